package perftest

import (
	"bytes"
	"context"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/softroce/softroce/nic/udp"
	"github.com/softroce/softroce/verbs"
)

// TestAdaptiveTimeout: with -u 1 the IBTA local ACK timeout is 8 us, far
// below a loopback round trip between two goroutine-driven devices, so
// with the fixed timeout nearly every window times out. With
// AdaptiveTimeout the requester's timeout follows the measured round trip
// and the run completes with few expiries (the first ones, before a
// sample, and backing off).
func TestAdaptiveTimeout(t *testing.T) {
	addr := netip.MustParseAddr("127.0.0.1")
	open := func(port int) *verbs.Device {
		l, err := udp.Open(udp.Config{Addr: addr, Port: port, SocketBuffer: 4 << 20})
		if err != nil {
			t.Skipf("cannot open UDP port %d on loopback: %v", port, err)
		}
		d, err := verbs.Open(l, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		return d
	}
	ds, dc := open(47941), open(47942)
	const iters = 300
	run := func(port int, adaptive bool) (*Result, *Result) {
		base := Config{Test: Write, Port: port, Size: 4096, MTU: 1024, Iters: iters, QPs: 1,
			QPTimeout: 1, AdaptiveTimeout: adaptive, Timeout: 60 * time.Second}
		var wg sync.WaitGroup
		var sout, cout bytes.Buffer
		var sres, cres *Result
		var serr, cerr error
		wg.Add(2)
		go func() {
			defer wg.Done()
			c := base
			c.RemotePort = 47942
			sres, serr = Run(context.Background(), ds, c, &sout)
		}()
		go func() {
			defer wg.Done()
			c := base
			c.Server, c.RemotePort = "127.0.0.1", 47941
			cres, cerr = Run(context.Background(), dc, c, &cout)
		}()
		wg.Wait()
		if !adaptive {
			if cerr != nil {
				t.Logf("fixed 8 us timeout: %v", cerr)
				return nil, nil
			}
			t.Logf("fixed 8 us timeout: client %+v", cres.Stats)
			return sres, cres
		}
		if serr != nil || cerr != nil {
			t.Fatalf("adaptive: server: %v\n%s\nclient: %v\n%s", serr, &sout, cerr, &cout)
		}
		return sres, cres
	}
	_, cres := run(47990, true)
	if cres.Report.Iters != iters || cres.Report.AvgBW <= 0 {
		t.Fatalf("adaptive: report %+v", cres.Report)
	}
	// 300 WRITEs of 4 packets in windows of 128 PSNs: a fixed 8 us timeout
	// expires on nearly every window; adapting leaves a handful.
	if st := cres.Stats; st.Timeouts > iters/10 {
		t.Fatalf("adaptive timeout: %d timeouts in %d WRITEs (stats %+v)", st.Timeouts, iters, st)
	} else {
		t.Logf("adaptive: client %+v", st)
	}
	run(47991, false) // for comparison, logged
}
