// Package nic defines Link, the small interface every packet backend
// implements (kernel UDP sockets, AF_XDP, the in-process pipe), and the
// pieces that work around any Link (impairment).
//
// A Link moves RoCEv2 packets, meaning UDP payloads from the BTH through
// the ICRC, in batches. The transport above it never knows which backend it
// runs on: the backend owns the IP and UDP headers, so it also owns the
// ICRC, which covers them. It fills the ICRC on send and checks it on
// receive, dropping and counting packets whose ICRC is wrong.
package nic

import (
	"net/netip"
)

// RoCEv2Port is the IANA UDP destination port for RoCEv2.
const RoCEv2Port = 4791

// ICRCStatus says what a backend could verify of a received packet's ICRC.
type ICRCStatus uint8

const (
	// ICRCVerified: the whole ICRC was checked over the real IP/UDP headers.
	ICRCVerified ICRCStatus = iota + 1
	// ICRCUnverified: the ICRC was not checked, because the backend cannot
	// know the IP header the peer hashed (an IPv4 header with options seen
	// through a kernel UDP socket) or was configured not to check. Stats
	// counts each reason.
	ICRCUnverified
	// ICRCPartial: the backend cannot see the peer's IPv4 Identification
	// (a kernel UDP socket hides it), so it recovered the ID from the ICRC
	// itself and checked the rest: PartialICRCBits of the 32 bits are a
	// genuine check, so a corrupted packet passes with probability about
	// 2^-16
	// (see icrc.SolveIPv4ID). It assumes the peer set DF on an unfragmented
	// packet, as rxe and RoCE NICs do.
	ICRCPartial
)

// PartialICRCBits is the strength of the check behind ICRCPartial.
const PartialICRCBits = 16

// CheckBits is the number of ICRC bits that checked the packet: 32 when
// verified, PartialICRCBits when partially verified, 0 otherwise.
func (s ICRCStatus) CheckBits() int {
	switch s {
	case ICRCVerified:
		return 32
	case ICRCPartial:
		return PartialICRCBits
	}
	return 0
}

func (s ICRCStatus) String() string {
	switch s {
	case ICRCVerified:
		return "verified"
	case ICRCUnverified:
		return "unverified"
	case ICRCPartial:
		return "partially verified (16 bits)"
	}
	return "unknown"
}

// Packet is one RoCEv2 packet in a batch. Buf is storage owned by the
// caller (cap >= the link's MaxPacket); N is the number of valid bytes.
type Packet struct {
	Buf []byte
	N   int
	// Remote is the peer: the destination on Send, the source on Recv.
	Remote netip.AddrPort
	// Local is the local address: the source on Send (zero: the backend's
	// default), the destination on Recv.
	Local netip.Addr
	// SrcPort is the UDP source port wanted on Send (0: backend's choice).
	// RoCEv2 peers accept any source port; rxe picks one per QP for ECMP.
	SrcPort uint16
	// ICRC is set on Recv.
	ICRC ICRCStatus
	// IPKnown says that a link that sees the received packet's IP header
	// filled the fields below (a UD receiver writes them into the GRH).
	// HopLimit is the IPv4 TTL or IPv6 hop limit, TClass the IPv4 TOS
	// (DSCP and ECN) or IPv6 traffic class, IPID the IPv4 identification,
	// FlowLabel the IPv6 flow label. On Send, HopLimit and TClass are the
	// address vector's (the GRH hop limit and traffic class, which RoCEv2
	// carries in the IP header, as rxe does): a link that writes or can
	// set them sends them, HopLimit 0 meaning its default TTL (64); the
	// in-process pipe carries TClass to the peer's Recv and ignores
	// HopLimit. IPKnown, IPID and FlowLabel are ignored on Send.
	IPKnown   bool
	HopLimit  uint8
	TClass    uint8
	IPID      uint16
	FlowLabel uint32
}

// Bytes returns the valid bytes.
func (p *Packet) Bytes() []byte { return p.Buf[:p.N] }

// Link is a batched packet backend.
type Link interface {
	// Recv blocks until at least one packet arrives, fills pkts[0:n] and
	// returns n. After Close it returns net.ErrClosed.
	Recv(pkts []Packet) (n int, err error)
	// Send computes each packet's ICRC into its last four bytes and
	// transmits the batch. On success it returns len(pkts) and nil.
	// Packets the link can never send (no or wrong-family destination,
	// too large) are dropped, counted in Stats.TxErrors, and not an error.
	// When one packet fails otherwise (its peer is unreachable, its next
	// hop unresolved), Send returns n, its index (the packets before it
	// were handed to the wire, or dropped as above), and the error:
	// pkts[n] was not sent and none after it was tried. The caller skips
	// pkts[n] and calls Send again with pkts[n+1:] (a reliable transport
	// retransmits pkts[n] later). An error wrapping net.ErrClosed means
	// the link is closed: nothing more will be sent.
	Send(pkts []Packet) (n int, err error)
	// BatchSize is the largest batch worth passing to Recv or Send.
	BatchSize() int
	// MTU is the IP MTU of the link: the largest IP packet it carries.
	MTU() int
	// Addrs are the local IP addresses the link sends from and receives on.
	Addrs() []netip.Addr
	// Stats returns the link's counters.
	Stats() Stats
	// Close releases the link and unblocks Recv.
	Close() error
}

// SendWrapper is a Link that wraps another and changes only what it
// sends (e.g. a destination port rewrite): everything it receives is
// what RecvSide returns. A driver receives from ReceiveSide of a link,
// so that the wrapped link's receive loops (blocking, polling, inline)
// stay available through the wrapper.
type SendWrapper interface {
	Link
	RecvSide() Link
}

// ReceiveSide follows SendWrappers to the link that actually receives.
func ReceiveSide(l Link) Link {
	for {
		w, ok := l.(SendWrapper)
		if !ok {
			return l
		}
		l = w.RecvSide()
	}
}

// Stats are counters every Link keeps. Every delivered packet (RxPackets)
// is in exactly one ICRC class: RxICRCVerified + RxICRCPartial +
// RxICRCUnverified = RxPackets.
type Stats struct {
	RxPackets, TxPackets uint64
	RxBytes, TxBytes     uint64
	RxICRCVerified       uint64 // accepted, the whole ICRC checked (ICRCVerified)
	RxICRCPartial        uint64 // accepted, PartialICRCBits of it checked (ICRCPartial)
	RxICRCUnverified     uint64 // accepted without an ICRC check: the sum of the reasons below
	// Why packets went unverified.
	RxUnverifiedIPOptions uint64 // IPv4 header with options (or control data cut short): not solvable
	RxUnverifiedOff       uint64 // checking turned off by configuration
	RxICRCBad             uint64 // dropped: ICRC mismatch (or, partially verified, no ID fits)
	RxMalformed           uint64 // dropped: not a RoCEv2 packet the link can deliver
	RxTruncated           uint64 // dropped: larger than the receive buffer
	TxErrors              uint64
}

// Overhead is what IP and UDP add to a RoCE packet: the largest RoCE
// packet (BTH..ICRC) on a link is MTU - Overhead(ipv6).
func Overhead(ipv6 bool) int {
	if ipv6 {
		return 40 + 8
	}
	return 20 + 8
}

// IBMTU returns the largest IB path MTU (256..4096) whose packets fit a
// link of IP MTU mtu, using rxe's rule (netdev MTU minus 80 bytes of
// IPv6+UDP+BTH+RETH+ICRC headroom), or 0 when even 256 does not fit.
func IBMTU(mtu int) int {
	room := mtu - 80
	for m := 4096; m >= 256; m >>= 1 {
		if m <= room {
			return m
		}
	}
	return 0
}
