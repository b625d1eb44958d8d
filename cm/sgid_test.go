package cm

import (
	"net/netip"
	"testing"

	"github.com/softroce/softroce/verbs"
)

// TestDefaultSGID: a CM's own address is the device's first GID that is
// not link-local, wherever the link-local GID is.
func TestDefaultSGID(t *testing.T) {
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
		{nil, 0},
	} {
		if got := DefaultSGID(c.table); got != c.want {
			t.Errorf("DefaultSGID(%v) = %d, want %d", c.table, got, c.want)
		}
	}
}
