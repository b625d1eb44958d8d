package engine_test

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/memreg"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/qpstate"
	"github.com/softroce/softroce/transport/engine"
	_ "github.com/softroce/softroce/transport/rc" // the QPs are RC's
	"github.com/softroce/softroce/wr"
)

var (
	errUnreachable = errors.New("fake: no route to host")
	errBroken      = errors.New("fake: device removed")
)

// fakeLink refuses packets to one address, records the rest, and fails Recv
// with recvErr.
type fakeLink struct {
	bad     netip.Addr
	recvErr error

	mu   sync.Mutex
	sent map[netip.Addr]int
}

func (l *fakeLink) Send(pkts []nic.Packet) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := range pkts {
		a := pkts[i].Remote.Addr()
		if a == l.bad {
			// nic.Link's contract: n packets went out before the failing one.
			return i, errUnreachable
		}
		l.sent[a]++
	}
	return len(pkts), nil
}

func (l *fakeLink) Recv([]nic.Packet) (int, error) { return 0, l.recvErr }
func (l *fakeLink) BatchSize() int                 { return 4 }
func (l *fakeLink) MTU() int                       { return 1500 }
func (l *fakeLink) Addrs() []netip.Addr            { return []netip.Addr{netip.MustParseAddr("10.0.0.1")} }
func (l *fakeLink) Stats() nic.Stats               { return nic.Stats{} }
func (l *fakeLink) Close() error                   { return nil }

type driverFixture struct {
	e        *engine.Engine
	pd       *memreg.PD
	scq, rcq *cq.CQ
}

func newDriverFixture(t *testing.T) *driverFixture {
	mrs := memreg.NewTable(memreg.Limits{})
	pd, err := mrs.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	scq, _ := cq.New(64)
	rcq, _ := cq.New(64)
	return &driverFixture{e: engine.NewEngine(mrs), pd: pd, scq: scq, rcq: rcq}
}

// rtsQP makes a QP in RTS that sends to remote.
func (f *driverFixture) rtsQP(t *testing.T, remote string) *engine.QP {
	qp, err := f.e.CreateQP(engine.QPConfig{PD: f.pd, SendCQ: f.scq, RecvCQ: f.rcq, MaxSendWR: 8, MaxRecvWR: 8})
	if err != nil {
		t.Fatal(err)
	}
	qp.SetState(qpstate.Init)
	qp.SetPath(engine.Path{Remote: engine.Remote(netip.MustParseAddr(remote)), DestQPN: 0x100, PMTU: 1024, Timeout: 14, RetryCnt: 7, RNRRetry: 7})
	qp.SetState(qpstate.RTR)
	qp.SetState(qpstate.RTS)
	return qp
}

// TestSendErrorSkipsOnlyThatPacket: one batch holds packets for three
// peers, the link refuses those to the middle one; the packets to the
// other two still go out, and the refused ones are counted.
func TestSendErrorSkipsOnlyThatPacket(t *testing.T) {
	f := newDriverFixture(t)
	link := &fakeLink{bad: netip.MustParseAddr("10.0.0.9"), recvErr: net.ErrClosed, sent: map[netip.Addr]int{}}
	d := engine.NewDriverStopped(f.e, link, engine.DriverConfig{})
	// Posting order is transmission order: B's packets, then the
	// unreachable peer's, then C's, all in one batch.
	for _, remote := range []string{"10.0.0.2", "10.0.0.9", "10.0.0.3"} {
		qp := f.rtsQP(t, remote)
		for i := 0; i < 2; i++ {
			if err := qp.PostSend(&wr.SendWR{ID: uint64(i), Opcode: wr.Send, Flags: wr.Signaled}); err != nil {
				t.Fatal(err)
			}
		}
	}
	d.Flush()
	for _, a := range []string{"10.0.0.2", "10.0.0.3"} {
		if n := link.sent[netip.MustParseAddr(a)]; n != 2 {
			t.Errorf("%s got %d packets, want 2", a, n)
		}
	}
	st := d.Stats()
	if st.TxDropped != 2 || !errors.Is(st.LastTxErr, errUnreachable) {
		t.Fatalf("stats %+v, want 2 dropped with %v", st, errUnreachable)
	}
}

// TestLinkFailureErrorsEveryQP: a Recv error other than net.ErrClosed is
// kept in Err, every QP is in ERR with its work requests flushed, and only
// then is OnLinkError told.
func TestLinkFailureErrorsEveryQP(t *testing.T) {
	f := newDriverFixture(t)
	link := &fakeLink{recvErr: errBroken, sent: map[netip.Addr]int{}}
	var qps []*engine.QP
	var seen error
	var statesAtCallback []qpstate.State
	d := engine.NewDriverStopped(f.e, link, engine.DriverConfig{OnLinkError: func(err error) {
		seen = err
		for _, qp := range qps {
			statesAtCallback = append(statesAtCallback, qp.State())
		}
	}})
	for _, remote := range []string{"10.0.0.2", "10.0.0.3"} {
		qp := f.rtsQP(t, remote)
		if err := qp.PostSend(&wr.SendWR{ID: 1, Opcode: wr.Send}); err != nil {
			t.Fatal(err)
		}
		if err := qp.PostRecv(&wr.RecvWR{ID: 2}); err != nil {
			t.Fatal(err)
		}
		qps = append(qps, qp)
	}
	d.Flush() // the SENDs are in flight when the link dies
	d.RunRecvLoop()
	if !errors.Is(d.Err(), errBroken) || !errors.Is(seen, errBroken) {
		t.Fatalf("Err() = %v, OnLinkError saw %v; want %v", d.Err(), seen, errBroken)
	}
	for i, s := range statesAtCallback {
		if s != qpstate.Err {
			t.Errorf("QP %d was in %v when OnLinkError ran", i, s)
		}
	}
	for _, c := range []*cq.CQ{f.scq, f.rcq} {
		wcs := make([]cq.WC, 8)
		n := c.Poll(wcs)
		if n != 2 {
			t.Fatalf("%d completions, want one flushed WR per QP", n)
		}
		for _, wc := range wcs[:n] {
			if wc.Status != cq.WRFlushErr {
				t.Errorf("completion %+v, want WR_FLUSH_ERR", wc)
			}
		}
	}
}

// TestLinkClosedIsNotAFailure: Recv's net.ErrClosed after Close is the
// normal end: no error, the QPs keep their state.
func TestLinkClosedIsNotAFailure(t *testing.T) {
	f := newDriverFixture(t)
	link := &fakeLink{recvErr: net.ErrClosed, sent: map[netip.Addr]int{}}
	called := false
	d := engine.NewDriverStopped(f.e, link, engine.DriverConfig{OnLinkError: func(error) { called = true }})
	qp := f.rtsQP(t, "10.0.0.2")
	d.RunRecvLoop()
	if d.Err() != nil || called || qp.State() != qpstate.RTS {
		t.Fatalf("Err() = %v, OnLinkError called %v, QP %v", d.Err(), called, qp.State())
	}
}

// TestCloseSendsBuiltACKs: an ACK built for an executed request, kept when
// its QP moved to ERR, leaves before Close closes the link.
func TestCloseSendsBuiltACKs(t *testing.T) {
	f := newDriverFixture(t)
	link := &fakeLink{recvErr: net.ErrClosed, sent: map[netip.Addr]int{}}
	d := engine.NewDriverStopped(f.e, link, engine.DriverConfig{})
	qp := f.rtsQP(t, "10.0.0.2")
	if err := qp.PostRecv(&wr.RecvWR{ID: 1}); err != nil {
		t.Fatal(err)
	}
	// A SEND asking for an ACK: the ACK is built as the batch ends, and
	// not yet handed out.
	req := bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCSendOnly, PKey: 0xffff, DestQP: qp.Num(), PSN: 0, AckReq: true}}
	buf := make([]byte, bth.Len(req.BTH.Opcode, 0))
	n, err := bth.Build(buf, &req, nil)
	if err != nil {
		t.Fatal(err)
	}
	f.e.Receive(time.Now(), []nic.Packet{{Buf: buf, N: n, Remote: engine.Remote(netip.MustParseAddr("10.0.0.2"))}})
	d.ErrorAllQPs()
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if n := link.sent[netip.MustParseAddr("10.0.0.2")]; n != 1 {
		t.Fatalf("%d packets left before the link closed, want the 1 ACK", n)
	}
}

// takeWakes returns how many wake-ups of d's timer goroutine are pending
// (0 or 1) and takes them.
func takeWakes(d *engine.Driver) int {
	n := len(d.Wakes())
	select {
	case <-d.Wakes():
	default:
	}
	return n
}

// TestBatchWakesTimerOnlyWhenNeeded: wake-ups the engine asks for while the
// receive goroutine handles a batch (and flushes after it) reach the timer
// goroutine only if that flush left work behind or armed a timer earlier
// than the one it sleeps for.
func TestBatchWakesTimerOnlyWhenNeeded(t *testing.T) {
	f := newDriverFixture(t)
	link := &fakeLink{recvErr: net.ErrClosed, sent: map[netip.Addr]int{}}
	d := engine.NewDriverStopped(f.e, link, engine.DriverConfig{})
	qp := f.rtsQP(t, "10.0.0.2")
	post := func(id uint64) {
		t.Helper()
		mustPost(t, qp, &wr.SendWR{ID: id, Opcode: wr.RDMAWrite, RemoteAddr: 0x1000, RKey: 1})
	}
	// Sending the first WRITE arms the ACK timer: the timer goroutine,
	// sleeping with no deadline, must hear of it.
	d.BeginBatch()
	post(1)
	d.Flush()
	d.EndBatch()
	if n := takeWakes(d); n != 1 {
		t.Fatalf("new timer: %d wake-ups, want 1", n)
	}
	f.e.NextDeadline() // the timer goroutine re-arms
	// A second WRITE sent by the same flush changes nothing for it.
	d.BeginBatch()
	post(2)
	d.Flush()
	d.EndBatch()
	if n := takeWakes(d); n != 0 {
		t.Fatalf("work done in the batch: %d wake-ups, want 0", n)
	}
	// Work posted after the batch's flush is left for the timer goroutine.
	d.BeginBatch()
	post(3)
	d.EndBatch()
	if n := takeWakes(d); n != 1 {
		t.Fatalf("work left over: %d wake-ups, want 1", n)
	}
	// Outside a batch every wake-up goes through.
	d.Flush()
	post(4)
	if n := takeWakes(d); n != 1 {
		t.Fatalf("posted outside a batch: %d wake-ups, want 1", n)
	}
	if got := link.sent[netip.MustParseAddr("10.0.0.2")]; got != 3 {
		t.Fatalf("%d packets sent, want 3", got)
	}
}

// TestBatchSendsOnTheCallersGoroutine: work posted inside Batch is on the
// link when Batch returns, and the timer goroutine was not woken for it;
// posted outside, it waits for that goroutine, which is woken.
func TestBatchSendsOnTheCallersGoroutine(t *testing.T) {
	f := newDriverFixture(t)
	link := &fakeLink{recvErr: net.ErrClosed, sent: map[netip.Addr]int{}}
	d := engine.NewDriverStopped(f.e, link, engine.DriverConfig{})
	qp := f.rtsQP(t, "10.0.0.2")
	post := func() {
		if err := qp.PostSend(&wr.SendWR{Opcode: wr.Send, Flags: wr.Signaled}); err != nil {
			t.Fatal(err)
		}
	}
	d.Batch(post)
	if n := link.sent[netip.MustParseAddr("10.0.0.2")]; n != 1 {
		t.Fatalf("after Batch the link has %d packets, want 1", n)
	}
	// The timer goroutine is woken once, to arm the retransmission timer
	// the first send started; as it would, it then sleeps until that.
	if len(d.Wakes()) != 1 {
		t.Fatal("the timer goroutine was not told of the new retransmission deadline")
	}
	<-d.Wakes()
	f.e.NextDeadline()
	d.Batch(post)
	if n := link.sent[netip.MustParseAddr("10.0.0.2")]; n != 2 {
		t.Fatalf("after a second Batch the link has %d packets, want 2", n)
	}
	if len(d.Wakes()) != 0 {
		t.Fatal("Batch woke the timer goroutine for work it sent itself")
	}
	post()
	if n := link.sent[netip.MustParseAddr("10.0.0.2")]; n != 2 || len(d.Wakes()) != 1 {
		t.Fatalf("a post outside Batch: %d packets on the link, %d wake-ups; want 2 and 1", n, len(d.Wakes()))
	}
	<-d.Wakes()
	d.Flush()
	// A post from elsewhere while a batch runs is sent by that batch's
	// flush or, if left over, woken for when the last batch ends.
	d.Batch(func() { d.Batch(func() {}) }) // nested batches end cleanly
	d.BeginBatch()
	post()
	d.EndBatch()
	if len(d.Wakes()) != 1 {
		t.Fatal("work posted during a batch that did not flush it was not woken for")
	}
}

// TestDoorbellSendsOnThePoster: a WR posted to an idle send queue leaves
// on the posting goroutine before PostSend returns (no goroutine of the
// driver runs here), waking the timer goroutine only when its timer must
// be re-armed; a WR posted behind outstanding work is left to the timer
// goroutine.
func TestDoorbellSendsOnThePoster(t *testing.T) {
	f := newDriverFixture(t)
	link := &fakeLink{recvErr: net.ErrClosed, sent: map[netip.Addr]int{}}
	d := engine.NewDriverStopped(f.e, link, engine.DriverConfig{})
	a, b := f.rtsQP(t, "10.0.0.2"), f.rtsQP(t, "10.0.0.3")
	write := &wr.SendWR{ID: 1, Opcode: wr.RDMAWrite, RemoteAddr: 0x1000, RKey: 1}
	sent := func(ip string) int {
		link.mu.Lock()
		defer link.mu.Unlock()
		return link.sent[netip.MustParseAddr(ip)]
	}
	d.Flush() // what entering RTS queued, as the timer goroutine would
	takeWakes(d)
	mustPost(t, a, write)
	if n := sent("10.0.0.2"); n != 1 {
		t.Fatalf("idle queue: %d packets sent by PostSend, want 1", n)
	}
	// The WRITE armed the ACK timer and the timer goroutine sleeps with
	// no deadline: it must hear of it.
	if n := takeWakes(d); n != 1 {
		t.Fatalf("first timer: %d wake-ups, want 1", n)
	}
	f.e.NextDeadline() // the timer goroutine re-arms
	// Another idle queue: sent at once; its timer expires after the one
	// the timer goroutine sleeps for, so nobody is woken.
	mustPost(t, b, write)
	if n := sent("10.0.0.3"); n != 1 {
		t.Fatalf("second idle queue: %d packets sent by PostSend, want 1", n)
	}
	if n := takeWakes(d); n != 0 {
		t.Fatalf("later timer: %d wake-ups, want 0", n)
	}
	// Behind the outstanding WRITE the WR waits for the timer goroutine.
	mustPost(t, a, write)
	if n := sent("10.0.0.2"); n != 1 {
		t.Fatalf("busy queue: %d packets sent by PostSend, want 1 (the first)", n)
	}
	if n := takeWakes(d); n != 1 {
		t.Fatalf("busy queue: %d wake-ups, want 1", n)
	}
	d.Flush()
	if n := sent("10.0.0.2"); n != 2 {
		t.Fatalf("after the timer goroutine's flush: %d packets, want 2", n)
	}
	// Inside Batch the doorbell does not ring: the posts leave together
	// in Batch's flush.
	c := f.rtsQP(t, "10.0.0.4")
	d.Flush()
	takeWakes(d)
	d.Batch(func() {
		mustPost(t, c, write)
		if n := sent("10.0.0.4"); n != 0 {
			t.Errorf("inside Batch: %d packets sent by PostSend, want 0", n)
		}
	})
	if n := sent("10.0.0.4"); n != 1 {
		t.Fatalf("after Batch: %d packets, want 1", n)
	}
	left, held := d.Doorbells()
	if left != 0 || held != 0 {
		t.Fatalf("%d doorbells, %d batches still counted", left, held)
	}
}

// pollLink is a fakeLink whose TryRecv finds nothing.
type pollLink struct {
	fakeLink
	tries int
}

func (l *pollLink) TryRecv([]nic.Packet) (int, error) { l.tries++; return 0, nil }

// TestPollInline: outside busy-poll mode PollInline does nothing; in it,
// it tries the link once, and not while another
// goroutine owns the receive path.
func TestPollInline(t *testing.T) {
	f := newDriverFixture(t)
	link := &pollLink{fakeLink: fakeLink{recvErr: net.ErrClosed, sent: map[netip.Addr]int{}}}
	if d := engine.NewDriverStopped(f.e, link, engine.DriverConfig{}); d.PollInline() || link.tries != 0 {
		t.Fatalf("without BusyPoll: PollInline tried the link %d times", link.tries)
	}
	d := engine.NewDriverStopped(f.e, link, engine.DriverConfig{BusyPoll: time.Millisecond})
	if d.PollInline() || link.tries != 1 {
		t.Fatalf("busy-poll: %d tries, want 1", link.tries)
	}
	d.ReceiveSide().Lock()
	seq := d.PollSeq()
	if d.PollInline() || link.tries != 1 || d.PollSeq() != seq+1 {
		t.Fatalf("receive path owned elsewhere: %d tries (want 1), poll count %d (want %d)", link.tries, d.PollSeq(), seq+1)
	}
	d.ReceiveSide().Unlock()
}

// TestPollInlineNoAlloc: an inline poll that finds nothing allocates nothing.
func TestPollInlineNoAlloc(t *testing.T) {
	f := newDriverFixture(t)
	link := &pollLink{fakeLink: fakeLink{recvErr: net.ErrClosed, sent: map[netip.Addr]int{}}}
	d := engine.NewDriverStopped(f.e, link, engine.DriverConfig{BusyPoll: time.Millisecond})
	if a := testing.AllocsPerRun(100, func() { d.PollInline() }); a != 0 {
		t.Fatalf("%v allocations per PollInline", a)
	}
}

func mustPost(t testing.TB, qp *engine.QP, swr *wr.SendWR) {
	t.Helper()
	if err := qp.PostSend(swr); err != nil {
		t.Fatal(err)
	}
}
