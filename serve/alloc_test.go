package serve

import (
	"testing"

	"github.com/softroce/softroce/nic/pipe"
	"github.com/softroce/softroce/verbs"
)

// The poller's pass over a send WQE and a receive WQE — reading them from
// the rings, checking their SGEs, posting them, moving their completions
// into the CQ ring — allocates nothing. (The QP is in ERR, so verbs
// completes every WQE at once, flushed: no peer is needed.)
func TestDataPathNoAllocs(t *testing.T) {
	a, b := pipe.New(pipe.Config{})
	defer b.Close()
	dev, err := verbs.Open(a, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := start(t, dev, 0)
	c := dial(t, s)
	c.open()
	pd := c.handle(opAllocPD, nil)
	buf, key := c.regMem(pd, 8192)
	cq, _, cqRing := c.cqRing(64)
	ring, qh := c.qpH(pd, cq)
	a2 := qpAttrWire{state: 6}
	if e, _, _ := c.call(opModifyQP, append(u32s(qh, 1), a2.encode(nil)...)); e != 0 {
		t.Fatalf("MODIFY_QP to ERR: %v", e)
	}
	base := uint64(uintptr(unsafePointer(buf)))
	sqOff, rqOff := ctlPage, ctlPage+4096
	var sq, rq, cons uint32
	d := s.devs[0]
	round := func() {
		w := ring[sqOff+int(sq&3)*(sizeSendWQE+sizeSGE):]
		le.PutUint64(w, uint64(sq))
		le.PutUint32(w[8:], 2)  // IBV_WR_SEND
		le.PutUint32(w[12:], 2) // SIGNALED
		le.PutUint32(w[20:], 1)
		le.PutUint32(w[24:], 0)
		le.PutUint64(w[sizeSendWQE:], base)
		le.PutUint32(w[sizeSendWQE+8:], 64)
		le.PutUint32(w[sizeSendWQE+12:], key)
		sq++
		store32(ring, offSQProd, sq)
		r := ring[rqOff+int(rq&3)*32:]
		le.PutUint64(r, uint64(rq))
		le.PutUint32(r[8:], 1)
		le.PutUint64(r[16:], base+100)
		le.PutUint32(r[24:], 64)
		le.PutUint32(r[28:], key)
		rq++
		store32(ring, offRQProd, rq)
		for load32(cqRing, offCQProd) != cons+2 {
			d.mu.Lock()
			d.pass()
			d.mu.Unlock()
		}
		cons += 2
		store32(cqRing, offCQCons, cons)
	}
	for range 20 {
		round()
	}
	n := testing.AllocsPerRun(200, round)
	switch {
	case raceEnabled:
		// The race detector allocates on its own; .ci/run repeats this
		// test without it, where the count is checked.
		t.Logf("%.1f allocations per WQE pair under -race (not checked)", n)
	case n != 0:
		t.Errorf("%.1f allocations per send and receive WQE pair, want 0", n)
	}
	if st := s.Stats(); st.BadWQEs != 0 {
		t.Errorf("WQEs refused: %+v", st)
	}
}
