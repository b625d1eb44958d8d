package perftest

import (
	"bytes"
	"testing"
)

// TestPatternHasNoPeriod: buffer contents must not repeat at a packet,
// page or 64 KiB distance, or a READ served from an offset that far off
// would pass the data check.
func TestPatternHasNoPeriod(t *testing.T) {
	b := make([]byte, 1<<18+64)
	for i := range b {
		b[i] = pattern(i)
	}
	for _, d := range []int{256, 1024, 4096, 1 << 16, 1 << 17} {
		if bytes.Equal(b[:64], b[d:d+64]) {
			t.Errorf("pattern repeats after %d bytes", d)
		}
	}
}
