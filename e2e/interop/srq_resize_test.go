package interop

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/softroce/softroce/conformance/agent"
	"github.com/softroce/softroce/internal/devsync"
	"github.com/softroce/softroce/transport/engine"
	"github.com/softroce/softroce/verbs"
)

// TestSRQResizeAgainstRxe: kernel rxe sends on two RC connections to
// softroce QPs sharing one SRQ while a host goroutine posts the SRQ's WQEs
// a few at a time and keeps resizing it, growing it when full and
// shrinking it to what is posted. Every message lands once, in its
// connection's order, in the SRQ's WQEs taken in posting order (rxe rides
// out the empty SRQ's RNR NAKs). Then the resize rules are compared on an
// rxe SRQ (ibv_modify_srq through the agent) and a softroce one holding
// the same posted WQEs: both refuse a size below the posted WQEs, above
// max_srq_wr or below the armed limit, both may shrink while the WQEs fit,
// and rxe's SRQ still hands out its WQEs in posting order after two
// resizes, to softroce's SENDs.
func TestSRQResizeAgainstRxe(t *testing.T) {
	needVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	must := mustOf(t)
	ag, apd, amr, acq := rxeSide(t, ctx)
	agid, err := ag.GID(ctx, 1)
	must(err)

	dev, pd, buf, mr, cq := hostSide(t, bufLen, 512)
	if dev.QueryDevice().DeviceCapFlags&verbs.DeviceSRQResize == 0 {
		t.Fatal("softroce does not report SRQ_RESIZE")
	}
	srq, err := pd.CreateSRQ(verbs.SRQInitAttr{MaxWR: 2, MaxSGE: 1})
	must(err)
	sgid, err := dev.QueryGID(0)
	must(err)
	const mtu, perQP, wqeLen = 1024, 60, 4096
	total := 2 * perQP
	var aqp [2]agent.QP
	var qp [2]*verbs.QP
	for k := range 2 {
		aqp[k], err = ag.CreateQP(ctx, apd, acq, acq, agent.QPCap{SendWR: 128, RecvWR: 16})
		must(err)
		must(ag.ModifyToInit(ctx, aqp[k], agent.AccessAll))
		qp[k], err = pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 16}, SRQ: srq})
		must(err)
		apsn, spsn := uint32(rand.IntN(1<<24)), uint32(rand.IntN(1<<24))
		must(connectRC(ctx, ag, aqp[k], agid, qp[k], sgid, mtu, apsn, spsn, 0, verbs.ConnectOptions{MinRNRTimer: 1}))
	}
	// Message i of connection k: (k, i) then a pattern, 8..3007 bytes,
	// one to four packets.
	msgLen := func(k, i int) int { return 8 + (k*perQP+i)*997%3000 }
	msg := func(k, i int) []byte {
		b := pattern(msgLen(k, i), byte(k*perQP+i))
		binary.LittleEndian.PutUint32(b, uint32(k))
		binary.LittleEndian.PutUint32(b[4:], uint32(i))
		return b
	}
	src := make([]byte, 0, total*wqeLen)
	for j := range total {
		m := msg(j%2, j/2)
		src = append(src, m...)
		src = append(src, make([]byte, wqeLen-len(m))...)
	}
	must(ag.WriteMem(ctx, amr, 0, src))

	// The host side: post the WQEs a few at a time, keeping at most a
	// varying handful outstanding so rxe finds the SRQ short (RNR NAKs),
	// and resize as it goes: shrink to what is outstanding every 5 WQEs,
	// grow when full.
	type result struct {
		resizes, during int // during: with messages received and more to come
		err             error
	}
	done := make(chan result, 1)
	var received atomic.Int64
	go func() {
		r := result{}
		resized := func(err error) bool {
			if r.err = err; err != nil {
				return false
			}
			r.resizes++
			if n := received.Load(); n > 0 && n < int64(total) {
				r.during++
			}
			return true
		}
		for id := 0; id < total && ctx.Err() == nil; {
			// Posted but not yet completed: the QPs can only lower it.
			left := id - int(received.Load())
			if left >= 2+(id/10)%8 {
				time.Sleep(100 * time.Microsecond)
				continue
			}
			err := srq.PostRecv(&verbs.RecvWR{ID: uint64(id), SGL: []verbs.SGE{{Addr: mr.Addr() + uint64(id*wqeLen), Length: wqeLen, LKey: mr.LKey()}}})
			switch {
			case err == nil:
				id++
				if id%5 == 0 && !resized(srq.Modify(verbs.SRQAttr{MaxWR: max(id-int(received.Load()), 1)}, verbs.SRQMaxWR)) {
					done <- r
					return
				}
			case errors.Is(err, engine.ErrQueueFull):
				if !resized(srq.Modify(verbs.SRQAttr{MaxWR: srq.Query().MaxWR + 1 + id%3}, verbs.SRQMaxWR)) {
					done <- r
					return
				}
			default:
				r.err = err
				done <- r
				return
			}
		}
		done <- r
	}()
	for j := range total {
		k, i := j%2, j/2
		must(ag.PostSend(ctx, aqp[k], agent.SendWR{WRID: uint64(j), Op: agent.OpSend, MR: amr, Off: j * wqeLen, Len: msgLen(k, i)}))
	}
	next := [2]int{}
	wcs := make([]verbs.WC, 32)
	for got := 0; got < total; {
		n, err := cq.Wait(ctx, wcs)
		if err != nil {
			t.Fatalf("after %d receives: %v", got, err)
		}
		for _, w := range wcs[:n] {
			if w.Status != 0 || w.WRID != uint64(got) {
				t.Fatalf("receive %d: %+v, want WQE %d (posting order)", got, w, got)
			}
			var head []byte
			devsync.Run(dev, func() { head = append(head, buf[got*wqeLen:got*wqeLen+8]...) })
			k, i := int(binary.LittleEndian.Uint32(head)), int(binary.LittleEndian.Uint32(head[4:]))
			if k > 1 || w.QPNum != qp[k].Num() || i != next[k] || int(w.ByteLen) != msgLen(k, i) {
				t.Fatalf("receive %d on QP %d (%d bytes): message %d of connection %d, want %d", got, w.QPNum, w.ByteLen, i, k, next[k])
			}
			var same bool
			devsync.Run(dev, func() { same = bytes.Equal(buf[got*wqeLen:got*wqeLen+int(w.ByteLen)], msg(k, i)) })
			if !same {
				t.Fatalf("receive %d: message %d of connection %d differs", got, i, k)
			}
			next[k]++
			got++
			received.Store(int64(got))
		}
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	for j := range total {
		wc, err := ag.Poll(ctx, acq, 20*time.Second)
		if err != nil || wc == nil || wc.Status != agent.WCSuccess {
			t.Fatalf("rxe SEND completion %d: %+v (%v)", j, wc, err)
		}
	}
	rnr := qp[0].Stats().RNRNAKsSent + qp[1].Stats().RNRNAKsSent
	t.Logf("%d messages through %d resizes, %d of them with messages still to come (now %+v), %d RNR NAKs sent",
		total, r.resizes, r.during, srq.Query(), rnr)
	if r.during < total/10 {
		t.Fatalf("only %d resizes while rxe was sending", r.during)
	}

	// The rules side by side: rxe's SRQ and a softroce one, 10 WQEs each.
	asrq, _, err := ag.CreateSRQ(ctx, apd, 16, 0)
	must(err)
	ssrq, err := pd.CreateSRQ(verbs.SRQInitAttr{MaxWR: 16, MaxSGE: 1})
	must(err)
	for i := range 10 {
		must(ag.PostSRQRecv(ctx, asrq, uint64(700+i), amr, i*wqeLen, wqeLen))
		must(ssrq.PostRecv(&verbs.RecvWR{ID: uint64(700 + i), SGL: []verbs.SGE{{Addr: mr.Addr() + uint64(i*wqeLen), Length: wqeLen, LKey: mr.LKey()}}}))
	}
	both := func(what string, size int, wantOK bool) int {
		t.Helper()
		n, aerr := ag.ResizeSRQ(ctx, asrq, size)
		serr := ssrq.Modify(verbs.SRQAttr{MaxWR: min(size, verbs.MaxSRQWR+1)}, verbs.SRQMaxWR)
		t.Logf("%s: resize to %d: rxe max_wr %d (%v), softroce %+v (%v)", what, size, n, aerr, ssrq.Query(), serr)
		if (aerr == nil) != wantOK || (serr == nil) != wantOK {
			t.Fatalf("%s: rxe %v, softroce %v, want success %v", what, aerr, serr, wantOK)
		}
		if aerr != nil && !strings.Contains(aerr.Error(), "Invalid argument") {
			t.Fatalf("%s: rxe error %v, want EINVAL", what, aerr)
		}
		return n
	}
	both("below the posted WQEs", 4, false)
	both("above max_srq_wr", 1<<24, false)
	must(ag.SetSRQLimit(ctx, asrq, 12))
	must(ssrq.Modify(verbs.SRQAttr{Limit: 12}, verbs.SRQLimit))
	both("below the armed limit", 11, false)
	must(ag.SetSRQLimit(ctx, asrq, 0))
	must(ssrq.Modify(verbs.SRQAttr{Limit: 0}, verbs.SRQLimit))
	if n := both("shrink to the posted WQEs", 10, true); n < 10 {
		t.Fatalf("rxe max_wr %d after a resize to 10", n)
	}
	if n := both("grow", 100, true); n < 100 {
		t.Fatalf("rxe max_wr %d after a resize to 100", n)
	}

	// rxe's resized SRQ still holds its 10 WQEs, in order: softroce SENDs
	// to an rxe QP on it.
	bqp, err := ag.CreateQP(ctx, apd, acq, acq, agent.QPCap{SendWR: 16, SRQ: asrq})
	must(err)
	must(ag.ModifyToInit(ctx, bqp, agent.AccessAll))
	sq, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq})
	must(err)
	apsn, spsn := uint32(rand.IntN(1<<24)), uint32(rand.IntN(1<<24))
	must(connectRC(ctx, ag, bqp, agid, sq, sgid, mtu, apsn, spsn, 0, verbs.ConnectOptions{}))
	for i := range 10 {
		must(sq.PostSend(&verbs.SendWR{ID: uint64(i), Opcode: verbs.WRSend, Flags: verbs.SendSignaled,
			SGL: []verbs.SGE{{Addr: mr.Addr(), Length: uint32(100 + i), LKey: mr.LKey()}}}))
	}
	for i := range 10 {
		wc, err := ag.Poll(ctx, acq, 20*time.Second)
		if err != nil || wc == nil || wc.Status != agent.WCSuccess || wc.WRID != uint64(700+i) || wc.ByteLen != uint32(100+i) {
			t.Fatalf("rxe receive %d on its resized SRQ: %+v (%v), want wr_id %d", i, wc, err, 700+i)
		}
	}
}
