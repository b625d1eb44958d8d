// Package linktest drives nic.Links in tests and benchmarks: a streaming
// sender and a counting receiver.
package linktest

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/softroce/softroce/nic"
)

// Patience returns a channel that fires a little before the test binary's
// -timeout would kill t (never when there is none, or for a benchmark), so
// that a test waiting for packets that never come fails with a message of
// its own, without a wall-clock bound of its own choosing.
func Patience(t testing.TB) <-chan time.Time {
	d, ok := t.(interface{ Deadline() (time.Time, bool) })
	if !ok {
		return nil
	}
	end, ok := d.Deadline()
	if !ok {
		return nil
	}
	left := time.Until(end)
	return time.After(left - min(10*time.Second, left/10))
}

// Packets returns n packets with buffers of size bytes.
func Packets(n, size int) []nic.Packet {
	p := make([]nic.Packet, n)
	for i := range p {
		p[i].Buf = make([]byte, size)
	}
	return p
}

// Fill makes p an n-byte RC RDMA WRITE ONLY-looking packet to dst.
func Fill(p *nic.Packet, n int, dst netip.AddrPort, seq uint32) {
	b := p.Buf[:n]
	clear(b)
	b[0] = 0x0a
	binary.BigEndian.PutUint16(b[2:], 0xffff)
	binary.BigEndian.PutUint32(b[8:], seq&0xffffff)
	p.N, p.Remote = n, dst
}

// Stream measures Send -> Recv: a goroutine sends batches of size-byte
// packets from tx to dst as fast as tx takes them until rx has received
// b.N packets. It reports packets/s and sets bytes per op to payload
// (the RDMA payload each packet carries). Packets lost on the way (socket
// buffers overflowing) are simply not counted, so the figure is the
// delivered rate.
func Stream(b *testing.B, tx, rx nic.Link, dst netip.AddrPort, size, payload, batch int) {
	out := Packets(batch, size)
	for i := range out {
		Fill(&out[i], size, dst, uint32(i))
	}
	in := Packets(batch, size+64)
	// Warm up: neighbour resolution, first packets through the path. A
	// link may drop a packet while it resolves its peer: resend until one
	// arrives.
	warm := make(chan struct{})
	go func() {
		rx.Recv(in)
		close(warm)
	}()
	for tick := time.NewTicker(10 * time.Millisecond); ; {
		tx.Send(out[:1])
		select {
		case <-warm:
		case <-tick.C:
			continue
		}
		tick.Stop()
		break
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	var sent atomic.Uint64
	go func() {
		defer wg.Done()
		for !stop.Load() {
			n, err := tx.Send(out)
			if errors.Is(err, net.ErrClosed) {
				return
			}
			sent.Add(uint64(n)) // on another error out[n] failed: go on
		}
	}()
	b.SetBytes(int64(payload))
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	got := 0
	for got < b.N {
		n, err := rx.Recv(in)
		if err != nil {
			b.Fatal(err)
		}
		got += n
	}
	el := time.Since(start)
	b.StopTimer()
	stop.Store(true)
	wg.Wait()
	b.ReportMetric(float64(got)/el.Seconds(), "pkt/s")
	if s := sent.Load(); s > 0 {
		b.ReportMetric(float64(got)/float64(s)*100, "%delivered")
	}
}
