package icrc

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Frame-level checking: find the RoCE packet inside a captured link-layer
// frame and compare the ICRC it carries with the one it should carry.
//
// Lengths come from the headers, never from the capture: an Ethernet frame
// may be padded to its 60-byte minimum or carry an FCS, so the packet ends
// where the UDP length (RoCEv2, as rxe reads it) or the GRH PayLen (RoCEv1)
// says. A capture cut short by its snap length is reported as Truncated,
// which is not an ICRC failure.

// EtherType values the frame parser understands.
const (
	EtherTypeIPv4   = 0x0800
	EtherTypeIPv6   = 0x86DD
	EtherTypeRoCEv1 = 0x8915 // IBTA annex A16: Ethernet | GRH | BTH ...
	EtherTypeVLAN   = 0x8100 // IEEE 802.1Q C-tag
	EtherTypeQinQ   = 0x88A8 // IEEE 802.1ad S-tag
	EtherTypeQinQ91 = 0x9100 // pre-standard double tagging
)

// UDPPort is the IANA destination port of RoCEv2 (annex A17.2.2).
const UDPPort = 4791

// grhNextHeaderIBA is the GRH NxtHdr value announcing an IBA transport
// header (IBTA vol. 1 §8.3.1).
const grhNextHeaderIBA = 0x1B

// Kind is the encapsulation of a RoCE packet.
type Kind uint8

// Encapsulations.
const (
	KindRoCEv2IPv4 Kind = iota + 1 // Ethernet | IPv4 | UDP 4791 | BTH
	KindRoCEv2IPv6                 // Ethernet | IPv6 | UDP 4791 | BTH
	KindRoCEv1                     // Ethernet (0x8915) | GRH | BTH
)

// String returns "RoCEv2" or "RoCEv1".
func (k Kind) String() string {
	switch k {
	case KindRoCEv2IPv4, KindRoCEv2IPv6:
		return "RoCEv2"
	case KindRoCEv1:
		return "RoCEv1"
	}
	return "unknown"
}

// Status is the verdict on a frame's ICRC.
type Status uint8

// Verdicts.
const (
	StatusOK        Status = iota + 1 // the ICRC on the wire is the computed one
	StatusMismatch                    // it is not: the packet was corrupted or rewritten
	StatusTruncated                   // the capture ends before the ICRC: nothing to check
)

// String returns "ok", "bad" or "truncated", the words inspect prints.
func (s Status) String() string {
	switch s {
	case StatusOK:
		return "ok"
	case StatusMismatch:
		return "bad"
	case StatusTruncated:
		return "truncated"
	}
	return "unknown"
}

// MaxVLANTags is the number of VLAN tags CheckFrame records; deeper stacks
// are still walked.
const MaxVLANTags = 2

// Result locates a RoCE packet in a frame and gives the ICRC verdict. All
// offsets are relative to the start of the buffer passed in.
type Result struct {
	Kind      Kind
	Status    Status
	Computed  uint32 // the ICRC the packet should carry (0 when truncated)
	Wire      uint32 // the ICRC it carries (0 when truncated)
	EtherType uint16 // after any VLAN tags
	NumVLAN   int    // VLAN tags walked
	VLAN      [MaxVLANTags]uint16
	L3        int // offset of the IPv4/IPv6 header or GRH
	L3Len     int // its length (IPv4 options included)
	UDP       int // offset of the UDP header; -1 for RoCEv1
	BTH       int // offset of the BTH
	End       int // offset just past the ICRC, as the length fields say
}

// ErrNotRoCE is returned for frames that are well-formed but carry no
// RoCE packet (other EtherTypes, other protocols, other UDP ports). It is
// a plain sentinel so that skipping ordinary traffic does not allocate.
var ErrNotRoCE = errors.New("icrc: not a RoCE frame")

// FrameError reports a frame that looks like RoCE but whose headers are
// inconsistent or cut before the transport header can be located.
type FrameError struct {
	Step   string // the header being decoded: "ethernet", "ipv4", "udp", ...
	Offset int    // offset of that header in the frame
	Detail string
	// Truncated is set when the capture ends before the headers needed to
	// locate the packet: a snap-length effect, not a malformed packet.
	Truncated bool
	// Kind is the encapsulation when the frame was identified as RoCE (UDP
	// destination port 4791 seen, or EtherType 0x8915) before the error;
	// zero when nothing says the frame is RoCE.
	Kind Kind
}

// Error names the header, its offset and what is wrong.
func (e *FrameError) Error() string {
	return fmt.Sprintf("icrc: %s header at offset %d: %s", e.Step, e.Offset, e.Detail)
}

// CheckFrame finds the RoCE packet in an Ethernet II frame (with any number
// of 802.1Q/802.1ad tags) and checks its ICRC. It computes in place, does
// not allocate for RoCE or non-RoCE frames, and never panics on short input.
func CheckFrame(frame []byte) (Result, error) {
	if len(frame) < 14 {
		return Result{}, &FrameError{Step: "ethernet", Detail: fmt.Sprintf("%d bytes, need 14", len(frame)), Truncated: true}
	}
	r, err := CheckL3(binary.BigEndian.Uint16(frame[12:]), frame[14:])
	if err != nil {
		if fe, ok := err.(*FrameError); ok {
			fe.Offset += 14
		}
		return Result{}, err
	}
	r.shift(14)
	return r, nil
}

// CheckL3 is CheckFrame for a packet that starts after its EtherType (for
// raw-IP and Linux cooked captures): pkt begins with the network header, or
// with VLAN tags when etherType is a VLAN TPID.
func CheckL3(etherType uint16, pkt []byte) (Result, error) {
	off := 0
	var vlan [MaxVLANTags]uint16
	nv := 0
	for etherType == EtherTypeVLAN || etherType == EtherTypeQinQ || etherType == EtherTypeQinQ91 {
		if len(pkt) < off+4 {
			return Result{}, &FrameError{Step: "vlan", Offset: off, Detail: "capture ends inside a VLAN tag", Truncated: true}
		}
		if nv < MaxVLANTags {
			vlan[nv] = binary.BigEndian.Uint16(pkt[off:]) & 0x0fff
		}
		nv++
		etherType = binary.BigEndian.Uint16(pkt[off+2:])
		off += 4
	}
	var (
		r   Result
		err error
	)
	switch etherType {
	case EtherTypeIPv4:
		r, err = checkIPv4(pkt[off:])
	case EtherTypeIPv6:
		r, err = checkIPv6(pkt[off:])
	case EtherTypeRoCEv1:
		r, err = checkRoCEv1(pkt[off:])
	default:
		return Result{}, ErrNotRoCE
	}
	if err != nil {
		if fe, ok := err.(*FrameError); ok {
			fe.Offset += off
		}
		return Result{}, err
	}
	r.EtherType, r.NumVLAN, r.VLAN = etherType, nv, vlan
	r.shift(off)
	return r, nil
}

// shift moves the offsets of r by n bytes.
func (r *Result) shift(n int) {
	r.L3 += n
	if r.UDP >= 0 {
		r.UDP += n
	}
	r.BTH += n
	r.End += n
}

// minUDPLen is the smallest UDP length that holds a RoCE packet.
const minUDPLen = 8 + bthLen + Len

func checkIPv4(pkt []byte) (Result, error) {
	if len(pkt) < 20 {
		if len(pkt) >= 10 && pkt[9] != 17 {
			return Result{}, ErrNotRoCE
		}
		return Result{}, &FrameError{Step: "ipv4", Detail: fmt.Sprintf("capture ends after %d bytes of the IPv4 header", len(pkt)), Truncated: true}
	}
	ihl := int(pkt[0]&0x0f) * 4
	// Not IPv4, not UDP, or a fragment (which cannot be checked alone; RoCE
	// senders set DF, rxe always): nothing here is RoCE.
	if pkt[0]>>4 != 4 || pkt[9] != 17 || binary.BigEndian.Uint16(pkt[6:])&0x3fff != 0 || ihl < 20 {
		return Result{}, ErrNotRoCE
	}
	r, err := udpLayout(pkt, ihl, int(binary.BigEndian.Uint16(pkt[2:]))-ihl, KindRoCEv2IPv4)
	if err != nil || r.Status == StatusTruncated {
		return r, err
	}
	r.Computed = ipv4Sum(pkt[:ihl], pkt[ihl:r.End])
	r.Wire = Wire(pkt[:r.End])
	r.Status = verdict(r.Computed, r.Wire)
	return r, nil
}

func checkIPv6(pkt []byte) (Result, error) {
	if len(pkt) < 40 {
		if len(pkt) >= 7 && pkt[6] != 17 {
			return Result{}, ErrNotRoCE
		}
		return Result{}, &FrameError{Step: "ipv6", Detail: fmt.Sprintf("capture ends after %d bytes of the IPv6 header", len(pkt)), Truncated: true}
	}
	// RoCEv2 puts UDP directly after the fixed header; a packet with
	// extension headers is not one the annex A17 ICRC rule covers.
	if pkt[0]>>4 != 6 || pkt[6] != 17 {
		return Result{}, ErrNotRoCE
	}
	r, err := udpLayout(pkt, 40, int(binary.BigEndian.Uint16(pkt[4:])), KindRoCEv2IPv6)
	if err != nil || r.Status == StatusTruncated {
		return r, err
	}
	r.Computed = ipv6Sum(pkt[:40], pkt[40:r.End])
	r.Wire = Wire(pkt[:r.End])
	r.Status = verdict(r.Computed, r.Wire)
	return r, nil
}

// udpLayout finds the UDP header at pkt[l3len:], decides by its
// destination port whether the packet is RoCE, checks the UDP length
// against the ipPayload bytes the IP header gives it, and fills in the
// offsets.
func udpLayout(pkt []byte, l3len, ipPayload int, kind Kind) (Result, error) {
	if len(pkt) < l3len+4 {
		return Result{}, &FrameError{Step: "udp", Offset: l3len, Detail: "capture ends before the UDP destination port", Truncated: true}
	}
	u := pkt[l3len:]
	if binary.BigEndian.Uint16(u[2:]) != UDPPort {
		return Result{}, ErrNotRoCE
	}
	if len(u) < 8 {
		return Result{}, &FrameError{Step: "udp", Offset: l3len, Detail: "capture ends inside the UDP header", Truncated: true, Kind: kind}
	}
	ulen := int(binary.BigEndian.Uint16(u[4:]))
	if ulen < minUDPLen {
		return Result{}, &FrameError{Step: "udp", Offset: l3len, Detail: fmt.Sprintf("UDP length %d cannot hold BTH and ICRC (%d)", ulen, minUDPLen), Kind: kind}
	}
	if ulen > ipPayload {
		return Result{}, &FrameError{Step: "udp", Offset: l3len, Detail: fmt.Sprintf("UDP length %d exceeds the %d bytes the IP header gives it", ulen, ipPayload), Kind: kind}
	}
	r := Result{Kind: kind, L3Len: l3len, UDP: l3len, BTH: l3len + 8, End: l3len + ulen, Status: StatusOK}
	if len(pkt) < r.End {
		r.Status = StatusTruncated
	}
	return r, nil
}

func checkRoCEv1(pkt []byte) (Result, error) {
	if len(pkt) < 40 {
		return Result{}, &FrameError{Step: "grh", Detail: fmt.Sprintf("capture ends after %d bytes of the GRH", len(pkt)), Truncated: true, Kind: KindRoCEv1}
	}
	if pkt[6] != grhNextHeaderIBA {
		return Result{}, &FrameError{Step: "grh", Detail: fmt.Sprintf("next header 0x%02x, want 0x1b (IBA transport)", pkt[6]), Kind: KindRoCEv1}
	}
	// PayLen counts from the byte after the GRH through the ICRC (§8.3.1).
	plen := int(binary.BigEndian.Uint16(pkt[4:]))
	if plen < bthLen+Len {
		return Result{}, &FrameError{Step: "grh", Detail: fmt.Sprintf("payload length %d cannot hold BTH and ICRC", plen), Kind: KindRoCEv1}
	}
	r := Result{Kind: KindRoCEv1, L3Len: 40, UDP: -1, BTH: 40, End: 40 + plen, Status: StatusOK}
	if len(pkt) < r.End {
		r.Status = StatusTruncated
		return r, nil
	}
	r.Computed = roceV1Sum(pkt[:40], pkt[40:r.End])
	r.Wire = Wire(pkt[:r.End])
	r.Status = verdict(r.Computed, r.Wire)
	return r, nil
}

func verdict(computed, wire uint32) Status {
	if computed == wire {
		return StatusOK
	}
	return StatusMismatch
}
