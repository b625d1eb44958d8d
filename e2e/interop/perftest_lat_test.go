package interop

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/softroce/softroce/tools/perftest"
)

// latRow is a row of perftest's latency table: bytes, iterations, then
// t_min, t_max, t_typical, t_avg, t_stdev, 99% and 99.9% (us).
var latRow = regexp.MustCompile(`(?m)^\s*(\d+)\s+(\d+)((?:\s+[0-9.]+){7})\s*$`)

// TestPerftestLatAgainstRxe runs ib_write_lat, ib_read_lat, ib_atomic_lat
// and ib_send_lat on the rxe guest against `softroce perftest --lat`'s
// engine on the host, softroce in either role. Both ends must finish;
// the side that measures (both for the write and send ping-pongs, the
// client for read and atomic) must report every iteration with
// min <= typical <= max. Latencies are logged: the guest is emulated.
func TestPerftestLatAgainstRxe(t *testing.T) {
	needVM(t)
	const iters = 100
	port := 19400
	for _, test := range []perftest.Test{perftest.Write, perftest.Read, perftest.Atomic, perftest.Send} {
		for _, role := range []string{"softroce-client", "softroce-server"} {
			port++
			tool := "ib_" + test.String() + "_lat"
			t.Run(role+"/"+tool, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
				defer cancel()
				dev := perftestDevice(t)
				cfg := perftest.Config{Test: test, Latency: true, Port: port, Iters: iters, Timeout: 120 * time.Second,
					Dial: vm.DialContext, Listen: vm.Listen}
				gcmd := fmt.Sprintf("timeout 100 %s -d rxe0 -x 1 -F -p %d -n %d", tool, port, iters)
				var out bytes.Buffer
				var res *perftest.Result
				var gout string
				if role == "softroce-client" {
					proc, err := vm.Start(ctx, gcmd)
					if err != nil {
						t.Fatal(err)
					}
					defer proc.Kill()
					if err := vm.WaitListening(ctx, port); err != nil {
						t.Fatalf("%s did not listen: %v", tool, err)
					}
					cfg.Server = vm.GuestAddr().String()
					if res, err = perftest.Run(ctx, dev, cfg, &out); err != nil {
						proc.Kill()
						g, _ := proc.Output()
						t.Fatalf("softroce client: %v\n%s\nguest:\n%s", err, &out, g)
					}
					if gout, err = proc.Wait(ctx); err != nil {
						t.Fatalf("%s server: %v\n%s", tool, err, gout)
					}
				} else {
					ln, err := vm.Listen("tcp4", fmt.Sprintf(":%d", port))
					if err != nil {
						t.Fatal(err)
					}
					defer ln.Close()
					cfg.Listen = func(string, string) (net.Listener, error) { return ln, nil }
					type result struct {
						res *perftest.Result
						err error
					}
					done := make(chan result, 1)
					go func() {
						r, err := perftest.Run(ctx, dev, cfg, &out)
						done <- result{r, err}
					}()
					var gerr error
					gout, gerr = vm.Run(ctx, gcmd+" "+vm.HostAddr().String())
					if gerr != nil {
						cancel()
					}
					r := <-done
					if r.err != nil || gerr != nil {
						t.Fatalf("softroce server: %v\n%s\n%s client: %v\n%s", r.err, &out, tool, gerr, gout)
					}
					res = r.res
				}
				size := 2
				if test == perftest.Atomic {
					size = 8
				}
				pingPong := test == perftest.Write || test == perftest.Send
				guestMeasures := pingPong || role == "softroce-server"
				if m := latRow.FindStringSubmatch(gout); guestMeasures {
					if m == nil {
						t.Fatalf("%s printed no latency row:\n%s", tool, gout)
					}
					checkLatRow(t, tool, m, size, iters)
				} else if m != nil {
					t.Fatalf("%s as the passive side printed a row:\n%s", tool, gout)
				}
				if pingPong || role == "softroce-client" {
					r := res.Lat
					if r == nil || r.Size != uint64(size) || r.Iters != iters || !(r.Min > 0) || r.Min > r.Typical || r.Typical > r.Max {
						t.Fatalf("softroce measured %+v, want %d bytes x %d iterations, min <= typical <= max\n%s", r, size, iters, &out)
					}
					t.Logf("softroce: t_typical %.2f us (min %.2f, max %.2f)", r.Typical, r.Min, r.Max)
				}
				if m := latRow.FindString(gout); m != "" {
					t.Logf("%s: %s", tool, m)
				}
			})
		}
	}
}

// checkLatRow checks a latency row of size bytes and iters iterations:
// t_min > 0 and t_min <= t_typical <= t_max.
func checkLatRow(t *testing.T, tool string, m []string, size, iters int) {
	t.Helper()
	var f []float64
	for _, s := range regexp.MustCompile(`[0-9.]+`).FindAllString(m[3], -1) {
		v, _ := strconv.ParseFloat(s, 64)
		f = append(f, v)
	}
	b, _ := strconv.Atoi(m[1])
	n, _ := strconv.Atoi(m[2])
	if b != size || n != iters || len(f) != 7 || !(f[0] > 0) || f[0] > f[2] || f[2] > f[1] {
		t.Fatalf("%s row %q: want %d bytes x %d iterations, 0 < t_min <= t_typical <= t_max", tool, m[0], size, iters)
	}
}
