package verbs

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/nic"
)

// rcPair is one connected RC QP on each of two devices.
type rcPair struct {
	qa, qb *QP
	ca, cb *CQ
}

func connectPair(t *testing.T, a, b *Device, pda, pdb *PD, o *ConnectOptions) rcPair {
	t.Helper()
	ca, _ := a.CreateCQ(64)
	cb, _ := b.CreateCQ(64)
	qa, err := pda.CreateQP(QPInitAttr{SendCQ: ca, RecvCQ: ca})
	if err != nil {
		t.Fatal(err)
	}
	qb, err := pdb.CreateQP(QPInitAttr{SendCQ: cb, RecvCQ: cb})
	if err != nil {
		t.Fatal(err)
	}
	ga, _ := a.QueryGID(0)
	gb, _ := b.QueryGID(0)
	oa, ob := *o, *o
	oa.SQPSN, ob.SQPSN = 100, 200
	if err := qa.Connect(RemoteInfo{QPN: qb.Num(), PSN: 200, GID: gb}, &oa); err != nil {
		t.Fatal(err)
	}
	if err := qb.Connect(RemoteInfo{QPN: qa.Num(), PSN: 100, GID: ga}, &ob); err != nil {
		t.Fatal(err)
	}
	return rcPair{qa, qb, ca, cb}
}

// post posts w, signaled, on qa and returns its completion.
func (p rcPair) post(t *testing.T, w SendWR) cq.WC {
	t.Helper()
	w.Flags |= SendSignaled
	if err := p.qa.PostSend(&w); err != nil {
		t.Fatal(err)
	}
	return waitOne(t, p.ca, w.Opcode.String())
}

func waitOne(t *testing.T, c *CQ, what string) cq.WC {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	wcs := make([]cq.WC, 1)
	if _, err := c.Wait(ctx, wcs); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return wcs[0]
}

// TestRemoteInvalidateOfUserMR: a peer's SEND_WITH_INV naming the rkey of
// an MR made by RegMR does not invalidate it. As rxe (class J): the
// responder sends no NAK, its receive completes REM_INV_REQ_ERR and its QP
// goes to ERR; the MR is still writable through another QP.
func TestRemoteInvalidateOfUserMR(t *testing.T) {
	a, b := openPair(t)
	var mu sync.Mutex
	var fromB []string
	b.SetPacketTrace(func(dir byte, p *nic.Packet) {
		var bp bth.Packet
		if dir == 'T' && bth.Parse(&bp, p.Bytes()) == nil {
			s := bp.BTH.Opcode().String()
			if bp.AETH != nil {
				s += " " + bp.AETH.Syndrome().String()
			}
			mu.Lock()
			fromB = append(fromB, s)
			mu.Unlock()
		}
	})
	pda, _ := a.AllocPD()
	pdb, _ := b.AllocPD()
	mra, _ := pda.RegMR(make([]byte, 4096), AccessLocalWrite)
	bufb := make([]byte, 4096)
	mrb, _ := pdb.RegMR(bufb, AccessLocalWrite|AccessRemoteWrite)
	p := connectPair(t, a, b, pda, pdb, &ConnectOptions{Timeout: 16, RetryCnt: 2})
	if err := p.qb.PostRecv(&RecvWR{ID: 7, SGL: []SGE{{Addr: mrb.Addr(), Length: 64, LKey: mrb.LKey()}}}); err != nil {
		t.Fatal(err)
	}
	if err := p.qa.PostSend(&SendWR{ID: 1, Opcode: WRSendWithInv, Flags: SendSignaled, InvRKey: mrb.RKey(),
		SGL: []SGE{{Addr: mra.Addr(), Length: 16, LKey: mra.LKey()}}}); err != nil {
		t.Fatal(err)
	}
	if wc := waitOne(t, p.cb, "receive completion"); wc.WRID != 7 || wc.Status != cq.RemInvReqErr || wc.Flags&cq.FlagWithInv != 0 {
		t.Fatalf("receive completion %+v, want REM_INV_REQ_ERR", wc)
	}
	if s := p.qb.State(); s != StateErr {
		t.Fatalf("responder QP state %v, want ERR", s)
	}
	// The SEND was received in order: it is ACKed (as rxe 6.1 does), never
	// NAKed, so the requester completes it.
	if wc := waitOne(t, p.ca, "send completion"); wc.WRID != 1 || wc.Status != cq.Success {
		t.Fatalf("send completion %+v, want success", wc)
	}
	mu.Lock()
	sent := append([]string(nil), fromB...)
	mu.Unlock()
	for _, line := range sent {
		if !strings.Contains(line, "ACK") || strings.Contains(line, "NAK") {
			t.Fatalf("responder sent %q, want only ACKs (class J: no NAK)", sent)
		}
	}
	// The MR survives: a WRITE through another QP pair lands.
	p2 := connectPair(t, a, b, pda, pdb, &ConnectOptions{})
	src := mra.Buf()
	for i := range src[:256] {
		src[i] = byte(i*7 + 3)
	}
	if err := p2.qa.PostSend(&SendWR{ID: 2, Opcode: WRRDMAWrite, Flags: SendSignaled, RemoteAddr: mrb.Addr() + 512, RKey: mrb.RKey(),
		SGL: []SGE{{Addr: mra.Addr(), Length: 256, LKey: mra.LKey()}}}); err != nil {
		t.Fatal(err)
	}
	if wc := waitOne(t, p2.ca, "WRITE completion"); wc.Status != cq.Success {
		t.Fatalf("WRITE to the MR after the refused invalidate: %v", wc.Status)
	}
	if !bytes.Equal(bufb[512:768], src[:256]) {
		t.Fatal("WRITE data did not land")
	}
}
