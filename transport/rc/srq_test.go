package rc

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/memreg"
	"github.com/softroce/softroce/qpstate"
	"github.com/softroce/softroce/transport/engine"
	"github.com/softroce/softroce/transport/internal/enginetest"
	"github.com/softroce/softroce/wr"
)

// srqFixture: endpoint 1 has an SRQ with two RC QPs on it, each connected
// to a QP of endpoint 0.
type srqFixture struct {
	s      *enginetest.Sim
	srq    *engine.SRQ
	qps    [2][2]*engine.QP // qps[k][0] sends to qps[k][1], which is on the SRQ
	limits int
	last   []uint32
	lmr    *memreg.MR
	local  []byte
	rmr    *memreg.MR
	remote []byte
}

func newSRQFixture(t *testing.T, maxWR int) *srqFixture {
	f := &srqFixture{s: enginetest.NewSim(t, 1, enginetest.Impairment{})}
	f.s.Keep = true
	var err error
	f.srq, err = f.s.EP[1].E.CreateSRQ(engine.SRQConfig{MaxWR: maxWR, MaxSGE: 2, OnLimit: func() { f.limits++ }})
	if err != nil {
		t.Fatal(err)
	}
	f.s.EP[1].E.OnLastWQE = func(qpn uint32) { f.last = append(f.last, qpn) }
	for k := range f.qps {
		f.qps[k] = f.s.Connect(enginetest.QPOpts{PMTU: 1024, PSN: [2]uint32{uint32(k) * 1000, 0xfffffe}, Timeout: 14, Retry: 7, RNRRetry: 7, MinRNR: 1, SRQ: [2]*engine.SRQ{nil, f.srq}})
	}
	f.lmr, f.local = f.s.Reg(0, 64<<10)
	f.rmr, f.remote = f.s.Reg(1, 64<<10)
	enginetest.Fill(f.local, 5)
	return f
}

func (f *srqFixture) postSRQ(t *testing.T, id uint64, off, n int) {
	t.Helper()
	if err := f.srq.PostRecv(&wr.RecvWR{ID: id, SGL: []wr.SGE{{Addr: f.rmr.Addr() + uint64(off), Length: uint32(n), LKey: f.rmr.LKey()}}}); err != nil {
		t.Fatal(err)
	}
}

func (f *srqFixture) send(t *testing.T, k int, id uint64, off, n int) {
	t.Helper()
	enginetest.MustPost(t, f.qps[k][0], &wr.SendWR{ID: id, Opcode: wr.Send, Flags: wr.Signaled, SGL: []wr.SGE{{Addr: f.lmr.Addr() + uint64(off), Length: uint32(n), LKey: f.lmr.LKey()}}})
}

// TestSRQConsumedInOrderAcrossQPs: SENDs arriving on two QPs of one SRQ
// take its WQEs in posting order, whichever QP they arrive on, and each
// completion names the QP it arrived on.
func TestSRQConsumedInOrderAcrossQPs(t *testing.T) {
	f := newSRQFixture(t, 8)
	for i := range 4 {
		f.postSRQ(t, uint64(100+i), i*8192, 8192)
	}
	// One at a time so the arrival order is known: QP B, A, A, B.
	order := []int{1, 0, 0, 1}
	sizes := []int{3000, 1, 8192, 0}
	for i, k := range order {
		f.send(t, k, uint64(i+1), i*100, sizes[i])
		f.s.WaitWC(f.s.EP[0].SCQ, 1, time.Second)
	}
	wcs := make([]cq.WC, 8)
	if n := f.s.EP[1].RCQ.Poll(wcs); n != 4 {
		t.Fatalf("%d receive completions, want 4", n)
	}
	for i, k := range order {
		w := wcs[i]
		if w.Status != cq.Success || w.WRID != uint64(100+i) || w.QPNum != f.qps[k][1].Num() || int(w.ByteLen) != sizes[i] {
			t.Fatalf("completion %d = %+v, want WR %d on QP %d with %d bytes", i, w, 100+i, f.qps[k][1].Num(), sizes[i])
		}
		if got, want := f.remote[i*8192:i*8192+sizes[i]], f.local[i*100:i*100+sizes[i]]; !bytes.Equal(got, want) {
			t.Fatalf("message %d landed wrong", i)
		}
	}
	if st := f.srq.Query(); st.Posted != 0 {
		t.Fatalf("SRQ still holds %d WQEs", st.Posted)
	}
}

// TestSRQEmptyRNR: a SEND to a QP whose SRQ is empty draws an RNR NAK and
// completes once a WQE is posted to the SRQ.
func TestSRQEmptyRNR(t *testing.T) {
	f := newSRQFixture(t, 4)
	f.send(t, 1, 1, 0, 100)
	f.s.Pump(nil, 100*time.Microsecond)
	if f.qps[1][1].Stats().RNRNAKsSent == 0 || f.qps[1][0].Stats().RNRNAKsRecv == 0 {
		t.Fatalf("no RNR NAK with an empty SRQ:\n%s", strings.Join(f.s.Trace, "\n"))
	}
	f.postSRQ(t, 7, 0, 4096)
	if wc := f.s.WaitWC(f.s.EP[0].SCQ, 1, time.Second)[0]; wc.Status != cq.Success {
		t.Fatalf("send completion %+v", wc)
	}
	wcs := f.s.WaitWC(f.s.EP[1].RCQ, 1, time.Second)
	if wcs[0].WRID != 7 || wcs[0].ByteLen != 100 {
		t.Fatalf("receive completion %+v", wcs[0])
	}
}

// TestSRQLimitFiresOnce: the limit event comes when a WQE taken leaves
// fewer than the limit posted, once; then the limit is disarmed until set
// again.
func TestSRQLimitFiresOnce(t *testing.T) {
	f := newSRQFixture(t, 8)
	for i := range 6 {
		f.postSRQ(t, uint64(i), i*1024, 1024)
	}
	if err := f.srq.SetLimit(4); err != nil {
		t.Fatal(err)
	}
	for i := range 2 { // 6 -> 4 posted: not below 4
		f.send(t, i%2, uint64(i), 0, 10)
	}
	f.s.WaitWC(f.s.EP[1].RCQ, 2, time.Second)
	if f.limits != 0 || f.srq.Query().Limit != 4 {
		t.Fatalf("limit fired %d times with 4 WQEs left (limit %d)", f.limits, f.srq.Query().Limit)
	}
	for i := range 3 { // 3, 2, 1 left
		f.send(t, i%2, uint64(10+i), 0, 10)
	}
	f.s.WaitWC(f.s.EP[1].RCQ, 3, time.Second)
	if f.limits != 1 {
		t.Fatalf("limit fired %d times, want once", f.limits)
	}
	if st := f.srq.Query(); st.Limit != 0 || st.Posted != 1 {
		t.Fatalf("after the event: %+v, want limit 0 (disarmed) and 1 posted", st)
	}
	if err := f.srq.SetLimit(9); err == nil {
		t.Fatal("limit above max_wr accepted")
	}
	if err := f.srq.SetLimit(2); err != nil {
		t.Fatal(err)
	}
	f.send(t, 0, 20, 0, 10) // 1 -> 0 left: below 2 again
	f.s.WaitWC(f.s.EP[1].RCQ, 1, time.Second)
	if f.limits != 2 {
		t.Fatalf("re-armed limit fired %d times in all, want 2", f.limits)
	}
}

// TestSRQQPErr: a QP on an SRQ refuses its own PostRecv; entering ERR it
// raises Last WQE Reached once, flushes only the WQE it had taken, and
// leaves the SRQ's WQEs to the other QP.
func TestSRQQPErr(t *testing.T) {
	f := newSRQFixture(t, 8)
	a, b := f.qps[0][1], f.qps[1][1]
	err := a.PostRecv(&wr.RecvWR{ID: 1, SGL: []wr.SGE{{Addr: f.rmr.Addr(), Length: 10, LKey: f.rmr.LKey()}}})
	if !errors.Is(err, engine.ErrState) || !strings.Contains(err.Error(), "SRQ") {
		t.Fatalf("PostRecv on a QP with an SRQ: %v", err)
	}
	for i := range 3 {
		f.postSRQ(t, uint64(50+i), i*2048, 2048)
	}
	// A two-packet SEND whose first packet is in: A holds WQE 50.
	f.s.Feed(1, a, bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCSendFirst, PSN: 0}}, make([]byte, 1024)) // a's RQ PSN is 0
	a.SetState(qpstate.Err)
	a.SetState(qpstate.Err) // already in ERR: no second event
	wcs := make([]cq.WC, 8)
	n := f.s.EP[1].RCQ.Poll(wcs)
	if n != 1 || wcs[0].WRID != 50 || wcs[0].Status != cq.WRFlushErr || wcs[0].QPNum != a.Num() {
		t.Fatalf("flush completions %+v, want only WR 50 on QP %d", wcs[:n], a.Num())
	}
	if len(f.last) != 1 || f.last[0] != a.Num() {
		t.Fatalf("last WQE events %v, want one for QP %d", f.last, a.Num())
	}
	if st := f.srq.Query(); st.Posted != 2 {
		t.Fatalf("SRQ holds %d WQEs after the flush, want 2", st.Posted)
	}
	f.send(t, 1, 1, 0, 10)
	if w := f.s.WaitWC(f.s.EP[1].RCQ, 1, time.Second)[0]; w.WRID != 51 || w.QPNum != b.Num() || w.Status != cq.Success {
		t.Fatalf("the other QP's receive %+v, want WR 51", w)
	}
	// A transport error (a SEND longer than the buffer) raises it too.
	f.send(t, 1, 2, 0, 4000)
	f.s.WaitWC(f.s.EP[1].RCQ, 1, time.Second)
	if b.State() != qpstate.Err || len(f.last) != 2 || f.last[1] != b.Num() {
		t.Fatalf("QP %d state %v, last WQE events %v", b.Num(), b.State(), f.last)
	}
	// A QP without SRQ never raises it.
	qps := f.s.Connect(enginetest.QPOpts{})
	qps[1].SetState(qpstate.Err)
	if len(f.last) != 2 {
		t.Fatalf("last WQE events %v for a QP without SRQ", f.last)
	}
}

// TestSRQDestroyBusy: an SRQ with QPs cannot be destroyed; once they are,
// it can, once.
func TestSRQDestroyBusy(t *testing.T) {
	f := newSRQFixture(t, 2)
	e := f.s.EP[1].E
	if err := e.DestroySRQ(f.srq); !errors.Is(err, engine.ErrSRQBusy) {
		t.Fatalf("destroy with QPs: %v", err)
	}
	f.postSRQ(t, 1, 0, 10)
	for k := range f.qps {
		if err := e.DestroyQP(f.qps[k][1]); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.DestroySRQ(f.srq); err != nil {
		t.Fatal(err)
	}
	if err := e.DestroySRQ(f.srq); !errors.Is(err, engine.ErrNoSRQ) {
		t.Fatalf("second destroy: %v", err)
	}
	if err := f.srq.PostRecv(&wr.RecvWR{ID: 2}); err == nil {
		t.Fatal("post to a destroyed SRQ accepted")
	}
	if _, err := e.CreateQP(engine.QPConfig{PD: f.s.EP[1].PD, SendCQ: f.s.EP[1].SCQ, RecvCQ: f.s.EP[1].RCQ, MaxSendWR: 1, SRQ: f.srq}); !errors.Is(err, engine.ErrNoSRQ) {
		t.Fatalf("create QP on a destroyed SRQ: %v", err)
	}
	if _, err := f.s.EP[0].E.CreateSRQ(engine.SRQConfig{MaxWR: 0}); err == nil {
		t.Fatal("SRQ with max_wr 0 created")
	}
}

// TestSRQPostLimits: max_wr and max_sge are enforced at post time.
func TestSRQPostLimits(t *testing.T) {
	f := newSRQFixture(t, 2)
	f.postSRQ(t, 1, 0, 10)
	f.postSRQ(t, 2, 0, 10)
	if err := f.srq.PostRecv(&wr.RecvWR{ID: 3}); !errors.Is(err, engine.ErrQueueFull) {
		t.Fatalf("third WR on an SRQ of 2: %v", err)
	}
	g := newSRQFixture(t, 4)
	sge := wr.SGE{Addr: g.rmr.Addr(), Length: 1, LKey: g.rmr.LKey()}
	if err := g.srq.PostRecv(&wr.RecvWR{ID: 1, SGL: []wr.SGE{sge, sge, sge}}); err == nil || g.srq.Query().Posted != 0 {
		t.Fatalf("3 SGEs on an SRQ of max_sge 2: %v", err)
	}
}
