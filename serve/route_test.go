package serve

import (
	"testing"

	"golang.org/x/sys/unix"
)

// A completion for a full client CQ ring raises CQ_ERR once with the CQ's
// handle, sets the ring's overrun flag and is counted; the completions
// that fit are in the ring. They are written on the transport's goroutine
// (the verbs CQ's push hook), which must leave the QP's move to ERR to the
// poller: doing it there would deadlock on the engine lock.
func TestCQOverrun(t *testing.T) {
	s := startPipe(t)
	h := dial(t, s)
	h.open()
	pd := h.handle(opAllocPD, nil)
	buf, key := h.regMem(pd, 8192)
	base := uint64(uintptr(unsafePointer(buf)))
	cq, slots, cqRing := h.cqRing(1)
	if slots != 1 {
		t.Fatalf("CREATE_CQ of 1 slot made %d", slots)
	}
	ring, qh := h.qpH(pd, cq) // in INIT: receives wait there
	rqOff := ctlPage + 4096
	for i := range 3 {
		r := ring[rqOff+i*32:]
		le.PutUint64(r, uint64(100+i))
		le.PutUint32(r[8:], 1)
		le.PutUint64(r[16:], base)
		le.PutUint32(r[24:], 64)
		le.PutUint32(r[28:], key)
	}
	store32(ring, offRQProd, 3)
	for load32(ring, offRQCons) != 3 {
		unix.Nanosleep(&unix.Timespec{Nsec: 1e5}, nil)
	}
	// To ERR: the three receives complete flushed into a ring of one.
	a := qpAttrWire{state: 6}
	if e, _, _ := h.call(opModifyQP, append(u32s(qh, 1), a.encode(nil)...)); e != 0 {
		t.Fatalf("MODIFY_QP to ERR: %v", e)
	}
	if n, err := unix.Poll([]unix.PollFd{{Fd: int32(h.events), Events: unix.POLLIN}}, 10000); n != 1 || err != nil {
		t.Fatalf("no async event after the overrun: %d %v", n, err)
	}
	if typ, hh := h.event(); typ != evCQErr || hh != cq {
		t.Errorf("async event %d for handle %d, want CQ_ERR for CQ %d", typ, hh, cq)
	}
	if load32(cqRing, offCQOverrun) == 0 {
		t.Error("the ring's overrun flag is not set")
	}
	if p := load32(cqRing, offCQProd); p != 1 {
		t.Errorf("producer index %d, want 1", p)
	}
	if id, st := le.Uint64(cqRing[ctlPage:]), le.Uint32(cqRing[ctlPage+8:]); id != 100 || st != 5 {
		t.Errorf("CQE wr_id %d status %d, want 100 and WR_FLUSH_ERR", id, st)
	}
	if st := s.Stats(); st.Overruns == 0 {
		t.Errorf("overrun not counted: %+v", st)
	}
	// The daemon still serves the client.
	if e, _, _ := h.call(opQueryQP, u32s(qh, 0)); e != 0 {
		t.Errorf("QUERY_QP after the overrun: %v", e)
	}
}
