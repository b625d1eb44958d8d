package cm

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"time"
)

// Peer is the far end of a CM exchange: the address a MAD came from (the
// GRH source, with the UDP port the datagram came from) and the QP that
// sent it. Replies always go to QP 1 of that address, as the kernel's CM
// sends them.
type Peer struct {
	Addr netip.AddrPort
	QPN  uint32
}

// String prints the peer as addr:port/qpn.
func (p Peer) String() string { return fmt.Sprintf("%v/qp%d", p.Addr, p.QPN) }

// Transport carries MADs. SendMAD sends one 256-byte MAD to QP 1 of to's
// address; it may keep nothing of mad after it returns. Incoming MADs are
// handed to the engine by whoever owns the transport (Engine.Receive, or
// the driver of Open).
type Transport interface {
	SendMAD(to Peer, mad []byte) error
}

// MADSize is the size of every CM MAD.
const MADSize = 256

// cmState is the IB CM state of one communication (IBTA vol. 1 §12.9, the
// states the kernel's ib_cm_state names).
type cmState uint8

// CM states.
const (
	stIdle cmState = iota
	stReqSent
	stReqRcvd
	stMRAReqSent
	stMRAReqRcvd
	stRepSent
	stRepRcvd
	stMRARepSent
	stMRARepRcvd
	stEstablished
	stDreqSent
	stDreqRcvd
	stTimewait
	stSIDRReqSent
	stSIDRReqRcvd
)

var stateNames = [...]string{"IDLE", "REQ_SENT", "REQ_RCVD", "MRA_REQ_SENT", "MRA_REQ_RCVD", "REP_SENT",
	"REP_RCVD", "MRA_REP_SENT", "MRA_REP_RCVD", "ESTABLISHED", "DREQ_SENT", "DREQ_RCVD", "TIMEWAIT",
	"SIDR_REQ_SENT", "SIDR_REQ_RCVD"}

func (s cmState) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("State(%d)", s)
}

// halfOpen says whether a passive communication in state s holds a
// half-open slot: a REQ (or SIDR_REQ) was taken in and no RTU has closed it.
func (s cmState) halfOpen() bool {
	switch s {
	case stReqRcvd, stMRAReqSent, stRepSent, stMRARepRcvd, stSIDRReqRcvd:
		return true
	}
	return false
}

// Config tunes an engine; zero fields take the defaults rdma_cm uses.
type Config struct {
	// GUID is the local CA GUID written in REQ and REP (node GUID).
	GUID uint64
	// MaxHalfOpen caps the passive communications that have received a REQ
	// (or SIDR_REQ) and are not established yet (default 1024). When the
	// table is full, a new REQ takes the place of the oldest request that
	// nobody accepted and whose sender never retransmitted it although its
	// own timer should have made it do so twice (a forged one); if there is
	// none, the REQ is counted and dropped, and the peer retries it.
	MaxHalfOpen int
	// AcceptTimeout is how long a received REQ waits for Accept or Reject
	// before it is rejected (REJ consumer defined) and forgotten (default
	// 4.096 s x 2^(24-8): the service time the delayed MRA promises).
	AcceptTimeout time.Duration
	// ResponseTimeout is the CM response timeout exponent sent in REQs
	// (4.096 us x 2^t; default 20, about 4 s) and MaxRetries the CM retries
	// (default 15), as rdma_cm sets them.
	ResponseTimeout uint8
	MaxRetries      uint8
	// PacketLifeTime is the path's packet lifetime exponent (default 16,
	// what rdma_cm assumes on RoCE) and AckDelay the local CA ACK delay
	// exponent reported in REPs (default 15, rxe's).
	PacketLifeTime uint8
	AckDelay       uint8
	// MRAServiceTimeout is the service timeout an MRA announces when a
	// duplicate REQ arrives before the application accepted (default 24).
	MRAServiceTimeout uint8
	// SIDRTimeout is the SIDR_REQ retransmission timeout (default 4096 ms),
	// with MaxRetries retries.
	SIDRTimeout time.Duration
	// Seed seeds the generator of comm IDs, transaction IDs and PSNs; 0
	// draws a random seed.
	Seed uint64
}

func (c *Config) fill() {
	def8 := func(v *uint8, d uint8) {
		if *v == 0 {
			*v = d
		}
	}
	if c.MaxHalfOpen <= 0 {
		c.MaxHalfOpen = 1024
	}
	def8(&c.ResponseTimeout, 20)
	def8(&c.MaxRetries, 15)
	def8(&c.PacketLifeTime, 16)
	def8(&c.AckDelay, 15)
	def8(&c.MRAServiceTimeout, 24)
	if c.AcceptTimeout <= 0 {
		c.AcceptTimeout = cmTime(c.MRAServiceTimeout)
	}
	if c.SIDRTimeout <= 0 {
		c.SIDRTimeout = 4096 * time.Millisecond
	}
	if c.ResponseTimeout > 31 {
		c.ResponseTimeout = 31
	}
	if c.MaxRetries > 15 {
		c.MaxRetries = 15
	}
}

// cmTime converts an IBA time exponent (4.096 us x 2^t) to a duration the
// way the kernel's CM does: 2^(t-8) ms, at least 1 ms.
func cmTime(t uint8) time.Duration {
	s := int(t&31) - 8
	if s < 0 {
		s = 0
	}
	return time.Duration(1<<s) * time.Millisecond
}

// ackTimeout is the QP local ACK timeout for a path: 4.096 us x 2^t must
// cover the peer's ACK delay and twice the packet lifetime. Like the
// kernel it takes the larger exponent and adds one only when the other is
// within a factor of two.
func ackTimeout(caAckDelay, packetLifeTime uint8) uint8 {
	t := int(packetLifeTime) + 1
	d := int(caAckDelay)
	if t >= d {
		if d >= t-1 {
			t++
		}
	} else {
		t = d
		if int(packetLifeTime)+1 >= d-1 {
			t++
		}
	}
	return uint8(min(31, t))
}

// Stats counts what the engine received, sent and refused. Every MAD is
// counted once in Received and then, if it was not acted on, in exactly one
// of the reasons.
type Stats struct {
	Received, Sent, Retransmitted uint64
	// Malformed MADs failed to parse (bad header, class, version, method
	// or field values); UnknownAttr carried an attribute the CM does not
	// handle (LAP and APR included: RoCE has no alternate paths).
	Malformed, UnknownAttr uint64
	// Unmatched named no communication of this engine (REP, RTU, DREQ,
	// DREP, REJ, MRA, SIDR_REP for unknown comm IDs); Duplicates were
	// retransmissions of a message already handled; Ignored arrived in a
	// state that takes no such message.
	Unmatched, Duplicates, Ignored uint64
	// HalfOpenEvicted unaccepted, never retransmitted requests gave their
	// place to a new REQ; HalfOpenDropped REQs found the half-open table
	// full of requests that could not be evicted; RejectedNoListener
	// drew REJ "invalid service ID" (or SIDR_REP unsupported);
	// RejectedStale drew REJ "stale connection"; RejectedOther any other
	// REJ the engine sent on its own.
	HalfOpenEvicted, HalfOpenDropped, RejectedNoListener, RejectedStale, RejectedOther uint64
	// Timeouts are exchanges abandoned after the last retry, or REQs
	// nobody accepted in time.
	Timeouts uint64
	// SendErrors are MADs the transport refused.
	SendErrors uint64
	// Unsupported were Get or Set MADs of a class (or a CM attribute)
	// nothing on this QP1 serves, answered with GetResp status 0x000C as
	// the kernel's MAD layer answers them.
	Unsupported uint64
	// Conns and HalfOpen are the current communications and how many of
	// them are half-open.
	Conns, HalfOpen int
}

// eventType is what happened to a communication.
type eventType uint8

const (
	evReqReceived eventType = iota + 1
	evRepReceived
	evEstablished
	evReqError // REQ retries exhausted
	evRepError // REP retries exhausted
	evRejReceived
	evDreqReceived
	evDrepReceived
	evDreqError
	evTimewaitExit
	evAcceptTimeout
	evSIDRReqReceived
	evSIDRRepReceived
	evSIDRReqError
)

var eventNames = [...]string{"", "REQ_RECEIVED", "REP_RECEIVED", "ESTABLISHED", "REQ_ERROR", "REP_ERROR",
	"REJ_RECEIVED", "DREQ_RECEIVED", "DREP_RECEIVED", "DREQ_ERROR", "TIMEWAIT_EXIT", "ACCEPT_TIMEOUT",
	"SIDR_REQ_RECEIVED", "SIDR_REP_RECEIVED", "SIDR_REQ_ERROR"}

func (t eventType) String() string {
	if int(t) < len(eventNames) {
		return eventNames[t]
	}
	return fmt.Sprintf("event(%d)", t)
}

// event is delivered to the engine's handler outside the engine lock. m is
// a copy of the message that caused it (private data copied).
type event struct {
	typ eventType
	c   *conn
	l   *listener
	m   msg
}

// retx is the one message a communication may have outstanding, with its
// retransmission timer (the kernel's MAD send with timeout and retries).
type retx struct {
	on       bool
	buf      [MADSize]byte
	deadline time.Time
	timeout  time.Duration
	left     int
}

// conn is one communication (the kernel's cm_id_private).
type conn struct {
	e       *engine
	state   cmState
	passive bool
	dead    bool

	localID, remoteID uint32
	tid               uint64
	peer              Peer
	serviceID         uint64
	remoteGUID        uint64

	localQPN, remoteQPN uint32
	sqPSN, rqPSN        uint32
	pathMTU             uint8
	respRes, initDepth  uint8
	retryCount          uint8
	rnrRetry            uint8
	avTimeout           uint8 // the QP's local ACK timeout exponent
	targetAckDelay      uint8
	timeout             time.Duration // the response timeout of this side's requests
	maxRetries          int
	serviceTimeout      uint8

	// A passive request: when it came, whether its sender retransmitted
	// it, and how old it may grow without that before it can be evicted.
	born     time.Time
	dupSeen  bool
	evictAge time.Duration

	// saved for answering duplicates: the RTU/DREP/MRA private data.
	private []byte

	rt       retx
	waitAt   time.Time // timewait exit, or the accept deadline of a REQ/SIDR_REQ
	inRemote bool      // in remoteIDs / remoteQPs
	inSIDR   bool

	// user is the rdma_cm object this communication belongs to.
	user any
}

type remoteKey struct {
	id   uint32
	guid uint64
}

type sidrKey struct {
	id   uint32
	addr netip.Addr
}

// listener is a service ID someone listens on.
type listener struct {
	serviceID uint64
	user      any
}

// engine is the IB CM of one port: no I/O of its own beyond Transport.SendMAD
// and no clock; time comes in with every call.
type engine struct {
	mu  sync.Mutex
	cfg Config
	tx  Transport
	rnd *rand.Rand

	hiTID     uint32
	ids       map[uint32]*conn
	remoteIDs map[remoteKey]*conn
	remoteQPs map[remoteKey]*conn
	sidr      map[sidrKey]*conn
	listeners map[uint64]*listener
	timed     map[*conn]struct{}
	halfOpen  int
	halfQ     []*conn // passive requests, oldest first, for eviction
	stats     Stats

	scratch [MADSize]byte
	in      msg

	events     []event
	dispatchMu sync.Mutex
	handler    func(*event)
}

func newEngine(cfg Config, tx Transport, handler func(*event)) *engine {
	cfg.fill()
	seed := cfg.Seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	e := &engine{cfg: cfg, tx: tx, handler: handler,
		rnd:       rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		ids:       make(map[uint32]*conn),
		remoteIDs: make(map[remoteKey]*conn),
		remoteQPs: make(map[remoteKey]*conn),
		sidr:      make(map[sidrKey]*conn),
		listeners: make(map[uint64]*listener),
		timed:     make(map[*conn]struct{}),
	}
	e.hiTID = e.rnd.Uint32()
	return e
}

// Errors of the engine's calls.
var (
	errState   = errors.New("cm: not allowed in the communication's current state")
	errInUse   = errors.New("cm: service ID already has a listener")
	errPrivate = errors.New("cm: private data too long")
)

// ---- dispatch ----

func (e *engine) post(ev event) {
	if e.handler != nil {
		e.events = append(e.events, ev)
	}
}

// dispatch delivers queued events, one at a time and without the engine
// lock, so handlers may call back into the engine. Only one goroutine
// dispatches at a time; one that finds dispatching under way leaves its
// events to it.
func (e *engine) dispatch() {
	for {
		if !e.dispatchMu.TryLock() {
			return
		}
		for {
			e.mu.Lock()
			if len(e.events) == 0 {
				e.events = e.events[:0]
				e.mu.Unlock()
				break
			}
			ev := e.events[0]
			e.events[0] = event{}
			e.events = e.events[1:]
			e.mu.Unlock()
			e.handler(&ev)
		}
		e.dispatchMu.Unlock()
		// An event queued between the last check and the unlock would
		// otherwise wait for the next call.
		e.mu.Lock()
		n := len(e.events)
		e.mu.Unlock()
		if n == 0 {
			return
		}
	}
}

// ---- tables and timers ----

func (e *engine) newID() uint32 {
	for {
		id := e.rnd.Uint32()
		if _, used := e.ids[id]; id != 0 && !used {
			return id
		}
	}
}

func (e *engine) formTID(c *conn) uint64 { return uint64(e.hiTID)<<32 | uint64(c.localID) }

func (e *engine) newConn(passive bool) *conn {
	c := &conn{e: e, passive: passive, localID: e.newID()}
	e.ids[c.localID] = c
	e.stats.Conns++
	return c
}

// acquire finds the communication whose local comm ID is local and whose
// remote comm ID is remote (0 before the peer's is known).
func (e *engine) acquire(local, remote uint32) *conn {
	c := e.ids[local]
	if c == nil || c.remoteID != remote {
		return nil
	}
	return c
}

func (e *engine) setState(c *conn, s cmState) {
	if c.passive {
		was, is := c.state.halfOpen(), s.halfOpen()
		if was && !is {
			e.halfOpen--
		} else if is && !was {
			e.halfOpen++
		}
	}
	c.state = s
}

func (e *engine) touchTimer(c *conn) {
	if c.rt.on || !c.waitAt.IsZero() {
		e.timed[c] = struct{}{}
	} else {
		delete(e.timed, c)
	}
}

func (e *engine) cancel(c *conn) {
	c.rt.on = false
	e.touchTimer(c)
}

func (e *engine) removeRemote(c *conn) {
	if !c.inRemote {
		return
	}
	k := remoteKey{c.remoteID, c.remoteGUID}
	if e.remoteIDs[k] == c {
		delete(e.remoteIDs, k)
	}
	q := remoteKey{c.remoteQPN, c.remoteGUID}
	if e.remoteQPs[q] == c {
		delete(e.remoteQPs, q)
	}
	c.inRemote = false
}

// free forgets a communication (reset to idle and destroyed).
func (e *engine) free(c *conn) {
	if c.dead {
		return
	}
	e.setState(c, stIdle)
	e.removeRemote(c)
	if c.inSIDR {
		delete(e.sidr, sidrKey{c.remoteID, c.peer.Addr.Addr()})
		c.inSIDR = false
	}
	if e.ids[c.localID] == c {
		delete(e.ids, c.localID)
	}
	c.rt.on = false
	c.waitAt = time.Time{}
	delete(e.timed, c)
	c.dead = true
	c.private = nil
	e.stats.Conns--
}

func (e *engine) enterTimewait(now time.Time, c *conn) {
	e.removeRemote(c)
	e.setState(c, stTimewait)
	c.rt.on = false
	c.waitAt = now.Add(cmTime(c.avTimeout))
	e.touchTimer(c)
}

// ---- sending ----

func (e *engine) send(to Peer, b []byte) {
	to.QPN = 1
	if err := e.tx.SendMAD(to, b); err != nil {
		e.stats.SendErrors++
		return
	}
	e.stats.Sent++
}

// sendMsg encodes m and sends it once.
func (e *engine) sendMsg(to Peer, m *msg) {
	b := e.scratch[:]
	encode(b, m)
	e.send(to, b)
}

// sendRetx encodes m as c's outstanding message and sends it; it is sent
// again every timeout until retries run out or the answer cancels it.
func (e *engine) sendRetx(now time.Time, c *conn, m *msg, timeout time.Duration, retries int) {
	encode(c.rt.buf[:], m)
	c.rt.on = true
	c.rt.timeout = timeout
	c.rt.left = retries
	c.rt.deadline = now.Add(timeout)
	e.touchTimer(c)
	e.send(c.peer, c.rt.buf[:])
}

func copyPrivate(p []byte) []byte {
	if len(p) == 0 {
		return nil
	}
	return append([]byte(nil), p...)
}

// ---- the public face of the engine (used by the rdma_cm layer) ----

// Receive hands the engine one MAD received from from.
func (e *engine) Receive(now time.Time, from Peer, mad []byte) {
	e.mu.Lock()
	e.receive(now, from, mad)
	e.mu.Unlock()
	e.dispatch()
}

// Tick runs the timers due at now.
func (e *engine) Tick(now time.Time) {
	e.mu.Lock()
	for c := range e.timed {
		e.fire(now, c)
	}
	if e.halfOpen == 0 {
		e.halfQ = nil
	}
	e.mu.Unlock()
	e.dispatch()
}

// NextDeadline is the earliest timer, zero if none.
func (e *engine) NextDeadline() time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	var d time.Time
	earliest := func(t time.Time) {
		if !t.IsZero() && (d.IsZero() || t.Before(d)) {
			d = t
		}
	}
	for c := range e.timed {
		if c.rt.on {
			earliest(c.rt.deadline)
		}
		earliest(c.waitAt)
	}
	return d
}

// Stats returns a snapshot of the counters.
func (e *engine) Stats() Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.stats
	s.HalfOpen = e.halfOpen
	return s
}

func (e *engine) listen(serviceID uint64, user any) (*listener, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.listeners[serviceID]; ok {
		return nil, fmt.Errorf("%w: 0x%016x", errInUse, serviceID)
	}
	l := &listener{serviceID: serviceID, user: user}
	e.listeners[serviceID] = l
	return l, nil
}

func (e *engine) unlisten(l *listener) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.listeners[l.serviceID] == l {
		delete(e.listeners, l.serviceID)
	}
}

// reqParams are what an active side puts in its REQ.
type reqParams struct {
	peer                 Peer
	serviceID            uint64
	qpn, psn             uint32
	respRes, initDepth   uint8
	retryCount, rnrRetry uint8
	mtu                  uint8
	srq                  bool
	flowControl          bool
	localGID, remoteGID  [16]byte
	hopLimit             uint8
	trafficClass         uint8
	flowLabel            uint32
	private              []byte
	user                 any
}

// connect sends a REQ (ib_send_cm_req).
func (e *engine) connect(now time.Time, p *reqParams) (*conn, error) {
	if len(p.private) > reqPrivate {
		return nil, errPrivate
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	c := e.newConn(false)
	c.user = p.user
	c.peer = p.peer
	c.serviceID = p.serviceID
	c.localQPN = p.qpn & 0xFFFFFF
	c.rqPSN = p.psn & 0xFFFFFF
	c.respRes, c.initDepth = p.respRes, p.initDepth
	c.retryCount = min(p.retryCount, 7)
	c.pathMTU = p.mtu
	c.avTimeout = e.cfg.PacketLifeTime + 1
	c.timeout = 2*cmTime(e.cfg.PacketLifeTime) + cmTime(e.cfg.ResponseTimeout)
	c.maxRetries = int(e.cfg.MaxRetries)
	c.tid = e.formTID(c)
	m := msg{attr: attrREQ, tid: c.tid, localID: c.localID, serviceID: p.serviceID, caGUID: e.cfg.GUID,
		qpn: c.localQPN, respRes: p.respRes, initDepth: p.initDepth, remoteCMTimeout: e.cfg.ResponseTimeout,
		transport: transportRC, psn: c.rqPSN, localCMTimeout: e.cfg.ResponseTimeout, retryCount: c.retryCount,
		pkey: 0xFFFF, mtu: p.mtu, rnrRetry: min(p.rnrRetry, 7), maxCMRetries: e.cfg.MaxRetries, srq: p.srq,
		localGID: p.localGID, remoteGID: p.remoteGID, flowLabel: p.flowLabel, trafficClass: p.trafficClass,
		hopLimit: p.hopLimit, localAckTimeout: ackTimeout(e.cfg.AckDelay, e.cfg.PacketLifeTime),
		private: p.private}
	m.flowControl = p.flowControl
	e.setState(c, stReqSent)
	e.sendRetx(now, c, &m, c.timeout, c.maxRetries)
	return c, nil
}

// repParams are what a passive side puts in its REP.
type repParams struct {
	qpn, psn           uint32
	respRes, initDepth uint8
	rnrRetry           uint8
	srq, flowControl   bool
	private            []byte
}

// accept sends the REP answering c's REQ (ib_send_cm_rep).
func (e *engine) accept(now time.Time, c *conn, p *repParams) error {
	if len(p.private) > repPrivate {
		return errPrivate
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if c.dead || (c.state != stReqRcvd && c.state != stMRAReqSent) {
		return fmt.Errorf("%w (accept in %v)", errState, c.state)
	}
	c.localQPN = p.qpn & 0xFFFFFF
	c.rqPSN = p.psn & 0xFFFFFF
	c.respRes, c.initDepth = p.respRes, p.initDepth
	m := msg{attr: attrREP, tid: c.tid, localID: c.localID, remoteID: c.remoteID, qpn: c.localQPN, psn: c.rqPSN,
		respRes: p.respRes, initDepth: p.initDepth, targetAckDelay: e.cfg.AckDelay, rnrRetry: min(p.rnrRetry, 7),
		srq: p.srq, caGUID: e.cfg.GUID, private: p.private}
	m.flowControl = p.flowControl
	c.waitAt = time.Time{}
	e.setState(c, stRepSent)
	e.sendRetx(now, c, &m, c.timeout, c.maxRetries)
	return nil
}

// rtu sends the RTU after a REP (ib_send_cm_rtu).
func (e *engine) rtu(now time.Time, c *conn, private []byte) error {
	if len(private) > rtuPrivate {
		return errPrivate
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if c.dead || (c.state != stRepRcvd && c.state != stMRARepSent) {
		return fmt.Errorf("%w (RTU in %v)", errState, c.state)
	}
	c.private = copyPrivate(private)
	e.setState(c, stEstablished)
	e.sendMsg(c.peer, &msg{attr: attrRTU, tid: c.tid, localID: c.localID, remoteID: c.remoteID, private: private})
	return nil
}

// establish is the passive side learning from its QP that the connection
// works (ib_cm_notify with COMM_EST): the first packet arrived before the RTU.
func (e *engine) establish(c *conn) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if c.dead {
		return errState
	}
	switch c.state {
	case stRepSent, stMRARepRcvd:
		e.setState(c, stEstablished)
		e.cancel(c)
		e.post(event{typ: evEstablished, c: c})
		return nil
	case stEstablished:
		return nil
	}
	return fmt.Errorf("%w (establish in %v)", errState, c.state)
}

// reject sends a REJ (ib_send_cm_rej) from any state before ESTABLISHED.
func (e *engine) reject(now time.Time, c *conn, reason uint16, ari, private []byte) error {
	if len(private) > rejPrivate || len(ari) > 72 {
		return errPrivate
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if c.dead {
		return errState
	}
	switch c.state {
	case stReqSent, stMRAReqRcvd, stReqRcvd, stMRAReqSent, stRepRcvd, stMRARepSent:
		e.sendMsg(c.peer, e.formatRej(c, reason, ari, private))
		e.free(c)
	case stRepSent, stMRARepRcvd:
		e.sendMsg(c.peer, e.formatRej(c, reason, ari, private))
		e.enterTimewait(now, c)
	default:
		return fmt.Errorf("%w (reject in %v)", errState, c.state)
	}
	return nil
}

func (e *engine) formatRej(c *conn, reason uint16, ari, private []byte) *msg {
	m := &msg{attr: attrREJ, tid: c.tid, localID: c.localID, remoteID: c.remoteID, reason: reason, ari: ari, private: private}
	switch c.state {
	case stReqRcvd:
		m.localID = 0
		m.msgRejected = msgRespREQ
	case stMRAReqSent:
		m.msgRejected = msgRespREQ
	case stRepRcvd, stMRARepSent:
		m.msgRejected = msgRespREP
	default:
		m.msgRejected = msgRespOther
	}
	return m
}

// disconnect sends a DREQ from ESTABLISHED, or the DREP that answers a
// received DREQ (ib_send_cm_dreq / ib_send_cm_drep).
func (e *engine) disconnect(now time.Time, c *conn, private []byte) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if c.dead {
		return errState
	}
	switch c.state {
	case stEstablished:
		if len(private) > dreqPrivate {
			return errPrivate
		}
		m := msg{attr: attrDREQ, tid: e.formTID(c), localID: c.localID, remoteID: c.remoteID, qpn: c.remoteQPN, private: private}
		e.setState(c, stDreqSent)
		e.sendRetx(now, c, &m, c.timeout, c.maxRetries)
	case stDreqRcvd:
		if len(private) > drepPrivate {
			return errPrivate
		}
		c.private = copyPrivate(private)
		e.enterTimewait(now, c)
		e.sendMsg(c.peer, &msg{attr: attrDREP, tid: c.tid, localID: c.localID, remoteID: c.remoteID, private: private})
	case stDreqSent, stTimewait:
		return nil
	default:
		return fmt.Errorf("%w (disconnect in %v)", errState, c.state)
	}
	return nil
}

// destroy ends a communication from any state the way ib_destroy_cm_id
// does: a REJ before establishment, a DREQ when established, a DREP when
// one is owed.
func (e *engine) destroy(now time.Time, c *conn) {
	e.mu.Lock()
	if c.dead {
		e.mu.Unlock()
		return
	}
	switch c.state {
	case stReqSent, stMRAReqRcvd:
		e.sendMsg(c.peer, e.formatRej(c, RejTimeout, guidBytes(e.cfg.GUID), nil))
	case stReqRcvd, stMRAReqSent, stRepSent, stMRARepRcvd, stRepRcvd, stMRARepSent:
		e.sendMsg(c.peer, e.formatRej(c, RejConsumerDefined, nil, nil))
	case stEstablished:
		e.sendMsg(c.peer, &msg{attr: attrDREQ, tid: e.formTID(c), localID: c.localID, remoteID: c.remoteID, qpn: c.remoteQPN})
	case stDreqRcvd:
		e.sendMsg(c.peer, &msg{attr: attrDREP, tid: c.tid, localID: c.localID, remoteID: c.remoteID})
	case stSIDRReqRcvd:
		e.sendMsg(c.peer, &msg{attr: attrSIDRRep, tid: c.tid, localID: c.remoteID, status: SIDRReject, serviceID: c.serviceID})
	}
	e.free(c)
	e.mu.Unlock()
}

func guidBytes(g uint64) []byte {
	b := make([]byte, 8)
	for i := range 8 {
		b[i] = byte(g >> (56 - 8*i))
	}
	return b
}

// sidrRequest sends a SIDR_REQ (ib_send_cm_sidr_req).
func (e *engine) sidrRequest(now time.Time, peer Peer, serviceID uint64, private []byte, user any) (*conn, error) {
	if len(private) > sidrReqPrivate {
		return nil, errPrivate
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	c := e.newConn(false)
	c.user = user
	c.peer = peer
	c.serviceID = serviceID
	c.tid = e.formTID(c)
	e.setState(c, stSIDRReqSent)
	m := msg{attr: attrSIDRReq, tid: c.tid, localID: c.localID, pkey: 0xFFFF, serviceID: serviceID, private: private}
	e.sendRetx(now, c, &m, e.cfg.SIDRTimeout, int(e.cfg.MaxRetries))
	return c, nil
}

// sidrReply answers a SIDR_REQ (ib_send_cm_sidr_rep) and forgets it.
func (e *engine) sidrReply(c *conn, status uint8, qpn, qkey uint32, private []byte) error {
	if len(private) > sidrRepPrivate {
		return errPrivate
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if c.dead || c.state != stSIDRReqRcvd {
		return errState
	}
	e.sendMsg(c.peer, &msg{attr: attrSIDRRep, tid: c.tid, localID: c.remoteID, status: status, qpn: qpn & 0xFFFFFF,
		serviceID: c.serviceID, qkey: qkey, private: private})
	e.free(c)
	return nil
}

// ---- timers ----

func (e *engine) fire(now time.Time, c *conn) {
	if c.rt.on && !now.Before(c.rt.deadline) {
		if c.rt.left > 0 {
			c.rt.left--
			c.rt.deadline = now.Add(c.rt.timeout)
			e.stats.Retransmitted++
			e.send(c.peer, c.rt.buf[:])
		} else {
			c.rt.on = false
			e.stats.Timeouts++
			switch c.state {
			case stReqSent, stMRAReqRcvd:
				e.free(c)
				e.post(event{typ: evReqError, c: c})
			case stRepSent, stMRARepRcvd:
				e.free(c)
				e.post(event{typ: evRepError, c: c})
			case stDreqSent:
				e.enterTimewait(now, c)
				e.post(event{typ: evDreqError, c: c})
			case stSIDRReqSent:
				e.free(c)
				e.post(event{typ: evSIDRReqError, c: c})
			}
		}
	}
	if !c.dead && !c.waitAt.IsZero() && !now.Before(c.waitAt) {
		c.waitAt = time.Time{}
		switch c.state {
		case stTimewait:
			e.free(c)
			e.post(event{typ: evTimewaitExit, c: c})
		case stReqRcvd, stMRAReqSent:
			e.stats.Timeouts++
			e.sendMsg(c.peer, e.formatRej(c, RejConsumerDefined, nil, nil))
			e.free(c)
			e.post(event{typ: evAcceptTimeout, c: c})
		case stSIDRReqRcvd:
			e.stats.Timeouts++
			e.sendMsg(c.peer, &msg{attr: attrSIDRRep, tid: c.tid, localID: c.remoteID, status: SIDRReject, serviceID: c.serviceID})
			e.free(c)
			e.post(event{typ: evAcceptTimeout, c: c})
		}
	}
	if !c.dead {
		e.touchTimer(c)
	}
}

// forget drops a communication without answering the peer, whose
// retransmission will find it gone (the kernel does this when it cannot
// take a REQ in).
func (e *engine) forget(c *conn) {
	e.mu.Lock()
	e.free(c)
	e.mu.Unlock()
}

// evictable says whether a passive request may give its place to a new
// one: nobody accepted it and its sender never retransmitted it.
func (c *conn) evictable() bool { return !c.dead && c.state == stMRAReqSent && !c.dupSeen }

// queueHalfOpen records a new passive request in arrival order. The queue
// is compacted whenever it holds more than twice the live half-open
// entries, so it never keeps freed communications alive for long.
func (e *engine) queueHalfOpen(c *conn) {
	e.halfQ = append(e.halfQ, c)
	if len(e.halfQ) > 2*e.halfOpen+64 {
		q := make([]*conn, 0, 2*e.halfOpen+64)
		for _, x := range e.halfQ {
			if x.evictable() {
				q = append(q, x)
			}
		}
		e.halfQ = q
	}
}

// evictHalfOpen frees the oldest passive request that nobody accepted and
// whose sender never retransmitted it within twice its own REQ timeout: a
// live requester would have, so it is most likely forged. It reports
// whether it made room.
func (e *engine) evictHalfOpen(now time.Time) bool {
	for len(e.halfQ) > 0 {
		c := e.halfQ[0]
		if c.evictable() && now.Sub(c.born) < c.evictAge {
			return false
		}
		e.halfQ[0] = nil
		e.halfQ = e.halfQ[1:]
		if c.evictable() {
			e.stats.HalfOpenEvicted++
			e.free(c)
			e.post(event{typ: evAcceptTimeout, c: c})
			return true
		}
	}
	return false
}
