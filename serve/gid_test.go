package serve

import "testing"

// TestRocePktType: the sl of a UD receive is the RoCE packet type of its
// own datagram (mlx5's: 0xa RoCEv2 over IPv4, 0x9 over IPv6).
func TestRocePktType(t *testing.T) {
	if got := rocePktType(4); got != 0xa {
		t.Errorf("IPv4: %#x", got)
	}
	if got := rocePktType(6); got != 0x9 {
		t.Errorf("IPv6: %#x", got)
	}
}
