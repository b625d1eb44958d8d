package perftest

import (
	"testing"
	"time"
)

// TestAdaptiveTimeout: with -u 4 the IBTA local ACK timeout is 65 us,
// below a loopback round trip between two goroutine-driven devices under
// the race detector, so with the fixed timeout many windows time out.
// (With -u 1, 8 us, the seven retries before the first sample span about
// 2 ms, less than a first round trip can take here: the run failed one
// time in five before it had a sample to adapt to.) With
// AdaptiveTimeout the requester's timeout follows the measured round trip
// and the run completes with few expiries (the first ones, before a
// sample, and backing off).
func TestAdaptiveTimeout(t *testing.T) {
	devs := loopbackDevs(t, 47941)
	const iters = 300
	base := Config{Test: Write, Size: 4096, MTU: 1024, Iters: iters, QPs: 1, QPTimeout: 4, Timeout: 60 * time.Second}
	c := base
	c.Port, c.AdaptiveTimeout = 47990, true
	_, cres, _, _ := runPair(t, devs, c, overUDP(47941))
	if cres.Report.Iters != iters || cres.Report.AvgBW <= 0 {
		t.Fatalf("adaptive: report %+v", cres.Report)
	}
	// 300 WRITEs of 4 packets in windows of 128 PSNs: a fixed 65 us timeout
	// expires on many windows; adapting leaves a handful.
	if st := cres.Stats; st.Timeouts > iters/10 {
		t.Fatalf("adaptive timeout: %d timeouts in %d WRITEs (stats %+v)", st.Timeouts, iters, st)
	} else {
		t.Logf("adaptive: client %+v", st)
	}
	// For comparison, logged: the fixed timeout may fail the run.
	c = base
	c.Port = 47991
	if res, errs, _ := runSides(devs, c, overUDP(47941)); errs[1] != nil {
		t.Logf("fixed 65 us timeout: %v", errs[1])
	} else {
		t.Logf("fixed 65 us timeout: client %+v", res[1].Stats)
	}
}
