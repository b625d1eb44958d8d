package verbs

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/transport/engine"
)

// TestDestroyQPTwice: the second Destroy of a QP reports an error.
func TestDestroyQPTwice(t *testing.T) {
	a, _ := openPair(t)
	pd, _ := a.AllocPD()
	c, _ := a.CreateCQ(16)
	qp, err := pd.CreateQP(QPInitAttr{SendCQ: c, RecvCQ: c})
	if err != nil {
		t.Fatal(err)
	}
	if err := qp.Destroy(); err != nil {
		t.Fatalf("first Destroy: %v", err)
	}
	if err := qp.Destroy(); !errors.Is(err, engine.ErrNoQP) {
		t.Fatalf("second Destroy = %v, want engine.ErrNoQP", err)
	}
}

// TestSGELimitsApart: max_send_sge bounds PostSend and max_recv_sge
// bounds PostRecv, each on its own.
func TestSGELimitsApart(t *testing.T) {
	a, b := openPair(t)
	pda, _ := a.AllocPD()
	pdb, _ := b.AllocPD()
	c, _ := a.CreateCQ(16)
	cb, _ := b.CreateCQ(16)
	qa, err := pda.CreateQP(QPInitAttr{SendCQ: c, RecvCQ: c, Cap: QPCap{MaxSendSGE: 1, MaxRecvSGE: 3}})
	if err != nil {
		t.Fatal(err)
	}
	qb, _ := pdb.CreateQP(QPInitAttr{SendCQ: cb, RecvCQ: cb})
	ga, _ := a.QueryGID(0)
	gb, _ := b.QueryGID(0)
	if err := qa.Connect(RemoteInfo{QPN: qb.Num(), GID: gb}, nil); err != nil {
		t.Fatal(err)
	}
	if err := qb.Connect(RemoteInfo{QPN: qa.Num(), GID: ga}, nil); err != nil {
		t.Fatal(err)
	}
	mr, _ := pda.RegMR(make([]byte, 64), AccessLocalWrite)
	sge := SGE{Addr: mr.Addr(), Length: 8, LKey: mr.LKey()}
	if err := qa.PostSend(&SendWR{Opcode: WRSend, SGL: []SGE{sge, sge}}); err == nil || !strings.Contains(err.Error(), "max_send_sge") {
		t.Errorf("PostSend with 2 SGEs on max_send_sge 1 = %v", err)
	}
	if err := qa.PostRecv(&RecvWR{SGL: []SGE{sge, sge, sge}}); err != nil {
		t.Errorf("PostRecv with 3 SGEs on max_recv_sge 3 = %v", err)
	}
	if err := qa.PostRecv(&RecvWR{SGL: []SGE{sge, sge, sge, sge}}); err == nil || !strings.Contains(err.Error(), "max_recv_sge") {
		t.Errorf("PostRecv with 4 SGEs on max_recv_sge 3 = %v", err)
	}
}

// TestSendCQOverrunMovesQPToError: a send CQ too small for the
// completions raises its CQ error event and the QP goes to ERR with a QP
// fatal event, as on the receive side.
func TestSendCQOverrunMovesQPToError(t *testing.T) {
	a, b := openPair(t)
	pda, _ := a.AllocPD()
	pdb, _ := b.AllocPD()
	sendCQ, _ := a.CreateCQ(1)
	recvCQ, _ := a.CreateCQ(16)
	cb, _ := b.CreateCQ(16)
	qa, _ := pda.CreateQP(QPInitAttr{SendCQ: sendCQ, RecvCQ: recvCQ})
	qb, _ := pdb.CreateQP(QPInitAttr{SendCQ: cb, RecvCQ: cb})
	ga, _ := a.QueryGID(0)
	gb, _ := b.QueryGID(0)
	if err := qa.Connect(RemoteInfo{QPN: qb.Num(), GID: gb}, nil); err != nil {
		t.Fatal(err)
	}
	if err := qb.Connect(RemoteInfo{QPN: qa.Num(), GID: ga}, nil); err != nil {
		t.Fatal(err)
	}
	mra, _ := pda.RegMR(make([]byte, 64), AccessLocalWrite)
	mrb, _ := pdb.RegMR(make([]byte, 64), AccessLocalWrite|AccessRemoteWrite)
	for i := 0; i < 3; i++ {
		if err := qa.PostSend(&SendWR{ID: uint64(i), Opcode: WRRDMAWrite, Flags: SendSignaled, RemoteAddr: mrb.Addr(), RKey: mrb.RKey(),
			SGL: []SGE{{Addr: mra.Addr(), Length: 8, LKey: mra.LKey()}}}); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case ev := <-sendCQ.Events():
		if ev.Type != cq.EventCQErr {
			t.Fatalf("CQ event %+v", ev)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no CQ error event")
	}
	// The device's async events carry both: the CQ error naming the CQ
	// (raised as the completion is rejected) and the QP fatal error.
	var sawCQErr, sawQPFatal bool
	for !sawCQErr || !sawQPFatal {
		select {
		case ev := <-a.AsyncEvents():
			switch {
			case ev.Type == EventCQErr && ev.CQ == sendCQ:
				sawCQErr = true
			case ev.Type == EventQPFatal && ev.QPNum == qa.Num():
				sawQPFatal = true
			default:
				t.Fatalf("async event %+v", ev)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("async events: CQ error %v, QP fatal %v", sawCQErr, sawQPFatal)
		}
	}
	if qa.State() != StateErr {
		t.Fatalf("QP state %v, want ERR", qa.State())
	}
}
