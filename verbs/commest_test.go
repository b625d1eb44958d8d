package verbs_test

import (
	"testing"

	"github.com/softroce/softroce/qpstate"
	"github.com/softroce/softroce/verbs"
)

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// TestCommEst: a QP's Established channel closes when the first packet
// from the peer arrives after RTR (the ACK coming back establishes the
// sender too). QPs already in RTS raise no async event; a QP in RTR raises
// EventCommEst once. After RESET the next packet is a first one again.
func TestCommEst(t *testing.T) {
	a, b := pair()
	defer a.dev.Close()
	defer b.dev.Close()
	if closed(a.qp.Established()) || closed(b.qp.Established()) {
		t.Fatal("established before any packet")
	}
	send := func() {
		t.Helper()
		if err := b.qp.PostRecv(&verbs.RecvWR{ID: 2, SGL: []verbs.SGE{{Addr: b.mr.Addr(), Length: 64, LKey: b.mr.LKey()}}}); err != nil {
			t.Fatal(err)
		}
		if err := a.qp.PostSend(&verbs.SendWR{ID: 1, Opcode: verbs.WRSend, Flags: verbs.SendSignaled,
			SGL: []verbs.SGE{{Addr: a.mr.Addr(), Length: 8, LKey: a.mr.LKey()}}}); err != nil {
			t.Fatal(err)
		}
		if wc := a.wait(); wc.Status != 0 {
			t.Fatalf("send: %v", wc.Status)
		}
		b.wait()
	}
	send()
	send()
	if !closed(b.qp.Established()) || !closed(a.qp.Established()) {
		t.Fatal("not established after a SEND and its ACK")
	}
	events := func(d *verbs.Device) (n int) {
		for {
			select {
			case ev := <-d.AsyncEvents():
				if ev.Type == verbs.EventCommEst {
					n++
				}
			default:
				return n
			}
		}
	}
	if na, nb := events(a.dev), events(b.dev); na != 0 || nb != 0 {
		t.Fatalf("EventCommEst on QPs in RTS: %d, %d", na, nb)
	}
	if s := verbs.EventCommEst.String(); s != "communication established" {
		t.Fatal(s)
	}
	// RESET, then INIT and RTR only, expecting the sender's next PSN.
	if err := b.qp.Modify(&verbs.QPAttr{State: verbs.StateReset}, qpstate.AttrState); err != nil {
		t.Fatal(err)
	}
	if err := b.qp.Init(0); err != nil {
		t.Fatal(err)
	}
	gid, _ := a.dev.QueryGID(0)
	rtr := verbs.QPAttr{State: verbs.StateRTR, PathMTU: 1024, DestQPN: a.qp.Num(), RQPSN: 0x1002, MaxDestRDAtomic: 1,
		MinRNRTimer: 12, AV: verbs.AddressVector{DGID: gid}}
	if err := b.qp.Modify(&rtr, qpstate.AttrState|qpstate.AttrAV|qpstate.AttrPathMTU|qpstate.AttrDestQPN|qpstate.AttrRQPSN|
		qpstate.AttrMaxDestRDAtomic|qpstate.AttrMinRNRTimer); err != nil {
		t.Fatal(err)
	}
	est := b.qp.Established()
	if closed(est) {
		t.Fatal("still established after RESET and RTR")
	}
	send()
	send()
	if !closed(est) {
		t.Fatal("the QP in RTR was not established by a SEND")
	}
	if nb := events(b.dev); nb != 1 {
		t.Fatalf("EventCommEst on the QP in RTR: %d, want 1", nb)
	}
}
