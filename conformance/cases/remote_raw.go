package cases

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/icrc"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/nic/udp"
)

// Peer kinds of RemoteConfig.Peer.
const (
	// PeerUDP sends from a UDP socket: the kernel writes the IPv4 header
	// (ID 0 with DF on Linux, its own TTL and TOS).
	PeerUDP = "udp"
	// PeerRaw sends from a raw IPv4 socket with IP_HDRINCL: the harness
	// writes the IPv4 and UDP headers itself, so the ID, TTL and TOS on
	// the wire are its own and the ICRC covers exactly those bytes.
	PeerRaw = "raw"
)

// Header fields the raw peer writes: a TTL and a DSCP/ECN no kernel
// default gives, so that a capture shows the header is the harness's.
const (
	rawPeerTTL = 61
	// rawPeerTOS is DSCP 26 (AF31, the RoCE class many fabrics use) with
	// ECN ECT(0): a RoCEv2 sender marks its packets ECN-capable.
	rawPeerTOS = 26<<2 | 0b10
)

// rawPeerLink is the raw-socket peer: packets leave through a raw IPv4
// socket whose headers the link builds, with an IPv4 ID that counts up
// from 1 per packet; the answers still arrive on the UDP link (the remote
// NIC replies to the peer's UDP port 4791, which the UDP socket holds, so
// the kernel sends no port unreachable), received with their IPv4 header
// on the UDP link's raw verifier so their ICRCs are checked over the ID
// the NIC really sent.
type rawPeerLink struct {
	*udp.Link
	fd    int
	local netip.Addr

	mu  sync.Mutex
	id  uint16 // the ID of the packet PutICRC last prepared
	pkt []byte // the IPv4 datagram being built
}

// openRawPeer opens the UDP link on local (its receive side) and the raw
// IPv4 socket it sends from.
func openRawPeer(local netip.Addr) (*rawPeerLink, error) {
	if !local.Is4() {
		return nil, fmt.Errorf("the raw peer sends IPv4 only; %s is not", local)
	}
	l, err := udp.Open(udp.Config{Addr: local, IPv4Check: udp.IPv4CheckRaw})
	if err != nil {
		return nil, err
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
	if err != nil {
		l.Close()
		return nil, fmt.Errorf("raw peer: raw IPv4 socket (root or CAP_NET_RAW): %w", err)
	}
	// IPPROTO_RAW implies IP_HDRINCL; set it anyway, to say so.
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_HDRINCL, 1); err != nil {
		unix.Close(fd)
		l.Close()
		return nil, fmt.Errorf("raw peer: IP_HDRINCL: %w", err)
	}
	return &rawPeerLink{Link: l, fd: fd, local: local, pkt: make([]byte, 0, 20+8+9000)}, nil
}

// build writes the IPv4 and UDP headers for p with ID id into r.pkt,
// followed by p's RoCE bytes, and returns the datagram and the offset of
// its UDP header.
func (r *rawPeerLink) build(p *nic.Packet, id uint16) ([]byte, error) {
	dst := p.Remote.Addr().Unmap()
	if !dst.Is4() {
		return nil, fmt.Errorf("raw peer: destination %s is not IPv4", p.Remote)
	}
	n := 20 + 8 + p.N
	if n > r.Link.MTU() {
		return nil, fmt.Errorf("raw peer: %d-byte packet exceeds the MTU %d", n, r.Link.MTU())
	}
	b := r.pkt[:n]
	clear(b[:28])
	b[0] = 0x45
	b[1] = rawPeerTOS
	binary.BigEndian.PutUint16(b[2:], uint16(n))
	binary.BigEndian.PutUint16(b[4:], id)
	binary.BigEndian.PutUint16(b[6:], 0x4000) // DF: RoCE is never fragmented
	b[8] = rawPeerTTL
	b[9] = unix.IPPROTO_UDP
	src, d := r.local.As4(), dst.As4()
	copy(b[12:16], src[:])
	copy(b[16:20], d[:])
	binary.BigEndian.PutUint16(b[10:], ipChecksum(b[:20]))
	sport := p.SrcPort
	if sport == 0 {
		sport = nic.RoCEv2Port
	}
	binary.BigEndian.PutUint16(b[20:], sport)
	binary.BigEndian.PutUint16(b[22:], p.Remote.Port())
	binary.BigEndian.PutUint16(b[24:], uint16(8+p.N))
	// UDP checksum 0: RoCEv2 over IPv4 sends none (annex A17.4.2).
	copy(b[28:], p.Buf[:p.N])
	return b, nil
}

func ipChecksum(h []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(h); i += 2 {
		s += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

// PutICRC implements nic.RawSender: the ICRC over the IPv4 header the next
// SendRaw sends p with (its ID included: IPv4 ID is not masked).
func (r *rawPeerLink) PutICRC(p *nic.Packet) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.id++
	if r.id == 0 {
		r.id = 1
	}
	b, err := r.build(p, r.id)
	if err != nil {
		return err
	}
	crc, err := icrc.IPv4(b[:20], b[20:])
	if err != nil {
		return err
	}
	icrc.Put(p.Buf[:p.N], crc)
	return nil
}

// Send implements nic.Link.
func (r *rawPeerLink) Send(pkts []nic.Packet) (int, error) {
	for i := range pkts {
		if err := r.PutICRC(&pkts[i]); err != nil {
			return i, err
		}
		if _, err := r.SendRaw(pkts[i : i+1]); err != nil {
			return i, err
		}
	}
	return len(pkts), nil
}

// SendRaw implements nic.RawSender: each packet goes out with the ID the
// last PutICRC chose, its ICRC bytes as they are.
func (r *rawPeerLink) SendRaw(pkts []nic.Packet) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range pkts {
		p := &pkts[i]
		b, err := r.build(p, r.id)
		if err != nil {
			return i, err
		}
		sa := &unix.SockaddrInet4{Addr: p.Remote.Addr().Unmap().As4()}
		if err := unix.Sendto(r.fd, b, 0, sa); err != nil {
			if errors.Is(err, unix.EBADF) {
				return i, net.ErrClosed
			}
			return i, fmt.Errorf("raw peer: send: %w", err)
		}
	}
	return len(pkts), nil
}

// Close implements nic.Link.
func (r *rawPeerLink) Close() error {
	r.mu.Lock()
	err := unix.Close(r.fd)
	r.fd = -1
	r.mu.Unlock()
	return errors.Join(err, r.Link.Close())
}
