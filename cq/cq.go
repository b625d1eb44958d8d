package cq

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
)

// MaxDepth is the largest depth New and Resize accept.
const MaxDepth = 1 << 20

// ErrOverrun is returned by Wait (and Err) once a completion did not fit in
// the CQ. The CQ stays in this error state until it is destroyed.
var ErrOverrun = errors.New("cq: completion queue overrun")

// EventType is the kind of an asynchronous CQ event. Values equal enum
// ibv_event_type.
type EventType uint8

// Asynchronous event types.
const (
	// EventCQErr (IBV_EVENT_CQ_ERR): the CQ overran; a completion was
	// rejected and the CQ is in the error state.
	EventCQErr EventType = 0
)

// String returns the text ibv_event_type_str gives.
func (t EventType) String() string {
	if t == EventCQErr {
		return "CQ error"
	}
	return fmt.Sprintf("EventType(%d)", uint8(t))
}

// Event is an asynchronous error event of a CQ.
type Event struct {
	Type EventType
	Err  error
}

// arm states of the notification mechanism (ibv_req_notify_cq).
const (
	armNone = iota
	armAny
	armSolicited
)

// CQ is a completion queue of fixed depth. It is safe for concurrent use by
// any number of producers (Push) and consumers (Poll, Wait).
//
// Entries live in a ring of WC values, so Push and Poll never allocate.
type CQ struct {
	mu      sync.Mutex
	ring    []WC
	head    int // index of the oldest entry
	count   int
	overrun bool
	arm     int

	notify chan struct{}       // completion channel, capacity 1 (coalescing)
	events chan Event          // async events, capacity 1 (only one CQ_ERR can happen)
	wake   chan struct{}       // wakes a Wait, capacity 1; the baton is passed on
	onErr  func(Event)         // SetErrorHook's function, guarded by mu
	onPush func(WC, bool) bool // SetPushHook's function, guarded by mu
	onPoll func() bool         // SetPollHook's function, guarded by mu
	waiter InlineWaiter        // SetWaitHook's, guarded by mu
	// readyFn is ready, bound once: a method value per Wait would
	// allocate.
	readyFn func() bool
	// inlineWaits counts Waits inside waiter.WaitInline: a Push then
	// interrupts the waiter, which may be blocked receiving.
	inlineWaits atomic.Int32
}

// InlineWaiter runs a device's receive path on a consumer blocked in Wait
// (engine.Driver): a packet then wakes the goroutine that wants the
// completion it brings, not a receive goroutine that would hand it over.
type InlineWaiter interface {
	// WaitInline waits until ready reports true, wake has a token or ctx
	// ends, receiving on the caller's goroutine when it can. It returns
	// false at once if it cannot wait that way; Wait then waits on wake.
	WaitInline(ctx context.Context, ready func() bool, wake <-chan struct{}) bool
	// Interrupt wakes a WaitInline that is blocked receiving.
	Interrupt()
}

// New creates a CQ that holds depth completions (ibv_create_cq's cqe).
// depth must be between 1 and MaxDepth.
func New(depth int) (*CQ, error) {
	if depth < 1 || depth > MaxDepth {
		return nil, fmt.Errorf("cq: create: depth %d out of range 1..%d", depth, MaxDepth)
	}
	c := &CQ{
		ring:   make([]WC, depth),
		notify: make(chan struct{}, 1),
		events: make(chan Event, 1),
		wake:   make(chan struct{}, 1),
	}
	c.readyFn = c.ready
	return c, nil
}

// Depth returns the number of completions the CQ can hold.
func (c *CQ) Depth() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.ring)
}

// Len returns the number of completions waiting to be polled.
func (c *CQ) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.count
}

// Err returns ErrOverrun once the CQ has overrun, nil before.
func (c *CQ) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.overrun {
		return ErrOverrun
	}
	return nil
}

// Push adds a completion that is not solicited. See PushSolicited.
func (c *CQ) Push(wc WC) bool { return c.PushSolicited(wc, false) }

// PushSolicited adds a completion. solicited is true for a receive
// completion of a message whose BTH had the Solicited Event bit set; it only
// matters to a CQ armed with ReqNotify(true).
//
// It returns false when the CQ is full or already in the error state: the
// completion is not stored, the CQ enters (or stays in) the error state, and
// on the first overrun one EventCQErr is delivered on Events (IBTA: a CQ
// overrun is a CQ error reported as an affiliated asynchronous event, never
// a silent drop). The
// caller must treat false as a failure to complete, e.g. by moving its QP to
// the error state as rxe does.
//
// An armed CQ fires its notification for the completion (any completion when
// armed with ReqNotify(false); with ReqNotify(true) only a solicited one or
// one whose Status is not Success, as IBTA Request Completion Notification
// defines solicited-only). An overrun also fires
// it, so that a consumer sleeping on Notify wakes up and sees ErrOverrun.
func (c *CQ) PushSolicited(wc WC, solicited bool) bool {
	c.mu.Lock()
	if c.onPush != nil && c.count == 0 && !c.overrun && c.onPush(wc, solicited) {
		c.mu.Unlock()
		return true
	}
	if c.overrun || c.count == len(c.ring) {
		first := !c.overrun
		c.overrun = true
		fire := c.arm != armNone
		c.arm = armNone
		hook := c.onErr
		c.mu.Unlock()
		if first {
			ev := Event{Type: EventCQErr, Err: ErrOverrun}
			select {
			case c.events <- ev:
			default:
			}
			if hook != nil {
				hook(ev)
			}
		}
		if fire {
			c.signal(c.notify)
		}
		c.signal(c.wake)
		if c.inlineWaits.Load() > 0 {
			c.interrupt()
		}
		return false
	}
	i := c.head + c.count
	if i >= len(c.ring) {
		i -= len(c.ring)
	}
	c.ring[i] = wc
	c.count++
	fire := c.arm == armAny || (c.arm == armSolicited && (solicited || wc.Status != Success))
	if fire {
		c.arm = armNone
	}
	c.mu.Unlock()
	if fire {
		c.signal(c.notify)
	}
	c.signal(c.wake)
	if c.inlineWaits.Load() > 0 {
		c.interrupt()
	}
	return true
}

func (c *CQ) interrupt() {
	c.mu.Lock()
	w := c.waiter
	c.mu.Unlock()
	if w != nil {
		w.Interrupt()
	}
}

// SetWaitHook makes Wait, on an empty CQ, wait through w
// (InlineWaiter.WaitInline). A nil w removes it.
func (c *CQ) SetWaitHook(w InlineWaiter) {
	c.mu.Lock()
	c.waiter = w
	c.mu.Unlock()
}

// ready reports whether a Wait would return now.
func (c *CQ) ready() bool {
	c.mu.Lock()
	r := c.count > 0 || c.overrun
	c.mu.Unlock()
	return r
}

// signal does a non-blocking send on a capacity-1 channel; a pending token
// already says the same thing, so a full channel coalesces.
func (c *CQ) signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// Poll moves up to len(wcs) completions, oldest first, into wcs and returns
// how many it moved (ibv_poll_cq). It never blocks.
//
// After an overrun Poll still returns the completions stored before it (each
// of them is a finished work request), and 0 once those are drained; use Err
// or Events to learn about the overrun.
//
// With a poll hook installed (SetPollHook), a Poll that finds the CQ empty
// runs the hook once and, if it reports progress, looks again.
func (c *CQ) Poll(wcs []WC) int {
	c.mu.Lock()
	n := c.pollLocked(wcs)
	hook := c.onPoll
	c.mu.Unlock()
	if n == 0 && hook != nil && len(wcs) > 0 && hook() {
		c.mu.Lock()
		n = c.pollLocked(wcs)
		c.mu.Unlock()
	}
	return n
}

// SetPollHook installs f, which a Poll that finds the CQ empty calls once,
// with no lock of the CQ held, before it returns 0; if f returns true (it
// made progress) Poll looks again. A busy-polling device uses it to run
// its receive path on the polling goroutine, so that a completion reaches
// a spinning consumer without a hand-off from another goroutine. f may
// push into this CQ. Wait does not call it. A nil f removes the hook.
func (c *CQ) SetPollHook(f func() bool) {
	c.mu.Lock()
	c.onPoll = f
	c.mu.Unlock()
}

func (c *CQ) pollLocked(wcs []WC) int {
	n := min(len(wcs), c.count)
	for k := 0; k < n; {
		// Copy the contiguous run up to the ring's end, then wrap.
		run := min(n-k, len(c.ring)-c.head)
		copy(wcs[k:k+run], c.ring[c.head:c.head+run])
		k += run
		c.head += run
		if c.head == len(c.ring) {
			c.head = 0
		}
	}
	c.count -= n
	return n
}

// Wait blocks until at least one completion is available or ctx is done,
// then behaves like Poll. It returns ctx.Err() when ctx ends first.
//
// Once the CQ has overrun, Wait does not block: it returns whatever
// completions are still stored (possibly none) together with ErrOverrun, in
// the manner of io.Reader: process the n completions, then handle the error.
func (c *CQ) Wait(ctx context.Context, wcs []WC) (int, error) {
	if len(wcs) == 0 {
		return 0, errors.New("cq: wait: empty completion slice")
	}
	for {
		c.mu.Lock()
		n := c.pollLocked(wcs)
		over, left := c.overrun, c.count
		w := c.waiter
		c.mu.Unlock()
		if left > 0 || over {
			// Other waiters may be asleep with completions still queued (or
			// the overrun not yet seen): pass the wake-up on.
			c.signal(c.wake)
		}
		if over {
			return n, ErrOverrun
		}
		if n > 0 {
			return n, nil
		}
		if w != nil {
			c.inlineWaits.Add(1)
			ok := w.WaitInline(ctx, c.readyFn, c.wake)
			c.inlineWaits.Add(-1)
			if ok {
				if err := ctx.Err(); err != nil && !c.ready() {
					return 0, err
				}
				continue
			}
		}
		select {
		case <-c.wake:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// ReqNotify arms the CQ (ibv_req_notify_cq): the next completion pushed
// after this call fires one notification on Notify and disarms the CQ. With
// solicitedOnly, only a solicited completion or an error completion fires it.
// Completions already in the CQ do not fire, so the usual event loop is:
// receive from Notify, ReqNotify, then Poll until empty.
// Arming an armed CQ never narrows it: ReqNotify(false) widens a
// solicited-only arm to any completion, ReqNotify(true) leaves an arm for
// any completion as it is.
func (c *CQ) ReqNotify(solicitedOnly bool) {
	c.mu.Lock()
	if solicitedOnly {
		if c.arm == armNone {
			c.arm = armSolicited
		}
	} else {
		c.arm = armAny
	}
	c.mu.Unlock()
}

// Notify returns the completion channel (what ibv_get_cq_event reads). It
// has capacity 1: notifications not yet received coalesce into one.
func (c *CQ) Notify() <-chan struct{} { return c.notify }

// Events returns the channel of asynchronous events (EventCQErr). At most
// one event is ever delivered per CQ; it stays buffered until received.
func (c *CQ) Events() <-chan Event { return c.events }

// SetErrorHook installs f, called once with the EventCQErr of the first
// overrun, besides its delivery on Events. It lets the owner of many CQs
// (a device) forward their errors to one place without a goroutine per CQ,
// as ibv_get_async_event reports a CQ error with the CQ named. f runs on the
// goroutine that pushed the rejected completion, possibly while that caller
// holds its own locks: it must not block and must not call back into that
// caller. A nil f removes the hook. A hook installed after the overrun is
// not called for it.
func (c *CQ) SetErrorHook(f func(Event)) {
	c.mu.Lock()
	c.onErr = f
	c.mu.Unlock()
}

// SetPushHook installs f, which is offered every completion pushed from
// then on, before the CQ stores it. When f returns true it has taken the
// completion (delivered it elsewhere): the CQ does not store it, does not
// fire its notification nor wake a Wait, and Push returns true. When f
// returns false the completion is stored as without a hook. f is offered
// a completion only while the CQ holds none, so completions f takes and
// completions it leaves never overtake one another: once f has declined
// one, everything after it is stored until a consumer has polled the CQ
// empty. It lets a consumer that forwards completions (the daemon, into
// its clients' rings) skip a wake-up per completion.
//
// f runs under the CQ's lock on the goroutine that pushes, which may hold
// its own locks (the transport's engine lock): it must not block and must
// not call into this CQ or into the pusher. A nil f removes the hook.
func (c *CQ) SetPushHook(f func(wc WC, solicited bool) bool) {
	c.mu.Lock()
	c.onPush = f
	c.mu.Unlock()
}

// Resize changes the depth (ibv_resize_cq), keeping the stored completions
// in order. It fails if depth is out of range or smaller than the number of
// completions stored. A CQ in the error state stays in it.
func (c *CQ) Resize(depth int) error {
	if depth < 1 || depth > MaxDepth {
		return fmt.Errorf("cq: resize: depth %d out of range 1..%d", depth, MaxDepth)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if depth < c.count {
		return fmt.Errorf("cq: resize: depth %d is smaller than the %d completions stored", depth, c.count)
	}
	ring := make([]WC, depth)
	n := c.count
	c.pollLocked(ring[:n])
	c.ring, c.head, c.count = ring, 0, n
	return nil
}
