package cq

import (
	"context"
	"testing"
)

// A push hook takes completions instead of the ring; once it declines one,
// later completions queue behind it until the CQ is polled empty, so the
// two consumers never see them out of order.
func TestPushHook(t *testing.T) {
	c, _ := New(4)
	var taken []uint64
	accept := true
	c.SetPushHook(func(wc WC, solicited bool) bool {
		if !accept {
			return false
		}
		taken = append(taken, wc.WRID)
		return true
	})
	c.ReqNotify(false)
	if !c.Push(WC{WRID: 1}) || !c.PushSolicited(WC{WRID: 2}, true) {
		t.Fatal("push refused")
	}
	if c.Len() != 0 || len(taken) != 2 || taken[0] != 1 || taken[1] != 2 {
		t.Fatalf("hook took %v, CQ holds %d", taken, c.Len())
	}
	select {
	case <-c.Notify():
		t.Fatal("a completion the hook took fired the notification")
	default:
	}
	accept = false
	c.Push(WC{WRID: 3})
	accept = true
	c.Push(WC{WRID: 4}) // must queue behind 3
	if c.Len() != 2 || len(taken) != 2 {
		t.Fatalf("after a decline: CQ holds %d, hook took %v", c.Len(), taken)
	}
	select {
	case <-c.Notify():
	default:
		t.Fatal("a stored completion did not fire the armed CQ")
	}
	buf := make([]WC, 4)
	if n := c.Poll(buf); n != 2 || buf[0].WRID != 3 || buf[1].WRID != 4 {
		t.Fatalf("polled %d: %+v", n, buf[:n])
	}
	c.Push(WC{WRID: 5}) // empty again: the hook is offered it
	if c.Len() != 0 || len(taken) != 3 || taken[2] != 5 {
		t.Fatalf("after polling empty: CQ holds %d, hook took %v", c.Len(), taken)
	}
	c.SetPushHook(nil)
	c.Push(WC{WRID: 6})
	if c.Len() != 1 || len(taken) != 3 {
		t.Fatalf("removed hook: CQ holds %d, hook took %v", c.Len(), taken)
	}
}

func TestPushHookNoAlloc(t *testing.T) {
	c, _ := New(8)
	var n int
	c.SetPushHook(func(wc WC, solicited bool) bool { n += int(wc.ByteLen); return true })
	allocs := testing.AllocsPerRun(100, func() {
		c.Push(WC{WRID: 1, ByteLen: 1})
		c.PushSolicited(WC{WRID: 2, ByteLen: 1}, true)
	})
	if allocs != 0 {
		t.Fatalf("Push through the hook allocates %v times", allocs)
	}
	if n == 0 {
		t.Fatal("hook not called")
	}
}

// TestPollHook: a Poll that finds the CQ empty runs the poll hook once
// and returns what the hook pushed; a Poll with completions stored, and
// Wait, do not run it.
func TestPollHook(t *testing.T) {
	c, _ := New(4)
	calls := 0
	c.SetPollHook(func() bool {
		calls++
		if calls == 1 {
			c.Push(WC{WRID: 7})
			return true
		}
		return false
	})
	wcs := make([]WC, 2)
	if n := c.Poll(wcs); n != 1 || wcs[0].WRID != 7 || calls != 1 {
		t.Fatalf("first Poll: %d completions (wr_id %d), hook ran %d times; want 1, 7, 1", n, wcs[0].WRID, calls)
	}
	if n := c.Poll(wcs); n != 0 || calls != 2 {
		t.Fatalf("empty Poll: %d completions, hook ran %d times; want 0, 2", n, calls)
	}
	c.Push(WC{WRID: 8})
	if n := c.Poll(wcs); n != 1 || calls != 2 {
		t.Fatalf("Poll with one stored: %d completions, hook ran %d times; want 1, 2", n, calls)
	}
	c.Push(WC{WRID: 9})
	if n, err := c.Wait(context.Background(), wcs); n != 1 || err != nil || calls != 2 {
		t.Fatalf("Wait: %d, %v, hook ran %d times; want 1, nil, 2", n, err, calls)
	}
	c.SetPollHook(nil)
	if n := c.Poll(wcs); n != 0 || calls != 2 {
		t.Fatalf("after removing the hook: %d completions, hook ran %d times", n, calls)
	}
}
