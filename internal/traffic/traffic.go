// Package traffic is the one bandwidth engine of softroce: the loop that
// posts work requests, polls their completions and turns the run into
// figures (bytes, messages/s, packets/s, peak and average bandwidth,
// retransmissions). `softroce bw` (package perf) and `softroce perftest`
// (package tools/perftest) each keep their own out-of-band protocol
// and output, and both measure through Send and Receive here, so every
// bandwidth figure the project prints comes from this code.
package traffic

import (
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/verbs"
)

// QP is the part of a queue pair a sender uses (*verbs.QP has it).
type QP interface {
	PostSend(wr *verbs.SendWR) error
	Stats() verbs.QPStats
}

// CQ is the completion queue the engine waits on (*verbs.CQ has it).
type CQ interface {
	Wait(ctx context.Context, wcs []verbs.WC) (int, error)
}

// WRID packs a QP's index and a message's sequence number into a wr_id,
// which is how the engine tells which messages a completion retires.
func WRID(q, n int) uint64 { return uint64(q)<<32 | uint64(uint32(n)) }

// SplitWRID is WRID's inverse.
func SplitWRID(id uint64) (q, n int) { return int(id >> 32), int(uint32(id)) }

// Sender describes one bandwidth run of the posting side.
type Sender struct {
	QPs []QP
	CQ  CQ
	// WRs holds one work request per QP, the template of its messages.
	// The engine sets ID and the signaled flag of every post itself.
	WRs []verbs.SendWR
	// Prepare, if set, adjusts QP q's template for its n-th message
	// (addresses that cycle over slots, say) before it is posted.
	Prepare func(q, n int, wr *verbs.SendWR)
	// Size is the bytes one message carries, for the figures.
	Size int
	// Iters is the number of messages over all QPs, shared out as evenly
	// as possible (QP q gets one more than the rest while q < Iters mod
	// the QPs). Ignored when Duration is set.
	Iters int
	// Duration posts for this long instead of Iters messages, then
	// drains what is in flight.
	Duration time.Duration
	// Stop, if set, ends a timed run early, as if Duration had passed
	// (an endless run stopped by its user).
	Stop <-chan struct{}
	// Count, if set, holds the messages completed so far, updated after
	// every batch of completions, for a caller that samples the run while
	// it goes (perftest's -D windows and --run_infinitely rows).
	Count *atomic.Int64
	// TxDepth is the most messages a QP has outstanding.
	TxDepth int
	// Signal asks for a completion once in this many messages per QP
	// and for each QP's last (perftest's -Q); 0 or 1: every message.
	Signal int
	// Progress, if set, is called every 100 ms or so with the messages
	// completed and the total (0 in a timed run), and once at the end.
	Progress func(done, total int64)
	// Now is the clock (nil: time.Now).
	Now func() time.Time
}

// Receiver describes the receiving side of a SEND bandwidth run: it
// counts receive completions, handing each to OnRecv (which checks it and
// posts the next receive).
type Receiver struct {
	QPs []QP // for the transport counters
	CQ  CQ
	// Size is the bytes one message carries, for the figures.
	Size int
	// Total is the messages expected over all QPs; 0: count until ctx ends.
	Total int
	// Idle, if set, gives up on the missing messages after this long
	// without one (UC and UD never resend a lost message).
	Idle time.Duration
	// Window is the least number of messages a peak is measured over
	// (see Result.Peak).
	Window int
	// OnRecv is called for every successful completion with the QP index
	// and sequence number of its wr_id; an error ends the run.
	OnRecv func(q, n int, wc *verbs.WC) error
	// Count, if set, holds the receives completed so far (see Sender).
	Count *atomic.Int64
	Now   func() time.Time
}

// Result is one run's figures. Rates are per second.
type Result struct {
	// Messages is the messages completed; Bytes what they carried.
	Messages int64
	Bytes    int64
	// Elapsed runs from the first post to the last completion (a sender,
	// as perftest times it) or from the first completion to the last (a
	// receiver, whose clock starts when traffic arrives).
	Elapsed time.Duration
	// Avg is Bytes / Elapsed, perftest's BW average; MsgRate is
	// Messages / Elapsed.
	Avg, MsgRate float64
	// Peak is the best rate over any run of consecutive completions at
	// least a tenth of the messages long, and never shorter than Window
	// messages (two send windows for a sender: one ACK may complete a
	// whole window at once, and a peak over one burst would time the
	// completion loop, not the link). Never below Avg.
	Peak float64
	// Stats is what the QPs' transport counters moved by during the run:
	// the packets they really sent and received (retransmissions
	// included), go-back-N retransmissions, timeouts and NAKs.
	Stats verbs.QPStats
	// TxPktRate and RxPktRate are Stats.TxPackets and RxPackets over
	// Elapsed: counted, not derived from the bytes.
	TxPktRate, RxPktRate float64
	// Lost is the messages a receiver stopped waiting for (Idle).
	Lost int
}

// MiB is the unit of perftest's "MB/sec".
const MiB = 1 << 20

var (
	runs      atomic.Uint64
	observeMu sync.Mutex
	observers map[int]func(Result)
	observeID int
)

// Runs counts the runs the engine has measured in this process.
func Runs() uint64 { return runs.Load() }

// Observe has f called with the Result of every later run, until the
// returned function is called.
func Observe(f func(Result)) (stop func()) {
	observeMu.Lock()
	defer observeMu.Unlock()
	if observers == nil {
		observers = map[int]func(Result){}
	}
	observeID++
	id := observeID
	observers[id] = f
	return func() {
		observeMu.Lock()
		delete(observers, id)
		observeMu.Unlock()
	}
}

func publish(r Result) {
	runs.Add(1)
	observeMu.Lock()
	fs := make([]func(Result), 0, len(observers))
	for _, f := range observers {
		fs = append(fs, f)
	}
	observeMu.Unlock()
	for _, f := range fs {
		f(r)
	}
}

// Sum adds up the QPs' transport counters.
func Sum(qps []QP) verbs.QPStats {
	var s verbs.QPStats
	for _, qp := range qps {
		s = add(s, qp.Stats(), 1)
	}
	return s
}

// add returns a + sign*b, counter by counter (every uint64 field, so
// that a counter the transport adds is never left out).
func add(a, b verbs.QPStats, sign int) verbs.QPStats {
	va, vb := reflect.ValueOf(&a).Elem(), reflect.ValueOf(b)
	for i := range va.NumField() {
		if f := va.Field(i); f.Kind() == reflect.Uint64 {
			if y := vb.Field(i).Uint(); sign < 0 {
				f.SetUint(f.Uint() - y)
			} else {
				f.SetUint(f.Uint() + y)
			}
		}
	}
	return a
}

// Send runs s: it keeps up to TxDepth messages outstanding on every QP
// until Iters messages (or Duration) have completed, and measures them.
// A signaled completion retires every message of its QP up to it (a send
// queue completes in order).
func Send(ctx context.Context, s *Sender) (Result, error) {
	nq := len(s.QPs)
	if nq == 0 || len(s.WRs) != nq || s.TxDepth < 1 {
		return Result{}, fmt.Errorf("traffic: %d QPs, %d work requests, tx depth %d", nq, len(s.WRs), s.TxDepth)
	}
	now := s.Now
	if now == nil {
		now = time.Now
	}
	signal := max(s.Signal, 1)
	timed := s.Duration > 0
	// quota[q] is QP q's share; in a timed run it is set when time is up.
	quota := make([]int, nq)
	for q := range quota {
		if timed {
			quota[q] = math.MaxInt
		} else {
			quota[q] = s.Iters / nq
			if q < s.Iters%nq {
				quota[q]++
			}
		}
	}
	posted, done := make([]int, nq), make([]int, nq)
	var total, completed int64 = int64(s.Iters), 0
	if timed {
		total = 0
	}
	wcs := make([]verbs.WC, 64)
	st0 := Sum(s.QPs)
	start := now()
	m := meter{start: start, window: 2 * s.TxDepth * nq}
	// A mark per batch of completions, at most one per signaled message.
	m.marks = make([]mark, 0, marksFor(timed, s.Iters/signal+nq))
	deadline := start.Add(s.Duration)
	lastReport := start
	stopping := false
	for {
		if timed && !stopping && (!now().Before(deadline) || stopped(s.Stop)) {
			// Time is up: every QP stops at its next signaled message,
			// so that its last post asks for a completion.
			stopping = true
			for q := range quota {
				quota[q] = (posted[q] + signal - 1) / signal * signal
			}
		}
		outstanding := false
		for q := 0; q < nq; q++ {
			wr := &s.WRs[q]
			for posted[q] < quota[q] && posted[q]-done[q] < s.TxDepth {
				n := posted[q]
				if s.Prepare != nil {
					s.Prepare(q, n, wr)
				}
				wr.ID = WRID(q, n)
				wr.Flags &^= verbs.SendSignaled
				if (n+1)%signal == 0 || n == quota[q]-1 {
					wr.Flags |= verbs.SendSignaled
				}
				if err := s.QPs[q].PostSend(wr); err != nil {
					return Result{}, fmt.Errorf("post %v %d on QP %d: %w", wr.Opcode, n, q, err)
				}
				posted[q]++
			}
			outstanding = outstanding || done[q] < posted[q]
		}
		if !outstanding {
			break
		}
		k, err := s.CQ.Wait(ctx, wcs)
		if err != nil {
			return Result{}, fmt.Errorf("waiting for completions after %d of %d: %w (QP stats %+v)",
				completed, sum(posted), err, add(Sum(s.QPs), st0, -1))
		}
		for i := range wcs[:k] {
			wc := &wcs[i]
			q, n := SplitWRID(wc.WRID)
			if q >= nq {
				return Result{}, fmt.Errorf("completion for unknown wr_id %#x", wc.WRID)
			}
			if wc.Status != cq.Success {
				return Result{}, fmt.Errorf("%v %d on QP %d completed with %v (QP stats %+v)",
					s.WRs[q].Opcode, n, q, wc.Status, add(Sum(s.QPs), st0, -1))
			}
			if n+1 > done[q] && n < posted[q] {
				completed += int64(n + 1 - done[q])
				done[q] = n + 1
			}
		}
		t := now()
		m.mark(t, completed)
		if s.Count != nil {
			s.Count.Store(completed)
		}
		if s.Progress != nil && t.Sub(lastReport) > 100*time.Millisecond {
			lastReport = t
			s.Progress(completed, total)
		}
	}
	if s.Progress != nil {
		s.Progress(completed, completed)
	}
	r := m.result(s.Size, add(Sum(s.QPs), st0, -1))
	publish(r)
	return r, nil
}

func sum(v []int) int64 {
	var n int64
	for _, x := range v {
		n += int64(x)
	}
	return n
}

// Receive runs r until Total receives have completed (or ctx ends when
// Total is 0, or Idle passes without a receive) and measures them.
func Receive(ctx context.Context, r *Receiver) (Result, error) {
	now := r.Now
	if now == nil {
		now = time.Now
	}
	wctx := ctx
	var idle *time.Timer
	if r.Idle > 0 {
		var cancel context.CancelFunc
		wctx, cancel = context.WithCancel(ctx)
		defer cancel()
		idle = time.AfterFunc(r.Idle, cancel)
		defer idle.Stop()
	}
	wcs := make([]verbs.WC, 64)
	st0 := Sum(r.QPs)
	m := meter{window: r.Window, marks: make([]mark, 0, marksFor(r.Total == 0, r.Total))}
	var done int64
	res := func() Result {
		res := m.result(r.Size, add(Sum(r.QPs), st0, -1))
		if r.Total > 0 {
			res.Lost = r.Total - int(done)
		}
		publish(res)
		return res
	}
	for r.Total == 0 || done < int64(r.Total) {
		k, err := r.CQ.Wait(wctx, wcs)
		if err != nil && ctx.Err() == nil && idle != nil && wctx.Err() != nil {
			if done == 0 {
				return Result{}, fmt.Errorf("no message arrived in %v (QP stats %+v)", r.Idle, add(Sum(r.QPs), st0, -1))
			}
			return res(), nil // gave up on the rest
		}
		if err != nil && r.Total == 0 && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
			return res(), nil
		}
		if err != nil {
			return Result{}, fmt.Errorf("waiting for receives after %d of %d: %w (QP stats %+v)",
				done, r.Total, err, add(Sum(r.QPs), st0, -1))
		}
		if idle != nil {
			idle.Reset(r.Idle)
		}
		t := now()
		if done == 0 {
			m.start = t // the receiver's clock starts with the traffic
		}
		for i := range wcs[:k] {
			wc := &wcs[i]
			q, n := SplitWRID(wc.WRID)
			if q >= len(r.QPs) {
				return Result{}, fmt.Errorf("completion for unknown wr_id %#x", wc.WRID)
			}
			if wc.Status != cq.Success {
				return Result{}, fmt.Errorf("receive %d on QP %d completed with %v (QP stats %+v)",
					n, q, wc.Status, add(Sum(r.QPs), st0, -1))
			}
			done++
			if r.OnRecv != nil {
				if err := r.OnRecv(q, n, wc); err != nil {
					return Result{}, err
				}
			}
		}
		m.mark(t, done)
		if r.Count != nil {
			r.Count.Store(done)
		}
	}
	return res(), nil
}

// stopped reports whether c is closed (never, for a nil c).
func stopped(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// maxMarks bounds the completion timeline a meter keeps (16 bytes each);
// beyond it every other mark is dropped, which only coarsens where peak
// windows may start and end.
const maxMarks = 1 << 18

// marksFor is the room to make for the marks of a run of at most n
// batches (unbounded: unknown, the slice grows).
func marksFor(unbounded bool, n int) int {
	if unbounded {
		return 1024
	}
	return min(n, maxMarks)
}

// meter is the timeline of a run: after each batch of completions, the
// time and the messages completed so far.
type meter struct {
	start  time.Time
	window int
	marks  []mark
}

type mark struct {
	t time.Duration // since start
	n int64         // messages completed by then
}

func (m *meter) mark(t time.Time, n int64) {
	if len(m.marks) > 0 && m.marks[len(m.marks)-1].n == n {
		return
	}
	if len(m.marks) == maxMarks {
		// Keep the even marks and the newest: half the room again.
		k := 0
		for i := 0; i < len(m.marks); i += 2 {
			m.marks[k] = m.marks[i]
			k++
		}
		m.marks = m.marks[:k]
	}
	m.marks = append(m.marks, mark{t.Sub(m.start), n})
}

// result computes the figures of the timeline.
func (m *meter) result(size int, st verbs.QPStats) Result {
	r := Result{Stats: st}
	if len(m.marks) == 0 {
		return r
	}
	last := m.marks[len(m.marks)-1]
	r.Messages, r.Bytes = last.n, last.n*int64(size)
	r.Elapsed = max(last.t, time.Microsecond)
	sec := r.Elapsed.Seconds()
	r.Avg = float64(r.Bytes) / sec
	r.MsgRate = float64(r.Messages) / sec
	r.TxPktRate = float64(st.TxPackets) / sec
	r.RxPktRate = float64(st.RxPackets) / sec
	r.Peak = max(peak(m.marks, size, max(int(last.n/10), m.window, 1)), r.Avg)
	return r
}

// peak is the best rate (bytes/s) between two marks at least w messages
// apart, the run's start (0 messages at time 0) counting as a mark.
func peak(marks []mark, size, w int) float64 {
	best := 0.0
	i := -1 // the mark a window starts at; -1 is the start
	at := func(k int) mark {
		if k < 0 {
			return mark{}
		}
		return marks[k]
	}
	for j := range marks {
		// The latest start still w messages before marks[j].
		for i+1 < j && marks[j].n-marks[i+1].n >= int64(w) {
			i++
		}
		a, b := at(i), marks[j]
		if b.n-a.n < int64(w) {
			continue
		}
		if d := b.t - a.t; d > 0 {
			best = max(best, float64(b.n-a.n)*float64(size)/d.Seconds())
		}
	}
	return best
}
