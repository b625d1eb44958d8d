package perf

import (
	"net/netip"
	"strings"
	"testing"
)

// TestParsePeer: an address takes the default port, an address and port
// keep theirs, a name that does not resolve says so.
func TestParsePeer(t *testing.T) {
	for in, want := range map[string]string{
		"10.1.1.2":       "10.1.1.2:18515",
		"10.1.1.2:7000":  "10.1.1.2:7000",
		"[fd00::2]:7000": "[fd00::2]:7000",
		"fd00::2":        "[fd00::2]:18515",
	} {
		got, err := ParsePeer(in, 18515)
		if err != nil || got.String() != want {
			t.Errorf("ParsePeer(%q) = %v, %v; want %s", in, got, err, want)
		}
	}
	if _, err := ParsePeer("no-such-host.invalid", 18515); err == nil || !strings.Contains(err.Error(), "does not resolve") {
		t.Errorf("unresolvable name: %v", err)
	}
}

// TestOpenLinkRefusals: an address of no local interface is refused before
// any backend opens, and a UDP port in use names the flag that picks
// another.
func TestOpenLinkRefusals(t *testing.T) {
	if err := CheckLocal(netip.MustParseAddr("192.0.2.77")); err == nil {
		t.Error("192.0.2.77 (TEST-NET-1) is taken for a local address")
	}
	if _, _, err := OpenLink("udp", netip.MustParseAddr("192.0.2.77"), 0); err == nil || !strings.Contains(err.Error(), "no local interface has this address") {
		t.Errorf("non-local address: %v", err)
	}
	lo := netip.MustParseAddr("127.0.0.1")
	l, port, err := OpenLink("udp", lo, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if port == 0 {
		t.Fatal("the link reports port 0")
	}
	if _, _, err := Opener("udp", lo, int(port))(netip.MustParseAddr("127.0.0.2")); err == nil || !strings.Contains(err.Error(), "pick another with --udp-port") {
		t.Errorf("port in use (and bind overriding the connection's address): %v", err)
	}
}
