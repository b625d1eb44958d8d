package serve

import (
	"sync/atomic"
	"time"
)

const (
	// lookFor bounds how long the receive goroutine looks at the rings
	// after a batch (afterReceive): a program that answers what the
	// batch brought (a ping-pong's WRITE or SEND) posts within a few
	// microseconds when it runs on another core.
	lookFor = 20 * time.Microsecond
	// lookSkipMax bounds how many batches pass without a look after
	// looks that found nothing: each such look doubles the gap.
	lookSkipMax = 1024
)

// look is afterReceive's state; only the receive goroutine touches it.
type look struct {
	pending func() bool   // packets wait for the receive (verbs.Device.PendingProbe)
	budget  time.Duration // lookFor
	misses  int           // looks in a row that ran out of time
	skip    int           // batches to pass before the next look
	// Looks that found posted work, that packets cut short, that ran
	// out of time (Stats).
	found, cut, expired atomic.Uint64
}

// afterReceive runs on the device's receive goroutine after each batch
// it handled, once the replies left (verbs.Device.SetAfterReceive). The
// batch may have put what a program waits for into its memory or its CQ
// ring, and a program that answers posts at once: looking at the rings
// here, with the QPs' sleeping flags clear, takes that post without its
// doorbell (a system call in the program) and without waking the poller
// (a thread wake-up on the way of every message of a ping-pong). It
// stops when it has posted what it found (sending it on this goroutine),
// when packets wait, or after lookFor; looks that find nothing space out
// the next ones (a stream's receiver answers nothing).
//
// It never waits for d.mu: a control operation holding it may be waiting
// for a packet this goroutine has to receive.
func (d *device) afterReceive() {
	l := &d.look
	if l.skip > 0 {
		l.skip--
		return
	}
	if !d.mu.TryLock() {
		return // the poller is in a pass, or a control operation runs
	}
	if len(d.qps) == 0 {
		d.mu.Unlock()
		return
	}
	d.looking(1)
	found := d.pass()
	d.mu.Unlock()
	cut := false
	start := time.Now()
	for i := 1; !found; i++ {
		if d.mu.TryLock() {
			if d.posted() {
				found = d.pass()
			}
			d.mu.Unlock()
			if found {
				break
			}
		}
		if i%8 == 0 {
			if time.Since(start) > l.budget {
				break
			}
			if l.pending() {
				cut = true
				break
			}
		}
	}
	if d.mu.TryLock() {
		d.looking(-1)
		if d.lookers == 0 {
			d.pass()
		}
		d.mu.Unlock()
	} else {
		// Whoever holds d.mu will not wait for this goroutine; the
		// poller counts the look out at its next pass, which the wake
		// brings about if it sleeps.
		d.lookExits.Add(1)
		ring(d.wakeFD)
	}
	switch {
	case found:
		l.found.Add(1)
		l.misses = 0
	case cut:
		l.cut.Add(1)
	default:
		l.expired.Add(1)
		l.misses = min(l.misses+1, 10)
		l.skip = min(1<<l.misses, lookSkipMax) - 1
	}
}
