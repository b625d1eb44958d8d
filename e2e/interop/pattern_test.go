package interop

import (
	"bytes"
	"testing"
)

// TestPatternHasNoPeriod: interop data must not repeat at a packet, page
// or 64 KiB distance, or data misplaced by that much would pass.
func TestPatternHasNoPeriod(t *testing.T) {
	b := pattern(1<<18+64, 7)
	for _, d := range []int{256, 1024, 4096, 1 << 16, 1 << 17} {
		if bytes.Equal(b[:64], b[d:d+64]) {
			t.Errorf("pattern repeats after %d bytes", d)
		}
	}
	if !bytes.Equal(pattern(100, 9), pattern(100, 9)) {
		t.Error("pattern is not reproducible")
	}
}
