package udp

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/softroce/softroce/icrc"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/nic/internal/linktest"
)

// TestRecvEach sends datagrams one at a time, each only after the last
// was delivered, so that every read finds the socket holding one: a loop
// over Recv then makes two recvmmsg calls per datagram (the second gets
// EAGAIN before it waits), RecvEach about one. Every datagram arrives in
// order and Close ends the loop with net.ErrClosed. Over GRO and without.
func TestRecvEach(t *testing.T) {
	for _, gro := range []Offload{OffloadOff, OffloadOn} {
		t.Run(gro.String(), func(t *testing.T) {
			a := open(t, "127.0.0.1", 9000)
			b, err := Open(Config{Addr: a.LocalAddrPort().Addr(), Port: freePort(t, a.LocalAddrPort().Addr()), MTU: 9000, Batch: 16, IPv4Check: IPv4CheckSolve, GRO: gro})
			if err != nil {
				t.Skipf("GRO %v: %v", gro, err)
			}
			defer b.Close()
			const n = 50
			got := make(chan uint32, n)
			errc := make(chan error, 1)
			in := packets(16, 4200)
			go func() {
				errc <- b.RecvEach(in, func(k int) {
					for _, p := range in[:k] {
						got <- binary.BigEndian.Uint32(p.Buf[8:])
					}
				})
			}()
			out := packets(1, 4200)
			for i := 0; i < n; i++ {
				out[0].N = 200
				fill(out[0].Buf, out[0].N, uint32(i))
				out[0].Remote = b.LocalAddrPort()
				if k, err := a.Send(out); k != 1 || err != nil {
					t.Fatalf("Send = %d, %v", k, err)
				}
				select {
				case seq := <-got:
					if seq != uint32(i) {
						t.Fatalf("datagram %d arrived as %d", i, seq)
					}
				case err := <-errc:
					t.Fatalf("RecvEach returned %v", err)
				case <-linktest.Patience(t):
					t.Fatalf("datagram %d not delivered", i)
				}
			}
			b.Close()
			if err := <-errc; !errors.Is(err, net.ErrClosed) {
				t.Fatalf("RecvEach after Close: %v", err)
			}
			// One call per datagram, plus the first (before anything was
			// sent) and a few for readiness reported after a read had
			// already taken the datagram; a Recv loop would need 2n.
			if c := b.rx.calls; c > n+n/4 {
				t.Fatalf("%d recvmmsg calls for %d datagrams", c, n)
			}
			t.Logf("%d recvmmsg calls for %d datagrams", b.rx.calls, n)
			if st := b.Stats(); st.RxPackets != n {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}

// TestRecvEachGROInPlace sends runs of packets as GSO super-packets to a
// GRO receiver whose RecvEach hands segments out in place: every packet
// arrives whole, in order and with a right ICRC, the packets not
// delivered keep the caller's buffers, and after RecvEach returns every
// buffer in pkts is the caller's again, never the link's memory. The batch is smaller than a
// run, so segments wait across deliveries.
func TestRecvEachGROInPlace(t *testing.T) {
	a := open(t, "127.0.0.1", 9000)
	b, err := Open(Config{Addr: a.LocalAddrPort().Addr(), Port: freePort(t, a.LocalAddrPort().Addr()), MTU: 9000, Batch: 4, IPv4Check: IPv4CheckSolve, GRO: OffloadOn})
	if err != nil {
		t.Skipf("GRO: %v", err)
	}
	defer b.Close()
	if !a.GSO() {
		t.Skip("no GSO on this host")
	}
	const runs, per, size = 20, 12, 1000
	in := packets(4, 4200)
	own := make([]*byte, len(in))
	for i := range in {
		own[i] = &in[i].Buf[0]
	}
	mine := func(from int) bool {
		for i := from; i < len(in); i++ {
			if &in[i].Buf[:1][0] != own[i] {
				return false
			}
		}
		return true
	}
	type rx struct {
		seq uint32
		ok  bool
	}
	got := make(chan rx, runs*per)
	errc := make(chan error, 1)
	misplaced := make(chan string, 1)
	go func() {
		errc <- b.RecvEach(in, func(k int) {
			if !mine(k) {
				select {
				case misplaced <- "a packet that was not delivered lost the caller's buffer":
				default:
				}
			}
			for _, p := range in[:k] {
				want := make([]byte, p.N)
				fill(want, p.N, binary.BigEndian.Uint32(p.Buf[8:]))
				ok := p.N == size && p.ICRC == nic.ICRCPartial &&
					string(p.Buf[12:p.N-icrc.Len]) == string(want[12:p.N-icrc.Len])
				got <- rx{binary.BigEndian.Uint32(p.Buf[8:]), ok}
			}
		})
	}()
	out := packets(per, 4200)
	seq := uint32(0)
	for r := 0; r < runs; r++ {
		for i := range out {
			out[i].N = size
			fill(out[i].Buf, size, seq+uint32(i))
			out[i].Remote = b.LocalAddrPort()
		}
		if k, err := a.Send(out); k != per || err != nil {
			t.Fatalf("Send = %d, %v", k, err)
		}
		for i := 0; i < per; i++ {
			select {
			case p := <-got:
				if p.seq != seq || !p.ok {
					t.Fatalf("packet %d arrived as %d, intact %v", seq, p.seq, p.ok)
				}
			case err := <-errc:
				t.Fatalf("RecvEach returned %v", err)
			case m := <-misplaced:
				t.Fatal(m)
			case <-linktest.Patience(t):
				t.Fatalf("packet %d not delivered", seq)
			}
			seq++
		}
	}
	b.Close()
	if err := <-errc; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("RecvEach after Close: %v", err)
	}
	select {
	case m := <-misplaced:
		t.Fatal(m)
	default:
	}
	if !mine(0) {
		t.Fatal("after RecvEach returned, pkts holds buffers that are not the caller's")
	}
	if st := a.OffloadStats(); st.GSOSends == 0 {
		t.Fatalf("no super-packet sent: %+v", st)
	}
	if st := b.OffloadStats(); st.RxSplit == 0 {
		t.Fatalf("no coalesced datagram received: %+v", st)
	}
}

// TestRecvEachUntil: an Interrupt while stop says no leaves the receiver
// waiting (a later datagram is still delivered by the same call); once
// stop says yes, an Interrupt makes it return nil without a packet, and a
// deliver after which stop says yes ends it too, the queued rest left for
// the next call. Close still ends it with net.ErrClosed.
func TestRecvEachUntil(t *testing.T) {
	a := open(t, "127.0.0.1", 9000)
	b := open(t, "127.0.0.1", 9000)
	recvEachUntil(t, a, b, func(uint32) netip.AddrPort { return b.LocalAddrPort() })
}

// untilRecver is a link with RecvEachUntil and Interrupt (Link, Multi).
type untilRecver interface {
	RecvEachUntil(pkts []nic.Packet, deliver func(n int), stop func() bool) error
	Interrupt()
	Close() error
}

// recvEachUntil is TestRecvEachUntil's sequence: a sends datagram seq to
// dst(seq), b receives.
func recvEachUntil(t *testing.T, a nic.Link, b untilRecver, dst func(seq uint32) netip.AddrPort) {
	in := packets(16, 4200)
	var quit atomic.Bool
	var delivered atomic.Int32
	got := make(chan uint32, 16)
	errc := make(chan error, 1)
	send := func(seq uint32) {
		t.Helper()
		out := packets(1, 4200)
		out[0].N = 200
		fill(out[0].Buf, out[0].N, seq)
		out[0].Remote = dst(seq)
		if k, err := a.Send(out); k != 1 || err != nil {
			t.Fatalf("Send = %d, %v", k, err)
		}
	}
	recv := func(stop func() bool) {
		go func() {
			errc <- b.RecvEachUntil(in, func(k int) {
				delivered.Add(int32(k))
				for _, p := range in[:k] {
					got <- binary.BigEndian.Uint32(p.Buf[8:])
				}
			}, stop)
		}()
	}
	expect := func(seq uint32) {
		t.Helper()
		var s uint32
		select {
		case s = <-got:
		case err := <-errc:
			// It may have delivered before it returned.
			select {
			case s = <-got:
				errc <- err
			default:
				t.Fatalf("RecvEachUntil returned %v", err)
			}
		case <-linktest.Patience(t):
			t.Fatalf("datagram %d not delivered", seq)
		}
		if s != seq {
			t.Fatalf("got datagram %d, want %d", s, seq)
		}
	}
	recv(quit.Load)
	b.Interrupt() // stop says no: keeps waiting
	send(1)
	expect(1)
	quit.Store(true)
	b.Interrupt()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("interrupted RecvEachUntil: %v", err)
		}
	case <-linktest.Patience(t):
		t.Fatal("Interrupt with stop true did not end RecvEachUntil")
	}
	// Two datagrams queued; stop turns true after the first deliver.
	send(2)
	send(3)
	time.Sleep(10 * time.Millisecond)
	// stop counts delivers, not questions: the Interrupt above may come
	// after that call returned on its own (stop turned true after its
	// deliver), and then wakes this call's first wait, which asks stop.
	base := delivered.Load()
	in = packets(1, 4200) // one packet a batch: the second stays queued
	recv(func() bool { return delivered.Load() > base })
	expect(2)
	if err := <-errc; err != nil {
		t.Fatalf("RecvEachUntil after a deliver with stop true: %v", err)
	}
	recv(nil)
	expect(3)
	b.Close()
	if err := <-errc; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}
