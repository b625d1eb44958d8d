package icrc

import (
	"errors"
	"math/bits"
	"sync"
	"sync/atomic"
)

// Recovering the IPv4 Identification from the ICRC.
//
// A receiver behind a kernel UDP socket sees every field the ICRC covers
// except the sender's IPv4 Identification (and its flags and options; see
// SolveIPv4ID). CRC-32 is affine over GF(2): for messages of equal length,
// crc(M ^ D) = crc(M) ^ raw(D), where raw is the CRC register transform
// from a zero state. Changing the 16 ID bits from 0 to id therefore
// changes the ICRC by L(id), a linear map from 16 bits to 32 that depends
// only on how many bytes follow the ID field. L is injective: raw of a
// nonzero 16-bit difference followed by k bytes is d(x)·x^(8k+c) mod P,
// which is zero only if P divides d(x) (x^m is coprime to P, whose
// constant term is 1), impossible for a d of degree below 16. So the
// received ICRC, xored with the one computed for ID 0, is either L(id) for
// exactly one id, or not in the image of L at all; a corrupted packet lands
// in that 2^16-element image with probability 2^-16. Sixteen of the 32
// bits remain a genuine check.

// IPv4IDCheckBits is how many bits of the ICRC still check a packet whose
// IPv4 Identification was recovered by SolveIPv4ID.
const IPv4IDCheckBits = 32 - 16

// idBasis is L, for one packet length, in reduced echelon form: row j has
// its lowest set bit at pivot[j], no later row has that bit, and tag[j]
// is the combination of ID bits whose image row j is.
type idBasis struct {
	pivot [16]uint32 // one-bit masks
	row   [16]uint32
	tag   [16]uint16
}

// solve returns the id with L(id) == diff, if there is one.
func (b *idBasis) solve(diff uint32) (uint16, bool) {
	var id uint16
	for j := range b.row {
		if diff&b.pivot[j] != 0 {
			diff ^= b.row[j]
			id ^= b.tag[j]
		}
	}
	return id, diff == 0
}

// gf2 is a linear map on 32-bit CRC registers: column i is the image of
// bit i.
type gf2 [32]uint32

func (m *gf2) apply(v uint32) uint32 {
	var r uint32
	for v != 0 {
		i := bits.TrailingZeros32(v)
		r ^= m[i]
		v &= v - 1
	}
	return r
}

// mul returns m∘n.
func (m *gf2) mul(n *gf2) gf2 {
	var r gf2
	for i := range n {
		r[i] = m.apply(n[i])
	}
	return r
}

// zeroBytes is the register transform of hashing k zero bytes, by
// repeated squaring of the one-byte transform.
func zeroBytes(k int) gf2 {
	var one, acc gf2
	t := &slicing8[0]
	for i := range one {
		r := uint32(1) << i
		one[i] = t[byte(r)] ^ r>>8
		acc[i] = r // identity
	}
	for ; k > 0; k >>= 1 {
		if k&1 != 0 {
			acc = one.mul(&acc)
		}
		one = one.mul(&one)
	}
	return acc
}

// idColumns returns L for a RoCE packet (BTH .. ICRC) of roceLen bytes:
// column b is the ICRC change caused by flipping bit b of the ID.
func idColumns(roceLen int) [16]uint32 {
	// Hashed after the ID field: flags and fragment offset (2), TTL,
	// protocol, checksum, addresses (12), UDP (8), the packet without
	// its ICRC.
	k := 2 + 12 + 8 + roceLen - Len
	z := zeroBytes(k)
	t := &slicing8[0]
	var cols [16]uint32
	for b := range cols {
		id := uint16(1) << b
		r := t[byte(id>>8)]            // ID high byte, from a zero register
		r = t[byte(r)^byte(id)] ^ r>>8 // ID low byte
		cols[b] = z.apply(r)
	}
	return cols
}

// newIDBasis reduces L for roceLen to echelon form.
func newIDBasis(roceLen int) *idBasis {
	cols := idColumns(roceLen)
	b := new(idBasis)
	for i, v := range cols {
		tag := uint16(1) << i
		for j := 0; j < i; j++ {
			if v&b.pivot[j] != 0 {
				v ^= b.row[j]
				tag ^= b.tag[j]
			}
		}
		if v == 0 {
			panic("icrc: IPv4 ID map is not injective") // impossible: see above
		}
		b.pivot[i], b.row[i], b.tag[i] = v&-v, v, tag
	}
	return b
}

// idBases caches one basis per packet length, built on first use and
// never freed: a page of 256 lengths at a time, read without locks. The
// memory is bounded by the lengths a link can receive: 160 bytes per
// length seen (under 1.5 MB for every length up to 9000 bytes).
var (
	idBases  [256]atomic.Pointer[[256]atomic.Pointer[idBasis]]
	idBaseMu sync.Mutex
)

func basisFor(roceLen int) *idBasis {
	page := idBases[roceLen>>8&0xff].Load()
	if page != nil {
		if b := page[roceLen&0xff].Load(); b != nil {
			return b
		}
	}
	idBaseMu.Lock()
	defer idBaseMu.Unlock()
	page = idBases[roceLen>>8&0xff].Load()
	if page == nil {
		page = new([256]atomic.Pointer[idBasis])
		idBases[roceLen>>8&0xff].Store(page)
	}
	b := page[roceLen&0xff].Load()
	if b == nil {
		b = newIDBasis(roceLen)
		page[roceLen&0xff].Store(b)
	}
	return b
}

// MaxIPv4RoCE is the largest RoCE packet (BTH .. ICRC) an IPv4 datagram
// without options can carry.
const MaxIPv4RoCE = 65535 - 20 - 8

// SolveIPv4ID finds the IPv4 Identification under which the ICRC that
// roce (BTH .. ICRC) carries is correct, given the rest of the header in h
// (h.ID is ignored; h.DF, addresses and ports are used as they are; an
// IPv4 header without options is assumed). It returns ok = false when no
// ID makes it correct: the packet, or the assumption about DF and options,
// is wrong. When ok is true the packet passed a check of IPv4IDCheckBits
// bits: a corrupted packet is accepted with probability 2^-16.
//
// The basis for each packet length is built once (a few microseconds) and
// kept; after that a call costs one ICRC computation and does not
// allocate.
func SolveIPv4ID(h *Header, roce []byte) (id uint16, ok bool, err error) {
	if len(h.Src) != 4 || len(h.Dst) != 4 {
		return 0, false, errIPv4Only
	}
	if len(roce) > MaxIPv4RoCE {
		return 0, false, errTooLong
	}
	h0 := *h
	h0.ID = 0
	c0, err := Synth(&h0, roce)
	if err != nil {
		return 0, false, err
	}
	id, ok = basisFor(len(roce)).solve(Wire(roce) ^ c0)
	return id, ok, nil
}

var (
	errIPv4Only = errors.New("icrc: SolveIPv4ID needs IPv4 addresses")
	errTooLong  = errors.New("icrc: packet too long for IPv4")
)
