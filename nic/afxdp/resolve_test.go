package afxdp

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/netnstest"
	"github.com/softroce/softroce/nic"
)

// blockingResolver holds every resolution of the addresses in slow until
// release is closed, and counts the calls per address.
type blockingResolver struct {
	mu      sync.Mutex
	calls   map[netip.Addr]int
	slow    func(netip.Addr) bool
	release chan struct{}
}

func (r *blockingResolver) resolve(real func(netip.Addr) ([6]byte, error), dst netip.Addr) ([6]byte, error) {
	r.mu.Lock()
	r.calls[dst]++
	r.mu.Unlock()
	if r.slow(dst) {
		<-r.release
		return [6]byte{}, &NeighbourError{Dst: dst, NextHop: dst, Ifname: "test"}
	}
	return real(dst)
}

func (r *blockingResolver) count(dst netip.Addr) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls[dst]
}

// recvSeqs receives n packets on l and returns their sequence numbers.
func recvSeqs(t *testing.T, l nic.Link, n int) []uint32 {
	t.Helper()
	in := packets(n, 2000)
	var seqs []uint32
	for len(seqs) < n {
		k, err := l.Recv(in)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range in[:k] {
			seqs = append(seqs, binary.BigEndian.Uint32(p.Buf[8:]))
		}
	}
	return seqs
}

// TestSendDoesNotWaitForResolution: while the resolution of one peer is
// stuck, a Send that includes a packet to it fails just that packet at
// once, and sends to a resolved peer complete. One resolution runs per
// address however often it is asked for, and at most maxResolving at once.
func TestSendDoesNotWaitForResolution(t *testing.T) {
	v := netnstest.Pair(t, netnstest.VethConfig{MTU: 1500})
	a := openIn(t, v.A, Config{})
	b := openIn(t, v.B, Config{})
	prefix := strings.TrimSuffix(v.B.Addr().String(), ".2")
	ghost := netip.MustParseAddr(prefix + ".99")
	r := &blockingResolver{calls: map[netip.Addr]int{}, release: make(chan struct{}),
		slow: func(d netip.Addr) bool { return d != v.B.Addr() }}
	a.setResolver(r.resolve)
	released := false
	release := func() {
		if !released {
			released = true
			close(r.release)
		}
	}
	t.Cleanup(release) // before the links close: Close waits for resolutions

	if err := a.Resolve(v.B.Addr()); err != nil {
		t.Fatal(err)
	}
	out := packets(4, 200)
	for i := range out {
		out[i].N = 200
		fill(out[i].Buf, 200, uint32(i))
		out[i].Remote = netip.AddrPortFrom(v.B.Addr(), 0)
	}
	out[1].Remote = netip.AddrPortFrom(ghost, 0)
	for round := range 3 {
		// The contract of nic.Link: n is the failed packet's index.
		n, err := a.Send(out)
		var ne *NeighbourError
		if n != 1 || !errors.As(err, &ne) || !errors.Is(err, ErrResolving) || ne.Dst != ghost {
			t.Fatalf("round %d: Send = %d, %v; want 1 and ErrResolving for %v", round, n, err, ghost)
		}
		if n, err := a.Send(out[n+1:]); n != 2 || err != nil {
			t.Fatalf("round %d: Send of the rest = %d, %v", round, n, err)
		}
		got := recvSeqs(t, b, 3)
		if got[0] != 0 || got[1] != 2 || got[2] != 3 {
			t.Fatalf("round %d: received %v, want [0 2 3]", round, got)
		}
	}
	// All of that happened while the ghost's one resolution was held.
	if k := a.resolving(); k != 1 {
		t.Errorf("%d resolutions running, want 1", k)
	}
	// Many unknown peers: no more than maxResolving resolutions at once.
	for i := range 2 * maxResolving {
		p := packets(1, 64)
		p[0].N = 64
		p[0].Remote = netip.AddrPortFrom(netip.MustParseAddr(prefix+"."+itoa(100+i)), 0)
		if n, err := a.Send(p); n != 0 || !errors.Is(err, ErrResolving) {
			t.Fatalf("Send to peer %d = %d, %v", i, n, err)
		}
	}
	if k := a.resolving(); k != maxResolving {
		t.Errorf("%d resolutions running, want %d (the bound)", k, maxResolving)
	}
	// Once the resolution fails, Send reports its verdict, cached.
	release()
	for {
		n, err := a.Send(out[1:2])
		if errors.Is(err, ErrResolving) {
			time.Sleep(time.Millisecond)
			continue
		}
		var ne *NeighbourError
		if n != 0 || !errors.As(err, &ne) || ne.NextHop != ghost {
			t.Fatalf("Send after the resolution failed = %d, %v", n, err)
		}
		break
	}
	if c := r.count(ghost); c != 1 {
		t.Errorf("%d resolutions of %v, want 1", c, ghost)
	}
	// The cached failure fails its packet alone in a batch too.
	n, err := a.Send(out)
	var ne *NeighbourError
	if n != 1 || !errors.As(err, &ne) || errors.Is(err, ErrResolving) {
		t.Fatalf("Send with the failed peer in the middle = %d, %v", n, err)
	}
	if n, err := a.Send(out[n+1:]); n != 2 || err != nil {
		t.Fatalf("Send of the rest = %d, %v", n, err)
	}
	if got := recvSeqs(t, b, 3); got[0] != 0 || got[1] != 2 || got[2] != 3 {
		t.Fatalf("received %v, want [0 2 3]", got)
	}
}

func itoa(i int) string {
	var b [8]byte
	n := len(b)
	for {
		n--
		b[n] = byte('0' + i%10)
		i /= 10
		if i == 0 {
			return string(b[n:])
		}
	}
}
