package dcqcn_test

import (
	"bytes"
	"container/heap"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/softroce/softroce/cc/dcqcn"
	"github.com/softroce/softroce/cc/rateplot"
	"github.com/softroce/softroce/nic/congest"
)

// The scenario: N senders, each a reaction point and a pacer, send
// fixed-size packets as fast as their pacer lets them into one
// ECN-marking bottleneck slower than their sum; the receiver applies the
// notification point's limiter per flow and each CNP reaches its sender
// a fixed delay later. A packet-level discrete-event model on injected
// time: no transport, no goroutines, the same numbers on every run.

type scenario struct {
	flows     int
	start     []time.Duration // per flow; nil: all at 0
	dcqcn     bool            // false: senders stay at line rate
	duration  time.Duration
	params    dcqcn.Params
	bottle    congest.Config
	pktSize   int
	cnpDelay  time.Duration // from the marked packet's arrival to the CNP's
	bin       time.Duration // throughput and queue sampling period
	burst     int           // pacer burst, bytes
	lineRate  float64
	sampleTag string
}

// result is what the run measured, per bin.
type result struct {
	bin      time.Duration
	rx       [][]float64 // rx[flow][bin]: bits/s delivered by the bottleneck
	queue    []int       // queue length at the end of each bin, bytes
	maxQueue []int       // longest queue found by a packet within each bin
	counters congest.Counters
	cc       dcqcn.Counters
}

type event struct {
	at   time.Time
	kind int // evSend, evMarked, evCNP
	flow int
	seq  uint64 // ties broken by insertion order: determinism
}

const (
	evSend = iota
	evMarked
	evCNP
)

type eventHeap []event

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	if !h[i].at.Equal(h[j].at) {
		return h[i].at.Before(h[j].at)
	}
	return h[i].seq < h[j].seq
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(event)) }
func (h *eventHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func (s *scenario) run(t testing.TB) *result {
	if err := s.params.Validate(); err != nil {
		t.Fatal(err)
	}
	q := congest.NewQueue(s.bottle)
	nbins := int(s.duration / s.bin)
	res := &result{bin: s.bin, rx: make([][]float64, s.flows), queue: make([]int, nbins), maxQueue: make([]int, nbins)}
	rps := make([]dcqcn.RP, s.flows)
	pacers := make([]dcqcn.Pacer, s.flows)
	nps := make([]dcqcn.NP, s.flows)
	var h eventHeap
	var seq uint64
	push := func(at time.Time, kind, flow int) {
		seq++
		heap.Push(&h, event{at: at, kind: kind, flow: flow, seq: seq})
	}
	for f := range s.flows {
		res.rx[f] = make([]float64, nbins)
		at := epoch
		if s.start != nil {
			at = epoch.Add(s.start[f])
		}
		rps[f].Init(&s.params, at)
		pacers[f].Init(at, s.lineRate, s.burst)
		push(at, evSend, f)
	}
	end := epoch.Add(s.duration)
	wire := time.Duration(float64(s.pktSize) * 8 / s.lineRate * 1e9) // the sender's own serialisation
	nextBin := 0
	for h.Len() > 0 {
		e := heap.Pop(&h).(event)
		if !e.at.Before(end) {
			break
		}
		for nextBin < nbins && !epoch.Add(time.Duration(nextBin+1)*s.bin).After(e.at) {
			res.queue[nextBin] = q.Len(epoch.Add(time.Duration(nextBin+1) * s.bin))
			nextBin++
		}
		r, p := &rps[e.flow], &pacers[e.flow]
		switch e.kind {
		case evSend:
			if s.dcqcn {
				r.Advance(e.at)
				p.SetRate(e.at, r.Rate())
			}
			grant, next := p.Allow(e.at, s.pktSize)
			if grant > 0 {
				if s.dcqcn {
					r.OnSent(e.at, s.pktSize)
					p.SetRate(e.at, r.Rate())
				}
				qlen := q.Len(e.at)
				v, _, departs := q.Enqueue(e.at, s.pktSize, congest.ECT0)
				if b := int(e.at.Sub(epoch) / s.bin); b < nbins {
					res.maxQueue[b] = max(res.maxQueue[b], qlen)
				}
				if v != congest.Dropped {
					if b := int(departs.Sub(epoch) / s.bin); b < nbins {
						res.rx[e.flow][b] += float64(s.pktSize * 8)
					}
					if v == congest.Marked {
						push(departs, evMarked, e.flow)
					}
				}
				next = e.at.Add(wire)
			}
			push(next, evSend, e.flow)
		case evMarked:
			if nps[e.flow].OnMarked(e.at, s.params.CNPInterval, &res.cc) {
				push(e.at.Add(s.cnpDelay), evCNP, e.flow)
			}
		case evCNP:
			if s.dcqcn {
				r.OnCNP(e.at, &res.cc)
				p.SetRate(e.at, r.Rate())
			} else {
				res.cc.RPCNPIgnored++
			}
		}
	}
	for f := range res.rx {
		for b := range res.rx[f] {
			res.rx[f][b] /= s.bin.Seconds()
		}
	}
	res.counters = q.Counters()
	return res
}

// mean is flow f's average rate over bins [from, to).
func (r *result) mean(f int, from, to time.Duration) float64 {
	a, b := int(from/r.bin), int(to/r.bin)
	sum := 0.0
	for _, v := range r.rx[f][a:b] {
		sum += v
	}
	return sum / float64(b-a)
}

// jain is Jain's fairness index of the flows' average rates over the window.
func (r *result) jain(from, to time.Duration) (index, total float64) {
	var sum, sq float64
	for f := range r.rx {
		m := r.mean(f, from, to)
		sum += m
		sq += m * m
	}
	return sum * sum / (float64(len(r.rx)) * sq), sum
}

// keep writes the run's rate plot to $DCQCN_PLOT/name.html when that
// variable names a directory, to look at what the numbers summarise.
func (r *result) keep(t *testing.T, s *scenario, name string) {
	dir := os.Getenv("DCQCN_PLOT")
	if dir == "" {
		return
	}
	p := &rateplot.Plot{Title: fmt.Sprintf("DCQCN, %d flows into %.0f Gb/s (%s)", s.flows, s.bottle.Rate/1e9, name),
		Step: r.bin, Kmin: float64(s.bottle.Kmin), Kmax: float64(s.bottle.Kmax)}
	for f := range r.rx {
		p.Flows = append(p.Flows, rateplot.Series{Name: fmt.Sprint("flow ", f), Values: r.rx[f]})
	}
	for _, q := range r.queue {
		p.Queue = append(p.Queue, float64(q))
	}
	var b bytes.Buffer
	if err := rateplot.Write(&b, p, "html"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".html"), b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// maxQueueAfter is the longest queue any packet found from `from` on.
func (r *result) maxQueueAfter(from time.Duration) int {
	m := 0
	for _, v := range r.maxQueue[int(from/r.bin):] {
		m = max(m, v)
	}
	return m
}

// marking is a switch's ECN profile.
type marking struct {
	name       string
	kmin, kmax int
	pmax       float64
}

// The two profiles the scenarios run with: the DCQCN authors' published
// switch configuration (Kmin 40 KB, Kmax 1000 KB, Pmax 1), and a shallow
// one with the same Kmin and ramp but Kmax 200 KB, closer to what a
// 10 Gb/s port is given, where "below Kmax" is a tighter bound. Not
// tuned: a gentler ramp (Kmax 400 KB, Pmax 20 %) lets an 8-flow line-rate
// incast overflow the 2 MB buffer before the first CNPs land.
var markings = []marking{
	{"authors", 40000, 1000000, 1},
	{"shallow", 40000, 200000, 1},
}

// base is the scenario the tests share. Why these numbers:
//   - 10 Gb/s senders into a 10 Gb/s bottleneck: an N-to-1 incast, the
//     senders' sum N times the bottleneck, every flow starting at line
//     rate as DCQCN QPs do.
//   - DCQCN at the authors' published parameters (dcqcn.Default),
//     CNPs at most every 50 us per flow, as in that configuration.
//   - 1000-byte packets, the authors' simulation payload size.
//   - a 2 MB buffer: a shallow switch's share per port, twice the
//     authors' Kmax, so that drops without congestion control come from
//     the missing feedback, not from a tiny buffer.
//   - 10 us from a marked packet leaving the bottleneck to its CNP at the
//     sender: a datacenter round trip through a switch or two. The mark
//     itself reaches the receiver only when the packet leaves the queue,
//     so queueing delay is part of the feedback loop, as on a real path.
//   - a pacer burst of two packets: RNICs pace per packet.
func base(flows int, dc bool, m marking) *scenario {
	line := 10e9
	return &scenario{
		flows: flows, dcqcn: dc, duration: 100 * time.Millisecond,
		params:   dcqcn.Default(line),
		bottle:   congest.Config{Rate: 10e9, Queue: 2 << 20, Kmin: m.kmin, Kmax: m.kmax, Pmax: m.pmax, Seed: 1},
		pktSize:  1000,
		cnpDelay: 10 * time.Microsecond,
		bin:      100 * time.Microsecond,
		burst:    2000,
		lineRate: line,
	}
}

// TestScenarioNoCC: the same senders without congestion control (line
// rate, CNPs ignored) fill the buffer and lose packets.
func TestScenarioNoCC(t *testing.T) {
	for _, m := range markings {
		for _, n := range []int{2, 4, 8} {
			s := base(n, false, m)
			s.duration = 20 * time.Millisecond
			r := s.run(t)
			if r.counters.Dropped == 0 {
				t.Errorf("%s, %d flows at line rate without congestion control: no drops (%+v)", m.name, n, r.counters)
			}
			if r.counters.MaxQueue < s.bottle.Queue-s.pktSize {
				t.Errorf("%s, %d flows: queue peaked at %d bytes, never filled the %d-byte buffer", m.name, n, r.counters.MaxQueue, s.bottle.Queue)
			}
		}
	}
}

// Targets of TestScenarioDCQCN. The incast's first burst is absorbed in
// about a millisecond (the first CNPs halve every flow, the next ones
// follow every 50 us); settle gives that five times over. The window
// starts once alpha has had 20 ms (about 360 alpha periods, enough for
// g = 1/256 to forget the start) to even the flows out.
const (
	settle      = 5 * time.Millisecond
	windowStart = 20 * time.Millisecond
)

func TestScenarioDCQCN(t *testing.T) {
	for _, m := range markings {
		for _, n := range []int{2, 4, 8} {
			t.Run(fmt.Sprintf("%s/%d flows", m.name, n), func(t *testing.T) {
				s := base(n, true, m)
				r := s.run(t)
				j, sum := r.jain(windowStart, s.duration)
				mq := r.maxQueueAfter(settle)
				t.Logf("drops %d, marked %d, max queue %d, after %v %d; over [%v, %v): Jain %.4f, sum %.2f Gb/s (%.1f%%); %+v",
					r.counters.Dropped, r.counters.Marked, r.counters.MaxQueue, settle, mq, windowStart, s.duration, j, sum/1e9, 100*sum/s.bottle.Rate, r.cc)
				if r.counters.Dropped != 0 {
					t.Errorf("%d drops with DCQCN", r.counters.Dropped)
				}
				if mq >= s.bottle.Kmax {
					t.Errorf("queue reached %d bytes after %v, Kmax %d", mq, settle, s.bottle.Kmax)
				}
				if j < 0.95 {
					t.Errorf("Jain's index %.4f over [%v, %v), want >= 0.95", j, windowStart, s.duration)
				}
				if sum < 0.85*s.bottle.Rate {
					t.Errorf("sum %.3f Gb/s over [%v, %v), want >= 85%% of %.0f Gb/s", sum/1e9, windowStart, s.duration, s.bottle.Rate/1e9)
				}
				if r.cc.RPCNPHandled == 0 || r.cc.NPCNPSent != r.cc.RPCNPHandled {
					t.Errorf("counters %+v: every CNP sent must be handled", r.cc)
				}
			})
		}
	}
}

// lateReach is how soon a flow started late must reach its fair share:
// its 5 ms average at 80 % of the bottleneck's rate over the flow count.
// A newcomer converges slowly under DCQCN: it starts at line rate with
// alpha 1, so its first cuts are deep, while the incumbents' alphas have
// decayed and they give way only as marks spread; with g = 1/256 that
// takes some 15 to 30 ms here. 35 ms states the bound with room to spare.
const lateReach = 35 * time.Millisecond

func TestScenarioLateFlow(t *testing.T) {
	const lateStart = 30 * time.Millisecond
	for _, m := range markings {
		for _, n := range []int{2, 4, 8} {
			t.Run(fmt.Sprintf("%s/%d flows", m.name, n), func(t *testing.T) {
				s := base(n, true, m)
				s.start = make([]time.Duration, n)
				s.start[n-1] = lateStart
				s.duration = lateStart + lateReach + 5*time.Millisecond
				r := s.run(t)
				share := s.bottle.Rate / float64(n)
				reach := time.Duration(-1)
				for at := lateStart; at+5*time.Millisecond <= s.duration; at += s.bin {
					if r.mean(n-1, at, at+5*time.Millisecond) >= 0.8*share {
						reach = at + 5*time.Millisecond - lateStart
						break
					}
				}
				t.Logf("late flow at 80%% of its %.2f Gb/s share %v after its start; drops %d", share/1e9, reach, r.counters.Dropped)
				r.keep(t, s, fmt.Sprintf("late-%s-%d", m.name, n))
				if reach < 0 || reach > lateReach {
					t.Errorf("late flow reached 80%% of its share after %v, want within %v", reach, lateReach)
				}
				if r.counters.Dropped != 0 {
					t.Errorf("%d drops", r.counters.Dropped)
				}
			})
		}
	}
}
