package icrc

// Synth for IPv4 does not hash the header it describes byte after byte:
// most of that header is fixed (version, the masked fields, protocol, the
// masked UDP checksum), and CRC-32 being affine, each other byte changes
// the state after the header independently of the rest. So the state is
// the one for the header with those bytes zero, XORed with one table entry
// per byte: independent lookups instead of a chain of dependent steps
// over a header built on the stack.

// synthV4Len is the IPv4 header Synth describes plus the UDP header.
const synthV4Len = 20 + 8

// synthTab[i][b] is the change to the state after the synthV4Len header
// bytes when byte i is b instead of 0: the register effect of b followed
// by synthV4Len-1-i bytes.
var synthTab [synthV4Len][256]uint32

// synthV4Zero is the CRC after the LRH stand-in and the header with every
// byte that varies zero.
var synthV4Zero uint32

func init() {
	t := &slicing8[0]
	for i := range synthV4Len {
		for bit := range 8 {
			r := t[1<<bit]
			for range synthV4Len - 1 - i {
				r = t[byte(r)] ^ r>>8
			}
			synthTab[i][1<<bit] = r
		}
		for v := 1; v < 256; v++ {
			low := v & -v
			synthTab[i][v] = synthTab[i][v&^low] ^ synthTab[i][low]
		}
	}
	var b [synthV4Len]byte
	b[0] = 0x45               // version 4, 20-byte header
	b[1] = 0xff               // TOS, masked
	b[8], b[9] = 0xff, 17     // TTL (masked), UDP
	b[10], b[11] = 0xff, 0xff // header checksum, masked
	b[26], b[27] = 0xff, 0xff // UDP checksum, masked
	synthV4Zero = updateSmall(crcLRH, b[:])
}

// synthV4 is the CRC after the LRH stand-in and the IPv4 and UDP header h
// describes for a UDP payload of roceLen bytes.
func synthV4(h *Header, roceLen int) uint32 {
	src, dst := (*[4]byte)(h.Src), (*[4]byte)(h.Dst)
	ul := uint16(8 + roceLen)
	tl := 20 + ul
	var df byte
	if h.DF {
		df = 0x40
	}
	T := &synthTab
	return synthV4Zero ^
		T[2][byte(tl>>8)] ^ T[3][byte(tl)] ^ T[4][byte(h.ID>>8)] ^ T[5][byte(h.ID)] ^ T[6][df] ^
		T[12][src[0]] ^ T[13][src[1]] ^ T[14][src[2]] ^ T[15][src[3]] ^
		T[16][dst[0]] ^ T[17][dst[1]] ^ T[18][dst[2]] ^ T[19][dst[3]] ^
		T[20][byte(h.SrcPort>>8)] ^ T[21][byte(h.SrcPort)] ^ T[22][byte(h.DstPort>>8)] ^ T[23][byte(h.DstPort)] ^
		T[24][byte(ul>>8)] ^ T[25][byte(ul)]
}
