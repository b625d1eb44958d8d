package main

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// BenchmarkLatVsRaw measures what a user measures: `softroce lat` between
// two processes over loopback (2-byte WRITE, a whole round trip), blocking
// (the waiter receives inline, the default), blocking with
// --no-inline-wait (the receive goroutine hands each completion over) and
// with --busy-poll, beside the reference, `softroce lat --raw-udp` (a
// plain blocking UDP ping-pong of the same size), in interleaved rounds so
// that the host's load hits all alike. It reports each path's median
// t_typical over the rounds (us) and its ratio to raw's, and the host's
// load average, and each path's context switches per round trip (both
// processes, start-up included: rusage); ns/op is one whole set of rounds. Rounds and iterations:
// SOFTROCE_LAT_ROUNDS (default 5), SOFTROCE_LAT_ITERS (default 5000).
//
//	go test -run '^$' -bench LatVsRaw -benchtime 1x ./cmd/softroce
func BenchmarkLatVsRaw(b *testing.B) {
	self, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	rounds, iters := envInt(b, "SOFTROCE_LAT_ROUNDS", 5), envInt(b, "SOFTROCE_LAT_ITERS", 5000)
	paths := []struct {
		name  string
		flags []string
	}{
		{"blocking", nil},
		{"no-inline-wait", []string{"--no-inline-wait"}},
		{"busy-poll", []string{"--busy-poll"}},
		{"raw", []string{"--raw-udp"}},
	}
	for i := 0; i < b.N; i++ {
		typ := make([][]float64, len(paths))
		csw := make([][]float64, len(paths))
		for r := 0; r < rounds; r++ {
			for k := range paths {
				// Each round starts at another path.
				p := paths[(k+r)%len(paths)]
				v, c, err := latRun(self, p.flags, iters)
				if err != nil {
					b.Fatalf("%s: %v", p.name, err)
				}
				typ[(k+r)%len(paths)] = append(typ[(k+r)%len(paths)], v)
				csw[(k+r)%len(paths)] = append(csw[(k+r)%len(paths)], c/float64(iters))
			}
		}
		raw := medianOf(typ[len(paths)-1])
		var line strings.Builder
		for k, p := range paths {
			m := medianOf(typ[k])
			b.ReportMetric(m, p.name+"-us")
			b.ReportMetric(medianOf(csw[k]), p.name+"-csw/rt")
			if p.name != "raw" {
				b.ReportMetric(m/raw, p.name+"/raw")
			}
			fmt.Fprintf(&line, " %s %.1f us (%.2f-%.2f, %.2f context switches a round trip)", p.name, m, slices.Min(typ[k]), slices.Max(typ[k]), medianOf(csw[k]))
		}
		load, _ := os.ReadFile("/proc/loadavg")
		b.Logf("%d rounds x %d round trips, t_typical medians:%s; load average %s", rounds, iters, line.String(), strings.Join(strings.Fields(string(load))[:3], " "))
	}
}

// latRun runs one `softroce lat` pair (this test binary as softroce) on
// free ports of 127.0.0.1 and returns the client's t_typical in us and
// the context switches of both processes.
func latRun(self string, flags []string, iters int) (float64, float64, error) {
	tcp, udpS, udpC := freePort("tcp"), freePort("udp"), freePort("udp")
	raw := slices.Contains(flags, "--raw-udp")
	if raw {
		udpC = udpS
	}
	env := append(os.Environ(), "SOFTROCE_TEST_AS_MAIN=1")
	common := func(udp int) []string {
		return append([]string{"lat", "--bind", "127.0.0.1", "-p", strconv.Itoa(tcp), "--udp-port", strconv.Itoa(udp), "-n", strconv.Itoa(iters)}, flags...)
	}
	srv := exec.Command(self, append(common(udpS), "--server")...)
	srv.Env = env
	if err := srv.Start(); err != nil {
		return 0, 0, err
	}
	defer srv.Process.Kill()
	// The client keeps trying for --wait (5 s) until the server listens.
	cli := exec.Command(self, append(common(udpC), "--json", "127.0.0.1")...)
	cli.Env = env
	out, err := cli.Output()
	if err != nil {
		return 0, 0, fmt.Errorf("client: %v\n%s", err, out)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Wait() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		return 0, 0, fmt.Errorf("the server did not exit")
	}
	var rep struct {
		Lat []struct {
			Typical float64 `json:"t_typical_usec"`
		} `json:"lat"`
	}
	if err := json.Unmarshal(out, &rep); err != nil || len(rep.Lat) == 0 {
		return 0, 0, fmt.Errorf("client output: %v\n%s", err, out)
	}
	return rep.Lat[0].Typical, float64(switches(cli.ProcessState) + switches(srv.ProcessState)), nil
}

// switches is a finished process's context switches, voluntary or not.
func switches(ps *os.ProcessState) int64 {
	if ru, ok := ps.SysUsage().(*syscall.Rusage); ok {
		return ru.Nvcsw + ru.Nivcsw
	}
	return 0
}

func freePort(network string) int {
	if network == "tcp" {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0
		}
		defer l.Close()
		return l.Addr().(*net.TCPAddr).Port
	}
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return 0
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).Port
}

func medianOf(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
