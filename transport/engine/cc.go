package engine

import (
	"cmp"
	"errors"
	"slices"
	"time"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/cc/dcqcn"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/qpstate"
)

// Congestion control (docs/congestion.md): a QP with DCQCN on is both a
// notification point, answering CE-marked packets with CNPs, and a
// reaction point, whose requester is paced to the rate its CNPs leave it.
// A QP with it off behaves exactly as before: its packets carry the
// address vector's traffic class, it sends no CNP, and a CNP for it is
// counted (rp_cnp_ignored) and dropped.

// ECN codepoints in the low two bits of the traffic class (RFC 3168).
const (
	ecnMask = 0b11
	ecnECT0 = 0b10
	ecnCE   = 0b11
)

// paceBurst is how much credit a paced QP may bank, as time at line
// rate (125 KB at 10 Gb/s): the driver's timer goroutine wakes tens of
// microseconds late on a loaded host, and credit capped below that delay
// is rate lost for good; the engine also builds up to MaxBatch packets
// (64 KB at a 1024-byte MTU) per turn. In steady state a paced QP's
// credit stays near zero; only a QP that was idle bursts this much.
const paceBurst = 100 * time.Microsecond

// qpCC is the congestion-control state of one QP, allocated only for a
// QP that has it on.
type qpCC struct {
	p      *dcqcn.Params
	inited bool // rp and pace start at the first use, on the engine's clock
	np     dcqcn.NP
	rp     dcqcn.RP
	pace   dcqcn.Pacer
	// limitedSince is when the pacer last held the requester back (zero:
	// not held); limited sums the time held.
	limitedSince time.Time
	limited      time.Duration
	stats        CCQPStats
}

// CCQPStats are a QP's congestion-control counters and state.
type CCQPStats struct {
	// Enabled: DCQCN is on for the QP.
	Enabled bool `json:"enabled"`
	// RateBPS is the current rate Rc in bits per second, TargetBPS the
	// target Rt, Alpha the congestion estimate.
	RateBPS   float64 `json:"rate_bps"`
	TargetBPS float64 `json:"target_bps"`
	Alpha     float64 `json:"alpha"`
	// RateLimitedNS is the time the pacer held the requester back while
	// it had packets to send, in nanoseconds.
	RateLimitedNS int64 `json:"rate_limited_ns"`
	// The device counters (dcqcn.Counters), for this QP.
	ECNMarked  uint64 `json:"np_ecn_marked_roce_packets"`
	CNPSent    uint64 `json:"np_cnp_sent"`
	CNPHandled uint64 `json:"rp_cnp_handled"`
	CNPIgnored uint64 `json:"rp_cnp_ignored"`
}

// ErrCCType is returned by SetCC for a QP that is not RC: only the RC
// requester is paced.
var ErrCCType = errors.New("engine: congestion control needs an RC QP")

// SetCC turns DCQCN on for qp with the parameters p, which must be valid
// and outlive the QP, or off with nil. Turning it on restarts the QP at
// line rate.
func (qp *QP) SetCC(p *dcqcn.Params) error {
	if p != nil {
		if qp.Config.Type != qpstate.RC {
			return ErrCCType
		}
		if err := p.Validate(); err != nil {
			return err
		}
	}
	qp.e.mu.Lock()
	defer qp.e.mu.Unlock()
	if p == nil {
		qp.cc = nil
		qp.PaceDeadline = time.Time{}
		qp.UpdateTimerSet()
		return nil
	}
	qp.cc = &qpCC{p: p}
	return nil
}

// CCEnabled reports whether DCQCN is on for the QP.
func (qp *QP) CCEnabled() bool {
	qp.e.mu.Lock()
	defer qp.e.mu.Unlock()
	return qp.cc != nil
}

// start begins the reaction point and the pacer at now, the first time.
func (c *qpCC) start(now time.Time) {
	if c.inited {
		return
	}
	c.inited = true
	c.rp.Init(c.p, now)
	c.pace.Init(now, c.p.LineRate, max(int(c.p.LineRate/8*paceBurst.Seconds()), 2*MaxPacket))
}

// sync brings the rate up to now and gives it to the pacer.
func (c *qpCC) sync(now time.Time) {
	c.start(now)
	c.rp.Advance(now)
	if r := c.rp.Rate(); r != c.pace.Rate() {
		c.pace.SetRate(now, r)
	}
}

// txClass is the traffic class a QP's packet leaves with: with congestion
// control on, a class that is not ECN-capable becomes ECT(0); any other
// ECN value is sent as given.
func (qp *QP) txClass() uint8 {
	tc := qp.Attr.TrafficClass
	if qp.cc != nil && tc&ecnMask == 0 {
		tc |= ecnECT0
	}
	return tc
}

// PaceReady asks the QP's pacer whether a request packet may leave now.
// Without congestion control it always may. When it may not, the QP's
// PaceDeadline is armed for the time it may, and the caller stops: the
// timer kicks the QP then. The caller charges what it sent with
// PaceSent.
func (qp *QP) PaceReady() bool {
	c := qp.cc
	if c == nil {
		return true
	}
	now := qp.e.now
	c.sync(now)
	ok, next := c.pace.Ready(now)
	if ok {
		if !c.limitedSince.IsZero() {
			c.limited += now.Sub(c.limitedSince)
			c.limitedSince = time.Time{}
		}
		return true
	}
	if c.limitedSince.IsZero() {
		c.limitedSince = now
	}
	if !next.IsZero() && (qp.PaceDeadline.IsZero() || !qp.PaceDeadline.Equal(next)) {
		qp.PaceDeadline = next
		qp.UpdateTimerSet()
	}
	return false
}

// PaceSent charges n bytes (one packet from the BTH through the ICRC) to
// the pacer and to the reaction point's byte counter.
func (qp *QP) PaceSent(n int) {
	if c := qp.cc; c != nil {
		c.pace.Spend(n)
		c.rp.OnSent(qp.e.now, n)
	}
}

// paceTimers runs the due PaceDeadlines in the order they fell due (then
// by QP number), not in the timer set's (a map's) order: the QPs' turns,
// and so a run on injected time, are the same every time.
func (e *Engine) paceTimers(now time.Time) {
	due := e.paceDue[:0]
	for qp := range e.timed {
		if t := qp.PaceDeadline; !t.IsZero() && !now.Before(t) {
			due = append(due, qp)
		}
	}
	slices.SortFunc(due, func(a, b *QP) int {
		if c := a.PaceDeadline.Compare(b.PaceDeadline); c != 0 {
			return c
		}
		return cmp.Compare(a.num, b.num)
	})
	for _, qp := range due {
		qp.paceTimer(now)
	}
	clear(due)
	e.paceDue = due[:0]
}

// paceTimer runs a due PaceDeadline: the rate is brought up to now and
// the requester gets another turn.
func (qp *QP) paceTimer(now time.Time) {
	qp.PaceDeadline = time.Time{}
	if qp.cc != nil {
		qp.cc.sync(now)
	}
	qp.UpdateTimerSet()
	if qp.CanSend() {
		qp.Kick()
	}
}

// noteCE is the notification point: a CE-marked packet arrived for qp,
// already accepted as from its peer. With congestion control on it asks
// the peer's QP (our remote QPN) to slow down with a CNP, at most one per
// CNP interval; either way the mark is counted.
func (e *Engine) noteCE(qp *QP) {
	c := qp.cc
	if c == nil {
		e.stats.CC.NPECNMarkedRoCEPackets++
		return
	}
	c.stats.ECNMarked++
	if !c.np.OnMarked(e.now, c.p.CNPInterval, &e.stats.CC) {
		return
	}
	if !qp.CanSend() {
		// The QP sends nothing in this state (nor its CNPs): undo the
		// count OnMarked made.
		e.stats.CC.NPCNPSent--
		return
	}
	c.stats.CNPSent++
	buf := qp.NewPacket()
	n, _ := bth.BuildCNP(buf, bth.CNPFields{DestQP: qp.Attr.DestQPN, PKey: 0xffff})
	qp.Sent(n)
	// A CNP is not ECN-capable: it reports congestion, it does not add
	// to what a marking queue measures.
	e.tx[len(e.tx)-1].TClass = qp.Attr.TrafficClass &^ ecnMask
}

// receiveCNP handles a CNP for qp: with congestion control on, its
// reaction point cuts the rate; otherwise it is counted and dropped.
func (e *Engine) receiveCNP(qp *QP, pk *nic.Packet) {
	if qp.Attr.Remote.IsValid() && pk.Remote.Addr() != qp.Attr.Remote.Addr() {
		e.stats.RxWrongSource++
		return
	}
	c := qp.cc
	if c == nil {
		e.stats.CC.RPCNPIgnored++
		return
	}
	c.sync(e.now)
	before := e.stats.CC.RPCNPHandled
	c.rp.OnCNP(e.now, &e.stats.CC)
	if e.stats.CC.RPCNPHandled != before {
		c.stats.CNPHandled++
	} else {
		c.stats.CNPIgnored++
	}
	c.pace.SetRate(e.now, c.rp.Rate())
}

// ccStats fills the QP's congestion-control state for a snapshot.
func (qp *QP) ccStats() CCQPStats {
	c := qp.cc
	if c == nil {
		return CCQPStats{}
	}
	s := c.stats
	s.Enabled = true
	limited := c.limited
	if c.inited {
		now := qp.e.now
		c.rp.Advance(now)
		if !c.limitedSince.IsZero() && now.After(c.limitedSince) {
			limited += now.Sub(c.limitedSince)
		}
		s.RateBPS, s.TargetBPS, s.Alpha = c.rp.Rate(), c.rp.Target(), c.rp.Alpha()
	} else {
		s.RateBPS, s.TargetBPS, s.Alpha = c.p.LineRate, c.p.LineRate, c.p.InitialAlpha
	}
	s.RateLimitedNS = int64(limited)
	return s
}

// isCE reports a packet marked Congestion Experienced.
func isCE(pk *nic.Packet) bool { return pk.TClass&ecnMask == ecnCE }
