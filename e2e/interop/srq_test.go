package interop

import (
	"bytes"
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/softroce/softroce/conformance/agent"
	"github.com/softroce/softroce/internal/devsync"
	"github.com/softroce/softroce/qpstate"
	"github.com/softroce/softroce/verbs"
)

// TestSRQResponderAgainstRxe: softroce is the responder with two RC QPs on
// one SRQ, kernel rxe the requester sending SENDs of several sizes on
// both connections. Every receive takes the SRQ's next WQE whichever QP it
// arrives on (wr_id in posting order, byte_len, qp_num of the QP it came
// in on), every byte lands, the limit event comes once, an empty SRQ
// draws RNR NAKs that rxe retries through, and a QP moved to ERR reports
// its last WQE.
func TestSRQResponderAgainstRxe(t *testing.T) {
	needVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	must := mustOf(t)
	ag, apd, amr, acq := rxeSide(t, ctx)
	agid, err := ag.GID(ctx, 1)
	must(err)

	dev, pd, buf, mr, cq := hostSide(t, bufLen, 256)
	const nWQE, wqeLen = 12, 80000
	srq, err := pd.CreateSRQ(verbs.SRQInitAttr{MaxWR: 16, MaxSGE: 1})
	must(err)
	sgid, err := dev.QueryGID(0)
	must(err)
	const mtu = 1024
	var aqp [2]agent.QP
	var qp [2]*verbs.QP
	for k := range 2 {
		aqp[k], err = ag.CreateQP(ctx, apd, acq, acq, agent.QPCap{SendWR: 64, RecvWR: 64})
		must(err)
		must(ag.ModifyToInit(ctx, aqp[k], agent.AccessAll))
		qp[k], err = pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 16}, SRQ: srq})
		must(err)
		apsn, spsn := uint32(0xfffff0+k), uint32(rand.IntN(1<<24))
		must(connectRC(ctx, ag, aqp[k], agid, qp[k], sgid, mtu, apsn, spsn, 0, verbs.ConnectOptions{MinRNRTimer: 1}))
	}
	for i := range nWQE {
		must(srq.PostRecv(&verbs.RecvWR{ID: uint64(5000 + i), SGL: []verbs.SGE{{Addr: mr.Addr() + uint64(i*wqeLen), Length: wqeLen, LKey: mr.LKey()}}}))
	}
	must(srq.Modify(verbs.SRQAttr{Limit: 3}, verbs.SRQLimit))

	mem := func(f func()) { devsync.Run(dev, f) }
	sizes := []int{0, 1, 1023, 1024, 4097, 70000}
	wrID := uint64(0)
	for i := range nWQE {
		k, n := i%2, sizes[i/2]
		data := pattern(n, byte(i))
		must(ag.WriteMem(ctx, amr, 0, data))
		wrID++
		must(ag.PostSend(ctx, aqp[k], agent.SendWR{WRID: wrID, Op: agent.OpSend, MR: amr, Off: 0, Len: n}))
		wc, err := ag.Poll(ctx, acq, 20*time.Second)
		if err != nil || wc == nil || wc.Status != agent.WCSuccess || wc.WRID != wrID || wc.QPN != aqp[k].QPN {
			t.Fatalf("rxe SEND %d (%d bytes on QP %d): completion %+v (%v)", i, n, aqp[k].QPN, wc, err)
		}
		wcs := make([]verbs.WC, 1)
		wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
		_, err = cq.Wait(wctx, wcs)
		wcancel()
		w := wcs[0]
		if err != nil || w.Status != 0 || w.WRID != uint64(5000+i) || int(w.ByteLen) != n || w.QPNum != qp[k].Num() || w.SrcQP != aqp[k].QPN {
			t.Fatalf("softroce receive %d: %+v (%v), want wr_id %d, %d bytes, qp_num %d", i, w, err, 5000+i, n, qp[k].Num())
		}
		var same bool
		mem(func() { same = bytes.Equal(buf[i*wqeLen:i*wqeLen+n], data) })
		if !same {
			t.Fatalf("receive %d: %d bytes differ in the SRQ's buffer", i, n)
		}
	}
	// 12 posted, limit 3: raised once, at the tenth receive.
	limits := 0
	for done := false; !done; {
		select {
		case ev := <-dev.AsyncEvents():
			if ev.Type != verbs.EventSRQLimitReached || ev.SRQ != srq {
				t.Fatalf("async event %+v", ev)
			}
			limits++
		default:
			done = true
		}
	}
	if limits != 1 || srq.Query().Limit != 0 {
		t.Fatalf("%d SRQ limit events (limit now %d), want 1 and disarmed", limits, srq.Query().Limit)
	}

	// The SRQ is empty: rxe's SEND draws RNR NAKs until a WQE is posted.
	data := pattern(3000, 77)
	must(ag.WriteMem(ctx, amr, 0, data))
	wrID++
	must(ag.PostSend(ctx, aqp[1], agent.SendWR{WRID: wrID, Op: agent.OpSend, MR: amr, Off: 0, Len: len(data)}))
	for qp[1].Stats().RNRNAKsSent == 0 {
		select {
		case <-ctx.Done():
			t.Fatal("no RNR NAK sent with the SRQ empty")
		case <-time.After(5 * time.Millisecond):
		}
	}
	must(srq.PostRecv(&verbs.RecvWR{ID: 6000, SGL: []verbs.SGE{{Addr: mr.Addr(), Length: wqeLen, LKey: mr.LKey()}}}))
	if wc, err := ag.Poll(ctx, acq, 20*time.Second); err != nil || wc == nil || wc.Status != agent.WCSuccess || wc.WRID != wrID {
		t.Fatalf("rxe SEND after RNR: completion %+v (%v)", wc, err)
	}
	wcs := make([]verbs.WC, 1)
	if _, err := cq.Wait(ctx, wcs); err != nil || wcs[0].WRID != 6000 || wcs[0].ByteLen != 3000 || wcs[0].QPNum != qp[1].Num() {
		t.Fatalf("softroce receive after RNR: %+v (%v)", wcs[0], err)
	}
	var same bool
	mem(func() { same = bytes.Equal(buf[:3000], data) })
	if !same {
		t.Fatal("receive after RNR: data differs")
	}

	must(qp[0].Modify(&verbs.QPAttr{State: verbs.StateErr}, qpstate.AttrState))
	select {
	case ev := <-dev.AsyncEvents():
		if ev.Type != verbs.EventQPLastWQEReached || ev.QPNum != qp[0].Num() {
			t.Fatalf("async event %+v, want last WQE reached for QP %d", ev, qp[0].Num())
		}
	case <-ctx.Done():
		t.Fatal("no last WQE reached event")
	}
}

// TestSRQRequesterAgainstRxe: the other role. Two rxe RC QPs share one
// rxe SRQ; softroce sends SENDs of several sizes on both connections. rxe
// hands out its SRQ's WQEs in posting order across the two QPs, every byte
// lands, rxe's limit event comes once, its RNR NAKs on an empty SRQ are
// retried through.
func TestSRQRequesterAgainstRxe(t *testing.T) {
	needVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	must := mustOf(t)
	ag, apd, amr, acq := rxeSide(t, ctx)
	asrq, _, err := ag.CreateSRQ(ctx, apd, 16, 0)
	must(err)
	agid, err := ag.GID(ctx, 1)
	must(err)

	dev, pd, buf, mr, cq := hostSide(t, bufLen, 256)
	sgid, err := dev.QueryGID(0)
	must(err)
	const mtu, nWQE, wqeLen = 4096, 12, 80000
	var aqp [2]agent.QP
	var qp [2]*verbs.QP
	for k := range 2 {
		aqp[k], err = ag.CreateQP(ctx, apd, acq, acq, agent.QPCap{SendWR: 16, SRQ: asrq})
		must(err)
		must(ag.ModifyToInit(ctx, aqp[k], agent.AccessAll))
		qp[k], err = pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 1}})
		must(err)
		apsn, spsn := uint32(rand.IntN(1<<24)), uint32(0xfffffa+k)
		must(connectRC(ctx, ag, aqp[k], agid, qp[k], sgid, mtu, apsn, spsn, 1, verbs.ConnectOptions{}))
	}
	for i := range nWQE {
		must(ag.PostSRQRecv(ctx, asrq, uint64(7000+i), amr, i*wqeLen, wqeLen))
	}
	must(ag.SetSRQLimit(ctx, asrq, 3))

	sizes := []int{0, 1, 4095, 4096, 4097, 70000}
	for i := range nWQE {
		k, n := i%2, sizes[i/2]
		data := pattern(n, byte(i)+40)
		devsync.Run(dev, func() { copy(buf, data) })
		if err := qp[k].PostSend(&verbs.SendWR{ID: uint64(i), Opcode: verbs.WRSend, Flags: verbs.SendSignaled,
			SGL: []verbs.SGE{{Addr: mr.Addr(), Length: uint32(n), LKey: mr.LKey()}}}); err != nil {
			t.Fatal(err)
		}
		wcs := make([]verbs.WC, 1)
		wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
		_, err = cq.Wait(wctx, wcs)
		wcancel()
		if err != nil || wcs[0].Status != 0 || wcs[0].WRID != uint64(i) {
			t.Fatalf("softroce SEND %d: %+v (%v)", i, wcs[0], err)
		}
		wc, err := ag.Poll(ctx, acq, 20*time.Second)
		if err != nil || wc == nil || wc.Status != agent.WCSuccess || wc.Opcode != agent.WCRecv || wc.WRID != uint64(7000+i) ||
			int(wc.ByteLen) != n || wc.QPN != aqp[k].QPN { // src_qp: rxe fills it for UD only
			t.Fatalf("rxe receive %d: %+v (%v), want wr_id %d, %d bytes, qp_num %d", i, wc, err, 7000+i, n, aqp[k].QPN)
		}
		got, err := ag.ReadMem(ctx, amr, i*wqeLen, n)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("rxe receive %d: %d bytes differ in its SRQ's buffer (%v)", i, n, err)
		}
	}
	ev, err := ag.AsyncEvent(ctx, 5*time.Second)
	if err != nil || ev == nil || ev.Type != agent.EventSRQLimitReached || ev.SRQ != asrq {
		t.Fatalf("rxe async event %+v (%v), want SRQ limit reached", ev, err)
	}
	if ev, err := ag.AsyncEvent(ctx, 200*time.Millisecond); err != nil || ev != nil {
		t.Fatalf("second rxe async event %+v (%v)", ev, err)
	}
	if _, _, limit, err := ag.QuerySRQ(ctx, asrq); err != nil || limit != 0 {
		t.Fatalf("rxe SRQ limit after the event: %d (%v), want 0", limit, err)
	}

	// rxe's SRQ is empty: it answers RNR NAK, softroce retries.
	data := pattern(5000, 9)
	devsync.Run(dev, func() { copy(buf, data) })
	must(qp[1].PostSend(&verbs.SendWR{ID: 100, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{{Addr: mr.Addr(), Length: 5000, LKey: mr.LKey()}}}))
	for qp[1].Stats().RNRNAKsRecv == 0 {
		select {
		case <-ctx.Done():
			t.Fatal("no RNR NAK from rxe with its SRQ empty")
		case <-time.After(5 * time.Millisecond):
		}
	}
	must(ag.PostSRQRecv(ctx, asrq, 7100, amr, 0, wqeLen))
	wcs := make([]verbs.WC, 1)
	if _, err := cq.Wait(ctx, wcs); err != nil || wcs[0].Status != 0 || wcs[0].WRID != 100 {
		t.Fatalf("softroce SEND after RNR: %+v (%v)", wcs[0], err)
	}
	wc, err := ag.Poll(ctx, acq, 20*time.Second)
	if err != nil || wc == nil || wc.Status != agent.WCSuccess || wc.WRID != 7100 || wc.ByteLen != 5000 || wc.QPN != aqp[1].QPN {
		t.Fatalf("rxe receive after RNR: %+v (%v)", wc, err)
	}
	if got, err := ag.ReadMem(ctx, amr, 0, 5000); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("rxe receive after RNR: data differs (%v)", err)
	}

	// rxe of the guest's kernel (6.1) raises no last WQE reached when a QP
	// on an SRQ is moved to ERR; any event it does raise must be that one,
	// for that QP.
	must(ag.SetState(ctx, aqp[0], "ERR"))
	ev, err = ag.AsyncEvent(ctx, 2*time.Second)
	switch {
	case err != nil:
		t.Fatal(err)
	case ev == nil:
		t.Log("rxe raised no last WQE reached event for a QP on an SRQ moved to ERR")
	case ev.Type != agent.EventQPLastWQEReached || ev.QPN != aqp[0].QPN:
		t.Fatalf("rxe async event %+v, want last WQE reached for QP %d", ev, aqp[0].QPN)
	}
}

// rxeSide starts a verbs agent on the guest's rxe0 with a PD, a buffer of
// bufLen bytes registered with every access right, and a 256-entry CQ.
func rxeSide(t *testing.T, ctx context.Context) (*agent.Client, agent.PD, agent.MR, agent.CQ) {
	t.Helper()
	ag, err := agent.Launch(ctx, vm, 7100+rand.IntN(800))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ag.Close() })
	if err := ag.Open(ctx, "rxe0"); err != nil {
		t.Fatal(err)
	}
	apd, err := ag.AllocPD(ctx)
	if err != nil {
		t.Fatal(err)
	}
	amr, err := ag.RegMR(ctx, apd, bufLen, agent.AccessAll)
	if err != nil {
		t.Fatal(err)
	}
	acq, err := ag.CreateCQ(ctx, 256)
	if err != nil {
		t.Fatal(err)
	}
	return ag, apd, amr, acq
}
