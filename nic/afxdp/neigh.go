package afxdp

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// ErrResolving says that the next hop of a destination is being resolved
// in the background: Send failed the packet rather than wait.
var ErrResolving = errors.New("resolution in progress")

// NeighbourError says that the link-layer address of a destination's next
// hop is not in the kernel's neighbour table (ARP for IPv4, NDP for IPv6).
// AF_XDP bypasses the kernel's output path, so it cannot resolve it on its
// own: the link asks the kernel to (by sending it one ordinary UDP
// datagram) and looks again for up to Config.ResolveWait before giving up.
// Send never waits for that: it fails the packet with Err = ErrResolving
// (NextHop not known yet) while the resolution runs in the background.
type NeighbourError struct {
	Dst, NextHop netip.Addr
	Ifname       string
	Err          error // the lookup failure, or ErrResolving
}

func (e *NeighbourError) Error() string {
	if errors.Is(e.Err, ErrResolving) {
		return fmt.Sprintf("afxdp: resolving the next hop (ARP/NDP) of %v on %s: packet dropped, not waited for", e.Dst, e.Ifname)
	}
	s := fmt.Sprintf("afxdp: no neighbour entry (ARP/NDP) for %v on %s", e.NextHop, e.Ifname)
	if e.NextHop != e.Dst {
		s += fmt.Sprintf(" (next hop to %v)", e.Dst)
	}
	s += ": is the peer up and on this link? check `ip neigh show dev " + e.Ifname + "`"
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *NeighbourError) Unwrap() error { return e.Err }

// RouteError says the destination is not reached through this link's
// interface.
type RouteError struct {
	Dst    netip.Addr
	Ifname string
	Err    error
}

func (e *RouteError) Error() string {
	return fmt.Sprintf("afxdp: no route to %v through %s: %v", e.Dst, e.Ifname, e.Err)
}

func (e *RouteError) Unwrap() error { return e.Err }

type neighEntry struct {
	mac     [6]byte
	err     error
	expires time.Time
}

// maxResolving bounds the resolutions running in the background at once.
const maxResolving = 16

// neighbours resolves destinations to MAC addresses through the kernel's
// routing and neighbour tables, over a netlink handle opened in the
// link's network namespace, and caches the answers. Send only reads the
// cache (lookupNoWait); a miss starts one background resolution per
// address, so that a peer that does not answer never stalls the sends to
// the others.
type neighbours struct {
	mu        sync.Mutex // guards m, resolving, closed
	m         map[netip.Addr]neighEntry
	resolving map[netip.Addr]struct{}
	closed    bool
	wg        sync.WaitGroup
	done      chan struct{} // closed by close: resolutions stop waiting

	nlMu     sync.Mutex // serialises requests on h
	h        *netlink.Handle
	ifindex  int
	ifname   string
	trigger4 *net.UDPConn // sends one datagram to make the kernel resolve
	trigger6 *net.UDPConn
	wait     time.Duration
	ttl      time.Duration
	// resolveFn is resolve; tests replace it.
	resolveFn func(dst netip.Addr) ([6]byte, error)
}

func newNeighbours(ifindex int, ifname string, wait time.Duration) (*neighbours, error) {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("open netlink: %w", err)
	}
	n := &neighbours{h: h, ifindex: ifindex, ifname: ifname, m: make(map[netip.Addr]neighEntry),
		resolving: make(map[netip.Addr]struct{}), done: make(chan struct{}), wait: wait, ttl: 5 * time.Second}
	n.resolveFn = n.resolve
	// Made now, in the caller's namespace; they keep it.
	n.trigger4, _ = net.ListenUDP("udp4", nil)
	n.trigger6, _ = net.ListenUDP("udp6", nil)
	return n, nil
}

// close stops the background resolutions, waits for them, and releases
// the sockets.
func (n *neighbours) close() {
	n.mu.Lock()
	n.closed = true
	n.mu.Unlock()
	close(n.done)
	n.wg.Wait()
	n.h.Close()
	if n.trigger4 != nil {
		n.trigger4.Close()
	}
	if n.trigger6 != nil {
		n.trigger6.Close()
	}
}

// cachedLocked returns the cached answer for dst, if fresh.
func (n *neighbours) cachedLocked(dst netip.Addr, now time.Time) (neighEntry, bool) {
	e, ok := n.m[dst]
	return e, ok && now.Before(e.expires)
}

// storeLocked caches an answer: a few seconds for a MAC address, one
// second for a failure (so that a dead peer is retried, but not on every
// packet).
func (n *neighbours) storeLocked(dst netip.Addr, mac [6]byte, err error, now time.Time) {
	ttl := n.ttl
	if err != nil {
		ttl = time.Second
	}
	if len(n.m) > 4096 {
		clear(n.m)
	}
	n.m[dst] = neighEntry{mac: mac, err: err, expires: now.Add(ttl)}
}

// lookupNoWait returns the cached MAC address of dst's next hop (or the
// cached failure). On a miss it reads the kernel's routing and neighbour
// tables once, without waiting: the kernel usually knows the peer already,
// from the TCP or CM exchange that set up the connection. Failing that, it
// starts resolving dst in the background, unless that is already under
// way or maxResolving resolutions are, and returns a *NeighbourError with
// ErrResolving at once. An address whose entry has aged out is refreshed
// in the background, but its last MAC address is used meanwhile (as the
// kernel uses a STALE entry while it probes), so that traffic to a peer
// does not lose a packet at every expiry.
func (n *neighbours) lookupNoWait(dst netip.Addr) ([6]byte, error) {
	n.mu.Lock()
	e, ok := n.m[dst]
	if ok && time.Now().Before(e.expires) {
		n.mu.Unlock()
		return e.mac, e.err
	}
	if ok && e.err == nil {
		n.startLocked(dst)
		n.mu.Unlock()
		return e.mac, nil
	}
	_, busy := n.resolving[dst]
	n.mu.Unlock()
	if !busy {
		if hop, err := n.nextHop(dst); err == nil {
			if mac, found := n.find(hop); found {
				n.mu.Lock()
				n.storeLocked(dst, mac, nil, time.Now())
				n.mu.Unlock()
				return mac, nil
			}
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.startLocked(dst)
	return [6]byte{}, &NeighbourError{Dst: dst, Ifname: n.ifname, Err: ErrResolving}
}

// startLocked starts resolving dst in the background unless that is
// under way or maxResolving resolutions are.
func (n *neighbours) startLocked(dst netip.Addr) {
	if _, busy := n.resolving[dst]; !busy && len(n.resolving) < maxResolving && !n.closed {
		n.resolving[dst] = struct{}{}
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			mac, err := n.resolveFn(dst)
			n.mu.Lock()
			n.storeLocked(dst, mac, err, time.Now())
			delete(n.resolving, dst)
			n.mu.Unlock()
		}()
	}
}

// lookup returns the MAC address of dst's next hop, resolving it now if
// it is not cached: it may wait up to the resolution timeout.
func (n *neighbours) lookup(dst netip.Addr) ([6]byte, error) {
	n.mu.Lock()
	e, ok := n.cachedLocked(dst, time.Now())
	n.mu.Unlock()
	if ok {
		return e.mac, e.err
	}
	mac, err := n.resolveFn(dst)
	n.mu.Lock()
	n.storeLocked(dst, mac, err, time.Now())
	n.mu.Unlock()
	return mac, err
}

func (n *neighbours) resolve(dst netip.Addr) ([6]byte, error) {
	hop, err := n.nextHop(dst)
	if err != nil {
		return [6]byte{}, err
	}
	if mac, ok := n.find(hop); ok {
		return mac, nil
	}
	// Have the kernel resolve it: one datagram to the discard port goes
	// out through its normal path, which sends the ARP request or
	// neighbour solicitation; the reply is passed up by the XDP program.
	tr := n.trigger4
	if hop.Is6() {
		tr = n.trigger6
	}
	if tr != nil {
		tr.WriteToUDPAddrPort([]byte("softroce neighbour resolution"), netip.AddrPortFrom(hop, 9))
	}
	giveUp := time.NewTimer(n.wait)
	defer giveUp.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-n.done:
			return [6]byte{}, &NeighbourError{Dst: dst, NextHop: hop, Ifname: n.ifname, Err: net.ErrClosed}
		case <-giveUp.C:
			return [6]byte{}, &NeighbourError{Dst: dst, NextHop: hop, Ifname: n.ifname}
		case <-tick.C:
			if mac, ok := n.find(hop); ok {
				return mac, nil
			}
		}
	}
}

// nextHop asks the kernel's routing table how dst is reached.
func (n *neighbours) nextHop(dst netip.Addr) (netip.Addr, error) {
	n.nlMu.Lock()
	defer n.nlMu.Unlock()
	routes, err := n.h.RouteGet(dst.AsSlice())
	if err != nil {
		return netip.Addr{}, &RouteError{Dst: dst, Ifname: n.ifname, Err: err}
	}
	if len(routes) == 0 {
		return netip.Addr{}, &RouteError{Dst: dst, Ifname: n.ifname, Err: errors.New("no route")}
	}
	r := routes[0]
	if r.LinkIndex != n.ifindex {
		name := fmt.Sprint(r.LinkIndex)
		if l, err := n.h.LinkByIndex(r.LinkIndex); err == nil {
			name = l.Attrs().Name
		}
		return netip.Addr{}, &RouteError{Dst: dst, Ifname: n.ifname, Err: fmt.Errorf("the kernel routes it through %s", name)}
	}
	if gw, ok := netip.AddrFromSlice(r.Gw); ok && gw.IsValid() && !gw.IsUnspecified() {
		return gw.Unmap(), nil
	}
	return dst, nil
}

// usable neighbour states: those with a link-layer address the kernel
// itself would send to.
const usableNUD = netlink.NUD_REACHABLE | netlink.NUD_STALE | netlink.NUD_DELAY | netlink.NUD_PROBE | netlink.NUD_PERMANENT | netlink.NUD_NOARP

func (n *neighbours) find(hop netip.Addr) ([6]byte, bool) {
	fam := netlink.FAMILY_V4
	if hop.Is6() {
		fam = netlink.FAMILY_V6
	}
	n.nlMu.Lock()
	list, err := n.h.NeighList(n.ifindex, fam)
	n.nlMu.Unlock()
	if err != nil {
		return [6]byte{}, false
	}
	for _, e := range list {
		ip, ok := netip.AddrFromSlice(e.IP)
		if !ok || ip.Unmap() != hop || e.State&usableNUD == 0 || len(e.HardwareAddr) != 6 {
			continue
		}
		return [6]byte(e.HardwareAddr), true
	}
	return [6]byte{}, false
}
