package ud

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/wr"
)

const (
	// GRHLen is the room at the head of every UD receive buffer: a UD
	// receive completes with ByteLen = GRHLen + payload.
	GRHLen = 40
	// GSIQPN is the QP number of the General Services Interface (QP1),
	// where management datagrams (the CM's MADs) arrive.
	GSIQPN = 1
	// GSIQKey is the Q_Key of QP1 (IB_QP1_QKEY): QP1 accepts nothing else.
	GSIQKey = 0x80010000
	// HeaderLen is the longest UD header set: BTH, DETH and ImmDt.
	HeaderLen = bth.BTHLen + bth.DETHLen + bth.ImmDtLen
)

// controlledQKey is the high-order bit of a Q_Key. A send work request
// whose Q_Key has it set uses the QP's own Q_Key instead (IBTA §10.2.5,
// C10-15): ordinary users cannot send with a controlled Q_Key.
const controlledQKey = 0x80000000

// SendQKey is the Q_Key a UD send carries in its DETH: the work request's,
// or the QP's own when the work request's has the high-order bit set.
func SendQKey(wrQKey, qpQKey uint32) uint32 {
	if wrQKey&controlledQKey != 0 {
		return qpQKey
	}
	return wrQKey
}

// QKeyToSend is the Q_Key the DETH of a send from QP number qpn carries:
// QP1 always sends GSIQKey, as rxe does and as management datagrams must
// (management datagrams carry Q_Key 0x80010000); any other QP follows
// SendQKey.
func QKeyToSend(qpn, wrQKey, qpQKey uint32) uint32 {
	if qpn == GSIQPN {
		return GSIQKey
	}
	return SendQKey(wrQKey, qpQKey)
}

// AcceptQKey reports whether a UD QP numbered qpn with Q_Key qpQKey
// accepts a packet whose DETH carries got. QP1 accepts only GSIQKey,
// whatever Q_Key it was given, as rxe checks (rxe_recv.c); any other QP
// accepts exactly its own (IBTA C10-16: a mismatch is silently dropped).
func AcceptQKey(qpn, qpQKey, got uint32) bool {
	if qpn == GSIQPN {
		return got == GSIQKey
	}
	return got == qpQKey
}

// ErrOpcode is returned for a work request UD cannot carry.
var ErrOpcode = errors.New("ud: a UD QP sends only SEND and SEND_WITH_IMM")

// Send describes one UD SEND packet.
type Send struct {
	Opcode    wr.Opcode // wr.Send or wr.SendWithImm
	DestQP    uint32
	SrcQP     uint32
	QKey      uint32 // as it goes in the DETH (see SendQKey)
	PSN       uint32
	Imm       uint32
	Solicited bool
	PKey      uint16 // 0: the default partition 0xFFFF
}

// Opcode is the packet opcode of a UD work request.
func Opcode(op wr.Opcode) (bth.Opcode, error) {
	switch op {
	case wr.Send:
		return bth.UDSendOnly, nil
	case wr.SendWithImm:
		return bth.UDSendOnlyImm, nil
	}
	return 0, fmt.Errorf("%w (got %v)", ErrOpcode, op)
}

// WriteHeaders writes the headers of s for a payload of n bytes that the
// caller copies at offset PayloadOffset(s.Opcode), zeroes pad and ICRC
// slot, and returns the packet length (-1 if dst is short or the opcode is
// not a UD one). AckReq is never set: UD has no acknowledgements.
func WriteHeaders(dst []byte, s *Send, n int) int {
	op, err := Opcode(s.Opcode)
	if err != nil {
		return -1
	}
	pkey := s.PKey
	if pkey == 0 {
		pkey = 0xffff
	}
	f := bth.Fields{BTH: bth.BTHFields{Opcode: op, SE: s.Solicited, PKey: pkey, DestQP: s.DestQP, PSN: s.PSN},
		QKey: s.QKey, SrcQP: s.SrcQP, Imm: s.Imm}
	return bth.WriteHeaders(dst, &f, n)
}

// PayloadOffset is where the payload of a UD work request's packet starts.
func PayloadOffset(op wr.Opcode) int {
	if op == wr.SendWithImm {
		return bth.BTHLen + bth.DETHLen + bth.ImmDtLen
	}
	return bth.BTHLen + bth.DETHLen
}

// FlowLabelToUDPSport maps a 20-bit flow label to a RoCEv2 UDP source port
// in 0xC000..0xFFFF, as rdma_flow_label_to_udp_sport does: the low 14 bits
// XOR the high 6, with the two top bits set.
func FlowLabelToUDPSport(fl uint32) uint16 {
	lo := fl & 0x3fff
	hi := (fl & 0xfc000) >> 14
	return uint16(lo^hi) | 0xc000
}

// SrcPort is the UDP source port of a UD packet: from the address
// handle's flow label when it has one (the rule of mlx5 and hns, and of
// rxe for a connected QP's address vector), else qpPort, the port fixed
// per QP that rxe uses for every UD packet of a QP.
func SrcPort(flowLabel uint32, qpPort uint16) uint16 {
	if fl := flowLabel & 0xfffff; fl != 0 {
		return FlowLabelToUDPSport(fl)
	}
	return qpPort
}

// IPHeader is what a receiver knows of the IP header a UD packet arrived
// in: the addresses, and the fields a link may or may not see (zero when
// it cannot).
type IPHeader struct {
	Src, Dst netip.Addr
	// UDPLen is the UDP length: 8 + the RoCE packet (BTH through ICRC).
	UDPLen int
	// TOS is the IPv4 TOS or IPv6 traffic class byte.
	TOS uint8
	// TTL is the IPv4 TTL or IPv6 hop limit.
	TTL uint8
	// ID is the IPv4 identification.
	ID uint16
	// DF is the IPv4 don't-fragment bit (RoCEv2 senders set it).
	DF bool
	// FlowLabel is the IPv6 flow label (20 bits).
	FlowLabel uint32
}

// ErrFamily is returned by WriteGRH for addresses of mixed or unknown
// families.
var ErrFamily = errors.New("ud: GRH needs two IPv4 or two IPv6 addresses")

// WriteGRH writes the 40 bytes a UD receive buffer starts with into
// dst[:40], as rxe does (rxe_resp.c, union rdma_network_hdr): for IPv4,
// 20 zero bytes then the 20-byte IPv4 header (no options, checksum
// included); for IPv6, the 40-byte IPv6 header. Consumers (the kernel CM,
// ibv_ud_pingpong) read the sender's address from it.
func WriteGRH(dst []byte, h *IPHeader) error {
	if len(dst) < GRHLen {
		return fmt.Errorf("ud: GRH needs %d bytes, have %d", GRHLen, len(dst))
	}
	g := dst[:GRHLen]
	switch {
	case h.Src.Is4() && h.Dst.Is4():
		clear(g[:20])
		ip := g[20:40]
		ip[0] = 0x45
		ip[1] = h.TOS
		binary.BigEndian.PutUint16(ip[2:], uint16(20+h.UDPLen))
		binary.BigEndian.PutUint16(ip[4:], h.ID)
		var frag uint16
		if h.DF {
			frag = 0x4000
		}
		binary.BigEndian.PutUint16(ip[6:], frag)
		ip[8] = h.TTL
		ip[9] = 17 // UDP
		ip[10], ip[11] = 0, 0
		s, d := h.Src.As4(), h.Dst.As4()
		copy(ip[12:16], s[:])
		copy(ip[16:20], d[:])
		binary.BigEndian.PutUint16(ip[10:], ipv4Checksum(ip))
	case h.Src.Is6() && !h.Src.Is4In6() && h.Dst.Is6() && !h.Dst.Is4In6():
		binary.BigEndian.PutUint32(g[0:], 6<<28|uint32(h.TOS)<<20|h.FlowLabel&0xfffff)
		binary.BigEndian.PutUint16(g[4:], uint16(h.UDPLen))
		g[6] = 17 // UDP
		g[7] = h.TTL
		s, d := h.Src.As16(), h.Dst.As16()
		copy(g[8:24], s[:])
		copy(g[24:40], d[:])
	default:
		return ErrFamily
	}
	return nil
}

// ipv4Checksum is the IPv4 header checksum of h (whose checksum field is
// zero).
func ipv4Checksum(h []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(h); i += 2 {
		s += uint32(h[i])<<8 | uint32(h[i+1])
	}
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

// SourceOfGRH returns the sender's address recorded in a UD receive
// buffer's GRH (the IPv4 source for the IPv4 layout, the IPv6 source
// otherwise): what a UD consumer builds its reply's address handle from.
func SourceOfGRH(g []byte) (netip.Addr, error) {
	if len(g) < GRHLen {
		return netip.Addr{}, fmt.Errorf("ud: GRH is %d bytes, have %d", GRHLen, len(g))
	}
	switch {
	case g[0]>>4 == 6:
		return netip.AddrFrom16([16]byte(g[8:24])), nil
	case g[20]>>4 == 4:
		return netip.AddrFrom4([4]byte(g[32:36])), nil
	}
	return netip.Addr{}, errors.New("ud: the GRH holds neither an IPv4 nor an IPv6 header")
}
