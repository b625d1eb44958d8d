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

// NeighbourError says that the link-layer address of a destination's next
// hop is not in the kernel's neighbour table (ARP for IPv4, NDP for IPv6).
// AF_XDP bypasses the kernel's output path, so it cannot resolve it on its
// own: the link asks the kernel to (by sending it one ordinary UDP
// datagram) and looks again once before giving up.
type NeighbourError struct {
	Dst, NextHop netip.Addr
	Ifname       string
	Err          error // the lookup failure, if any
}

func (e *NeighbourError) Error() string {
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

// neighbours resolves destinations to MAC addresses through the kernel's
// routing and neighbour tables, over a netlink handle opened in the
// link's network namespace, and caches the answers.
type neighbours struct {
	mu       sync.Mutex
	h        *netlink.Handle
	ifindex  int
	ifname   string
	m        map[netip.Addr]neighEntry
	trigger4 *net.UDPConn // sends one datagram to make the kernel resolve
	trigger6 *net.UDPConn
	wait     time.Duration
	ttl      time.Duration
}

func newNeighbours(ifindex int, ifname string, wait time.Duration) (*neighbours, error) {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("open netlink: %w", err)
	}
	n := &neighbours{h: h, ifindex: ifindex, ifname: ifname, m: make(map[netip.Addr]neighEntry), wait: wait, ttl: 5 * time.Second}
	// Made now, in the caller's namespace; they keep it.
	n.trigger4, _ = net.ListenUDP("udp4", nil)
	n.trigger6, _ = net.ListenUDP("udp6", nil)
	return n, nil
}

func (n *neighbours) close() {
	n.h.Close()
	if n.trigger4 != nil {
		n.trigger4.Close()
	}
	if n.trigger6 != nil {
		n.trigger6.Close()
	}
}

// lookup returns the MAC address of dst's next hop. Answers are cached for
// a few seconds (failures for one second, so that a dead peer does not
// make every send wait).
func (n *neighbours) lookup(dst netip.Addr) ([6]byte, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	now := time.Now()
	if e, ok := n.m[dst]; ok && now.Before(e.expires) {
		return e.mac, e.err
	}
	mac, err := n.resolve(dst)
	ttl := n.ttl
	if err != nil {
		ttl = time.Second
	}
	if len(n.m) > 4096 {
		clear(n.m)
	}
	n.m[dst] = neighEntry{mac: mac, err: err, expires: now.Add(ttl)}
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
	deadline := time.Now().Add(n.wait)
	for time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		if mac, ok := n.find(hop); ok {
			return mac, nil
		}
	}
	return [6]byte{}, &NeighbourError{Dst: dst, NextHop: hop, Ifname: n.ifname}
}

// nextHop asks the kernel's routing table how dst is reached.
func (n *neighbours) nextHop(dst netip.Addr) (netip.Addr, error) {
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
	list, err := n.h.NeighList(n.ifindex, fam)
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
