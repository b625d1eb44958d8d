package afxdp

import (
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/netnstest"
)

// A neighbour whose cached entry has aged out is not a miss: Send keeps
// using the MAC address it knows while one background resolution
// refreshes it, so that a long transfer does not lose a packet (and wait
// for the transport's retransmission timeout) every time the cache
// expires. Only a destination never resolved fails with ErrResolving.
func TestSendUsesAgedNeighbourWhileRefreshing(t *testing.T) {
	v := netnstest.Pair(t, netnstest.VethConfig{MTU: 1500})
	a := openIn(t, v.A, Config{})
	b := openIn(t, v.B, Config{})
	var calls atomic.Int32
	hold := make(chan struct{})
	a.setResolver(func(real func(netip.Addr) ([6]byte, error), dst netip.Addr) ([6]byte, error) {
		if calls.Add(1) > 1 {
			<-hold // the refresh of an aged entry takes its time
		}
		return real(dst)
	})
	t.Cleanup(func() { close(hold) }) // before the links close: Close waits for resolutions
	if err := a.Resolve(v.B.Addr()); err != nil {
		t.Fatal(err)
	}
	a.neigh.mu.Lock()
	e := a.neigh.m[v.B.Addr()]
	e.expires = time.Now().Add(-time.Millisecond) // aged out
	a.neigh.m[v.B.Addr()] = e
	a.neigh.mu.Unlock()
	out := packets(3, 200)
	for i := range out {
		out[i].N = 200
		fill(out[i].Buf, 200, uint32(i))
		out[i].Remote = netip.AddrPortFrom(v.B.Addr(), 0)
	}
	for round := range 2 {
		if n, err := a.Send(out); n != len(out) || err != nil {
			t.Fatalf("round %d: Send to a peer whose entry aged out = %d, %v; want %d, nil", round, n, err, len(out))
		}
		if got := recvSeqs(t, b, 3); got[0] != 0 || got[1] != 1 || got[2] != 2 {
			t.Fatalf("round %d: received %v", round, got)
		}
	}
	for calls.Load() < 2 {
		time.Sleep(time.Millisecond)
	}
	if k := a.resolving(); k != 1 {
		t.Errorf("%d refreshes running, want 1", k)
	}
	if s := a.Stats(); s.TxErrors != 0 {
		t.Errorf("TxErrors = %d, want 0", s.TxErrors)
	}
}

// A peer the kernel has already resolved (here: through an earlier link on
// the same interface) costs a new link no packet: its first Send finds
// the kernel's neighbour entry at once instead of dropping the packet and
// resolving in the background.
func TestFirstSendUsesKernelNeighbour(t *testing.T) {
	v := netnstest.Pair(t, netnstest.VethConfig{MTU: 1500})
	b := openIn(t, v.B, Config{})
	var first *Link
	v.A.NS.Run(t, func() (err error) { first, err = Open(Config{Interface: v.A.Name}); return err })
	if err := first.Resolve(v.B.Addr()); err != nil {
		t.Fatal(err)
	}
	first.Close()
	a := openIn(t, v.A, Config{})
	var calls atomic.Int32
	a.setResolver(func(real func(netip.Addr) ([6]byte, error), dst netip.Addr) ([6]byte, error) {
		calls.Add(1)
		return real(dst)
	})
	out := packets(2, 200)
	for i := range out {
		out[i].N = 200
		fill(out[i].Buf, 200, uint32(i))
		out[i].Remote = netip.AddrPortFrom(v.B.Addr(), 0)
	}
	if n, err := a.Send(out); n != len(out) || err != nil {
		t.Fatalf("first Send to a peer the kernel knows = %d, %v; want %d, nil", n, err, len(out))
	}
	if got := recvSeqs(t, b, 2); got[0] != 0 || got[1] != 1 {
		t.Fatalf("received %v", got)
	}
	if c := calls.Load(); c != 0 || a.Stats().TxErrors != 0 {
		t.Errorf("%d background resolutions, TxErrors %d; want none", c, a.Stats().TxErrors)
	}
}
