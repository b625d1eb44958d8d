package engine

import (
	"context"
	"errors"
	"net"
	"time"

	"github.com/softroce/softroce/nic"
)

// Inline waits: in blocking mode a consumer waiting for a completion
// receives on the link itself, so that a packet wakes exactly the
// goroutine that wants what it brings. Handing the completion from the
// receive goroutine to a sleeping consumer costs a second wake-up per
// hop, and on an idle host (where latency is measured) waking a second
// thread is most of a round trip.
//
// The receive path has one seat (a token in d.seat). The receive
// goroutine holds it while nobody waits. A consumer that finds the CQ
// empty asks it to step aside (want + Interrupt), takes the seat, and
// receives and handles packets for every QP until its own CQ has an
// entry; a completion pushed from elsewhere (the timer goroutine, a
// poster) interrupts its wait through the CQ. Consumers waiting at the
// same time wait for the seat or their CQ, whichever comes first. The
// receive goroutine takes the seat back only once it has been free for
// inlineGap, so a ping-pong's consumer keeps it from one round trip to
// the next.

// inlineStep is how often the receive goroutine looks whether consumers
// still hold the receive path, and inlineGap how long the path must have
// been free before it takes it back: long against the moment between two
// waits of a ping-pong (a post), short against RC timers (an IBTA timeout
// of 8 is about 1 ms). A packet that arrives while no one waits is
// handled at the latest about inlineStep+inlineGap later.
const (
	inlineStep = 200 * time.Microsecond
	inlineGap  = 50 * time.Microsecond
)

// seatLoop is the receive goroutine in blocking mode with inline waits.
func (d *Driver) seatLoop() {
	batch := d.rxBatch
	deliver := func(n int) { d.handle(batch[:n]) }
	t := time.NewTimer(time.Hour)
	t.Stop()
	defer t.Stop()
	for {
		select {
		case <-d.done:
			return
		case <-d.seat:
		}
		d.want.Store(false)
		err := d.recvFn(batch, deliver, d.want.Load)
		d.seat <- struct{}{}
		if err != nil {
			d.inlineOff.Store(true)
			if !errors.Is(err, net.ErrClosed) {
				d.linkFailed(err)
			}
			return
		}
		if !d.stepAside(t) {
			return
		}
	}
}

// stepAside waits until no consumer has held the receive path for
// inlineGap. It returns false once the driver is closed.
func (d *Driver) stepAside(t *time.Timer) bool {
	wait := inlineStep
	for {
		t.Reset(wait)
		select {
		case <-d.done:
			t.Stop()
			return false
		case <-t.C:
		}
		if d.seatConsumer.Load() {
			wait = inlineStep // a consumer is receiving
			continue
		}
		free := d.now().Sub(d.epoch.Add(time.Duration(d.seatFreed.Load())))
		if free >= inlineGap {
			return true
		}
		wait = inlineGap - free
	}
}

// WaitInline is what a consumer blocked on an empty CQ of this device
// runs (cq.CQ.SetWaitHook): it waits for the receive path's seat, its CQ's
// wake-up or the end of ctx, whichever comes first, and with the seat it
// receives and handles packets on its own goroutine, as the receive
// goroutine would, until ready reports true or ctx ends. It returns false
// without waiting when inline waits are off (busy-poll mode, a link
// without RecvEachUntil, NoInlineWait, or a link that failed): the caller
// then waits on wake alone. The caller must hold no lock that a
// completion's delivery takes.
func (d *Driver) WaitInline(ctx context.Context, ready func() bool, wake <-chan struct{}) bool {
	if d.intr == nil || d.inlineOff.Load() {
		return false
	}
	select {
	case <-d.seat:
	default:
		if !d.seatConsumer.Load() {
			// The receive goroutine has it: ask it to step aside.
			d.want.Store(true)
			d.intr.Interrupt()
		}
		select {
		case <-d.seat:
		case <-wake:
			return true
		case <-ctx.Done():
			return true
		case <-d.done:
			return false
		}
	}
	d.seatConsumer.Store(true)
	var stopCtx func() bool
	if ctx.Done() != nil {
		stopCtx = context.AfterFunc(ctx, d.intr.Interrupt)
	}
	d.inlineReady, d.inlineCtx = ready, ctx
	err := d.recvFn(d.rxBatch, d.inlineDeliverFn, d.inlineStopFn)
	d.inlineReady, d.inlineCtx = nil, nil
	if stopCtx != nil {
		stopCtx()
	}
	d.seatFreed.Store(int64(time.Since(d.epoch)))
	d.seatConsumer.Store(false)
	d.seat <- struct{}{}
	if err != nil {
		// The receive goroutine meets the same error (or the close)
		// and reports it.
		d.inlineOff.Store(true)
		return false
	}
	return true
}

// kernelWaiter is a link whose receive loop can also wait in a system
// call rather than the runtime poller where that pays (nic/udp:
// WaitEachUntil), so that a packet wakes the thread that handles it: one
// thread wake-up a hop.
type kernelWaiter interface {
	WaitEachUntil(pkts []nic.Packet, deliver func(n int), stop func() bool) error
}

// inlineDeliver handles a batch received by a consumer in WaitInline.
func (d *Driver) inlineDeliver(n int) {
	d.inHandle.Store(true)
	d.handle(d.rxBatch[:n])
	d.inline.Add(uint64(n))
	d.inHandle.Store(false)
}

// inlineStop is WaitInline's stop: the consumer's CQ has an entry or its
// ctx ended.
func (d *Driver) inlineStop() bool { return d.inlineReady() || d.inlineCtx.Err() != nil }

// Interrupt wakes a consumer blocked receiving in WaitInline: a completion
// for it was pushed from another goroutine. A consumer handling a batch
// looks at its CQ afterwards anyway.
func (d *Driver) Interrupt() {
	if d.intr != nil && d.seatConsumer.Load() && !d.inHandle.Load() {
		d.intr.Interrupt()
	}
}

// SeatTaken reports whether a consumer is receiving in WaitInline now.
func (d *Driver) SeatTaken() bool { return d.seatConsumer.Load() }

// drainIdle handles, on the timer goroutine, the packets waiting in the
// link when no one holds the receive path (inline waits only): an ACK
// that arrived in time must not be taken for a timeout because the
// receive goroutine was stepping aside.
func (d *Driver) drainIdle() {
	if d.intr == nil {
		return
	}
	dr, ok := d.rx.(interface {
		Drain(pkts []nic.Packet) (int, error)
	})
	if !ok {
		return
	}
	select {
	case <-d.seat:
	default:
		return // someone is receiving
	}
	for {
		n, err := dr.Drain(d.rxBatch)
		if n > 0 {
			d.handle(d.rxBatch[:n])
		}
		if n == 0 || err != nil {
			break
		}
	}
	d.seat <- struct{}{}
}
