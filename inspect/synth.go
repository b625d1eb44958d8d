package inspect

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/icrc"
)

// FrameSpec describes a RoCE frame to synthesise, for tests, demos and
// captures the project writes itself.
type FrameSpec struct {
	Kind    icrc.Kind  // KindRoCEv2IPv4 (the default), KindRoCEv2IPv6 or KindRoCEv1
	VLANs   []uint16   // 802.1Q tags, outermost first
	Src     netip.Addr // IPv4 for KindRoCEv2IPv4, else IPv6 (GIDs for RoCEv1)
	Dst     netip.Addr
	SrcPort uint16 // UDP source port (RoCEv2); 0xC000 when zero
	TOS     uint8  // IPv4 TOS / IPv6 and GRH traffic class (masked by the ICRC)
	TTL     uint8  // hop limit; 64 when zero (masked by the ICRC)
	IPID    uint16 // IPv4 identification (covered by the ICRC)
	Fields  bth.Fields
	Payload []byte
	// MinFrame pads the frame with zeros to the 60-byte Ethernet minimum,
	// as a NIC does; the packet's own lengths do not change.
	MinFrame bool
}

// BuildFrame returns the Ethernet frame described by s, with a correct ICRC.
func BuildFrame(s *FrameSpec) ([]byte, error) {
	kind := s.Kind
	if kind == 0 {
		kind = icrc.KindRoCEv2IPv4
	}
	n := bth.Len(s.Fields.BTH.Opcode, len(s.Payload))
	l2 := 14 + 4*len(s.VLANs)
	var l3 int
	switch kind {
	case icrc.KindRoCEv2IPv4:
		if !s.Src.Is4() || !s.Dst.Is4() {
			return nil, fmt.Errorf("build RoCEv2/IPv4 frame: addresses %v, %v are not IPv4", s.Src, s.Dst)
		}
		l3 = 20 + 8
	case icrc.KindRoCEv2IPv6:
		l3 = 40 + 8
	case icrc.KindRoCEv1:
		l3 = 40
	default:
		return nil, fmt.Errorf("build frame: unknown kind %d", kind)
	}
	size := l2 + l3 + n
	frame := make([]byte, max(size, 60))
	if !s.MinFrame {
		frame = frame[:size]
	}
	copy(frame[0:], []byte{0x02, 0, 0, 0, 0, 0x02, 0x02, 0, 0, 0, 0, 0x01})
	o := 12
	for _, v := range s.VLANs {
		binary.BigEndian.PutUint16(frame[o:], icrc.EtherTypeVLAN)
		binary.BigEndian.PutUint16(frame[o+2:], v&0x0fff)
		o += 4
	}
	ttl := s.TTL
	if ttl == 0 {
		ttl = 64
	}
	sport := s.SrcPort
	if sport == 0 {
		sport = 0xc000
	}
	o += 2
	p := frame[o:size]
	if _, err := bth.Build(p[l3:], &s.Fields, s.Payload); err != nil {
		return nil, fmt.Errorf("build frame: %w", err)
	}
	var crc uint32
	var err error
	switch kind {
	case icrc.KindRoCEv2IPv4:
		binary.BigEndian.PutUint16(frame[o-2:], icrc.EtherTypeIPv4)
		ip := p[:20]
		ip[0], ip[1] = 0x45, s.TOS
		binary.BigEndian.PutUint16(ip[2:], uint16(20+8+n))
		binary.BigEndian.PutUint16(ip[4:], s.IPID)
		ip[6] = 0x40 // DF, as rxe sends
		ip[8], ip[9] = ttl, 17
		a, b := s.Src.As4(), s.Dst.As4()
		copy(ip[12:], a[:])
		copy(ip[16:], b[:])
		binary.BigEndian.PutUint16(ip[10:], ipv4Checksum(ip))
		putUDP(p[20:28], sport, 8+n)
		crc, err = icrc.IPv4(ip, p[20:])
	case icrc.KindRoCEv2IPv6:
		binary.BigEndian.PutUint16(frame[o-2:], icrc.EtherTypeIPv6)
		putGRH(p[:40], s, 8+n, 17, ttl)
		putUDP(p[40:48], sport, 8+n)
		crc, err = icrc.IPv6(p[:40], p[40:])
	case icrc.KindRoCEv1:
		binary.BigEndian.PutUint16(frame[o-2:], icrc.EtherTypeRoCEv1)
		putGRH(p[:40], s, n, 0x1b, ttl)
		crc, err = icrc.RoCEv1(p[:40], p[40:])
	}
	if err != nil {
		return nil, fmt.Errorf("build frame: %w", err)
	}
	icrc.Put(p, crc)
	return frame, nil
}

func putUDP(u []byte, sport uint16, length int) {
	binary.BigEndian.PutUint16(u[0:], sport)
	binary.BigEndian.PutUint16(u[2:], icrc.UDPPort)
	binary.BigEndian.PutUint16(u[4:], uint16(length))
	binary.BigEndian.PutUint16(u[6:], 0) // rxe sends checksum 0
}

// putGRH writes an IPv6 header or GRH (same layout, IBTA §8.3).
func putGRH(h []byte, s *FrameSpec, payLen int, next, hop uint8) {
	binary.BigEndian.PutUint32(h[0:], 6<<28|uint32(s.TOS)<<20)
	binary.BigEndian.PutUint16(h[4:], uint16(payLen))
	h[6], h[7] = next, hop
	a, b := s.Src.As16(), s.Dst.As16()
	copy(h[8:], a[:])
	copy(h[24:], b[:])
}

func ipv4Checksum(h []byte) uint16 {
	var sum uint32
	for i := 0; i < len(h); i += 2 {
		if i != 10 {
			sum += uint32(binary.BigEndian.Uint16(h[i:]))
		}
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}
