package icrc

import (
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
	return update(update(0, lrh[:]), c)
}

// TestFastPathMatchesSlow compares the in-place fast path and the staged
// path with a plain masked copy, on random contiguous and split packets
// of every length around the block boundary.
func TestFastPathMatchesSlow(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for n := minUDPLen; n < 300; n++ {
		for _, ihl := range []int{20, 24, 44, 60} {
			pkt := make([]byte, ihl+n)
			for i := range pkt {
				pkt[i] = byte(rng.Uint32())
			}
			masks := map[int]byte{1: 0xff, 8: 0xff, 10: 0xff, 11: 0xff, ihl + 6: 0xff, ihl + 7: 0xff, ihl + 12: 0xff}
			want := slowSum(pkt, masks)
			if got := ipv4Sum(pkt[:ihl], pkt[ihl:]); got != want {
				t.Fatalf("IPv4 ihl %d udp %d: contiguous %08x, want %08x", ihl, n, got, want)
			}
			split := append([]byte(nil), pkt[ihl:]...)
			if got := ipv4Sum(pkt[:ihl:ihl], split); got != want {
				t.Fatalf("IPv4 ihl %d udp %d: split %08x, want %08x", ihl, n, got, want)
			}
		}
		pkt := make([]byte, 40+n)
		for i := range pkt {
			pkt[i] = byte(rng.Uint32())
		}
		masks := map[int]byte{0: 0x0f, 1: 0xff, 2: 0xff, 3: 0xff, 7: 0xff, 46: 0xff, 47: 0xff, 52: 0xff}
		if got, want := ipv6Sum(pkt[:40], pkt[40:]), slowSum(pkt, masks); got != want {
			t.Fatalf("IPv6 udp %d: %08x, want %08x", n, got, want)
		}
		if got, want := ipv6Sum(pkt[:40:40], append([]byte(nil), pkt[40:]...)), slowSum(pkt, masks); got != want {
			t.Fatalf("IPv6 split udp %d: %08x, want %08x", n, got, want)
		}
		v1 := map[int]byte{0: 0x0f, 1: 0xff, 2: 0xff, 3: 0xff, 7: 0xff, 44: 0xff}
		if got, want := roceV1Sum(pkt[:40], pkt[40:]), slowSum(pkt, v1); got != want {
			t.Fatalf("RoCEv1 %d: %08x, want %08x", n, got, want)
		}
		if got, want := roceV1Sum(pkt[:40:40], append([]byte(nil), pkt[40:]...)), slowSum(pkt, v1); got != want {
			t.Fatalf("RoCEv1 split %d: %08x, want %08x", n, got, want)
		}
	}
}
