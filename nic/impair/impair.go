// Package impair wraps any nic.Link in a bad network: seeded loss,
// duplication, reordering, corruption, delay and jitter on the send side.
//
// Real links lose, duplicate and reorder packets, and RC must recover from
// all of it (IBTA 9.7.5: PSN sequence errors, duplicates, retransmission),
// so the transport is tested through this wrapper. The local kernel has no
// netem qdisc (docs/platform.md), which is why the impairment is done here.
//
// Every decision is drawn from a PCG generator seeded by Config.Seed, so a
// run with the same seed and the same sequence of sends makes the same
// decisions. Delay and the flush of a held (reordered) packet depend on
// time; with Delay and Jitter zero and packets sent back to back, the
// output order is deterministic too.
//
// Corruption flips one byte after the ICRC was computed, so the receiver's
// ICRC check drops the packet, as it would drop a packet damaged on the
// wire. That needs the wrapped link to implement nic.RawSender (every
// backend of this module does); otherwise a corrupted packet is simply not
// sent. Note that a receiver that checks the ICRC only in part (nic/udp
// over IPv4 without privilege: 16 bits) or not at all delivers a
// corrupted packet now and then, exactly as it would from a real wire.
package impair

import (
	"github.com/softroce/softroce/nic/internal/spec"

	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/softroce/softroce/nic"
)

// Config says how bad the network is. Probabilities are fractions in
// [0, 1]; the zero Config passes everything through unchanged.
type Config struct {
	Loss    float64 // probability that a packet is dropped
	Dup     float64 // probability that a packet is sent twice
	Reorder float64 // probability that a packet is held back and sent after its successor
	Corrupt float64 // probability that one byte of a packet is flipped after its ICRC was computed
	// Delay is added to every packet; Jitter adds a uniform random
	// [0, Jitter) on top, which also reorders packets, as on a real path.
	Delay, Jitter time.Duration
	// Hold bounds how long a reordered packet waits for a successor to
	// overtake it (default 1ms).
	Hold time.Duration
	// Seed seeds the decisions; 0 picks a seed from the clock (Seed() on
	// the wrapped link reports it so a failing run can be repeated).
	Seed uint64
	// Queue is how many delayed packets may be in flight at once (default
	// 1024); beyond it packets are dropped and counted as Overflow.
	Queue int
}

// DefaultHold is the default Config.Hold.
const DefaultHold = time.Millisecond

// Parse reads a Config from a comma-separated list such as
// "loss=10%,dup=5%,reorder=10%,corrupt=1%,delay=1ms,jitter=200us,seed=7".
// Probabilities are percentages ("10%") or fractions ("0.1"); durations use
// Go syntax. Keys: loss, dup, reorder, corrupt, delay, jitter, hold, seed,
// queue. The empty string is the zero Config.
func Parse(s string) (Config, error) {
	var c Config
	err := spec.Each(s, "impair", "loss, dup, reorder, corrupt, delay, jitter, hold, seed or queue", func(k, v string) error {
		var err error
		switch k {
		case "loss":
			c.Loss, err = spec.Prob(v)
		case "dup", "duplicate":
			c.Dup, err = spec.Prob(v)
		case "reorder":
			c.Reorder, err = spec.Prob(v)
		case "corrupt":
			c.Corrupt, err = spec.Prob(v)
		case "delay":
			c.Delay, err = parseDur(v)
		case "jitter":
			c.Jitter, err = parseDur(v)
		case "hold":
			c.Hold, err = parseDur(v)
		case "seed":
			c.Seed, err = strconv.ParseUint(v, 0, 64)
		case "queue":
			var n int
			n, err = strconv.Atoi(v)
			if err == nil && n < 1 {
				err = errors.New("must be at least 1")
			}
			c.Queue = n
		default:
			return spec.ErrUnknownKey
		}
		return err
	})
	if err != nil {
		return Config{}, err
	}
	return c, nil
}

func parseDur(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, err
	}
	if d < 0 {
		return 0, errors.New("negative duration")
	}
	return d, nil
}

// String formats c in the syntax Parse reads, omitting zero fields.
func (c Config) String() string {
	var b strings.Builder
	add := func(k, v string) {
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k + "=" + v)
	}
	prob := func(k string, f float64) {
		if f == 0 {
			return
		}
		// A percentage reads best, but f*100/100 is not always f: then
		// write the fraction, which Parse reads back exactly.
		pct := strconv.FormatFloat(f*100, 'g', -1, 64)
		if back, err := strconv.ParseFloat(pct, 64); err == nil && back/100 == f {
			add(k, pct+"%")
		} else {
			add(k, strconv.FormatFloat(f, 'g', -1, 64))
		}
	}
	prob("loss", c.Loss)
	prob("dup", c.Dup)
	prob("reorder", c.Reorder)
	prob("corrupt", c.Corrupt)
	for _, d := range []struct {
		k string
		v time.Duration
	}{{"delay", c.Delay}, {"jitter", c.Jitter}, {"hold", c.Hold}} {
		if d.v != 0 {
			add(d.k, d.v.String())
		}
	}
	if c.Seed != 0 {
		add("seed", strconv.FormatUint(c.Seed, 10))
	}
	if c.Queue != 0 {
		add("queue", strconv.Itoa(c.Queue))
	}
	return b.String()
}

// Counters say what the wrapper did.
type Counters struct {
	Packets    uint64 // packets offered to Send
	Dropped    uint64 // lost on purpose
	Duplicated uint64 // sent a second time
	Reordered  uint64 // held back behind a successor
	Corrupted  uint64 // sent with a flipped byte (or, without nic.RawSender, not sent)
	Delayed    uint64 // went through the delay queue
	Overflow   uint64 // dropped because the delay queue was full
}

// Link is a nic.Link with impairment on its send side. Receive, MTU,
// addresses and Stats are the wrapped link's.
type Link struct {
	inner nic.Link
	raw   nic.RawSender // nil when inner cannot send pre-computed ICRCs
	cfg   Config
	seed  uint64

	mu     sync.Mutex // guards everything below and serialises sends
	rng    *rand.Rand
	out    []nic.Packet // scratch batch handed to the inner link
	rawOut []bool       // parallel to out: this one goes through SendRaw
	held   heldPkt
	// scratch holds corrupted copies for the current send.
	scratch  []scratchPkt
	nscratch int
	holdT    *time.Timer
	gen      uint64 // generation of the held packet, for the hold timer
	closed   bool

	delayQ    *delayQueue
	closeOnce sync.Once

	c struct {
		packets, dropped, duplicated, reordered, corrupted, delayed, overflow atomic.Uint64
	}
}

type scratchPkt struct {
	pkt  nic.Packet
	data []byte
}

type heldPkt struct {
	ok   bool
	raw  bool
	pkt  nic.Packet
	data []byte
}

// Wrap returns l behind the impairment cfg. Close closes l.
func Wrap(l nic.Link, cfg Config) *Link {
	if cfg.Hold == 0 {
		cfg.Hold = DefaultHold
	}
	if cfg.Queue == 0 {
		cfg.Queue = 1024
	}
	seed := cfg.Seed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano()) | 1
	}
	w := &Link{inner: l, cfg: cfg, seed: seed, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
	w.raw, _ = l.(nic.RawSender)
	w.held.data = make([]byte, l.MTU())
	if cfg.Delay > 0 || cfg.Jitter > 0 {
		w.delayQ = newDelayQueue(w, cfg.Queue, l.MTU())
	}
	return w
}

var _ nic.RawSender = (*Link)(nil)

// Seed returns the seed in use (the configured one, or the one picked).
func (w *Link) Seed() uint64 { return w.seed }

// Config returns the configuration, with defaults filled in and the seed in use.
func (w *Link) Config() Config { c := w.cfg; c.Seed = w.seed; return c }

// Counters returns what the wrapper has done so far.
func (w *Link) Counters() Counters {
	return Counters{
		Packets: w.c.packets.Load(), Dropped: w.c.dropped.Load(), Duplicated: w.c.duplicated.Load(),
		Reordered: w.c.reordered.Load(), Corrupted: w.c.corrupted.Load(), Delayed: w.c.delayed.Load(),
		Overflow: w.c.overflow.Load(),
	}
}

// Recv implements nic.Link (no impairment on receive).
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

// Close stops the delay queue (pending packets are discarded) and closes
// the wrapped link.
func (w *Link) Close() error {
	err := net.ErrClosed
	w.closeOnce.Do(func() { err = w.close() })
	return err
}

func (w *Link) close() error {
	w.mu.Lock()
	w.closed = true
	if w.holdT != nil {
		w.holdT.Stop()
	}
	w.mu.Unlock()
	if w.delayQ != nil {
		w.delayQ.close()
	}
	return w.inner.Close()
}

// PutICRC implements nic.RawSender.
func (w *Link) PutICRC(p *nic.Packet) error {
	if w.raw == nil {
		return fmt.Errorf("impair: wrapped %T cannot send pre-computed ICRCs", w.inner)
	}
	return w.raw.PutICRC(p)
}

// Send implements nic.Link: each packet may be dropped, corrupted,
// duplicated, held back behind its successor and delayed. It returns
// len(pkts) unless the wrapped link fails.
func (w *Link) Send(pkts []nic.Packet) (int, error) { return w.send(pkts, false) }

// SendRaw implements nic.RawSender: impairment as in Send, ICRCs left as
// the caller wrote them.
func (w *Link) SendRaw(pkts []nic.Packet) (int, error) {
	if w.raw == nil {
		return 0, fmt.Errorf("impair: wrapped %T cannot send pre-computed ICRCs", w.inner)
	}
	return w.send(pkts, true)
}

func (w *Link) chance(p float64) bool { return p > 0 && w.rng.Float64() < p }

func (w *Link) send(pkts []nic.Packet, raw bool) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return 0, net.ErrClosed
	}
	w.out, w.rawOut = w.out[:0], w.rawOut[:0]
	w.nscratch = 0
	for i := range pkts {
		p := &pkts[i]
		w.c.packets.Add(1)
		// Draw every decision for every packet, whatever the outcome, so
		// that one knob does not shift the random stream of the others.
		loss, corrupt, dup, reorder := w.chance(w.cfg.Loss), w.chance(w.cfg.Corrupt), w.chance(w.cfg.Dup), w.chance(w.cfg.Reorder)
		pos, flip := w.rng.IntN(max(p.N, 1)), byte(1+w.rng.IntN(255))
		if loss {
			w.c.dropped.Add(1)
			continue
		}
		pktRaw := raw
		if corrupt {
			w.c.corrupted.Add(1)
			if w.raw == nil || p.N < 16 {
				continue
			}
			if !raw {
				if err := w.raw.PutICRC(p); err != nil {
					continue // the inner link would reject it too
				}
			}
			// Byte 4 of the BTH (resv8a) is masked out of the ICRC
			// (IBTA A17.3.3): a flip there would go unnoticed.
			if pos == 4 {
				pos = 5
			}
			// Damage a copy: the caller may keep its packet to
			// retransmit, and the retransmission must arrive intact.
			p = w.scratchCopy(p)
			p.Buf[pos] ^= flip
			pktRaw = true
		}
		if reorder && !w.held.ok && p.N <= len(w.held.data) {
			w.c.reordered.Add(1)
			w.hold(p, pktRaw)
			continue
		}
		w.emit(p, pktRaw)
		if dup {
			w.c.duplicated.Add(1)
			w.emit(p, pktRaw)
		}
		if w.held.ok {
			// The successor has gone out: now the held packet follows it.
			// It leaves through a scratch copy because a later packet of
			// this batch may be held in its place before the flush.
			w.emit(w.scratchCopy(&w.held.pkt), w.held.raw)
			w.held.ok = false
		}
	}
	err := w.flush()
	if err != nil {
		return 0, err
	}
	return len(pkts), nil
}

// scratchCopy returns a copy of p in a buffer owned by w, valid until the
// next send. The buffers are kept and reused, so steady state allocates
// nothing.
func (w *Link) scratchCopy(p *nic.Packet) *nic.Packet {
	if w.nscratch == len(w.scratch) {
		w.scratch = append(w.scratch, scratchPkt{data: make([]byte, max(w.inner.MTU(), p.N))})
	}
	s := &w.scratch[w.nscratch]
	w.nscratch++
	if len(s.data) < p.N {
		s.data = make([]byte, p.N)
	}
	s.pkt = *p
	s.pkt.Buf, s.pkt.N = s.data, copy(s.data, p.Buf[:p.N])
	return &s.pkt
}

// hold copies p aside until a successor overtakes it or Hold expires.
func (w *Link) hold(p *nic.Packet, raw bool) {
	n := copy(w.held.data, p.Buf[:p.N])
	w.held.pkt = *p
	w.held.pkt.Buf, w.held.pkt.N = w.held.data, n
	w.held.raw, w.held.ok = raw, true
	w.gen++
	gen := w.gen
	if w.holdT != nil {
		w.holdT.Stop()
	}
	// A new closure per hold is one small allocation per reordered packet
	// only; ordinary packets allocate nothing.
	w.holdT = time.AfterFunc(w.cfg.Hold, func() { w.release(gen) })
}

// release sends the held packet when no successor came within Hold.
func (w *Link) release(gen uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed || !w.held.ok || w.gen != gen {
		return
	}
	w.out, w.rawOut = w.out[:0], w.rawOut[:0]
	w.nscratch = 0
	w.emit(&w.held.pkt, w.held.raw)
	w.held.ok = false
	w.flush()
}

// emit queues p for the wrapped link (or the delay queue).
func (w *Link) emit(p *nic.Packet, raw bool) {
	if w.delayQ != nil {
		d := w.cfg.Delay
		if w.cfg.Jitter > 0 {
			d += time.Duration(w.rng.Int64N(int64(w.cfg.Jitter)))
		}
		if w.delayQ.push(p, raw, d) {
			w.c.delayed.Add(1)
		} else {
			w.c.overflow.Add(1)
		}
		return
	}
	w.out = append(w.out, *p)
	w.rawOut = append(w.rawOut, raw)
}

// flush hands w.out to the wrapped link, in order, splitting it into runs
// of Send and SendRaw.
func (w *Link) flush() error {
	for i := 0; i < len(w.out); {
		j := i + 1
		for j < len(w.out) && w.rawOut[j] == w.rawOut[i] {
			j++
		}
		var err error
		if w.rawOut[i] {
			_, err = w.raw.SendRaw(w.out[i:j])
		} else {
			_, err = w.inner.Send(w.out[i:j])
		}
		if err != nil {
			return err
		}
		i = j
	}
	return nil
}

// delayQueue holds copies of delayed packets in a heap ordered by due
// time; one goroutine sends them when due. Buffers come from a fixed pool.
type delayQueue struct {
	w    *Link
	mu   sync.Mutex
	h    itemHeap
	free [][]byte
	wake chan struct{}
	done chan struct{}
	seq  uint64
	wg   sync.WaitGroup
}

type item struct {
	due  time.Time
	seq  uint64 // FIFO among equal due times
	raw  bool
	pkt  nic.Packet
	data []byte
}

// itemHeap is a binary min-heap of items by (due, seq). It is written out
// rather than using container/heap, whose interface{} boxing would
// allocate for every delayed packet.
type itemHeap []item

func (h itemHeap) less(i, j int) bool {
	if h[i].due.Equal(h[j].due) {
		return h[i].seq < h[j].seq
	}
	return h[i].due.Before(h[j].due)
}

func (h *itemHeap) push(it item) {
	*h = append(*h, it)
	a := *h
	for i := len(a) - 1; i > 0; {
		p := (i - 1) / 2
		if !a.less(i, p) {
			break
		}
		a[i], a[p] = a[p], a[i]
		i = p
	}
}

func (h *itemHeap) pop() item {
	a := *h
	top := a[0]
	last := len(a) - 1
	a[0] = a[last]
	a = a[:last]
	for i := 0; ; {
		l, r, m := 2*i+1, 2*i+2, i
		if l < len(a) && a.less(l, m) {
			m = l
		}
		if r < len(a) && a.less(r, m) {
			m = r
		}
		if m == i {
			break
		}
		a[i], a[m] = a[m], a[i]
		i = m
	}
	*h = a
	return top
}

func newDelayQueue(w *Link, n, size int) *delayQueue {
	q := &delayQueue{w: w, h: make(itemHeap, 0, n), free: make([][]byte, n),
		wake: make(chan struct{}, 1), done: make(chan struct{})}
	mem := make([]byte, n*size)
	for i := range q.free {
		q.free[i] = mem[i*size : (i+1)*size : (i+1)*size]
	}
	q.wg.Add(1)
	go q.run()
	return q
}

func (q *delayQueue) push(p *nic.Packet, raw bool, d time.Duration) bool {
	q.mu.Lock()
	if len(q.free) == 0 || p.N > len(q.free[0]) {
		q.mu.Unlock()
		return false
	}
	buf := q.free[len(q.free)-1]
	q.free = q.free[:len(q.free)-1]
	it := item{due: time.Now().Add(d), seq: q.seq, raw: raw, pkt: *p, data: buf}
	q.seq++
	it.pkt.Buf, it.pkt.N = buf, copy(buf, p.Buf[:p.N])
	q.h.push(it)
	first := q.h[0].seq == it.seq
	q.mu.Unlock()
	if first {
		select {
		case q.wake <- struct{}{}:
		default:
		}
	}
	return true
}

func (q *delayQueue) close() {
	close(q.done)
	q.wg.Wait()
}

// run sends due packets in batches. Sends go straight to the wrapped link
// (not through Link.send), so delayed packets are not impaired twice.
func (q *delayQueue) run() {
	defer q.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var batch []nic.Packet
	var bufs [][]byte
	for {
		q.mu.Lock()
		now := time.Now()
		batch, bufs = batch[:0], bufs[:0]
		raw := false
		for len(q.h) > 0 && !q.h[0].due.After(now) && (len(batch) == 0 || q.h[0].raw == raw) {
			it := q.h.pop()
			raw = it.raw
			batch = append(batch, it.pkt)
			bufs = append(bufs, it.data)
		}
		var wait time.Duration = time.Hour
		if len(q.h) > 0 {
			wait = time.Until(q.h[0].due)
		}
		q.mu.Unlock()
		if len(batch) > 0 {
			if raw {
				q.w.raw.SendRaw(batch)
			} else {
				q.w.inner.Send(batch)
			}
			q.mu.Lock()
			q.free = append(q.free, bufs...)
			q.mu.Unlock()
			continue // more may be due
		}
		timer.Reset(max(wait, 0))
		select {
		case <-q.done:
			return
		case <-q.wake:
			if !timer.Stop() {
				select {
				case <-timer.C:
				default:
				}
			}
		case <-timer.C:
		}
	}
}
