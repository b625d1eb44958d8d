package cm

import (
	"bytes"
	"errors"
	"net/netip"
	"testing"

	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/nic/pipe"
	"github.com/softroce/softroce/nic/udp"
	"github.com/softroce/softroce/verbs"
)

func openQP1Side(t *testing.T, link nic.Link) *side {
	t.Helper()
	dev, err := verbs.Open(link, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := Open(dev, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := &side{dev: dev, cm: c, buf: make([]byte, 4096)}
	s.pd, _ = dev.AllocPD()
	s.cq, _ = dev.CreateCQ(64)
	s.mr, _ = s.pd.RegMR(s.buf, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
	t.Cleanup(func() { c.Close(); dev.Close() })
	return s
}

// TestQP1Loopback runs the whole stack: two devices on an in-process pipe,
// each CM on its device's QP1 (UD SENDs with a GRH), an RC connection made
// by Dial and Accept, a SEND across it, a UD resolution, a refused port
// and a disconnect.
func TestQP1Loopback(t *testing.T) {
	t.Run("IPv4", func(t *testing.T) { qp1Loopback(t, pipe.Config{}) })
	t.Run("IPv6", func(t *testing.T) {
		qp1Loopback(t, pipe.Config{AddrA: netip.MustParseAddr("fd00::1"), AddrB: netip.MustParseAddr("fd00::2")})
	})
}

func qp1Loopback(t *testing.T, cfg pipe.Config) {
	la, lb := pipe.New(cfg)
	a, b := openQP1Side(t, la), openQP1Side(t, lb)
	ctx := ctxT(t)
	l, err := b.cm.Listen(PortSpaceTCP, 7174)
	if err != nil {
		t.Fatal(err)
	}
	bqp := b.newQP(t)
	if err := bqp.Init(verbs.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	if err := bqp.PostRecv(&verbs.RecvWR{ID: 7, SGL: []verbs.SGE{{Addr: b.mr.Addr(), Length: 64, LKey: b.mr.LKey()}}}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	var kb *Conn
	var from netip.Addr
	go func() {
		req, err := l.Next(ctx)
		if err != nil {
			done <- err
			return
		}
		from = req.Remote // from the cma_hdr
		kb, err = req.Accept(ctx, bqp, nil)
		done <- err
	}()
	aqp := a.newQP(t)
	ka, err := a.cm.Dial(ctx, b.cm.Local(), PortSpaceTCP, 7174, aqp, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if from != a.cm.Local() || kb.Remote() != a.cm.Local() || ka.Remote() != b.cm.Local() {
		t.Fatalf("addresses: cma_hdr source %v, passive remote %v, active remote %v", from, kb.Remote(), ka.Remote())
	}
	copy(a.buf, "over QP1")
	if err := aqp.PostSend(&verbs.SendWR{ID: 1, Opcode: verbs.WRSend, Flags: verbs.SendSignaled,
		SGL: []verbs.SGE{{Addr: a.mr.Addr(), Length: 8, LKey: a.mr.LKey()}}}); err != nil {
		t.Fatal(err)
	}
	wc := make([]verbs.WC, 1)
	if _, err := b.cq.Wait(ctx, wc); err != nil || wc[0].Status != cq.Success || !bytes.Equal(b.buf[:8], []byte("over QP1")) {
		t.Fatalf("receive: %v %+v", err, wc[0])
	}
	// SIDR over QP1.
	lu, _ := b.cm.Listen(PortSpaceUDP, 7174)
	go func() {
		if req, err := lu.Next(ctx); err == nil {
			req.AcceptUD(0x99, 0, nil)
		}
	}()
	r, err := a.cm.ResolveUD(ctx, b.cm.Local(), 7174, nil)
	if err != nil || r.QPN != 0x99 || r.QKey != UDPQKey {
		t.Fatalf("resolve UD: %v %+v", err, r)
	}
	// Nobody on another port: REJ 8 back through QP1.
	if _, err := a.cm.Dial(ctx, b.cm.Local(), PortSpaceTCP, 1, a.newQP(t), nil); !errors.Is(err, ErrNoListener) {
		t.Fatalf("dial to a closed port: %v", err)
	}
	if err := ka.Disconnect(ctx); err != nil {
		t.Fatal(err)
	}
	<-kb.Done()
	if s := b.cm.Stats(); s.Malformed != 0 || s.Unmatched != 0 || s.SendErrors != 0 {
		t.Errorf("passive CM stats %+v", s)
	}
}

func TestGRHSource(t *testing.T) {
	// IPv4 as rxe writes it: 20 zero bytes, then the IPv4 header.
	g := make([]byte, verbs.GRHLen)
	g[20] = 0x45
	copy(g[32:36], []byte{10, 88, 0, 2})
	if a, ok := grhSource(g); !ok || a.String() != "10.88.0.2" {
		t.Fatalf("IPv4 GRH: %v %v", a, ok)
	}
	// IPv6: the GRH is the IPv6 header, source at byte 8.
	g6 := make([]byte, verbs.GRHLen)
	g6[0] = 0x60
	copy(g6[8:24], []byte{0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1})
	if a, ok := grhSource(g6); !ok || a.String() != "fd00::1" {
		t.Fatalf("IPv6 GRH: %v %v", a, ok)
	}
	if _, ok := grhSource(make([]byte, verbs.GRHLen)); ok {
		t.Fatal("an all-zero GRH names a source")
	}
}

// TestUDPLoopback connects two devices over kernel UDP sockets on
// 127.91.0.1 and 127.91.0.2, port 4791: the CM's MADs and the RC traffic
// cross real sockets, and replies go to the GRH's IPv4 source.
func TestUDPLoopback(t *testing.T) {
	var links [2]nic.Link
	for i, a := range []string{"127.91.0.1", "127.91.0.2"} {
		l, err := udp.Open(udp.Config{Addr: netip.MustParseAddr(a), MTU: 1500})
		if err != nil {
			t.Fatalf("UDP socket on %s:4791: %v", a, err)
		}
		links[i] = l
	}
	a, b := openQP1Side(t, links[0]), openQP1Side(t, links[1])
	ctx := ctxT(t)
	l, err := b.cm.Listen(PortSpaceTCP, 18515)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		req, err := l.Next(ctx)
		if err == nil {
			_, err = req.Accept(ctx, b.newQP(t), nil)
		}
		done <- err
	}()
	k, err := a.cm.Dial(ctx, netip.MustParseAddr("127.91.0.2"), PortSpaceTCP, 18515, a.newQP(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := k.Disconnect(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestQP1HostileDatagrams sends a CM, through its device's QP1, what a
// hostile peer would: datagrams too short, random bytes, a REP for no
// connection, a REQ for a port nobody listens on. The first three are
// counted and dropped; the REQ draws a REJ 8 back to the sender's QP1,
// addressed from the GRH.
func TestQP1HostileDatagrams(t *testing.T) {
	la, lb := pipe.New(pipe.Config{})
	da, err := verbs.Open(la, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer da.Close()
	raw, err := OpenQP1(da, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	b := openQP1Side(t, lb)
	to := Peer{Addr: netip.AddrPortFrom(b.cm.Local(), 4791), QPN: 1}
	junk := make([]byte, MADSize)
	for i := range junk {
		junk[i] = byte(i * 7)
	}
	rep := build(&msg{attr: attrREP, localID: 5, remoteID: 6, qpn: 7})
	req := build(&msg{attr: attrREQ, tid: 0xfeed, localID: 0x1234, serviceID: ServiceID(PortSpaceTCP, 4444), qpn: 9, mtu: 3})
	for _, m := range [][]byte{junk[:10], junk, rep, req} {
		if err := raw.SendMAD(to, m); err != nil {
			t.Fatal(err)
		}
	}
	buf := make([]byte, 2*MADSize)
	n, from, err := raw.RecvMAD(buf)
	if err != nil {
		t.Fatal(err)
	}
	var m msg
	if err := decode(buf[:n], &m); err != nil || m.attr != attrREJ || m.reason != RejInvalidServiceID || m.tid != 0xfeed || m.remoteID != 0x1234 {
		t.Fatalf("reply %+v (%v)", m, err)
	}
	if from.Addr.Addr() != b.cm.Local() || from.QPN != 1 {
		t.Errorf("reply from %v", from)
	}
	s := b.cm.Stats()
	if s.Received != 4 || s.Malformed != 2 || s.Unmatched != 1 || s.RejectedNoListener != 1 || s.Conns != 0 {
		t.Errorf("stats %+v", s)
	}
}
