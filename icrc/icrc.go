// Package icrc computes and verifies the RoCE invariant CRC (IBTA vol. 1
// annex A17.3.3): CRC-32 (IEEE) over a stand-in LRH of eight 0xFF bytes, the
// IP (or GRH) header and UDP header with their variant fields set to ones,
// the BTH with its resv8a byte set to ones, and the rest of the packet up to
// the ICRC. The result goes on the wire least-significant byte first.
//
// Everything is computed in place over the caller's bytes; only the few
// header bytes that need masking are staged on the stack.
package icrc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// Len is the size of the ICRC trailer.
const Len = 4

const bthLen = 12

var lrh = [8]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// crcLRH is the CRC state after the LRH stand-in; seeding with it skips
// hashing the eight constant bytes on every packet.
var crcLRH = crc32.Update(0, crc32.IEEETable, lrh[:])

// ErrShort reports a buffer too small to hold the headers and ICRC.
var ErrShort = errors.New("icrc: packet too short")

func update(crc uint32, p []byte) uint32 { return crc32.Update(crc, crc32.IEEETable, p) }

// tail hashes the BTH (masked) and everything after it up to the ICRC.
func tail(crc uint32, roce []byte) uint32 {
	var b [bthLen]byte
	copy(b[:], roce[:bthLen])
	b[4] = 0xff
	crc = update(crc, b[:])
	return update(crc, roce[bthLen:len(roce)-Len])
}

// IPv4 returns the ICRC of a RoCEv2 packet given its IPv4 header (options
// included) and its UDP segment (UDP header, BTH ... ICRC). The ICRC bytes
// themselves are not hashed.
func IPv4(ip, udp []byte) (uint32, error) {
	if len(ip) < 20 || len(ip) > 60 || len(udp) < 8+bthLen+Len {
		return 0, ErrShort
	}
	var h [68]byte
	n := copy(h[:], ip)
	h[1] = 0xff               // TOS
	h[8] = 0xff               // TTL
	h[10], h[11] = 0xff, 0xff // header checksum
	copy(h[n:], udp[:8])
	h[n+6], h[n+7] = 0xff, 0xff // UDP checksum
	crc := update(crcLRH, h[:n+8])
	return tail(crc, udp[8:]), nil
}

// IPv6 is IPv4's counterpart: traffic class, flow label and hop limit masked.
func IPv6(ip, udp []byte) (uint32, error) {
	if len(ip) < 40 || len(udp) < 8+bthLen+Len {
		return 0, ErrShort
	}
	var h [48]byte
	copy(h[:], ip[:40])
	h[0] |= 0x0f
	h[1], h[2], h[3] = 0xff, 0xff, 0xff
	h[7] = 0xff
	copy(h[40:], udp[:8])
	h[46], h[47] = 0xff, 0xff
	crc := update(crcLRH, h[:])
	return tail(crc, udp[8:]), nil
}

// RoCEv1 returns the ICRC of a RoCEv1 packet: GRH (traffic class, flow
// label and hop limit masked) followed by BTH ... ICRC.
func RoCEv1(grh, roce []byte) (uint32, error) {
	if len(grh) < 40 || len(roce) < bthLen+Len {
		return 0, ErrShort
	}
	var h [40]byte
	copy(h[:], grh[:40])
	h[0] |= 0x0f
	h[1], h[2], h[3] = 0xff, 0xff, 0xff
	h[7] = 0xff
	return tail(update(crcLRH, h[:]), roce), nil
}

// Wire returns the ICRC carried in the last four bytes of a packet.
func Wire(pkt []byte) uint32 { return binary.LittleEndian.Uint32(pkt[len(pkt)-Len:]) }

// Put stores crc into the last four bytes of pkt, as on the wire.
func Put(pkt []byte, crc uint32) { binary.LittleEndian.PutUint32(pkt[len(pkt)-Len:], crc) }

// Header describes the IP and UDP header a packet is (or will be) sent
// with, for links that do not build the headers themselves (kernel UDP
// sockets): the ICRC is computed over a header synthesised from it.
type Header struct {
	Src, Dst  []byte // 4 bytes (IPv4) or 16 bytes (IPv6)
	ID        uint16 // IPv4 identification; Linux sends 0 with IP_PMTUDISC_DO
	DF        bool   // IPv4 don't-fragment flag
	SrcPort   uint16
	DstPort   uint16
	FlowLabel uint32 // masked anyway; kept for completeness
}

// Synth computes the ICRC of roce (BTH ... ICRC) as if sent with h.
func Synth(h *Header, roce []byte) (uint32, error) {
	if len(roce) < bthLen+Len {
		return 0, ErrShort
	}
	var b [48]byte
	udpLen := 8 + len(roce)
	switch {
	case len(h.Src) == 4 && len(h.Dst) == 4:
		b[0] = 0x45
		b[1] = 0xff
		binary.BigEndian.PutUint16(b[2:], uint16(20+udpLen))
		binary.BigEndian.PutUint16(b[4:], h.ID)
		if h.DF {
			b[6] = 0x40
		}
		b[8], b[9] = 0xff, 17
		b[10], b[11] = 0xff, 0xff
		copy(b[12:], h.Src)
		copy(b[16:], h.Dst)
		putUDP(b[20:28], h.SrcPort, h.DstPort, udpLen)
		return tail(update(crcLRH, b[:28]), roce), nil
	case len(h.Src) == 16 && len(h.Dst) == 16:
		b[0], b[1], b[2], b[3] = 0x6f, 0xff, 0xff, 0xff
		binary.BigEndian.PutUint16(b[4:], uint16(udpLen))
		b[6], b[7] = 17, 0xff
		copy(b[8:], h.Src)
		copy(b[24:], h.Dst)
		crc := update(crcLRH, b[:40])
		var u [8]byte
		putUDP(u[:], h.SrcPort, h.DstPort, udpLen)
		return tail(update(crc, u[:]), roce), nil
	}
	return 0, fmt.Errorf("icrc: addresses must both be IPv4 or both IPv6 (got %d and %d bytes)", len(h.Src), len(h.Dst))
}

func putUDP(u []byte, sport, dport uint16, length int) {
	binary.BigEndian.PutUint16(u[0:], sport)
	binary.BigEndian.PutUint16(u[2:], dport)
	binary.BigEndian.PutUint16(u[4:], uint16(length))
	u[6], u[7] = 0xff, 0xff
}
