package enginetest

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

// Sim is a deterministic two-endpoint network on simulated time: the
// engines never see a real clock, so timeouts and RNR waits cost nothing
// and every run with the same seed is identical.
type Sim struct {
	T   testing.TB
	Now time.Time
	EP  [2]*EP
	Rng *rand.Rand // the seeded source of the impairments, free for a workload to draw from too
	// Rules drop exact packets, whatever the impairment.
	Rules []Rule
	// Trace holds one line per packet sent ("0>1 SEND_ONLY psn=5"), if
	// Keep is set; Verbose adds the simulated time and the destination QP.
	Trace   []string
	Keep    bool
	Verbose bool
	// Steps counts the rounds of the last Pump.
	Steps int

	q   flights
	seq int
	imp Impairment
	tx  map[uint64]int
}

// Impairment is what the simulated network does to each packet, as
// probabilities: lose it, deliver it twice, delay it by up to 50 µs more
// (reordering it), flip a bit (the receiving link then drops it on its
// ICRC); Delay is the one-way delay of every packet.
type Impairment struct {
	Loss, Dup, Reorder, Corrupt float64
	Delay                       time.Duration
}

// Rule drops (or otherwise handles) an exact packet, in the manner of
// Lumina's event injection: "drop the 2nd transmission of PSN p".
type Rule struct {
	From    int
	Opcode  int // -1: any
	PSN     uint32
	Nth     int    // which transmission (1-based)
	Action  string // "drop"
	Matched int    // how many packets the rule met
}

type flight struct {
	at    time.Time
	seq   int
	to    int
	sport uint16
	data  []byte
}

// EP is one endpoint: an engine with its memory, a PD, an address and the
// send and receive CQs of the QPs Connect makes.
type EP struct {
	E    *engine.Engine
	MRs  *memreg.Table
	PD   *memreg.PD
	Addr netip.Addr
	SCQ  *cq.CQ
	RCQ  *cq.CQ
	QPs  []*engine.QP // the QPs Connect made, for Dump
}

// Epoch is the simulated time a Sim starts at.
var Epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// NewSim is a Sim whose impairments draw from seed, with CQs of 65536
// entries.
func NewSim(t testing.TB, seed uint64, imp Impairment) *Sim {
	return NewSimCQ(t, seed, imp, 1<<16)
}

// NewSimCQ is NewSim with CQs of the given depth (fuzz targets use small
// ones to keep each execution cheap).
func NewSimCQ(t testing.TB, seed uint64, imp Impairment, cqDepth int) *Sim {
	s := &Sim{T: t, Now: Epoch, Rng: rand.New(rand.NewPCG(seed, seed^0x5eed)), imp: imp, tx: map[uint64]int{}}
	for i := range s.EP {
		mrs := memreg.NewTable(memreg.Limits{})
		pd, err := mrs.AllocPD()
		if err != nil {
			t.Fatal(err)
		}
		scq, _ := cq.New(cqDepth)
		rcq, _ := cq.New(cqDepth)
		s.EP[i] = &EP{E: engine.NewEngine(mrs), MRs: mrs, PD: pd, Addr: netip.AddrFrom4([4]byte{10, 0, 0, byte(i + 1)}), SCQ: scq, RCQ: rcq}
	}
	return s
}

// QPOpts are the attributes of the QPs Connect makes; zero values take
// defaults (PMTU 1024, 256 work requests each way, 16 RDMA READs and
// atomics outstanding).
type QPOpts struct {
	PMTU            int
	PSN             [2]uint32 // each side's initial send PSN
	Timeout         uint8
	Retry, RNRRetry uint8
	MinRNR          uint8
	MaxRD           int
	Depth           int
	SRQ             [2]*engine.SRQ // the SRQ each side's QP is created on (nil: its own receive queue)
	Type            qpstate.Type   // service of both QPs (zero: RC)
	Adaptive        bool           // Path.AdaptiveTimeout on both QPs
}

// Connect makes a connected QP (RC unless o.Type says otherwise) on each
// endpoint and brings both to RTS.
func (s *Sim) Connect(o QPOpts) [2]*engine.QP {
	if o.PMTU == 0 {
		o.PMTU = 1024
	}
	if o.Depth == 0 {
		o.Depth = 256
	}
	if o.MaxRD == 0 {
		o.MaxRD = 16
	}
	var qps [2]*engine.QP
	for i, ep := range s.EP {
		qp, err := ep.E.CreateQP(engine.QPConfig{Type: o.Type, PD: ep.PD, SendCQ: ep.SCQ, RecvCQ: ep.RCQ, MaxSendWR: o.Depth, MaxRecvWR: o.Depth, MaxSendSGE: 4, MaxRecvSGE: 4, MaxInline: 256, SRQ: o.SRQ[i]})
		if err != nil {
			s.T.Fatal(err)
		}
		qps[i] = qp
		ep.QPs = append(ep.QPs, qp)
	}
	for i, qp := range qps {
		peer := 1 - i
		qp.SetState(qpstate.Init)
		qp.SetPath(engine.Path{Remote: engine.Remote(s.EP[peer].Addr), Local: s.EP[i].Addr, DestQPN: qps[peer].Num(), PMTU: o.PMTU,
			RQPSN: o.PSN[peer], SQPSN: o.PSN[i], Timeout: o.Timeout, RetryCnt: o.Retry, RNRRetry: o.RNRRetry,
			MinRNRTimer: o.MinRNR, MaxRDAtomic: o.MaxRD, MaxDestRDAtomic: o.MaxRD,
			Access: memreg.AccessRemoteWrite | memreg.AccessRemoteRead | memreg.AccessRemoteAtomic | memreg.AccessLocalWrite, AdaptiveTimeout: o.Adaptive})
		qp.SetState(qpstate.RTR)
		qp.SetState(qpstate.RTS)
	}
	return qps
}

// TraceSent calls fn with every packet engine i sends, parsed (a
// malformed one fails the test).
func (s *Sim) TraceSent(fn func(i int, pk *bth.Packet)) {
	for i := range s.EP {
		s.EP[i].E.SetPacketTrace(func(dir byte, p *nic.Packet) {
			if dir != 'T' {
				return
			}
			var pk bth.Packet
			if err := bth.Parse(&pk, p.Bytes()); err != nil {
				s.T.Errorf("engine %d sent a malformed packet: %v", i, err)
				return
			}
			fn(i, &pk)
		})
	}
}

func (s *Sim) send(from int, p *nic.Packet) {
	data := append([]byte(nil), p.Bytes()...)
	src, dst := s.EP[from].Addr.As4(), s.EP[1-from].Addr.As4()
	h := icrc.Header{Src: src[:], Dst: dst[:], DF: true, SrcPort: p.SrcPort, DstPort: nic.RoCEv2Port}
	crc, err := icrc.Synth(&h, data)
	if err != nil {
		s.T.Fatal(err)
	}
	icrc.Put(data, crc)
	var bp bth.Packet
	if err := bth.Parse(&bp, data); err != nil {
		s.T.Fatalf("engine %d sent a malformed packet: %v", from, err)
	}
	key := uint64(from)<<40 | uint64(bp.BTH.Opcode())<<24 | uint64(bp.BTH.PSN())
	s.tx[key]++
	nth := s.tx[key]
	if s.Keep {
		s.Trace = append(s.Trace, fmt.Sprintf("%d>%d %s psn=%d%s", from, 1-from, ShortOp(bp.BTH.Opcode()), bp.BTH.PSN(), aethNote(&bp)))
		if s.Verbose {
			s.Trace[len(s.Trace)-1] = fmt.Sprintf("%v qp=%d ", s.Now.Sub(Epoch), bp.BTH.DestQP()) + s.Trace[len(s.Trace)-1]
		}
	}
	for i := range s.Rules {
		r := &s.Rules[i]
		if r.From == from && (r.Opcode < 0 || r.Opcode == int(bp.BTH.Opcode())) && r.PSN == bp.BTH.PSN() && r.Nth == nth {
			r.Matched++
			if r.Action == "drop" {
				if s.Keep {
					s.Trace[len(s.Trace)-1] += " DROPPED"
				}
				return
			}
		}
	}
	copies := 1
	if s.imp.Loss > 0 && s.Rng.Float64() < s.imp.Loss {
		copies = 0
	}
	if copies == 1 && s.imp.Dup > 0 && s.Rng.Float64() < s.imp.Dup {
		copies = 2
	}
	for c := 0; c < copies; c++ {
		d := data
		if s.imp.Corrupt > 0 && s.Rng.Float64() < s.imp.Corrupt {
			d = append([]byte(nil), data...)
			d[s.Rng.IntN(len(d))] ^= 1 << s.Rng.IntN(8)
		}
		delay := s.imp.Delay + time.Microsecond
		if s.imp.Reorder > 0 && s.Rng.Float64() < s.imp.Reorder {
			delay += time.Duration(s.Rng.IntN(50)) * time.Microsecond
		}
		s.seq++
		heap.Push(&s.q, flight{at: s.Now.Add(delay), seq: s.seq, to: 1 - from, sport: p.SrcPort, data: d})
	}
}

// ShortOp is an opcode's name without the "RC " of RC opcodes.
func ShortOp(o bth.Opcode) string { return strings.TrimPrefix(o.String(), "RC ") }

func aethNote(p *bth.Packet) string {
	if p.AETH == nil || p.AETH.Syndrome() == bth.SyndromeACKUnlimited {
		return ""
	}
	return " " + p.AETH.Syndrome().String()
}

// Pump exchanges packets until done() or nothing is left to do, or the
// simulated deadline passes.
func (s *Sim) Pump(done func() bool, limit time.Duration) {
	end := s.Now.Add(limit)
	for s.Steps = 0; ; s.Steps++ {
		for i, ep := range s.EP {
			for {
				out, more := ep.E.Progress(s.Now)
				for j := range out {
					s.send(i, &out[j])
				}
				ep.E.Release(out)
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
		for _, ep := range s.EP {
			if d := ep.E.NextDeadline(); !d.IsZero() && (next.IsZero() || d.Before(next)) {
				next = d
			}
		}
		if next.IsZero() || next.After(end) {
			return
		}
		if next.After(s.Now) {
			s.Now = next
		}
		var batches [2][]nic.Packet
		for len(s.q) > 0 && !s.q[0].at.After(s.Now) {
			f := heap.Pop(&s.q).(flight)
			if !s.icrcOK(f) {
				continue // a corrupted packet fails the ICRC: the link drops it
			}
			batches[f.to] = append(batches[f.to], nic.Packet{Buf: f.data, N: len(f.data), Remote: engine.Remote(s.EP[1-f.to].Addr), Local: s.EP[f.to].Addr, ICRC: nic.ICRCVerified})
		}
		for i, b := range batches {
			if len(b) > 0 {
				s.EP[i].E.Receive(s.Now, b)
			}
		}
	}
}

func (s *Sim) icrcOK(f flight) bool {
	src, dst := s.EP[1-f.to].Addr.As4(), s.EP[f.to].Addr.As4()
	h := icrc.Header{Src: src[:], Dst: dst[:], DF: true, SrcPort: f.sport, DstPort: nic.RoCEv2Port}
	c, err := icrc.Synth(&h, f.data)
	return err == nil && c == icrc.Wire(f.data)
}

// Dump describes every QP Connect made, one line each from describe (a
// service's test knows its own state of the QP), and the oldest work
// request of those with some outstanding.
func (s *Sim) Dump(describe func(*engine.QP) string) string {
	out := ""
	for i, ep := range s.EP {
		for _, qp := range ep.QPs {
			out += fmt.Sprintf("ep%d %s\n", i, describe(qp))
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
