package udp

import (
	"net/netip"
	"testing"

	"github.com/softroce/softroce/nic"
)

// ipFieldsBatch is a batch to b of equal-sized packets (GSO runs where the
// link has GSO) whose HopLimit and TClass change along it: the defaults,
// an address vector's values, the socket's own TTL, ECN bits alone, TTL 1.
func ipFieldsBatch(b netip.AddrPort) []nic.Packet {
	out := packets(16, 4200)
	for i := range out {
		out[i].N = 4128
		out[i].Remote = b
		fill(out[i].Buf, out[i].N, uint32(i))
		switch {
		case i >= 5 && i < 10:
			out[i].HopLimit, out[i].TClass = 7, 46<<2|1 // DSCP EF, ECT(1)
		case i == 10:
			out[i].HopLimit = 64
		case i == 11:
			out[i].HopLimit, out[i].TClass = 255, 3 // CE alone
		case i == 12:
			out[i].HopLimit = 1
		}
	}
	return out
}

// TestSendHopLimitTClass: a packet's HopLimit and TClass become the IPv4
// TTL and TOS (IPv6 hop limit and traffic class) the receiver reads
// (IP_RECVTTL/IP_RECVTOS, IPV6_RECVHOPLIMIT/IPV6_RECVTCLASS), per packet,
// with and without GSO (a run never spans two values); HopLimit 0 sends
// the socket's default TTL and TClass 0 sends 0.
func TestSendHopLimitTClass(t *testing.T) {
	for _, addr := range []string{"127.0.0.1", "::1"} {
		for _, gso := range []Offload{OffloadOff, OffloadOn} {
			t.Run(addr+"/"+gso.String(), func(t *testing.T) {
				ad := netip.MustParseAddr(addr)
				a, err := Open(Config{Addr: ad, Port: freePort(t, ad), MTU: 9000, GSO: gso, IPv4Check: IPv4CheckSolve})
				if err != nil {
					t.Fatal(err)
				}
				defer a.Close()
				b := open(t, addr, 9000)
				if a.defHop == 0 {
					t.Fatal("the link did not learn its socket's default TTL")
				}
				out := ipFieldsBatch(b.LocalAddrPort())
				if n, err := a.Send(out); n != len(out) || err != nil {
					t.Fatalf("Send = %d, %v", n, err)
				}
				in := recvN(t, b, packets(len(out), 4200), len(out))
				for i := range in {
					p, o := &in[i], &out[i]
					hop := o.HopLimit
					if hop == 0 {
						hop = a.defHop
					}
					if string(p.Bytes()) != string(o.Bytes()) || !p.IPKnown || p.HopLimit != hop || p.TClass != o.TClass {
						t.Errorf("packet %d: known %v TTL %d TOS %#x, want TTL %d TOS %#x", i, p.IPKnown, p.HopLimit, p.TClass, hop, o.TClass)
					}
				}
				if ost := a.OffloadStats(); gso == OffloadOn && a.GSO() && (ost.GSOSends != 3 || ost.GSOSegments != 13) {
					t.Errorf("GSO runs: %+v, want 3 sends of 13 segments (0-4, 5-9, 13-15)", ost)
				}
			})
		}
	}
}

// TestSendHopLimitTClassNoAllocs: the control messages cost no
// allocation.
func TestSendHopLimitTClassNoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under the race detector")
	}
	for _, addr := range []string{"127.0.0.1", "::1"} {
		a, b := open(t, addr, 9000), open(t, addr, 9000)
		out, in := ipFieldsBatch(b.LocalAddrPort()), packets(16, 4200)
		allocs := batchAllocs(t, a, b, out, in)
		if allocs != 0 {
			t.Errorf("%s: %v allocations per batch", addr, allocs)
		}
	}
}
