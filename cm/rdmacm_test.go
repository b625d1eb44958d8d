package cm

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/nic/pipe"
	"github.com/softroce/softroce/verbs"
)

// chanMAD is an in-memory MADConn: the two ends of a channel pair, with
// an optional filter that loses MADs.
type chanMAD struct {
	self   netip.AddrPort
	in     chan []byte
	peer   *chanMAD
	drop   func(b []byte) bool
	mu     sync.Mutex
	closed chan struct{}
	once   sync.Once
}

func chanMADPair(a, b netip.Addr) (*chanMAD, *chanMAD) {
	x := &chanMAD{self: netip.AddrPortFrom(a, 4791), in: make(chan []byte, 64), closed: make(chan struct{})}
	y := &chanMAD{self: netip.AddrPortFrom(b, 4791), in: make(chan []byte, 64), closed: make(chan struct{})}
	x.peer, y.peer = y, x
	return x, y
}

func (c *chanMAD) SendMAD(to Peer, b []byte) error {
	c.mu.Lock()
	drop := c.drop
	c.mu.Unlock()
	if drop != nil && drop(b) {
		return nil
	}
	select {
	case c.peer.in <- append([]byte(nil), b...):
	default: // a full queue loses the MAD, as a network would
	}
	return nil
}

func (c *chanMAD) RecvMAD(buf []byte) (int, Peer, error) {
	select {
	case b := <-c.in:
		return copy(buf, b), Peer{c.peer.self, 1}, nil
	case <-c.closed:
		return 0, Peer{}, ErrClosed
	}
}

func (c *chanMAD) Close() error {
	c.once.Do(func() { close(c.closed) })
	return nil
}

func (c *chanMAD) setDrop(f func([]byte) bool) {
	c.mu.Lock()
	c.drop = f
	c.mu.Unlock()
}

type side struct {
	dev *verbs.Device
	cm  *CM
	pd  *verbs.PD
	cq  *verbs.CQ
	mr  *verbs.MR
	buf []byte
	tx  *chanMAD
}

func (s *side) newQP(t *testing.T) *verbs.QP {
	t.Helper()
	qp, err := s.pd.CreateQP(verbs.QPInitAttr{SendCQ: s.cq, RecvCQ: s.cq, Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16}})
	if err != nil {
		t.Fatal(err)
	}
	return qp
}

// fastCM makes the CM timers short so that timeouts happen in
// milliseconds: a 1 ms response timeout and 2 retries.
var fastCM = &Options{Config: Config{ResponseTimeout: 8, PacketLifeTime: 1, MaxRetries: 2, AcceptTimeout: 200 * time.Millisecond}}

func sides(t *testing.T, opts *Options) (a, b *side) {
	t.Helper()
	return sides2(t, opts, opts)
}

// sides2 gives each side its own options.
func sides2(t *testing.T, optsA, optsB *Options) (a, b *side) {
	t.Helper()
	la, lb := pipe.New(pipe.Config{})
	ta, tb := chanMADPair(netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"))
	open := func(link nic.Link, tx *chanMAD, opts *Options) *side {
		dev, err := verbs.Open(link, nil)
		if err != nil {
			t.Fatal(err)
		}
		c, err := New(dev, tx, opts)
		if err != nil {
			t.Fatal(err)
		}
		s := &side{dev: dev, cm: c, tx: tx, buf: make([]byte, 4096)}
		s.pd, _ = dev.AllocPD()
		s.cq, _ = dev.CreateCQ(64)
		s.mr, _ = s.pd.RegMR(s.buf, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
		t.Cleanup(func() { c.Close(); dev.Close() })
		return s
	}
	return open(la, ta, optsA), open(lb, tb, optsB)
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// serveNext hands l's next connection request to f, in a goroutine.
func serveNext(ctx context.Context, l *Listener, f func(*ConnRequest)) {
	go func() {
		if req, err := l.Next(ctx); err == nil {
			f(req)
		}
	}()
}

func TestDialAcceptSendDisconnect(t *testing.T) {
	a, b := sides(t, nil)
	l, err := b.cm.Listen(PortSpaceTCP, 7471)
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	type res struct {
		k   *Conn
		req *ConnRequest
		err error
	}
	ch := make(chan res, 1)
	bqp := b.newQP(t)
	go func() {
		req, err := l.Next(ctx)
		if err != nil {
			ch <- res{err: err}
			return
		}
		// Receives may be posted once the QP is in INIT; Accept moves it.
		k, err := req.Accept(ctx, bqp, &ConnParam{ResponderResources: 1, InitiatorDepth: 1, RNRRetryCount: 6,
			PrivateData: []byte("accepted")})
		ch <- res{k, req, err}
	}()
	aqp := a.newQP(t)
	ka, err := a.cm.Dial(ctx, b.cm.Local(), PortSpaceTCP, 7471, aqp, &ConnParam{ResponderResources: 1, InitiatorDepth: 1,
		RetryCount: 5, RNRRetryCount: 3, PrivateData: []byte("hi there")})
	if err != nil {
		t.Fatal(err)
	}
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	kb := r.k
	if !bytes.HasPrefix(r.req.PrivateData, []byte("hi there")) || r.req.Remote != a.cm.Local() || r.req.RemoteQPN != aqp.Num() {
		t.Errorf("request: data %q remote %v qpn %d", r.req.PrivateData[:8], r.req.Remote, r.req.RemoteQPN)
	}
	if !bytes.HasPrefix(ka.PrivateData(), []byte("accepted")) {
		t.Errorf("REP private data %q", ka.PrivateData()[:8])
	}
	// Both QPs in RTS with each other's QPN and matching PSNs.
	attrA, _ := aqp.Query()
	attrB, _ := bqp.Query()
	if attrA.State != verbs.StateRTS || attrB.State != verbs.StateRTS {
		t.Fatalf("QP states %v %v", attrA.State, attrB.State)
	}
	if attrA.DestQPN != bqp.Num() || attrB.DestQPN != aqp.Num() || attrA.SQPSN != attrB.RQPSN || attrB.SQPSN != attrA.RQPSN {
		t.Errorf("QP attrs: A dest %d sq %#x rq %#x, B dest %d sq %#x rq %#x", attrA.DestQPN, attrA.SQPSN, attrA.RQPSN,
			attrB.DestQPN, attrB.SQPSN, attrB.RQPSN)
	}
	// Each side's RNR retry count is the one its peer sent; the transport
	// retry count is the active side's for both.
	if attrA.RetryCnt != 5 || attrB.RetryCnt != 5 || attrA.RNRRetry != 6 || attrB.RNRRetry != 3 {
		t.Errorf("retry %d %d, RNR retry %d %d", attrA.RetryCnt, attrB.RetryCnt, attrA.RNRRetry, attrB.RNRRetry)
	}
	if attrA.Timeout != 17 || attrB.Timeout != 17 || attrA.MaxRDAtomic != 1 || attrB.MaxDestRDAtomic != 1 || attrA.MinRNRTimer != 0 {
		t.Errorf("timeouts %d %d rd %d %d rnr timer %d", attrA.Timeout, attrB.Timeout, attrA.MaxRDAtomic, attrB.MaxDestRDAtomic, attrA.MinRNRTimer)
	}
	// A SEND goes through on the connection the CM made.
	copy(a.buf, "ping")
	if err := bqp.PostRecv(&verbs.RecvWR{ID: 9, SGL: []verbs.SGE{{Addr: b.mr.Addr(), Length: 64, LKey: b.mr.LKey()}}}); err != nil {
		t.Fatal(err)
	}
	if err := aqp.PostSend(&verbs.SendWR{ID: 1, Opcode: verbs.WRSend, Flags: verbs.SendSignaled,
		SGL: []verbs.SGE{{Addr: a.mr.Addr(), Length: 4, LKey: a.mr.LKey()}}}); err != nil {
		t.Fatal(err)
	}
	wc := make([]verbs.WC, 1)
	if _, err := b.cq.Wait(ctx, wc); err != nil || wc[0].Status != cq.Success || string(b.buf[:4]) != "ping" {
		t.Fatalf("receive: %v %+v %q", err, wc[0], b.buf[:4])
	}
	if err := ka.Disconnect(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-kb.Done():
	case <-ctx.Done():
		t.Fatal("passive side never saw the disconnect")
	}
	if !errors.Is(kb.Err(), ErrDisconnected) {
		t.Errorf("passive end: %v", kb.Err())
	}
}

// TestDREQLeavesPassiveQP: a DREQ ends the passive side's connection
// (Done, ErrDisconnected) but leaves its QP as it is, as the kernel's
// rdma_cm does (RDMA_CM_EVENT_DISCONNECTED changes no QP state; only
// rdma_disconnect, librdmacm's included, moves the QP to ERR): its work
// still outstanding completes normally, and the QP goes to ERR, flushing
// what is left, when that side disconnects in turn.
func TestDREQLeavesPassiveQP(t *testing.T) {
	a, b := sides(t, nil)
	l, err := b.cm.Listen(PortSpaceTCP, 7472)
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	bqp := b.newQP(t)
	accepted := make(chan *Conn, 1)
	serveNext(ctx, l, func(req *ConnRequest) {
		k, err := req.Accept(ctx, bqp, nil)
		if err != nil {
			t.Error(err)
		}
		accepted <- k
	})
	aqp := a.newQP(t)
	ka, err := a.cm.Dial(ctx, b.cm.Local(), PortSpaceTCP, 7472, aqp, nil)
	if err != nil {
		t.Fatal(err)
	}
	kb := <-accepted
	if kb == nil {
		t.FailNow()
	}
	recv := func(s *side, qp *verbs.QP, id uint64, off uint64) {
		t.Helper()
		if err := qp.PostRecv(&verbs.RecvWR{ID: id, SGL: []verbs.SGE{{Addr: s.mr.Addr() + off, Length: 64, LKey: s.mr.LKey()}}}); err != nil {
			t.Fatal(err)
		}
	}
	send := func(s *side, qp *verbs.QP, id uint64) {
		t.Helper()
		if err := qp.PostSend(&verbs.SendWR{ID: id, Opcode: verbs.WRSend, Flags: verbs.SendSignaled,
			SGL: []verbs.SGE{{Addr: s.mr.Addr() + 1024, Length: 8, LKey: s.mr.LKey()}}}); err != nil {
			t.Fatal(err)
		}
	}
	// b's receives: 10 for a SEND that comes after the DREQ, 11 left.
	recv(b, bqp, 10, 0)
	recv(b, bqp, 11, 64)
	// A DREQ from a whose QP stays up (what a's QP does is a's affair):
	// b's QP must keep serving it.
	a.cm.e.disconnect(a.cm.clock.Now(), ka.c, nil)
	a.cm.e.dispatch()
	a.cm.kick()
	select {
	case <-kb.Done():
	case <-ctx.Done():
		t.Fatal("passive side never saw the DREQ")
	}
	if !errors.Is(kb.Err(), ErrDisconnected) {
		t.Errorf("passive end: %v", kb.Err())
	}
	if st := bqp.State(); st != verbs.StateRTS {
		t.Fatalf("passive QP %v after the DREQ, want RTS (left to the application)", st)
	}
	// Work posted and outstanding completes normally both ways.
	recv(a, aqp, 20, 0)
	send(b, bqp, 12)
	send(a, aqp, 2)
	want := map[uint64]bool{10: true, 12: true}
	for len(want) > 0 {
		wc := make([]verbs.WC, 1)
		if _, err := b.cq.Wait(ctx, wc); err != nil {
			t.Fatalf("passive side: %v, still waiting for %v", err, want)
		}
		if wc[0].Status != cq.Success || !want[wc[0].WRID] {
			t.Fatalf("passive side completion %+v after the DREQ, want success for %v", wc[0], want)
		}
		delete(want, wc[0].WRID)
	}
	// Disconnecting in turn (rdma_disconnect after DISCONNECTED) moves
	// the QP to ERR: the receive left is flushed.
	if err := kb.Disconnect(ctx); err != nil {
		t.Fatal(err)
	}
	if st := bqp.State(); st != verbs.StateErr {
		t.Errorf("passive QP %v after its Disconnect, want ERR", st)
	}
	wc := make([]verbs.WC, 1)
	if _, err := b.cq.Wait(ctx, wc); err != nil || wc[0].WRID != 11 || wc[0].Status != cq.WRFlushErr {
		t.Errorf("after Disconnect: %v %+v, want receive 11 flushed", err, wc[0])
	}
}

func TestDialNoListener(t *testing.T) {
	a, b := sides(t, nil)
	qp := a.newQP(t)
	_, err := a.cm.Dial(ctxT(t), b.cm.Local(), PortSpaceTCP, 9, qp, nil)
	var rej *RejectError
	if !errors.Is(err, ErrNoListener) || !errors.As(err, &rej) || rej.Reason != 8 {
		t.Fatalf("err %v, want REJ 8", err)
	}
	t.Log(err)
	// The QP is left in INIT: the same QP dials again once someone listens.
	if qp.State() != verbs.StateInit {
		t.Fatalf("QP %v after a REJ", qp.State())
	}
	l, _ := b.cm.Listen(PortSpaceTCP, 9)
	go func() {
		if req, err := l.Next(ctxT(t)); err == nil {
			req.Accept(ctxT(t), b.newQP(t), nil)
		}
	}()
	if _, err := a.cm.Dial(ctxT(t), b.cm.Local(), PortSpaceTCP, 9, qp, nil); err != nil {
		t.Fatalf("second dial: %v", err)
	}
}

func TestDialRejectedWithPrivateData(t *testing.T) {
	a, b := sides(t, nil)
	l, _ := b.cm.Listen(PortSpaceTCP, 7000)
	ctx := ctxT(t)
	serveNext(ctx, l, func(req *ConnRequest) { req.Reject([]byte("busy")) })
	_, err := a.cm.Dial(ctx, b.cm.Local(), PortSpaceTCP, 7000, a.newQP(t), nil)
	var rej *RejectError
	if !errors.As(err, &rej) || rej.Reason != 28 || !bytes.HasPrefix(rej.PrivateData, []byte("busy")) || errors.Is(err, ErrNoListener) {
		t.Fatalf("err %v", err)
	}
	t.Log(err)
}

func TestDialUnreachable(t *testing.T) {
	a, b := sides(t, fastCM)
	a.tx.setDrop(func([]byte) bool { return true })
	_, err := a.cm.Dial(ctxT(t), b.cm.Local(), PortSpaceTCP, 7000, a.newQP(t), nil)
	if !errors.Is(err, ErrUnreachable) {
		t.Fatalf("err %v", err)
	}
	if s := a.cm.Stats(); s.Retransmitted != 2 || s.Timeouts != 1 {
		t.Errorf("stats %+v", s)
	}
	t.Log(err)
}

func TestDisconnectWithoutDREP(t *testing.T) {
	a, b := sides(t, nil)
	l, _ := b.cm.Listen(PortSpaceTCP, 7000)
	ctx := ctxT(t)
	serveNext(ctx, l, func(req *ConnRequest) { req.Accept(ctx, b.newQP(t), nil) })
	k, err := a.cm.Dial(ctx, b.cm.Local(), PortSpaceTCP, 7000, a.newQP(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	// The peer's CM goes silent: the DREQ is never answered. Its timer
	// is shortened to 1 ms and 2 retries, so the test does not wait the
	// 16 x 4.6 s rdma_cm would.
	a.tx.setDrop(func([]byte) bool { return true })
	a.cm.e.mu.Lock()
	k.c.timeout, k.c.maxRetries = time.Millisecond, 2
	a.cm.e.mu.Unlock()
	if err := k.Disconnect(ctx); !errors.Is(err, ErrDisconnectTimeout) {
		t.Fatalf("err %v", err)
	} else {
		t.Log(err)
	}
	if k.QP().State() != verbs.StateErr {
		t.Errorf("QP %v", k.QP().State())
	}
}

func TestResolveUD(t *testing.T) {
	a, b := sides(t, nil)
	l, _ := b.cm.Listen(PortSpaceUDP, 5000)
	ctx := ctxT(t)
	serveNext(ctx, l, func(req *ConnRequest) {
		if req.UD() && bytes.HasPrefix(req.PrivateData, []byte("udaddy")) {
			req.AcceptUD(0x123, 0, []byte("here"))
		}
	})
	r, err := a.cm.ResolveUD(ctx, b.cm.Local(), 5000, []byte("udaddy"))
	if err != nil {
		t.Fatal(err)
	}
	if r.QPN != 0x123 || r.QKey != UDPQKey || !bytes.HasPrefix(r.PrivateData, []byte("here")) {
		t.Fatalf("%+v", r)
	}
	if _, err := a.cm.ResolveUD(ctx, b.cm.Local(), 5001, nil); !errors.Is(err, ErrNoListener) {
		t.Fatalf("unknown port: %v", err)
	}
}

func TestAcceptAfterExpiry(t *testing.T) {
	// rdma_cm's timers on the dialing side, a 200 ms accept timeout on
	// the listening side: the REJ of the expiry comes long before the
	// first REQ retransmission.
	a, b := sides2(t, nil, fastCM)
	l, _ := b.cm.Listen(PortSpaceTCP, 7000)
	ctx := ctxT(t)
	_, err := a.cm.Dial(ctx, b.cm.Local(), PortSpaceTCP, 7000, a.newQP(t), nil)
	// Nobody accepted: the REQ expired and was rejected.
	var rej *RejectError
	if !errors.As(err, &rej) || rej.Reason != RejConsumerDefined {
		t.Fatalf("dial: %v", err)
	}
	req, err := l.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := req.Accept(ctx, b.newQP(t), nil); !errors.Is(err, ErrExpired) {
		t.Fatalf("late accept: %v", err)
	}
}

// TestBacklogFullForgetsREQ: a listener with a backlog of one forgets a
// second REQ without answering it; the dialer's retransmission is taken
// once the first request has been accepted.
func TestBacklogFullForgetsREQ(t *testing.T) {
	// The dialer retransmits every 2 x 2 ms + 2^(16-8) ms, 15 times.
	a, b := sides2(t, &Options{Config: Config{ResponseTimeout: 16, PacketLifeTime: 9}}, &Options{Backlog: 1})
	l, _ := b.cm.Listen(PortSpaceTCP, 7000)
	ctx := ctxT(t)
	errs := make(chan error, 2)
	for range 2 {
		qp := a.newQP(t)
		go func() {
			_, err := a.cm.Dial(ctx, b.cm.Local(), PortSpaceTCP, 7000, qp, nil)
			errs <- err
		}()
	}
	// Both REQs arrive before anyone takes the first from the backlog.
	// The second is forgotten: one half-open entry, nothing sent back.
	for s := b.cm.Stats(); s.Received < 2 || s.HalfOpen != 1; s = b.cm.Stats() {
		if ctx.Err() != nil || s.Sent != 0 {
			t.Fatalf("after two REQs with a backlog of one: %+v", s)
		}
		time.Sleep(time.Millisecond)
	}
	for range 2 {
		req, err := l.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := req.Accept(ctx, b.newQP(t), nil); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}
