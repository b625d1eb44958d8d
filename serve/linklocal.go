package serve

import (
	"fmt"
	"net/netip"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/nic/udp"
	"github.com/softroce/softroce/verbs"
)

// linkLocal is a device's IPv6 link-local GID: its index, its address and
// the index of the interface it is on, in the network namespace the
// device's sockets were opened in (the namespace of the daemon's
// programs). rdma_cm binds and resolves such an address only with a scope
// id that names that interface, as the kernel's rdma_cm binds it to the
// device of the network interface the scope id names.
type linkLocal struct {
	index int
	addr  netip.Addr
	scope uint32 // 0: unknown (no socket bound to it); then nothing binds it
}

// linkLocalOf finds v's link-local GID and the interface of the socket
// bound to it: getsockname gives a link-local socket's address with the
// scope id it was bound with.
func linkLocalOf(v *verbs.Device) linkLocal {
	ll := linkLocal{index: -1}
	for i, g := range v.GIDTable() {
		if a := g.Addr; isLinkLocal(a) {
			ll.index, ll.addr = i, a.WithZone("")
			break
		}
	}
	if ll.index < 0 {
		return ll
	}
	type controlSocket interface{ ControlSocket(func(fd uintptr)) error }
	var socks []controlSocket
	l := v.Link()
	for {
		// A wrapper (softroce serve --impair) over the sockets.
		w, ok := l.(interface{ Inner() nic.Link })
		if !ok {
			break
		}
		l = w.Inner()
	}
	switch l := l.(type) {
	case *udp.Multi:
		for _, x := range l.Links() {
			socks = append(socks, x)
		}
	case controlSocket:
		socks = append(socks, l)
	}
	for _, c := range socks {
		c.ControlSocket(func(fd uintptr) {
			sa, err := unix.Getsockname(int(fd))
			if s6, ok := sa.(*unix.SockaddrInet6); ok && err == nil && netip.AddrFrom16(s6.Addr) == ll.addr {
				ll.scope = s6.ZoneId
			}
		})
		if ll.scope != 0 {
			break
		}
	}
	return ll
}

// scoped is the device's link-local address with its scope id as zone (as
// decodeSockaddr gives a program's).
func (ll linkLocal) scoped() netip.Addr {
	return ll.addr.WithZone(strconv.FormatUint(uint64(ll.scope), 10))
}

// linkLocalDev is the device a link-local address with a scope id binds
// to, as the kernel's rdma_bind_addr binds it: the scope id is required
// (without one, EINVAL: cma_check_linklocal), and the address must be the
// link-local GID of the device on the interface it names; any other
// interface or address is ENODEV, the kernel's answer when the network
// interface the scope id names has no RDMA device with that GID
// (rdma_translate_ip, then cma_acquire_dev_by_src_ip).
func (s *Server) linkLocalDev(a netip.Addr) (*device, error) {
	scope := scopeOf(a)
	if scope == 0 {
		return nil, fmt.Errorf("%w: link-local %v without a scope id (%v%%IFNAME)", syscall.EINVAL, a, a)
	}
	for _, d := range s.devs {
		if d.ll.onScope(scope) && d.ll.addr == a.WithZone("") {
			return d, nil
		}
	}
	return nil, fmt.Errorf("%w: %v is no device's link-local address on interface %d", syscall.ENODEV, a.WithZone(""), scope)
}

// scopeDev is the device whose link-local GID is on the interface scope
// names, or nil.
func (s *Server) scopeDev(scope uint32) *device {
	for _, d := range s.devs {
		if d.ll.onScope(scope) {
			return d
		}
	}
	return nil
}

// onScope says whether scope (a sin6_scope_id) names the interface of the
// device's link-local GID.
func (ll linkLocal) onScope(scope uint32) bool {
	return ll.index >= 0 && ll.scope != 0 && ll.scope == scope
}
