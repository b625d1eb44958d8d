package congest

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/softroce/softroce/nic"
)

// Link is a nic.Link whose send side goes through the bottleneck: Send
// offers each packet to the Queue and holds those accepted until they
// leave it, then hands them to the wrapped link with their (possibly
// CE-marked) traffic class. Receive, MTU, addresses and Stats are the
// wrapped link's.
//
// With an injected clock (WrapClock) nothing runs by itself: packets that
// have left are sent by the next Send or by Pump, which says when the
// next one leaves. Wrap runs on the wall clock with one goroutine that
// pumps at those times.
type Link struct {
	inner nic.Link
	now   func() time.Time

	mu     sync.Mutex // guards everything below and serialises sends
	q      *Queue
	held   []heldPkt // FIFO: departure times only grow
	head   int
	free   [][]byte     // buffers of sent packets, for reuse
	out    []nic.Packet // scratch batch handed to the inner link
	closed bool

	kick      chan struct{} // wakes the pump goroutine (wall clock only)
	done      chan struct{}
	closeOnce sync.Once
}

type heldPkt struct {
	pkt     nic.Packet
	departs time.Time
}

// Wrap returns l behind the bottleneck cfg on the wall clock. Close closes l.
func Wrap(l nic.Link, cfg Config) (*Link, error) {
	w, err := WrapClock(l, cfg, time.Now)
	if err != nil {
		return nil, err
	}
	w.kick, w.done = make(chan struct{}, 1), make(chan struct{})
	go w.pumpLoop()
	return w, nil
}

// WrapClock returns l behind the bottleneck cfg on the clock now, for
// deterministic tests: the caller calls Pump as its time advances.
func WrapClock(l nic.Link, cfg Config, now func() time.Time) (*Link, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Link{inner: l, now: now, q: NewQueue(cfg)}, nil
}

// Config returns the configuration, defaults filled in and the seed in use.
func (w *Link) Config() Config { w.mu.Lock(); defer w.mu.Unlock(); return w.q.Config() }

// Counters returns what the bottleneck has done so far.
func (w *Link) Counters() Counters { w.mu.Lock(); defer w.mu.Unlock(); return w.q.Counters() }

// QueueLen is the bottleneck's queue in bytes now.
func (w *Link) QueueLen() int { w.mu.Lock(); defer w.mu.Unlock(); return w.q.Len(w.now()) }

// Recv implements nic.Link.
func (w *Link) Recv(pkts []nic.Packet) (int, error) { return w.inner.Recv(pkts) }

// BatchSize implements nic.Link.
func (w *Link) BatchSize() int { return w.inner.BatchSize() }

// MTU implements nic.Link.
func (w *Link) MTU() int { return w.inner.MTU() }

// Addrs implements nic.Link.
func (w *Link) Addrs() []netip.Addr { return w.inner.Addrs() }

// Stats implements nic.Link: the wrapped link's counters.
func (w *Link) Stats() nic.Stats { return w.inner.Stats() }

// Inner returns the wrapped link.
func (w *Link) Inner() nic.Link { return w.inner }

// RecvSide returns the wrapped link, which does all the receiving: the
// bottleneck changes only what is sent, so a driver may use the wrapped
// link's own receive loops.
func (w *Link) RecvSide() nic.Link { return w.inner }

var _ nic.SendWrapper = (*Link)(nil)

// Close drops the packets still queued and closes the wrapped link.
func (w *Link) Close() error {
	err := net.ErrClosed
	w.closeOnce.Do(func() {
		w.mu.Lock()
		w.closed = true
		w.mu.Unlock()
		if w.done != nil {
			close(w.done)
		}
		err = w.inner.Close()
	})
	return err
}

// Send implements nic.Link: every packet is offered to the bottleneck;
// dropped ones are counted there and, as on a real path, not an error.
// It returns len(pkts) unless the wrapped link fails or is closed.
func (w *Link) Send(pkts []nic.Packet) (int, error) {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return 0, net.ErrClosed
	}
	now := w.now()
	for i := range pkts {
		p := &pkts[i]
		v, tc, departs := w.q.Enqueue(now, p.N, p.TClass)
		if v == Dropped {
			continue
		}
		h := heldPkt{pkt: *p, departs: departs}
		h.pkt.TClass = tc
		h.pkt.Buf = w.buffer(p.N)
		h.pkt.N = copy(h.pkt.Buf, p.Buf[:p.N])
		w.held = append(w.held, h)
	}
	_, err := w.pumpLocked(now)
	w.mu.Unlock()
	if w.kick != nil {
		select {
		case w.kick <- struct{}{}:
		default:
		}
	}
	if err != nil {
		return 0, err
	}
	return len(pkts), nil
}

// buffer returns a buffer for an n-byte packet, reusing those of packets
// already sent: steady state allocates nothing.
func (w *Link) buffer(n int) []byte {
	for len(w.free) > 0 {
		b := w.free[len(w.free)-1]
		w.free = w.free[:len(w.free)-1]
		if cap(b) >= n {
			return b[:cap(b)]
		}
	}
	return make([]byte, max(n, w.inner.MTU()))
}

// Pump sends the packets that have left the bottleneck by now and returns
// when the next one leaves (the zero time when none is held).
func (w *Link) Pump() (next time.Time, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return time.Time{}, net.ErrClosed
	}
	return w.pumpLocked(w.now())
}

func (w *Link) pumpLocked(now time.Time) (time.Time, error) {
	var err error
	for w.head < len(w.held) && !w.held[w.head].departs.After(now) {
		w.out = w.out[:0]
		for w.head < len(w.held) && !w.held[w.head].departs.After(now) && len(w.out) < max(w.inner.BatchSize(), 1) {
			w.out = append(w.out, w.held[w.head].pkt)
			w.held[w.head] = heldPkt{}
			w.head++
		}
		if err == nil {
			err = w.sendAll(w.out)
		}
		for i := range w.out {
			w.free = append(w.free, w.out[i].Buf)
			w.out[i] = nic.Packet{}
		}
	}
	if w.head == len(w.held) {
		w.held, w.head = w.held[:0], 0
	} else if w.head > len(w.held)/2 {
		n := copy(w.held, w.held[w.head:])
		clear(w.held[n:])
		w.held, w.head = w.held[:n], 0
	}
	if w.head < len(w.held) {
		return w.held[w.head].departs, err
	}
	return time.Time{}, err
}

// sendAll hands pkts to the wrapped link, skipping packets it fails on
// (a lost packet, to the transport) and stopping when it is closed.
func (w *Link) sendAll(pkts []nic.Packet) error {
	for len(pkts) > 0 {
		n, err := w.inner.Send(pkts)
		if err == nil {
			return nil
		}
		if n >= len(pkts) || isClosed(err) {
			return err
		}
		pkts = pkts[n+1:]
	}
	return nil
}

func isClosed(err error) bool { return err != nil && errors.Is(err, net.ErrClosed) }

// pumpLoop runs Pump at each departure time on the wall clock.
func (w *Link) pumpLoop() {
	t := time.NewTimer(time.Hour)
	t.Stop()
	for {
		next, err := w.Pump()
		if err != nil && isClosed(err) {
			return
		}
		if !next.IsZero() {
			t.Reset(time.Until(next))
		}
		select {
		case <-w.done:
			t.Stop()
			return
		case <-w.kick:
		case <-t.C:
		}
		t.Stop()
	}
}
