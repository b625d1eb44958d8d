package apps

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// ucxTransports is `ucx_info -d` by memory domain: each domain's
// transports as "transport/device" (rc_verbs/softroce0:1).
func ucxTransports(out string) map[string][]string {
	m := map[string][]string{}
	md, tl := "", ""
	for _, line := range strings.Split(out, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(strings.TrimPrefix(line, "#")), ": ")
		if !ok {
			continue
		}
		switch k {
		case "Memory domain":
			md, tl = v, ""
			m[md] = m[md][:0:0]
		case "Transport":
			tl = v
		case "Device":
			if md != "" && tl != "" {
				m[md] = append(m[md], tl+"/"+v)
			}
		}
	}
	return m
}

// ucxInfoCheck fails the test unless `ucx_info -d` (out) lists rc_verbs
// and ud_verbs on port 1 of dev, in memory domain dev.
func ucxInfoCheck(t *testing.T, out, dev string) {
	t.Helper()
	m := ucxTransports(out)
	got := strings.Join(m[dev], " ")
	for _, tl := range []string{"rc_verbs", "ud_verbs"} {
		if !strings.Contains(" "+got+" ", " "+tl+"/"+dev+":1 ") {
			t.Errorf("ucx_info -d: memory domain %s has no %s on %s:1 (it has %q):\n%s", dev, tl, dev, got, out)
		}
	}
	t.Logf("ucx_info -d: %s: %s", dev, got)
}

// ucxCase is one ucx_perftest run: a test (-t) under UCX_TLS tls, of
// iters iterations (-n) of size bytes (-s). UCT tests (tl set) name their
// transport (-x), the device (-d) and the data layout (-D).
type ucxCase struct {
	test, tls  string
	tl, layout string
	size       int
	iters      int
}

func (c ucxCase) String() string {
	s := fmt.Sprintf("%s %d B, UCX_TLS=%s", c.test, c.size, c.tls)
	if c.tl != "" {
		s = fmt.Sprintf("%s %s %s %d B", c.test, c.tl, c.layout, c.size)
	}
	return s
}

// ucxRun is a ucx_perftest server and its client, started.
type ucxRun struct {
	c        ucxCase
	srv, cli endProc
}

// ucxPerfStart starts c: the server at ro.server (it takes every
// parameter from its client, the device's name included), once it
// listens the client at ro.client on device dev (UCT).
func ucxPerfStart(t *testing.T, ro role, c ucxCase, dev string) *ucxRun {
	t.Helper()
	port := ro.port(t)
	env := []string{"UCX_TLS=" + c.tls}
	srv := ro.server.start(t, env, "ucx_perftest", "-p", strconv.Itoa(port))
	ro.server.waitListen(t, srv, port)
	args := []string{"ucx_perftest", ro.server.addr.String(), "-p", strconv.Itoa(port), "-t", c.test,
		"-n", strconv.Itoa(c.iters), "-s", strconv.Itoa(c.size)}
	if c.tl != "" {
		args = append(args, "-x", c.tl, "-d", dev+":1", "-D", c.layout)
	}
	return &ucxRun{c: c, srv: srv, cli: ro.client.start(t, env, args...)}
}

// wait waits for the client (up to timeout) and the server, and returns
// both outputs and exit errors. It calls nothing of testing's.
func (u *ucxRun) wait(timeout time.Duration) (co, so string, cerr, serr error) {
	cerr = u.cli.Wait(timeout)
	if cerr != nil {
		// A server whose client failed may wait for another.
		serr = u.srv.Wait(5 * time.Second)
	} else {
		serr = u.srv.Wait(30 * time.Second)
	}
	return u.cli.Output(), u.srv.Output(), cerr, serr
}

// ucxPerfRun runs c (ucxPerfStart) and waits for it.
func ucxPerfRun(t *testing.T, ro role, c ucxCase, dev string, timeout time.Duration) (co, so string, cerr, serr error) {
	t.Helper()
	return ucxPerfStart(t, ro, c, dev).wait(timeout)
}

// ucxFinal is ucx_perftest's "Final:" line: iterations; latency or
// overhead in µs (median, average, overall); bandwidth in MB/s and
// message rate in msg/s (average, overall).
type ucxFinal struct {
	line                       string
	iters                      int
	median, avg, overall       float64
	bwAvg, bwAll, mrAvg, mrAll float64
}

func parseUCXFinal(out string) (ucxFinal, error) {
	f := ucxFinal{line: lastLine(out, "Final:")}
	fs := strings.Fields(f.line)
	if len(fs) != 9 {
		return f, fmt.Errorf("no Final line of 8 figures")
	}
	var err error
	if f.iters, err = strconv.Atoi(fs[1]); err != nil {
		return f, err
	}
	for i, p := range []*float64{&f.median, &f.avg, &f.overall, &f.bwAvg, &f.bwAll, &f.mrAvg, &f.mrAll} {
		if *p, err = strconv.ParseFloat(fs[2+i], 64); err != nil {
			return f, fmt.Errorf("figure %d of %q: %v", i+1, f.line, err)
		}
	}
	return f, nil
}

// lastLine is the last line of out that starts with prefix.
func lastLine(out, prefix string) string {
	l := ""
	for _, s := range strings.Split(out, "\n") {
		if strings.HasPrefix(s, prefix) {
			l = s
		}
	}
	return l
}

// ucxPerfCheck fails the test unless the run ended well with a Final line
// of c.iters iterations and positive latency and message rate (and
// bandwidth, from 1 KiB up: smaller messages print 0.00 MB/s); it logs
// the line as printed.
func ucxPerfCheck(t *testing.T, ro role, c ucxCase, co, so string, cerr, serr error) {
	t.Helper()
	f, err := parseUCXFinal(co)
	if cerr != nil || serr != nil || err != nil {
		t.Errorf("ucx_perftest %v (%s): client %v, server %v, %v\nclient:\n%s\nserver:\n%s", c, ro.name, cerr, serr, err, co, so)
		return
	}
	if f.iters != c.iters || f.avg <= 0 || f.mrAll <= 0 || c.size >= 1024 && f.bwAll <= 0 {
		t.Errorf("ucx_perftest %v (%s): %q, want %d iterations, positive figures", c, ro.name, f.line, c.iters)
	}
	t.Logf("ucx_perftest %v (%s): %s", c, ro.name, f.line)
}

// ucxUCT and ucxUCP are the ucx_perftest runs: UCT's put and active
// message bandwidth on each verbs transport (ud_verbs has no put), and
// UCP's puts, gets, active messages and tag matching under both
// transport selections (with ud_verbs alone, UCP emulates puts and gets
// over active messages).
var (
	ucxUCT = []ucxCase{
		{test: "put_bw", tls: "rc_verbs,ud_verbs,self", tl: "rc_verbs", layout: "zcopy", size: 65536, iters: 200},
		{test: "am_bw", tls: "rc_verbs,ud_verbs,self", tl: "rc_verbs", layout: "bcopy", size: 4096, iters: 200},
		{test: "am_bw", tls: "ud_verbs", tl: "ud_verbs", layout: "bcopy", size: 512, iters: 200},
	}
	ucxUCP = func(iters int) []ucxCase {
		var l []ucxCase
		for _, tls := range []string{"rc_verbs,ud_verbs,self", "ud_verbs"} {
			for _, c := range []struct {
				test string
				size int
			}{{"ucp_put_bw", 65536}, {"ucp_get", 65536}, {"ucp_am_bw", 65536}, {"tag_lat", 8}, {"tag_bw", 65536}} {
				l = append(l, ucxCase{test: c.test, tls: tls, size: c.size, iters: iters})
			}
		}
		return l
	}
)

// ucx_perftest between two softroce hosts, server on host A and client on
// host B, each through `softroce run` with UCX_TLS set and nothing else:
// the UCT and UCP runs that TestUCXPerftestAgainstRxe runs against rxe.
func TestUCXPerftest(t *testing.T) {
	Need(t, "ucx-utils", "ucx_perftest", "ucx_info")
	hs := NewTwoHosts(t)
	out, err := hs.A.Run(t, time.Minute, nil, "ucx_info", "-d")
	if err != nil {
		t.Fatalf("ucx_info -d: %v\n%s", err, out)
	}
	ucxInfoCheck(t, out, "softroce0")
	for _, c := range append(ucxUCT, ucxUCP(200)...) {
		co, so, cerr, serr := ucxPerfRun(t, hs.role(), c, "softroce0", 2*time.Minute)
		ucxPerfCheck(t, hs.role(), c, co, so, cerr, serr)
	}
}
