package verbs

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/softroce/softroce/qpstate"
)

// TestSRQOverPipe: two QPs of device b on one SRQ receive SENDs from two
// QPs of device a; the SRQ's WQEs are taken in posting order, the limit
// event names the SRQ and comes once, a QP on the SRQ refuses its own
// PostRecv, moving one to ERR raises Last WQE Reached for it, and the SRQ
// cannot be destroyed while the QPs exist.
func TestSRQOverPipe(t *testing.T) {
	a, b := openPair(t)
	pda, _ := a.AllocPD()
	pdb, _ := b.AllocPD()
	ca, _ := a.CreateCQ(64)
	cb, _ := b.CreateCQ(64)
	if d := b.QueryDevice(); d.MaxSRQ != MaxSRQ || d.MaxSRQWR != MaxSRQWR || d.MaxSRQSGE != MaxSRQSGE {
		t.Fatalf("device SRQ limits %+v", d)
	}
	for _, bad := range []SRQInitAttr{{MaxWR: MaxSRQWR + 1}, {MaxSGE: MaxSRQSGE + 1}, {MaxWR: 4, Limit: 5}, {MaxWR: -1}} {
		if _, err := pdb.CreateSRQ(bad); err == nil {
			t.Errorf("CreateSRQ(%+v) accepted", bad)
		}
	}
	srq, err := pdb.CreateSRQ(SRQInitAttr{MaxWR: 16, MaxSGE: 2})
	if err != nil {
		t.Fatal(err)
	}
	if q := srq.Query(); q != (SRQAttr{MaxWR: 16, MaxSGE: 2}) {
		t.Fatalf("Query = %+v", q)
	}
	ga, _ := a.QueryGID(0)
	gb, _ := b.QueryGID(0)
	var qa, qb [2]*QP
	for k := range 2 {
		qa[k], _ = pda.CreateQP(QPInitAttr{SendCQ: ca, RecvCQ: ca})
		qb[k], err = pdb.CreateQP(QPInitAttr{SendCQ: cb, RecvCQ: cb, SRQ: srq})
		if err != nil {
			t.Fatal(err)
		}
		if err := qa[k].Connect(RemoteInfo{QPN: qb[k].Num(), GID: gb}, nil); err != nil {
			t.Fatal(err)
		}
		if err := qb[k].Connect(RemoteInfo{QPN: qa[k].Num(), GID: ga}, nil); err != nil {
			t.Fatal(err)
		}
	}
	src := make([]byte, 8192)
	for i := range src {
		src[i] = byte(i*13 + i>>8)
	}
	dst := make([]byte, 8*4096)
	mra, _ := pda.RegMR(src, AccessLocalWrite)
	mrb, _ := pdb.RegMR(dst, AccessLocalWrite)
	if err := qb[0].PostRecv(&RecvWR{ID: 1, SGL: []SGE{{Addr: mrb.Addr(), Length: 8, LKey: mrb.LKey()}}}); err == nil || !strings.Contains(err.Error(), "SRQ") {
		t.Fatalf("PostRecv on a QP with an SRQ = %v", err)
	}
	for i := range 8 {
		if err := srq.PostRecv(&RecvWR{ID: uint64(100 + i), SGL: []SGE{{Addr: mrb.Addr() + uint64(i*4096), Length: 4096, LKey: mrb.LKey()}}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := srq.Modify(SRQAttr{Limit: 17}, SRQLimit); err == nil {
		t.Fatal("limit above max_wr accepted")
	}
	if err := srq.Modify(SRQAttr{Limit: 6}, SRQLimit); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sizes := []int{4096, 0, 1, 3000}
	for i, n := range sizes { // QP 0, 1, 0, 1: one at a time, so the order is known
		k := i % 2
		if err := qa[k].PostSend(&SendWR{ID: uint64(i), Opcode: WRSend, Flags: SendSignaled, SGL: []SGE{{Addr: mra.Addr() + uint64(i), Length: uint32(n), LKey: mra.LKey()}}}); err != nil {
			t.Fatal(err)
		}
		wc := make([]WC, 1)
		if _, err := cb.Wait(ctx, wc); err != nil {
			t.Fatal(err)
		}
		if wc[0].Status != 0 || wc[0].WRID != uint64(100+i) || wc[0].QPNum != qb[k].Num() || int(wc[0].ByteLen) != n {
			t.Fatalf("receive %d: %+v, want WR %d on QP %d, %d bytes", i, wc[0], 100+i, qb[k].Num(), n)
		}
		var got []byte
		b.eng.Sync(func() { got = append(got, dst[i*4096:i*4096+n]...) })
		if !bytes.Equal(got, src[i:i+n]) {
			t.Fatalf("receive %d: data differs", i)
		}
		if _, err := ca.Wait(ctx, wc); err != nil || wc[0].Status != 0 {
			t.Fatalf("send %d: %+v %v", i, wc[0], err)
		}
	}
	// 8 -> 4 left: below 6 once, at the third receive.
	select {
	case ev := <-b.AsyncEvents():
		if ev.Type != EventSRQLimitReached || ev.SRQ != srq || ev.Type.String() != "SRQ limit reached" {
			t.Fatalf("event %+v (%v)", ev, ev.Type)
		}
	case <-ctx.Done():
		t.Fatal("no SRQ limit event")
	}
	if q := srq.Query(); q.Limit != 0 {
		t.Fatalf("limit %d after the event, want 0 (disarmed)", q.Limit)
	}
	if err := srq.Destroy(); !errors.Is(err, ErrBusy) {
		t.Fatalf("Destroy with QPs = %v", err)
	}
	if err := pdb.Dealloc(); !errors.Is(err, ErrBusy) {
		t.Fatalf("Dealloc with an SRQ = %v", err)
	}
	if err := qb[0].Modify(&QPAttr{State: StateErr}, qpstate.AttrState); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-b.AsyncEvents():
		if ev.Type != EventQPLastWQEReached || ev.QPNum != qb[0].Num() || ev.Type.String() != "last WQE reached" {
			t.Fatalf("event %+v (%v)", ev, ev.Type)
		}
	case <-ctx.Done():
		t.Fatal("no last WQE reached event")
	}
	for _, q := range qb {
		if err := q.Destroy(); err != nil {
			t.Fatal(err)
		}
	}
	if err := srq.Destroy(); err != nil {
		t.Fatal(err)
	}
	if err := srq.PostRecv(&RecvWR{ID: 1}); err == nil {
		t.Fatal("post to a destroyed SRQ accepted")
	}
	if _, err := pdb.CreateQP(QPInitAttr{SendCQ: cb, RecvCQ: cb, SRQ: srq}); err == nil {
		t.Fatal("QP created on a destroyed SRQ")
	}
	other, _ := b.AllocPD()
	s2, _ := pdb.CreateSRQ(SRQInitAttr{})
	if _, err := other.CreateQP(QPInitAttr{SendCQ: cb, RecvCQ: cb, SRQ: s2}); err == nil {
		t.Fatal("QP created on an SRQ of another PD")
	}
}
