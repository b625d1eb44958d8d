package serve

import (
	"net/netip"
	"testing"

	"github.com/softroce/softroce/verbs"
)

// TestServedGID: the address a device serves (rdma_cm's, the GUID's) is
// its first GID that is not link-local, wherever the link-local GID is.
func TestServedGID(t *testing.T) {
	g := func(as ...string) []verbs.GIDEntry {
		var e []verbs.GIDEntry
		for _, a := range as {
			e = append(e, verbs.GIDEntry{Addr: netip.MustParseAddr(a)})
		}
		return e
	}
	for _, c := range []struct {
		table []verbs.GIDEntry
		want  int
	}{
		{g("10.0.0.1"), 0},
		{g("fe80::1", "10.0.0.1"), 1},
		{g("fe80::1", "2001:db8::1"), 1},
		{g("fe80::1"), 0},
		{nil, -1},
	} {
		if got := servedGID(c.table); got != c.want {
			t.Errorf("servedGID(%v) = %d, want %d", c.table, got, c.want)
		}
	}
}

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
