package mad

import (
	"errors"
	"fmt"
	"net/netip"
)

// PortSpace is an rdma_cm port space: bits 31-16 of its service IDs.
type PortSpace uint16

// The port spaces of rdma_cm (IBTA annex A11 for the IP-based ones).
const (
	PortSpaceIPoIB PortSpace = 0x0002
	PortSpaceTCP   PortSpace = 0x0106 // RDMA_PS_TCP: RC and UC connections
	PortSpaceUDP   PortSpace = 0x0111 // RDMA_PS_UDP: UD, resolved by SIDR
	PortSpaceIB    PortSpace = 0x013F // RDMA_PS_IB: any QP type
)

var portSpaceNames = map[PortSpace]string{PortSpaceIPoIB: "RDMA_PS_IPOIB", PortSpaceTCP: "RDMA_PS_TCP",
	PortSpaceUDP: "RDMA_PS_UDP", PortSpaceIB: "RDMA_PS_IB"}

// String names the port space ("RDMA_PS_TCP"), or gives its number.
func (p PortSpace) String() string {
	if s, ok := portSpaceNames[p]; ok {
		return s
	}
	return fmt.Sprintf("PS(0x%04x)", uint16(p))
}

// ServiceID is a CM service ID (IBTA §12.6.5, annex A3).
type ServiceID uint64

// rdma_cm's service IDs are 0x00000000_01PPPPPP: the top five bytes fixed,
// then the port space and port.
const (
	rdmaCMServiceIDBase = 0x0000000001000000
	rdmaCMServiceIDMask = 0xFFFFFFFFFF000000
)

// RDMACMServiceID is the service ID rdma_cm listens on and connects to
// for a port in a port space: (port space << 16) | port.
func RDMACMServiceID(ps PortSpace, port uint16) ServiceID {
	return ServiceID(uint64(ps)<<16 | uint64(port))
}

// IsRDMACM reports whether s has the form of an rdma_cm service ID.
func (s ServiceID) IsRDMACM() bool { return s&rdmaCMServiceIDMask == rdmaCMServiceIDBase }

// PortSpace is bits 31-16.
func (s ServiceID) PortSpace() PortSpace { return PortSpace(s >> 16) }

// Port is bits 15-0.
func (s ServiceID) Port() uint16 { return uint16(s) }

// String renders an rdma_cm service ID as "RDMA_PS_TCP:7174" and any other
// as hex.
func (s ServiceID) String() string {
	if s.IsRDMACM() {
		return fmt.Sprintf("%s:%d", s.PortSpace(), s.Port())
	}
	return fmt.Sprintf("0x%016x", uint64(s))
}

// Short renders an rdma_cm service ID as "0x106:7174" and any other as hex.
func (s ServiceID) Short() string {
	if s.IsRDMACM() {
		return fmt.Sprintf("0x%x:%d", uint16(s.PortSpace()), s.Port())
	}
	return fmt.Sprintf("0x%x", uint64(s))
}

// CMAHeaderLen is the size of rdma_cm's header in REQ and SIDR_REQ private data.
const CMAHeaderLen = 36

// CMAVersion is the only cma_hdr version.
const CMAVersion = 0

// CMAHeader views rdma_cm's 36-byte header: version (byte 0), IP version
// in the high nibble of byte 1, the sender's port (2-3), its address
// (4-19) and the destination address (20-35). IPv4 addresses take the
// last 4 bytes of their 16 with 12 zero bytes before them.
type CMAHeader []byte

// Errors of ParseCMAHeader.
var (
	ErrCMAShort     = errors.New("mad: private data shorter than a cma_hdr")
	ErrCMAVersion   = errors.New("mad: cma_hdr version is not 0")
	ErrCMAIPVersion = errors.New("mad: cma_hdr IP version is neither 4 nor 6")
)

// ParseCMAHeader views the head of REQ or SIDR_REQ private data as a
// cma_hdr and checks it as rdma_cm does: version 0, IP version 4 or 6.
// The view is returned with a version error too (nil when pd is short).
func ParseCMAHeader(pd []byte) (CMAHeader, error) {
	if len(pd) < CMAHeaderLen {
		return nil, ErrCMAShort
	}
	h := CMAHeader(pd[:CMAHeaderLen])
	if h.Version() != CMAVersion {
		return h, ErrCMAVersion
	}
	if v := h.IPVersion(); v != 4 && v != 6 {
		return h, ErrCMAIPVersion
	}
	return h, nil
}

// Version is byte 0.
func (h CMAHeader) Version() uint8 { return h[0] }

// IPVersion is the high nibble of byte 1: 4 or 6.
func (h CMAHeader) IPVersion() uint8 { return h[1] >> 4 }

// Port is the sender's port.
func (h CMAHeader) Port() uint16 { return be.Uint16(h[2:]) }

// SrcAddr is the sender's address (IPv4 when IPVersion is 4).
func (h CMAHeader) SrcAddr() netip.Addr { return h.addr(4) }

// DstAddr is the destination address.
func (h CMAHeader) DstAddr() netip.Addr { return h.addr(20) }

func (h CMAHeader) addr(o int) netip.Addr {
	if h.IPVersion() == 4 {
		return netip.AddrFrom4([4]byte(h[o+12 : o+16]))
	}
	return netip.AddrFrom16([16]byte(h[o : o+16]))
}

// SetVersion writes byte 0.
func (h CMAHeader) SetVersion(v uint8) { h[0] = v }

// SetIPVersion writes the high nibble of byte 1, keeping the low one.
func (h CMAHeader) SetIPVersion(v uint8) { h[1] = h[1]&0x0f | v<<4 }

// SetPort writes the sender's port.
func (h CMAHeader) SetPort(v uint16) { be.PutUint16(h[2:], v) }

// SetSrcAddr writes the sender's address in the layout of IPVersion.
func (h CMAHeader) SetSrcAddr(a netip.Addr) { h.setAddr(4, a) }

// SetDstAddr writes the destination address in the layout of IPVersion.
func (h CMAHeader) SetDstAddr(a netip.Addr) { h.setAddr(20, a) }

func (h CMAHeader) setAddr(o int, a netip.Addr) {
	d := h[o : o+16]
	clear(d)
	switch {
	case !a.IsValid():
	case h.IPVersion() == 4:
		b := a.Unmap().As4()
		copy(d[12:], b[:])
	default:
		b := a.As16()
		copy(d, b[:])
	}
}

// Encode writes a whole header as rdma_cm does for a connection from src
// to dst: version 0, IP version 4 when src is IPv4 (or IPv4-mapped) and 6
// otherwise, src's port and both addresses.
func (h CMAHeader) Encode(src netip.AddrPort, dst netip.Addr) {
	clear(h[:CMAHeaderLen])
	v := uint8(6)
	if src.Addr().Unmap().Is4() {
		v = 4
	}
	h.SetIPVersion(v)
	h.SetPort(src.Port())
	h.SetSrcAddr(src.Addr())
	h.SetDstAddr(dst)
}
