package verbs

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/nic/pipe"
	"github.com/softroce/softroce/qpstate"
)

func openPair(t *testing.T) (*Device, *Device) {
	t.Helper()
	la, lb := pipe.New(pipe.Config{MTU: 1500})
	a, err := Open(la, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Open(lb, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

func TestQueryPortAndGID(t *testing.T) {
	a, _ := openPair(t)
	p := a.QueryPort()
	// rxe's rule: the largest IB MTU not above link MTU - 80: 1500 -> 1024.
	if p.ActiveMTU != 1024 || p.MaxMTU != 4096 || p.State != "PORT_ACTIVE" || p.GIDTblLen != 1 {
		t.Fatalf("port %+v", p)
	}
	g, err := a.QueryGID(0)
	if err != nil {
		t.Fatal(err)
	}
	if g.String() != "0000:0000:0000:0000:0000:ffff:0a00:0001" || g.Addr() != netip.MustParseAddr("10.0.0.1") {
		t.Fatalf("GID %s (%v)", g, g.Addr())
	}
	if _, err := a.QueryGID(5); err == nil || !strings.Contains(err.Error(), "out of range") {
		t.Fatalf("QueryGID(5) = %v", err)
	}
	if d := a.QueryDevice(); d.MaxQPWR != MaxQPWR || d.AtomicCap != "ATOMIC_HCA" {
		t.Fatalf("device %+v", d)
	}
}

func TestCreateQPLimits(t *testing.T) {
	a, _ := openPair(t)
	pd, _ := a.AllocPD()
	c, _ := a.CreateCQ(16)
	for _, tc := range []struct {
		attr QPInitAttr
		want string
	}{
		{QPInitAttr{SendCQ: c, RecvCQ: c, Cap: QPCap{MaxSendWR: MaxQPWR + 1}}, "max_qp_wr"},
		{QPInitAttr{SendCQ: c, RecvCQ: c, Cap: QPCap{MaxSendSGE: MaxSGE + 1}}, "max_sge"},
		{QPInitAttr{SendCQ: c, RecvCQ: c, Cap: QPCap{MaxInlineData: 4096}}, "max_inline_data"},
		{QPInitAttr{Type: 9, SendCQ: c, RecvCQ: c}, "not implemented"},
		{QPInitAttr{SendCQ: c}, "receive CQ"},
	} {
		if _, err := pd.CreateQP(tc.attr); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("CreateQP(%+v) = %v, want an error about %s", tc.attr.Cap, err, tc.want)
		}
	}
	if _, err := a.CreateCQ(MaxCQE + 1); err == nil {
		t.Error("CQ deeper than max_cqe accepted")
	}
}

func TestModifyErrorsNameTheAttribute(t *testing.T) {
	a, _ := openPair(t)
	pd, _ := a.AllocPD()
	c, _ := a.CreateCQ(16)
	qp, _ := pd.CreateQP(QPInitAttr{SendCQ: c, RecvCQ: c})
	// RESET -> RTS is illegal.
	err := qp.Modify(&QPAttr{State: StateRTS}, qpstate.AttrState)
	var te *qpstate.TransitionError
	if !errors.As(err, &te) || !strings.Contains(err.Error(), "RESET") || !strings.Contains(err.Error(), "RTS") {
		t.Fatalf("RESET->RTS: %v", err)
	}
	if err := qp.Init(AccessRemoteWrite); err != nil {
		t.Fatal(err)
	}
	// INIT -> RTR without PATH_MTU names the missing attribute.
	err = qp.Modify(&QPAttr{State: StateRTR, DestQPN: 5}, qpstate.AttrState|qpstate.AttrAV|qpstate.AttrDestQPN|qpstate.AttrRQPSN|qpstate.AttrMaxDestRDAtomic|qpstate.AttrMinRNRTimer)
	if err == nil || !strings.Contains(err.Error(), "PATH_MTU") {
		t.Fatalf("missing PATH_MTU: %v", err)
	}
	// A path MTU above the port's active MTU is refused with both numbers.
	err = qp.Modify(&QPAttr{State: StateRTR, PathMTU: 4096}, qpstate.AttrState|qpstate.AttrAV|qpstate.AttrPathMTU|qpstate.AttrDestQPN|qpstate.AttrRQPSN|qpstate.AttrMaxDestRDAtomic|qpstate.AttrMinRNRTimer)
	if err == nil || !strings.Contains(err.Error(), "active MTU 1024") {
		t.Fatalf("path MTU 4096 on a 1500-byte link: %v", err)
	}
	if err := qp.PostSend(&SendWR{Opcode: WRSend}); err == nil {
		t.Fatal("post send in INIT accepted")
	}
}

// TestCQOverrunMovesQPToError: a receive CQ too small for the completions
// raises the CQ's error event and the QP goes to ERR with a QP fatal event.
func TestCQOverrunMovesQPToError(t *testing.T) {
	a, b := openPair(t)
	mk := func(d *Device, depth int) (*QP, *CQ, *MR) {
		pd, _ := d.AllocPD()
		c, _ := d.CreateCQ(depth)
		mr, _ := pd.RegMR(make([]byte, 4096), AccessLocalWrite)
		qp, _ := pd.CreateQP(QPInitAttr{SendCQ: c, RecvCQ: c})
		return qp, c, mr
	}
	qa, _, mra := mk(a, 64)
	qb, cb, mrb := mk(b, 1)
	ga, _ := a.QueryGID(0)
	gb, _ := b.QueryGID(0)
	if err := qa.Connect(RemoteInfo{QPN: qb.Num(), PSN: 1, GID: gb}, &ConnectOptions{SQPSN: 1}); err != nil {
		t.Fatal(err)
	}
	if err := qb.Connect(RemoteInfo{QPN: qa.Num(), PSN: 1, GID: ga}, &ConnectOptions{SQPSN: 1}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		qb.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{{Addr: mrb.Addr(), Length: 64, LKey: mrb.LKey()}}})
		qa.PostSend(&SendWR{ID: uint64(i), Opcode: WRSend, SGL: []SGE{{Addr: mra.Addr(), Length: 8, LKey: mra.LKey()}}})
	}
	select {
	case ev := <-cb.Events():
		if ev.Type != cq.EventCQErr {
			t.Fatalf("CQ event %+v", ev)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no CQ error event")
	}
	// The device reports both: the CQ error naming the CQ, and the QP that
	// could not complete going to ERR.
	var sawCQErr, sawQPFatal bool
	for !sawCQErr || !sawQPFatal {
		select {
		case ev := <-b.AsyncEvents():
			switch {
			case ev.Type == EventCQErr && ev.CQ == cb:
				sawCQErr = true
			case ev.Type == EventQPFatal && ev.QPNum == qb.Num():
				sawQPFatal = true
			default:
				t.Fatalf("async event %+v", ev)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("async events: CQ error %v, QP fatal %v", sawCQErr, sawQPFatal)
		}
	}
	if qb.State() != StateErr {
		t.Fatalf("QP state %v", qb.State())
	}
}
