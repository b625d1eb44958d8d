package verbs

import (
	"context"
	"encoding/binary"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/softroce/softroce/transport/engine"
)

// TestSRQModifyRules: the ibv_modify_srq rules of a resize, without
// traffic: the device reports SRQ_RESIZE; a size above max_srq_wr, below
// 1, below the posted WQEs or below the armed limit is refused and changes
// nothing; unknown mask bits are refused; MaxWR and Limit together apply
// together; a shrink to the posted count keeps them.
func TestSRQModifyRules(t *testing.T) {
	_, b := openPair(t)
	if b.QueryDevice().DeviceCapFlags&DeviceSRQResize == 0 || DeviceSRQResize != 0x2000 {
		t.Fatal("SRQ_RESIZE not reported")
	}
	pd, _ := b.AllocPD()
	srq, err := pd.CreateSRQ(SRQInitAttr{MaxWR: 8, MaxSGE: 1})
	if err != nil {
		t.Fatal(err)
	}
	mr, _ := pd.RegMR(make([]byte, 4096), AccessLocalWrite)
	for i := range 5 {
		if err := srq.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{{Addr: mr.Addr(), Length: 16, LKey: mr.LKey()}}}); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		attr SRQAttr
		mask SRQAttrMask
	}{
		{SRQAttr{MaxWR: MaxSRQWR + 1}, SRQMaxWR},
		{SRQAttr{MaxWR: 0}, SRQMaxWR},
		{SRQAttr{MaxWR: 4}, SRQMaxWR},
		{SRQAttr{MaxWR: 20, Limit: 21}, SRQMaxWR | SRQLimit},
		{SRQAttr{MaxWR: 20}, 1 << 4},
	} {
		if err := srq.Modify(c.attr, c.mask); err == nil {
			t.Fatalf("Modify(%+v, %#x) accepted", c.attr, c.mask)
		}
	}
	if q := srq.Query(); q != (SRQAttr{MaxWR: 8, MaxSGE: 1}) {
		t.Fatalf("after refused modifies: %+v", q)
	}
	if err := srq.Modify(SRQAttr{MaxWR: 20, Limit: 12}, SRQMaxWR|SRQLimit); err != nil {
		t.Fatal(err)
	}
	if err := srq.Modify(SRQAttr{MaxWR: 11}, SRQMaxWR); err == nil {
		t.Fatal("resize below the armed limit accepted")
	}
	if err := srq.Modify(SRQAttr{MaxWR: 5, Limit: 0}, SRQMaxWR|SRQLimit); err != nil {
		t.Fatal(err)
	}
	if q := srq.Query(); q != (SRQAttr{MaxWR: 5, MaxSGE: 1}) {
		t.Fatalf("after the shrink: %+v", q)
	}
	if err := srq.PostRecv(&RecvWR{ID: 9, SGL: []SGE{{Addr: mr.Addr(), Length: 16, LKey: mr.LKey()}}}); !errors.Is(err, engine.ErrQueueFull) {
		t.Fatalf("post into the full shrunk SRQ: %v", err)
	}
}

// TestSRQResizeWhileConsumed (run with -race): two QPs of device b on one
// SRQ receive SENDs from two QPs of device a while another goroutine posts
// the WQEs and keeps resizing the SRQ, growing it when full and shrinking
// it to what is posted. Every message arrives once, each QP's in order,
// and the WQEs are taken in posting order, none lost.
func TestSRQResizeWhileConsumed(t *testing.T) {
	a, b := openPair(t)
	pda, _ := a.AllocPD()
	pdb, _ := b.AllocPD()
	const perQP, msgLen = 300, 8
	total := 2 * perQP
	ca, _ := a.CreateCQ(2 * total)
	cb, _ := b.CreateCQ(2 * total)
	srq, err := pdb.CreateSRQ(SRQInitAttr{MaxWR: 2, MaxSGE: 1})
	if err != nil {
		t.Fatal(err)
	}
	ga, _ := a.QueryGID(0)
	gb, _ := b.QueryGID(0)
	var qa, qb [2]*QP
	for k := range 2 {
		qa[k], _ = pda.CreateQP(QPInitAttr{SendCQ: ca, RecvCQ: ca})
		if qb[k], err = pdb.CreateQP(QPInitAttr{SendCQ: cb, RecvCQ: cb, SRQ: srq}); err != nil {
			t.Fatal(err)
		}
		opts := &ConnectOptions{RNRRetry: 7, MinRNRTimer: 1, Timeout: 14, RetryCnt: 7}
		if err := qa[k].Connect(RemoteInfo{QPN: qb[k].Num(), GID: gb}, opts); err != nil {
			t.Fatal(err)
		}
		if err := qb[k].Connect(RemoteInfo{QPN: qa[k].Num(), GID: ga}, opts); err != nil {
			t.Fatal(err)
		}
	}
	src := make([]byte, total*msgLen)
	mra, _ := pda.RegMR(src, AccessLocalWrite)
	dst := make([]byte, total*msgLen)
	mrb, _ := pdb.RegMR(dst, AccessLocalWrite)
	for k := range 2 {
		for i := range perQP {
			off := (k*perQP + i) * msgLen
			binary.LittleEndian.PutUint32(src[off:], uint32(k))
			binary.LittleEndian.PutUint32(src[off+4:], uint32(i))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	errc := make(chan error, 3)
	resizes := 0
	go func() { // the poster and resizer
		for id := 0; id < total; {
			err := srq.PostRecv(&RecvWR{ID: uint64(id), SGL: []SGE{{Addr: mrb.Addr() + uint64(id*msgLen), Length: msgLen, LKey: mrb.LKey()}}})
			switch {
			case err == nil:
				id++
				if id%7 == 0 {
					// Shrink to what is posted: the QPs only take, so it fits.
					if err := srq.Modify(SRQAttr{MaxWR: max(srq.rc.Query().Posted, 1)}, SRQMaxWR); err != nil {
						errc <- err
						return
					}
					resizes++
				}
			case errors.Is(err, engine.ErrQueueFull):
				if err := srq.Modify(SRQAttr{MaxWR: srq.Query().MaxWR + 1 + id%5}, SRQMaxWR); err != nil {
					errc <- err
					return
				}
				resizes++
			default:
				errc <- err
				return
			}
			if ctx.Err() != nil {
				return
			}
		}
		errc <- nil
	}()
	for k := range 2 {
		go func() { // a sender per QP
			for i := 0; i < perQP; {
				off := uint64((k*perQP + i) * msgLen)
				err := qa[k].PostSend(&SendWR{ID: uint64(i), Opcode: WRSend, Flags: SendSignaled, SGL: []SGE{{Addr: mra.Addr() + off, Length: msgLen, LKey: mra.LKey()}}})
				switch {
				case err == nil:
					i++
				case errors.Is(err, engine.ErrQueueFull):
					runtime.Gosched()
				default:
					errc <- err
					return
				}
				if ctx.Err() != nil {
					return
				}
			}
			errc <- nil
		}()
	}
	wcs := make([]WC, 64)
	next := [2]uint32{}
	for got := 0; got < total; {
		n, err := cb.Wait(ctx, wcs)
		if err != nil {
			t.Fatalf("after %d receives: %v", got, err)
		}
		for _, wc := range wcs[:n] {
			if wc.Status != 0 || wc.WRID != uint64(got) || wc.ByteLen != msgLen {
				t.Fatalf("receive %d: %+v, want WQE %d", got, wc, got)
			}
			var k, i uint32
			b.eng.Sync(func() {
				k = binary.LittleEndian.Uint32(dst[got*msgLen:])
				i = binary.LittleEndian.Uint32(dst[got*msgLen+4:])
			})
			if k > 1 || wc.QPNum != qb[k].Num() || i != next[k] {
				t.Fatalf("receive %d on QP %d: message %d of QP %d, want %d", got, wc.QPNum, i, k, next[k])
			}
			next[k]++
			got++
		}
	}
	for range 3 {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	for sent := 0; sent < total; {
		n, err := ca.Wait(ctx, wcs)
		if err != nil {
			t.Fatal(err)
		}
		for _, wc := range wcs[:n] {
			if wc.Status != 0 {
				t.Fatalf("send completion %+v", wc)
			}
		}
		sent += n
	}
	if resizes < 10 {
		t.Fatalf("only %d resizes", resizes)
	}
	t.Logf("%d resizes, final %+v", resizes, srq.Query())
}
