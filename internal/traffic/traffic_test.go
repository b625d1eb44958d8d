package traffic

import (
	"context"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/verbs"
)

// clock is simulated time: it moves only when a fake QP posts.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

// fakeQP completes every signaled WR at once into a real CQ, costs cost
// of simulated time per post (costAt, if set, per message), and counts
// pkts packets sent and one received per message.
type fakeQP struct {
	q       int
	cq      *cq.CQ
	clk     *clock
	cost    time.Duration
	costAt  func(n int) time.Duration
	pkts    uint64
	st      verbs.QPStats
	posts   []verbs.SendWR
	status  cq.Status
	failAt  int // post number that fails (0: none)
	retxPer int // one retransmission every retxPer messages
}

func (f *fakeQP) PostSend(wr *verbs.SendWR) error {
	n := len(f.posts)
	if f.failAt != 0 && n == f.failAt {
		return errors.New("send queue full")
	}
	f.posts = append(f.posts, *wr)
	if f.costAt != nil {
		f.clk.t = f.clk.t.Add(f.costAt(n))
	} else {
		f.clk.t = f.clk.t.Add(f.cost)
	}
	f.st.TxPackets += f.pkts
	f.st.RxPackets++
	if f.retxPer > 0 && (n+1)%f.retxPer == 0 {
		f.st.TxPackets++
		f.st.Retransmits++
	}
	if wr.Flags&verbs.SendSignaled != 0 {
		f.cq.Push(verbs.WC{WRID: wr.ID, Status: f.status})
	}
	return nil
}

func (f *fakeQP) Stats() verbs.QPStats { return f.st }

func newCQ(t *testing.T) *cq.CQ {
	c, err := cq.New(4096)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(math.Abs(a), math.Abs(b)) }

// TestSendFigures runs a scripted stream: 100 messages of 1000 bytes on
// one QP, one in flight, the first 50 taking 10 us each and the rest 5 us.
// Every figure follows from the script.
func TestSendFigures(t *testing.T) {
	clk := &clock{t: time.Unix(1000, 0)}
	c := newCQ(t)
	qp := &fakeQP{cq: c, clk: clk, pkts: 2, retxPer: 10, st: verbs.QPStats{TxPackets: 7, Retransmits: 3},
		costAt: func(n int) time.Duration {
			if n < 50 {
				return 10 * time.Microsecond
			}
			return 5 * time.Microsecond
		}}
	s := Sender{QPs: []QP{qp}, CQ: c, WRs: make([]verbs.SendWR, 1), Size: 1000, Iters: 100, TxDepth: 1, Now: clk.now}
	var progress [][2]int64
	s.Progress = func(done, total int64) { progress = append(progress, [2]int64{done, total}) }
	r, err := Send(context.Background(), &s)
	if err != nil {
		t.Fatal(err)
	}
	el := 750 * time.Microsecond
	if r.Messages != 100 || r.Bytes != 100000 || r.Elapsed != el {
		t.Fatalf("%d messages, %d bytes in %v; want 100, 100000 in %v", r.Messages, r.Bytes, r.Elapsed, el)
	}
	if !near(r.Avg, 1e5/el.Seconds()) || !near(r.MsgRate, 100/el.Seconds()) {
		t.Errorf("average %g B/s, %g msg/s", r.Avg, r.MsgRate)
	}
	// The best 10 messages (a tenth) are 10 fast ones: 10 x 1000 B in 50 us.
	if !near(r.Peak, 2e8) {
		t.Errorf("peak %g B/s, want 2e8", r.Peak)
	}
	// Counted packets: 2 per message plus 10 retransmitted, only those of
	// this run (the QP had sent 7 before).
	if r.Stats.TxPackets != 210 || r.Stats.Retransmits != 10 || r.Stats.RxPackets != 100 {
		t.Errorf("stats %+v", r.Stats)
	}
	if !near(r.TxPktRate, 210/el.Seconds()) || !near(r.RxPktRate, 100/el.Seconds()) {
		t.Errorf("packet rates %g, %g", r.TxPktRate, r.RxPktRate)
	}
	if len(progress) == 0 || progress[len(progress)-1] != [2]int64{100, 100} {
		t.Errorf("progress %v", progress)
	}
}

// TestSendSignalsAndShares: Iters are shared over the QPs, at most TxDepth
// are outstanding per QP, one in Signal is signaled and so is each QP's
// last, and a signaled completion retires those before it.
func TestSendSignalsAndShares(t *testing.T) {
	clk := &clock{t: time.Unix(0, 0)}
	c := newCQ(t)
	qps := []*fakeQP{{q: 0}, {q: 1}, {q: 2}}
	s := Sender{CQ: c, Size: 64, Iters: 23, TxDepth: 4, Signal: 3, Now: clk.now}
	for _, f := range qps {
		f.cq, f.clk, f.cost = c, clk, time.Microsecond
		s.QPs = append(s.QPs, f)
		s.WRs = append(s.WRs, verbs.SendWR{Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled})
	}
	var prepared int
	s.Prepare = func(q, n int, wr *verbs.SendWR) {
		prepared++
		wr.RemoteAddr = uint64(q)<<20 | uint64(n)
	}
	r, err := Send(context.Background(), &s)
	if err != nil {
		t.Fatal(err)
	}
	if r.Messages != 23 || prepared != 23 {
		t.Fatalf("%d messages, %d prepared", r.Messages, prepared)
	}
	for q, f := range qps {
		want := 7
		if q < 2 {
			want = 8
		}
		if len(f.posts) != want {
			t.Fatalf("QP %d: %d posts, want %d", q, len(f.posts), want)
		}
		for n, wr := range f.posts {
			if gq, gn := SplitWRID(wr.ID); gq != q || gn != n || wr.RemoteAddr != uint64(q)<<20|uint64(n) {
				t.Fatalf("QP %d post %d: wr_id %#x, remote %#x", q, n, wr.ID, wr.RemoteAddr)
			}
			signaled := wr.Flags&verbs.SendSignaled != 0
			if want := (n+1)%3 == 0 || n == want-1; signaled != want {
				t.Fatalf("QP %d post %d: signaled %v", q, n, signaled)
			}
		}
	}
}

// TestSendTimed: a timed run stops posting when time is up, at a signaled
// message of every QP, and drains.
func TestSendTimed(t *testing.T) {
	clk := &clock{t: time.Unix(0, 0)}
	c := newCQ(t)
	f := &fakeQP{cq: c, clk: clk, cost: 7 * time.Microsecond}
	s := Sender{QPs: []QP{f}, CQ: c, WRs: make([]verbs.SendWR, 1), Size: 8, Duration: time.Millisecond, TxDepth: 8, Signal: 4, Now: clk.now}
	r, err := Send(context.Background(), &s)
	if err != nil {
		t.Fatal(err)
	}
	n := len(f.posts)
	if n%4 != 0 || r.Messages != int64(n) || f.posts[n-1].Flags&verbs.SendSignaled == 0 {
		t.Fatalf("%d posts, %d messages completed", n, r.Messages)
	}
	// Posting stops at the first signaled message after 1 ms.
	if el := time.Duration(n) * 7 * time.Microsecond; el < time.Millisecond || el > time.Millisecond+8*7*time.Microsecond {
		t.Fatalf("%d posts take %v of simulated time", n, el)
	}
}

func TestSendErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		qp   fakeQP
		want string
	}{
		{"status", fakeQP{status: cq.RemAccessErr}, "completed with"},
		{"post", fakeQP{failAt: 3}, "send queue full"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := &clock{}
			c := newCQ(t)
			f := tc.qp
			f.cq, f.clk = c, clk
			s := Sender{QPs: []QP{&f}, CQ: c, WRs: make([]verbs.SendWR, 1), Size: 8, Iters: 10, TxDepth: 2, Now: clk.now}
			before := Runs()
			if _, err := Send(context.Background(), &s); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
			if Runs() != before {
				t.Fatal("a failed run was counted")
			}
		})
	}
	// A completion naming a QP that is not in the run.
	c := newCQ(t)
	c.Push(verbs.WC{WRID: WRID(5, 0)})
	clk := &clock{}
	s := Sender{QPs: []QP{&fakeQP{cq: newCQ(t), clk: clk}}, CQ: c, WRs: make([]verbs.SendWR, 1), Size: 8, Iters: 1, TxDepth: 1, Now: clk.now}
	if _, err := Send(context.Background(), &s); err == nil || !strings.Contains(err.Error(), "unknown wr_id") {
		t.Fatalf("error %v", err)
	}
}

// TestReceive: the receiver's clock starts at the first completion; with
// Idle it gives up on the missing messages and says how many.
func TestReceive(t *testing.T) {
	c := newCQ(t)
	clk := &clock{t: time.Unix(50, 0)}
	qp := &fakeQP{st: verbs.QPStats{RxPackets: 5}}
	// Three batches of completions, 100 us apart; 2 of 12 never come.
	batches := [][]int{{0, 1, 2, 3}, {4, 5, 6}, {7, 8, 9}}
	push := func(b []int) {
		for _, n := range b {
			c.Push(verbs.WC{WRID: WRID(0, n), ByteLen: 100})
			qp.st.RxPackets++
		}
	}
	push(batches[0])
	next := 1
	var got []int
	r := Receiver{QPs: []QP{qp}, CQ: c, Size: 100, Total: 12, Idle: 50 * time.Millisecond, Window: 1, Now: clk.now,
		OnRecv: func(q, n int, wc *verbs.WC) error {
			got = append(got, n)
			if n == batches[next-1][len(batches[next-1])-1] && next < len(batches) {
				// The last of a batch: the next arrives 100 us later.
				clk.t = clk.t.Add(100 * time.Microsecond)
				push(batches[next])
				next++
			}
			return nil
		}}
	res, err := Receive(context.Background(), &r)
	if err != nil {
		t.Fatal(err)
	}
	// The counters moved by the 6 packets that came during the run (the
	// first batch was in before it started).
	if len(got) != 10 || res.Messages != 10 || res.Lost != 2 || res.Bytes != 1000 || res.Stats.RxPackets != 6 {
		t.Fatalf("got %v, result %+v", got, res)
	}
	if res.Elapsed != 200*time.Microsecond || !near(res.Avg, 1000/200e-6) {
		t.Fatalf("elapsed %v, avg %g", res.Elapsed, res.Avg)
	}
	// Nothing at all: an error, not a result.
	r = Receiver{QPs: []QP{qp}, CQ: newCQ(t), Size: 1, Total: 1, Idle: 20 * time.Millisecond}
	if _, err := Receive(context.Background(), &r); err == nil || !strings.Contains(err.Error(), "no message arrived") {
		t.Fatalf("error %v", err)
	}
	// Until ctx ends (Total 0): what arrived, no error.
	c = newCQ(t)
	c.Push(verbs.WC{WRID: WRID(0, 0)})
	ctx, cancel := context.WithCancel(context.Background())
	r = Receiver{QPs: []QP{qp}, CQ: c, Size: 1, OnRecv: func(int, int, *verbs.WC) error { cancel(); return nil }}
	if res, err := Receive(ctx, &r); err != nil || res.Messages != 1 {
		t.Fatalf("%+v, %v", res, err)
	}
}

// TestPeakWindow: the peak never spans fewer messages than the window,
// so one burst of completions (a whole send window acknowledged at once)
// does not count as a rate.
func TestPeakWindow(t *testing.T) {
	us := time.Microsecond
	// 100 messages: 90 at a steady 10 us each, then 10 completing at once.
	var marks []mark
	for i := 1; i <= 90; i++ {
		marks = append(marks, mark{time.Duration(i) * 10 * us, int64(i)})
	}
	marks = append(marks, mark{900*us + 1, 100})
	if p := peak(marks, 1, 20); !near(p, 20/(100e-6+1e-9)) {
		// The best window of 20 messages ends with the burst: 20 in
		// 100 us and 1 ns (10 steady ones, then the 10 at once).
		t.Fatalf("peak %g", p)
	}
	if p := peak(marks, 1, 101); p != 0 {
		t.Fatalf("a window longer than the run gave %g", p)
	}
	// Decimation keeps the meter bounded and the totals exact.
	var m meter
	m.start = time.Unix(0, 0)
	for i := 1; i <= maxMarks+10; i++ {
		m.mark(m.start.Add(time.Duration(i)), int64(i))
	}
	if len(m.marks) > maxMarks || m.marks[len(m.marks)-1].n != maxMarks+10 {
		t.Fatalf("%d marks, last %+v", len(m.marks), m.marks[len(m.marks)-1])
	}
	if r := m.result(1, verbs.QPStats{}); r.Messages != maxMarks+10 || r.Elapsed != time.Duration(maxMarks+10) {
		t.Fatalf("%+v", r)
	}
}

// TestObserve: every finished run is counted and shown to observers.
func TestObserve(t *testing.T) {
	var seen []Result
	stop := Observe(func(r Result) { seen = append(seen, r) })
	before := Runs()
	clk := &clock{}
	c := newCQ(t)
	s := Sender{QPs: []QP{&fakeQP{cq: c, clk: clk, cost: time.Microsecond}}, CQ: c, WRs: make([]verbs.SendWR, 1), Size: 8, Iters: 5, TxDepth: 2, Now: clk.now}
	r, err := Send(context.Background(), &s)
	stop()
	if err != nil {
		t.Fatal(err)
	}
	if Runs() != before+1 || len(seen) != 1 || seen[0] != r {
		t.Fatalf("runs %d -> %d, seen %+v, result %+v", before, Runs(), seen, r)
	}
	if _, err := Send(context.Background(), &s); err != nil || len(seen) != 1 {
		t.Fatalf("observer called after stop (%d), %v", len(seen), err)
	}
}

// countingQP completes every signaled WR into a CQ and keeps nothing.
type countingQP struct{ cq *cq.CQ }

func (f countingQP) PostSend(wr *verbs.SendWR) error {
	if wr.Flags&verbs.SendSignaled != 0 {
		f.cq.Push(verbs.WC{WRID: wr.ID})
	}
	return nil
}

func (countingQP) Stats() verbs.QPStats { return verbs.QPStats{} }

// TestSendNoAllocPerMessage: the loop allocates per run, never per message.
func TestSendNoAllocPerMessage(t *testing.T) {
	c := newCQ(t)
	run := func(iters int) float64 {
		s := Sender{QPs: []QP{countingQP{c}, countingQP{c}}, CQ: c, WRs: make([]verbs.SendWR, 2), Size: 64, Iters: iters, TxDepth: 16, Signal: 4}
		return testing.AllocsPerRun(5, func() {
			if _, err := Send(context.Background(), &s); err != nil {
				t.Fatal(err)
			}
		})
	}
	if small, big := run(16), run(4000); big > small {
		t.Fatalf("%v allocations for 16 messages, %v for 4000", small, big)
	}
}

// TestSumCoversEveryCounter: Sum and the run's difference carry every
// transport counter.
func TestSumCoversEveryCounter(t *testing.T) {
	var a verbs.QPStats
	v := reflect.ValueOf(&a).Elem()
	// The counters are the uint64 fields; CC is a state (rates, alpha)
	// that does not add up.
	for i := range v.NumField() {
		if v.Field(i).Kind() == reflect.Uint64 {
			v.Field(i).SetUint(uint64(10 + i))
		}
	}
	qp := &fakeQP{st: a}
	s := Sum([]QP{qp, qp})
	d := add(s, a, -1)
	sv, dv := reflect.ValueOf(s), reflect.ValueOf(d)
	for i := range v.NumField() {
		if v.Field(i).Kind() != reflect.Uint64 {
			continue
		}
		if sv.Field(i).Uint() != uint64(2*(10+i)) || dv.Field(i).Uint() != uint64(10+i) {
			t.Fatalf("%s: sum %d, difference %d", v.Type().Field(i).Name, sv.Field(i).Uint(), dv.Field(i).Uint())
		}
	}
}
