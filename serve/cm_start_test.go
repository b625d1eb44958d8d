package serve

import (
	"context"
	"errors"
	"log"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/softroce/softroce/cm"
	"github.com/softroce/softroce/nic/pipe"
	"github.com/softroce/softroce/verbs"
)

// logBuf collects a Server's log lines.
type logBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// cmPair is a daemon on one end of a pipe (10.0.0.1) and, on the other
// end, a device with its own CM: a peer host whose programs use rdma_cm.
type cmPair struct {
	s    *Server
	lg   *logBuf
	peer *cm.CM
	pdev *verbs.Device
	pd   *verbs.PD
	cq   *verbs.CQ
}

// newCMPair starts the daemon; before starts with its device (before
// the daemon takes it over), the peer's CM is opened after Listen.
func newCMPair(t *testing.T, before func(d *verbs.Device)) *cmPair {
	t.Helper()
	la, lb := pipe.New(pipe.Config{})
	da, err := verbs.Open(la, nil)
	if err != nil {
		t.Fatal(err)
	}
	db, err := verbs.Open(lb, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if before != nil {
		before(da)
	}
	p := &cmPair{lg: &logBuf{}, pdev: db}
	p.s = serveOn(t, []*verbs.Device{da}, Config{Socket: filepath.Join(t.TempDir(), "s.sock"), Log: log.New(p.lg, "", 0)})
	if p.peer, err = cm.Open(db, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.peer.Close() })
	if p.pd, err = db.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if p.cq, err = db.CreateCQ(16); err != nil {
		t.Fatal(err)
	}
	return p
}

func (p *cmPair) qp(t *testing.T) *verbs.QP {
	t.Helper()
	qp, err := p.pd.CreateQP(verbs.QPInitAttr{SendCQ: p.cq, RecvCQ: p.cq})
	if err != nil {
		t.Fatal(err)
	}
	return qp
}

var daemonAddr = netip.MustParseAddr("10.0.0.1")

// A daemon no program has used answers a peer's REQ for a port nobody
// listens on with REJ 8 and its SIDR_REQ with SIDR status 1, as the
// kernel's ib_cm does on a host with an RNIC: the peer's Dial and
// ResolveUD fail with ErrNoListener instead of retrying until
// ErrUnreachable (no deadline here: without an answer they would return
// ErrUnreachable after their retries, and the test would fail on it).
func TestCMAnswersBeforeAnyRdmaCM(t *testing.T) {
	p := newCMPair(t, nil)
	ctx := context.Background()
	_, err := p.peer.Dial(ctx, daemonAddr, cm.PortSpaceTCP, 7471, p.qp(t), nil)
	var rej *cm.RejectError
	if !errors.Is(err, cm.ErrNoListener) || !errors.As(err, &rej) || rej.Reason != cm.RejInvalidServiceID {
		t.Fatalf("Dial to a port nobody listens on: %v, want REJ 8 (ErrNoListener)", err)
	}
	if _, err := p.peer.ResolveUD(ctx, daemonAddr, 7174, nil); !errors.Is(err, cm.ErrNoListener) {
		t.Fatalf("ResolveUD of a port nobody listens on: %v, want SIDR status 1 (ErrNoListener)", err)
	}
	if st := p.s.Stats(); st.Accepted != 0 {
		t.Fatalf("a client used the daemon: %+v", st)
	}
	c, err := p.s.devs[0].cmOpen()
	if err != nil {
		t.Fatal(err)
	}
	if st := c.Stats(); st.RejectedNoListener != 2 {
		t.Errorf("daemon's CM: %d requests refused for want of a listener, want 2 (%+v)", st.RejectedNoListener, st)
	}
	if st := p.peer.Stats(); st.Retransmitted != 0 {
		t.Errorf("the peer retransmitted %d times: the first answer should have done (%+v)", st.Retransmitted, st)
	}
	// Once closed, the daemon's CM is gone for good, and a closed device
	// is not reopened.
	p.s.Close()
	if _, err := p.s.devs[0].cmOpen(); !errors.Is(err, cm.ErrClosed) {
		t.Errorf("CM of a closed daemon: %v, want ErrClosed", err)
	}
}

// When QP1 is another owner's as the daemon starts, that is logged once;
// rdma_cm calls fail with the reason (rdma_listen: ENODEV) until QP1 is
// free, and then the CM opens on the next use and answers the peer.
func TestCMStartWithQP1Taken(t *testing.T) {
	var owner *cm.QP1
	p := newCMPair(t, func(d *verbs.Device) {
		var err error
		if owner, err = cm.OpenQP1(d, 0); err != nil {
			t.Fatal(err)
		}
	})
	defer owner.Close()
	if n := strings.Count(p.lg.String(), "cannot take QP1"); n != 1 {
		t.Fatalf("%d log lines about QP1 at start, want 1:\n%s", n, p.lg.String())
	}
	// A program's rdma_listen is refused, with the reason.
	r := dial(t, p.s)
	e, _, fds := r.call(opCMOpen, cmReqBody(0, nil))
	if e != 0 {
		t.Fatalf("CM_OPEN: %v", e)
	}
	closeAll(fds)
	listen := func() error {
		_, body, _ := r.call(opCMCreateID, cmReqBody(0, func(b []byte) { le.PutUint32(b[4:], psTCP) }))
		id := le.Uint32(body)
		if e, _, _ := r.call(opCMBind, cmReqBody(id, func(b []byte) { putSockaddr(b[40:], netip.MustParseAddrPort("10.0.0.1:7471")) })); e != 0 {
			t.Fatalf("BIND: %v", e)
		}
		if e, _, _ := r.call(opCMListen, cmReqBody(id, nil)); e != 0 {
			return e
		}
		return nil
	}
	if err := listen(); err != syscall.ENODEV {
		t.Errorf("LISTEN with QP1 taken: %v, want ENODEV", err)
	}
	if _, err := p.s.devs[0].cmOpen(); err == nil || !errors.Is(err, verbs.ErrBusy) {
		t.Errorf("open with QP1 taken: %v, want the busy QP1", err)
	}
	if n := strings.Count(p.lg.String(), "cannot take QP1"); n != 1 {
		t.Errorf("%d log lines about QP1 after more tries, want still 1:\n%s", n, p.lg.String())
	}
	// QP1 freed: the next use opens the CM, which answers the peer.
	owner.Close()
	if err := listen(); err != nil {
		t.Fatalf("LISTEN once QP1 is free: %v", err)
	}
	if !strings.Contains(p.lg.String(), "now has QP1") {
		t.Errorf("the recovery was not logged:\n%s", p.lg.String())
	}
	_, err := p.peer.Dial(context.Background(), daemonAddr, cm.PortSpaceTCP, 7472, p.qp(t), nil)
	if !errors.Is(err, cm.ErrNoListener) {
		t.Errorf("Dial to a port nobody listens on: %v, want ErrNoListener", err)
	}
}
