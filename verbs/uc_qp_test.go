package verbs

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/qpstate"
)

// ucPair connects a UC QP on each of two devices.
func ucPair(t *testing.T) (qa, qb *QP, ca, cb *CQ, mra, mrb *MR, bufa, bufb []byte) {
	t.Helper()
	a, b := openPair(t)
	pda, _ := a.AllocPD()
	pdb, _ := b.AllocPD()
	ca, _ = a.CreateCQ(64)
	cb, _ = b.CreateCQ(64)
	var err error
	if qa, err = pda.CreateQP(QPInitAttr{Type: QPTypeUC, SendCQ: ca, RecvCQ: ca}); err != nil {
		t.Fatal(err)
	}
	if qb, err = pdb.CreateQP(QPInitAttr{Type: QPTypeUC, SendCQ: cb, RecvCQ: cb}); err != nil {
		t.Fatal(err)
	}
	bufa, bufb = make([]byte, 16<<10), make([]byte, 16<<10)
	mra, _ = pda.RegMR(bufa, AccessLocalWrite|AccessRemoteWrite)
	mrb, _ = pdb.RegMR(bufb, AccessLocalWrite|AccessRemoteWrite)
	ga, _ := a.QueryGID(0)
	gb, _ := b.QueryGID(0)
	if err := qa.Connect(RemoteInfo{QPN: qb.Num(), PSN: 0x200, GID: gb}, &ConnectOptions{SQPSN: 0x100}); err != nil {
		t.Fatal(err)
	}
	if err := qb.Connect(RemoteInfo{QPN: qa.Num(), PSN: 0x100, GID: ga}, &ConnectOptions{SQPSN: 0x200}); err != nil {
		t.Fatal(err)
	}
	return
}

func waitWC(t *testing.T, c *CQ) WC {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	wc := make([]WC, 1)
	if _, err := c.Wait(ctx, wc); err != nil {
		t.Fatal(err)
	}
	return wc[0]
}

// TestUCQP: a UC QP connects with UC's attributes, carries a multi-packet
// SEND with immediate, a WRITE and a WRITE with immediate, and refuses
// READ and atomics at post time.
func TestUCQP(t *testing.T) {
	qa, qb, ca, cb, mra, mrb, bufa, bufb := ucPair(t)
	attr, init := qa.Query()
	if init.Type != QPTypeUC || attr.State != StateRTS || attr.SQPSN != 0x100 || attr.RQPSN != 0x200 || attr.Timeout != 0 || attr.MaxRDAtomic != 0 {
		t.Fatalf("attributes %+v %+v", attr, init)
	}
	for i := range bufa {
		bufa[i] = byte(i * 13)
	}
	if err := qb.PostRecv(&RecvWR{ID: 9, SGL: []SGE{{Addr: mrb.Addr(), Length: 8192, LKey: mrb.LKey()}}}); err != nil {
		t.Fatal(err)
	}
	if err := qb.PostRecv(&RecvWR{ID: 10, SGL: []SGE{{Addr: mrb.Addr(), Length: 16, LKey: mrb.LKey()}}}); err != nil {
		t.Fatal(err)
	}
	post := func(w *SendWR) {
		t.Helper()
		if err := qa.PostSend(w); err != nil {
			t.Fatal(err)
		}
		if wc := waitWC(t, ca); wc.Status != cq.Success || wc.WRID != w.ID {
			t.Fatalf("send completion %+v", wc)
		}
	}
	post(&SendWR{ID: 1, Opcode: WRSendWithImm, Flags: SendSignaled, Imm: 0x55, SGL: []SGE{{Addr: mra.Addr(), Length: 5000, LKey: mra.LKey()}}})
	if wc := waitWC(t, cb); wc.WRID != 9 || wc.Status != cq.Success || wc.ByteLen != 5000 || wc.ImmData != 0x55 || !bytes.Equal(bufb[:5000], bufa[:5000]) {
		t.Fatalf("SEND arrived as %+v", wc)
	}
	post(&SendWR{ID: 2, Opcode: WRRDMAWrite, Flags: SendSignaled, SGL: []SGE{{Addr: mra.Addr() + 100, Length: 3000, LKey: mra.LKey()}}, RemoteAddr: mrb.Addr() + 8192, RKey: mrb.RKey()})
	post(&SendWR{ID: 3, Opcode: WRRDMAWriteWithImm, Flags: SendSignaled, Imm: 0x66, SGL: []SGE{{Addr: mra.Addr(), Length: 1, LKey: mra.LKey()}}, RemoteAddr: mrb.Addr() + 12000, RKey: mrb.RKey()})
	if wc := waitWC(t, cb); wc.WRID != 10 || wc.Opcode != cq.OpRecvRDMAWithImm || wc.ImmData != 0x66 {
		t.Fatalf("WRITE with immediate arrived as %+v", wc)
	}
	// The WRITE before it is placed: the packets of one QP arrive in order.
	if !bytes.Equal(bufb[8192:11192], bufa[100:3100]) || bufb[12000] != bufa[0] {
		t.Fatal("WRITE data differs")
	}
	for _, op := range []WROpcode{WRRDMARead, WRAtomicCmpAndSwp, WRAtomicFetchAndAdd, WRSendWithInv} {
		err := qa.PostSend(&SendWR{Opcode: op, SGL: []SGE{{Addr: mra.Addr(), Length: 8, LKey: mra.LKey()}}, RemoteAddr: mrb.Addr(), RKey: mrb.RKey()})
		if err == nil || !strings.Contains(err.Error(), "UC") {
			t.Errorf("post %v on a UC QP: %v", op, err)
		}
	}
	if qa.Stats().RxPackets != 0 {
		t.Fatalf("the UC requester received %d packets: UC has no ACKs", qa.Stats().RxPackets)
	}
}

// TestUCModifyMasks: modify-QP follows UC's attribute masks: RC-only
// attributes (timeout, retries) are refused on the way to RTS.
func TestUCModifyMasks(t *testing.T) {
	a, _ := openPair(t)
	pd, _ := a.AllocPD()
	c, _ := a.CreateCQ(8)
	qp, err := pd.CreateQP(QPInitAttr{Type: QPTypeUC, SendCQ: c, RecvCQ: c})
	if err != nil {
		t.Fatal(err)
	}
	g, _ := a.QueryGID(0)
	if err := qp.Init(AccessRemoteWrite); err != nil {
		t.Fatal(err)
	}
	rtr := QPAttr{State: StateRTR, PathMTU: 1024, DestQPN: 5, AV: AddressVector{DGID: g}}
	if err := qp.Modify(&rtr, qpstate.AttrState|qpstate.AttrAV|qpstate.AttrPathMTU|qpstate.AttrDestQPN|qpstate.AttrRQPSN); err != nil {
		t.Fatal(err)
	}
	rts := QPAttr{State: StateRTS, Timeout: 14}
	var te *qpstate.TransitionError
	if err := qp.Modify(&rts, qpstate.AttrState|qpstate.AttrSQPSN|qpstate.AttrTimeout); !errors.As(err, &te) {
		t.Fatalf("RTS with a timeout on UC = %v, want a TransitionError", err)
	}
	if err := qp.Modify(&rts, qpstate.AttrState|qpstate.AttrSQPSN); err != nil {
		t.Fatal(err)
	}
	// A service softroce does not implement (XRC, raw) is refused.
	if _, err := pd.CreateQP(QPInitAttr{Type: QPType(3), SendCQ: c, RecvCQ: c}); err == nil {
		t.Fatal("CreateQP of an unknown QP type succeeded")
	}
}
