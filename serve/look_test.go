package serve

import (
	"testing"
	"time"
)

// waitUntil polls cond for up to ten seconds (a hang, not a speed bound).
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// lookQP is a daemon on a UDP device with one client QP, its poller
// asleep (the QP's flag asks for the doorbell).
func lookQP(t *testing.T) (*Server, *device, []byte) {
	s := startUDP(t)
	d := s.devs[0]
	if d.look.pending == nil {
		t.Fatal("the UDP device has no pending probe: the receive goroutine does not look at the rings")
	}
	c := dial(t, s)
	c.open()
	pd := c.handle(opAllocPD, nil)
	ring := c.qp(pd, c.handle(opCreateCQ, u32s(16, 0)))
	waitUntil(t, "the poller sleeps", func() bool { return load32(ring, offSleeping) == 1 })
	return s, d, ring
}

// While the receive goroutine looks at the rings after a batch, the QPs'
// flags are clear, so a program's post rings no doorbell, and the look
// takes the WQE itself; afterwards the flag asks for the doorbell again.
func TestLookTakesPost(t *testing.T) {
	s, d, ring := lookQP(t)
	d.look.budget = time.Hour // it ends on the post alone
	// No packets come. The program posts while the look runs (the probe
	// for packets is called then), as the library does: the WQE, the
	// producer index, and, only if the flag asks for it, the doorbell.
	// The WQE is garbage: the daemon refuses it, and consumes it either
	// way.
	flag := uint32(2)
	d.look.pending = func() bool {
		if flag == 2 {
			flag = load32(ring, offSleeping)
			for i := range ring[ctlPage : ctlPage+64] {
				ring[ctlPage+i] = 0xA5
			}
			store32(ring, offSQProd, 1)
		}
		return false
	}
	d.afterReceive()
	if flag != 0 {
		t.Errorf("sleeping flag %d while the look ran, want 0 (no doorbell)", flag)
	}
	if got := load32(ring, offSQCons); got != 1 {
		t.Errorf("SQ consumer index %d after the look, want 1", got)
	}
	st := s.Stats()
	if st.LooksFound != 1 || st.LooksExpired != 0 || st.LooksCut != 0 {
		t.Errorf("looks found/cut/expired %d/%d/%d, want 1/0/0", st.LooksFound, st.LooksCut, st.LooksExpired)
	}
	// At once, or, if the poller's backstop pass held the lock as the
	// look ended, once the poller has counted it out.
	waitUntil(t, "the flag asks for the doorbell again", func() bool { return load32(ring, offSleeping) == 1 })
}

// A look that finds nothing ends after lookFor and spaces out the next
// ones; one cut short by a waiting packet does neither.
func TestLookBacksOff(t *testing.T) {
	s, d, ring := lookQP(t)
	d.look.pending = func() bool { return false }
	t0 := time.Now()
	d.afterReceive()
	if el := time.Since(t0); el < lookFor {
		t.Errorf("a look with nothing posted ended after %v, before lookFor %v", el, lookFor)
	}
	if st := s.Stats(); st.LooksExpired != 1 || d.look.skip != 1 {
		t.Fatalf("after one empty look: expired %d, skip %d; want 1, 1", st.LooksExpired, d.look.skip)
	}
	d.afterReceive() // skipped
	d.afterReceive()
	if st := s.Stats(); st.LooksExpired != 2 || d.look.skip != 3 {
		t.Fatalf("after two empty looks: expired %d, skip %d; want 2, 3", st.LooksExpired, d.look.skip)
	}
	d.look.skip = 0
	d.look.pending = func() bool { return true }
	d.afterReceive()
	if st := s.Stats(); st.LooksCut != 1 || d.look.skip != 0 {
		t.Errorf("a look cut short by a packet: cut %d, skip %d; want 1, 0", st.LooksCut, d.look.skip)
	}
	waitUntil(t, "the flag asks for the doorbell again", func() bool { return load32(ring, offSleeping) == 1 })
}

// A look that cannot take the device lock when it ends (a control
// operation holds it) does not wait for it: the poller counts it out at
// its next pass, and the flag asks for the doorbell again.
func TestLookEndsWithoutTheLock(t *testing.T) {
	_, d, ring := lookQP(t)
	d.look.budget = time.Hour // it ends on the probe alone
	d.look.pending = func() bool {
		d.mu.Lock() // a control operation takes the lock as the look ends
		return true
	}
	d.afterReceive()
	if n := d.lookExits.Load(); n != 1 {
		t.Errorf("%d looks left for the poller to count out, want 1", n)
	}
	if f := load32(ring, offSleeping); f != 0 {
		t.Errorf("sleeping flag %d while the look is not counted out, want 0", f)
	}
	d.mu.Unlock()
	waitUntil(t, "the poller counts the look out and sleeps", func() bool {
		return d.lookExits.Load() == 0 && load32(ring, offSleeping) == 1
	})
}
