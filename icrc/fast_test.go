package icrc

import (
	"encoding/binary"
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

// slowSum computes the ICRC the straightforward way: copy the packet, set
// the masked fields to ones, hash 8 x 0xFF and the copy.
func slowSum(pkt []byte, masks map[int]byte) uint32 {
	c := append([]byte(nil), pkt[:len(pkt)-Len]...)
	for i, m := range masks {
		c[i] |= m
	}
	return crc32.ChecksumIEEE(append(append([]byte(nil), lrh[:]...), c...))
}

func v4Masks(ihl int) map[int]byte {
	return map[int]byte{1: 0xff, 8: 0xff, 10: 0xff, 11: 0xff, ihl + 6: 0xff, ihl + 7: 0xff, ihl + 12: 0xff}
}

var (
	v6Masks = map[int]byte{0: 0x0f, 1: 0xff, 2: 0xff, 3: 0xff, 7: 0xff, 46: 0xff, 47: 0xff, 52: 0xff}
	v1Masks = map[int]byte{0: 0x0f, 1: 0xff, 2: 0xff, 3: 0xff, 7: 0xff, 44: 0xff}
)

// checkSums compares ipv4Sum (header of ihl bytes), ipv6Sum and
// roceV1Sum on pkt, contiguous and split, with slowSum.
func checkSums(t *testing.T, pkt []byte, ihl int) {
	t.Helper()
	split := func(h int) ([]byte, []byte) {
		return append([]byte(nil), pkt[:h]...)[:h:h], append([]byte(nil), pkt[h:]...)
	}
	// The header with room after it, but the rest elsewhere.
	spare := func(h int) ([]byte, []byte) {
		return append(make([]byte, 0, len(pkt)+64), pkt[:h]...), append([]byte(nil), pkt[h:]...)
	}
	if len(pkt) >= ihl+minUDPLen {
		want := slowSum(pkt, v4Masks(ihl))
		if got := ipv4Sum(pkt[:ihl], pkt[ihl:]); got != want {
			t.Fatalf("IPv4 ihl %d len %d: contiguous %08x, want %08x", ihl, len(pkt), got, want)
		}
		if got := ipv4Sum(split(ihl)); got != want {
			t.Fatalf("IPv4 ihl %d len %d: split %08x, want %08x", ihl, len(pkt), got, want)
		}
		if got := ipv4Sum(spare(ihl)); got != want {
			t.Fatalf("IPv4 ihl %d len %d: split with spare capacity %08x, want %08x", ihl, len(pkt), got, want)
		}
	}
	if len(pkt) >= 40+minUDPLen {
		want := slowSum(pkt, v6Masks)
		if got := ipv6Sum(pkt[:40], pkt[40:]); got != want {
			t.Fatalf("IPv6 len %d: contiguous %08x, want %08x", len(pkt), got, want)
		}
		if got := ipv6Sum(split(40)); got != want {
			t.Fatalf("IPv6 len %d: split %08x, want %08x", len(pkt), got, want)
		}
		if got := ipv6Sum(spare(40)); got != want {
			t.Fatalf("IPv6 len %d: split with spare capacity %08x, want %08x", len(pkt), got, want)
		}
	}
	if len(pkt) >= 40+bthLen+Len {
		want := slowSum(pkt, v1Masks)
		if got := roceV1Sum(pkt[:40], pkt[40:]); got != want {
			t.Fatalf("RoCEv1 len %d: contiguous %08x, want %08x", len(pkt), got, want)
		}
		if got := roceV1Sum(split(40)); got != want {
			t.Fatalf("RoCEv1 len %d: split %08x, want %08x", len(pkt), got, want)
		}
	}
}

// TestSumsMatchSlow compares the in-place sums with a plain masked copy
// on random packets of every length up to a few vector blocks (so every
// remainder modulo 16 and 64, below and above crc32's vector threshold),
// for every IPv4 header length, and on a sample of longer ones.
func TestSumsMatchSlow(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	random := func(n int) []byte {
		p := make([]byte, n)
		for i := range p {
			p[i] = byte(rng.Uint32())
		}
		return p
	}
	for n := 40 + bthLen + Len; n < 400; n++ {
		for ihl := 20; ihl <= 60; ihl += 4 {
			checkSums(t, random(n), ihl)
		}
	}
	for range 300 {
		checkSums(t, random(400+rng.IntN(9200)), 20+4*rng.IntN(11))
	}
	// Masked bytes already all ones, or all zeros: the fixes are zero or
	// the largest.
	for _, b := range []byte{0x00, 0xff} {
		for _, n := range []int{68, 1100, 4200} {
			p := random(n)
			for _, m := range []map[int]byte{v4Masks(20), v6Masks} {
				for i := range m {
					p[i] = b
				}
			}
			checkSums(t, p, 20)
		}
	}
}

// FuzzSumsMatchSlow: for any bytes, the three sums agree with a plain
// masked copy, contiguous and split.
func FuzzSumsMatchSlow(f *testing.F) {
	f.Add(make([]byte, 64), uint8(0))
	f.Add(make([]byte, 1100), uint8(3))
	f.Add([]byte("\x45\x02\x10\x5c\x12\x34\x40\x00\x40\x11\xff\xff\x0a\x00\x00\x01\x0a\x00\x00\x02"+
		"\xc0\x00\x12\xb7\x00\x48\x00\x00\x0a\x40\xff\xff\x00\x00\x00\x11\x80\x00\x00\x05abcdefgh"), uint8(0))
	f.Fuzz(func(t *testing.T, pkt []byte, q uint8) {
		checkSums(t, pkt, 20+4*int(q%11))
	})
}

// TestPreTable checks the masking table against its definition: XORing v
// into byte i of any message changes the CRC as XORing pre[i][v] into
// the state before byte 0.
func TestPreTable(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 2000 {
		i, v := rng.IntN(preLen), byte(rng.Uint32())
		msg := make([]byte, i+1+rng.IntN(200))
		for k := range msg {
			msg[k] = byte(rng.Uint32())
		}
		c0 := rng.Uint32()
		flipped := append([]byte(nil), msg...)
		flipped[i] ^= v
		if got, want := update(c0^pre[i][v], msg), update(c0, flipped); got != want {
			t.Fatalf("pre[%d][%#x]: %08x, want %08x", i, v, got, want)
		}
	}
}

// TestSynthMatchesSlow compares Synth with a plain masked copy of the
// header it describes, for IPv4 and IPv6 and every length around the
// vector blocks.
func TestSynthMatchesSlow(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for n := bthLen + Len; n < 1200; n++ {
		roce := make([]byte, n)
		for i := range roce {
			roce[i] = byte(rng.Uint32())
		}
		// IPv4: the header Synth builds, with the variant fields random
		// (they are masked anyway).
		a4 := rng.Uint64()
		h4 := Header{Src: []byte{byte(a4), byte(a4 >> 8), byte(a4 >> 16), byte(a4 >> 24)},
			Dst: []byte{byte(a4 >> 32), byte(a4 >> 40), byte(a4 >> 48), byte(a4 >> 56)}, ID: uint16(rng.Uint32()),
			DF: n%2 == 0, SrcPort: uint16(rng.Uint32()), DstPort: uint16(rng.Uint32())}
		ip := make([]byte, 20+8+n)
		ip[0], ip[1] = 0x45, byte(rng.Uint32())
		binary.BigEndian.PutUint16(ip[2:], uint16(20+8+n))
		binary.BigEndian.PutUint16(ip[4:], h4.ID)
		if h4.DF {
			ip[6] = 0x40
		}
		ip[8], ip[9] = byte(rng.Uint32()), 17
		ip[10], ip[11] = byte(rng.Uint32()), byte(rng.Uint32())
		copy(ip[12:], h4.Src)
		copy(ip[16:], h4.Dst)
		binary.BigEndian.PutUint16(ip[20:], h4.SrcPort)
		binary.BigEndian.PutUint16(ip[22:], h4.DstPort)
		binary.BigEndian.PutUint16(ip[24:], uint16(8+n))
		ip[26], ip[27] = byte(rng.Uint32()), byte(rng.Uint32())
		copy(ip[28:], roce)
		got, err := Synth(&h4, roce)
		if want := slowSum(ip, v4Masks(20)); err != nil || got != want {
			t.Fatalf("Synth IPv4 %d: %08x, %v, want %08x", n, got, err, want)
		}

		src, dst := make([]byte, 16), make([]byte, 16)
		for i := range src {
			src[i], dst[i] = byte(rng.Uint32()), byte(rng.Uint32())
		}
		h6 := Header{Src: src, Dst: dst, SrcPort: uint16(rng.Uint32()), DstPort: uint16(rng.Uint32())}
		ip6 := make([]byte, 40+8+n)
		ip6[0], ip6[1], ip6[2], ip6[3] = 0x60|byte(rng.Uint32()&0xf), byte(rng.Uint32()), byte(rng.Uint32()), byte(rng.Uint32())
		binary.BigEndian.PutUint16(ip6[4:], uint16(8+n))
		ip6[6], ip6[7] = 17, byte(rng.Uint32())
		copy(ip6[8:], src)
		copy(ip6[24:], dst)
		binary.BigEndian.PutUint16(ip6[40:], h6.SrcPort)
		binary.BigEndian.PutUint16(ip6[42:], h6.DstPort)
		binary.BigEndian.PutUint16(ip6[44:], uint16(8+n))
		ip6[46], ip6[47] = byte(rng.Uint32()), byte(rng.Uint32())
		copy(ip6[48:], roce)
		got, err = Synth(&h6, roce)
		if want := slowSum(ip6, v6Masks); err != nil || got != want {
			t.Fatalf("Synth IPv6 %d: %08x, %v, want %08x", n, got, err, want)
		}
	}
}

// TestSumsAllocs: no path allocates, contiguous or split.
func TestSumsAllocs(t *testing.T) {
	pkt := make([]byte, 60+8+bthLen+4096+Len)
	ip4s, udps := append([]byte(nil), pkt[:20]...), append([]byte(nil), pkt[20:]...)
	ip6s := append([]byte(nil), pkt[:40]...)
	h := Header{Src: pkt[:4], Dst: pkt[4:8]}
	for name, f := range map[string]func(){
		"IPv4":         func() { IPv4(pkt[:20], pkt[20:]) },
		"IPv4 opts":    func() { IPv4(pkt[:60], pkt[60:]) },
		"IPv4 split":   func() { IPv4(ip4s, udps) },
		"IPv6":         func() { IPv6(pkt[:40], pkt[40:]) },
		"IPv6 split":   func() { IPv6(ip6s, udps) },
		"RoCEv1":       func() { RoCEv1(pkt[:40], pkt[40:]) },
		"RoCEv1 split": func() { RoCEv1(ip6s, udps) },
		"Synth":        func() { Synth(&h, pkt[28:]) },
	} {
		if n := testing.AllocsPerRun(100, f); n != 0 {
			t.Errorf("%s: %v allocs per packet", name, n)
		}
	}
}
