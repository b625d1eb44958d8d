package icrc

// The fast path hashes a contiguous packet in place, headers and all, with
// two hash/crc32 calls (so both run on the carry-less-multiply hardware
// path), and patches in the masking afterwards. It rests on CRC-32 being
// affine in its input: for equal-length messages,
//
//	crc32.Update(c, H ^ D) == crc32.Update(c, H) ^ raw(D)
//
// where raw is the bare CRC register transform from a zero state. D is the
// difference between the masked and the real header bytes, nonzero only at
// the few masked positions, so raw(D) is the XOR of one precomputed table
// entry per masked byte. Hashing exactly fastBlock bytes first keeps every
// masked byte inside that first block, so the tables do not depend on the
// packet length.

// fastBlock is the length of the first block: a multiple of 16 and at
// least 64, so that crc32 handles it with its vector path.
const fastBlock = 64

// maskTab[i][v] is raw() of a fastBlock-byte message that is zero except
// for byte i, which is v.
var maskTab [fastBlock][256]uint32

func init() {
	t := &slicing8[0]
	for i := range fastBlock {
		for bit := range 8 {
			r := t[byte(1)<<bit] // raw register after byte i (zeros before it leave it 0)
			for range fastBlock - 1 - i {
				r = t[byte(r)] ^ r>>8
			}
			maskTab[i][1<<bit] = r
		}
		for v := 1; v < 256; v++ {
			low := v & -v
			maskTab[i][v] = maskTab[i][v&^low] ^ maskTab[i][low]
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

// fix returns the correction for setting the bits m of p[i] to ones.
func fix(p []byte, i int, m byte) uint32 { return maskTab[i][^p[i]&m] }

// fastIPv4 computes the ICRC of pkt (IPv4 header with ihl bytes, UDP,
// BTH ... ICRC), or reports false when the packet is too short or its
// masked bytes fall outside the first block.
func fastIPv4(pkt []byte, ihl int) (uint32, bool) {
	b4 := ihl + 8 + 4 // BTH byte 4
	if b4 >= fastBlock || len(pkt)-Len < fastBlock {
		return 0, false
	}
	c := update(crcLRH, pkt[:fastBlock])
	c ^= fix(pkt, 1, 0xff) ^ fix(pkt, 8, 0xff) ^ fix(pkt, 10, 0xff) ^ fix(pkt, 11, 0xff) ^
		fix(pkt, ihl+6, 0xff) ^ fix(pkt, ihl+7, 0xff) ^ fix(pkt, b4, 0xff)
	return update(c, pkt[fastBlock:len(pkt)-Len]), true
}

// fastGRH does the same for an IPv6 header or GRH of 40 bytes followed by
// hdr more header bytes before the BTH (8 for UDP, 0 for RoCEv1).
func fastGRH(pkt []byte, hdr int) (uint32, bool) {
	if len(pkt)-Len < fastBlock {
		return 0, false
	}
	c := update(crcLRH, pkt[:fastBlock])
	c ^= fix(pkt, 0, 0x0f) ^ fix(pkt, 1, 0xff) ^ fix(pkt, 2, 0xff) ^ fix(pkt, 3, 0xff) ^ fix(pkt, 7, 0xff) ^
		fix(pkt, 40+hdr+4, 0xff)
	if hdr == 8 {
		c ^= fix(pkt, 46, 0xff) ^ fix(pkt, 47, 0xff)
	}
	return update(c, pkt[fastBlock:len(pkt)-Len]), true
}
