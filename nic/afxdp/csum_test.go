package afxdp

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"
)

// refSum is the textbook 16-bit ones'-complement sum (RFC 1071).
func refSum(b []byte) uint16 {
	var s uint32
	for len(b) >= 2 {
		s += uint32(binary.BigEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		s += uint32(b[0]) << 8
	}
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return uint16(s)
}

func TestChecksumSum(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 1))
	for n := 0; n < 300; n++ {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		if n%7 == 0 {
			for i := range b {
				b[i] = 0xff // worst case for carries
			}
		}
		if got, want := fold(sum(0, b)), refSum(b); got != want {
			t.Fatalf("%d bytes: sum %#04x, want %#04x", n, got, want)
		}
	}
	// Sums chain: header, then payload.
	b := make([]byte, 4130)
	for i := range b {
		b[i] = byte(i * 31)
	}
	if got, want := fold(sum(sum(0, b[:48]), b[48:])), refSum(b); got != want {
		t.Errorf("chained %#04x, want %#04x", got, want)
	}
}

func BenchmarkUDPChecksum4K(b *testing.B) {
	p := make([]byte, 4128)
	b.SetBytes(int64(len(p)))
	for b.Loop() {
		udpChecksum(p[:8], p[:8], p)
	}
}
