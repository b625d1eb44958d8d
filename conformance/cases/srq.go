package cases

import (
	"bytes"
	"fmt"
	"strings"
	"time"

	"github.com/softroce/softroce/bth"
)

// docs/conformance-catalogue.md has no entries for shared receive queues:
// IBTA vol. 1 §10.2.9 (SRQs) and §11.6.3 (asynchronous events).

// Shared receive queues: the limit event and the last-WQE event.
var srqCases = []*Case{
	{
		ID: "srq-limit-event",
		Spec: "An SRQ with 4 receive WQEs and its limit armed at 2 (ibv_modify_srq): SENDs to a QP on it are ACKed and " +
			"complete in posting order; no event while 3 and then 2 WQEs are left; the SEND that leaves 1 (fewer than " +
			"the limit) raises exactly one IBV_EVENT_SRQ_LIMIT_REACHED naming the SRQ, and the limit disarms (a query " +
			"shows 0): the next SEND raises no second event (IBTA §10.2.9 SRQ limit, §11.6.3 asynchronous events)",
		Run: runSRQLimit,
	},
	{
		ID: "srq-last-wqe-after-error",
		Spec: "A QP on an SRQ that a class C error (a WRITE with an unknown R_Key: NAK 0x62) moves to the error state " +
			"raises IBV_EVENT_QP_LAST_WQE_REACHED for that QP; the WQEs left on the SRQ are not flushed by it: another " +
			"QP on the same SRQ takes the next one (IBTA §10.2.9 SRQs: last WQE reached; §11.6.3 asynchronous events; " +
			"§10.3.1 the error state)",
		Known: map[string]string{"rxe": "docs/rxe-behaviour.md §4.4: on 6.1 a QP on an SRQ raises no " +
			"IBV_EVENT_QP_LAST_WQE_REACHED when a class C error moves it to ERR either"},
		Run: func(x *X) { runSRQLastWQE(x, false) },
	},
	{
		ID: "srq-last-wqe-after-modify",
		Spec: "A QP on an SRQ moved to the error state by ibv_modify_qp raises IBV_EVENT_QP_LAST_WQE_REACHED for that " +
			"QP; the WQEs left on the SRQ are not flushed by it: another QP on the same SRQ takes the next one " +
			"(IBTA §10.2.9 SRQs: last WQE reached; §11.6.3 asynchronous events; §10.3.1 the error state)",
		Known: map[string]string{"rxe": "docs/rxe-behaviour.md §4.4: on 6.1 a QP on an SRQ moved to ERR by modify-QP " +
			"raises no IBV_EVENT_QP_LAST_WQE_REACHED"},
		Run: func(x *X) { runSRQLastWQE(x, true) },
	},
}

// sendOnly is a SEND ONLY with AckReq.
func sendOnly(psn uint32) bth.Fields {
	return bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCSendOnly, PSN: psn, AckReq: true}}
}

// events collects the target's async events for the case until d passes
// with none.
func (x *X) events(s Session, d time.Duration) []*Event {
	var evs []*Event
	for {
		ev, err := s.Event(x.Ctx, d)
		x.Must(err, "wait for an async event")
		if ev == nil {
			return evs
		}
		evs = append(evs, ev)
	}
}

func describeEvents(evs []*Event) string {
	if len(evs) == 0 {
		return "no event"
	}
	var s []string
	for _, e := range evs {
		switch {
		case e.SRQ:
			s = append(s, fmt.Sprintf("%s (%d) on the SRQ", e.Name, e.Type))
		case e.QPN != 0:
			s = append(s, fmt.Sprintf("%s (%d) on QP 0x%x", e.Name, e.Type, e.QPN))
		default:
			s = append(s, fmt.Sprintf("%s (%d)", e.Name, e.Type))
		}
	}
	return strings.Join(s, ", ")
}

func countEvents(evs []*Event, typ int, match func(*Event) bool) int {
	n := 0
	for _, e := range evs {
		if e.Type == typ && match(e) {
			n++
		}
	}
	return n
}

// sendExpectACK sends a SEND ONLY of data at psn and checks it is ACKed.
func (x *X) sendExpectACK(what string, psn uint32, data []byte) bool {
	x.Send(sendOnly(psn), data)
	got := x.C.Collect(answerWait, func(q *Pkt) bool { return isACK(q, psn) || anyNAK(q) })
	ok := len(got) > 0 && isACK(got[len(got)-1], psn)
	if !ok {
		x.Failf("%s: want an ACK at PSN 0x%06x, got %s", what, psn, DescribeAll(got))
	}
	return ok
}

// recvCompletion polls s for a receive completion and checks its WR ID,
// status and length.
func (x *X) recvCompletion(s Session, what string, wrID uint64, n int) *Completion {
	wc, err := s.Poll(x.Ctx, answerWait)
	x.Must(err, "poll")
	switch {
	case wc == nil:
		x.Failf("%s: no receive completion", what)
	case wc.WRID != wrID || wc.Status != 0 || wc.ByteLen != uint32(n):
		x.Failf("%s: receive completion wr %d %s %d bytes, want wr %d SUCCESS %d bytes", what, wc.WRID,
			wcStatusName(wc.Status), wc.ByteLen, wrID, n)
	}
	return wc
}

func runSRQLimit(x *X) {
	const wqes, limit, size = 4, 2, 64
	n := randPSN()
	x.Open(QPSpec{RecvPSN: n, SRQ: &SRQSpec{MaxWR: 16}})
	for i := 0; i < wqes; i++ {
		x.Must(x.S.PostSRQRecv(x.Ctx, uint64(100+i), i*256, size), "post an SRQ receive")
	}
	x.Must(x.S.SetSRQLimit(x.Ctx, limit), "arm the SRQ limit")
	l, err := x.S.SRQLimit(x.Ctx)
	x.Must(err, "query the SRQ")
	if l != limit {
		x.Fatalf("the SRQ limit reads %d after arming it at %d", l, limit)
	}
	var trail []string
	for i := 0; i < wqes; i++ {
		psn := bth.PSNAdd(n, i)
		data := pattern(size, byte(0x30+i))
		x.sendExpectACK(fmt.Sprintf("SEND %d", i+1), psn, data)
		x.recvCompletion(x.S, fmt.Sprintf("SEND %d", i+1), uint64(100+i), size)
		wait := quietWait
		if i == 2 {
			wait = answerWait
		}
		evs := x.events(x.S, wait)
		left := wqes - 1 - i
		trail = append(trail, fmt.Sprintf("%d left: %s", left, describeEvents(evs)))
		lim := countEvents(evs, EventSRQLimitReached, func(e *Event) bool { return e.SRQ })
		if left < limit && i == 2 {
			x.Check(lim == 1, "the SEND that left %d WQE(s), fewer than the limit %d, raised %d SRQ limit event(s), want 1", left, limit, lim)
			l, err := x.S.SRQLimit(x.Ctx)
			x.Must(err, "query the SRQ")
			trail = append(trail, fmt.Sprintf("limit then %d", l))
			x.Check(l == 0, "after the limit event the SRQ limit reads %d, want 0 (disarmed)", l)
		} else {
			x.Check(lim == 0, "the SEND that left %d WQE(s) raised %d SRQ limit event(s), want none", left, lim)
		}
		if !x.Check(bytes.Equal(x.mem(0, i*256, size), data), "SEND %d did not land in WQE %d's buffer", i+1, i) {
			break
		}
	}
	x.Observe("SRQ of %d WQEs, limit %d: 4 SENDs ACKed; %s", wqes, limit, strings.Join(trail, "; "))
}

// runSRQLastWQE: QP A on an SRQ takes one WQE, then leaves for the error
// state (a class C error, or modify-QP); QP B on the same SRQ takes the
// next WQE.
func runSRQLastWQE(x *X, modify bool) {
	const size = 64
	n := randPSN()
	x.Open(QPSpec{RecvPSN: n, SRQ: &SRQSpec{MaxWR: 16}})
	a := x.S
	for i := 0; i < 3; i++ {
		x.Must(a.PostSRQRecv(x.Ctx, uint64(200+i), i*256, size), "post an SRQ receive")
	}
	x.sendExpectACK("SEND on QP A", n, pattern(size, 0x41))
	x.recvCompletion(a, "SEND on QP A", 200, size)
	if modify {
		x.Must(a.SetError(x.Ctx), "modify QP A to ERR")
		x.Observe("QP A on the SRQ took a WQE, then modify-QP to ERR")
	} else {
		mr := a.MR(0)
		psn := bth.PSNAdd(n, 1)
		x.Send(writeOnly(psn, mr.Addr, mr.RKey^0x5a5a00, 8), make([]byte, 8))
		got := x.C.Collect(quietWait, nil)
		x.Observe("QP A on the SRQ took a WQE, then a WRITE with a bad R_Key -> %s", DescribeAll(got))
		x.Check(len(got) == 1 && isNAK(got[0], bth.SyndromeRemoteAccessError, psn), "want exactly one NAK 0x62 at PSN 0x%06x", psn)
	}
	st := x.noteState("leaving")
	x.Check(st == "" || st == "ERR", "QP A is in %s, not ERR", st)
	evs := x.events(a, answerWait)
	x.Observe("events: %s", describeEvents(evs))
	last := countEvents(evs, EventLastWQEReached, func(e *Event) bool { return e.QPN == a.QPN() })
	x.Check(last == 1, "QP A raised %d IBV_EVENT_QP_LAST_WQE_REACHED, want 1", last)
	// QP A is flushed; the SRQ's WQEs are not: QP B takes WQE 201.
	if wc, err := a.Poll(x.Ctx, quietWait); err == nil && wc != nil {
		x.Notef("QP A's CQ after the error: wr %d %s", wc.WRID, wcStatusName(wc.Status))
		x.Check(wc.WRID != 201 && wc.WRID != 202, "an SRQ WQE (wr %d) completed on the failed QP A", wc.WRID)
	}
	m := randPSN()
	b := x.OpenQP(QPSpec{RecvPSN: m, SRQ: &SRQSpec{}})
	data := pattern(size, 0x42)
	if x.sendExpectACK("SEND on QP B", m, data) {
		x.Observe("SEND on QP B, same SRQ -> ACK")
	}
	wc := x.recvCompletion(b, "SEND on QP B", 201, size)
	if wc != nil {
		x.Observe("QP B's receive completion: wr %d %s", wc.WRID, wcStatusName(wc.Status))
	}
	x.Check(bytes.Equal(x.mem(0, 256, size), data), "QP B's SEND did not land in the next SRQ WQE's buffer")
}
