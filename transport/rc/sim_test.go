package rc

import (
	"container/heap"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/icrc"
	"github.com/softroce/softroce/memreg"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/qpstate"
	"github.com/softroce/softroce/transport/engine"
)

// sim is a deterministic two-endpoint network on simulated time: the
// engines never see a real clock, so timeouts and RNR waits cost nothing
// and every run with the same seed is identical.
type sim struct {
	t       testing.TB
	now     time.Time
	ep      [2]*simEP
	q       flights
	seq     int
	rng     *rand.Rand
	imp     impairment
	rules   []rule
	trace   []string
	keep    bool // record the trace
	verbose bool
	tx      map[uint64]int
	steps   int
}

type impairment struct {
	loss, dup, reorder, corrupt float64
	delay                       time.Duration
}

// rule drops (or otherwise handles) an exact packet, in the manner of
// Lumina's event injection: "drop the 2nd transmission of PSN p".
type rule struct {
	from    int
	opcode  int // -1: any
	psn     uint32
	nth     int // which transmission (1-based)
	action  string
	matched int
}

type flight struct {
	at    time.Time
	seq   int
	to    int
	sport uint16
	data  []byte
}

type simEP struct {
	e    *engine.Engine
	mrs  *memreg.Table
	pd   *memreg.PD
	addr netip.Addr
	scq  *cq.CQ
	rcq  *cq.CQ
	qps  []*engine.QP // the QPs connect made, for dump
}

var simEpoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// simAdaptive turns Path.AdaptiveTimeout on for every QP connect makes.
var simAdaptive bool

func newSim(t testing.TB, seed uint64, imp impairment) *sim {
	return newSimCQ(t, seed, imp, 1<<16)
}

// newSimCQ is newSim with CQs of the given depth (fuzz targets use small
// ones to keep each execution cheap).
func newSimCQ(t testing.TB, seed uint64, imp impairment, cqDepth int) *sim {
	s := &sim{t: t, now: simEpoch, rng: rand.New(rand.NewPCG(seed, seed^0x5eed)), imp: imp, tx: map[uint64]int{}}
	for i := range s.ep {
		mrs := memreg.NewTable(memreg.Limits{})
		pd, err := mrs.AllocPD()
		if err != nil {
			t.Fatal(err)
		}
		scq, _ := cq.New(cqDepth)
		rcq, _ := cq.New(cqDepth)
		s.ep[i] = &simEP{e: engine.NewEngine(mrs), mrs: mrs, pd: pd, addr: netip.AddrFrom4([4]byte{10, 0, 0, byte(i + 1)}), scq: scq, rcq: rcq}
	}
	return s
}

type qpOpts struct {
	pmtu            int
	psn             [2]uint32
	timeout         uint8
	retry, rnrRetry uint8
	minRNR          uint8
	maxRD           int
	depth           int
	srq             [2]*engine.SRQ // the SRQ each side's QP is created on (nil: its own receive queue)
	typ             qpstate.Type   // service of both QPs (zero: RC)
	adaptive        bool           // Path.AdaptiveTimeout on both QPs
}

// connect makes an RC QP on each endpoint and brings both to RTS.
func (s *sim) connect(o qpOpts) [2]*engine.QP {
	if o.pmtu == 0 {
		o.pmtu = 1024
	}
	if o.depth == 0 {
		o.depth = 256
	}
	if o.maxRD == 0 {
		o.maxRD = 16
	}
	var qps [2]*engine.QP
	for i, ep := range s.ep {
		qp, err := ep.e.CreateQP(engine.QPConfig{Type: o.typ, PD: ep.pd, SendCQ: ep.scq, RecvCQ: ep.rcq, MaxSendWR: o.depth, MaxRecvWR: o.depth, MaxSendSGE: 4, MaxRecvSGE: 4, MaxInline: 256, SRQ: o.srq[i]})
		if err != nil {
			s.t.Fatal(err)
		}
		qps[i] = qp
		ep.qps = append(ep.qps, qp)
	}
	for i, qp := range qps {
		peer := 1 - i
		qp.SetState(qpstate.Init)
		qp.SetPath(engine.Path{Remote: engine.Remote(s.ep[peer].addr), Local: s.ep[i].addr, DestQPN: qps[peer].Num(), PMTU: o.pmtu,
			RQPSN: o.psn[peer], SQPSN: o.psn[i], Timeout: o.timeout, RetryCnt: o.retry, RNRRetry: o.rnrRetry,
			MinRNRTimer: o.minRNR, MaxRDAtomic: o.maxRD, MaxDestRDAtomic: o.maxRD,
			Access: memreg.AccessRemoteWrite | memreg.AccessRemoteRead | memreg.AccessRemoteAtomic | memreg.AccessLocalWrite, AdaptiveTimeout: o.adaptive || simAdaptive})
		qp.SetState(qpstate.RTR)
		qp.SetState(qpstate.RTS)
	}
	return qps
}

// traceSent calls fn with every packet engine i sends, parsed (a
// malformed one fails the test).
func (s *sim) traceSent(fn func(i int, pk *bth.Packet)) {
	for i := range s.ep {
		s.ep[i].e.SetPacketTrace(func(dir byte, p *nic.Packet) {
			if dir != 'T' {
				return
			}
			var pk bth.Packet
			if err := bth.Parse(&pk, p.Bytes()); err != nil {
				s.t.Errorf("engine %d sent a malformed packet: %v", i, err)
				return
			}
			fn(i, &pk)
		})
	}
}

func (s *sim) send(from int, p *nic.Packet) {
	data := append([]byte(nil), p.Bytes()...)
	src, dst := s.ep[from].addr.As4(), s.ep[1-from].addr.As4()
	h := icrc.Header{Src: src[:], Dst: dst[:], DF: true, SrcPort: p.SrcPort, DstPort: nic.RoCEv2Port}
	crc, err := icrc.Synth(&h, data)
	if err != nil {
		s.t.Fatal(err)
	}
	icrc.Put(data, crc)
	var bp bth.Packet
	if err := bth.Parse(&bp, data); err != nil {
		s.t.Fatalf("engine %d sent a malformed packet: %v", from, err)
	}
	key := uint64(from)<<40 | uint64(bp.BTH.Opcode())<<24 | uint64(bp.BTH.PSN())
	s.tx[key]++
	nth := s.tx[key]
	if s.keep {
		s.trace = append(s.trace, fmt.Sprintf("%d>%d %s psn=%d%s", from, 1-from, shortOp(bp.BTH.Opcode()), bp.BTH.PSN(), aethNote(&bp)))
		if s.verbose {
			s.trace[len(s.trace)-1] = fmt.Sprintf("%v qp=%d ", s.now.Sub(simEpoch), bp.BTH.DestQP()) + s.trace[len(s.trace)-1]
		}
	}
	for i := range s.rules {
		r := &s.rules[i]
		if r.from == from && (r.opcode < 0 || r.opcode == int(bp.BTH.Opcode())) && r.psn == bp.BTH.PSN() && r.nth == nth {
			r.matched++
			if r.action == "drop" {
				if s.keep {
					s.trace[len(s.trace)-1] += " DROPPED"
				}
				return
			}
		}
	}
	copies := 1
	if s.imp.loss > 0 && s.rng.Float64() < s.imp.loss {
		copies = 0
	}
	if copies == 1 && s.imp.dup > 0 && s.rng.Float64() < s.imp.dup {
		copies = 2
	}
	for c := 0; c < copies; c++ {
		d := data
		if s.imp.corrupt > 0 && s.rng.Float64() < s.imp.corrupt {
			d = append([]byte(nil), data...)
			d[s.rng.IntN(len(d))] ^= 1 << s.rng.IntN(8)
		}
		delay := s.imp.delay + time.Microsecond
		if s.imp.reorder > 0 && s.rng.Float64() < s.imp.reorder {
			delay += time.Duration(s.rng.IntN(50)) * time.Microsecond
		}
		s.seq++
		heap.Push(&s.q, flight{at: s.now.Add(delay), seq: s.seq, to: 1 - from, sport: p.SrcPort, data: d})
	}
}

func shortOp(o bth.Opcode) string { return strings.TrimPrefix(o.String(), "RC ") }

func aethNote(p *bth.Packet) string {
	if p.AETH == nil || p.AETH.Syndrome() == bth.SyndromeACKUnlimited {
		return ""
	}
	return " " + p.AETH.Syndrome().String()
}

// pump exchanges packets until done() or nothing is left to do, or the
// simulated deadline passes.
func (s *sim) pump(done func() bool, limit time.Duration) {
	end := s.now.Add(limit)
	for s.steps = 0; ; s.steps++ {
		for i, ep := range s.ep {
			for {
				out, more := ep.e.Progress(s.now)
				for j := range out {
					s.send(i, &out[j])
				}
				ep.e.Release(out)
				if !more {
					break
				}
			}
		}
		if done != nil && done() {
			return
		}
		// Next event: a packet arrival or a timer.
		next := time.Time{}
		if len(s.q) > 0 {
			next = s.q[0].at
		}
		for _, ep := range s.ep {
			if d := ep.e.NextDeadline(); !d.IsZero() && (next.IsZero() || d.Before(next)) {
				next = d
			}
		}
		if next.IsZero() || next.After(end) {
			return
		}
		if next.After(s.now) {
			s.now = next
		}
		var batches [2][]nic.Packet
		for len(s.q) > 0 && !s.q[0].at.After(s.now) {
			f := heap.Pop(&s.q).(flight)
			if !s.icrcOK(f) {
				continue // a corrupted packet fails the ICRC: the link drops it
			}
			batches[f.to] = append(batches[f.to], nic.Packet{Buf: f.data, N: len(f.data), Remote: engine.Remote(s.ep[1-f.to].addr), Local: s.ep[f.to].addr, ICRC: nic.ICRCVerified})
		}
		for i, b := range batches {
			if len(b) > 0 {
				s.ep[i].e.Receive(s.now, b)
			}
		}
	}
}

func (s *sim) icrcOK(f flight) bool {
	src, dst := s.ep[1-f.to].addr.As4(), s.ep[f.to].addr.As4()
	h := icrc.Header{Src: src[:], Dst: dst[:], DF: true, SrcPort: f.sport, DstPort: nic.RoCEv2Port}
	c, err := icrc.Synth(&h, f.data)
	return err == nil && c == icrc.Wire(f.data)
}

// rcOf is the RC service state of qp.
func rcOf(qp *engine.QP) *rcQP { return qp.Service().(*rcQP) }

func debug(qp *engine.QP) string {
	var r responder
	var compPSN uint32
	if rq, ok := qp.Service().(*rcQP); ok {
		r, compPSN = rq.resp, rq.compPSN
	}
	return fmt.Sprintf("QP %d state %v sq=%d sendOff=%d pkt=%d comp=%d next=%d rd=%d/%d retryDL=%v rnrDL=%v | ePSN=%d msn=%d jobs=%d backlog=%d cur=%v",
		qp.Num(), qp.StateLocked(), qp.SQCount, qp.SQSendOff, qp.SQPkt, compPSN, qp.NextPSN, qp.RDOutstanding, qp.Attr.MaxRDAtomic,
		!qp.RetryDeadline.IsZero(), !qp.RNRDeadline.IsZero(), r.ePSN, r.msn, len(r.jobs), r.blN, qp.Msg.Active)
}

func (s *sim) dump() string {
	out := ""
	for i, ep := range s.ep {
		for _, qp := range ep.qps {
			out += fmt.Sprintf("ep%d %s\n", i, debug(qp))
			if qp.SQCount > 0 {
				w := &qp.SQ[qp.SQHead]
				out += fmt.Sprintf("    head: %v len=%d state=%d psn %d..%d readDone=%d\n", w.WR.Opcode, w.Length, w.State, w.FirstPSN, w.LastPSN, w.ReadDone)
			}
		}
	}
	return out
}

// flights is a min-heap of packets in flight by arrival time, then by
// send order, so simultaneous arrivals keep their order.
type flights []flight

func (f flights) Len() int { return len(f) }
func (f flights) Less(a, b int) bool {
	if !f[a].at.Equal(f[b].at) {
		return f[a].at.Before(f[b].at)
	}
	return f[a].seq < f[b].seq
}
func (f flights) Swap(a, b int) { f[a], f[b] = f[b], f[a] }
func (f *flights) Push(x any)   { *f = append(*f, x.(flight)) }
func (f *flights) Pop() any {
	old := *f
	x := old[len(old)-1]
	*f = old[:len(old)-1]
	return x
}
