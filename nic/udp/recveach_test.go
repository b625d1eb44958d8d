package udp

import (
	"encoding/binary"
	"errors"
	"net"
	"testing"

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
