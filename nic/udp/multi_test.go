package udp

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/netnstest"
	"github.com/softroce/softroce/nic"
)

// openMultiPair opens, in each namespace of a veth pair, a Multi on the
// end's link-local and IPv4 addresses, in the kernel's GID order.
func openMultiPair(t *testing.T, noDAD bool) (a, b *Multi) {
	t.Helper()
	netnstest.Require(t)
	v := netnstest.Pair(t, netnstest.VethConfig{MTU: 1500, NoDAD: noDAD})
	open := func(e *netnstest.End) (m *Multi) {
		e.NS.Run(t, func() error {
			ll, err := LinkLocalOf(e.Addr(), 5*time.Second)
			if err != nil {
				return err
			}
			if ll.Zone() != e.Name {
				t.Errorf("link-local %v: zone is not %s", ll, e.Name)
			}
			m, err = OpenMulti(Config{IPv4Check: IPv4CheckSolve}, ll, e.Addr())
			return err
		})
		t.Cleanup(func() { m.Close() })
		return m
	}
	return open(v.A), open(v.B)
}

// TestMultiLinkLocal: two namespaces exchange packets over both the IPv6
// link-local and the IPv4 addresses of their veth ends; each packet leaves
// from the address of its destination's family and scope, and arrives
// with the right source, destination and ICRC check.
func TestMultiLinkLocal(t *testing.T) {
	a, b := openMultiPair(t, true)
	if as := a.Addrs(); len(as) != 2 || !as[0].IsLinkLocalUnicast() || as[0].Zone() != "" || !as[1].Is4() {
		t.Fatalf("Addrs = %v, want [link-local IPv6 without zone, IPv4]", as)
	}
	out := packets(6, 300)
	for i := range out {
		out[i].N = 100 + i
		fill(out[i].Buf, out[i].N, uint32(i))
		// Runs of each family, to be split between the sockets.
		out[i].Remote = netip.AddrPortFrom(b.Addrs()[(i/2)%2], 4791)
	}
	if n, err := a.Send(out); n != len(out) || err != nil {
		t.Fatalf("Send = %d, %v", n, err)
	}
	in := packets(8, 300)
	seen := map[uint32]nic.Packet{}
	deadline := time.Now().Add(5 * time.Second)
	for len(seen) < len(out) && time.Now().Before(deadline) {
		n, err := b.Recv(in)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range in[:n] {
			seen[binary.BigEndian.Uint32(p.Buf[8:])] = p
		}
	}
	for i := range out {
		p, ok := seen[uint32(i)]
		if !ok {
			t.Errorf("packet %d lost", i)
			continue
		}
		fam := (i / 2) % 2
		if p.Local != b.Addrs()[fam] || p.Remote != netip.AddrPortFrom(a.Addrs()[fam], 4791) {
			t.Errorf("packet %d: %v -> %v, want %v -> %v", i, p.Remote, p.Local, a.Addrs()[fam], b.Addrs()[fam])
		}
		want := nic.ICRCVerified // IPv6: the whole ICRC
		if fam == 1 {
			want = nic.ICRCPartial
		}
		if p.ICRC != want {
			t.Errorf("packet %d: ICRC %v, want %v", i, p.ICRC, want)
		}
	}
	// A source address the link does not have: dropped and counted.
	out[0].Local = netip.MustParseAddr("fe80::1")
	if n, err := a.Send(out[:1]); n != 1 || err != nil {
		t.Fatalf("Send from a foreign address = %d, %v", n, err)
	}
	if st := a.Stats(); st.TxPackets != uint64(len(out)) || st.TxErrors != 1 {
		t.Errorf("stats %+v: want %d sent, 1 error", st, len(out))
	}
	if st := b.Stats(); st.RxPackets != uint64(len(out)) || st.RxICRCVerified != 4 || st.RxICRCPartial != 2 {
		t.Errorf("receiver stats %+v", st)
	}
}

// TestMultiRecvEachPingPong bounces one packet at a time between the two
// ends, alternating families, with both receiving through RecvEach: a
// wake-up lost between the sockets and the epoll descriptor stalls it.
func TestMultiRecvEachPingPong(t *testing.T) {
	a, b := openMultiPair(t, true)
	const rounds = 2000
	// b echoes whatever it gets back to its sender.
	echoDone := make(chan error, 1)
	go func() {
		in := packets(8, 300)
		echoDone <- b.RecvEach(in, func(n int) {
			for i := range in[:n] {
				in[i].Local = netip.Addr{}
			}
			b.Send(in[:n])
		})
	}()
	got := make(chan uint32, 1)
	recvDone := make(chan error, 1)
	go func() {
		in := packets(8, 300)
		recvDone <- a.RecvEach(in, func(n int) {
			for _, p := range in[:n] {
				got <- binary.BigEndian.Uint32(p.Buf[8:])
			}
		})
	}()
	out := packets(1, 300)
	for i := 0; i < rounds; i++ {
		out[0].N = 64
		fill(out[0].Buf, 64, uint32(i))
		out[0].Remote = netip.AddrPortFrom(b.Addrs()[i%2], 4791)
		if _, err := a.Send(out); err != nil {
			t.Fatal(err)
		}
		select {
		case seq := <-got:
			if seq != uint32(i) {
				t.Fatalf("round %d: got packet %d", i, seq)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("round %d (to %v): no echo", i, out[0].Remote)
		}
	}
	a.Close()
	b.Close()
	for _, ch := range []chan error{echoDone, recvDone} {
		if err := <-ch; !errors.Is(err, net.ErrClosed) {
			t.Errorf("RecvEach after Close = %v, want net.ErrClosed", err)
		}
	}
}

// TestLinkLocalTentative: right after the link comes up its link-local
// address is tentative (DAD); LinkLocalOf waits until it is usable.
func TestLinkLocalTentative(t *testing.T) {
	netnstest.Require(t)
	v := netnstest.Pair(t, netnstest.VethConfig{MTU: 1500})
	v.A.NS.Run(t, func() error {
		t0 := time.Now()
		ll, err := LinkLocalOf(v.A.Addr(), 10*time.Second)
		if err != nil {
			return err
		}
		t.Logf("%v usable after %v", ll, time.Since(t0))
		m, err := OpenMulti(Config{IPv4Check: IPv4CheckSolve}, ll, v.A.Addr())
		if err != nil {
			return err
		}
		return m.Close()
	})
}

// TestLinkLocalNone: loopback has no link-local address.
func TestLinkLocalNone(t *testing.T) {
	if _, err := LinkLocalOf(netip.MustParseAddr("127.0.0.1"), 0); !errors.Is(err, ErrNoLinkLocal) {
		t.Fatalf("LinkLocalOf(127.0.0.1) = %v, want ErrNoLinkLocal", err)
	}
}

// TestOpenLinkLocalNeedsZone: a link-local address without its interface
// is refused with a message that says so.
func TestOpenLinkLocalNeedsZone(t *testing.T) {
	_, err := Open(Config{Addr: netip.MustParseAddr("fe80::1")})
	if err == nil {
		t.Fatal("Open(fe80::1) succeeded")
	}
	t.Log(err)
}

// TestMultiRecvEachBurst: bursts larger than a batch to both addresses
// all arrive through RecvEach, which reads a socket again only while its
// last read came back full.
func TestMultiRecvEachBurst(t *testing.T) {
	a, b := openMultiPair(t, true)
	const bursts, per = 20, 100
	total := make(chan int, 1)
	var seen [bursts * per]bool
	go func() {
		in := packets(16, 300)
		n := 0
		b.RecvEach(in, func(k int) {
			for _, p := range in[:k] {
				if s := binary.BigEndian.Uint32(p.Buf[8:]); s < bursts*per && !seen[s] {
					seen[s] = true
					n++
				}
			}
			if n == bursts*per {
				total <- n
			}
		})
	}()
	out := packets(per, 300)
	for i := 0; i < bursts; i++ {
		for j := range out {
			out[j].N = 200
			fill(out[j].Buf, 200, uint32(i*per+j))
			out[j].Remote = netip.AddrPortFrom(b.Addrs()[(i+j/50)%2], 4791)
		}
		if n, err := a.Send(out); n != per || err != nil {
			t.Fatalf("burst %d: Send = %d, %v", i, n, err)
		}
		// Pace the bursts so that the socket buffers hold them.
		time.Sleep(2 * time.Millisecond)
	}
	select {
	case <-total:
	case <-time.After(10 * time.Second):
		st := b.Stats()
		t.Fatalf("not every packet arrived: receiver stats %+v", st)
	}
}

// TestMultiNoAllocs: a batch sent and received through a Multi (Send,
// Recv, TryRecv) allocates nothing in steady state.
func TestMultiNoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under the race detector")
	}
	a, b := openMultiPair(t, true)
	out, in := packets(16, 1500), packets(16, 1500)
	for i := range out {
		out[i].N = 1000
		fill(out[i].Buf, out[i].N, uint32(i))
		out[i].Remote = netip.AddrPortFrom(b.Addrs()[i/8], 4791)
	}
	for _, try := range []bool{false, true} {
		allocs := testing.AllocsPerRun(50, func() {
			if _, err := a.Send(out); err != nil {
				t.Fatal(err)
			}
			for got := 0; got < len(out); {
				var n int
				var err error
				if try {
					n, err = b.TryRecv(in)
				} else {
					n, err = b.Recv(in)
				}
				if err != nil {
					t.Fatal(err)
				}
				got += n
			}
		})
		if allocs != 0 {
			t.Errorf("TryRecv %v: %v allocations per batch of %d", try, allocs, len(out))
		}
	}
}

// TestMultiRecvEachUntil is TestRecvEachUntil through a Multi, the
// datagrams alternating between its link-local and IPv4 addresses.
func TestMultiRecvEachUntil(t *testing.T) {
	a, b := openMultiPair(t, true)
	recvEachUntil(t, a, b, func(seq uint32) netip.AddrPort { return netip.AddrPortFrom(b.Addrs()[seq%2], 4791) })
}
