package impair

import (
	"encoding/binary"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/softroce/softroce/icrc"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/nic/pipe"
)

func TestParse(t *testing.T) {
	c, err := Parse("loss=10%,dup=5%,reorder=10%,corrupt=1%,delay=1ms,seed=7")
	if err != nil {
		t.Fatal(err)
	}
	want := Config{Loss: 0.1, Dup: 0.05, Reorder: 0.1, Corrupt: 0.01, Delay: time.Millisecond, Seed: 7}
	if c != want {
		t.Fatalf("Parse = %+v, want %+v", c, want)
	}
	if c2, err := Parse(c.String()); err != nil || c2 != c {
		t.Errorf("round trip %q -> %+v, %v", c.String(), c2, err)
	}
	c, err = Parse(" loss = 0.25 , jitter=200us, hold=2ms, queue=16 ")
	if err != nil || c.Loss != 0.25 || c.Jitter != 200*time.Microsecond || c.Hold != 2*time.Millisecond || c.Queue != 16 {
		t.Errorf("Parse = %+v, %v", c, err)
	}
	if c, err := Parse(""); err != nil || c != (Config{}) {
		t.Errorf("empty: %+v %v", c, err)
	}
	for _, bad := range []string{"loss", "loss=abc", "loss=101%", "loss=-1%", "dup=2", "delay=fast",
		"delay=-1ms", "seed=x", "queue=0", "frobnicate=1", "loss=NaN"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) succeeded", bad)
		} else if !strings.HasPrefix(err.Error(), "impair: ") {
			t.Errorf("Parse(%q) error %q lacks the package prefix", bad, err)
		}
	}
	// A bare number above 1 is most likely a percentage without its sign:
	// the error shows both ways of writing it.
	for in, want := range map[string]string{
		"loss=10":    "impair: loss=10: a probability is a percentage or a fraction: write 10% or 0.1",
		"dup=2.5":    "write 2.5% or 0.025",
		"loss=101%":  "a percentage from 0% to 100% (10%) or a fraction from 0 to 1 (0.1)",
		"corrupt=-1": "a percentage from 0% to 100% (10%) or a fraction from 0 to 1 (0.1)",
	} {
		if _, err := Parse(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q) = %v, want %q", in, err, want)
		}
	}
}

// setup returns an impaired sender and the plain receiving end of a pipe.
func setup(t *testing.T, cfg Config) (*Link, nic.Link) {
	t.Helper()
	a, b := pipe.New(pipe.Config{Depth: 4096})
	w := Wrap(a, cfg)
	t.Cleanup(func() { w.Close(); b.Close() })
	return w, b
}

func packets(n, size int) []nic.Packet {
	pkts := make([]nic.Packet, n)
	for i := range pkts {
		pkts[i].Buf = make([]byte, size)
		pkts[i].N = size
	}
	return pkts
}

// number writes seq into the PSN of every packet of out.
func number(out []nic.Packet, first int) {
	for i := range out {
		b := out[i].Buf
		clear(b)
		b[0] = 0x04
		binary.BigEndian.PutUint32(b[8:], uint32(first+i))
		for j := 12; j < len(b)-icrc.Len; j++ {
			b[j] = byte(first + i + j)
		}
	}
}

// drain receives until n packets arrived or idle passed without traffic,
// and returns their sequence numbers.
func drain(t *testing.T, b nic.Link, n int, idle time.Duration) []int {
	t.Helper()
	var got []int
	in := packets(64, 256)
	tick := make(chan struct{}, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for len(got) < n {
			k, err := b.Recv(in)
			if err != nil {
				return
			}
			for i := 0; i < k; i++ {
				got = append(got, int(binary.BigEndian.Uint32(in[i].Buf[8:])))
			}
			select {
			case tick <- struct{}{}:
			default:
			}
		}
	}()
	timer := time.NewTimer(idle)
	defer timer.Stop()
	for {
		select {
		case <-done:
			return got
		case <-tick:
			timer.Reset(idle)
		case <-timer.C:
			b.Close()
			<-done
			return got
		}
	}
}

func send(t *testing.T, w *Link, total int) {
	t.Helper()
	out := packets(50, 128)
	for seq := 0; seq < total; seq += len(out) {
		number(out, seq)
		if n, err := w.Send(out); n != len(out) || err != nil {
			t.Fatalf("Send = %d, %v", n, err)
		}
	}
}

func TestPassThrough(t *testing.T) {
	w, b := setup(t, Config{})
	send(t, w, 1000)
	got := drain(t, b, 1000, 5*time.Second)
	for i, s := range got {
		if s != i {
			t.Fatalf("packet %d is %d", i, s)
		}
	}
	if len(got) != 1000 || w.Counters() != (Counters{Packets: 1000}) {
		t.Errorf("got %d, counters %+v", len(got), w.Counters())
	}
}

func TestLossRate(t *testing.T) {
	w, b := setup(t, Config{Loss: 0.1, Seed: 42})
	const total = 3000
	send(t, w, total)
	c := w.Counters()
	got := drain(t, b, total-int(c.Dropped), 5*time.Second)
	if rate := float64(c.Dropped) / total; math.Abs(rate-0.1) > 0.02 {
		t.Errorf("loss rate %.3f, want 0.10", rate)
	}
	if len(got) != total-int(c.Dropped) {
		t.Errorf("received %d, want %d", len(got), total-int(c.Dropped))
	}
}

func TestDeterministic(t *testing.T) {
	run := func(seed uint64) []int {
		// A long Hold: a held packet must be overtaken by the next
		// send, not released by its timer, for the order to repeat.
		w, b := setup(t, Config{Loss: 0.1, Dup: 0.1, Reorder: 0.1, Corrupt: 0.05, Seed: seed, Hold: 200 * time.Millisecond})
		send(t, w, 1000)
		return drain(t, b, 1<<30, 500*time.Millisecond)
	}
	a, b, c := run(7), run(7), run(8)
	if len(a) < 900 || !equal(a, b) {
		t.Errorf("same seed, different outcomes (%d vs %d packets)", len(a), len(b))
	}
	if equal(a, c) {
		t.Error("different seeds, same outcome")
	}
}

func equal(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestCorruptCaughtByICRC(t *testing.T) {
	w, b := setup(t, Config{Corrupt: 1, Seed: 3})
	out := packets(100, 128)
	number(out, 0)
	keep := make([][]byte, len(out))
	for i := range out {
		keep[i] = append([]byte(nil), out[i].Buf[:128-icrc.Len]...)
	}
	w.Send(out)
	// One good packet behind them, to know the corrupted ones were processed.
	last := packets(1, 128)
	number(last, 1000)
	w2 := Wrap(w.Inner(), Config{})
	w2.Send(last)
	got := drain(t, b, 1, 5*time.Second)
	if len(got) != 1 || got[0] != 1000 {
		t.Errorf("received %v, want only the good packet", got)
	}
	if bad := b.Stats().RxICRCBad; bad != 100 {
		t.Errorf("receiver dropped %d packets for a bad ICRC, want 100", bad)
	}
	for i := range out {
		if string(out[i].Buf[:128-icrc.Len]) != string(keep[i]) {
			t.Fatalf("caller's packet %d was modified", i)
		}
	}
}

func TestDuplicate(t *testing.T) {
	w, b := setup(t, Config{Dup: 1})
	send(t, w, 100)
	got := drain(t, b, 200, 5*time.Second)
	for i, s := range got {
		if s != i/2 {
			t.Fatalf("got %v", got)
		}
	}
	if len(got) != 200 || w.Counters().Duplicated != 100 {
		t.Errorf("got %d packets, counters %+v", len(got), w.Counters())
	}
}

func TestReorder(t *testing.T) {
	w, b := setup(t, Config{Reorder: 1, Hold: 20 * time.Millisecond})
	out := packets(5, 64)
	number(out, 0)
	start := time.Now()
	w.Send(out)
	// Every packet is held behind its successor: 1 0 3 2, and 4 waits for
	// a successor that never comes until Hold expires.
	got := drain(t, b, 5, 5*time.Second)
	if !equal(got, []int{1, 0, 3, 2, 4}) {
		t.Errorf("order %v", got)
	}
	if el := time.Since(start); el < 20*time.Millisecond {
		t.Errorf("held packet released after %v, before Hold", el)
	}
	if c := w.Counters(); c.Reordered != 3 {
		t.Errorf("counters %+v", c)
	}
}

func TestDelayAndJitter(t *testing.T) {
	w, b := setup(t, Config{Delay: 30 * time.Millisecond})
	out := packets(10, 64)
	number(out, 0)
	start := time.Now()
	w.Send(out)
	got := drain(t, b, 10, 5*time.Second)
	if el := time.Since(start); el < 30*time.Millisecond || len(got) != 10 {
		t.Errorf("%d packets after %v", len(got), el)
	}
	for i, s := range got {
		if s != i {
			t.Errorf("constant delay reordered: %v", got)
			break
		}
	}
	w, b = setup(t, Config{Jitter: 5 * time.Millisecond, Seed: 1})
	send(t, w, 200)
	got = drain(t, b, 200, 5*time.Second)
	inversions := 0
	for i := 1; i < len(got); i++ {
		if got[i] < got[i-1] {
			inversions++
		}
	}
	if len(got) != 200 || inversions == 0 || w.Counters().Delayed != 200 {
		t.Errorf("jitter: %d packets, %d inversions, %+v", len(got), inversions, w.Counters())
	}
}

func TestDelayQueueOverflow(t *testing.T) {
	w, b := setup(t, Config{Delay: 10 * time.Millisecond, Queue: 8})
	send(t, w, 50)
	got := drain(t, b, 8, 5*time.Second)
	if c := w.Counters(); len(got) != 8 || c.Overflow != 42 || c.Delayed != 8 {
		t.Errorf("got %d, counters %+v", len(got), c)
	}
}

func TestSendAfterClose(t *testing.T) {
	w, _ := setup(t, Config{Delay: time.Millisecond})
	w.Close()
	if _, err := w.Send(packets(1, 64)); err == nil {
		t.Error("Send after Close succeeded")
	}
}

// FuzzParse: Parse never panics, and what it accepts formats back to a
// string that parses to the same Config.
func FuzzParse(f *testing.F) {
	f.Add("loss=10%,dup=5%,reorder=10%,corrupt=1%,delay=1ms,seed=7")
	f.Add("jitter=200us,hold=2ms,queue=16")
	f.Add("loss=0.1234567891234")
	f.Fuzz(func(t *testing.T, s string) {
		c, err := Parse(s)
		if err != nil {
			return
		}
		c2, err := Parse(c.String())
		if err != nil || c2 != c {
			t.Fatalf("%q -> %+v -> %q -> %+v, %v", s, c, c.String(), c2, err)
		}
	})
}
