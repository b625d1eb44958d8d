package cm

import (
	"bytes"
	"net/netip"
	"testing"
	"time"

	"github.com/softroce/softroce/bth/mad"
)

// The engine tests run two (or more) engines over an in-memory network on
// simulated time: nothing sleeps, and a lost message is a filter.

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

type packet struct {
	from, to Peer
	b        []byte
}

type memNet struct {
	nodes map[netip.AddrPort]*node
	queue []packet
	// drop, when set, is asked about every packet; true loses it.
	drop func(p packet) bool
	log  []packet
}

type node struct {
	net    *memNet
	addr   netip.AddrPort
	e      *engine
	events []event
	// on, when set, sees every event as it is dispatched.
	on func(n *node, ev *event)
}

func newMemNet() *memNet { return &memNet{nodes: map[netip.AddrPort]*node{}} }

type nodeTx struct{ n *node }

func (t nodeTx) SendMAD(to Peer, b []byte) error {
	t.n.net.queue = append(t.n.net.queue, packet{from: Peer{t.n.addr, 1}, to: to, b: append([]byte(nil), b...)})
	return nil
}

func (nw *memNet) add(addr string, cfg Config) *node {
	n := &node{net: nw, addr: netip.MustParseAddrPort(addr)}
	if cfg.GUID == 0 {
		cfg.GUID = uint64(len(nw.nodes)+1) * 0x1111
	}
	if cfg.Seed == 0 {
		cfg.Seed = uint64(len(nw.nodes) + 7)
	}
	n.e = newEngine(cfg, nodeTx{n}, func(ev *event) {
		n.events = append(n.events, *ev)
		if n.on != nil {
			n.on(n, ev)
		}
	})
	nw.nodes[n.addr] = n
	return n
}

// deliver hands every queued packet to its destination until the network
// is quiet, and returns how many were delivered.
func (nw *memNet) deliver(now time.Time) int {
	n := 0
	for len(nw.queue) > 0 {
		p := nw.queue[0]
		nw.queue = nw.queue[1:]
		nw.log = append(nw.log, p)
		if nw.drop != nil && nw.drop(p) {
			continue
		}
		if dst := nw.nodes[p.to.Addr]; dst != nil {
			n++
			dst.e.Receive(now, p.from, p.b)
		}
	}
	return n
}

// advance runs every node's timers up to end, in deadline order, delivering
// what they send, and returns the time it stopped.
func (nw *memNet) advance(now, end time.Time) time.Time {
	for {
		var next time.Time
		for _, n := range nw.nodes {
			if d := n.e.NextDeadline(); !d.IsZero() && (next.IsZero() || d.Before(next)) {
				next = d
			}
		}
		if next.IsZero() || next.After(end) {
			return end
		}
		if next.Before(now) {
			next = now
		}
		now = next
		for _, n := range nw.nodes {
			n.e.Tick(now)
		}
		nw.deliver(now)
	}
}

// connect has a send testReq(b) at t0 and delivers what follows.
func (nw *memNet) connect(a, b *node) *conn {
	c, _ := a.e.connect(t0, testReq(b))
	nw.deliver(t0)
	return c
}

func (nw *memNet) count(attr uint16) int {
	k := 0
	for _, p := range nw.log {
		if mad.MAD(p.b).AttrID() == mad.AttrID(attr) {
			k++
		}
	}
	return k
}

func (n *node) last(typ eventType) *event {
	for i := len(n.events) - 1; i >= 0; i-- {
		if n.events[i].typ == typ {
			return &n.events[i]
		}
	}
	return nil
}

func (n *node) has(typ eventType) bool { return n.last(typ) != nil }

const svc = 0x0000000001060000 | 7174

func testReq(to *node) *reqParams {
	return &reqParams{peer: Peer{to.addr, 1}, serviceID: svc, qpn: 0x11, psn: 0xabcdef, respRes: 4, initDepth: 2,
		retryCount: 7, rnrRetry: 6, mtu: 3, hopLimit: 64, private: []byte("hello")}
}

// autoAccept makes b accept every REQ it gets with QPN 0x22 and PSN 0x123456.
func autoAccept(b *node) {
	b.on = func(n *node, ev *event) {
		if ev.typ == evReqReceived {
			if err := n.e.accept(t0, ev.c, &repParams{qpn: 0x22, psn: 0x123456, respRes: ev.c.respRes,
				initDepth: ev.c.initDepth, rnrRetry: 7, private: []byte("welcome")}); err != nil {
				panic(err)
			}
		}
	}
}

// autoRTU makes a answer every REP with an RTU.
func autoRTU(a *node) {
	a.on = func(n *node, ev *event) {
		if ev.typ == evRepReceived {
			if err := n.e.rtu(t0, ev.c, nil); err != nil {
				panic(err)
			}
		}
	}
}

func pair(t *testing.T) (*memNet, *node, *node) {
	t.Helper()
	nw := newMemNet()
	a := nw.add("10.0.0.1:4791", Config{})
	b := nw.add("10.0.0.2:4791", Config{})
	if _, err := b.e.listen(svc, "L"); err != nil {
		t.Fatal(err)
	}
	return nw, a, b
}

// answerDREQ makes b answer every DREQ with a DREP.
func answerDREQ(b *node) {
	b.on = func(n *node, ev *event) {
		if ev.typ == evDreqReceived {
			n.e.disconnect(t0, ev.c, nil)
		}
	}
}

// autoPair is pair with b accepting every REQ and a answering every REP.
func autoPair(t *testing.T) (*memNet, *node, *node) {
	t.Helper()
	nw, a, b := pair(t)
	autoAccept(b)
	autoRTU(a)
	return nw, a, b
}

// dropFirst drops the first MAD of attr.
func dropFirst(attr mad.AttrID) func(packet) bool {
	lost := false
	return func(p packet) bool {
		if mad.MAD(p.b).AttrID() == attr && !lost {
			lost = true
			return true
		}
		return false
	}
}

// dropAll drops every MAD of attr.
func dropAll(attr mad.AttrID) func(packet) bool {
	return func(p packet) bool { return mad.MAD(p.b).AttrID() == attr }
}

func TestConnectEstablishes(t *testing.T) {
	nw, a, b := autoPair(t)
	c, err := a.e.connect(t0, testReq(b))
	if err != nil {
		t.Fatal(err)
	}
	nw.deliver(t0)
	if c.state != stEstablished {
		t.Fatalf("active state %v, want ESTABLISHED", c.state)
	}
	req := b.last(evReqReceived)
	if req == nil {
		t.Fatal("no REQ event")
	}
	bc := req.c
	if bc.state != stEstablished || !b.has(evEstablished) {
		t.Fatalf("passive state %v, want ESTABLISHED", bc.state)
	}
	if !bytes.HasPrefix(req.m.private, []byte("hello")) {
		t.Errorf("REQ private data %q", req.m.private[:8])
	}
	// The passive side learns the active side's QPN and PSN; resources are
	// seen from its own side (its responder resources are the peer's
	// initiator depth).
	if bc.remoteQPN != 0x11 || bc.sqPSN != 0xabcdef || bc.respRes != 2 || bc.initDepth != 4 {
		t.Errorf("passive: remote QPN %#x sq PSN %#x resp %d init %d", bc.remoteQPN, bc.sqPSN, bc.respRes, bc.initDepth)
	}
	if c.remoteQPN != 0x22 || c.sqPSN != 0x123456 || c.rqPSN != 0xabcdef || c.rnrRetry != 7 {
		t.Errorf("active: remote QPN %#x sq PSN %#x rq PSN %#x rnr %d", c.remoteQPN, c.sqPSN, c.rqPSN, c.rnrRetry)
	}
	// Active: REQ resp 4 / init 2, REP echoes passive's view (resp 2, init 4)
	// so the active side's initiator depth is the REP's responder resources.
	if c.initDepth != 2 || c.respRes != 4 {
		t.Errorf("active: init %d resp %d, want 2 and 4", c.initDepth, c.respRes)
	}
	// Local ACK timeout: the REQ asks for ackTimeout(15, 16) = 17, the
	// passive side takes it, the active side recomputes it from the REP.
	if bc.avTimeout != 17 || c.avTimeout != 17 {
		t.Errorf("ACK timeouts: passive %d active %d, want 17", bc.avTimeout, c.avTimeout)
	}
	if c.remoteID != bc.localID || bc.remoteID != c.localID {
		t.Errorf("comm IDs do not pair: %#x/%#x and %#x/%#x", c.localID, c.remoteID, bc.localID, bc.remoteID)
	}
	// Transaction IDs: hi_tid << 32 | local comm ID, kept by REP and RTU.
	for _, p := range nw.log {
		v := mad.MAD(p.b)
		if v.TID() != c.tid {
			t.Errorf("%v TID %#x, want the REQ's %#x", v.AttrID(), v.TID(), c.tid)
		}
	}
	if uint32(c.tid) != c.localID {
		t.Errorf("TID %#x does not end in the comm ID %#x", c.tid, c.localID)
	}
	if s := b.e.Stats(); s.HalfOpen != 0 || s.Conns != 1 {
		t.Errorf("passive stats %+v", s)
	}
	if got := nw.count(attrREQ) + nw.count(attrREP) + nw.count(attrRTU); got != 3 || len(nw.log) != 3 {
		t.Errorf("%d messages, want REQ REP RTU", len(nw.log))
	}
}

func TestNoListenerREJ8(t *testing.T) {
	nw, a, b := pair(t)
	p := testReq(b)
	p.serviceID = svc + 1
	c, _ := a.e.connect(t0, p)
	nw.deliver(t0)
	ev := a.last(evRejReceived)
	if ev == nil || ev.m.reason != RejInvalidServiceID {
		t.Fatalf("want REJ reason 8, got %+v", ev)
	}
	if !c.dead || a.e.Stats().Conns != 0 {
		t.Error("rejected communication not forgotten")
	}
	if s := b.e.Stats(); s.RejectedNoListener != 1 || s.Conns != 0 {
		t.Errorf("passive stats %+v", s)
	}
	// The REJ names the REQ's comm ID as remote and carries its TID.
	r := mad.MAD(nw.log[1].b).REJ()
	if r.RemoteCommID() != c.localID || r.LocalCommID() != 0 || r.MsgRejected() != mad.RejectedREQ || mad.MAD(nw.log[1].b).TID() != c.tid {
		t.Errorf("REJ fields: local %#x remote %#x msg %d", r.LocalCommID(), r.RemoteCommID(), r.MsgRejected())
	}
}

func TestConsumerReject(t *testing.T) {
	nw, a, b := pair(t)
	b.on = func(n *node, ev *event) {
		if ev.typ == evReqReceived {
			if err := n.e.reject(t0, ev.c, RejConsumerDefined, nil, []byte("go away")); err != nil {
				panic(err)
			}
		}
	}
	nw.connect(a, b)
	ev := a.last(evRejReceived)
	if ev == nil || ev.m.reason != RejConsumerDefined || !bytes.HasPrefix(ev.m.private, []byte("go away")) {
		t.Fatalf("want REJ 28 with private data, got %+v", ev)
	}
	if a.e.Stats().Conns != 0 || b.e.Stats().Conns != 0 || b.e.Stats().HalfOpen != 0 {
		t.Error("state left after a reject")
	}
}

func TestLostREQRetransmitted(t *testing.T) {
	nw, a, b := autoPair(t)
	nw.drop = dropFirst(mad.AttrREQ)
	c := nw.connect(a, b)
	if c.state != stReqSent {
		t.Fatalf("state %v after a lost REQ", c.state)
	}
	// rdma_cm's REQ timeout: 2 x 2^(16-8) ms + 2^(20-8) ms.
	want := t0.Add(4608 * time.Millisecond)
	if d := a.e.NextDeadline(); !d.Equal(want) {
		t.Fatalf("retransmission at %v, want %v", d.Sub(t0), want.Sub(t0))
	}
	nw.advance(t0, want)
	if c.state != stEstablished || a.e.Stats().Retransmitted != 1 {
		t.Fatalf("state %v, %d retransmissions", c.state, a.e.Stats().Retransmitted)
	}
}

func TestUnreachableAfterRetries(t *testing.T) {
	nw, a, b := pair(t)
	nw.drop = func(packet) bool { return true }
	nw.connect(a, b)
	end := nw.advance(t0, t0.Add(10*time.Minute))
	_ = end
	ev := a.last(evReqError)
	if ev == nil {
		t.Fatal("no REQ error")
	}
	if n := nw.count(attrREQ); n != 16 {
		t.Errorf("%d REQs sent, want 1 + 15 retries", n)
	}
	if s := a.e.Stats(); s.Timeouts != 1 || s.Conns != 0 || s.Retransmitted != 15 {
		t.Errorf("stats %+v", s)
	}
}

func TestLostREPDuplicateREQDropped(t *testing.T) {
	nw, a, b := autoPair(t)
	nw.drop = dropFirst(mad.AttrREP)
	c := nw.connect(a, b)
	nw.advance(t0, t0.Add(10*time.Second))
	if c.state != stEstablished {
		t.Fatalf("state %v", c.state)
	}
	// The passive side retransmitted its REP after 2^(20-8) ms, before the
	// active side's REQ timer (4608 ms) fired.
	if n := nw.count(attrREP); n != 2 {
		t.Errorf("%d REPs, want 2", n)
	}
	if n := nw.count(attrREQ); n != 1 {
		t.Errorf("%d REQs, want 1", n)
	}
}

func TestDuplicateREQBeforeAcceptDrawsMRA(t *testing.T) {
	nw, a, b := pair(t)
	autoRTU(a)
	c := nw.connect(a, b)
	now := nw.advance(t0, t0.Add(4608*time.Millisecond))
	if n := nw.count(attrMRA); n != 1 {
		t.Fatalf("%d MRAs, want one answering the duplicate REQ", n)
	}
	if c.state != stMRAReqRcvd {
		t.Fatalf("active state %v, want MRA_REQ_RCVD", c.state)
	}
	if s := b.e.Stats(); s.Duplicates != 1 || s.Conns != 1 {
		t.Errorf("passive stats %+v", s)
	}
	// The MRA's service timeout 24 plus 2^(17-8) ms.
	want := now.Add(65536*time.Millisecond + 512*time.Millisecond)
	if d := a.e.NextDeadline(); !d.Equal(want) {
		t.Errorf("REQ deadline after MRA in %v, want %v", d.Sub(now), want.Sub(now))
	}
	bc := b.last(evReqReceived).c
	if err := b.e.accept(now, bc, &repParams{qpn: 0x22, psn: 1}); err != nil {
		t.Fatal(err)
	}
	nw.deliver(now)
	if c.state != stEstablished || bc.state != stEstablished {
		t.Fatalf("states %v %v", c.state, bc.state)
	}
}

func TestLostRTUDuplicateREPResendsRTU(t *testing.T) {
	nw, a, b := autoPair(t)
	nw.drop = dropFirst(mad.AttrRTU)
	nw.connect(a, b)
	bc := b.last(evReqReceived).c
	if bc.state != stRepSent {
		t.Fatalf("passive %v", bc.state)
	}
	nw.advance(t0, t0.Add(5*time.Second))
	if bc.state != stEstablished || nw.count(attrRTU) != 2 || a.e.Stats().Duplicates != 1 {
		t.Fatalf("passive %v, %d RTUs, active dups %d", bc.state, nw.count(attrRTU), a.e.Stats().Duplicates)
	}
}

func TestEstablishBeforeRTU(t *testing.T) {
	nw, a, b := autoPair(t)
	nw.drop = dropAll(mad.AttrRTU)
	nw.connect(a, b)
	bc := b.last(evReqReceived).c
	// The first packet on the QP stands for the RTU (COMM_EST).
	if err := b.e.establish(bc); err != nil {
		t.Fatal(err)
	}
	b.e.dispatch()
	if bc.state != stEstablished || !b.has(evEstablished) || !b.e.NextDeadline().IsZero() {
		t.Fatalf("passive %v, deadline %v", bc.state, b.e.NextDeadline())
	}
}

func TestDisconnect(t *testing.T) {
	nw, a, b := autoPair(t)
	c := nw.connect(a, b)
	answerDREQ(b)
	if err := a.e.disconnect(t0, c, []byte("bye")); err != nil {
		t.Fatal(err)
	}
	nw.deliver(t0)
	if !a.has(evDrepReceived) || c.state != stTimewait {
		t.Fatalf("active %v", c.state)
	}
	nw.advance(t0, t0.Add(time.Second))
	if !a.has(evTimewaitExit) || !b.has(evTimewaitExit) || a.e.Stats().Conns != 0 || b.e.Stats().Conns != 0 {
		t.Fatalf("timewait not left: %+v %+v", a.e.Stats(), b.e.Stats())
	}
	// DREQ names the peer's QPN.
	for _, p := range nw.log {
		if v := mad.MAD(p.b); v.AttrID() == mad.AttrDREQ && v.DREQ().RemoteQPN() != 0x22 {
			t.Errorf("DREQ remote QPN %#x", v.DREQ().RemoteQPN())
		}
	}
}

func TestDREQWithoutDREPTimesOut(t *testing.T) {
	nw, a, b := autoPair(t)
	c := nw.connect(a, b)
	nw.drop = dropAll(mad.AttrDREQ)
	a.e.disconnect(t0, c, nil)
	nw.deliver(t0)
	nw.advance(t0, t0.Add(10*time.Minute))
	if !a.has(evDreqError) || !a.has(evTimewaitExit) || a.e.Stats().Conns != 0 {
		t.Fatalf("no DREQ error: %v", a.events)
	}
	if n := nw.count(attrDREQ); n != 16 {
		t.Errorf("%d DREQs, want 16", n)
	}
}

func TestLostDREPAnsweredFromTimewait(t *testing.T) {
	nw, a, b := autoPair(t)
	c := nw.connect(a, b)
	answerDREQ(b)
	nw.drop = dropFirst(mad.AttrDREP)
	// A long timewait on b so the retransmitted DREQ finds it.
	bc := b.last(evReqReceived).c
	bc.avTimeout = 24
	a.e.disconnect(t0, c, nil)
	nw.deliver(t0)
	nw.advance(t0, t0.Add(5*time.Second))
	if !a.has(evDrepReceived) || b.e.Stats().Duplicates != 1 {
		t.Fatalf("active events %v, passive dups %d", a.events, b.e.Stats().Duplicates)
	}
}

func TestAcceptTimeoutFreesHalfOpen(t *testing.T) {
	nw, a, b := pair(t)
	nw.connect(a, b)
	if s := b.e.Stats(); s.HalfOpen != 1 {
		t.Fatalf("half-open %d", s.HalfOpen)
	}
	nw.advance(t0, t0.Add(2*time.Minute))
	if s := b.e.Stats(); s.HalfOpen != 0 || s.Conns != 0 || !b.has(evAcceptTimeout) {
		t.Fatalf("passive stats %+v", s)
	}
	if ev := a.last(evRejReceived); ev == nil || ev.m.reason != RejConsumerDefined {
		t.Fatalf("active got %v", a.events)
	}
}

func TestStaleConnectionREJ10(t *testing.T) {
	nw, a, b := autoPair(t)
	nw.connect(a, b)
	// A second REQ naming the same QP of the same CA, with another comm ID.
	c2, _ := a.e.connect(t0, testReq(b))
	nw.deliver(t0)
	if ev := a.last(evRejReceived); ev == nil || ev.c != c2 || ev.m.reason != RejStaleConn {
		t.Fatalf("want REJ stale, got %v", a.events)
	}
	if b.e.Stats().RejectedStale != 1 {
		t.Error("stale REJ not counted")
	}
}

func TestSIDR(t *testing.T) {
	nw := newMemNet()
	a := nw.add("10.0.0.1:4791", Config{})
	b := nw.add("10.0.0.2:4791", Config{})
	sid := uint64(mad.RDMACMServiceID(mad.PortSpaceUDP, 7174))
	b.e.listen(sid, nil)
	b.on = func(n *node, ev *event) {
		if ev.typ == evSIDRReqReceived {
			n.e.sidrReply(ev.c, SIDRSuccess, 0x33, mad.RDMAUDPQKey, []byte("ud"))
		}
	}
	a.e.sidrRequest(t0, Peer{b.addr, 1}, sid, []byte("who"), nil)
	nw.deliver(t0)
	ev := a.last(evSIDRRepReceived)
	if ev == nil || ev.m.status != SIDRSuccess || ev.m.qpn != 0x33 || ev.m.qkey != mad.RDMAUDPQKey {
		t.Fatalf("SIDR_REP %+v", ev)
	}
	a.e.sidrRequest(t0, Peer{b.addr, 1}, sid+1, nil, nil)
	nw.deliver(t0)
	if ev := a.last(evSIDRRepReceived); ev.m.status != SIDRUnsupported {
		t.Fatalf("unknown service: status %d", ev.m.status)
	}
	if a.e.Stats().Conns != 0 || b.e.Stats().Conns != 0 {
		t.Error("SIDR left state")
	}
	// Unanswered SIDR_REQ: 1 + 15 tries of 4096 ms, then an error.
	nw.drop = func(packet) bool { return true }
	a.e.sidrRequest(t0, Peer{b.addr, 1}, sid, nil, nil)
	nw.deliver(t0)
	nw.advance(t0, t0.Add(2*time.Minute))
	if !a.has(evSIDRReqError) {
		t.Fatal("no SIDR timeout")
	}
}

// TestREQFieldsAsTheKernelWrites checks the REQ against what rdma_cm on
// RoCE sends: permissive LIDs and a routed path for hop limit 64, P_Key
// 0xFFFF, CM response timeouts 20 and 15 retries, the local ACK timeout
// ack_timeout(15, 16) = 17, RC transport.
func TestREQFieldsAsTheKernelWrites(t *testing.T) {
	nw, a, b := pair(t)
	p := testReq(b)
	p.localGID = gid(netip.MustParseAddr("10.0.0.1"))
	p.remoteGID = gid(netip.MustParseAddr("10.0.0.2"))
	a.e.connect(t0, p)
	r := mad.MAD(nw.queue[0].b).REQ()
	pp := r.Primary()
	switch {
	case r.ServiceID() != svc || r.LocalCAGUID() != a.e.cfg.GUID || r.LocalQPN() != 0x11 || r.StartingPSN() != 0xabcdef:
		t.Errorf("ids: %v %#x %#x %#x", r.ServiceID(), r.LocalCAGUID(), r.LocalQPN(), r.StartingPSN())
	case r.RemoteCMResponseTimeout() != 20 || r.LocalCMResponseTimeout() != 20 || r.MaxCMRetries() != 15:
		t.Errorf("CM timeouts %d %d retries %d", r.RemoteCMResponseTimeout(), r.LocalCMResponseTimeout(), r.MaxCMRetries())
	case r.TransportType() != 0 || r.PKey() != 0xFFFF || r.PathMTU() != 3 || r.RetryCount() != 7 || r.RNRRetryCount() != 6:
		t.Errorf("transport %d pkey %#x mtu %d retry %d rnr %d", r.TransportType(), r.PKey(), r.PathMTU(), r.RetryCount(), r.RNRRetryCount())
	case r.ResponderResources() != 4 || r.InitiatorDepth() != 2:
		t.Errorf("resources %d depth %d", r.ResponderResources(), r.InitiatorDepth())
	case pp.LocalLID() != 0xFFFF || pp.RemoteLID() != 0xFFFF || pp.SubnetLocal() || pp.HopLimit() != 64 || pp.LocalAckTimeout() != 17:
		t.Errorf("path: LIDs %#x %#x subnet local %v hop %d ack timeout %d", pp.LocalLID(), pp.RemoteLID(), pp.SubnetLocal(), pp.HopLimit(), pp.LocalAckTimeout())
	case pp.LocalGID() != netip.MustParseAddr("::ffff:10.0.0.1") || pp.RemoteGID() != netip.MustParseAddr("::ffff:10.0.0.2"):
		t.Errorf("GIDs %v %v", pp.LocalGID(), pp.RemoteGID())
	}
}
