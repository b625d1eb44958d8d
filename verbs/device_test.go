package verbs

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/nic/pipe"
	"github.com/softroce/softroce/qpstate"
)

// guard bounds how long a test waits for something that must happen; it
// only turns a hang into a failure.
const guard = 10 * time.Second

func newQP(t *testing.T, d *Device) (*PD, *CQ, *QP) {
	t.Helper()
	pd, err := d.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	c, err := d.CreateCQ(64)
	if err != nil {
		t.Fatal(err)
	}
	qp, err := pd.CreateQP(QPInitAttr{SendCQ: c, RecvCQ: c})
	if err != nil {
		t.Fatal(err)
	}
	return pd, c, qp
}

// TestFailedModifyChangesNothing: a Modify that fails on any check, the
// state machine's or the device's, leaves every attribute as it was, in
// Query and in the transport's path.
func TestFailedModifyChangesNothing(t *testing.T) {
	a, b := openPair(t)
	gb, _ := b.QueryGID(0)
	rtrMask := qpstate.AttrState | qpstate.AttrAV | qpstate.AttrPathMTU | qpstate.AttrDestQPN | qpstate.AttrRQPSN |
		qpstate.AttrMaxDestRDAtomic | qpstate.AttrMinRNRTimer | qpstate.AttrAccessFlags
	rtr := func(f func(*QPAttr)) QPAttr {
		a := QPAttr{State: StateRTR, PathMTU: 1024, DestQPN: 0x77, RQPSN: 5, MaxDestRDAtomic: 4, MinRNRTimer: 12,
			AccessFlags: uint32(AccessRemoteRead | AccessRemoteWrite | AccessRemoteAtomic),
			AV:          AddressVector{DGID: gb, HopLimit: 64}}
		f(&a)
		return a
	}
	cases := []struct {
		name string
		attr QPAttr
		mask AttrMask
		want string
	}{
		{"path MTU above the port's", rtr(func(a *QPAttr) { a.PathMTU = 4096 }), rtrMask, "active MTU"},
		{"sgid index out of range", rtr(func(a *QPAttr) { a.AV.SGIDIndex = 3 }), rtrMask, "sgid_index"},
		{"max_dest_rd_atomic above the limit", rtr(func(a *QPAttr) { a.MaxDestRDAtomic = MaxQPRDAtom + 1 }), rtrMask, "max_dest_rd_atomic"},
		{"min RNR timer out of range", rtr(func(a *QPAttr) { a.MinRNRTimer = 32 }), rtrMask, "MIN_RNR_TIMER"},
		{"pkey index out of range", rtr(func(a *QPAttr) { a.PKeyIndex = 2 }), rtrMask | qpstate.AttrPKeyIndex, "pkey_index"},
		{"INIT->INIT on port 2", QPAttr{State: StateInit, Port: 2, AccessFlags: 0}, qpstate.AttrState | qpstate.AttrPort | qpstate.AttrAccessFlags, "port 2"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, _, qp := newQP(t, a)
			if err := qp.Init(AccessRemoteWrite); err != nil {
				t.Fatal(err)
			}
			attr0, init0 := qp.Query()
			path0 := qp.rc.Path()
			err := qp.Modify(&tc.attr, tc.mask)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Modify = %v, want an error about %s", err, tc.want)
			}
			attr1, init1 := qp.Query()
			if !reflect.DeepEqual(attr0, attr1) || !reflect.DeepEqual(init0, init1) {
				t.Errorf("failed Modify changed the QP:\nbefore %+v\nafter  %+v", attr0, attr1)
			}
			if path1 := qp.rc.Path(); path1 != path0 {
				t.Errorf("failed Modify changed the transport path:\nbefore %+v\nafter  %+v", path0, path1)
			}
			// The same attributes with the fault removed are accepted.
			if tc.mask&qpstate.AttrState != 0 && tc.attr.State == StateRTR {
				good := rtr(func(*QPAttr) {})
				if err := qp.Modify(&good, rtrMask); err != nil {
					t.Fatalf("valid RTR refused after a failed one: %v", err)
				}
			}
		})
	}
}

// TestConnectValidatesFirst: Connect with a path MTU the port cannot
// carry fails before the first step, leaving the QP in RESET.
func TestConnectValidatesFirst(t *testing.T) {
	a, b := openPair(t)
	_, _, qp := newQP(t, a)
	gb, _ := b.QueryGID(0)
	attr0, _ := qp.Query()
	err := qp.Connect(RemoteInfo{QPN: 0x77, PSN: 1, GID: gb}, &ConnectOptions{PathMTU: 4096})
	if err == nil || !strings.Contains(err.Error(), "active MTU") {
		t.Fatalf("Connect = %v", err)
	}
	if attr1, _ := qp.Query(); !reflect.DeepEqual(attr0, attr1) || attr1.State != StateReset {
		t.Fatalf("failed Connect changed the QP:\nbefore %+v\nafter  %+v", attr0, attr1)
	}
}

// TestDeallocPDInUse: a PD with a QP or an MR cannot be deallocated; the
// error says what uses it; once they are gone it can, once.
func TestDeallocPDInUse(t *testing.T) {
	a, _ := openPair(t)
	pd, _, qp := newQP(t, a)
	mr, err := pd.RegMR(make([]byte, 64), AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	err = pd.Dealloc()
	if !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "1 QPs") {
		t.Fatalf("Dealloc with a QP and an MR = %v", err)
	}
	if err := qp.Destroy(); err != nil {
		t.Fatal(err)
	}
	err = pd.Dealloc()
	if !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "memory regions") {
		t.Fatalf("Dealloc with an MR = %v", err)
	}
	if err := a.DeregMR(mr); err != nil {
		t.Fatal(err)
	}
	if err := pd.Dealloc(); err != nil {
		t.Fatalf("Dealloc of an unused PD: %v", err)
	}
	if err := pd.Dealloc(); err == nil {
		t.Fatal("second Dealloc succeeded")
	}
	c, _ := a.CreateCQ(4)
	if _, err := pd.CreateQP(QPInitAttr{SendCQ: c, RecvCQ: c}); err == nil || !strings.Contains(err.Error(), "deallocated") {
		t.Fatalf("CreateQP on a deallocated PD = %v", err)
	}
}

// TestDestroyQP: Destroy works once; the QP refuses verbs afterwards, and
// its slot under max_qp, its PD and its CQs are free again.
func TestDestroyQP(t *testing.T) {
	la, _ := newPipe(t)
	a, err := Open(la, &Options{MaxQP: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	pd, c, qp := newQP(t, a)
	if err := qp.Destroy(); err != nil {
		t.Fatal(err)
	}
	if err := qp.Destroy(); err == nil || !strings.Contains(err.Error(), "already destroyed") {
		t.Fatalf("second Destroy = %v", err)
	}
	if err := qp.PostRecv(&RecvWR{ID: 1}); err == nil || !strings.Contains(err.Error(), "destroyed") {
		t.Fatalf("PostRecv on a destroyed QP = %v", err)
	}
	if err := qp.Init(AccessRemoteRead); err == nil || !strings.Contains(err.Error(), "destroyed") {
		t.Fatalf("Modify on a destroyed QP = %v", err)
	}
	if err := a.DestroyCQ(c); err != nil {
		t.Fatalf("DestroyCQ after its only QP was destroyed: %v", err)
	}
	c2, _ := a.CreateCQ(4)
	q2, err := pd.CreateQP(QPInitAttr{SendCQ: c2, RecvCQ: c2})
	if err != nil {
		t.Fatalf("CreateQP with max_qp 1 after the first QP was destroyed: %v", err)
	}
	a.Close()
	if err := q2.Destroy(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Destroy after Close = %v", err)
	}
}

func newPipe(t *testing.T) (nic.Link, nic.Link) {
	t.Helper()
	la, lb := pipe.New(pipe.Config{MTU: 1500})
	t.Cleanup(func() { la.Close(); lb.Close() })
	return la, lb
}

// TestMaxQPAndMaxCQ: the limits QueryDevice reports are the ones
// enforced; destroying frees a slot; a CQ in use cannot be destroyed.
func TestMaxQPAndMaxCQ(t *testing.T) {
	if d, _ := openPair(t); d.QueryDevice().MaxQP != DefaultMaxQP || d.QueryDevice().MaxCQ != DefaultMaxCQ {
		t.Fatalf("default limits %+v", d.QueryDevice())
	}
	la, _ := newPipe(t)
	a, err := Open(la, &Options{MaxQP: 2, MaxCQ: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if attr := a.QueryDevice(); attr.MaxQP != 2 || attr.MaxCQ != 2 {
		t.Fatalf("QueryDevice %+v, want max_qp 2, max_cq 2", attr)
	}
	pd, _ := a.AllocPD()
	c1, _ := a.CreateCQ(8)
	c2, err := a.CreateCQ(8)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.CreateCQ(8); err == nil || !strings.Contains(err.Error(), "max_cq 2") {
		t.Fatalf("third CQ = %v", err)
	}
	q1, _ := pd.CreateQP(QPInitAttr{SendCQ: c1, RecvCQ: c2})
	if _, err := pd.CreateQP(QPInitAttr{SendCQ: c1, RecvCQ: c1}); err != nil {
		t.Fatal(err)
	}
	if _, err := pd.CreateQP(QPInitAttr{SendCQ: c1, RecvCQ: c1}); err == nil || !strings.Contains(err.Error(), "max_qp 2") {
		t.Fatalf("third QP = %v", err)
	}
	if err := a.DestroyCQ(c2); !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), "1 QP") {
		t.Fatalf("DestroyCQ of a CQ in use = %v", err)
	}
	if err := q1.Destroy(); err != nil {
		t.Fatal(err)
	}
	if err := a.DestroyCQ(c2); err != nil {
		t.Fatalf("DestroyCQ of an unused CQ: %v", err)
	}
	if err := a.DestroyCQ(c2); err == nil {
		t.Fatal("second DestroyCQ succeeded")
	}
	if _, err := pd.CreateQP(QPInitAttr{SendCQ: c2, RecvCQ: c1}); err == nil || !strings.Contains(err.Error(), "send CQ") {
		t.Fatalf("CreateQP with a destroyed CQ = %v", err)
	}
	foreign, _ := cq.New(8)
	if _, err := pd.CreateQP(QPInitAttr{SendCQ: c1, RecvCQ: foreign}); err == nil || !strings.Contains(err.Error(), "receive CQ") {
		t.Fatalf("CreateQP with a CQ not made by the device = %v", err)
	}
	if _, err := a.CreateCQ(8); err != nil {
		t.Fatalf("CreateCQ after DestroyCQ freed a slot: %v", err)
	}
	if _, err := pd.CreateQP(QPInitAttr{SendCQ: c1, RecvCQ: c1}); err != nil {
		t.Fatalf("CreateQP after Destroy freed a slot: %v", err)
	}
}

// TestAsyncEventTypes: the values are enum ibv_event_type's and each type
// has its own text.
func TestAsyncEventTypes(t *testing.T) {
	want := map[AsyncEventType]uint8{EventCQErr: 0, EventQPFatal: 1, EventDeviceFatal: 8}
	seen := map[string]bool{}
	for ty, v := range want {
		if uint8(ty) != v {
			t.Errorf("%v = %d, want %d", ty, uint8(ty), v)
		}
		s := ty.String()
		if s == "" || seen[s] || strings.Contains(s, "unknown") {
			t.Errorf("%d.String() = %q", uint8(ty), s)
		}
		seen[s] = true
	}
	if s := AsyncEventType(42).String(); !strings.Contains(s, "42") {
		t.Errorf("AsyncEventType(42).String() = %q", s)
	}
}

// TestAsyncEventsDropped: events raised while the queue is full are
// counted, and the queued ones each name their CQ.
func TestAsyncEventsDropped(t *testing.T) {
	a, _ := openPair(t)
	const n = asyncQueueLen + 6
	cqs := map[*CQ]bool{}
	for i := 0; i < n; i++ {
		c, err := a.CreateCQ(1)
		if err != nil {
			t.Fatal(err)
		}
		cqs[c] = true
		c.Push(WC{})
		if c.Push(WC{}) {
			t.Fatal("push into a full CQ accepted")
		}
	}
	if got := a.AsyncEventsDropped(); got != n-asyncQueueLen {
		t.Fatalf("AsyncEventsDropped() = %d, want %d", got, n-asyncQueueLen)
	}
	for i := 0; i < asyncQueueLen; i++ {
		ev := <-a.AsyncEvents()
		if ev.Type != EventCQErr || !cqs[ev.CQ] {
			t.Fatalf("event %+v, want a CQ error naming one of the CQs", ev)
		}
		delete(cqs, ev.CQ)
	}
}

// TestSendCQOverrunIsAsyncEvent: a send CQ too small for the send
// completions raises a CQ error on the device's async events, naming it.
func TestSendCQOverrunIsAsyncEvent(t *testing.T) {
	a, b := openPair(t)
	pda, _ := a.AllocPD()
	scq, _ := a.CreateCQ(1)
	rcq, _ := a.CreateCQ(16)
	qa, err := pda.CreateQP(QPInitAttr{SendCQ: scq, RecvCQ: rcq, Cap: QPCap{MaxInlineData: 8}})
	if err != nil {
		t.Fatal(err)
	}
	pdb, _, qb := newQP(t, b)
	mrb, _ := pdb.RegMR(make([]byte, 64), AccessLocalWrite|AccessRemoteWrite)
	ga, _ := a.QueryGID(0)
	gb, _ := b.QueryGID(0)
	if err := qa.Connect(RemoteInfo{QPN: qb.Num(), PSN: 1, GID: gb}, &ConnectOptions{SQPSN: 1}); err != nil {
		t.Fatal(err)
	}
	if err := qb.Connect(RemoteInfo{QPN: qa.Num(), PSN: 1, GID: ga}, &ConnectOptions{SQPSN: 1}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if err := qa.PostSend(&SendWR{ID: uint64(i), Opcode: WRRDMAWrite, Flags: SendSignaled | SendInline, InlineData: []byte{1},
			RemoteAddr: mrb.Addr(), RKey: mrb.RKey()}); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case ev := <-a.AsyncEvents():
		if ev.Type != EventCQErr || ev.CQ != scq {
			t.Fatalf("first async event %+v, want the send CQ's error", ev)
		}
		// The write that fitted succeeded: the overrun is not from errors.
		wcs := make([]WC, 1)
		if scq.Poll(wcs) != 1 || wcs[0].Status != cq.Success {
			t.Fatalf("the completion stored before the overrun: %+v", wcs[0])
		}
	case <-time.After(guard):
		t.Fatal("no CQ error on the device's async events")
	}
}

// TestCloseFlushes: Close moves every QP to ERR, so a waiter on the CQ gets
// each outstanding work request back flushed; verbs then fail with
// ErrClosed.
func TestCloseFlushes(t *testing.T) {
	a, b := openPair(t)
	pd, c, qp := newQP(t, a)
	mr, _ := pd.RegMR(make([]byte, 64), AccessLocalWrite)
	gb, _ := b.QueryGID(0)
	// Nobody answers on b (no such QP), and timeout 31 (2.4 hours) keeps
	// the sends outstanding until Close.
	if err := qp.Connect(RemoteInfo{QPN: 0x123, PSN: 1, GID: gb}, &ConnectOptions{Timeout: 31}); err != nil {
		t.Fatal(err)
	}
	sge := []SGE{{Addr: mr.Addr(), Length: 8, LKey: mr.LKey()}}
	for i := 0; i < 2; i++ {
		if err := qp.PostSend(&SendWR{ID: uint64(10 + i), Opcode: WRSend, SGL: sge, Flags: SendSignaled}); err != nil {
			t.Fatal(err)
		}
		if err := qp.PostRecv(&RecvWR{ID: uint64(20 + i), SGL: sge}); err != nil {
			t.Fatal(err)
		}
	}
	got := make(chan []WC)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), guard)
		defer cancel()
		var wcs []WC
		buf := make([]WC, 8)
		for len(wcs) < 4 {
			n, err := c.Wait(ctx, buf)
			if err != nil {
				break
			}
			wcs = append(wcs, buf[:n]...)
		}
		got <- wcs
	}()
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	wcs := <-got
	ids := map[uint64]bool{}
	for _, wc := range wcs {
		if wc.Status != cq.WRFlushErr {
			t.Errorf("completion %+v, want WR_FLUSH_ERR", wc)
		}
		ids[wc.WRID] = true
	}
	if len(wcs) != 4 || !ids[10] || !ids[11] || !ids[20] || !ids[21] {
		t.Fatalf("completions after Close: %+v, want the 2 sends and 2 receives flushed", wcs)
	}
	if qp.State() != StateErr {
		t.Errorf("QP state %v after Close", qp.State())
	}
	if !errors.Is(a.Err(), ErrClosed) {
		t.Errorf("Err() = %v", a.Err())
	}
	for name, err := range map[string]error{
		"PostSend": qp.PostSend(&SendWR{Opcode: WRSend}),
		"PostRecv": qp.PostRecv(&RecvWR{}),
		"Modify":   qp.Modify(&QPAttr{State: StateReset}, qpstate.AttrState),
		"Destroy":  qp.Destroy(),
		"Dealloc":  pd.Dealloc(),
		"DeregMR":  a.DeregMR(mr),
		"DestroyCQ": func() error {
			return a.DestroyCQ(c)
		}(),
		"AllocPD":  func() error { _, err := a.AllocPD(); return err }(),
		"CreateCQ": func() error { _, err := a.CreateCQ(4); return err }(),
		"RegMR":    func() error { _, err := pd.RegMR(make([]byte, 8), 0); return err }(),
		"CreateQP": func() error { _, err := pd.CreateQP(QPInitAttr{SendCQ: c, RecvCQ: c}); return err }(),
	} {
		if !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), "closed") {
			t.Errorf("%s on a closed device = %v, want ErrClosed", name, err)
		}
	}
	if err := a.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
}

var errLinkGone = errors.New("link gone: netdev removed")

// failLink is a nic.Link whose Recv fails with errLinkGone when told to;
// Send discards.
type failLink struct {
	fail, closed chan struct{}
	once         sync.Once
}

func newFailLink() *failLink {
	return &failLink{fail: make(chan struct{}), closed: make(chan struct{})}
}

func (l *failLink) Recv([]nic.Packet) (int, error) {
	select {
	case <-l.fail:
		return 0, errLinkGone
	case <-l.closed:
		return 0, net.ErrClosed
	}
}
func (l *failLink) Send(p []nic.Packet) (int, error) { return len(p), nil }
func (l *failLink) BatchSize() int                   { return 8 }
func (l *failLink) MTU() int                         { return 1500 }
func (l *failLink) Addrs() []netip.Addr              { return []netip.Addr{netip.MustParseAddr("10.0.0.1")} }
func (l *failLink) Stats() nic.Stats                 { return nic.Stats{} }
func (l *failLink) Close() error                     { l.once.Do(func() { close(l.closed) }); return nil }

// TestLinkFailureIsDeviceFatal: a link whose Recv fails raises
// IBV_EVENT_DEVICE_FATAL, flushes every QP, and later verbs fail with an
// error naming the link's error; cleanup verbs still work.
func TestLinkFailureIsDeviceFatal(t *testing.T) {
	link := newFailLink()
	a, err := Open(link, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	pd, c, qp := newQP(t, a)
	mr, _ := pd.RegMR(make([]byte, 64), AccessLocalWrite)
	if err := qp.Connect(RemoteInfo{QPN: 0x123, PSN: 1, GID: GIDFromAddr(netip.MustParseAddr("10.0.0.2"))}, &ConnectOptions{Timeout: 31}); err != nil {
		t.Fatal(err)
	}
	sge := []SGE{{Addr: mr.Addr(), Length: 8, LKey: mr.LKey()}}
	if err := qp.PostSend(&SendWR{ID: 1, Opcode: WRSend, SGL: sge, Flags: SendSignaled}); err != nil {
		t.Fatal(err)
	}
	if err := qp.PostRecv(&RecvWR{ID: 2, SGL: sge}); err != nil {
		t.Fatal(err)
	}
	if a.Err() != nil {
		t.Fatalf("Err() = %v on a working device", a.Err())
	}
	close(link.fail)
	select {
	case ev := <-a.AsyncEvents():
		if ev.Type != EventDeviceFatal || !strings.Contains(ev.Reason, errLinkGone.Error()) {
			t.Fatalf("async event %+v, want a device fatal error naming the link error", ev)
		}
	case <-time.After(guard):
		t.Fatal("no device fatal event")
	}
	if err := a.Err(); !errors.Is(err, ErrDeviceFatal) || !errors.Is(err, errLinkGone) {
		t.Fatalf("Err() = %v", err)
	}
	if qp.State() != StateErr {
		t.Fatalf("QP state %v after the link failed", qp.State())
	}
	wcs := make([]WC, 4)
	if n := c.Poll(wcs); n != 2 || wcs[0].Status != cq.WRFlushErr || wcs[1].Status != cq.WRFlushErr {
		t.Fatalf("completions %+v, want the send and the receive flushed", wcs[:n])
	}
	for name, err := range map[string]error{
		"PostSend": qp.PostSend(&SendWR{Opcode: WRSend}),
		"PostRecv": qp.PostRecv(&RecvWR{}),
		"CreateQP": func() error { _, err := pd.CreateQP(QPInitAttr{SendCQ: c, RecvCQ: c}); return err }(),
	} {
		if !errors.Is(err, ErrDeviceFatal) || !strings.Contains(err.Error(), errLinkGone.Error()) {
			t.Errorf("%s after the link failed = %v", name, err)
		}
	}
	// Freeing what the program holds still works on a failed device.
	if err := qp.Destroy(); err != nil {
		t.Errorf("Destroy: %v", err)
	}
	if err := a.DeregMR(mr); err != nil {
		t.Errorf("DeregMR: %v", err)
	}
	if err := pd.Dealloc(); err != nil {
		t.Errorf("Dealloc: %v", err)
	}
	if err := a.DestroyCQ(c); err != nil {
		t.Errorf("DestroyCQ: %v", err)
	}
	if err := a.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}
