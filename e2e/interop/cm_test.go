package interop

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/softroce/softroce/bth/mad"
	"github.com/softroce/softroce/cm"
	"github.com/softroce/softroce/conformance/rxevm"
	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/verbs"
)

// ucmatose's defaults (librdmacm/examples/cmatose.c): port 7471, one
// connection, 10 messages of 100 bytes each way. The server sends first;
// the client answers once it has received all of them; the server
// disconnects.
const (
	ucmatosePort  = 7471
	ucmatoseCount = 10
	ucmatoseSize  = 100
)

// cmPeer is the softroce side of an rdma_cm test: a CM on the host
// device's QP1 and an RC QP with ucmatose's queue sizes.
type cmPeer struct {
	dev *verbs.Device
	cm  *cm.CM
	pd  *verbs.PD
	scq *verbs.CQ
	rcq *verbs.CQ
	mr  *verbs.MR
	buf []byte
	qp  *verbs.QP
}

func newCMPeer(t *testing.T) *cmPeer { return newCMPeerOn(t, nil) }

// newCMPeerOn runs the CM on wrap(QP1) when wrap is set, to lose MADs.
func newCMPeerOn(t *testing.T, wrap func(*cm.QP1) cm.MADConn) *cmPeer {
	t.Helper()
	p := &cmPeer{dev: hostDevice(t), buf: make([]byte, 2*ucmatoseSize)}
	var err error
	if wrap == nil {
		p.cm, err = cm.Open(p.dev, nil)
	} else {
		var q *cm.QP1
		if q, err = cm.OpenQP1(p.dev, 0); err == nil {
			p.cm, err = cm.New(p.dev, wrap(q), nil)
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.cm.Close() })
	p.pd, _ = p.dev.AllocPD()
	p.scq, _ = p.dev.CreateCQ(ucmatoseCount)
	p.rcq, _ = p.dev.CreateCQ(ucmatoseCount)
	p.mr, _ = p.pd.RegMR(p.buf, verbs.AccessLocalWrite)
	if p.qp, err = p.pd.CreateQP(verbs.QPInitAttr{SendCQ: p.scq, RecvCQ: p.rcq, SQSigAll: true,
		Cap: verbs.QPCap{MaxSendWR: ucmatoseCount, MaxRecvWR: ucmatoseCount}}); err != nil {
		t.Fatal(err)
	}
	// ucmatose posts its receives before it connects or accepts; so do we
	// (a QP takes receives from INIT on).
	if err := p.qp.Init(0); err != nil {
		t.Fatal(err)
	}
	for i := range ucmatoseCount {
		if err := p.qp.PostRecv(&verbs.RecvWR{ID: uint64(100 + i), SGL: []verbs.SGE{{Addr: p.mr.Addr() + ucmatoseSize,
			Length: ucmatoseSize, LKey: p.mr.LKey()}}}); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

func (p *cmPeer) sendAll() error {
	for i := range ucmatoseCount {
		if err := p.qp.PostSend(&verbs.SendWR{ID: uint64(i), Opcode: verbs.WRSend,
			SGL: []verbs.SGE{{Addr: p.mr.Addr(), Length: ucmatoseSize, LKey: p.mr.LKey()}}}); err != nil {
			return err
		}
	}
	return nil
}

// wait takes n completions from c, all of which must succeed.
func wait(ctx context.Context, c *verbs.CQ, n int, what string) error {
	wcs := make([]verbs.WC, n)
	for got := 0; got < n; {
		k, err := c.Wait(ctx, wcs[got:])
		if err != nil {
			return fmt.Errorf("%s: %d of %d completions: %w", what, got, n, err)
		}
		for _, wc := range wcs[got : got+k] {
			if wc.Status != cq.Success {
				return fmt.Errorf("%s: completion %d: %v", what, got, wc.Status)
			}
		}
		got += k
	}
	return nil
}

// captureTap records the test's traffic on the VM's tap, kept under the
// temporary directory when the test fails.
func captureTap(t *testing.T, name string) {
	t.Helper()
	path := filepath.Join(os.TempDir(), "softroce-"+name+".pcap")
	f, err := os.Create(path)
	if err != nil {
		return
	}
	c, err := vm.CaptureTap(f)
	if err != nil {
		f.Close()
		return
	}
	t.Cleanup(func() {
		c.Stop()
		f.Close()
		if t.Failed() {
			t.Logf("tap capture: %s", path)
		} else {
			os.Remove(path)
		}
	})
}

// TestUcmatoseAgainstRxe runs ucmatose on the rxe guest against a softroce
// peer built on package cm, both roles: the guest's kernel CM (IB CM over
// rxe's QP1, rdma_cm on top) connects, exchanges 10 SENDs each way and
// disconnects with the softroce CM.
func TestUcmatoseAgainstRxe(t *testing.T) {
	needVM(t)
	t.Run("softroce-server", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
		defer cancel()
		captureTap(t, "ucmatose-server")
		p := newCMPeer(t)
		l, err := p.cm.Listen(cm.PortSpaceTCP, ucmatosePort)
		if err != nil {
			t.Fatal(err)
		}
		proc, err := vm.Start(ctx, fmt.Sprintf("timeout 120 ucmatose -s %s", vm.HostAddr()))
		if err != nil {
			t.Fatal(err)
		}
		defer proc.Kill()
		guest := func() string { out, _ := proc.Wait(ctx); return out }
		req, err := l.Next(ctx)
		if err != nil {
			t.Fatalf("no connection request: %v\nguest:\n%s", err, guest())
		}
		t.Logf("request from %v port %d, QPN %d, %+v", req.Remote, req.RemotePort, req.RemoteQPN, req.Param)
		k, err := req.Accept(ctx, p.qp, nil)
		if err != nil {
			t.Fatalf("accept: %v\nguest:\n%s", err, guest())
		}
		if err := p.sendAll(); err != nil {
			t.Fatal(err)
		}
		if err := wait(ctx, p.scq, ucmatoseCount, "sends"); err != nil {
			t.Fatalf("%v\nguest:\n%s", err, guest())
		}
		if err := wait(ctx, p.rcq, ucmatoseCount, "receives"); err != nil {
			t.Fatalf("%v\nguest:\n%s", err, guest())
		}
		if err := k.Disconnect(ctx); err != nil {
			t.Fatalf("disconnect: %v\nguest:\n%s", err, guest())
		}
		out, err := proc.Wait(ctx)
		if err != nil || !strings.Contains(out, "data transfers complete") || !strings.Contains(out, "return status 0") {
			t.Fatalf("ucmatose client: %v\n%s", err, out)
		}
		t.Logf("guest: %s; CM %+v", lastLines(out, 3), p.cm.Stats())
	})
	t.Run("softroce-client", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
		defer cancel()
		captureTap(t, "ucmatose-client")
		p := newCMPeer(t)
		proc, err := vm.Start(ctx, "timeout 120 ucmatose")
		if err != nil {
			t.Fatal(err)
		}
		defer proc.Kill()
		guest := func() string { out, _ := proc.Wait(ctx); return out }
		// The server listens once it has started: until then its CM
		// answers REJ 8, which is quick, so retry on that alone.
		var k *cm.Conn
		for {
			k, err = p.cm.Dial(ctx, vm.GuestAddr(), cm.PortSpaceTCP, ucmatosePort, p.qp,
				&cm.ConnParam{ResponderResources: 1, InitiatorDepth: 1, RetryCount: 5, RNRRetryCount: 7})
			if !errors.Is(err, cm.ErrNoListener) || ctx.Err() != nil {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("dial: %v\nguest:\n%s", err, guest())
		}
		if err := wait(ctx, p.rcq, ucmatoseCount, "receives"); err != nil {
			t.Fatalf("%v\nguest:\n%s", err, guest())
		}
		if err := p.sendAll(); err != nil {
			t.Fatal(err)
		}
		if err := wait(ctx, p.scq, ucmatoseCount, "sends"); err != nil {
			t.Fatalf("%v\nguest:\n%s", err, guest())
		}
		select {
		case <-k.Done():
		case <-ctx.Done():
			t.Fatalf("the server never disconnected\nguest:\n%s", guest())
		}
		out, err := proc.Wait(ctx)
		if err != nil || !strings.Contains(out, "data transfers complete") || !strings.Contains(out, "return status 0") {
			t.Fatalf("ucmatose server: %v\n%s", err, out)
		}
		t.Logf("guest: %s; CM %+v", lastLines(out, 3), p.cm.Stats())
	})
}

// udaddy's defaults (librdmacm/examples/udaddy.c): port 7174 of
// RDMA_PS_UDP, 10 datagrams of 100 bytes each way, SEND_WITH_IMM carrying
// the sender's QPN so the server can answer without a SIDR of its own.
const (
	udaddyPort  = 7174
	udaddyCount = 10
	udaddySize  = 100
)

type udPeer struct {
	cm  *cm.CM
	pd  *verbs.PD
	cq  *verbs.CQ
	mr  *verbs.MR
	buf []byte
	qp  *verbs.QP
}

func newUDPeer(t *testing.T) *udPeer {
	t.Helper()
	dev := hostDevice(t)
	p := &udPeer{buf: make([]byte, udaddyCount*(verbs.GRHLen+udaddySize)+udaddySize)}
	var err error
	if p.cm, err = cm.Open(dev, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.cm.Close() })
	p.pd, _ = dev.AllocPD()
	p.cq, _ = dev.CreateCQ(2 * udaddyCount)
	p.mr, _ = p.pd.RegMR(p.buf, verbs.AccessLocalWrite)
	if p.qp, err = p.pd.CreateQP(verbs.QPInitAttr{Type: verbs.QPTypeUD, SendCQ: p.cq, RecvCQ: p.cq,
		Cap: verbs.QPCap{MaxSendWR: udaddyCount, MaxRecvWR: udaddyCount}}); err != nil {
		t.Fatal(err)
	}
	// rdma_cm gives the UD QPs of RDMA_PS_UDP the Q_Key 0x01234567.
	if err := p.qp.ReadyUD(cm.UDPQKey, 0); err != nil {
		t.Fatal(err)
	}
	for i := range udaddyCount {
		off := uint64(i * (verbs.GRHLen + udaddySize))
		if err := p.qp.PostRecv(&verbs.RecvWR{ID: uint64(100 + i), SGL: []verbs.SGE{{Addr: p.mr.Addr() + off,
			Length: verbs.GRHLen + udaddySize, LKey: p.mr.LKey()}}}); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// send sends udaddy's 10 datagrams to qpn at addr.
func (p *udPeer) send(addr verbs.GID, qpn, qkey uint32) error {
	ah, err := p.pd.CreateAH(verbs.AHAttr{DGID: addr, HopLimit: 64})
	if err != nil {
		return err
	}
	defer ah.Destroy()
	src := p.mr.Addr() + uint64(udaddyCount*(verbs.GRHLen+udaddySize))
	for i := range udaddyCount {
		if err := p.qp.PostSend(&verbs.SendWR{ID: uint64(i), Opcode: verbs.WRSendWithImm, Flags: verbs.SendSignaled,
			Imm: p.qp.Num(), SGL: []verbs.SGE{{Addr: src, Length: udaddySize, LKey: p.mr.LKey()}},
			AH: ah.AV(), RemoteQPN: qpn, RemoteQKey: qkey}); err != nil {
			return err
		}
	}
	return nil
}

// recv takes n completions, which must succeed, and returns the receives.
func (p *udPeer) recv(ctx context.Context, n int) ([]verbs.WC, error) {
	var recvs []verbs.WC
	wcs := make([]verbs.WC, n)
	for got := 0; got < n; {
		k, err := p.cq.Wait(ctx, wcs[:n-got])
		if err != nil {
			return nil, fmt.Errorf("%d of %d completions: %w", got, n, err)
		}
		for _, wc := range wcs[:k] {
			if wc.Status != cq.Success {
				return nil, fmt.Errorf("completion %d: %v", got, wc.Status)
			}
			if wc.WRID >= 100 {
				recvs = append(recvs, wc)
			}
		}
		got += k
	}
	return recvs, nil
}

// TestUdaddyAgainstRxe runs udaddy on the rxe guest against a softroce
// peer built on package cm, both roles: the client resolves the server's
// UD QP with SIDR (the kernel's SIDR_REQ/SIDR_REP over QP1, Q_Key
// 0x01234567) and the two exchange 10 datagrams each way.
func TestUdaddyAgainstRxe(t *testing.T) {
	needVM(t)
	t.Run("softroce-server", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
		defer cancel()
		captureTap(t, "udaddy-server")
		p := newUDPeer(t)
		l, err := p.cm.Listen(cm.PortSpaceUDP, udaddyPort)
		if err != nil {
			t.Fatal(err)
		}
		proc, err := vm.Start(ctx, fmt.Sprintf("timeout 120 udaddy -s %s", vm.HostAddr()))
		if err != nil {
			t.Fatal(err)
		}
		defer proc.Kill()
		guest := func() string { out, _ := proc.Wait(ctx); return out }
		req, err := l.Next(ctx)
		if err != nil || !req.UD() {
			t.Fatalf("no UD request (%v)\nguest:\n%s", err, guest())
		}
		if err := req.AcceptUD(p.qp.Num(), 0, nil); err != nil {
			t.Fatal(err)
		}
		recvs, err := p.recv(ctx, udaddyCount)
		if err != nil {
			t.Fatalf("receives: %v\nguest:\n%s", err, guest())
		}
		// Reply to the address in the GRH and the QPN in the immediate.
		wc := recvs[0]
		src := p.buf[int(wc.WRID-100)*(verbs.GRHLen+udaddySize):]
		from := verbs.GIDFromAddr(netip.AddrFrom4([4]byte(src[32:36])))
		if err := p.send(from, wc.ImmData, cm.UDPQKey); err != nil {
			t.Fatal(err)
		}
		if _, err := p.recv(ctx, udaddyCount); err != nil {
			t.Fatalf("sends: %v\nguest:\n%s", err, guest())
		}
		out, err := proc.Wait(ctx)
		if err != nil || !strings.Contains(out, "data transfers complete") || !strings.Contains(out, "return status 0") {
			t.Fatalf("udaddy client: %v\n%s", err, out)
		}
		t.Logf("guest: %s; CM %+v", lastLines(out, 3), p.cm.Stats())
	})
	t.Run("softroce-client", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
		defer cancel()
		captureTap(t, "udaddy-client")
		p := newUDPeer(t)
		proc, err := vm.Start(ctx, "timeout 120 udaddy")
		if err != nil {
			t.Fatal(err)
		}
		defer proc.Kill()
		guest := func() string { out, _ := proc.Wait(ctx); return out }
		var r *cm.UDRemote
		for {
			r, err = p.cm.ResolveUD(ctx, vm.GuestAddr(), udaddyPort, nil)
			if !errors.Is(err, cm.ErrNoListener) || ctx.Err() != nil {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("resolve: %v\nguest:\n%s", err, guest())
		}
		t.Logf("resolved: QPN %d Q_Key %#x", r.QPN, r.QKey)
		if r.QKey != cm.UDPQKey {
			t.Errorf("Q_Key %#x, want %#x", r.QKey, cm.UDPQKey)
		}
		if err := p.send(verbs.GIDFromAddr(r.Addr), r.QPN, r.QKey); err != nil {
			t.Fatal(err)
		}
		// Our 10 send completions and the server's 10 replies.
		if recvs, err := p.recv(ctx, 2*udaddyCount); err != nil || len(recvs) != udaddyCount {
			t.Fatalf("exchange: %v (%d receives)\nguest:\n%s", err, len(recvs), guest())
		}
		out, err := proc.Wait(ctx)
		if err != nil || !strings.Contains(out, "data transfers complete") || !strings.Contains(out, "return status 0") {
			t.Fatalf("udaddy server: %v\n%s", err, out)
		}
		t.Logf("guest: %s; CM %+v", lastLines(out, 3), p.cm.Stats())
	})
}

// TestCMNoListenerAgainstRxe checks REJ 8 both ways: the kernel's CM
// refuses a softroce REQ for a port nobody listens on, and ucmatose sees
// softroce's REJ as RDMA_CM_EVENT_REJECTED with status 8.
func TestCMNoListenerAgainstRxe(t *testing.T) {
	needVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	p := newCMPeer(t)
	_, err := p.cm.Dial(ctx, vm.GuestAddr(), cm.PortSpaceTCP, 9, p.qp, nil)
	var rej *cm.RejectError
	if !errors.Is(err, cm.ErrNoListener) || !errors.As(err, &rej) || rej.Reason != 8 {
		t.Fatalf("dial to a port nobody listens on: %v", err)
	}
	t.Logf("softroce: %v", err)
	out, _ := vm.Run(ctx, fmt.Sprintf("timeout 60 ucmatose -s %s -p 9", vm.HostAddr()))
	if !strings.Contains(out, "RDMA_CM_EVENT_REJECTED, error: 8") {
		t.Fatalf("ucmatose to a port softroce does not listen on:\n%s", out)
	}
	if s := p.cm.Stats(); s.RejectedNoListener != 1 {
		t.Errorf("CM stats %+v", s)
	}
	t.Logf("guest: %s", lastLines(out, 3))
}

// loseFirst is QP1 losing the first MAD of one attribute it sends.
type loseFirst struct {
	*cm.QP1
	attr mad.AttrID
	lost atomic.Bool
}

func (l *loseFirst) SendMAD(to cm.Peer, b []byte) error {
	if mad.MAD(b).AttrID() == l.attr && l.lost.CompareAndSwap(false, true) {
		return nil
	}
	return l.QP1.SendMAD(to, b)
}

// TestUcmatoseLossAgainstRxe loses one CM message of softroce's and lets
// the kernel's retransmission rules recover it: a lost RTU (softroce
// client) is recovered by the kernel retransmitting its REP, which
// softroce answers with the RTU again; a lost REP (softroce server) by
// softroce retransmitting it on the REQ's CM response timeout, while the
// kernel's duplicate REQ is dropped.
func TestUcmatoseLossAgainstRxe(t *testing.T) {
	needVM(t)
	for _, tc := range []struct {
		name string
		attr mad.AttrID
	}{{"lost-RTU/softroce-client", mad.AttrRTU}, {"lost-REP/softroce-server", mad.AttrREP}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
			defer cancel()
			var lossy *loseFirst
			p := newCMPeerOn(t, func(q *cm.QP1) cm.MADConn { lossy = &loseFirst{QP1: q, attr: tc.attr}; return lossy })
			var proc *rxevm.GuestProc
			var k *cm.Conn
			var err error
			if tc.attr == mad.AttrRTU {
				if proc, err = vm.Start(ctx, "timeout 120 ucmatose"); err != nil {
					t.Fatal(err)
				}
				for {
					k, err = p.cm.Dial(ctx, vm.GuestAddr(), cm.PortSpaceTCP, ucmatosePort, p.qp, nil)
					if !errors.Is(err, cm.ErrNoListener) || ctx.Err() != nil {
						break
					}
					time.Sleep(200 * time.Millisecond)
				}
			} else {
				l, lerr := p.cm.Listen(cm.PortSpaceTCP, ucmatosePort)
				if lerr != nil {
					t.Fatal(lerr)
				}
				if proc, err = vm.Start(ctx, fmt.Sprintf("timeout 120 ucmatose -s %s", vm.HostAddr())); err != nil {
					t.Fatal(err)
				}
				var req *cm.ConnRequest
				if req, err = l.Next(ctx); err == nil {
					k, err = req.Accept(ctx, p.qp, nil)
				}
			}
			defer proc.Kill()
			guest := func() string { out, _ := proc.Wait(ctx); return out }
			if err != nil {
				t.Fatalf("connect: %v\nguest:\n%s", err, guest())
			}
			if !lossy.lost.Load() {
				t.Fatal("nothing was lost")
			}
			// The rest of ucmatose's exchange, in the role's order.
			if tc.attr == mad.AttrRTU {
				err = errors.Join(wait(ctx, p.rcq, ucmatoseCount, "receives"), p.sendAll(), wait(ctx, p.scq, ucmatoseCount, "sends"))
				if err == nil {
					<-k.Done()
				}
			} else {
				err = errors.Join(p.sendAll(), wait(ctx, p.scq, ucmatoseCount, "sends"), wait(ctx, p.rcq, ucmatoseCount, "receives"))
				if err == nil {
					err = k.Disconnect(ctx)
				}
			}
			if err != nil {
				t.Fatalf("%v\nguest:\n%s", err, guest())
			}
			out, err := proc.Wait(ctx)
			if err != nil || !strings.Contains(out, "return status 0") {
				t.Fatalf("ucmatose: %v\n%s", err, out)
			}
			s := p.cm.Stats()
			if tc.attr == mad.AttrRTU && s.Duplicates != 1 {
				t.Errorf("want the kernel's REP retransmission answered as a duplicate: %+v", s)
			}
			if tc.attr == mad.AttrREP && s.Retransmitted < 1 {
				t.Errorf("want softroce's REP retransmitted: %+v", s)
			}
			t.Logf("guest: %s; CM %+v", lastLines(out, 2), s)
		})
	}
}
