package serve

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/cm"
	"github.com/softroce/softroce/qpstate"
	"github.com/softroce/softroce/verbs"
)

// Connection management for librdmacm.so.1: an event channel is one
// client connection that began with CM_OPEN; its cm_ids live here and
// their connections are made by the device's cm.CM (the IB CM over QP1).
// The QPs are the process's own, created through libibverbs on another
// connection of the same process: a cm_id takes one by its QP number and
// the QP's token (which only CREATE_QP's answer carries), and only a QP of
// the same uid (SO_PEERCRED) on the id's device. A pid would not do: a
// connection keeps its pid after its process exits, and another user's
// program may get that pid.

const (
	maxCMEvents = 4096
	// disconnectWait bounds the DREQ a destroyed or dead client's
	// connection sends (the CM's own retries end earlier).
	disconnectWait = time.Minute
	// acceptWaitMS bounds how long ACCEPT waits for the QP to reach RTS.
	acceptWaitMS = 2000
)

// cmDev is a device's CM. The daemon opens it when it starts serving
// (Server.startCMs), so that QP1 is there and answers whether or not a
// program uses rdma_cm, as the kernel's ib_cm does on a host with an RNIC:
// a REQ for a port nobody listens on draws REJ 8 at once, not silence
// until the peer's REQ retries run out. If QP1 cannot be taken then
// (another owner holds it), that is logged and every later use by rdma_cm
// tries again: the program's call fails with the error until it can.
type cmDev struct {
	mu     sync.Mutex
	c      *cm.CM
	closed bool
	err    error // the last open's failure, until an open succeeds
}

// cmOpen returns the device's CM, opening it if it is not open yet.
func (d *device) cmOpen() (*cm.CM, error) {
	x := &d.cm
	x.mu.Lock()
	defer x.mu.Unlock()
	switch {
	case x.closed:
		return nil, cm.ErrClosed
	case x.c != nil:
		return x.c, nil
	}
	c, err := cm.Open(d.v, nil)
	if err != nil {
		// Logged once per run of failures, not once per program's call.
		if x.err == nil {
			d.s.log.Printf("%s: the connection manager cannot take QP1: %v; rdma_cm calls on %s fail until it can, and peers' CM requests go unanswered", d.name, err, d.name)
		}
		x.err = err
		return nil, err
	}
	if x.err != nil {
		d.s.log.Printf("%s: the connection manager now has QP1", d.name)
	}
	x.c, x.err = c, nil
	return c, nil
}

// startCMs opens every device's CM when the daemon starts serving; a
// device whose QP1 is taken is logged and retried on rdma_cm's first use.
func (s *Server) startCMs() {
	for _, d := range s.devs {
		d.cmOpen()
	}
}

func (d *device) cmClose() {
	d.cm.mu.Lock()
	defer d.cm.mu.Unlock()
	if d.cm.c != nil {
		d.cm.c.Close()
		d.cm.c = nil
	}
	d.cm.closed = true
}

func (d *device) addr() netip.Addr {
	if g := d.v.GIDTable(); len(g) > 0 {
		return g[0].Addr.Unmap()
	}
	return netip.Addr{}
}

// cmChan is an event channel: its ids and queued events.
type cmChan struct {
	c      *client
	notify int // the write end of the event pipe
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	ids     map[uint32]*cmID
	next    uint32
	events  []cmEvent
	dropped int
}

// cmID is one rdma_cm_id.
type cmID struct {
	h         uint32
	ps        cm.PortSpace
	ud        bool
	dev       *device // nil: bound to every device (wildcard)
	src, dst  netip.AddrPort
	bound     bool
	resolved  bool
	routed    bool
	listening []*cm.Listener
	req       *cm.ConnRequest
	conn      *cm.Conn
	qp        *qpObj
	busy      bool // a connect or accept is under way
	ctx       context.Context
	cancel    context.CancelFunc
}

// Port spaces (enum rdma_port_space).
const (
	psTCP = 0x0106
	psUDP = 0x0111
	psIB  = 0x013f
)

func (c *client) cmOpen() ([]byte, []int, error) {
	if c.cm != nil || c.dev != nil {
		return nil, nil, fmt.Errorf("%w: connection already in use", syscall.EBUSY)
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return nil, nil, err
	}
	unix.SetNonblock(p[1], true)
	ch := &cmChan{c: c, notify: p[1], ids: map[uint32]*cmID{}}
	ch.ctx, ch.cancel = context.WithCancel(context.Background())
	c.cm = ch
	return cmResp(0, cmNoDev, netip.AddrPort{}, netip.AddrPort{}), []int{p[0]}, nil
}

// handleCM runs one CM request.
func (c *client) handleCM(r request) ([]byte, []int, error) {
	if r.op == opCMOpen {
		return c.cmOpen()
	}
	ch := c.cm
	if ch == nil {
		return nil, nil, fmt.Errorf("%w: CM op %d before CM_OPEN", syscall.EBADF, r.op)
	}
	q, err := decodeCMReq(r.body)
	if err != nil {
		return nil, nil, err
	}
	if r.op == opCMCreateID {
		return ch.createID(&q)
	}
	if r.op == opCMGetEvent {
		return ch.getEvent()
	}
	ch.mu.Lock()
	id := ch.ids[q.id]
	ch.mu.Unlock()
	if id == nil {
		return nil, nil, fmt.Errorf("%w: no cm_id %d", syscall.EINVAL, q.id)
	}
	switch r.op {
	case opCMDestroyID:
		ch.destroyID(id)
		return nil, nil, nil
	case opCMBind:
		return ch.bind(id, &q)
	case opCMResolveAddr:
		return ch.resolveAddr(id, &q)
	case opCMResolveRoute:
		return nil, nil, ch.resolveRoute(id)
	case opCMListen:
		return nil, nil, ch.listen(id)
	case opCMConnect:
		return nil, nil, ch.connect(id, &q)
	case opCMAccept:
		return nil, nil, ch.accept(id, &q)
	case opCMReject:
		return nil, nil, ch.reject(id, &q)
	case opCMDisconnect:
		return nil, nil, ch.disconnect(id)
	case opCMAttachQP:
		return nil, nil, ch.attachQP(id, &q)
	case opCMDetachQP:
		ch.mu.Lock()
		id.qp = nil
		ch.mu.Unlock()
		return nil, nil, nil
	case opCMQuery:
		ch.mu.Lock()
		defer ch.mu.Unlock()
		return cmResp(id.h, devIndex(id.dev), id.src, id.dst), nil, nil
	}
	return nil, nil, fmt.Errorf("%w: op %d", errMsg, r.op)
}

func devIndex(d *device) uint32 {
	if d == nil {
		return cmNoDev
	}
	return uint32(d.index)
}

func (ch *cmChan) newID(ps cm.PortSpace, ud bool) (*cmID, error) {
	if l := ch.c.lim().CMIDsPerConn; len(ch.ids) >= l {
		return nil, ch.c.limited(ch.c.s.led.count(syscall.ENOMEM, limCMIDs, l))
	}
	ch.next++
	if ch.next == 0 {
		ch.next = 1
	}
	id := &cmID{h: ch.next, ps: ps, ud: ud}
	id.ctx, id.cancel = context.WithCancel(ch.ctx)
	ch.ids[id.h] = id
	return id, nil
}

func (ch *cmChan) createID(q *cmReq) ([]byte, []int, error) {
	var ps cm.PortSpace
	var ud bool
	switch q.ps {
	case psTCP:
		ps = cm.PortSpaceTCP
	case psUDP:
		ps, ud = cm.PortSpaceUDP, true
	case psIB:
		ps = cm.PortSpaceIB
		ud = q.qpType == 4 // IBV_QPT_UD
	default:
		return nil, nil, fmt.Errorf("%w: port space 0x%x", syscall.EPROTONOSUPPORT, q.ps)
	}
	ch.mu.Lock()
	defer ch.mu.Unlock()
	id, err := ch.newID(ps, ud)
	if err != nil {
		return nil, nil, err
	}
	return cmResp(id.h, cmNoDev, netip.AddrPort{}, netip.AddrPort{}), nil, nil
}

// post queues an event and makes the channel's fd readable.
func (ch *cmChan) post(e cmEvent) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.ids[e.id] == nil && e.typ != cmEvConnectRequest {
		return // destroyed meanwhile
	}
	if len(ch.events) >= maxCMEvents {
		ch.dropped++
		return
	}
	e.priv = append([]byte(nil), e.priv...)
	ch.events = append(ch.events, e)
	unix.Write(ch.notify, []byte{1})
}

func (ch *cmChan) getEvent() ([]byte, []int, error) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if len(ch.events) == 0 {
		return nil, nil, syscall.EAGAIN
	}
	e := ch.events[0]
	ch.events[0] = cmEvent{}
	ch.events = ch.events[1:]
	return e.encode(), nil, nil
}

// devFor finds the device that owns a (the address's own device), or for
// a remote address the first device of its family.
func (s *Server) devFor(a netip.Addr, remote bool) *device {
	a = a.Unmap()
	for _, d := range s.devs {
		if d.addr() == a {
			return d
		}
	}
	if remote {
		for _, d := range s.devs {
			if d.addr().Is4() == a.Is4() {
				return d
			}
		}
	}
	return nil
}

func ephemeral() uint16 { return uint16(32768 + rand.IntN(28232)) }

func (ch *cmChan) bind(id *cmID, q *cmReq) ([]byte, []int, error) {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if id.bound || id.resolved {
		return nil, nil, fmt.Errorf("%w: cm_id %d already bound", syscall.EINVAL, id.h)
	}
	if !q.hasSrc {
		return nil, nil, fmt.Errorf("%w: bind without an address", syscall.EINVAL)
	}
	a := q.src.Addr()
	var d *device
	if !a.IsUnspecified() {
		if d = ch.c.s.devFor(a, false); d == nil {
			return nil, nil, fmt.Errorf("%w: %v is no device's address", syscall.EADDRNOTAVAIL, a)
		}
	}
	port := q.src.Port()
	if port == 0 {
		port = ephemeral()
	}
	id.dev, id.src, id.bound = d, netip.AddrPortFrom(a, port), true
	return cmResp(id.h, devIndex(d), id.src, id.dst), nil, nil
}

func (ch *cmChan) resolveAddr(id *cmID, q *cmReq) ([]byte, []int, error) {
	if !q.hasDst {
		return nil, nil, fmt.Errorf("%w: no destination", syscall.EINVAL)
	}
	ch.mu.Lock()
	if id.listening != nil || id.req != nil || id.conn != nil {
		ch.mu.Unlock()
		return nil, nil, fmt.Errorf("%w: cm_id %d is listening or connected", syscall.EINVAL, id.h)
	}
	if q.hasSrc && !id.bound {
		a := q.src.Addr()
		var d *device
		if !a.IsUnspecified() {
			if d = ch.c.s.devFor(a, false); d == nil {
				ch.mu.Unlock()
				return nil, nil, fmt.Errorf("%w: %v is no device's address", syscall.EADDRNOTAVAIL, a)
			}
		}
		id.dev, id.src, id.bound = d, q.src, true
	}
	dst := q.dst.Addr()
	if dst.IsUnspecified() || dst.IsLoopback() && id.dev == nil {
		// The kernel resolves those to a local device too.
		if len(ch.c.s.devs) > 0 && id.dev == nil {
			id.dev = ch.c.s.devs[0]
		}
		if dst.IsUnspecified() && id.dev != nil {
			dst = id.dev.addr()
		}
	}
	if id.dev == nil {
		id.dev = ch.c.s.devFor(dst, true)
	}
	ev := cmEvent{id: id.h, typ: cmEvAddrResolved}
	if id.dev == nil || id.dev.addr().Is4() != dst.Is4() {
		ev.typ, ev.status = cmEvAddrError, -int32(syscall.EHOSTUNREACH)
	} else {
		port := id.src.Port()
		if port == 0 {
			port = ephemeral()
		}
		id.src = netip.AddrPortFrom(id.dev.addr(), port)
		id.dst = netip.AddrPortFrom(dst, q.dst.Port())
		id.resolved = true
		ev.dev, ev.src, ev.dst = uint32(id.dev.index), id.src, id.dst
	}
	resp := cmResp(id.h, devIndex(id.dev), id.src, id.dst)
	ch.mu.Unlock()
	ch.post(ev)
	return resp, nil, nil
}

func (ch *cmChan) resolveRoute(id *cmID) error {
	ch.mu.Lock()
	ok := id.resolved
	ev := cmEvent{id: id.h, typ: cmEvRouteResolved, dev: devIndex(id.dev), src: id.src, dst: id.dst}
	if ok {
		id.routed = true
	}
	ch.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: cm_id %d: resolve the address first", syscall.EINVAL, id.h)
	}
	ch.post(ev)
	return nil
}

func (ch *cmChan) listen(id *cmID) error {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if !id.bound {
		return fmt.Errorf("%w: cm_id %d: bind before listen", syscall.EINVAL, id.h)
	}
	if id.listening != nil || id.resolved {
		return fmt.Errorf("%w: cm_id %d already listening or resolved", syscall.EINVAL, id.h)
	}
	devs := ch.c.s.devs
	if id.dev != nil {
		devs = []*device{id.dev}
	}
	var ls []*cm.Listener
	var openErr error
	for _, d := range devs {
		if d.addr().IsValid() && id.src.Addr().IsUnspecified() && d.addr().Is4() != id.src.Addr().Is4() && id.src.Addr().Is4() {
			continue // an IPv4 wildcard listens on the IPv4 devices
		}
		c, err := d.cmOpen()
		if err != nil {
			openErr = err
			continue
		}
		l, err := c.Listen(id.ps, id.src.Port())
		if err != nil {
			for _, x := range ls {
				x.Close()
			}
			return fmt.Errorf("%w: port %d: %v", syscall.EADDRINUSE, id.src.Port(), err)
		}
		ls = append(ls, l)
		ch.wg.Add(1)
		go ch.accepting(id, d, l)
	}
	if len(ls) == 0 {
		if openErr != nil {
			return fmt.Errorf("%w: no device to listen on: %v", syscall.ENODEV, openErr)
		}
		return fmt.Errorf("%w: no device to listen on", syscall.ENODEV)
	}
	id.listening = ls
	return nil
}

// accepting turns a listener's requests into CONNECT_REQUEST events, each
// with a new cm_id.
func (ch *cmChan) accepting(id *cmID, d *device, l *cm.Listener) {
	defer ch.wg.Done()
	for {
		r, err := l.Next(id.ctx)
		if err != nil {
			return
		}
		ch.mu.Lock()
		if ch.ids[id.h] != id {
			ch.mu.Unlock()
			r.Reject(nil)
			return
		}
		child, err := ch.newID(id.ps, r.UD())
		if err != nil {
			ch.mu.Unlock()
			r.Reject(nil)
			continue
		}
		child.dev, child.req, child.bound, child.resolved, child.routed = d, r, true, true, true
		child.src = netip.AddrPortFrom(d.addr(), id.src.Port())
		child.dst = netip.AddrPortFrom(r.Remote.Unmap(), r.RemotePort)
		ch.mu.Unlock()
		p := r.Param
		ch.post(cmEvent{id: child.h, typ: cmEvConnectRequest, listen: id.h, dev: uint32(d.index), qpn: r.RemoteQPN,
			src: child.src, dst: child.dst, priv: r.PrivateData,
			param: cmParam{respRes: p.ResponderResources, initDepth: p.InitiatorDepth, flowControl: b2u(p.FlowControl),
				retry: p.RetryCount, rnrRetry: p.RNRRetryCount, valid: 1}})
	}
}

func b2u(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

// attachQP gives the id the process's QP qpn, moved to INIT (a UD QP on
// to RTS with rdma_cm's Q_Key), as rdma_create_qp does.
func (ch *cmChan) attachQP(id *cmID, q *cmReq) error {
	ch.mu.Lock()
	d := id.dev
	ch.mu.Unlock()
	if d == nil {
		return fmt.Errorf("%w: cm_id %d has no device yet", syscall.EINVAL, id.h)
	}
	d.mu.Lock()
	qo := d.byQPN[q.qpn]
	d.mu.Unlock()
	if !ch.c.owns(qo, q.qpToken) {
		return fmt.Errorf("%w: no QP %d of this process on %s (or not its token)", syscall.EINVAL, q.qpn, d.name)
	}
	qp := qo.qp
	if qp.State() == verbs.StateReset {
		a := verbs.QPAttr{State: verbs.StateInit, Port: 1, PKeyIndex: 0,
			AccessFlags: uint32(verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead)}
		mask := qpstate.AttrState | qpstate.AttrPort | qpstate.AttrPKeyIndex | qpstate.AttrAccessFlags
		if id.ud {
			a.AccessFlags, a.QKey = 0, cm.UDPQKey
			mask = qpstate.AttrState | qpstate.AttrPort | qpstate.AttrPKeyIndex | qpstate.AttrQKey
		}
		if err := qp.Modify(&a, mask); err != nil {
			return fmt.Errorf("%w: QP %d to INIT: %v", syscall.EINVAL, q.qpn, err)
		}
		if id.ud {
			if err := qp.Modify(&verbs.QPAttr{State: verbs.StateRTR}, qpstate.AttrState); err != nil {
				return fmt.Errorf("%w: QP %d to RTR: %v", syscall.EINVAL, q.qpn, err)
			}
			if err := qp.Modify(&verbs.QPAttr{State: verbs.StateRTS, SQPSN: rand.Uint32() & 0xffffff},
				qpstate.AttrState|qpstate.AttrSQPSN); err != nil {
				return fmt.Errorf("%w: QP %d to RTS: %v", syscall.EINVAL, q.qpn, err)
			}
		}
	}
	ch.mu.Lock()
	id.qp = qo
	ch.mu.Unlock()
	return nil
}

// owns says whether qo is the client's to take: the same known uid and the
// QP's token.
func (c *client) owns(qo *qpObj, token uint64) bool {
	if qo == nil || c.uid < 0 || qo.c.uid != c.uid {
		return false
	}
	var a, b [8]byte
	le.PutUint64(a[:], qo.token)
	le.PutUint64(b[:], token)
	return subtle.ConstantTimeCompare(a[:], b[:]) == 1
}

func connParam(q *cmReq) *cm.ConnParam {
	if q.param.valid == 0 {
		return nil
	}
	p := q.param
	return &cm.ConnParam{PrivateData: append([]byte(nil), q.priv...), ResponderResources: p.respRes, InitiatorDepth: p.initDepth,
		FlowControl: p.flowControl != 0, RetryCount: min(p.retry, 7), RNRRetryCount: min(p.rnrRetry, 7)}
}

func paramOf(p cm.ConnParam) cmParam {
	return cmParam{respRes: p.ResponderResources, initDepth: p.InitiatorDepth, flowControl: b2u(p.FlowControl),
		retry: p.RetryCount, rnrRetry: p.RNRRetryCount, valid: 1}
}

// failure turns a CM error into the event rdma_cm reports for it.
func failure(e *cmEvent, err error, fallback uint32) {
	var rej *cm.RejectError
	switch {
	case errors.As(err, &rej):
		e.typ, e.status, e.priv = cmEvRejected, int32(rej.Reason), rej.PrivateData
	case errors.Is(err, cm.ErrNoListener):
		e.typ, e.status = cmEvRejected, 8
	case errors.Is(err, cm.ErrRejected):
		e.typ, e.status = cmEvRejected, 28
	case errors.Is(err, cm.ErrUnreachable):
		e.typ, e.status = cmEvUnreachable, -int32(syscall.ETIMEDOUT)
	default:
		e.typ, e.status = fallback, -int32(syscall.ECONNABORTED)
	}
}

func (ch *cmChan) connect(id *cmID, q *cmReq) error {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	switch {
	case !id.routed:
		return fmt.Errorf("%w: cm_id %d: resolve the route first", syscall.EINVAL, id.h)
	case id.busy || id.conn != nil:
		return fmt.Errorf("%w: cm_id %d is connecting or connected", syscall.EISCONN, id.h)
	case !id.ud && id.qp == nil:
		return fmt.Errorf("%w: cm_id %d: rdma_connect without a QP", syscall.EOPNOTSUPP, id.h)
	}
	c, err := id.dev.cmOpen()
	if err != nil {
		return fmt.Errorf("%w: %v", syscall.ENODEV, err)
	}
	id.busy = true
	p := connParam(q)
	priv := append([]byte(nil), q.priv...)
	ch.wg.Add(1)
	go func() {
		defer ch.wg.Done()
		ev := cmEvent{id: id.h, typ: cmEvEstablished, dev: uint32(id.dev.index), src: id.src, dst: id.dst}
		if id.ud {
			r, err := c.ResolveUD(id.ctx, id.dst.Addr(), id.dst.Port(), priv)
			if err != nil {
				failure(&ev, err, cmEvUnreachable)
			} else {
				ev.qpn, ev.qkey, ev.priv = r.QPN, r.QKey, r.PrivateData
			}
			ch.mu.Lock()
			id.busy = false
			ch.mu.Unlock()
			ch.post(ev)
			return
		}
		k, err := c.Dial(id.ctx, id.dst.Addr(), id.ps, id.dst.Port(), id.qp.qp, p)
		if err != nil {
			failure(&ev, err, cmEvConnectError)
			ch.mu.Lock()
			id.busy = false
			ch.mu.Unlock()
			ch.post(ev)
			return
		}
		ev.param, ev.priv = paramOf(k.Param()), k.PrivateData()
		ch.established(id, k, ev)
	}()
	return nil
}

// established records the connection, reports it and then its end.
func (ch *cmChan) established(id *cmID, k *cm.Conn, ev cmEvent) {
	ch.mu.Lock()
	id.conn, id.busy = k, false
	ch.mu.Unlock()
	ch.post(ev)
	select {
	case <-k.Done():
		ch.post(cmEvent{id: id.h, typ: cmEvDisconnected, dev: ev.dev, src: id.src, dst: id.dst})
	case <-id.ctx.Done():
		// Destroyed while connecting: the connection still goes down.
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), disconnectWait)
			defer cancel()
			k.Disconnect(ctx)
		}()
	}
}

func (ch *cmChan) accept(id *cmID, q *cmReq) error {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	r := id.req
	switch {
	case r == nil:
		return fmt.Errorf("%w: cm_id %d has no connection request", syscall.EINVAL, id.h)
	case id.busy || id.conn != nil:
		return fmt.Errorf("%w: cm_id %d already accepting", syscall.EISCONN, id.h)
	}
	if r.UD() {
		// The QPN only goes into the SIDR_REP: it tells the peer where to
		// send, which any UD sender may do with the well-known rdma_cm
		// Q_Key anyway, so it needs no ownership check.
		qpn := q.qpn
		if id.qp != nil {
			qpn = id.qp.qpn
		}
		if qpn == 0 {
			return fmt.Errorf("%w: UD accept without a QP", syscall.EINVAL)
		}
		id.req = nil
		if err := r.AcceptUD(qpn, q.qkey, q.priv); err != nil {
			return fmt.Errorf("%w: %v", syscall.ETIMEDOUT, err)
		}
		return nil
	}
	if id.qp == nil {
		return fmt.Errorf("%w: cm_id %d: rdma_accept without a QP", syscall.EOPNOTSUPP, id.h)
	}
	id.busy = true
	p := connParam(q)
	qp := id.qp.qp
	returned := make(chan struct{})
	ch.wg.Add(1)
	go func() {
		defer ch.wg.Done()
		ev := cmEvent{id: id.h, typ: cmEvEstablished, dev: uint32(id.dev.index), src: id.src, dst: id.dst}
		k, err := r.Accept(id.ctx, qp, p)
		close(returned)
		ch.mu.Lock()
		id.req = nil
		ch.mu.Unlock()
		if err != nil {
			failure(&ev, err, cmEvConnectError)
			if ev.typ == cmEvUnreachable {
				ev.typ = cmEvConnectError
			}
			ch.mu.Lock()
			id.busy = false
			ch.mu.Unlock()
			ch.post(ev)
			return
		}
		ev.param = paramOf(k.Param())
		ch.established(id, k, ev)
	}()
	// librdmacm's rdma_accept returns with the QP in RTS (it moves it
	// before the REP goes), and programs post at once: wait for that
	// here, not for the RTU.
	for i := 0; i < acceptWaitMS && qp.State() != verbs.StateRTS; i++ {
		select {
		case <-returned:
			return nil
		case <-time.After(time.Millisecond):
		}
	}
	return nil
}

func (ch *cmChan) reject(id *cmID, q *cmReq) error {
	ch.mu.Lock()
	r := id.req
	if id.busy {
		r = nil
	}
	id.req = nil
	ch.mu.Unlock()
	if r == nil {
		return fmt.Errorf("%w: cm_id %d has no connection request", syscall.EINVAL, id.h)
	}
	if err := r.Reject(q.priv); err != nil {
		return fmt.Errorf("%w: %v", syscall.ETIMEDOUT, err)
	}
	return nil
}

func (ch *cmChan) disconnect(id *cmID) error {
	ch.mu.Lock()
	k := id.conn
	ch.mu.Unlock()
	if k == nil {
		return fmt.Errorf("%w: cm_id %d is not connected", syscall.EINVAL, id.h)
	}
	ch.wg.Add(1)
	go func() {
		defer ch.wg.Done()
		k.Disconnect(id.ctx)
	}()
	return nil
}

// destroyID frees an id as the kernel does: listeners close, a request
// not yet answered is rejected, a connection is disconnected (its DREQ
// goes out even though nobody waits for the answer).
func (ch *cmChan) destroyID(id *cmID) {
	ch.mu.Lock()
	delete(ch.ids, id.h)
	ls, r, k, busy := id.listening, id.req, id.conn, id.busy
	id.listening, id.req = nil, nil
	ch.mu.Unlock()
	for _, l := range ls {
		l.Close()
	}
	if r != nil && !busy {
		r.Reject(nil)
	}
	if k != nil {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), disconnectWait)
			defer cancel()
			k.Disconnect(ctx)
		}()
	}
	id.cancel()
}

// cmCleanup destroys what a closed channel left: every id (so its
// connections are disconnected and its listeners closed), then the
// goroutines are waited for and the pipe closed.
func (c *client) cmCleanup() {
	ch := c.cm
	if ch == nil {
		return
	}
	ch.mu.Lock()
	ids := make([]*cmID, 0, len(ch.ids))
	for _, id := range ch.ids {
		ids = append(ids, id)
	}
	ch.mu.Unlock()
	for _, id := range ids {
		ch.destroyID(id)
	}
	ch.cancel()
	ch.wg.Wait()
	unix.Close(ch.notify)
}
