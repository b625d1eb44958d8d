package cm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"time"

	"github.com/softroce/softroce/bth/mad"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/qpstate"
	"github.com/softroce/softroce/verbs"
)

// MADConn is a Transport that also receives: a device's QP1, or anything
// else that moves 256-byte MADs between CMs (tests use an in-memory one).
type MADConn interface {
	Transport
	// RecvMAD blocks for the next MAD, copies it into buf (at least
	// MADSize bytes) and says who sent it. Once Close is called it returns
	// an error.
	RecvMAD(buf []byte) (n int, from Peer, err error)
	Close() error
}

// Options tune a CM; the zero value (or nil) gives rdma_cm's defaults.
type Options struct {
	Config
	// Clock drives the timers (default: real time).
	Clock Clock
	// SGIDIndex is the GID table entry whose address the CM uses as its
	// own (0: DefaultSGIDIndex).
	SGIDIndex int
	// Backlog caps the requests waiting in a Listener for Next (default
	// 64, like a listen backlog); a REQ beyond it is dropped unanswered so
	// the peer retries it.
	Backlog int
}

// DefaultSGIDIndex is the GID a CM on dev uses by default: the first
// whose address is not IPv6 link-local (DefaultSGID).
func DefaultSGIDIndex(dev *verbs.Device) int { return DefaultSGID(dev.GIDTable()) }

// DefaultSGID is the index of the first GID of table whose address is not
// IPv6 link-local, or 0 when there is none. rdma_cm names peers by
// routable addresses, and a device on an interface has that interface's
// link-local GID at index 0 (as a kernel RoCE device has) with its IPv4
// address after it.
func DefaultSGID(table []verbs.GIDEntry) int {
	for i, g := range table {
		if a := g.Addr.Unmap(); !a.Is6() || !a.IsLinkLocalUnicast() {
			return i
		}
	}
	return 0
}

// SGIDFor is the index of the GID of table a message to remote goes
// from: for an IPv6 link-local peer the device's link-local GID (a peer
// on the link is reached only from the link's own scope, as the kernel's
// route lookup picks a link-local source for a link-local destination),
// otherwise def. ok is false when remote is link-local and the table has
// no link-local GID.
func SGIDFor(table []verbs.GIDEntry, remote netip.Addr, def int) (int, bool) {
	if r := remote.Unmap(); !r.Is6() || !r.IsLinkLocalUnicast() {
		return def, true
	}
	for i, g := range table {
		if a := g.Addr.Unmap(); a.Is6() && a.IsLinkLocalUnicast() {
			return i, true
		}
	}
	return def, false
}

// source is the GID index and address the CM uses toward remote
// (SGIDFor): its own, or its device's link-local one for a link-local
// peer.
func (c *CM) source(remote netip.Addr) (int, netip.Addr, bool) {
	if r := remote.Unmap(); !r.Is6() || !r.IsLinkLocalUnicast() {
		return c.sgid, c.local, true
	}
	g := c.dev.GIDTable()
	i, ok := SGIDFor(g, remote, c.sgid)
	if !ok || i >= len(g) {
		return c.sgid, c.local, false
	}
	return i, g[i].Addr, true
}

// CM is the connection manager of one device port: an IB CM over a MAD
// transport with rdma_cm's semantics on top. It runs two goroutines (one
// receiving, one for timers), whatever the number of connections.
type CM struct {
	dev   *verbs.Device
	t     MADConn
	e     *engine
	clock Clock
	local netip.Addr
	sgid  int
	opts  Options

	wakeCh chan struct{}
	done   chan struct{}
	wg     sync.WaitGroup

	mu        sync.Mutex
	closed    bool
	listeners map[*Listener]struct{}
}

// New starts a CM for dev that sends and receives its MADs through t. The
// CM uses dev's GID table for its own address and moves the QPs it is
// given through their states; t is closed by Close.
func New(dev *verbs.Device, t MADConn, opts *Options) (*CM, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	gids := dev.GIDTable()
	if o.SGIDIndex == 0 {
		o.SGIDIndex = DefaultSGIDIndex(dev)
	}
	if o.SGIDIndex < 0 || o.SGIDIndex >= len(gids) {
		return nil, fmt.Errorf("cm: GID index %d out of range: device %s has %d GIDs", o.SGIDIndex, dev.Name(), len(gids))
	}
	if o.Clock == nil {
		o.Clock = realClock{}
	}
	if o.Backlog <= 0 {
		o.Backlog = 64
	}
	local := gids[o.SGIDIndex].Addr
	if o.GUID == 0 {
		// A node GUID from the address: unique per port, stable across runs.
		g := netip.AddrFrom16(local.As16()).As16()
		o.GUID = binary.BigEndian.Uint64(g[8:]) ^ binary.BigEndian.Uint64(g[:8]) | 0x0200000000000000
	}
	c := &CM{dev: dev, t: t, clock: o.Clock, local: local, sgid: o.SGIDIndex, opts: o,
		wakeCh: make(chan struct{}, 1), done: make(chan struct{}), listeners: map[*Listener]struct{}{}}
	c.e = newEngine(o.Config, t, c.onEvent)
	c.wg.Add(2)
	go c.recvLoop()
	go c.timerLoop()
	return c, nil
}

// Close stops the CM: listeners close, waiting calls return ErrClosed and
// the transport is closed. Connections are not disconnected.
func (c *CM) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	ls := make([]*Listener, 0, len(c.listeners))
	for l := range c.listeners {
		ls = append(ls, l)
	}
	c.mu.Unlock()
	for _, l := range ls {
		l.Close()
	}
	close(c.done)
	err := c.t.Close()
	c.wg.Wait()
	return err
}

// Stats returns the IB CM's counters.
func (c *CM) Stats() Stats { return c.e.Stats() }

// Local is the address the CM connects from and listens on.
func (c *CM) Local() netip.Addr { return c.local }

func (c *CM) kick() {
	select {
	case c.wakeCh <- struct{}{}:
	default:
	}
}

func (c *CM) recvLoop() {
	defer c.wg.Done()
	buf := make([]byte, 2*MADSize)
	for {
		n, from, err := c.t.RecvMAD(buf)
		if err != nil {
			select {
			case <-c.done:
				return
			default:
			}
			// A transport error other than closing: keep receiving, but
			// not in a tight loop.
			t := c.clock.NewTimer(10 * time.Millisecond)
			select {
			case <-t.C():
			case <-c.done:
				t.Stop()
				return
			}
			continue
		}
		c.e.Receive(c.clock.Now(), from, buf[:n])
		c.kick()
	}
}

func (c *CM) timerLoop() {
	defer c.wg.Done()
	for {
		d := c.e.NextDeadline()
		var tc <-chan time.Time
		var tm Timer
		if !d.IsZero() {
			tm = c.clock.NewTimer(max(0, d.Sub(c.clock.Now())))
			tc = tm.C()
		}
		select {
		case <-tc:
			c.e.Tick(c.clock.Now())
		case <-c.wakeCh:
		case <-c.done:
			if tm != nil {
				tm.Stop()
			}
			return
		}
		if tm != nil {
			tm.Stop()
		}
	}
}

func (c *CM) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// onEvent routes the engine's events to the objects waiting for them. It
// runs in whichever goroutine dispatches, never concurrently with itself.
func (c *CM) onEvent(ev *event) {
	// What the handlers below send may set timers.
	defer c.kick()
	switch ev.typ {
	case evReqReceived, evSIDRReqReceived:
		l, _ := ev.l.user.(*Listener)
		if l == nil {
			c.e.forget(ev.c)
			return
		}
		l.take(ev)
		return
	}
	conn, _ := ev.c.user.(*Conn)
	if conn == nil {
		return
	}
	switch ev.typ {
	case evDreqReceived:
		// The peer disconnects: the DREP answers at once, the QP is left
		// as it is. The kernel's rdma_cm reports DISCONNECTED and changes
		// no QP state: this side's work still outstanding completes, and
		// its QP goes to ERR when it disconnects in turn (rdma_disconnect)
		// or destroys the QP.
		c.e.disconnect(c.clock.Now(), ev.c, nil)
		conn.end(ErrDisconnected)
	case evRejReceived:
		if conn.isUp() {
			conn.qpError()
			conn.end(fmt.Errorf("%w: %w", ErrDisconnected, &RejectError{Reason: ev.m.reason, PrivateData: ev.m.private}))
		}
	case evTimewaitExit:
		return
	}
	select {
	case conn.ev <- *ev:
	default:
	}
}

// ---- addresses ----

func mtuCode(bytes int) uint8 {
	for code := uint8(5); code > 1; code-- {
		if 128<<code <= bytes {
			return code
		}
	}
	return 1
}

func gid(a netip.Addr) [16]byte { return netip.AddrFrom16(a.As16()).As16() }

func (c *CM) peerOf(a netip.Addr) Peer { return Peer{netip.AddrPortFrom(a, nic.RoCEv2Port), 1} }

// ---- connections ----

// Conn is an RC connection made by Dial or ConnRequest.Accept. Its QP is
// in RTS once the call returns.
type Conn struct {
	cm     *CM
	c      *conn
	qp     *verbs.QP
	ev     chan event
	remote netip.Addr

	// set before the Conn is handed out
	privateData []byte
	param       ConnParam

	mu     sync.Mutex
	up     bool
	err    error
	done   chan struct{}
	ending bool
}

// cmaPrivate is a REQ's (SIDR_REQ's) private data: the cma_hdr from
// srcPort (0: an ephemeral port) to remote, then the consumer's data.
func (c *CM) cmaPrivate(local, remote netip.Addr, srcPort uint16, data []byte) []byte {
	private := make([]byte, mad.CMAHeaderLen+len(data))
	if srcPort == 0 {
		srcPort = uint16(0x8000 | rand.IntN(0x7000))
	}
	mad.CMAHeader(private).Encode(netip.AddrPortFrom(local.Unmap(), srcPort), remote.Unmap())
	copy(private[mad.CMAHeaderLen:], data)
	return private
}

func (c *CM) newConn(qp *verbs.QP, remote netip.Addr) *Conn {
	return &Conn{cm: c, qp: qp, remote: remote, ev: make(chan event, 16), done: make(chan struct{})}
}

// QP is the connection's queue pair.
func (k *Conn) QP() *verbs.QP { return k.qp }

// Remote is the peer's address.
func (k *Conn) Remote() netip.Addr { return k.remote }

// PrivateData is what the peer's REP (for Dial) or REQ (for Accept, after
// the cma_hdr) carried. REP private data is the whole 196-byte area.
func (k *Conn) PrivateData() []byte { return k.privateData }

// Param are the parameters the QP was set up with, from this side's view:
// ResponderResources the READs it accepts, InitiatorDepth those it issues,
// RetryCount its transport retries, RNRRetryCount its RNR retries.
func (k *Conn) Param() ConnParam { return k.param }

// Done is closed when the connection ends: the peer disconnected (its
// DREQ leaves the QP as it is, for this side's Disconnect to move it to
// ERR), or Disconnect was called.
func (k *Conn) Done() <-chan struct{} { return k.done }

// Err says why the connection ended (nil while it is up).
func (k *Conn) Err() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.err
}

func (k *Conn) isUp() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.up && !k.ending
}

func (k *Conn) setUp() {
	k.mu.Lock()
	k.up = true
	k.mu.Unlock()
}

func (k *Conn) end(err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.ending {
		return
	}
	k.ending = true
	k.err = err
	close(k.done)
}

// qpError moves the QP to ERR, as rdma_cm does before a DREQ or DREP and
// when a REJ ends a connection; its outstanding work completes flushed.
func (k *Conn) qpError() {
	if k.qp != nil {
		_ = k.qp.Modify(&verbs.QPAttr{State: verbs.StateErr}, qpstate.AttrState)
	}
}

// Disconnect moves the QP to ERR and sends a DREQ (rdma_disconnect). It
// returns when the DREP arrives, with ErrDisconnectTimeout when none comes
// after the CM retries, or ctx's error. Disconnecting a connection the peer
// already ended moves the QP to ERR (a DREQ leaves it up) and returns nil.
func (k *Conn) Disconnect(ctx context.Context) error {
	k.mu.Lock()
	if k.ending {
		k.mu.Unlock()
		k.qpError()
		return nil
	}
	k.ending = true
	k.err = ErrDisconnected
	close(k.done)
	k.mu.Unlock()
	k.qpError()
	e := k.cm.e
	if err := e.disconnect(k.cm.clock.Now(), k.c, nil); err != nil {
		return nil // the peer's DREQ or REJ got there first
	}
	e.dispatch()
	k.cm.kick()
	for {
		ev, err := waitEvent(ctx, k.ev, k.cm.done)
		if err != nil {
			return err
		}
		switch ev.typ {
		case evDrepReceived, evDreqReceived, evRejReceived:
			return nil
		case evDreqError:
			return fmt.Errorf("%w (peer %v)", ErrDisconnectTimeout, k.remote)
		}
	}
}

func waitEvent(ctx context.Context, ch chan event, closed chan struct{}) (event, error) {
	select {
	case ev := <-ch:
		return ev, nil
	case <-ctx.Done():
		return event{}, ctx.Err()
	case <-closed:
		return event{}, ErrClosed
	}
}

// qpSetup are the attributes a CM exchange gives a QP (ib_cm_init_qp_attr).
type qpSetup struct {
	remote         netip.Addr
	mtu            int
	destQPN        uint32
	rqPSN, sqPSN   uint32
	maxDestRD      uint8
	maxRD          uint8
	timeout        uint8
	retry, rnr     uint8
	remoteReadable bool
}

// toRTS moves qp through INIT (again, for the CM's access flags), RTR and
// RTS as rdma_cm does: remote write always, remote read and atomics when
// this side offers responder resources; RTR with the path MTU, the peer's
// QPN and PSN, max_dest_rd_atomic = responder resources and a
// min_rnr_timer of 0; RTS with the CM's ACK timeout, retry counts and
// max_rd_atomic = initiator depth.
func (c *CM) toRTS(qp *verbs.QP, s *qpSetup) error {
	access := verbs.AccessRemoteWrite
	if s.remoteReadable {
		access |= verbs.AccessRemoteRead | verbs.AccessRemoteAtomic
	}
	init := verbs.QPAttr{State: verbs.StateInit, PKeyIndex: 0, Port: 1, AccessFlags: uint32(access)}
	mask := qpstate.AttrState | qpstate.AttrAccessFlags
	if qp.State() == verbs.StateReset {
		mask |= qpstate.AttrPKeyIndex | qpstate.AttrPort
	}
	if err := qp.Modify(&init, mask); err != nil {
		return fmt.Errorf("cm: QP %d to INIT: %w", qp.Num(), err)
	}
	sgid, _, _ := c.source(s.remote)
	rtr := verbs.QPAttr{State: verbs.StateRTR, PathMTU: s.mtu, DestQPN: s.destQPN, RQPSN: s.rqPSN,
		MaxDestRDAtomic: min(s.maxDestRD, verbs.MaxQPRDAtom), MinRNRTimer: 0,
		AV: verbs.AddressVector{DGID: gid(s.remote), SGIDIndex: uint8(sgid), HopLimit: 64}}
	if err := qp.Modify(&rtr, qpstate.AttrState|qpstate.AttrAV|qpstate.AttrPathMTU|qpstate.AttrDestQPN|
		qpstate.AttrRQPSN|qpstate.AttrMaxDestRDAtomic|qpstate.AttrMinRNRTimer); err != nil {
		return fmt.Errorf("cm: QP %d to RTR: %w", qp.Num(), err)
	}
	rts := verbs.QPAttr{State: verbs.StateRTS, SQPSN: s.sqPSN, Timeout: s.timeout, RetryCnt: s.retry, RNRRetry: s.rnr,
		MaxRDAtomic: min(s.maxRD, verbs.MaxQPRDAtom)}
	if err := qp.Modify(&rts, qpstate.AttrState|qpstate.AttrSQPSN|qpstate.AttrTimeout|qpstate.AttrRetryCnt|
		qpstate.AttrRNRRetry|qpstate.AttrMaxQPRDAtomic); err != nil {
		return fmt.Errorf("cm: QP %d to RTS: %w", qp.Num(), err)
	}
	return nil
}

// Dial connects qp to the listener on port of port space ps at remote
// (rdma_resolve_addr, rdma_resolve_route and rdma_connect in one call).
// The address is resolved from the device's GID table (no ARP: the link
// does that); the REQ carries a cma_hdr and p's private data (at most
// MaxConnPrivateData bytes). qp must be an RC QP in RESET or INIT; it is in
// RTS when Dial returns, after the RTU is sent. A nil p means
// DefaultConnParam. Errors: *RejectError (errors.Is ErrNoListener for REJ
// 8, ErrRejected otherwise), ErrUnreachable after the CM retries, ctx's.
func (c *CM) Dial(ctx context.Context, remote netip.Addr, ps PortSpace, port uint16, qp *verbs.QP, p *ConnParam) (*Conn, error) {
	if c.isClosed() {
		return nil, ErrClosed
	}
	if p == nil {
		p = &DefaultConnParam
	}
	if len(p.PrivateData) > MaxConnPrivateData {
		return nil, fmt.Errorf("cm: dial: %d bytes of private data, at most %d fit after the cma_hdr", len(p.PrivateData), MaxConnPrivateData)
	}
	_, local, ok := c.source(remote)
	if !ok {
		return nil, fmt.Errorf("cm: dial %v: no route: device %s has no link-local GID", remote, c.dev.Name())
	}
	if local.Unmap().Is4() != remote.Unmap().Is4() {
		return nil, fmt.Errorf("cm: dial %v: no route: the CM's address %v is of the other IP family", remote, local)
	}
	if st := qp.State(); st != verbs.StateReset && st != verbs.StateInit {
		return nil, fmt.Errorf("cm: dial: QP %d is in %v, want RESET or INIT", qp.Num(), st)
	}
	if qp.State() == verbs.StateReset {
		a := verbs.QPAttr{State: verbs.StateInit, Port: 1}
		if err := qp.Modify(&a, qpstate.AttrState|qpstate.AttrPKeyIndex|qpstate.AttrPort|qpstate.AttrAccessFlags); err != nil {
			return nil, fmt.Errorf("cm: dial: QP %d to INIT: %w", qp.Num(), err)
		}
	}
	private := c.cmaPrivate(local, remote, p.SourcePort, p.PrivateData)
	k := c.newConn(qp, remote.Unmap())
	_, init := qp.Query()
	mtu := mtuCode(c.dev.QueryPort().ActiveMTU)
	ec, err := c.e.connect(c.clock.Now(), &reqParams{peer: c.peerOf(remote.Unmap()), serviceID: ServiceID(ps, port),
		qpn: qp.Num(), psn: rand.Uint32() & 0xFFFFFF, respRes: p.ResponderResources, initDepth: p.InitiatorDepth,
		retryCount: p.RetryCount, rnrRetry: p.RNRRetryCount, mtu: mtu, srq: init.SRQ != nil, flowControl: p.FlowControl,
		localGID: gid(local), remoteGID: gid(remote), hopLimit: 64, private: private, user: k})
	if err != nil {
		return nil, err
	}
	k.c = ec
	c.kick()
	for {
		ev, err := waitEvent(ctx, k.ev, c.done)
		if err != nil {
			c.e.destroy(c.clock.Now(), ec)
			return nil, fmt.Errorf("cm: dial %v port %d: %w", remote, port, err)
		}
		switch ev.typ {
		case evRepReceived:
			e := c.e
			e.mu.Lock()
			s := qpSetup{remote: k.remote, mtu: 128 << ec.pathMTU, destQPN: ec.remoteQPN, rqPSN: ec.rqPSN, sqPSN: ec.sqPSN,
				maxDestRD: ec.respRes, maxRD: ec.initDepth, timeout: ec.avTimeout, retry: ec.retryCount, rnr: ec.rnrRetry,
				remoteReadable: ec.respRes > 0}
			e.mu.Unlock()
			if err := c.toRTS(qp, &s); err != nil {
				c.e.reject(c.clock.Now(), ec, RejConsumerDefined, nil, nil)
				c.kick()
				return nil, fmt.Errorf("cm: dial %v: %w", remote, err)
			}
			k.privateData = ev.m.private
			k.param = ConnParam{ResponderResources: s.maxDestRD, InitiatorDepth: s.maxRD, RetryCount: s.retry,
				RNRRetryCount: s.rnr, FlowControl: ev.m.flowControl}
			k.setUp()
			if err := c.e.rtu(c.clock.Now(), ec, nil); err != nil {
				return nil, fmt.Errorf("cm: dial %v: %w", remote, err)
			}
			c.e.dispatch()
			c.kick()
			return k, nil
		case evRejReceived:
			// The QP was not touched yet: it stays in INIT, and a Dial
			// may be tried again with it (librdmacm leaves a user's QP
			// alone on a REJ too).
			rerr := &RejectError{Reason: ev.m.reason, PrivateData: ev.m.private}
			return nil, fmt.Errorf("cm: dial %v port %d: %w", remote, port, rerr)
		case evReqError:
			return nil, fmt.Errorf("cm: dial %v port %d: %w", remote, port, ErrUnreachable)
		}
	}
}

// ---- listening ----

// Listener receives the connection requests (REQ, or SIDR_REQ on
// PortSpaceUDP) for one port.
type Listener struct {
	cm   *CM
	ps   PortSpace
	port uint16
	l    *listener
	reqs chan *ConnRequest

	mu     sync.Mutex
	closed bool
	done   chan struct{}
}

// Listen listens on port of port space ps (rdma_bind_addr + rdma_listen).
func (c *CM) Listen(ps PortSpace, port uint16) (*Listener, error) {
	if c.isClosed() {
		return nil, ErrClosed
	}
	l := &Listener{cm: c, ps: ps, port: port, reqs: make(chan *ConnRequest, c.opts.Backlog), done: make(chan struct{})}
	el, err := c.e.listen(ServiceID(ps, port), l)
	if err != nil {
		return nil, fmt.Errorf("cm: listen on %v port %d: %w", ps, port, err)
	}
	l.l = el
	c.mu.Lock()
	c.listeners[l] = struct{}{}
	c.mu.Unlock()
	return l, nil
}

// Port is the port listened on.
func (l *Listener) Port() uint16 { return l.port }

// Close stops listening; requests not yet taken are rejected.
func (l *Listener) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	close(l.done)
	l.mu.Unlock()
	l.cm.e.unlisten(l.l)
	l.cm.mu.Lock()
	delete(l.cm.listeners, l)
	l.cm.mu.Unlock()
	for {
		select {
		case r := <-l.reqs:
			r.Reject(nil)
		default:
			return nil
		}
	}
}

// take turns a REQ or SIDR_REQ event into a ConnRequest.
func (l *Listener) take(ev *event) {
	e := l.cm.e
	m := &ev.m
	hdr, err := mad.ParseCMAHeader(m.private)
	if err != nil {
		// rdma_cm refuses a request it cannot read the addresses of.
		if ev.typ == evSIDRReqReceived {
			e.sidrReply(ev.c, SIDRReject, 0, 0, nil)
		} else {
			e.reject(l.cm.clock.Now(), ev.c, RejConsumerDefined, nil, nil)
		}
		return
	}
	r := &ConnRequest{l: l, ud: ev.typ == evSIDRReqReceived, Remote: hdr.SrcAddr(), RemotePort: hdr.Port(),
		Local: hdr.DstAddr(), PrivateData: m.private[mad.CMAHeaderLen:]}
	r.k = l.cm.newConn(nil, ev.c.peer.Addr.Addr().Unmap())
	r.k.c = ev.c
	ev.c.user = r.k
	if !r.ud {
		r.RemoteQPN = m.qpn
		r.Param = ConnParam{ResponderResources: m.initDepth, InitiatorDepth: m.respRes, FlowControl: m.flowControl,
			RetryCount: m.retryCount, RNRRetryCount: m.rnrRetry}
		r.mtu = m.mtu
	}
	l.mu.Lock()
	closed := l.closed
	l.mu.Unlock()
	if closed {
		e.destroy(l.cm.clock.Now(), ev.c)
		return
	}
	select {
	case l.reqs <- r:
	default:
		// Backlog full: forget it without an answer, so the peer's
		// retransmission finds room later.
		e.forget(ev.c)
	}
}

// Next waits for the next connection request (RDMA_CM_EVENT_CONNECT_REQUEST).
func (l *Listener) Next(ctx context.Context) (*ConnRequest, error) {
	select {
	case r := <-l.reqs:
		return r, nil
	case <-l.done:
		return nil, ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// ConnRequest is a connection request waiting for Accept or Reject.
type ConnRequest struct {
	l  *Listener
	k  *Conn
	ud bool

	// Remote and RemotePort are the requester's address and rdma_cm port
	// (from the cma_hdr); Local is the address it asked for.
	Remote     netip.Addr
	RemotePort uint16
	Local      netip.Addr
	// PrivateData is the requester's private data after the cma_hdr
	// (the rest of the message's area: 56 bytes for a REQ, 180 for UD).
	PrivateData []byte
	// RemoteQPN is the requester's QP; Param what it asked for, seen from
	// this side (ResponderResources is the peer's initiator depth).
	RemoteQPN uint32
	Param     ConnParam
	mtu       uint8
}

// UD says the request is a SIDR_REQ (PortSpaceUDP): answer it with AcceptUD.
func (r *ConnRequest) UD() bool { return r.ud }

// Accept connects qp (an RC QP in RESET or INIT) to the requester: the QP
// goes to RTS with the REQ's parameters, the REP carries p's private data,
// and Accept returns once the RTU arrives. A nil p answers with what the
// requester asked for. The initiator depth is capped by the requester's
// responder resources.
func (r *ConnRequest) Accept(ctx context.Context, qp *verbs.QP, p *ConnParam) (*Conn, error) {
	if r.ud {
		return nil, errors.New("cm: accept: a UD request is answered with AcceptUD")
	}
	c := r.l.cm
	k := r.k
	ec := k.c
	var pp ConnParam
	if p == nil {
		pp = ConnParam{ResponderResources: r.Param.ResponderResources, InitiatorDepth: r.Param.InitiatorDepth, RNRRetryCount: 7}
	} else {
		pp = *p
	}
	if len(pp.PrivateData) > MaxAcceptPrivateData {
		return nil, fmt.Errorf("cm: accept: %d bytes of private data, at most %d", len(pp.PrivateData), MaxAcceptPrivateData)
	}
	pp.InitiatorDepth = min(pp.InitiatorDepth, r.Param.InitiatorDepth)
	if st := qp.State(); st != verbs.StateReset && st != verbs.StateInit {
		return nil, fmt.Errorf("cm: accept: QP %d is in %v, want RESET or INIT", qp.Num(), st)
	}
	k.qp = qp
	psn := rand.Uint32() & 0xFFFFFF
	c.e.mu.Lock()
	dead := ec.dead
	s := qpSetup{remote: k.remote, mtu: min(128<<r.mtu, c.dev.QueryPort().ActiveMTU), destQPN: ec.remoteQPN, rqPSN: psn,
		sqPSN: ec.sqPSN, maxDestRD: pp.ResponderResources, maxRD: pp.InitiatorDepth, timeout: ec.avTimeout,
		retry: ec.retryCount, rnr: ec.rnrRetry, remoteReadable: pp.ResponderResources > 0}
	c.e.mu.Unlock()
	if dead {
		return nil, fmt.Errorf("cm: accept %v: %w", r.Remote, ErrExpired)
	}
	if err := c.toRTS(qp, &s); err != nil {
		c.e.reject(c.clock.Now(), ec, RejConsumerDefined, nil, nil)
		c.kick()
		return nil, fmt.Errorf("cm: accept %v: %w", r.Remote, err)
	}
	_, init := qp.Query()
	if err := c.e.accept(c.clock.Now(), ec, &repParams{qpn: qp.Num(), psn: psn, respRes: pp.ResponderResources,
		initDepth: pp.InitiatorDepth, rnrRetry: pp.RNRRetryCount, srq: init.SRQ != nil, flowControl: pp.FlowControl,
		private: pp.PrivateData}); err != nil {
		k.qpError()
		if errors.Is(err, errState) {
			return nil, fmt.Errorf("cm: accept %v: %w", r.Remote, ErrExpired)
		}
		return nil, fmt.Errorf("cm: accept %v: %w", r.Remote, err)
	}
	k.privateData = r.PrivateData
	k.param = ConnParam{ResponderResources: s.maxDestRD, InitiatorDepth: s.maxRD, RetryCount: s.retry, RNRRetryCount: s.rnr,
		FlowControl: pp.FlowControl}
	c.kick()
	// The first packet on the QP stands for a lost RTU (COMM_EST,
	// ib_cm_notify): the REP's retransmissions stop and Accept returns.
	est := qp.Established()
	for {
		var ev event
		var err error
		select {
		case <-est:
			est = nil
			if c.e.establish(ec) == nil {
				c.e.dispatch()
				c.kick()
			}
			continue
		default:
		}
		select {
		case ev = <-k.ev:
		case <-est:
			continue
		case <-ctx.Done():
			err = ctx.Err()
		case <-c.done:
			err = ErrClosed
		}
		if err != nil {
			c.e.destroy(c.clock.Now(), ec)
			k.qpError()
			return nil, fmt.Errorf("cm: accept %v: %w", r.Remote, err)
		}
		switch ev.typ {
		case evEstablished:
			k.setUp()
			return k, nil
		case evRejReceived:
			k.qpError()
			return nil, fmt.Errorf("cm: accept %v: %w", r.Remote, &RejectError{Reason: ev.m.reason, PrivateData: ev.m.private})
		case evRepError:
			k.qpError()
			return nil, fmt.Errorf("cm: accept %v: no RTU: %w", r.Remote, ErrUnreachable)
		case evDreqReceived:
			return nil, fmt.Errorf("cm: accept %v: %w", r.Remote, ErrDisconnected)
		}
	}
}

// Reject refuses the request with REJ reason 28 "consumer defined" and
// privateData (rdma_reject), or, for a UD request, a SIDR_REP "rejected".
func (r *ConnRequest) Reject(privateData []byte) error {
	c := r.l.cm
	var err error
	if r.ud {
		err = c.e.sidrReply(r.k.c, SIDRReject, 0, 0, privateData)
	} else {
		err = c.e.reject(c.clock.Now(), r.k.c, RejConsumerDefined, nil, privateData)
	}
	if errors.Is(err, errState) {
		return fmt.Errorf("cm: reject %v: %w", r.Remote, ErrExpired)
	}
	return err
}

// AcceptUD answers a UD request with the QPN and Q_Key of the UD QP that
// serves it (0 means UDPQKey) and privateData.
func (r *ConnRequest) AcceptUD(qpn, qkey uint32, privateData []byte) error {
	if !r.ud {
		return errors.New("cm: AcceptUD on an RC request")
	}
	if qkey == 0 {
		qkey = UDPQKey
	}
	err := r.l.cm.e.sidrReply(r.k.c, SIDRSuccess, qpn, qkey, privateData)
	if errors.Is(err, errState) {
		return fmt.Errorf("cm: accept %v: %w", r.Remote, ErrExpired)
	}
	return err
}

// UDRemote is what SIDR resolved: the remote UD QP and its Q_Key.
type UDRemote struct {
	Addr        netip.Addr
	QPN         uint32
	QKey        uint32
	PrivateData []byte
}

// ResolveUD asks the listener on port (PortSpaceUDP) at remote for its UD
// QP with a SIDR_REQ, privateData after the cma_hdr (at most
// MaxUDPrivateData bytes). Errors: ErrNoListener (SIDR status 1), a
// rejection, ErrUnreachable after the retries.
func (c *CM) ResolveUD(ctx context.Context, remote netip.Addr, port uint16, privateData []byte) (*UDRemote, error) {
	return c.ResolveUDFrom(ctx, 0, remote, port, privateData)
}

// ResolveUDFrom is ResolveUD whose cma_hdr names srcPort as the source
// port (0: an ephemeral one), as rdma_cm names its id's port.
func (c *CM) ResolveUDFrom(ctx context.Context, srcPort uint16, remote netip.Addr, port uint16, privateData []byte) (*UDRemote, error) {
	if c.isClosed() {
		return nil, ErrClosed
	}
	if len(privateData) > MaxUDPrivateData {
		return nil, fmt.Errorf("cm: resolve UD: %d bytes of private data, at most %d", len(privateData), MaxUDPrivateData)
	}
	_, local, ok := c.source(remote)
	if !ok {
		return nil, fmt.Errorf("cm: resolve UD %v: no route: device %s has no link-local GID", remote, c.dev.Name())
	}
	private := c.cmaPrivate(local, remote, srcPort, privateData)
	k := c.newConn(nil, remote.Unmap())
	ec, err := c.e.sidrRequest(c.clock.Now(), c.peerOf(remote.Unmap()), ServiceID(PortSpaceUDP, port), private, k)
	if err != nil {
		return nil, err
	}
	k.c = ec
	c.kick()
	for {
		ev, err := waitEvent(ctx, k.ev, c.done)
		if err != nil {
			c.e.destroy(c.clock.Now(), ec)
			return nil, fmt.Errorf("cm: resolve UD %v port %d: %w", remote, port, err)
		}
		switch ev.typ {
		case evSIDRRepReceived:
			switch ev.m.status {
			case SIDRSuccess:
				return &UDRemote{Addr: remote.Unmap(), QPN: ev.m.qpn, QKey: ev.m.qkey, PrivateData: ev.m.private}, nil
			case SIDRUnsupported:
				return nil, fmt.Errorf("cm: resolve UD %v port %d: %w", remote, port, ErrNoListener)
			default:
				return nil, fmt.Errorf("cm: resolve UD %v port %d: %w: SIDR_REP status %d (%s)", remote, port, ErrRejected,
					ev.m.status, mad.SIDRStatusName(ev.m.status))
			}
		case evSIDRReqError:
			return nil, fmt.Errorf("cm: resolve UD %v port %d: %w", remote, port, ErrUnreachable)
		}
	}
}
