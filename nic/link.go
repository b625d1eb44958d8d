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
	// ICRCUnverified: the backend cannot see the IP header the peer sent
	// (kernel UDP sockets over IPv4 hide the IPv4 ID), so the ICRC was not
	// checked. The transport still has the UDP checksum-free payload.
	ICRCUnverified
)

func (s ICRCStatus) String() string {
	switch s {
	case ICRCVerified:
		return "verified"
	case ICRCUnverified:
		return "unverified"
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
}

// Bytes returns the valid bytes.
func (p *Packet) Bytes() []byte { return p.Buf[:p.N] }

// Link is a batched packet backend.
type Link interface {
	// Recv blocks until at least one packet arrives, fills pkts[0:n] and
	// returns n. After Close it returns net.ErrClosed.
	Recv(pkts []Packet) (n int, err error)
	// Send computes each packet's ICRC into its last four bytes and
	// transmits the batch. It returns how many were handed to the wire.
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

// Stats are counters every Link keeps.
type Stats struct {
	RxPackets, TxPackets uint64
	RxBytes, TxBytes     uint64
	RxICRCBad            uint64 // dropped: ICRC mismatch
	RxICRCUnverified     uint64 // accepted without an ICRC check (see ICRCUnverified)
	RxMalformed          uint64 // dropped: not a RoCEv2 packet the link can deliver
	RxTruncated          uint64 // dropped: larger than the receive buffer
	TxErrors             uint64
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
