package udp

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/nic"
)

// Multi is a nic.Link over several addresses of one interface, one Link
// (socket) per address: a kernel RoCE device's GID table has an entry per
// address, the IPv6 link-local one first, and a device on a Multi gets
// the same table from Addrs, in the order given to OpenMulti.
//
// Send hands each run of packets to the Link of its source (Packet.Local)
// or, without one, to the Link of its destination's family and scope
// (link-local or not). Receiving waits on all sockets at once through one
// epoll descriptor in the runtime poller, then drains each socket with
// non-blocking batches: no goroutine per socket, nothing allocated per
// packet.
type Multi struct {
	links []*Link
	addrs []netip.Addr
	ep    *sock // epoll set of the receiving sockets (waited on as a socket is)
	batch int

	rxMu sync.Mutex
	next int    // the Link a receive pass starts with (fairness)
	more []bool // per Link: its last receive may have left packets
	// Recv and TryRecv's state and callbacks, bound once so that a
	// receive allocates nothing (under rxMu).
	rxPkts []nic.Packet
	rxN    int
	rxErr  error
	stopFn func(n int) bool
	readFn func(uintptr) bool
	each   multiEach // RecvEachUntil's state

	closed   atomic.Bool
	txErrors atomic.Uint64
}

var _ nic.Link = (*Multi)(nil)

// OpenMulti opens one Link per address in addrs, each with cfg (its Addr
// replaced), and joins them. Link-local IPv6 addresses need their zone
// (see Config.Addr).
func OpenMulti(cfg Config, addrs ...netip.Addr) (*Multi, error) {
	if len(addrs) == 0 {
		return nil, errors.New("udp: no local address given")
	}
	m := &Multi{}
	fail := func(err error) (*Multi, error) {
		for _, l := range m.links {
			l.Close()
		}
		if m.ep != nil {
			m.ep.Close()
		}
		return nil, err
	}
	for _, a := range addrs {
		c := cfg
		c.Addr = a
		l, err := Open(c)
		if err != nil {
			return fail(err)
		}
		m.links = append(m.links, l)
		m.addrs = append(m.addrs, l.local.Addr())
	}
	m.batch = m.links[0].batch
	m.more = make([]bool, len(m.links))
	m.stopFn = func(n int) bool { m.rxN = n; return false }
	m.readFn = func(uintptr) bool {
		_, m.rxErr = m.pass(m.rxPkts, true, m.stopFn)
		return m.rxN > 0 || m.rxErr != nil
	}
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return fail(fmt.Errorf("udp: epoll: %w", err))
	}
	if m.ep, err = newSock(epfd); err != nil {
		unix.Close(epfd)
		return fail(fmt.Errorf("udp: epoll: %w", err))
	}
	for _, l := range m.links {
		var cerr error
		err := l.rx.rc.Control(func(fd uintptr) {
			cerr = unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, int(fd), &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)})
		})
		if err == nil {
			err = cerr
		}
		if err != nil {
			return fail(fmt.Errorf("udp: add the socket of %v to epoll: %w", l.local, err))
		}
	}
	// The epoll descriptor is readable while a member socket is: a
	// receive waits on it like on a socket.
	return m, nil
}

// Links are the Links joined, in the order of Addrs.
func (m *Multi) Links() []*Link { return m.links }

// Addrs implements nic.Link: the addresses in the order given to
// OpenMulti. The slice is shared: do not modify it.
func (m *Multi) Addrs() []netip.Addr { return m.addrs }

// BatchSize implements nic.Link.
func (m *Multi) BatchSize() int { return m.batch }

// MTU implements nic.Link: the smallest of the Links' (one interface's
// addresses share its MTU).
func (m *Multi) MTU() int {
	mtu := m.links[0].mtu
	for _, l := range m.links[1:] {
		mtu = min(mtu, l.mtu)
	}
	return mtu
}

// ControlSocket runs f with the first Link's socket (see Link.ControlSocket).
func (m *Multi) ControlSocket(f func(fd uintptr)) error { return m.links[0].ControlSocket(f) }

// Stats implements nic.Link: the sums of the Links' counters.
func (m *Multi) Stats() nic.Stats {
	var s nic.Stats
	for _, l := range m.links {
		t := l.Stats()
		s.RxPackets += t.RxPackets
		s.TxPackets += t.TxPackets
		s.RxBytes += t.RxBytes
		s.TxBytes += t.TxBytes
		s.RxICRCVerified += t.RxICRCVerified
		s.RxICRCPartial += t.RxICRCPartial
		s.RxICRCUnverified += t.RxICRCUnverified
		s.RxUnverifiedIPOptions += t.RxUnverifiedIPOptions
		s.RxUnverifiedOff += t.RxUnverifiedOff
		s.RxICRCBad += t.RxICRCBad
		s.RxMalformed += t.RxMalformed
		s.RxTruncated += t.RxTruncated
		s.TxErrors += t.TxErrors
	}
	s.TxErrors += m.txErrors.Load()
	return s
}

// Close implements nic.Link.
func (m *Multi) Close() error {
	if m.closed.Swap(true) {
		return net.ErrClosed
	}
	m.ep.Close()
	for _, l := range m.links {
		l.Close()
	}
	return nil
}

// linkFor returns the Link p goes out of: the one of its source address,
// or without one the first of its destination's family and scope; nil
// when none fits.
func (m *Multi) linkFor(p *nic.Packet) *Link {
	if p.Local.IsValid() {
		local := p.Local.Unmap().WithZone("")
		for _, l := range m.links {
			if l.local.Addr() == local {
				return l
			}
		}
		return nil
	}
	dst := p.Remote.Addr().Unmap()
	ll := dst.Is6() && dst.IsLinkLocalUnicast()
	for _, l := range m.links {
		a := l.local.Addr()
		if a.Is4() == dst.Is4() && (a.Is6() && a.IsLinkLocalUnicast()) == ll {
			return l
		}
	}
	return nil
}

// Send implements nic.Link: each run of packets for one Link is one Send
// of that Link, with its contract.
func (m *Multi) Send(pkts []nic.Packet) (int, error) { return m.send(pkts, false) }

// SendRaw implements nic.RawSender (see Link.SendRaw).
func (m *Multi) SendRaw(pkts []nic.Packet) (int, error) { return m.send(pkts, true) }

// PutICRC implements nic.RawSender.
func (m *Multi) PutICRC(p *nic.Packet) error {
	l := m.linkFor(p)
	if l == nil {
		return fmt.Errorf("udp: no address of %v can send to %v", m.addrs, p.Remote)
	}
	return l.PutICRC(p)
}

func (m *Multi) send(pkts []nic.Packet, raw bool) (int, error) {
	if m.closed.Load() {
		return 0, fmt.Errorf("udp: send: %w", net.ErrClosed)
	}
	for i := 0; i < len(pkts); {
		l := m.linkFor(&pkts[i])
		j := i + 1
		for j < len(pkts) && m.linkFor(&pkts[j]) == l {
			j++
		}
		if l == nil {
			m.txErrors.Add(uint64(j - i))
			i = j
			continue
		}
		var n int
		var err error
		if raw {
			n, err = l.SendRaw(pkts[i:j])
		} else {
			n, err = l.Send(pkts[i:j])
		}
		if err != nil {
			return i + n, err
		}
		i = j
	}
	return len(pkts), nil
}

// pass receives one batch from each Link in turn, non-blocking, calling
// got for each non-empty one, and reports whether a Link may have more.
// The first pass after a wake-up tries every Link; later ones only those
// whose last receive may have left packets (a full batch, or segments of
// a coalesced datagram not handed out yet): a socket that returned fewer
// datagrams than asked for was empty then, and a datagram that arrived
// since makes the epoll descriptor ready again. got returning false ends
// the pass.
func (m *Multi) pass(pkts []nic.Packet, first bool, got func(n int) bool) (bool, error) {
	more := false
	k := len(m.links)
	for i := 0; i < k; i++ {
		j := (m.next + i) % k
		if !first && !m.more[j] {
			continue
		}
		l := m.links[j]
		n, err := l.recv(pkts, true)
		if err != nil {
			return more, err
		}
		m.more[j] = n > 0 && l.pending()
		more = more || m.more[j]
		if n > 0 && !got(n) {
			m.next = (j + 1) % k
			return true, nil
		}
	}
	return more, nil
}

// Recv implements nic.Link: it blocks until some Link has packets.
func (m *Multi) Recv(pkts []nic.Packet) (int, error) {
	if len(pkts) == 0 {
		return 0, nil
	}
	m.rxMu.Lock()
	defer m.rxMu.Unlock()
	m.rxPkts, m.rxN, m.rxErr = pkts, 0, nil
	err := m.ep.Read(m.readFn)
	for err == errInterrupted { // an Interrupt is for RecvEachUntil
		err = m.ep.Read(m.readFn)
	}
	m.rxPkts = nil
	return m.rxN, m.recvErr(err, m.rxErr)
}

// TryRecv is Recv without waiting (see Link.TryRecv).
func (m *Multi) TryRecv(pkts []nic.Packet) (int, error) {
	if len(pkts) == 0 {
		return 0, nil
	}
	m.rxMu.Lock()
	defer m.rxMu.Unlock()
	m.rxN = 0
	_, err := m.pass(pkts, true, m.stopFn)
	return m.rxN, m.recvErr(nil, err)
}

// Drain is TryRecv for a receiver that is not polling (see Link.Drain).
func (m *Multi) Drain(pkts []nic.Packet) (int, error) { return m.TryRecv(pkts) }

// RecvEach receives until the link is closed or fails, calling deliver
// for each batch (see Link.RecvEach).
func (m *Multi) RecvEach(pkts []nic.Packet, deliver func(n int)) error {
	return m.RecvEachUntil(pkts, deliver, nil)
}

// RecvEachUntil is RecvEach that also returns, with a nil error, once stop
// reports true (see Link.RecvEachUntil): stop is asked before the first
// wait, after each deliver, and whenever Interrupt wakes the wait. It
// waits once every socket was found drained (pass); a packet that
// arrives after that makes the epoll descriptor ready again, so the wait
// ends at once.
func (m *Multi) RecvEachUntil(pkts []nic.Packet, deliver func(n int), stop func() bool) error {
	return m.recvEachUntil(pkts, deliver, stop, false)
}

// WaitEachUntil is RecvEachUntil waiting in a system call (see
// Link.WaitEachUntil).
func (m *Multi) WaitEachUntil(pkts []nic.Packet, deliver func(n int), stop func() bool) error {
	return m.recvEachUntil(pkts, deliver, stop, true)
}

func (m *Multi) recvEachUntil(pkts []nic.Packet, deliver func(n int), stop func() bool, kernel bool) error {
	if len(pkts) == 0 {
		return errors.New("udp: RecvEach with no buffers")
	}
	m.rxMu.Lock()
	defer m.rxMu.Unlock()
	e := &m.each
	e.pkts, e.deliver, e.stop, e.fail, e.stopped = pkts, deliver, stop, nil, false
	defer func() { e.pkts, e.deliver, e.stop = nil, nil, nil }()
	if e.fn == nil {
		// Bound once: closures per call would allocate.
		e.m, e.fn, e.gotFn = m, e.step, e.got
	}
	if done, err := m.ep.waitEach(e.fn, stop, kernel, &e.stopped, &e.fail); !done {
		return m.recvErr(err, e.fail)
	}
	return nil
}

// multiEach is Multi.RecvEachUntil's state (under rxMu).
type multiEach struct {
	m       *Multi
	pkts    []nic.Packet
	deliver func(n int)
	stop    func() bool
	fail    error
	stopped bool
	fn      func(uintptr) bool // step
	gotFn   func(n int) bool   // got
}

// got delivers n packets and reports whether to go on.
func (e *multiEach) got(n int) bool {
	e.deliver(n)
	e.stopped = e.stop != nil && e.stop()
	return !e.stopped
}

// step passes over the Links until they are empty (false: wait) or stop
// or an error says to return (true).
func (e *multiEach) step(uintptr) bool {
	for first := true; ; first = false {
		more, err := e.m.pass(e.pkts, first, e.gotFn)
		if err != nil {
			e.fail = err
			return true
		}
		if e.stopped {
			return true
		}
		if !more {
			return false
		}
	}
}

// Interrupt wakes a RecvEachUntil waiting for packets (see
// Link.Interrupt).
func (m *Multi) Interrupt() { m.ep.Interrupt() }

// recvErr maps a receive's errors: the poller's (err) and a Link's (fail).
func (m *Multi) recvErr(err, fail error) error {
	if err == nil && fail == nil {
		return nil
	}
	if m.closed.Load() || errors.Is(err, os.ErrClosed) || errors.Is(fail, net.ErrClosed) {
		return net.ErrClosed
	}
	if fail != nil {
		return fail
	}
	return fmt.Errorf("udp: wait on %v: %w", m.addrs, err)
}
