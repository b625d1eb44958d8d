package serve

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"
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
	c, err := cm.Open(d.v, &cm.Options{SGIDIndex: d.gidIndex})
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

// addr is the address the device serves, the one rdma_cm binds and
// resolves (cm.DefaultSGID), whatever its GID index.
func (d *device) addr() netip.Addr {
	if g := d.v.GIDTable(); d.gidIndex < len(g) {
		return g[d.gidIndex].Addr.Unmap()
	}
	return netip.Addr{}
}

// cmChan is an event channel: its ids and queued events. The program's
// end of its event socket (the channel's fd) gets one byte per queued
// event; the daemon keeps a descriptor of that end too (drain), to take
// back the bytes of events that rdma_migrate_id moves to another channel.
type cmChan struct {
	c      *client
	notify int    // the daemon's end of the event socket
	drain  int    // the program's end, as the daemon holds it
	token  uint64 // names the channel to rdma_migrate_id (CM_OPEN's answer)

	mu      sync.Mutex
	ids     map[uint32]*cmID
	next    uint32
	events  []cmEvent
	dropped int
	closed  bool
}

// cmID is one rdma_cm_id. Its fields are guarded by the mutex of the
// channel it is on (lock), which rdma_migrate_id changes; h is its handle
// on that channel.
type cmID struct {
	ch        atomic.Pointer[cmChan]
	h         uint32
	ps        cm.PortSpace
	ud        bool
	dev       *device // nil: bound to every device (wildcard or loopback)
	src, dst  netip.AddrPort
	bound     bool
	resolved  bool
	routed    bool
	loopback  bool // the address resolved to a loopback or wildcard destination
	listening []*cm.Listener
	req       *cm.ConnRequest
	conn      *cm.Conn
	qp        *qpObj
	busy      bool // a connect or accept is under way
	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup // its goroutines: listeners, connect, accept, disconnect
}

// lock locks the channel the id is on now and returns it.
func (id *cmID) lock() *cmChan {
	for {
		ch := id.ch.Load()
		ch.mu.Lock()
		if id.ch.Load() == ch {
			return ch
		}
		ch.mu.Unlock()
	}
}

// post queues an event of the id on the channel it is on now, with its
// handle there.
func (id *cmID) post(e cmEvent) {
	ch := id.lock()
	defer ch.mu.Unlock()
	if ch.ids[id.h] != id {
		return // destroyed meanwhile
	}
	e.id = id.h
	ch.postLocked(e)
}

// cmChans are the open event channels by token, for rdma_migrate_id.
var cmChans struct {
	mu sync.Mutex
	m  map[uint64]*cmChan
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
	// A socket pair rather than a pipe: the daemon takes bytes back from
	// the program's end with MSG_DONTWAIT, whatever O_NONBLOCK the program
	// set on it (a flag of the descriptor both share).
	p, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	give, err := unix.Dup(p[0])
	if err != nil {
		unix.Close(p[0])
		unix.Close(p[1])
		return nil, nil, err
	}
	unix.CloseOnExec(give)
	unix.SetNonblock(p[1], true)
	unix.Shutdown(p[1], unix.SHUT_RD)
	ch := &cmChan{c: c, notify: p[1], drain: p[0], ids: map[uint32]*cmID{}}
	cmChans.mu.Lock()
	if cmChans.m == nil {
		cmChans.m = map[uint64]*cmChan{}
	}
	for ch.token == 0 || cmChans.m[ch.token] != nil {
		if ch.token, err = newQPToken(); err != nil { // random, as a QP's token
			cmChans.mu.Unlock()
			unix.Close(give)
			unix.Close(p[0])
			unix.Close(p[1])
			return nil, nil, err
		}
	}
	cmChans.m[ch.token] = ch
	cmChans.mu.Unlock()
	c.cm = ch
	return cmOpenResp(ch.token), []int{give}, nil
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
		x := id.lock()
		id.qp = nil
		x.mu.Unlock()
		return nil, nil, nil
	case opCMQuery:
		x := id.lock()
		defer x.mu.Unlock()
		return cmResp(id.h, devIndex(id.dev), id.src, id.dst), nil, nil
	case opCMMigrateID:
		return ch.migrate(id, q.qpToken)
	}
	return nil, nil, fmt.Errorf("%w: op %d", errMsg, r.op)
}

func devIndex(d *device) uint32 {
	if d == nil {
		return cmNoDev
	}
	return uint32(d.index)
}

// alloc returns a handle no id of the channel has.
func (ch *cmChan) alloc() uint32 {
	for {
		ch.next++
		if ch.next != 0 && ch.ids[ch.next] == nil {
			return ch.next
		}
	}
}

func (ch *cmChan) newID(ps cm.PortSpace, ud bool) (*cmID, error) {
	if l := ch.c.lim().CMIDsPerConn; len(ch.ids) >= l {
		return nil, ch.c.limited(ch.c.s.led.count(syscall.ENOMEM, limCMIDs, l))
	}
	if ch.closed {
		return nil, fmt.Errorf("%w: event channel closed", syscall.EBADF)
	}
	id := &cmID{h: ch.alloc(), ps: ps, ud: ud}
	id.ch.Store(ch)
	// Not the channel's context: rdma_migrate_id may move the id to a
	// channel that outlives this one.
	id.ctx, id.cancel = context.WithCancel(context.Background())
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

// postLocked queues an event and makes the channel's fd readable; ch.mu
// is held.
func (ch *cmChan) postLocked(e cmEvent) {
	if ch.closed {
		return
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

// migrate moves id from ch to the channel whose token the program showed,
// as the kernel's ucma_migrate_id moves a context between files: the id
// gets a handle there, and its events not yet taken move along in their
// order (a listener's CONNECT_REQUESTs with the ids they carry). Events
// already taken stay the program's on the old channel (librdmacm waits for
// their ack). The fd of the old channel loses one byte per moved event, so
// it polls readable only for what it still has.
func (ch *cmChan) migrate(id *cmID, token uint64) ([]byte, []int, error) {
	cmChans.mu.Lock()
	to := cmChans.m[token]
	cmChans.mu.Unlock()
	// Only a channel of this daemon and of the same user: the token is
	// the program's secret, the uid a second fence.
	if to == nil || token == 0 || to.c.s != ch.c.s || to.c.uid != ch.c.uid || ch.c.uid < 0 {
		return nil, nil, fmt.Errorf("%w: no event channel of this user with that token", syscall.EINVAL)
	}
	if to == ch {
		ch.mu.Lock()
		defer ch.mu.Unlock()
		return cmResp(id.h, devIndex(id.dev), id.src, id.dst), nil, nil
	}
	a, b := ch, to
	if a.token > b.token {
		a, b = b, a
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	b.mu.Lock()
	defer b.mu.Unlock()
	if ch.ids[id.h] != id {
		return nil, nil, fmt.Errorf("%w: cm_id %d is gone", syscall.EINVAL, id.h)
	}
	if to.closed {
		return nil, nil, fmt.Errorf("%w: the new event channel is closed", syscall.EINVAL)
	}
	var moved, kept []cmEvent
	ids := []*cmID{id}
	for _, e := range ch.events {
		switch {
		case e.typ == cmEvConnectRequest && e.listen == id.h:
			if child := ch.ids[e.id]; child != nil {
				ids = append(ids, child)
			}
			moved = append(moved, e)
		case e.typ != cmEvConnectRequest && e.id == id.h:
			moved = append(moved, e)
		default:
			kept = append(kept, e)
		}
	}
	if l := to.c.lim().CMIDsPerConn; len(to.ids)+len(ids) > l {
		return nil, nil, to.c.limited(to.c.s.led.count(syscall.ENOMEM, limCMIDs, l))
	}
	if len(to.events)+len(moved) > maxCMEvents {
		return nil, nil, fmt.Errorf("%w: the new event channel's queue is full", syscall.ENOMEM)
	}
	handles := map[uint32]uint32{}
	for _, x := range ids {
		old := x.h
		delete(ch.ids, old)
		x.h = to.alloc()
		to.ids[x.h] = x
		x.ch.Store(to)
		handles[old] = x.h
	}
	ch.events = kept
	for _, e := range moved {
		if e.typ == cmEvConnectRequest {
			e.listen = id.h
		}
		if h, ok := handles[e.id]; ok {
			e.id = h
		}
		to.events = append(to.events, e)
		unix.Write(to.notify, []byte{1})
		var b [1]byte
		unix.Recvfrom(ch.drain, b[:], unix.MSG_DONTWAIT)
	}
	return cmResp(id.h, devIndex(id.dev), id.src, id.dst), nil, nil
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

// bindDev is the device binding to a gives an id (nil for the wildcard),
// or why a is refused: an IPv6 link-local address goes by its scope id
// (linkLocalDev), any other address that no device owns is
// EADDRNOTAVAIL, as the kernel's rdma_translate_ip finds no interface
// with it.
func (s *Server) bindDev(a netip.Addr) (*device, error) {
	switch {
	case isLinkLocal(a):
		return s.linkLocalDev(a)
	case s.anyAddr(a):
		return nil, nil
	}
	if d := s.devFor(a, false); d != nil {
		return d, nil
	}
	return nil, fmt.Errorf("%w: %v is no device's address", syscall.EADDRNOTAVAIL, a)
}

// anyAddr says whether binding to a is binding to no device: the wildcard,
// or a loopback address no device owns. The kernel's rdma_cm treats a
// loopback address as the wildcard (cma_any_addr): rdma_bind_addr takes
// no device (id->verbs stays NULL) and rdma_listen listens on every
// device. A device of softroce may own a loopback address (a daemon on
// 127.0.0.1): then it is that device's address like any other.
func (s *Server) anyAddr(a netip.Addr) bool {
	a = a.Unmap()
	return a.IsUnspecified() || a.IsLoopback() && s.devFor(a, false) == nil
}

// loopbackDev is the device a loopback or wildcard destination resolves
// to, as the kernel's cma_bind_loopback picks it: the first device with an
// active port, whatever its address family. Every softroce device's port
// is active, so that is the first device.
func (s *Server) loopbackDev() *device {
	if len(s.devs) == 0 {
		return nil
	}
	return s.devs[0]
}

// loopbackOf is the loopback address of a's family (cma_set_loopback).
func loopbackOf(a netip.Addr) netip.Addr {
	if a.Is4() {
		return netip.AddrFrom4([4]byte{127, 0, 0, 1})
	}
	return netip.IPv6Loopback()
}

func ephemeral() uint16 { return uint16(32768 + rand.IntN(28232)) }

func (ch *cmChan) bind(id *cmID, q *cmReq) ([]byte, []int, error) {
	x := id.lock()
	defer x.mu.Unlock()
	if id.bound || id.resolved {
		return nil, nil, fmt.Errorf("%w: cm_id %d already bound", syscall.EINVAL, id.h)
	}
	if !q.hasSrc {
		return nil, nil, fmt.Errorf("%w: bind without an address", syscall.EINVAL)
	}
	a := q.src.Addr()
	d, err := ch.c.s.bindDev(a)
	if err != nil {
		return nil, nil, err
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
	s := ch.c.s
	x := id.lock()
	if id.listening != nil || id.req != nil || id.conn != nil {
		x.mu.Unlock()
		return nil, nil, fmt.Errorf("%w: cm_id %d is listening or connected", syscall.EINVAL, id.h)
	}
	if q.hasSrc && !id.bound {
		d, err := s.bindDev(q.src.Addr())
		if err != nil {
			x.mu.Unlock()
			return nil, nil, err
		}
		id.dev, id.src, id.bound = d, q.src, true
	}
	dst := q.dst.Addr()
	if src := id.src.Addr(); id.bound && (isLinkLocal(src) || isLinkLocal(dst)) && src.Is4() != dst.Is4() {
		// rdma_resolve_addr refuses a destination of another family
		// than the bound source (resolve_prepare_src).
		x.mu.Unlock()
		return nil, nil, fmt.Errorf("%w: %v from %v: another address family", syscall.EINVAL, dst, id.src.Addr())
	}
	ev := cmEvent{typ: cmEvAddrResolved}
	port := id.src.Port()
	if port == 0 {
		port = ephemeral()
	}
	switch {
	case isLinkLocal(dst):
		// A link-local destination is on the link of the source's
		// interface: the bound one, or (unbound, as the kernel's
		// cma_bind_addr copies it to the source) the one the
		// destination's scope id names.
		d := id.dev
		if d == nil {
			d = s.scopeDev(scopeOf(dst))
		}
		if d == nil || d.ll.index < 0 || d.ll.scope == 0 {
			ev.typ, ev.status = cmEvAddrError, -int32(syscall.ENODEV)
			break
		}
		id.dev = d
		id.src = netip.AddrPortFrom(d.ll.scoped(), port)
		id.dst = netip.AddrPortFrom(dst, q.dst.Port())
		id.resolved = true
		ev.dev, ev.src, ev.dst = uint32(d.index), id.src, id.dst
	case s.anyAddr(dst):
		// cma_resolve_loopback: an id on no device takes the first one
		// (cma_bind_loopback) and its source becomes the loopback
		// address; the destination stays as given, and its GID is the
		// source's.
		// An id bound to a device's address keeps it (and its route,
		// the kernel having its network interface then).
		if id.dev == nil {
			if id.dev = s.loopbackDev(); id.dev == nil {
				x.mu.Unlock()
				return nil, nil, fmt.Errorf("%w: no device", syscall.ENODEV)
			}
			fam := dst
			if id.src.Addr().IsValid() {
				fam = id.src.Addr()
			}
			id.src = netip.AddrPortFrom(loopbackOf(fam), port)
			id.loopback = true
		} else {
			id.src = netip.AddrPortFrom(id.dev.addr(), port)
		}
		id.dst = netip.AddrPortFrom(dst, q.dst.Port())
		id.resolved = true
		ev.dev, ev.src, ev.dst = uint32(id.dev.index), id.src, id.dst
	default:
		if id.dev == nil {
			id.dev = s.devFor(dst, true)
		}
		if id.dev == nil || id.dev.addr().Is4() != dst.Is4() {
			ev.typ, ev.status = cmEvAddrError, -int32(syscall.EHOSTUNREACH)
		} else {
			id.src = netip.AddrPortFrom(id.dev.addr(), port)
			id.dst = netip.AddrPortFrom(dst, q.dst.Port())
			id.resolved = true
			ev.dev, ev.src, ev.dst = uint32(id.dev.index), id.src, id.dst
		}
	}
	resp := cmResp(id.h, devIndex(id.dev), id.src, id.dst)
	x.mu.Unlock()
	id.post(ev)
	return resp, nil, nil
}

func (ch *cmChan) resolveRoute(id *cmID) error {
	x := id.lock()
	ok, loop := id.resolved, id.loopback
	ev := cmEvent{typ: cmEvRouteResolved, dev: devIndex(id.dev), src: id.src, dst: id.dst}
	if ok && !loop {
		id.routed = true
	}
	x.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: cm_id %d: resolve the address first", syscall.EINVAL, id.h)
	}
	if loop {
		// As the kernel on a RoCE port (rxe's too): a loopback or
		// wildcard destination leaves the id bound to no network
		// interface, and cma_resolve_iboe_route needs one
		// (cma_iboe_set_path_rec_l2_fields), so rdma_resolve_route fails
		// at once with ENODEV.
		return fmt.Errorf("%w: cm_id %d: a loopback destination has no RoCE route", syscall.ENODEV, id.h)
	}
	id.post(ev)
	return nil
}

func (ch *cmChan) listen(id *cmID) error {
	x := id.lock()
	defer x.mu.Unlock()
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
	var on []*device
	var openErr error
	for _, d := range devs {
		if d.addr().IsValid() && id.dev == nil && d.addr().Is4() != id.src.Addr().Is4() && id.src.Addr().Is4() {
			continue // an IPv4 wildcard (or loopback) listens on the IPv4 devices
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
		ls, on = append(ls, l), append(on, d)
	}
	if len(ls) == 0 {
		if openErr != nil {
			return fmt.Errorf("%w: no device to listen on: %v", syscall.ENODEV, openErr)
		}
		return fmt.Errorf("%w: no device to listen on", syscall.ENODEV)
	}
	for i, l := range ls {
		id.wg.Add(1)
		go id.accepting(on[i], l)
	}
	id.listening = ls
	return nil
}

// accepting turns a listener's requests into CONNECT_REQUEST events, each
// with a new cm_id on the channel the listener is on.
func (id *cmID) accepting(d *device, l *cm.Listener) {
	defer id.wg.Done()
	for {
		r, err := l.Next(id.ctx)
		if err != nil {
			return
		}
		ch := id.lock()
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
		if local := r.Local.Unmap(); isLinkLocal(local) && local == d.ll.addr {
			// Asked for on the device's link-local address: the
			// kernel's cma_save_ip6_info gives the new id the cma_hdr's
			// addresses, with no scope id.
			child.src = netip.AddrPortFrom(local, id.src.Port())
		}
		child.dst = netip.AddrPortFrom(r.Remote.Unmap(), r.RemotePort)
		p := r.Param
		ch.postLocked(cmEvent{id: child.h, typ: cmEvConnectRequest, listen: id.h, dev: uint32(d.index), qpn: r.RemoteQPN,
			src: child.src, dst: child.dst, priv: r.PrivateData,
			param: cmParam{respRes: p.ResponderResources, initDepth: p.InitiatorDepth, flowControl: b2u(p.FlowControl),
				retry: p.RetryCount, rnrRetry: p.RNRRetryCount, valid: 1}})
		ch.mu.Unlock()
	}
}

func b2u(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

// attachQP gives the id the process's QP qpn, moved to INIT (a UD QP on
// to RTS with rdma_cm's Q_Key), as rdma_create_qp does. An id keeps the
// QP it has: a second one is refused with EINVAL, as librdmacm's
// rdma_create_qp refuses it (id->qp set). In the kernel the ucma holds no
// QP at all (the QP is the library's, the CM only learns its number at
// connect or accept), so this is where that rule is kept; otherwise a
// program could re-point a connecting or connected id at another QP.
func (ch *cmChan) attachQP(id *cmID, q *cmReq) error {
	x := id.lock()
	d, has := id.dev, id.qp != nil
	x.mu.Unlock()
	if d == nil {
		return fmt.Errorf("%w: cm_id %d has no device yet", syscall.EINVAL, id.h)
	}
	if has {
		return fmt.Errorf("%w: cm_id %d already has a QP", syscall.EINVAL, id.h)
	}
	d.mu.Lock()
	qo := d.byQPN[q.qpn]
	d.mu.Unlock()
	if !ch.c.owns(qo, q.qpToken) {
		return fmt.Errorf("%w: no QP %d of this process on %s (or not its token)", syscall.EINVAL, q.qpn, d.name)
	}
	// Claimed before the QP is moved, so two ATTACH_QPs at once cannot
	// both succeed.
	x = id.lock()
	if id.qp != nil {
		x.mu.Unlock()
		return fmt.Errorf("%w: cm_id %d already has a QP", syscall.EINVAL, id.h)
	}
	id.qp = qo
	x.mu.Unlock()
	if err := initQP(qo, id.ud); err != nil {
		x = id.lock()
		if id.qp == qo {
			id.qp = nil
		}
		x.mu.Unlock()
		return fmt.Errorf("%w: QP %d: %v", syscall.EINVAL, q.qpn, err)
	}
	return nil
}

// initQP moves a QP in RESET to INIT (a UD one on to RTS with rdma_cm's
// Q_Key).
func initQP(qo *qpObj, ud bool) error {
	qp := qo.qp
	if qp.State() != verbs.StateReset {
		return nil
	}
	a := verbs.QPAttr{State: verbs.StateInit, Port: 1, PKeyIndex: 0,
		AccessFlags: uint32(verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead)}
	mask := qpstate.AttrState | qpstate.AttrPort | qpstate.AttrPKeyIndex | qpstate.AttrAccessFlags
	if ud {
		a.AccessFlags, a.QKey = 0, cm.UDPQKey
		mask = qpstate.AttrState | qpstate.AttrPort | qpstate.AttrPKeyIndex | qpstate.AttrQKey
	}
	if err := qp.Modify(&a, mask); err != nil {
		return fmt.Errorf("to INIT: %v", err)
	}
	if ud {
		if err := qp.Modify(&verbs.QPAttr{State: verbs.StateRTR}, qpstate.AttrState); err != nil {
			return fmt.Errorf("to RTR: %v", err)
		}
		if err := qp.Modify(&verbs.QPAttr{State: verbs.StateRTS, SQPSN: rand.Uint32() & 0xffffff},
			qpstate.AttrState|qpstate.AttrSQPSN); err != nil {
			return fmt.Errorf("to RTS: %v", err)
		}
	}
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

// rdmaMax is librdmacm's RDMA_MAX_RESP_RES and RDMA_MAX_INIT_DEPTH.
const rdmaMax = 0xFF

// rdDepths sets an RC connect's or accept's READ/atomic depths as
// librdmacm does before they go into the REQ or REP: RDMA_MAX_RESP_RES
// and RDMA_MAX_INIT_DEPTH stand for the device's limits (max_qp_rd_atom,
// max_qp_init_rd_atom), on accept for what the request asked (req, seen
// from this side) up to them; another value above a limit is EINVAL
// (ucma_valid_param). The peer programs what the REQ or REP carries into
// its QP as given: kernel rxe refuses a max_rd_atomic above its limit, so
// the 0xFF itself must never reach the wire.
func rdDepths(d *device, ps cm.PortSpace, p *cm.ConnParam, req *cm.ConnParam) error {
	a := d.v.QueryDevice()
	set := func(what string, v *uint8, lim int, asked uint8) error {
		switch {
		case *v == rdmaMax && req != nil:
			*v = uint8(min(int(asked), lim))
		case *v == rdmaMax:
			*v = uint8(lim)
		case int(*v) > lim && ps == cm.PortSpaceTCP:
			return fmt.Errorf("%w: %s %d above the device's %d", syscall.EINVAL, what, *v, lim)
		case int(*v) > lim:
			*v = uint8(lim)
		}
		return nil
	}
	var asked cm.ConnParam
	if req != nil {
		asked = *req
	}
	if err := set("responder_resources", &p.ResponderResources, a.MaxQPRDAtom, asked.ResponderResources); err != nil {
		return err
	}
	return set("initiator_depth", &p.InitiatorDepth, a.MaxQPInitRDAtom, asked.InitiatorDepth)
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
	x := id.lock()
	defer x.mu.Unlock()
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
	p := connParam(q)
	if p != nil && !id.ud {
		if err := rdDepths(id.dev, id.ps, p, nil); err != nil {
			return err
		}
	}
	id.busy = true
	priv := append([]byte(nil), q.priv...)
	var qp *verbs.QP
	if id.qp != nil {
		qp = id.qp.qp
	}
	dev, src, dst, ps, ud, qo := id.dev, id.src, id.dst, id.ps, id.ud, id.qp
	id.wg.Add(1)
	go func() {
		defer id.wg.Done()
		if qo != nil {
			dev.takeRecvs(qo)
		}
		ev := cmEvent{typ: cmEvEstablished, dev: uint32(dev.index), src: src, dst: dst}
		if ud {
			r, err := c.ResolveUDFrom(id.ctx, src.Port(), dst.Addr().WithZone(""), dst.Port(), priv)
			if err != nil {
				failure(&ev, err, cmEvUnreachable)
			} else {
				ev.qpn, ev.qkey, ev.priv = r.QPN, r.QKey, r.PrivateData
			}
			x := id.lock()
			id.busy = false
			x.mu.Unlock()
			id.post(ev)
			return
		}
		// The cma_hdr names the id's port, as the kernel's does.
		withPort := cm.DefaultConnParam
		if p != nil {
			withPort = *p
		}
		withPort.SourcePort = src.Port()
		k, err := c.Dial(id.ctx, dst.Addr().WithZone(""), ps, dst.Port(), qp, &withPort)
		if err != nil {
			failure(&ev, err, cmEvConnectError)
			x := id.lock()
			id.busy = false
			x.mu.Unlock()
			id.post(ev)
			return
		}
		ev.param, ev.priv = paramOf(k.Param()), k.PrivateData()
		id.established(k, ev)
	}()
	return nil
}

// takeRecvs moves into verbs the receives q's program has posted to its
// ring (or its SRQ's) by now, rather than at the poller's next pass: a
// program posts receives, then connects or accepts, and the peer may send
// as soon as the connection is up. On a RNIC a posted receive is the
// adapter's at once; here a receive still in the ring when the first
// SEND arrives draws an RNR NAK, which fails the peer's QP outright when
// its rnr_retry is 0 (librdmacm passes the program's rnr_retry_count,
// Ceph's rdma_cm connections leave it 0).
func (d *device) takeRecvs(q *qpObj) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.byQPN[q.qpn] != q {
		return // destroyed meanwhile
	}
	if q.srq != nil {
		q.srq.rq.drain(q.srq.mem.b)
	} else {
		q.rq.drain(q.mem.b)
	}
}

// established records the connection, reports it and then its end, on
// whichever channel the id is on by then.
func (id *cmID) established(k *cm.Conn, ev cmEvent) {
	x := id.lock()
	id.conn, id.busy = k, false
	src, dst := id.src, id.dst
	x.mu.Unlock()
	id.post(ev)
	select {
	case <-k.Done():
		id.post(cmEvent{typ: cmEvDisconnected, dev: ev.dev, src: src, dst: dst})
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
	x := id.lock()
	r := id.req
	switch {
	case r == nil:
		x.mu.Unlock()
		return fmt.Errorf("%w: cm_id %d has no connection request", syscall.EINVAL, id.h)
	case id.busy || id.conn != nil:
		x.mu.Unlock()
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
			x.mu.Unlock()
			return fmt.Errorf("%w: UD accept without a QP", syscall.EINVAL)
		}
		id.req = nil
		x.mu.Unlock()
		if err := r.AcceptUD(qpn, q.qkey, q.priv); err != nil {
			return fmt.Errorf("%w: %v", syscall.ETIMEDOUT, err)
		}
		return nil
	}
	if id.qp == nil {
		x.mu.Unlock()
		return fmt.Errorf("%w: cm_id %d: rdma_accept without a QP", syscall.EOPNOTSUPP, id.h)
	}
	p := connParam(q)
	if p == nil {
		// librdmacm's rdma_accept without parameters: the request's
		// depths up to the device's, seven retries.
		p = &cm.ConnParam{ResponderResources: rdmaMax, InitiatorDepth: rdmaMax, RetryCount: 7, RNRRetryCount: 7}
	}
	if err := rdDepths(id.dev, id.ps, p, &r.Param); err != nil {
		x.mu.Unlock()
		return err
	}
	id.busy = true
	qo, qp := id.qp, id.qp.qp
	dev, src, dst := id.dev, id.src, id.dst
	returned := make(chan struct{})
	id.wg.Add(1)
	x.mu.Unlock()
	// Before the REP, whose answer lets the peer send.
	dev.takeRecvs(qo)
	go func() {
		defer id.wg.Done()
		ev := cmEvent{typ: cmEvEstablished, dev: uint32(dev.index), src: src, dst: dst}
		k, err := r.Accept(id.ctx, qp, p)
		close(returned)
		x := id.lock()
		id.req = nil
		x.mu.Unlock()
		if err != nil {
			failure(&ev, err, cmEvConnectError)
			if ev.typ == cmEvUnreachable {
				ev.typ = cmEvConnectError
			}
			x := id.lock()
			id.busy = false
			x.mu.Unlock()
			id.post(ev)
			return
		}
		ev.param = paramOf(k.Param())
		id.established(k, ev)
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
	x := id.lock()
	r := id.req
	if id.busy {
		r = nil
	}
	id.req = nil
	x.mu.Unlock()
	if r == nil {
		return fmt.Errorf("%w: cm_id %d has no connection request", syscall.EINVAL, id.h)
	}
	if err := r.Reject(q.priv); err != nil {
		return fmt.Errorf("%w: %v", syscall.ETIMEDOUT, err)
	}
	return nil
}

func (ch *cmChan) disconnect(id *cmID) error {
	x := id.lock()
	k := id.conn
	if k != nil {
		id.wg.Add(1)
	}
	x.mu.Unlock()
	if k == nil {
		return fmt.Errorf("%w: cm_id %d is not connected", syscall.EINVAL, id.h)
	}
	go func() {
		defer id.wg.Done()
		k.Disconnect(id.ctx)
	}()
	return nil
}

// destroyID frees an id as the kernel does: listeners close, a request
// not yet answered is rejected, a connection is disconnected (its DREQ
// goes out even though nobody waits for the answer).
func (ch *cmChan) destroyID(id *cmID) {
	x := id.lock()
	if x.ids[id.h] == id {
		delete(x.ids, id.h)
	}
	ls, r, k, busy := id.listening, id.req, id.conn, id.busy
	id.listening, id.req = nil, nil
	x.mu.Unlock()
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

// cmCleanup destroys what a closed channel left: every id still on it (so
// its connections are disconnected and its listeners closed; ids migrated
// away are the other channel's), then waits for their goroutines and
// closes the event socket.
func (c *client) cmCleanup() {
	ch := c.cm
	if ch == nil {
		return
	}
	cmChans.mu.Lock()
	delete(cmChans.m, ch.token)
	cmChans.mu.Unlock()
	ch.mu.Lock()
	ch.closed = true
	ids := make([]*cmID, 0, len(ch.ids))
	for _, id := range ch.ids {
		ids = append(ids, id)
	}
	ch.mu.Unlock()
	for _, id := range ids {
		ch.destroyID(id)
	}
	for _, id := range ids {
		id.wg.Wait()
	}
	ch.mu.Lock()
	unix.Close(ch.notify)
	unix.Close(ch.drain)
	ch.mu.Unlock()
}
