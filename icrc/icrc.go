// Package icrc computes and verifies the RoCE invariant CRC (IBTA vol. 1
// annex A17.3.3): CRC-32 (IEEE) over a stand-in LRH of eight 0xFF bytes, the
// IP (or GRH) header and UDP header with their variant fields set to ones,
// the BTH with its resv8a byte set to ones, and the rest of the packet up to
// the ICRC. The result goes on the wire least-significant byte first.
//
// Everything is computed in place over the caller's bytes, without
// copying: the masking is folded into the CRC's starting state.
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

// slicing8 holds the tables of the slicing-by-8 CRC-32 (IEEE, reflected)
// used for the staged header bytes. hash/crc32 would do as well, but
// handing it a stack buffer moves the buffer to the heap (the hardware
// path is called through a function value), which would cost one
// allocation per packet.
//
// It is built by a variable initializer, not init, because the masking
// tables (fast.go, whose init runs first) are derived from it.
var slicing8 = makeSlicing8()

func makeSlicing8() *[8][256]uint32 {
	var t [8][256]uint32
	for i := range 256 {
		c := uint32(i)
		for range 8 {
			if c&1 != 0 {
				c = c>>1 ^ crc32.IEEE
			} else {
				c >>= 1
			}
		}
		t[0][i] = c
	}
	for i := range 256 {
		c := t[0][i]
		for k := 1; k < 8; k++ {
			c = t[0][c&0xff] ^ c>>8
			t[k][i] = c
		}
	}
	return &t
}

// updateSmall is crc32.Update(crc, IEEETable, p) for short buffers that
// must stay on the caller's stack.
func updateSmall(crc uint32, p []byte) uint32 {
	crc = ^crc
	t := slicing8
	for len(p) >= 8 {
		crc ^= uint32(p[0]) | uint32(p[1])<<8 | uint32(p[2])<<16 | uint32(p[3])<<24
		crc = t[0][p[7]] ^ t[1][p[6]] ^ t[2][p[5]] ^ t[3][p[4]] ^
			t[4][crc>>24] ^ t[5][crc>>16&0xff] ^ t[6][crc>>8&0xff] ^ t[7][crc&0xff]
		p = p[8:]
	}
	if len(p) >= 4 { // one slicing-by-4 step rather than four byte steps
		crc ^= uint32(p[0]) | uint32(p[1])<<8 | uint32(p[2])<<16 | uint32(p[3])<<24
		crc = t[0][crc>>24] ^ t[1][crc>>16&0xff] ^ t[2][crc>>8&0xff] ^ t[3][crc&0xff]
		p = p[4:]
	}
	for _, v := range p {
		crc = t[0][byte(crc)^v] ^ crc>>8
	}
	return ^crc
}

// The sums below hash the caller's bytes in place, the masking folded
// into the starting state (fast.go). When the headers and the rest of the
// packet are contiguous it is one crc32 call; otherwise the short header
// goes through updateSmall first. Callers have checked the lengths.

// body hashes p up to its ICRC: crc32 over a multiple of 16 bytes (its
// vector path, from 64 bytes), then the slicing-by-8 loop over the last
// 0..15, which crc32 would hash a byte at a time.
func body(c uint32, p []byte) uint32 {
	p = p[:len(p)-Len]
	k := len(p) &^ 15
	return updateSmall(update(c, p[:k]), p[k:])
}

// ipv4Sum: ip is the whole IPv4 header (20..60 bytes), udp the UDP
// segment through the ICRC (at least 8+12+4 bytes). The usual packet,
// contiguous and without IP options, takes the shortest path: every
// instruction before the crc32 call shows when packets come back to back.
func ipv4Sum(ip, udp []byte) uint32 {
	if len(ip) == 20 && cap(ip) >= 20+len(udp) && &ip[:21][20] == &udp[0] {
		pkt := ip[:20+len(udp)]
		_ = pkt[20+13] // one bounds check for both fixes
		p := pkt[:len(pkt)-Len]
		k := len(p) &^ 15 // body, written out
		return updateSmall(update(crcLRH^fixIPv4(pkt)^fixUDP20(pkt), p[:k]), p[k:])
	}
	return ipv4SumAny(ip, udp)
}

func ipv4SumAny(ip, udp []byte) uint32 {
	if pkt, ok := contiguous(ip, udp); ok {
		return body(crcLRH^fixIPv4(pkt)^fixUDP(pkt, len(ip)), pkt)
	}
	c := updateSmall(crcLRH^fixIPv4(ip), ip)
	return body(c^fixUDP(udp, 0), udp)
}

// ipv6Sum: ip is the 40-byte IPv6 header, udp as for ipv4Sum.
func ipv6Sum(ip, udp []byte) uint32 {
	if pkt, ok := contiguous(ip[:40], udp); ok {
		return body(crcLRH^fixGRH(pkt)^fixUDP(pkt, 40), pkt)
	}
	c := updateSmall(crcLRH^fixGRH(ip), ip[:40])
	return body(c^fixUDP(udp, 0), udp)
}

// roceV1Sum: grh is the 40-byte GRH, roce the BTH through the ICRC.
func roceV1Sum(grh, roce []byte) uint32 {
	if pkt, ok := contiguous(grh[:40], roce); ok {
		return body(crcLRH^fixGRH(pkt)^fixBTH(pkt, 40), pkt)
	}
	c := updateSmall(crcLRH^fixGRH(grh), grh[:40])
	return body(c^fixBTH(roce, 0), roce)
}

// IPv4 returns the ICRC of a RoCEv2 packet given its IPv4 header (options
// included) and its UDP segment (UDP header, BTH ... ICRC). The ICRC bytes
// themselves are not hashed.
func IPv4(ip, udp []byte) (uint32, error) {
	if uint(len(ip))-20 > 60-20 || len(udp) < 8+bthLen+Len { // one compare for 20..60, to stay inlinable
		return 0, ErrShort
	}
	return ipv4Sum(ip, udp), nil
}

// IPv6 is IPv4's counterpart: traffic class, flow label and hop limit masked.
func IPv6(ip, udp []byte) (uint32, error) {
	if len(ip) < 40 || len(udp) < 8+bthLen+Len {
		return 0, ErrShort
	}
	return ipv6Sum(ip, udp), nil
}

// RoCEv1 returns the ICRC of a RoCEv1 packet: GRH (traffic class, flow
// label and hop limit masked) followed by BTH ... ICRC.
func RoCEv1(grh, roce []byte) (uint32, error) {
	if len(grh) < 40 || len(roce) < bthLen+Len {
		return 0, ErrShort
	}
	return roceV1Sum(grh, roce), nil
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
	udpLen := 8 + len(roce)
	switch {
	case len(h.Src) == 4 && len(h.Dst) == 4:
		return body(synthV4(h, len(roce))^fixBTH(roce, 0), roce), nil
	case len(h.Src) == 16 && len(h.Dst) == 16:
		var b [48]byte
		b[0], b[1], b[2], b[3] = 0x6f, 0xff, 0xff, 0xff
		binary.BigEndian.PutUint16(b[4:], uint16(udpLen))
		b[6], b[7] = 17, 0xff
		copy(b[8:], h.Src)
		copy(b[24:], h.Dst)
		putUDP(b[40:48], h.SrcPort, h.DstPort, udpLen)
		return body(updateSmall(crcLRH, b[:48])^fixBTH(roce, 0), roce), nil
	}
	return 0, fmt.Errorf("icrc: addresses must both be IPv4 or both IPv6 (got %d and %d bytes)", len(h.Src), len(h.Dst))
}

func putUDP(u []byte, sport, dport uint16, length int) {
	binary.BigEndian.PutUint16(u[0:], sport)
	binary.BigEndian.PutUint16(u[2:], dport)
	binary.BigEndian.PutUint16(u[4:], uint16(length))
	u[6], u[7] = 0xff, 0xff
}
