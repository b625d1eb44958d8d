package bth

import (
	"errors"
	"fmt"
)

// CNPLen is the size of a RoCEv2 Congestion Notification Packet from the
// BTH through the ICRC: BTH, 16 reserved bytes, ICRC (IBTA annex A17.9).
const CNPLen = BTHLen + CNPPayloadLen + ICRCLen

// CNPFields is what a CNP says: the QP to slow down, in the partition it was
// sent in. Everything else in a CNP is fixed.
type CNPFields struct {
	DestQP uint32 // the requester QP whose rate the receiver asks to cut
	PKey   uint16
}

// BuildCNP writes the CNP described by c into dst (at least CNPLen bytes) and returns
// CNPLen: opcode 0x81, BECN set, FECN, AckReq and PSN zero, the 16 reserved
// bytes zero, and a zeroed ICRC slot that the link fills as for any RoCEv2
// packet (the ICRC covers the IP and UDP headers, which the link owns).
func BuildCNP(dst []byte, c CNPFields) (int, error) {
	f := Fields{BTH: BTHFields{Opcode: CNP, PKey: c.PKey, BECN: true, DestQP: c.DestQP}}
	n := WriteHeaders(dst, &f, CNPPayloadLen)
	if n < 0 {
		return 0, fmt.Errorf("bth: build CNP: need %d bytes, have %d", CNPLen, len(dst))
	}
	clear(dst[BTHLen : BTHLen+CNPPayloadLen])
	return n, nil
}

// ErrNotCNP is returned by ParseCNP for a well-formed packet of another opcode.
var ErrNotCNP = errors.New("bth: not a CNP")

// ParseCNP decodes b (BTH through ICRC) as a CNP. Malformed input returns
// Parse's *ParseError, another opcode an error wrapping ErrNotCNP. BECN is
// not required: a CNP without it is still a congestion signal, and
// dropping it would only hide congestion (callers read BECN from the BTH
// if they care). The ICRC is not checked here: the link did that.
func ParseCNP(b []byte) (CNPFields, error) {
	var p Packet
	if err := Parse(&p, b); err != nil {
		return CNPFields{}, err
	}
	if p.Info.Op != OpCNP {
		return CNPFields{}, fmt.Errorf("%w: opcode 0x%02x %s", ErrNotCNP, uint8(p.BTH.Opcode()), p.BTH.Opcode())
	}
	return CNPFields{DestQP: p.BTH.DestQP(), PKey: p.BTH.PKey()}, nil
}
