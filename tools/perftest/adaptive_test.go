package perftest

import (
	"testing"
	"time"
)

// TestAdaptiveTimeout: with -u 1 the IBTA local ACK timeout is 8 us, far
// below a loopback round trip between two goroutine-driven devices, so
// with the fixed timeout nearly every window times out. With
// AdaptiveTimeout the requester's timeout follows the measured round trip
// and the run completes with few expiries (the first ones, before a
// sample, and backing off).
func TestAdaptiveTimeout(t *testing.T) {
	devs := loopbackDevs(t, 47941)
	const iters = 300
	base := Config{Test: Write, Size: 4096, MTU: 1024, Iters: iters, QPs: 1, QPTimeout: 1, Timeout: 60 * time.Second}
	c := base
	c.Port, c.AdaptiveTimeout = 47990, true
	_, cres, _, _ := runPair(t, devs, c, overUDP(47941))
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
	// For comparison, logged: the fixed timeout may fail the run.
	c = base
	c.Port = 47991
	if res, errs, _ := runSides(devs, c, overUDP(47941)); errs[1] != nil {
		t.Logf("fixed 8 us timeout: %v", errs[1])
	} else {
		t.Logf("fixed 8 us timeout: client %+v", res[1].Stats)
	}
}
