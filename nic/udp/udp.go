// Package udp is the portable, unprivileged nic.Link: a kernel UDP socket
// bound to the RoCEv2 port (4791) on one local address, IPv4 or IPv6, with
// batched sendmmsg through golang.org/x/net's ipv4 and ipv6 PacketConn
// WriteBatch, and recvmmsg(2) issued directly so that receiving allocates
// nothing (x/net's ReadBatch allocates each datagram's source address).
//
// # What the ICRC covers, and what this link can check
//
// The RoCEv2 ICRC (IBTA annex A17.3.3) covers the IP header, including the
// IPv4 Identification field, which the kernel chooses. An unconnected socket
// with IP_MTU_DISCOVER = IP_PMTUDISC_DO makes Linux send ID 0 with DF set
// (docs/platform.md), so Send computes the ICRC over exactly the header
// the kernel will send (icrc.Synth with ID 0, DF), and a peer that checks
// the ICRC over the real header (kernel rdma_rxe, a RoCE NIC, nic/afxdp)
// accepts it. The source port is always the bound port: Packet.SrcPort is
// ignored.
//
// On receive a UDP socket sees neither the peer's IPv4 header nor its ID.
//   - IPv6: every field the ICRC covers is known (addresses from the
//     socket and IPV6_PKTINFO, ports, lengths; traffic class, flow label
//     and hop limit are masked), so the full ICRC is verified: packets
//     with a bad ICRC are dropped and counted in Stats.RxICRCBad, good ones
//     are marked nic.ICRCVerified.
//   - IPv4, raw socket (IPv4CheckRaw; IPv4CheckAuto when the process has
//     root or CAP_NET_RAW): datagrams are read from a raw IPv4 socket that
//     shows the header, options and all, and the full ICRC is verified as
//     for IPv6 (nic.ICRCVerified). nic/afxdp verifies it too.
//   - IPv4, unprivileged (IPv4CheckSolve; IPv4CheckAuto without the
//     privilege): the peer's ID (rxe and NICs send non-zero IDs) is
//     recovered from the ICRC itself (icrc.SolveIPv4ID), which leaves 16
//     of its 32 bits as a check: a corrupted packet passes with
//     probability 2^-16. Good packets are marked nic.ICRCPartial and
//     counted in Stats.RxICRCPartial; a packet that no ID explains is
//     dropped as RxICRCBad. The socket hides the DF flag and the IP
//     options too, which the ICRC also covers. DF is taken to be set, as
//     rxe and RoCE NICs send it, except on a datagram the kernel
//     reassembled (IP_RECVFRAGSIZE says so), which was sent without it;
//     a peer that sends unfragmented packets without DF fails the check
//     on every packet (it shows as RxICRCBad). A packet with IP options
//     (IP_RECVOPTS shows them, but possibly not as the peer hashed them)
//     is delivered unchecked, marked nic.ICRCUnverified and counted in
//     Stats.RxUnverifiedIPOptions.
//   - IPv4CheckNone: no check; packets are marked nic.ICRCUnverified and
//     counted in Stats.RxUnverifiedOff.
package udp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/icrc"
	"github.com/softroce/softroce/nic"
)

// DefaultBatch is the batch size used when Config.Batch is 0.
const DefaultBatch = 32

// DefaultSocketBuffer is the socket buffer size used when
// Config.SocketBuffer is 0.
const DefaultSocketBuffer = 4 << 20

// Config describes the socket to open.
type Config struct {
	// Addr is the local address to bind: a specific IPv4 or IPv6 address
	// of an interface of this host (the ICRC covers the source address,
	// so the wildcard address is refused). An IPv6 link-local address
	// names its interface in its zone (fe80::1%eth0): the socket is then
	// bound to that interface, which scopes the link-local destinations
	// it sends to. Addrs and received packets carry addresses without
	// zones.
	Addr netip.Addr
	// Port is the UDP port (0: 4791, the RoCEv2 port).
	Port int
	// MTU is the IP MTU (0: the MTU of the interface that owns Addr).
	MTU int
	// Batch is the largest batch per system call (0: DefaultBatch).
	Batch int
	// IPv4Check chooses how the ICRC of received IPv4 packets is checked
	// (see the package doc); ignored for IPv6, which is always verified.
	// The zero value, IPv4CheckAuto, checks by default.
	IPv4Check IPv4Check
	// VerifyIPv4 is IPv4Check = IPv4CheckRaw, kept for existing callers.
	VerifyIPv4 bool
	// SocketBuffer is the size asked for SO_RCVBUF and SO_SNDBUF (0:
	// DefaultSocketBuffer; negative: leave the kernel's default). With
	// CAP_NET_ADMIN it is forced past net.core.rmem_max/wmem_max. A RoCE
	// sender bursts a whole message window: a receive buffer that cannot
	// hold it drops the tail of every burst, and go-back-N resends it.
	SocketBuffer int
	// GSO chooses UDP segmentation offload on send (UDP_SEGMENT): the
	// packets of one Send batch to one peer of one size go out as one
	// super-packet, each packet's ICRC computed for the IPv4 ID the
	// kernel gives its segment. OffloadAuto: on when the kernel supports
	// it; a path that cannot segment turns it off at the first refusal.
	GSO Offload
	// GRO chooses UDP receive coalescing (UDP_GRO), with coalesced
	// datagrams split by their segment size on Recv. It also makes the
	// IPv4CheckRaw socket split super-packets from a GSO sender, which a
	// raw socket sees unsegmented. OffloadAuto: on when supported.
	GRO Offload
}

// IPv4Check is how a Link checks the ICRC of IPv4 packets it receives.
type IPv4Check uint8

const (
	// IPv4CheckAuto is IPv4CheckRaw when the process may open a raw
	// socket (root or CAP_NET_RAW), IPv4CheckSolve otherwise.
	IPv4CheckAuto IPv4Check = iota
	// IPv4CheckRaw receives IPv4 through a raw socket that shows the
	// header: the full ICRC is verified (nic.ICRCVerified). Open fails
	// without root or CAP_NET_RAW.
	IPv4CheckRaw
	// IPv4CheckSolve recovers the peer's IPv4 ID from the ICRC and checks
	// the remaining 16 bits (nic.ICRCPartial). No privilege needed.
	IPv4CheckSolve
	// IPv4CheckNone does not check (nic.ICRCUnverified).
	IPv4CheckNone
)

func (c IPv4Check) String() string {
	switch c {
	case IPv4CheckAuto:
		return "auto"
	case IPv4CheckRaw:
		return "raw"
	case IPv4CheckSolve:
		return "solve"
	case IPv4CheckNone:
		return "none"
	}
	return "unknown"
}

// Link is a nic.Link over a kernel UDP socket.
type Link struct {
	sock   *sock // the UDP socket, out of the runtime poller
	local  netip.AddrPort
	addrs  []netip.Addr
	v6     bool
	defHop uint8     // the TTL (hop limit) the socket sends without a control message
	check  IPv4Check // as resolved by Open: never IPv4CheckAuto on IPv4
	mtu    int
	batch  int
	closed atomic.Bool

	rxMu sync.Mutex
	rx   *receiver
	each eachLoop // RecvEachUntil's state (under rxMu)
	// raw is the raw IPv4 socket of Config.VerifyIPv4 (nil without).
	raw        *sock
	rawScratch []byte

	txMu  sync.Mutex
	tx    *sender
	gsoOn bool // under txMu: runs go out as GSO super-packets
	gro   bool // the receiver coalesces (or splits super-packets)

	gsoFallbacks atomic.Uint64
	gsoSends     atomic.Uint64
	gsoSegments  atomic.Uint64
	rxPolled     atomic.Uint64
	rxSplit      atomic.Uint64

	rxPackets, txPackets atomic.Uint64
	rxBytes, txBytes     atomic.Uint64
	rxVerified           atomic.Uint64
	rxPartial            atomic.Uint64
	rxUnvOptions         atomic.Uint64
	rxUnvOff             atomic.Uint64
	rxBad                atomic.Uint64
	rxMalformed          atomic.Uint64
	rxTruncated          atomic.Uint64
	txErrors             atomic.Uint64
}

var _ nic.RawSender = (*Link)(nil)

// oobSize fits the control messages a datagram can carry: IP_PKTINFO (or
// IPV6_PKTINFO), IP_RECVFRAGSIZE, the TTL and TOS (hop limit, traffic
// class and flow information), UDP_GRO and up to 40 bytes of IP_OPTIONS.
const oobSize = 256

// ipv6FlowInfo is IPV6_FLOWINFO (linux/in6.h): as a socket option it asks
// for the flow information of received datagrams.
const ipv6FlowInfo = 11

// Open binds the socket and prepares its batches.
func Open(cfg Config) (*Link, error) {
	zone := cfg.Addr.Zone()
	addr := cfg.Addr.Unmap().WithZone("")
	if !addr.IsValid() {
		return nil, errors.New("udp: no local address given")
	}
	if addr.IsUnspecified() || addr.IsMulticast() {
		return nil, fmt.Errorf("udp: %v: need a specific unicast address of this host (the ICRC covers the source address)", addr)
	}
	var ifi *net.Interface
	if addr.Is6() && addr.IsLinkLocalUnicast() {
		if zone == "" {
			return nil, fmt.Errorf("udp: link-local %v needs its interface: %v%%IFNAME", addr, addr)
		}
		var err error
		if ifi, err = interfaceByZone(zone); err != nil {
			return nil, fmt.Errorf("udp: %v%%%s: %w", addr, zone, err)
		}
		zone = ifi.Name
	} else {
		zone = ""
	}
	port := cfg.Port
	if port == 0 {
		port = nic.RoCEv2Port
	}
	if port < 0 || port > 65535 {
		return nil, fmt.Errorf("udp: bad port %d", port)
	}
	batch := cfg.Batch
	if batch <= 0 {
		batch = DefaultBatch
	}
	mtu := cfg.MTU
	if mtu == 0 {
		if ifi == nil {
			var err error
			if ifi, err = InterfaceOf(addr); err != nil {
				return nil, fmt.Errorf("udp: find the MTU of %v: %w", addr, err)
			}
		}
		mtu = ifi.MTU
	}
	v6 := addr.Is6()
	if mtu-nic.Overhead(v6) < 12+icrc.Len {
		return nil, fmt.Errorf("udp: MTU %d is too small for a RoCE packet", mtu)
	}
	network := "udp4"
	if v6 {
		network = "udp6"
	}
	la := net.UDPAddrFromAddrPort(netip.AddrPortFrom(addr.WithZone(zone), uint16(port)))
	conn, err := net.ListenUDP(network, la)
	if err != nil {
		switch {
		case errors.Is(err, syscall.EADDRINUSE):
			return nil, fmt.Errorf("udp: UDP port %d on %v is in use: is another RoCE stack (rdma_rxe) or softroce running? choose another UDP port (Config.Port): %w", port, addr, err)
		case errors.Is(err, syscall.EADDRNOTAVAIL) && addr.Is6():
			// Linux refuses a tentative address (duplicate address
			// detection still running) as it refuses an absent one.
			return nil, fmt.Errorf("udp: %v is not a usable address of any interface of this host (absent, or still tentative: duplicate address detection takes about a second after the link comes up): %w", la, err)
		case errors.Is(err, syscall.EADDRNOTAVAIL):
			return nil, fmt.Errorf("udp: %v is not an address of any interface of this host: %w", addr, err)
		case errors.Is(err, syscall.EACCES):
			return nil, fmt.Errorf("udp: binding UDP port %d on %v is not permitted: %w", port, addr, err)
		}
		return nil, fmt.Errorf("udp: bind %v: %w", la, err)
	}
	l := &Link{local: netip.AddrPortFrom(addr, uint16(port)), addrs: []netip.Addr{addr},
		v6: v6, mtu: mtu, batch: batch}
	if err := l.setup(cfg, conn); err != nil {
		conn.Close()
		return nil, err
	}
	if l.sock, err = detach(conn); err != nil {
		conn.Close()
		return nil, fmt.Errorf("udp: socket: %w", err)
	}
	rc := l.sock
	l.rx = newReceiver(rc, batch, 0)
	if !v6 {
		if err := l.setupCheck(cfg); err != nil {
			l.Close()
			return nil, err
		}
	}
	l.tx = newSender(rc, batch)
	if err := l.setupOffload(cfg); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// setup sets the socket options: don't-fragment with a deterministic IPv4
// ID of 0, the local destination address as a control message, buffers.
func (l *Link) setup(cfg Config, conn *net.UDPConn) error {
	rc, err := conn.SyscallConn()
	if err != nil {
		return fmt.Errorf("udp: raw socket: %w", err)
	}
	var serr error
	err = rc.Control(func(fd uintptr) {
		if l.v6 {
			// No fragmentation: an oversize packet fails with EMSGSIZE.
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_DO)
			if serr == nil {
				// rxe sends UDP checksum 0 over IPv6 too, which Linux
				// drops unless told otherwise (docs/platform.md, ICRC);
				// the ICRC, verified in full over IPv6, covers the data.
				if e := unix.SetsockoptInt(int(fd), unix.IPPROTO_UDP, unix.UDP_NO_CHECK6_RX, 1); e != nil {
					serr = fmt.Errorf("udp: accept zero UDP checksums (UDP_NO_CHECK6_RX): %w", e)
					return
				}
			}
		} else {
			// Linux sends IPv4 ID 0 from an unconnected socket in this
			// mode (docs/platform.md), the ID the ICRC is computed with.
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO)
		}
		if serr != nil {
			serr = fmt.Errorf("udp: set don't-fragment (IP_MTU_DISCOVER): %w", serr)
			return
		}
		size := cfg.SocketBuffer
		if size == 0 {
			size = DefaultSocketBuffer
		}
		if size > 0 {
			for _, o := range [][2]int{{unix.SO_RCVBUFFORCE, unix.SO_RCVBUF}, {unix.SO_SNDBUFFORCE, unix.SO_SNDBUF}} {
				if unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, o[0], size) == nil {
					continue
				}
				// Unprivileged: the kernel caps it at rmem_max/wmem_max.
				if e := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, o[1], size); e != nil {
					serr = fmt.Errorf("udp: set socket buffer: %w", e)
					return
				}
			}
		}
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return err
	}
	// The received header's TTL and TOS (IPv6: hop limit, traffic class,
	// flow label), which a UD receiver writes into its GRH. Best effort:
	// without them packets say IPKnown false.
	rc.Control(func(fd uintptr) {
		// The TTL the socket sends by default: a packet asking for it
		// needs no control message.
		if l.v6 {
			if v, err := unix.GetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_UNICAST_HOPS); err == nil && v > 0 && v < 256 {
				l.defHop = uint8(v)
			}
		} else if v, err := unix.GetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_TTL); err == nil && v > 0 && v < 256 {
			l.defHop = uint8(v)
		}
		if l.v6 {
			unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_RECVHOPLIMIT, 1)
			unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_RECVTCLASS, 1)
			unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, ipv6FlowInfo, 1)
		} else {
			unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_RECVTTL, 1)
			unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_RECVTOS, 1)
		}
	})
	if l.v6 {
		pc := ipv6.NewPacketConn(conn)
		if err := pc.SetControlMessage(ipv6.FlagDst, true); err != nil {
			return fmt.Errorf("udp: enable IPV6_PKTINFO: %w", err)
		}
	} else {
		pc := ipv4.NewPacketConn(conn)
		if err := pc.SetControlMessage(ipv4.FlagDst, true); err != nil {
			return fmt.Errorf("udp: enable IP_PKTINFO: %w", err)
		}
	}
	return nil
}

// setupCheck prepares the IPv4 ICRC check cfg asks for.
func (l *Link) setupCheck(cfg Config) error {
	l.check = cfg.IPv4Check
	if cfg.VerifyIPv4 {
		l.check = IPv4CheckRaw
	}
	switch l.check {
	case IPv4CheckAuto, IPv4CheckRaw:
		size := cfg.SocketBuffer
		if size == 0 {
			size = DefaultSocketBuffer
		}
		err := l.openRaw4(size)
		if err == nil {
			l.check = IPv4CheckRaw
			return nil
		}
		if l.check == IPv4CheckRaw || !errors.Is(err, syscall.EPERM) && !errors.Is(err, syscall.EACCES) {
			return err
		}
		l.check = IPv4CheckSolve
	case IPv4CheckSolve, IPv4CheckNone:
	default:
		return fmt.Errorf("udp: unknown IPv4Check %d", l.check)
	}
	if l.check == IPv4CheckNone {
		return nil
	}
	var serr error
	err := l.sock.Control(func(fd uintptr) {
		// The options, to tell a header with options (whose ICRC cannot
		// be solved) from one without.
		if e := unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_RECVOPTS, 1); e != nil {
			serr = fmt.Errorf("udp: enable IP_RECVOPTS: %w", e)
			return
		}
		// The largest fragment of a reassembled datagram, to tell one
		// sent without DF (Linux 4.10 on; without it, fragmented
		// datagrams fail the check).
		unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_RECVFRAGSIZE, 1)
	})
	if err == nil {
		err = serr
	}
	return err
}

// IPv4Check returns how the link checks received IPv4 packets: IPv4CheckRaw,
// IPv4CheckSolve or IPv4CheckNone (IPv4CheckAuto resolved), or
// IPv4CheckAuto for an IPv6 link.
func (l *Link) IPv4Check() IPv4Check { return l.check }

// interfaceByZone finds the interface an IPv6 zone names, by name or
// index.
func interfaceByZone(zone string) (*net.Interface, error) {
	if ifi, err := net.InterfaceByName(zone); err == nil {
		return ifi, nil
	}
	if n, err := strconv.Atoi(zone); err == nil && n > 0 {
		return net.InterfaceByIndex(n)
	}
	return nil, fmt.Errorf("no interface %q", zone)
}

// InterfaceOf returns the interface that owns addr. A link-local address
// with a zone is looked up on the interface its zone names only.
func InterfaceOf(addr netip.Addr) (*net.Interface, error) {
	if z := addr.Zone(); z != "" {
		ifi, err := interfaceByZone(z)
		if err != nil {
			return nil, err
		}
		addr = addr.WithZone("")
		if as, err := ifi.Addrs(); err == nil {
			for _, a := range as {
				if pn, ok := a.(*net.IPNet); ok {
					if ip, ok := netip.AddrFromSlice(pn.IP); ok && ip.Unmap() == addr {
						return ifi, nil
					}
				}
			}
		}
		return nil, fmt.Errorf("interface %s has no address %v", ifi.Name, addr)
	}
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("list interfaces: %w", err)
	}
	for i := range ifs {
		as, err := ifs[i].Addrs()
		if err != nil {
			continue
		}
		for _, a := range as {
			if pn, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(pn.IP); ok && ip.Unmap() == addr {
					return &ifs[i], nil
				}
			}
		}
	}
	return nil, fmt.Errorf("no interface has address %v", addr)
}

// LocalAddrPort is the bound address and port.
func (l *Link) LocalAddrPort() netip.AddrPort { return l.local }

// ControlSocket runs f with the UDP socket's descriptor, for what needs
// the socket itself (the daemon asks it for its network namespace).
func (l *Link) ControlSocket(f func(fd uintptr)) error { return l.sock.Control(f) }

// MaxPacket is the largest RoCE packet (BTH through ICRC) the link sends.
func (l *Link) MaxPacket() int { return l.mtu - nic.Overhead(l.v6) }

// BatchSize implements nic.Link.
func (l *Link) BatchSize() int { return l.batch }

// MTU implements nic.Link.
func (l *Link) MTU() int { return l.mtu }

// Addrs implements nic.Link. The slice is shared: do not modify it.
func (l *Link) Addrs() []netip.Addr { return l.addrs }

// Stats implements nic.Link.
func (l *Link) Stats() nic.Stats {
	return nic.Stats{
		RxPackets: l.rxPackets.Load(), TxPackets: l.txPackets.Load(),
		RxBytes: l.rxBytes.Load(), TxBytes: l.txBytes.Load(),
		RxICRCVerified: l.rxVerified.Load(), RxICRCPartial: l.rxPartial.Load(),
		RxICRCUnverified:      l.rxUnvOptions.Load() + l.rxUnvOff.Load(),
		RxUnverifiedIPOptions: l.rxUnvOptions.Load(), RxUnverifiedOff: l.rxUnvOff.Load(),
		RxICRCBad:   l.rxBad.Load(),
		RxMalformed: l.rxMalformed.Load(), RxTruncated: l.rxTruncated.Load(),
		TxErrors: l.txErrors.Load(),
	}
}

// Close implements nic.Link.
func (l *Link) Close() error {
	if l.closed.Swap(true) {
		return net.ErrClosed
	}
	if l.raw != nil {
		l.raw.Close()
	}
	return l.sock.Close()
}

// synth computes the ICRC of roce sent from src to dst over the header
// Linux builds for this socket (IPv4: ID 0, DF). The address bytes stay in
// this frame so nothing escapes.
func synth(src, dst netip.AddrPort, roce []byte) (uint32, error) {
	var s, d [16]byte
	h := icrc.Header{DF: true, SrcPort: src.Port(), DstPort: dst.Port()}
	if src.Addr().Is4() {
		s4, d4 := src.Addr().As4(), dst.Addr().As4()
		copy(s[:], s4[:])
		copy(d[:], d4[:])
		h.Src, h.Dst = s[:4], d[:4]
	} else {
		s, d = src.Addr().As16(), dst.Addr().As16()
		h.Src, h.Dst = s[:], d[:]
	}
	return icrc.Synth(&h, roce)
}

// dest returns the destination of p, defaulting the port to 4791, or false
// when p cannot go out of this link.
func (l *Link) dest(p *nic.Packet) (netip.AddrPort, bool) {
	if p.N < 12+icrc.Len || p.N > l.MaxPacket() || p.N > len(p.Buf) {
		return netip.AddrPort{}, false
	}
	a := p.Remote.Addr().Unmap()
	if !a.IsValid() || a.Is4() == l.v6 || a.IsUnspecified() {
		return netip.AddrPort{}, false
	}
	if p.Local.IsValid() && p.Local.Unmap() != l.local.Addr() {
		return netip.AddrPort{}, false
	}
	port := p.Remote.Port()
	if port == 0 {
		port = nic.RoCEv2Port
	}
	return netip.AddrPortFrom(a, port), true
}

// PutICRC implements nic.RawSender.
func (l *Link) PutICRC(p *nic.Packet) error {
	dst, ok := l.dest(p)
	if !ok {
		return fmt.Errorf("udp: cannot send a %d-byte packet to %v from %v (max %d bytes)", p.N, p.Remote, l.local, l.MaxPacket())
	}
	crc, err := synth(l.local, dst, p.Buf[:p.N])
	if err != nil {
		return fmt.Errorf("udp: compute ICRC: %w", err)
	}
	icrc.Put(p.Buf[:p.N], crc)
	return nil
}

// Send implements nic.Link. Packets that can never go out of this link
// (no or wrong-family destination, too large for the MTU, a Local that is
// not this socket's address) are dropped and counted in TxErrors. When
// the kernel refuses one packet (EHOSTUNREACH, ENETUNREACH, EMSGSIZE, a
// firewall's EPERM...), Send returns its index and the error, as
// nic.Link specifies: every packet before it was sent or dropped, none
// after it was tried.
func (l *Link) Send(pkts []nic.Packet) (int, error) { return l.sendPackets(pkts, true) }

// SendRaw implements nic.RawSender, with Send's contract. The ICRCs are
// the caller's, computed for ID 0 (PutICRC): these packets never go out
// as GSO segments.
func (l *Link) SendRaw(pkts []nic.Packet) (int, error) { return l.sendPackets(pkts, false) }

var (
	errClosed     = net.ErrClosed
	errNoProgress = io.ErrNoProgress
)

func sendError(l *Link, to netip.AddrPort, err error) error {
	return fmt.Errorf("udp: send from %v to %v: %w", l.local, to, err)
}

// Recv implements nic.Link. It blocks until at least one packet is ready.
// Packets whose ICRC fails its check are dropped and counted; how IPv4
// packets are checked is in the package doc.
func (l *Link) Recv(pkts []nic.Packet) (int, error) { return l.recv(pkts, false) }

// TryRecv is Recv without waiting: it returns 0 and no error when no
// packet is ready. A busy-polling receive loop calls it (rc.DriverConfig.BusyPoll).
func (l *Link) TryRecv(pkts []nic.Packet) (int, error) {
	n, err := l.recv(pkts, true)
	l.rxPolled.Add(uint64(n))
	return n, err
}

// Drain is TryRecv for a receiver that is not polling: it returns what
// is waiting without waiting, and Polled does not count it. A driver
// reads what arrived before it acts on a timeout this way.
func (l *Link) Drain(pkts []nic.Packet) (int, error) { return l.recv(pkts, true) }

// Polled is the number of packets TryRecv returned.
func (l *Link) Polled() uint64 { return l.rxPolled.Load() }

func (l *Link) recv(pkts []nic.Packet, nonblock bool) (int, error) {
	if len(pkts) == 0 {
		return 0, nil
	}
	l.rxMu.Lock()
	defer l.rxMu.Unlock()
	l.rx.nonblock = nonblock
	for {
		var n int
		var err error
		if l.gro {
			// Segments left from the last batch first.
			if k := l.drain(pkts); k > 0 {
				return k, nil
			}
			err = l.rx.recvBig()
		} else {
			n, err = l.rx.recv(pkts)
		}
		if err != nil {
			if l.closed.Load() || errors.Is(err, net.ErrClosed) || errors.Is(err, os.ErrClosed) {
				return 0, net.ErrClosed
			}
			if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EHOSTUNREACH) {
				continue // an ICMP error for something we sent earlier
			}
			return 0, fmt.Errorf("udp: recvmmsg on %v: %w", l.local, err)
		}
		if nonblock && (n == 0 && !l.gro || l.gro && l.rx.cur >= l.rx.n) {
			return 0, nil // nothing was ready
		}
		if k := l.acceptBatch(pkts, n); k > 0 {
			return k, nil
		}
	}
}

// pending reports whether the last non-blocking receive may have left
// datagrams in the socket or segments in the receiver: its read filled
// the whole batch, or coalesced segments are still to be handed out.
func (l *Link) pending() bool {
	r := l.rx
	if l.gro && r.cur < r.n {
		return true
	}
	return r.n > 0 && r.n == r.want
}

// acceptBatch checks the n datagrams the receiver read into pkts and moves
// the delivered ones to the front; it returns how many.
func (l *Link) acceptBatch(pkts []nic.Packet, n int) int {
	k := 0
	for i := 0; i < n; i++ {
		var ok bool
		m, flags, src, oob := l.rx.message(i)
		if l.raw != nil {
			ok = l.acceptRaw(m, flags, l.rx.header(i), &pkts[i])
		} else {
			ok = l.accept(m, flags, src, oob, &pkts[i])
		}
		if ok {
			if k != i {
				pkts[k], pkts[i] = pkts[i], pkts[k]
			}
			k++
		}
	}
	return k
}

// RecvEach receives into pkts until the link is closed (it then returns
// net.ErrClosed) or fails, and calls deliver with the number of packets
// each time some arrived; deliver must be done with them before it
// returns. With GRO, a delivered packet's Buf is the segment in the
// link's own receive buffer (no copy), valid only until deliver returns;
// pkts holds the caller's buffers again when RecvEach returns. Unlike a loop over Recv, it waits in the poller as soon as a
// recvmmsg returns fewer datagrams than it asked for (the socket was empty
// then) instead of first trying once more and getting EAGAIN, which saves
// a system call per wait. That is only safe inside one poller read: each
// Recv starts by clearing the readiness a packet that arrived meanwhile
// set. Recv and TryRecv wait while it runs.
func (l *Link) RecvEach(pkts []nic.Packet, deliver func(n int)) error {
	return l.RecvEachUntil(pkts, deliver, nil)
}

// RecvEachUntil is RecvEach that also returns, with a nil error, once stop
// reports true: stop is asked before the first wait, after each deliver,
// and whenever Interrupt wakes the wait. A consumer waiting for its own
// completion receives this way on its own goroutine, and whoever hands it
// that completion from elsewhere calls Interrupt. stop may be nil (never).
func (l *Link) RecvEachUntil(pkts []nic.Packet, deliver func(n int), stop func() bool) error {
	return l.recvEachUntil(pkts, deliver, stop, false)
}

// WaitEachUntil is RecvEachUntil for the one goroutine that holds a
// device's receive path (a consumer waiting for its completion, or the
// receive goroutine): where that pays it waits in a ppoll system call,
// not the runtime poller, so the packet wakes the thread that handles it
// (see sock and kernelWaitOK).
func (l *Link) WaitEachUntil(pkts []nic.Packet, deliver func(n int), stop func() bool) error {
	return l.recvEachUntil(pkts, deliver, stop, true)
}

func (l *Link) recvEachUntil(pkts []nic.Packet, deliver func(n int), stop func() bool, kernel bool) error {
	if len(pkts) == 0 {
		return errors.New("udp: RecvEach with no buffers")
	}
	l.rxMu.Lock()
	defer l.rxMu.Unlock()
	r := l.rx
	r.nonblock = false
	// Segments of coalesced datagrams are delivered in place (no copy
	// into pkts' buffers): deliver is done with them before the next
	// recvmmsg overwrites them.
	r.alias = true
	e := &l.each
	e.pkts, e.deliver, e.stop, e.fail, e.stopped = pkts, deliver, stop, nil, false
	defer func() {
		r.restore(pkts)
		r.alias = false
		e.pkts, e.deliver, e.stop = nil, nil, nil
	}()
	if e.fn == nil {
		e.l, e.fn = l, e.step // bound once: a closure per call would allocate
	}
	done, err := r.rc.waitEach(e.fn, stop, kernel, &e.stopped, &e.fail)
	if done {
		return nil
	}
	if err == nil {
		err = e.fail
	}
	if l.closed.Load() || errors.Is(err, net.ErrClosed) || errors.Is(err, os.ErrClosed) {
		return net.ErrClosed
	}
	return fmt.Errorf("udp: recvmmsg on %v: %w", l.local, err)
}

// eachLoop is RecvEachUntil's state (under rxMu).
type eachLoop struct {
	l       *Link
	pkts    []nic.Packet
	deliver func(n int)
	stop    func() bool
	fail    error
	stopped bool
	fn      func(fd uintptr) bool // step
}

// give delivers k packets and reports whether stop says to return.
func (e *eachLoop) give(k int) bool {
	e.deliver(k)
	e.stopped = e.stop != nil && e.stop()
	return e.stopped
}

// step receives and delivers until the socket is empty (false: wait) or
// stop, an error or the end of a batch says to return (true).
func (e *eachLoop) step(fd uintptr) bool {
	l, r, pkts := e.l, e.l.rx, e.pkts
	for {
		if l.gro {
			if k := l.drain(pkts); k > 0 {
				if e.give(k) {
					return true
				}
				continue
			}
			r.setupBig()
		} else {
			r.setup(pkts)
		}
		if !r.read(fd) {
			return false // EAGAIN: wait
		}
		if r.errno != 0 {
			if r.errno == syscall.ECONNREFUSED || r.errno == syscall.EHOSTUNREACH {
				continue // an ICMP error for something we sent earlier
			}
			e.fail = r.errno
			r.n = 0
			return true
		}
		full := r.n == r.want
		if l.gro {
			for r.cur < r.n {
				if k := l.drain(pkts); k > 0 && e.give(k) {
					return true // the rest stays for the next receive
				}
			}
		} else if k := l.acceptBatch(pkts, r.n); k > 0 && e.give(k) {
			return true
		}
		if !full {
			return false // the queue was empty: wait for the next packet
		}
	}
}

// Interrupt wakes a RecvEachUntil waiting for packets, which then asks
// its stop function; one that is not waiting yet returns from its next
// wait at once. The caller makes what stop reports true first.
func (l *Link) Interrupt() { l.readSock().Interrupt() }

// readSock is the socket the receiver reads.
func (l *Link) readSock() *sock {
	if l.raw != nil {
		return l.raw
	}
	return l.sock
}

// accept fills p from received message i and reports whether it is
// delivered.
func (l *Link) accept(n int, flags int32, src netip.AddrPort, oob []byte, p *nic.Packet) bool {
	if flags&unix.MSG_TRUNC != 0 {
		l.rxTruncated.Add(1)
		return false
	}
	if !src.IsValid() || n < 12+icrc.Len {
		l.rxMalformed.Add(1)
		return false
	}
	c := parseCmsgs(oob, l.v6)
	p.N = n
	p.Remote = src
	p.Local = l.local.Addr()
	// The header's TTL and TOS (or hop limit, traffic class and flow
	// label) come in control messages; the IPv4 ID only as solved below.
	p.IPKnown, p.HopLimit, p.TClass, p.IPID, p.FlowLabel = l.v6 && c.hasTTL, c.ttl, c.tos, 0, c.flow
	if c.hasDst {
		p.Local = c.dst
	}
	p.SrcPort = 0
	local := netip.AddrPortFrom(p.Local, l.local.Port())
	switch {
	case l.v6:
		crc, err := synth(p.Remote, local, p.Buf[:p.N])
		if err != nil {
			l.rxMalformed.Add(1)
			return false
		}
		if crc != icrc.Wire(p.Buf[:p.N]) {
			l.rxBad.Add(1)
			return false
		}
		p.ICRC = nic.ICRCVerified
		l.rxVerified.Add(1)
	case l.check == IPv4CheckNone:
		p.ICRC = nic.ICRCUnverified
		l.rxUnvOff.Add(1)
	case c.options || flags&unix.MSG_CTRUNC != 0:
		// The header had options (or the control data that would say
		// was cut): the ICRC covers them as the peer sent them, which
		// the socket may not show. See the package doc.
		p.ICRC = nic.ICRCUnverified
		l.rxUnvOptions.Add(1)
	default:
		// The peer's ID is not visible: solve for it (package doc). A
		// reassembled datagram was sent without DF.
		id, ok, err := solveV4(p.Remote, local, !c.fragmented, p.Buf[:p.N])
		if err != nil {
			l.rxMalformed.Add(1)
			return false
		}
		if !ok {
			l.rxBad.Add(1)
			return false
		}
		p.IPKnown, p.IPID = c.hasTTL && !c.fragmented, id
		p.ICRC = nic.ICRCPartial
		l.rxPartial.Add(1)
	}
	l.rxPackets.Add(1)
	l.rxBytes.Add(uint64(p.N))
	return true
}

// solveV4 recovers the IPv4 ID under which roce's ICRC is right for a
// header from src to dst without options, with DF as given.
func solveV4(src, dst netip.AddrPort, df bool, roce []byte) (uint16, bool, error) {
	s, d := src.Addr().As4(), dst.Addr().As4()
	h := icrc.Header{Src: s[:], Dst: d[:], DF: df, SrcPort: src.Port(), DstPort: dst.Port()}
	return icrc.SolveIPv4ID(&h, roce)
}

// cmsgs is what the control messages of a datagram say.
type cmsgs struct {
	dst        netip.Addr // the header destination (IP_PKTINFO, IPV6_PKTINFO)
	hasDst     bool
	options    bool // IP_RECVOPTS: the IPv4 header had options
	fragmented bool // IP_RECVFRAGSIZE: the kernel reassembled the datagram
	hasTTL     bool // IP_TTL or IPV6_HOPLIMIT came
	ttl, tos   uint8
	flow       uint32 // IPV6_FLOWINFO: the flow label
}

// parseCmsgs decodes the control messages, by hand so that nothing
// allocates.
func parseCmsgs(oob []byte, v6 bool) cmsgs {
	var c cmsgs
	for len(oob) >= unix.SizeofCmsghdr {
		// struct cmsghdr { size_t len; int level; int type; } on 64-bit Linux.
		ln := int(binary.NativeEndian.Uint64(oob))
		level := int32(binary.NativeEndian.Uint32(oob[8:]))
		typ := int32(binary.NativeEndian.Uint32(oob[12:]))
		if ln < unix.SizeofCmsghdr || ln > len(oob) {
			return c
		}
		data := oob[unix.SizeofCmsghdr:ln]
		switch {
		case !v6 && level == unix.IPPROTO_IP && typ == unix.IP_PKTINFO && len(data) >= unix.SizeofInet4Pktinfo:
			// struct in_pktinfo { int ifindex; in_addr spec_dst; in_addr addr; }
			c.dst, c.hasDst = netip.AddrFrom4([4]byte(data[8:12])), true
		case v6 && level == unix.IPPROTO_IPV6 && typ == unix.IPV6_PKTINFO && len(data) >= unix.SizeofInet6Pktinfo:
			// struct in6_pktinfo { in6_addr addr; int ifindex; }
			c.dst, c.hasDst = netip.AddrFrom16([16]byte(data[0:16])).Unmap(), true
		case !v6 && level == unix.IPPROTO_IP && (typ == unix.IP_RECVOPTS || typ == unix.IP_OPTIONS) && len(data) > 0:
			// Linux labels the options of IP_RECVOPTS with that option's
			// number.
			c.options = true
		case !v6 && level == unix.IPPROTO_IP && typ == unix.IP_RECVFRAGSIZE:
			c.fragmented = true
		case !v6 && level == unix.IPPROTO_IP && typ == unix.IP_TTL && len(data) >= 4:
			c.ttl, c.hasTTL = uint8(binary.NativeEndian.Uint32(data)), true
		case !v6 && level == unix.IPPROTO_IP && typ == unix.IP_TOS && len(data) >= 1:
			c.tos = data[0]
		case v6 && level == unix.IPPROTO_IPV6 && typ == unix.IPV6_HOPLIMIT && len(data) >= 4:
			c.ttl, c.hasTTL = uint8(binary.NativeEndian.Uint32(data)), true
		case v6 && level == unix.IPPROTO_IPV6 && typ == unix.IPV6_TCLASS && len(data) >= 4:
			c.tos = uint8(binary.NativeEndian.Uint32(data))
		case v6 && level == unix.IPPROTO_IPV6 && typ == ipv6FlowInfo && len(data) >= 4:
			c.flow = binary.BigEndian.Uint32(data) & 0xfffff
		}
		adv := cmsgAlign(ln)
		if adv > len(oob) {
			break
		}
		oob = oob[adv:]
	}
	return c
}

// pktinfoDst finds the header destination address in an IP_PKTINFO or
// IPV6_PKTINFO control message.
func pktinfoDst(oob []byte, v6 bool) (netip.Addr, bool) {
	c := parseCmsgs(oob, v6)
	return c.dst, c.hasDst
}

func cmsgAlign(n int) int { return (n + 7) &^ 7 }
