package icrc

import "encoding/binary"

// Every sum below hashes the packet in place with one hash/crc32 call over
// contiguous bytes, so that the whole packet takes crc32's carry-less-
// multiply path as one chain, and folds the masking into the starting
// state instead of copying the masked header. It rests on CRC-32 being
// affine in its input. With R the CRC register before a byte b, one step
// is R' = S(R ^ b), where S (hashing one zero byte) is linear and
// invertible (P has a constant term). XORing v into byte i therefore has
// the same effect as XORing v into the register before byte i, and that
// the same as XORing S^-i(v) into the register before byte 0, whatever
// follows and however long the packet is. Setting the masked bits m of
// byte i to ones XORs v = m &^ p[i] into it, so the masked ICRC is
//
//	crc32.Update(crcLRH ^ pre[i1][v1] ^ pre[i2][v2] ^ ..., p)
//
// with one table lookup per masked byte before the one crc32 call. (Two
// calls, a masked copy of the header and then the rest, cost a fixed
// ~25-50 ns per packet on a CPU with the vector CRC path: the second
// call's chain waits for the first to fold and reduce.) crc32.Update
// inverts the state on entry and exit, which commutes with the XOR.

// preLen covers every masked byte: the BTH's resv8a after a 60-byte IPv4
// header and UDP is byte 72.
const preLen = 60 + 8 + bthLen

// pre[i][v] is S^-i(v): the change to the state before byte 0 equivalent
// to XORing v into byte i.
var pre [preLen][256]uint32

func init() {
	t := &slicing8[0]
	// The top byte of t[x] is a bijection of x (checked here), which is
	// what makes S invertible by table.
	var inv [256]byte
	var seen [256]bool
	for x := range 256 {
		top := byte(t[x] >> 24)
		if seen[top] {
			panic("icrc: CRC table top bytes not a bijection")
		}
		seen[top] = true
		inv[top] = byte(x)
	}
	// S(X) = t[X&0xff] ^ X>>8: the top byte of S(X) is that of t[X&0xff].
	unstep := func(y uint32) uint32 {
		x0 := inv[y>>24]
		return (y^t[x0])<<8 | uint32(x0)
	}
	for bit := range 8 {
		e := uint32(1) << bit
		for i := range preLen {
			pre[i][1<<bit] = e
			e = unstep(e)
		}
	}
	for i := range preLen {
		for v := 1; v < 256; v++ {
			low := v & -v
			pre[i][v] = pre[i][v&^low] ^ pre[i][low]
		}
	}
}

// contiguous returns a and b as one slice when b starts right where a
// ends in the same backing array.
func contiguous(a, b []byte) ([]byte, bool) {
	if len(a) == 0 || len(b) == 0 || cap(a) < len(a)+len(b) {
		return nil, false
	}
	full := a[:len(a)+len(b)]
	if &full[len(a)] != &b[0] {
		return nil, false
	}
	return full, true
}

// The fixes of each header: p[off:] is the header. They read the masked
// bytes with as few loads as they can, since on a CPU with the vector CRC
// path every load before the crc32 call shows in the cost of a packet.
// Fully masked bytes: the XOR that sets byte b to ones is ^b.

// fixIPv4 masks TOS (DSCP and ECN) and TTL, which may change in flight,
// and the header checksum with them, of an IPv4 header at p[0:].
func fixIPv4(p []byte) uint32 {
	w := ^binary.LittleEndian.Uint64(p[4:12])
	return pre[1][^p[1]] ^ pre[8][byte(w>>32)] ^ pre[10][byte(w>>48)] ^ pre[11][byte(w>>56)]
}

// fixGRH masks traffic class, flow label and hop limit of an IPv6 header
// or GRH at p[0:] (annex A17.3.3; the same fields for both layouts).
func fixGRH(p []byte) uint32 {
	w := ^binary.LittleEndian.Uint64(p[0:8])
	return pre[0][byte(w)&0x0f] ^ pre[1][byte(w>>8)] ^ pre[2][byte(w>>16)] ^ pre[3][byte(w>>24)] ^
		pre[7][byte(w>>56)]
}

// fixUDP masks the UDP checksum and the BTH's resv8a (FECN, BECN) of the
// UDP segment at p[off:].
func fixUDP(p []byte, off int) uint32 {
	w := ^binary.LittleEndian.Uint64(p[off+6 : off+14]) // UDP checksum .. BTH byte 4
	r := (*[7][256]uint32)(pre[off+6 : off+13])
	return r[0][byte(w)] ^ r[1][byte(w>>8)] ^ r[6][byte(w>>48)]
}

// fixUDP20 is fixUDP(p, 20), for an IPv4 header without options (the
// usual case), with constant offsets.
func fixUDP20(p []byte) uint32 {
	w := ^binary.LittleEndian.Uint64(p[20+6 : 20+14])
	return pre[20+6][byte(w)] ^ pre[20+7][byte(w>>8)] ^ pre[20+12][byte(w>>48)]
}

// fixBTH masks resv8a of the BTH at p[off:].
func fixBTH(p []byte, off int) uint32 { return pre[off+4][^p[off+4]] }
