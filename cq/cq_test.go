package cq

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

func TestStatusStrings(t *testing.T) {
	// Spot checks against ibv_wc_status_str, plus the full range is named.
	cases := map[Status]string{
		Success:          "success",
		LocLenErr:        "local length error",
		LocProtErr:       "local protection error",
		WRFlushErr:       "Work Request Flushed Error",
		RemInvReqErr:     "remote invalid request error",
		RemAccessErr:     "remote access error",
		RemOpErr:         "remote operation error",
		RetryExcErr:      "transport retry counter exceeded",
		RNRRetryExcErr:   "RNR retry counter exceeded",
		FatalErr:         "fatal error",
		GeneralErr:       "general error",
		TMRndvIncomplete: "TM software rendezvous",
		Status(24):       "unknown",
		Status(255):      "unknown",
	}
	for s, want := range cases {
		if got := s.String(); got != want {
			t.Errorf("Status(%d).String() = %q, want %q", s, got, want)
		}
	}
	if RetryExcErr != 12 || GeneralErr != 21 || TMRndvIncomplete != 23 {
		t.Errorf("status values drifted from enum ibv_wc_status")
	}
	for s := Success; s <= TMRndvIncomplete; s++ {
		if s.String() == "" || s.String() == "unknown" {
			t.Errorf("Status(%d) has no name", s)
		}
	}
}

func TestOpcodeAndFlags(t *testing.T) {
	if OpRecv.String() != "RECV" || OpRDMARead.String() != "RDMA_READ" || Opcode(77).String() != "Opcode(77)" {
		t.Errorf("opcode names: %v %v %v", OpRecv, OpRDMARead, Opcode(77))
	}
	if got := (FlagWithImm | FlagWithInv).String(); got != "WITH_IMM|WITH_INV" {
		t.Errorf("flags = %q", got)
	}
	if got := Flags(0x30 | 1).String(); got != "GRH|0x30" {
		t.Errorf("flags = %q", got)
	}
}

func TestNewDepth(t *testing.T) {
	for _, d := range []int{0, -1, MaxDepth + 1} {
		if _, err := New(d); err == nil {
			t.Errorf("New(%d) succeeded", d)
		}
	}
	c, err := New(3)
	if err != nil || c.Depth() != 3 {
		t.Fatalf("New(3) = %v, %v", c, err)
	}
}

func TestBatchPollOrderAndWrap(t *testing.T) {
	c, _ := New(4)
	next, want := uint64(0), uint64(0)
	buf := make([]WC, 3)
	// Push and poll in uneven batches so the ring wraps many times.
	for round := 0; round < 50; round++ {
		for c.Len() < 4 {
			if !c.Push(WC{WRID: next}) {
				t.Fatal("push failed below depth")
			}
			next++
		}
		n := c.Poll(buf[:1+round%3])
		if n != 1+round%3 {
			t.Fatalf("round %d: polled %d", round, n)
		}
		for _, wc := range buf[:n] {
			if wc.WRID != want {
				t.Fatalf("got wr_id %d, want %d", wc.WRID, want)
			}
			want++
		}
	}
	if n := c.Poll(nil); n != 0 {
		t.Fatalf("Poll(nil) = %d", n)
	}
}

func TestPushPollNoAlloc(t *testing.T) {
	c, _ := New(8)
	buf := make([]WC, 8)
	allocs := testing.AllocsPerRun(100, func() {
		c.Push(WC{WRID: 1})
		c.PushSolicited(WC{WRID: 2}, true)
		c.Poll(buf)
	})
	if allocs != 0 {
		t.Fatalf("Push/Poll allocate %v times", allocs)
	}
}

func TestOverrun(t *testing.T) {
	c, _ := New(2)
	c.ReqNotify(true)
	if !c.Push(WC{WRID: 1}) || !c.Push(WC{WRID: 2}) {
		t.Fatal("push within depth failed")
	}
	if c.Err() != nil {
		t.Fatal("error before overrun")
	}
	if c.Push(WC{WRID: 3}) {
		t.Fatal("push beyond depth succeeded")
	}
	select {
	case ev := <-c.Events():
		if ev.Type != EventCQErr || !errors.Is(ev.Err, ErrOverrun) || ev.Type.String() != "CQ error" {
			t.Fatalf("event = %+v", ev)
		}
	default:
		t.Fatal("no CQ_ERR event")
	}
	select {
	case <-c.Notify():
	default:
		t.Fatal("overrun did not wake an armed CQ")
	}
	// The CQ stays in error: later pushes fail even with room, and no second event.
	buf := make([]WC, 4)
	n, err := c.Wait(context.Background(), buf)
	if n != 2 || !errors.Is(err, ErrOverrun) || buf[0].WRID != 1 || buf[1].WRID != 2 {
		t.Fatalf("Wait after overrun = %d, %v, %+v", n, err, buf[:n])
	}
	if c.Push(WC{WRID: 4}) {
		t.Fatal("push after overrun succeeded")
	}
	select {
	case ev := <-c.Events():
		t.Fatalf("second event %+v", ev)
	default:
	}
	if n, err := c.Wait(context.Background(), buf); n != 0 || !errors.Is(err, ErrOverrun) {
		t.Fatalf("Wait on drained overrun CQ = %d, %v", n, err)
	}
	if c.Poll(buf) != 0 {
		t.Fatal("poll returned the rejected completion")
	}
}

func TestWaitTimeoutCancelAndWake(t *testing.T) {
	c, _ := New(4)
	buf := make([]WC, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if n, err := c.Wait(ctx, buf); n != 0 || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait on empty CQ = %d, %v", n, err)
	}
	ctx2, cancel2 := context.WithCancel(context.Background())
	go func() { time.Sleep(5 * time.Millisecond); cancel2() }()
	if _, err := c.Wait(ctx2, buf); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait after cancel = %v", err)
	}
	go func() { time.Sleep(5 * time.Millisecond); c.Push(WC{WRID: 42}) }()
	n, err := c.Wait(context.Background(), buf)
	if n != 1 || err != nil || buf[0].WRID != 42 {
		t.Fatalf("Wait = %d, %v, %+v", n, err, buf[0])
	}
	if _, err := c.Wait(context.Background(), nil); err == nil {
		t.Fatal("Wait with empty slice succeeded")
	}
}

func TestManyWaitersAllWake(t *testing.T) {
	// Three waiters taking one completion each must all return when three
	// completions arrive, even though wake-ups coalesce.
	c, _ := New(8)
	var wg sync.WaitGroup
	got := make(chan uint64, 3)
	for range 3 {
		wg.Go(func() {
			buf := make([]WC, 1)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if n, err := c.Wait(ctx, buf); n == 1 && err == nil {
				got <- buf[0].WRID
			}
		})
	}
	time.Sleep(10 * time.Millisecond)
	c.Push(WC{WRID: 1})
	c.Push(WC{WRID: 2})
	c.Push(WC{WRID: 3})
	wg.Wait()
	if len(got) != 3 {
		t.Fatalf("%d of 3 waiters got a completion", len(got))
	}
}

func fired(c *CQ) bool {
	select {
	case <-c.Notify():
		return true
	default:
		return false
	}
}

func TestNotifyArmSemantics(t *testing.T) {
	c, _ := New(16)
	c.Push(WC{})
	if fired(c) {
		t.Fatal("unarmed CQ fired")
	}
	c.ReqNotify(false)
	if fired(c) {
		t.Fatal("arming with a completion already queued fired")
	}
	c.Push(WC{})
	c.Push(WC{})
	if !fired(c) {
		t.Fatal("armed CQ did not fire")
	}
	if fired(c) {
		t.Fatal("one arm fired twice")
	}
	c.Push(WC{})
	if fired(c) {
		t.Fatal("fired after disarm")
	}

	// Solicited only: plain success completions do not fire.
	c.ReqNotify(true)
	c.Push(WC{Status: Success})
	c.PushSolicited(WC{Status: Success}, false)
	if fired(c) {
		t.Fatal("solicited-only arm fired for unsolicited success")
	}
	c.PushSolicited(WC{Status: Success}, true)
	if !fired(c) {
		t.Fatal("solicited-only arm did not fire for a solicited completion")
	}
	c.ReqNotify(true)
	c.Push(WC{Status: WRFlushErr})
	if !fired(c) {
		t.Fatal("solicited-only arm did not fire for an error completion")
	}
	// ReqNotify(false) widens a solicited arm; ReqNotify(true) does not narrow.
	c.ReqNotify(true)
	c.ReqNotify(false)
	c.Push(WC{})
	if !fired(c) {
		t.Fatal("widened arm did not fire")
	}
	c.ReqNotify(false)
	c.ReqNotify(true)
	c.Push(WC{})
	if !fired(c) {
		t.Fatal("ReqNotify(true) narrowed an any-completion arm")
	}
}

func TestResize(t *testing.T) {
	c, _ := New(3)
	buf := make([]WC, 3)
	c.Push(WC{WRID: 0})
	c.Poll(buf[:1])
	for i := uint64(1); i <= 3; i++ { // wraps: head is 1
		c.Push(WC{WRID: i})
	}
	if err := c.Resize(2); err == nil {
		t.Fatal("shrinking below stored count succeeded")
	}
	if err := c.Resize(0); err == nil {
		t.Fatal("Resize(0) succeeded")
	}
	if err := c.Resize(5); err != nil {
		t.Fatal(err)
	}
	c.Push(WC{WRID: 4})
	c.Push(WC{WRID: 5})
	out := make([]WC, 8)
	n := c.Poll(out)
	if n != 5 || c.Depth() != 5 {
		t.Fatalf("after resize polled %d depth %d", n, c.Depth())
	}
	for i := range n {
		if out[i].WRID != uint64(i+1) {
			t.Fatalf("order after resize: %+v", out[:n])
		}
	}
}

func TestConcurrentPushPoll(t *testing.T) {
	const producers, per, depth = 4, 3000, 32
	c, _ := New(depth)
	slots := make(chan struct{}, depth) // credits: never more than depth in flight
	for range depth {
		slots <- struct{}{}
	}
	var wg sync.WaitGroup
	for p := range producers {
		wg.Go(func() {
			for i := range per {
				<-slots
				if !c.Push(WC{WRID: uint64(p)<<32 | uint64(i)}) {
					t.Error("push rejected within credits")
					return
				}
			}
		})
	}
	last := make([]int64, producers)
	for i := range last {
		last[i] = -1
	}
	buf := make([]WC, 7)
	total := 0
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for total < producers*per {
		n, err := c.Wait(ctx, buf)
		if err != nil {
			t.Fatalf("after %d: %v", total, err)
		}
		for _, wc := range buf[:n] {
			p, i := int(wc.WRID>>32), int64(uint32(wc.WRID))
			if i != last[p]+1 {
				t.Fatalf("producer %d: got %d after %d (per-producer order broken)", p, i, last[p])
			}
			last[p] = i
			slots <- struct{}{}
		}
		total += n
	}
	wg.Wait()
	if c.Err() != nil {
		t.Fatal(c.Err())
	}
}

func BenchmarkPushPoll(b *testing.B) {
	c, _ := New(1024)
	buf := make([]WC, 16)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		c.Push(WC{WRID: uint64(i)})
		if i%16 == 15 {
			c.Poll(buf)
		}
	}
}

// TestErrorHook: the hook sees the first overrun exactly once, with the same
// event Events delivers; later rejected pushes do not call it again, and a
// removed hook is not called.
func TestErrorHook(t *testing.T) {
	c, _ := New(1)
	var got []Event
	c.SetErrorHook(func(ev Event) { got = append(got, ev) })
	if !c.Push(WC{WRID: 1}) {
		t.Fatal("first push rejected")
	}
	if len(got) != 0 {
		t.Fatalf("hook called before any overrun: %+v", got)
	}
	for i := 0; i < 3; i++ {
		if c.Push(WC{WRID: uint64(2 + i)}) {
			t.Fatal("push into a full CQ accepted")
		}
	}
	if len(got) != 1 || got[0].Type != EventCQErr || !errors.Is(got[0].Err, ErrOverrun) {
		t.Fatalf("hook saw %+v, want one CQ_ERR", got)
	}
	if ev := <-c.Events(); ev != got[0] {
		t.Fatalf("Events delivered %+v, the hook %+v", ev, got[0])
	}

	d, _ := New(1)
	called := false
	d.SetErrorHook(func(Event) { called = true })
	d.SetErrorHook(nil)
	d.Push(WC{})
	d.Push(WC{})
	if called {
		t.Fatal("removed hook called")
	}
}
