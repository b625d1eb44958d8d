package congest

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/nic/pipe"
)

// fakeClock is an injected clock the test moves by hand.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func packets(n, size int, tc uint8) []nic.Packet {
	pkts := make([]nic.Packet, n)
	for i := range pkts {
		b := make([]byte, size)
		b[0] = 0x04 // RC SEND_ONLY
		binary.BigEndian.PutUint16(b[2:], 0xffff)
		binary.BigEndian.PutUint32(b[8:], uint32(i))
		pkts[i] = nic.Packet{Buf: b, N: size, TClass: tc}
	}
	return pkts
}

func recvAll(t *testing.T, l nic.Link, n int) []nic.Packet {
	t.Helper()
	in := packets(n, 2048, 0xff)
	for got := 0; got < n; {
		k, err := l.Recv(in[got:])
		if err != nil {
			t.Fatal(err)
		}
		got += k
	}
	return in
}

// TestLinkClock: on an injected clock, packets reach the wrapped pipe only
// when they have left the bottleneck, in order, with their CE marks, and
// still pass the receiver's ICRC check.
func TestLinkClock(t *testing.T) {
	clk := &fakeClock{t: t0}
	a, b := pipe.New(pipe.Config{})
	defer b.Close()
	// 1 B/ns; 1000-byte packets: the n-th leaves at n µs. Kmin 2500,
	// Kmax 3000: the 4th packet (queue 3000) and later are marked.
	w, err := WrapClock(a, Config{Rate: 8e9, Queue: 5000, Kmin: 2500, Kmax: 3000, Pmax: 1, Seed: 1}, clk.now)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if n, err := w.Send(packets(6, 1000, ECT0)); n != 6 || err != nil {
		t.Fatalf("Send = %d, %v", n, err)
	}
	steps := []struct {
		at      time.Duration
		sent    uint64 // packets handed to the pipe by then
		next    time.Duration
		queueLn int
	}{
		{0, 0, 1 * time.Microsecond, 5000},
		{999 * time.Nanosecond, 0, 1 * time.Microsecond, 4001},
		{1 * time.Microsecond, 1, 2 * time.Microsecond, 4000},
		{3500 * time.Nanosecond, 3, 4 * time.Microsecond, 1500},
		{time.Hour, 5, 0, 0},
	}
	for _, s := range steps {
		clk.t = t0.Add(s.at)
		next, err := w.Pump()
		if err != nil {
			t.Fatal(err)
		}
		var wantNext time.Time
		if s.next != 0 {
			wantNext = t0.Add(s.next)
		}
		if got := a.Stats().TxPackets; got != s.sent || !next.Equal(wantNext) || w.QueueLen() != s.queueLn {
			t.Errorf("at +%v: %d sent, next %v, queue %d; want %d, %v, %d", s.at, got, next, w.QueueLen(), s.sent, wantNext, s.queueLn)
		}
	}
	c := w.Counters()
	if c.Enqueued != 5 || c.DroppedFull != 1 || c.Marked != 2 || c.MaxQueue != 5000 {
		t.Errorf("counters %+v", c)
	}
	in := recvAll(t, b, 5)
	for i, p := range in[:5] {
		psn := binary.BigEndian.Uint32(p.Buf[8:]) & 0xffffff
		want := uint8(ECT0)
		if i >= 3 {
			want = CE
		}
		if psn != uint32(i) || p.TClass != want || p.ICRC != nic.ICRCVerified {
			t.Errorf("packet %d: PSN %d TClass %#x ICRC %v; want PSN %d TClass %#x", i, psn, p.TClass, p.ICRC, i, want)
		}
	}
}

// TestLinkWallClock: Wrap delivers by itself, through its pump goroutine.
func TestLinkWallClock(t *testing.T) {
	a, b := pipe.New(pipe.Config{})
	defer b.Close()
	w, err := Wrap(a, Config{Rate: 1e9, Kmin: 2000, Kmax: 8000, Pmax: 1, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Send(packets(20, 1000, ECT1)); err != nil {
		t.Fatal(err)
	}
	done := make(chan []nic.Packet)
	go func() { done <- recvAll(t, b, 20) }()
	select {
	case in := <-done:
		marked := 0
		for _, p := range in {
			if p.TClass == CE {
				marked++
			}
		}
		if c := w.Counters(); marked == 0 || uint64(marked) != c.Marked {
			t.Errorf("%d received marked, counters %+v", marked, c)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("packets not delivered")
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Send(packets(1, 100, 0)); err == nil {
		t.Error("Send after Close succeeded")
	}
}

// TestLinkNoAlloc: once its buffers exist, the relay allocates nothing
// per packet.
func TestLinkNoAlloc(t *testing.T) {
	clk := &fakeClock{t: t0}
	a, b := pipe.New(pipe.Config{Depth: 4096})
	defer b.Close()
	w, err := WrapClock(a, Config{Rate: 8e9, Kmin: 20000, Kmax: 60000, Pmax: 0.1, Seed: 1}, clk.now)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	out := packets(16, 1000, ECT0)
	in := packets(64, 2048, 0)
	round := func() {
		w.Send(out)
		clk.t = clk.t.Add(16 * time.Microsecond)
		w.Pump()
		for a.Stats().TxPackets > b.Stats().RxPackets {
			b.Recv(in)
		}
	}
	for range 10 {
		round()
	}
	if n := testing.AllocsPerRun(100, round); n != 0 {
		t.Errorf("%v allocations per batch", n)
	}
}
