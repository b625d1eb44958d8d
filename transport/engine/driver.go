package engine

import (
	"context"
	"errors"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/qpstate"
)

// Driver runs an Engine on a nic.Link in real time with two goroutines
// per device (not per QP): one receives batches, one runs timers and
// posted work. Both send what the engine produces.
type Driver struct {
	e    *Engine
	link nic.Link
	rx   nic.Link // what receives: link, or what it wraps (nic.ReceiveSide)
	cfg  DriverConfig
	wake chan struct{}
	done chan struct{}
	wg   sync.WaitGroup
	smu  sync.Mutex // serialises Send on the link
	once sync.Once

	// batches (under e.mu) counts the goroutines in a batch: the receive
	// goroutine handling received packets, and callers of Batch, as
	// e.doorbells counts posters about to send their own WR. Each flushes
	// afterwards, so a wake-up of the timer goroutine then would only find
	// the work already done: it is noted in missed and sent by the last of
	// them to end, only if still needed.
	batches int
	missed  bool
	// held (under e.mu) counts callers inside Batch: their posts wait for
	// Batch's one flush instead of each ringing the doorbell.
	held int

	// epoch is when the driver started; now derives the time from it.
	epoch time.Time

	// Busy-poll mode only. own is held by whichever goroutine is inside
	// the link's receive and the handling of what it returned (the
	// receive goroutine, or a consumer in PollInline), so packets are
	// handled one batch at a time, in the order the link returned them.
	// rxBatch is the buffers they share under own. pollSeq counts
	// PollInline calls: the receive goroutine backs off while it moves.
	poll    tryRecver
	own     sync.Mutex
	rxBatch []nic.Packet
	pollSeq atomic.Uint64
	inline  atomic.Uint64 // packets PollInline handled

	// Blocking mode with a link that can interrupt its receive (inline
	// waits, see WaitInline). seat holds the receive path's one token:
	// whoever took it (the receive goroutine, or a consumer waiting in
	// WaitInline) receives on the link, into rxBatch, and gives it back.
	intr         interruptRecver
	seat         chan struct{}
	seatConsumer atomic.Bool  // a consumer holds the seat
	inHandle     atomic.Bool  // that consumer is handling a batch, not waiting
	want         atomic.Bool  // a consumer asked the receive goroutine to step aside
	seatFreed    atomic.Int64 // when a consumer last gave the seat back, since epoch
	inlineOff    atomic.Bool  // the link failed or closed under a consumer: no more inline waits
	// The seat holder's receive loop and a consumer's callbacks, bound
	// once (a closure per wait would allocate); the consumer's ready and
	// ctx are set while it holds the seat.
	recvFn          func(pkts []nic.Packet, deliver func(n int), stop func() bool) error
	inlineDeliverFn func(n int)
	inlineStopFn    func() bool
	inlineReady     func() bool
	inlineCtx       context.Context

	fatal     atomic.Pointer[error] // the Recv error that stopped the receive loop
	txDropped atomic.Uint64
	lastTxErr atomic.Pointer[error]
}

// DriverConfig tunes NewDriverWith. The zero value is what NewDriver uses.
type DriverConfig struct {
	// OnLinkError, if set, is called once from the receive goroutine when
	// the link's Recv failed with an error other than net.ErrClosed, after
	// Err reports it and every QP has been moved to ERR. It may block
	// briefly but must not call Close.
	OnLinkError func(err error)
	// BusyPoll, if positive, makes the receive goroutine poll the link
	// for up to this long after the last packet before it sleeps in Recv
	// (a wake-up saved per packet, for latency runs, at the cost of a
	// core). It needs a link with TryRecv (nic/udp); others ignore it.
	BusyPoll time.Duration

	// NoInlineWait keeps consumers blocked in WaitInline off the receive
	// path: the receive goroutine alone receives, and hands completions
	// over. For comparisons; inline waits are on by default in blocking
	// mode on a link that supports them.
	NoInlineWait bool

	// TimerGrace, if set, replaces timerGrace: how long the timer
	// goroutine lets the receive side take what arrived before it acts on
	// a due deadline.
	TimerGrace time.Duration
}

// interruptRecver is a link whose receive loop a consumer can run and
// another goroutine can wake (nic/udp).
type interruptRecver interface {
	RecvEachUntil(pkts []nic.Packet, deliver func(n int), stop func() bool) error
	Interrupt()
}

// tryRecver is a link that can receive without waiting.
type tryRecver interface {
	TryRecv(pkts []nic.Packet) (int, error)
}

// DriverStats count what the driver could not hand to the link.
type DriverStats struct {
	// TxDropped is the number of packets the link refused (Send returned
	// an error for them). To RC each is a lost packet that retransmission
	// recovers, or that ends in a retry-exceeded completion.
	TxDropped uint64
	// LastTxErr is the error of the latest refused packet, nil if none.
	LastTxErr error
	// Inline is the number of received packets handled on consumers'
	// goroutines (PollInline) rather than the receive goroutine's.
	Inline uint64
}

// NewDriver starts running e on link.
func NewDriver(e *Engine, link nic.Link) *Driver { return NewDriverWith(e, link, DriverConfig{}) }

// NewDriverWith starts running e on link with cfg.
func NewDriverWith(e *Engine, link nic.Link, cfg DriverConfig) *Driver {
	d := newDriver(e, link, cfg)
	d.wg.Add(2)
	go d.recvLoop()
	go d.timerLoop()
	return d
}

// newDriver wires d to e without starting its goroutines (tests drive
// recvLoop and flush themselves).
func newDriver(e *Engine, link nic.Link, cfg DriverConfig) *Driver {
	d := &Driver{e: e, link: link, rx: nic.ReceiveSide(link), cfg: cfg, wake: make(chan struct{}, 1), done: make(chan struct{}), epoch: time.Now()}
	if p, ok := d.rx.(tryRecver); ok && cfg.BusyPoll > 0 {
		d.poll = p
	}
	if ir, ok := d.rx.(interruptRecver); ok && d.poll == nil && !cfg.NoInlineWait {
		d.intr = ir
		d.seat = make(chan struct{}, 1)
		d.seat <- struct{}{}
		d.recvFn = ir.RecvEachUntil
		if kw, ok := ir.(kernelWaiter); ok {
			d.recvFn = kw.WaitEachUntil
		}
		d.inlineDeliverFn, d.inlineStopFn = d.inlineDeliver, d.inlineStop
	}
	d.rxBatch = make([]nic.Packet, link.BatchSize())
	for i := range d.rxBatch {
		d.rxBatch[i].Buf = make([]byte, MaxPacket+64)
	}
	e.mu.Lock()
	e.Wake = d.wakeLocked
	e.Doorbell = d.doorbell
	e.DoorbellOK = d.doorbellOKLocked
	e.mu.Unlock()
	return d
}

// wakeLocked is the engine's Wake (called under e.mu).
func (d *Driver) wakeLocked() {
	if d.batches > 0 || d.e.doorbells > 0 {
		d.missed = true
		return
	}
	d.kick()
}

// handle runs a received batch and sends what follows from it, then wakes
// the timer goroutine only if posted work is left over or a timer now
// expires before the time it sleeps until.
func (d *Driver) handle(pkts []nic.Packet) {
	d.beginBatch()
	d.e.Receive(d.now(), pkts)
	d.flush()
	d.endBatch()
}

func (d *Driver) beginBatch() {
	d.e.mu.Lock()
	d.batches++
	d.e.mu.Unlock()
}

func (d *Driver) endBatch() {
	e := d.e
	e.mu.Lock()
	d.batches--
	need := d.settleLocked()
	e.mu.Unlock()
	if need {
		d.kick()
	}
}

// Batch runs f, which posts work, then sends what the engine built for
// it on the caller's goroutine, as the receive goroutine does after a
// batch of packets. A caller that posts for many QPs (a daemon moving
// work requests from its clients' rings) saves, per post, the wake-up of
// the timer goroutine and the hand-off to it; that goroutine is woken
// afterwards only if work is left or a timer now expires before it
// planned to wake. Posts during f do not ring the doorbell: they leave
// together in the one flush. f must not call Batch.
func (d *Driver) Batch(f func()) {
	d.e.mu.Lock()
	d.batches++
	d.held++
	d.e.mu.Unlock()
	f()
	d.e.mu.Lock()
	d.held--
	d.e.mu.Unlock()
	d.flush()
	d.endBatch()
}

// doorbellOKLocked is the engine's DoorbellOK: posts outside Batch ring.
func (d *Driver) doorbellOKLocked() bool { return d.held == 0 }

// doorbell is the engine's Doorbell: the poster of a WR to an idle send
// queue sends it now, on its own goroutine, instead of waking the timer
// goroutine to do it.
func (d *Driver) doorbell() {
	d.flush()
	e := d.e
	e.mu.Lock()
	e.doorbells--
	need := d.settleLocked()
	e.mu.Unlock()
	if need {
		d.kick()
	}
}

// settleLocked reports, once no batch or doorbell is running any more,
// whether a wake-up held back meanwhile must still reach the timer
// goroutine: work is left over, or a timer now expires before the time it
// sleeps until.
func (d *Driver) settleLocked() bool {
	if d.batches > 0 || d.e.doorbells > 0 {
		return false
	}
	need := d.missed && (len(d.e.pending) > 0 || d.timerEarlierLocked())
	d.missed = false
	return need
}

// timerEarlierLocked reports whether a timer is due before the time the
// timer goroutine last chose to sleep until (as updateTimerSet decides).
func (d *Driver) timerEarlierLocked() bool {
	e := d.e
	for qp := range e.timed {
		for _, t := range qp.deadlines() {
			if !t.IsZero() && (e.sleepUntil.IsZero() || t.Before(e.sleepUntil)) {
				return true
			}
		}
	}
	return false
}

func (d *Driver) kick() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// Kick asks the driver to run Progress soon (after posting work).
func (d *Driver) Kick() { d.kick() }

// eachRecver is a link that runs the receive loop itself and waits in
// the poller without a final empty read (nic/udp).
type eachRecver interface {
	RecvEach(pkts []nic.Packet, deliver func(n int)) error
}

func (d *Driver) recvLoop() {
	defer d.wg.Done()
	batch := d.rxBatch
	if d.poll != nil {
		d.busyLoop()
		return
	}
	if d.intr != nil {
		d.seatLoop()
		return
	}
	if each, ok := d.rx.(eachRecver); ok {
		err := each.RecvEach(batch, func(n int) { d.handle(batch[:n]) })
		if err != nil && !errors.Is(err, net.ErrClosed) {
			d.linkFailed(err)
		}
		return
	}
	for {
		n, err := d.rx.Recv(batch)
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				d.linkFailed(err)
			}
			return
		}
		d.handle(batch[:n])
	}
}

// busyLoop is the receive loop of busy-poll mode: it polls the link for up
// to BusyPoll, then sleeps in Recv. While consumers drive the receive path
// themselves (PollInline) it stays out of their way: it sleeps, and takes
// over again once no consumer has polled for a whole BusyPoll.
func (d *Driver) busyLoop() {
	t := time.NewTimer(time.Hour)
	t.Stop()
	defer t.Stop()
	seen := d.pollSeq.Load()
	for {
		if s := d.pollSeq.Load(); s != seen {
			seen = d.backOff(t, s)
			select {
			case <-d.done:
				return
			default:
			}
		}
		got, err := d.spin(seen)
		if err == nil && !got && d.pollSeq.Load() == seen {
			// Sleep in Recv, owning the receive path meanwhile: a
			// consumer's PollInline finds it taken and its Poll falls
			// back to what this goroutine delivers.
			d.own.Lock()
			var n int
			n, err = d.rx.Recv(d.rxBatch)
			if err == nil {
				d.handle(d.rxBatch[:n])
			}
			d.own.Unlock()
		}
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				d.linkFailed(err)
			}
			return
		}
	}
}

// backOff sleeps in steps of BusyPoll until a whole step passes without a
// PollInline (or the driver is closed), and returns the poll count then.
// Packets that arrive after the last consumer stopped polling wait at most
// about two steps.
func (d *Driver) backOff(t *time.Timer, seen uint64) uint64 {
	for {
		t.Reset(d.cfg.BusyPoll)
		select {
		case <-d.done:
			t.Stop()
			return seen
		case <-t.C:
		}
		s := d.pollSeq.Load()
		if s == seen {
			return s
		}
		seen = s
	}
}

// spin polls the link for up to BusyPoll, yielding the processor between
// tries so that the other goroutines of the device still run. It reports
// whether it handled packets; it stops early when a consumer polls
// (pollSeq moves away from seen).
func (d *Driver) spin(seen uint64) (bool, error) {
	t0 := time.Now()
	for i := 0; ; i++ {
		if d.pollSeq.Load() != seen {
			return false, nil
		}
		if d.own.TryLock() {
			n, err := d.poll.TryRecv(d.rxBatch)
			if n > 0 {
				d.handle(d.rxBatch[:n])
			}
			d.own.Unlock()
			if n > 0 || err != nil {
				return n > 0, err
			}
		}
		if i&15 == 15 && time.Since(t0) > d.cfg.BusyPoll {
			return false, nil
		}
		runtime.Gosched()
	}
}

// PollInline runs the device's receive path once on the caller's
// goroutine, in busy-poll mode (DriverConfig.BusyPoll with a link that
// has TryRecv): one non-blocking batch from the link, handled as the
// receive goroutine handles one, replies and ACKs sent before it returns.
// A consumer spinning on an empty CQ calls it (cq.CQ.SetPollHook), so a
// round trip needs no hand-off between goroutines; meanwhile the receive
// goroutine sleeps. If another goroutine is inside the receive path,
// PollInline does nothing. It reports whether it handled packets, and is
// a no-op returning false outside busy-poll mode. The caller must hold no
// lock that completion delivery takes.
func (d *Driver) PollInline() bool {
	if d.poll == nil {
		return false
	}
	d.pollSeq.Add(1)
	if !d.own.TryLock() {
		return false
	}
	// A link error is left to the receive goroutine, which meets it too.
	n, _ := d.poll.TryRecv(d.rxBatch)
	if n > 0 {
		d.handle(d.rxBatch[:n])
		d.inline.Add(uint64(n))
	}
	d.own.Unlock()
	return n > 0
}

// linkFailed handles a link that can no longer receive: nothing will ever
// acknowledge or answer the QPs again, so rather than letting each run out
// its retries (or wait forever for a request) every QP moves to ERR now and
// its work requests complete with WR_FLUSH_ERR, as a device-fatal error does
// on an RDMA NIC.
func (d *Driver) linkFailed(err error) {
	d.fatal.Store(&err)
	d.ErrorAllQPs()
	if d.cfg.OnLinkError != nil {
		d.cfg.OnLinkError(err)
	}
}

// ErrorAllQPs moves every QP of the engine to ERR, as a modify-QP to ERR
// would (IBTA §10.3.1: outstanding work requests complete with
// WR_FLUSH_ERR); QPs already in ERR stay there. No QP-fatal async event is
// raised: the caller reports the reason (device closed, link failed) once.
func (d *Driver) ErrorAllQPs() {
	e := d.e
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, qp := range e.qps {
		if qp.state != qpstate.Err {
			qp.setStateLocked(qpstate.Err)
		}
	}
}

func (d *Driver) timerLoop() {
	defer d.wg.Done()
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		d.flush()
		next := d.e.NextDeadline()
		wait := time.Hour
		if !next.IsZero() {
			wait = max(time.Until(next), 0)
		}
		t.Reset(wait)
		select {
		case <-d.done:
			return
		case <-d.wake:
		case <-t.C:
			if d.e.PaceOnly() {
				// A paced QP may send: no ACK to wait for.
				break
			}
			// A deadline is due. If this process (or its VM's vCPU)
			// was not scheduled for a while, the ACKs that arrived
			// meanwhile wait in the socket, and the runtime runs this
			// goroutine, readied by its timer, before the receive
			// goroutine, readied by the poller in the same pass: the
			// ACK timeout would fire for packets acknowledged in time
			// and resend the window. Parking once, briefly, lets the
			// receive goroutine read them first.
			t.Reset(d.grace())
			select {
			case <-d.done:
				return
			case <-t.C:
			}
			// With inline waits the receive path may have no one on
			// it just now (the receive goroutine stepping aside):
			// read what is waiting before a deadline is acted on.
			d.drainIdle()
		}
	}
}

// timerGrace is how long the timer goroutine lets the receive goroutine
// run before the engine acts on a due deadline: short against any local
// ACK timeout a QP uses in practice (IBTA timeout 8 is about 1 ms, the
// default 14 about 67 ms).
const timerGrace = 200 * time.Microsecond

func (d *Driver) grace() time.Duration {
	if d.cfg.TimerGrace != 0 {
		return d.cfg.TimerGrace
	}
	return timerGrace
}

// now is the current time read from the monotonic clock alone: time.Now
// also reads the wall clock, a second clock read on every batch and flush
// (over 100 ns each on a virtual machine), and the engine only compares
// and adds times. The wall reading drifts from the system clock by what
// it was stepped or slewed since the driver started.
func (d *Driver) now() time.Time { return d.epoch.Add(time.Since(d.epoch)) }

// flush sends everything the engine has to send.
func (d *Driver) flush() {
	d.smu.Lock()
	defer d.smu.Unlock()
	for {
		out, more := d.e.Progress(d.now())
		d.send(out)
		d.e.Release(out)
		if !more {
			return
		}
	}
}

// send hands out to the link. Link.Send reports how many packets went to
// the wire before the one that failed: that one is counted as dropped and
// skipped, and the rest of the batch still goes out, since they may be for
// other, reachable peers. A lost packet is nothing new to RC:
// retransmission recovers it.
func (d *Driver) send(out []nic.Packet) {
	for sent := 0; sent < len(out); {
		n, err := d.link.Send(out[sent:])
		n = min(max(n, 0), len(out)-sent)
		sent += n
		switch {
		case err == nil && n == 0:
			// Nothing taken and no reason given: do not spin on it.
			d.dropped(uint64(len(out)-sent), errors.New("engine: link sent nothing and reported no error"))
			return
		case err == nil:
		case errors.Is(err, net.ErrClosed):
			// Every later packet would fail the same way.
			d.dropped(uint64(len(out)-sent), err)
			return
		case sent < len(out):
			d.dropped(1, err)
			sent++
		}
	}
}

func (d *Driver) dropped(n uint64, err error) {
	if n == 0 {
		return
	}
	d.txDropped.Add(n)
	d.lastTxErr.Store(&err)
}

// Err returns the error that stopped the link's receive side (other than
// Close), nil while it works. Once it is set every QP has been moved to ERR.
func (d *Driver) Err() error {
	if p := d.fatal.Load(); p != nil {
		return *p
	}
	return nil
}

// Stats returns the driver's counters.
func (d *Driver) Stats() DriverStats {
	s := DriverStats{TxDropped: d.txDropped.Load(), Inline: d.inline.Load()}
	if p := d.lastTxErr.Load(); p != nil {
		s.LastTxErr = *p
	}
	return s
}

// Close stops the driver and closes the link.
func (d *Driver) Close() error {
	var err error
	d.once.Do(func() {
		// What the engine has built still leaves first: ACKs for requests
		// the QPs executed before Device.Close moved them to ERR, whose
		// completions the application may already have seen.
		d.flush()
		close(d.done)
		err = d.link.Close()
		d.wg.Wait()
	})
	return err
}
