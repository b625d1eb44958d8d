package verbs

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/qpstate"
)

// blockingPair connects RC QPs on two blocking devices over loopback UDP,
// both with opts.
func blockingPair(t *testing.T, depth int, opts *Options) (qa, qb *QP, ca, cb *CQ, a, b *Device) {
	t.Helper()
	a, pa := openUDPDevice(t, opts)
	b, pb := openUDPDevice(t, opts)
	qa, qb, ca, cb = connectRC(t, a, b, pa, pb, depth)
	return qa, qb, ca, cb, a, b
}

// pingPong runs n SEND ping-pongs between qa and qb, each side waiting in
// Wait on its own goroutine, and checks every completion.
func pingPong(t *testing.T, n int, qa, qb *QP, ca, cb *CQ) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	side := func(q *QP, c *CQ, first bool) error {
		wcs := make([]cq.WC, 1)
		recv := func() error {
			if _, err := c.Wait(ctx, wcs); err != nil {
				return err
			}
			if wcs[0].Status != cq.Success || wcs[0].Opcode != cq.OpRecv {
				return errors.New("receive completed with " + wcs[0].Status.String())
			}
			return q.PostRecv(&RecvWR{ID: 1})
		}
		send := func(i int) error {
			if err := q.PostSend(&SendWR{ID: uint64(i), Opcode: WRSendWithImm, Flags: SendSignaled, Imm: uint32(i)}); err != nil {
				return err
			}
			// The send's completion, then (unless last) the reply.
			if _, err := c.Wait(ctx, wcs); err != nil {
				return err
			}
			if wcs[0].Status != cq.Success || wcs[0].Opcode != cq.OpSend {
				return errors.New("send completed with " + wcs[0].Status.String())
			}
			return nil
		}
		if err := q.PostRecv(&RecvWR{ID: 1}); err != nil {
			return err
		}
		for i := 0; i < n; i++ {
			if !first {
				if err := recv(); err != nil {
					return err
				}
			}
			if err := send(i); err != nil {
				return err
			}
			if first {
				if err := recv(); err != nil {
					return err
				}
			}
		}
		return nil
	}
	errc := make(chan error, 1)
	go func() { errc <- side(qb, cb, false) }()
	if err := side(qa, ca, true); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

// TestInlineWaitPingPong: a SEND ping-pong between two blocking devices
// whose consumers wait in CQ.Wait: every message completes, and the
// consumers themselves receive most packets (Stats().Inline), so a packet
// wakes the goroutine that wants it. With NoInlineWait none is received
// inline.
func TestInlineWaitPingPong(t *testing.T) {
	const n = 300
	for _, off := range []bool{false, true} {
		qa, qb, ca, cb, a, b := blockingPair(t, 8, &Options{NoInlineWait: off})
		pingPong(t, n, qa, qb, ca, cb)
		ia, ib := a.drv.Stats().Inline, b.drv.Stats().Inline
		t.Logf("NoInlineWait %v: packets received inline: %d and %d of about %d each", off, ia, ib, 2*n)
		if off && ia+ib != 0 {
			t.Fatalf("NoInlineWait: %d packets received inline", ia+ib)
		}
		// Each side receives n SENDs and n ACKs; the receive goroutine
		// keeps the first few, and any that arrive between two waits.
		if !off && (ia < n/2 || ib < n/2) {
			t.Fatalf("only %d and %d of %d packets a side received inline", ia, ib, 2*n)
		}
	}
}

// TestInlineWaitWokenFromElsewhere: a consumer blocked in Wait on an
// empty CQ receives on the link (nothing arrives); a completion pushed by
// another goroutine (the flush of a QP moved to ERR) wakes it at once.
func TestInlineWaitWokenFromElsewhere(t *testing.T) {
	qa, _, ca, _, a, _ := blockingPair(t, 8, nil)
	if err := qa.PostRecv(&RecvWR{ID: 7}); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	wcs := make([]cq.WC, 1)
	go func() {
		_, err := ca.Wait(context.Background(), wcs)
		got <- err
	}()
	// Let it take the seat and block receiving.
	for deadline := time.Now().Add(5 * time.Second); !a.drv.SeatTaken() && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	if !a.drv.SeatTaken() {
		t.Fatal("the waiting consumer never took the receive path")
	}
	if err := qa.Modify(&QPAttr{State: StateErr}, qpstate.AttrState); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
		if wcs[0].Status != cq.WRFlushErr || wcs[0].WRID != 7 {
			t.Fatalf("completion %+v, want the flushed receive 7", wcs[0])
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the flush completion did not wake the waiting consumer")
	}
}

// TestInlineWaitContext: a consumer receiving in Wait returns when its
// context ends, and the device goes on working: the receive goroutine or
// the next waiter takes the receive path over.
func TestInlineWaitContext(t *testing.T) {
	qa, qb, ca, cb, _, _ := blockingPair(t, 8, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	if _, err := ca.Wait(ctx, make([]cq.WC, 1)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait = %v, want the deadline", err)
	}
	if d := time.Since(t0); d > 5*time.Second {
		t.Fatalf("Wait returned %v after its deadline", d)
	}
	pingPong(t, 20, qa, qb, ca, cb)
}

// TestInlineWaitOtherCQ: while one consumer holds the receive path,
// blocked on a CQ nothing completes on, another consumer of the device
// gets each of its completions (the first one's goroutine receives them
// and wakes it); after the first gives up, the second carries on alone.
func TestInlineWaitOtherCQ(t *testing.T) {
	qa, qb, ca, cb, _, b := blockingPair(t, 8, nil)
	idle, _ := b.CreateCQ(4)
	ctx, cancel := context.WithCancel(context.Background())
	held := make(chan error, 1)
	go func() {
		_, err := idle.Wait(ctx, make([]cq.WC, 1))
		held <- err
	}()
	for deadline := time.Now().Add(5 * time.Second); !b.drv.SeatTaken() && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	before := b.drv.Stats().Inline
	pingPong(t, 100, qa, qb, ca, cb)
	if b.drv.Stats().Inline == before {
		t.Fatal("no packet was received by a waiting consumer")
	}
	cancel()
	if err := <-held; !errors.Is(err, context.Canceled) {
		t.Fatalf("the idle waiter: %v", err)
	}
	pingPong(t, 100, qa, qb, ca, cb)
}

// TestInlineWaitThenNoWait: after its consumer got its completion through
// an inline wait and stopped waiting, a device still answers its peer: a
// WRITE into its memory is executed and acknowledged (the receive
// goroutine takes the receive path back), several times over.
func TestInlineWaitThenNoWait(t *testing.T) {
	qa, qb, ca, cb, _, _ := blockingPair(t, 8, nil)
	mra, err := qa.pd.RegMR(make([]byte, 64), AccessLocalWrite|AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	mrb, err := qb.pd.RegMR(make([]byte, 64), AccessLocalWrite|AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	write := func(q *QP, c *CQ, from, to *MR, id int) {
		t.Helper()
		w := &SendWR{ID: uint64(id), Opcode: WRRDMAWrite, Flags: SendSignaled, RemoteAddr: to.Addr(), RKey: to.RKey(),
			SGL: []SGE{{Addr: from.Addr(), Length: 64, LKey: from.LKey()}}}
		if err := q.PostSend(w); err != nil {
			t.Fatal(err)
		}
		wcs := make([]cq.WC, 1)
		if _, err := c.Wait(ctx, wcs); err != nil || wcs[0].Status != cq.Success {
			t.Fatalf("WRITE %d: %v %v", id, err, wcs[0].Status)
		}
	}
	for i := 0; i < 20; i++ {
		// A waits inline for its own WRITE's ACK, then waits no more
		// while B's WRITE needs A to answer.
		write(qa, ca, mra, mrb, i)
		write(qb, cb, mrb, mra, i)
	}
}
