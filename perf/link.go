package perf

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	"syscall"

	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/nic/afxdp"
	"github.com/softroce/softroce/nic/udp"
)

// Opener returns the LinkOpener of a bw or lat run over backend ("udp":
// kernel sockets; "afxdp": AF_XDP, root) on UDP port port. A valid bind
// overrides the address the out-of-band connection was made from.
func Opener(backend string, bind netip.Addr, port int) LinkOpener {
	return func(local netip.Addr) (nic.Link, uint16, error) {
		if bind.IsValid() {
			local = bind
		}
		return OpenLink(backend, local, port)
	}
}

// OpenLink opens the data link of the chosen backend on local's interface
// and returns it with the UDP port it listens on.
func OpenLink(backend string, local netip.Addr, port int) (nic.Link, uint16, error) {
	if err := CheckLocal(local); err != nil {
		return nil, 0, fmt.Errorf("%v: %w", local, err)
	}
	ifi, err := interfaceOf(local)
	if err != nil {
		return nil, 0, fmt.Errorf("%v: %w", local, err)
	}
	switch backend {
	case "afxdp":
		l, err := afxdp.Open(afxdp.Config{Interface: ifi.Name, Addr: local, Port: port, Queues: rxQueues(ifi.Name)})
		if err != nil {
			return nil, 0, fmt.Errorf("AF_XDP on %s: %w", ifi.Name, err)
		}
		return l, uint16(port), nil
	default:
		l, err := udp.Open(udp.Config{Addr: local, Port: port, MTU: ifi.MTU, SocketBuffer: udpSocketBuffer})
		if err != nil {
			if errors.Is(err, syscall.EADDRINUSE) {
				return nil, 0, fmt.Errorf("UDP port %d on %v is in use (another softroce, or a kernel RoCE device?): pick another with --udp-port", port, local)
			}
			return nil, 0, err
		}
		return l, l.LocalAddrPort().Port(), nil
	}
}

// ParsePeer reads "10.1.1.2", "10.1.1.2:18515", "[fd00::2]:18515" or a
// host name; port is the one to use when s names none.
func ParsePeer(s string, port int) (netip.AddrPort, error) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap, nil
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return netip.AddrPortFrom(a, uint16(port)), nil
	}
	addrs, err := net.LookupHost(s)
	if err != nil || len(addrs) == 0 {
		return netip.AddrPort{}, fmt.Errorf("peer %q: not an address, and it does not resolve: %v", s, err)
	}
	a, err := netip.ParseAddr(addrs[0])
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("peer %q: %v", s, err)
	}
	return netip.AddrPortFrom(a.Unmap(), uint16(port)), nil
}

// CheckLocal tells whether addr belongs to this host, by binding it.
func CheckLocal(addr netip.Addr) error {
	c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(addr, 0)))
	if err != nil {
		if errors.Is(err, syscall.EADDRNOTAVAIL) {
			return errors.New("no local interface has this address")
		}
		return err
	}
	return c.Close()
}

// interfaceOf finds the interface whose network holds addr (127.0.0.2 is
// on lo although lo's address is 127.0.0.1).
func interfaceOf(addr netip.Addr) (*net.Interface, error) {
	if ifi, err := udp.InterfaceOf(addr); err == nil {
		return ifi, nil
	}
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	for i := range ifs {
		as, _ := ifs[i].Addrs()
		for _, a := range as {
			if pn, ok := a.(*net.IPNet); ok && pn.Contains(net.IP(addr.AsSlice())) {
				return &ifs[i], nil
			}
		}
	}
	return nil, errors.New("no local interface has this address")
}

// rxQueues counts the interface's active receive queues in sysfs (0 when
// unknown: the backend decides). The netlink attribute a backend may read
// instead is the number allocated, which on a veth made by `ip link add`
// is the CPU count even though one queue is active, and binding an AF_XDP
// socket to an inactive queue fails.
func rxQueues(ifname string) int {
	m, _ := filepath.Glob("/sys/class/net/" + ifname + "/queues/rx-*")
	return len(m)
}

// udpSocketBuffer is the socket buffer asked for (the kernel caps it at
// net.core.rmem_max / wmem_max). A bandwidth run keeps tx-depth messages
// in flight; with the 208 KiB default the receiver's socket overflows and
// every drop costs a go-back-N retransmission.
const udpSocketBuffer = 4 << 20
