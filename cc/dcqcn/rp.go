package dcqcn

import (
	"math"
	"time"
)

// RP is the reaction point of one QP: its current rate Rc, target rate
// Rt, congestion estimate alpha, and the timer and byte-counter stages of
// the rate increase. It is a small value the caller embeds in its per-QP
// state; Init it before use. It is not safe for concurrent use (the QP's
// owner serialises calls, as it does for the QP's other state).
type RP struct {
	p      *Params
	rc, rt float64
	alpha  float64
	// alphaAt starts the current alpha period, timerAt the current
	// rate-increase timer period.
	alphaAt, timerAt time.Time
	lastCut          time.Time
	cut              bool  // a CNP has been handled since Init
	bytes            int64 // bytes sent since the last byte-counter event
	tStage, bStage   int   // increase events by timer and by byte counter since the last cut
}

// Init starts the reaction point at line rate at time now. p must be
// valid (Params.Validate) and outlive the RP; it is shared, not copied.
func (r *RP) Init(p *Params, now time.Time) {
	*r = RP{p: p, rc: p.LineRate, rt: p.LineRate, alpha: p.InitialAlpha, alphaAt: now, timerAt: now}
}

// Rate is the current rate Rc in bits per second.
func (r *RP) Rate() float64 { return r.rc }

// Target is the target rate Rt in bits per second.
func (r *RP) Target() float64 { return r.rt }

// Alpha is the current congestion estimate.
func (r *RP) Alpha() float64 { return r.alpha }

// Stages returns the increase events counted by the timer and by the
// byte counter since the last rate cut.
func (r *RP) Stages() (timer, bytes int) { return r.tStage, r.bStage }

// OnCNP handles a CNP for this QP received at now: alpha = (1-g)*alpha +
// g, Rt = Rc, Rc = max(Rmin, Rc*(1-alpha/2)), and the increase stages,
// byte counter and both periods restart. It returns false, changing
// nothing, for a CNP within RateReducePeriod of the previous cut. c, if
// not nil, counts the CNP as handled or ignored.
func (r *RP) OnCNP(now time.Time, c *Counters) bool {
	r.Advance(now)
	if r.cut && r.p.RateReducePeriod > 0 && now.Sub(r.lastCut) < r.p.RateReducePeriod {
		if c != nil {
			c.RPCNPIgnored++
		}
		return false
	}
	g := r.p.G
	r.alpha = (1-g)*r.alpha + g
	r.rt = r.rc
	r.rc = max(r.p.MinRate, r.rc*(1-r.alpha/2))
	r.tStage, r.bStage, r.bytes = 0, 0, 0
	r.alphaAt, r.timerAt, r.lastCut, r.cut = now, now, now, true
	if c != nil {
		c.RPCNPHandled++
	}
	return true
}

// OnSent accounts n bytes sent at now: every ByteCounter bytes is one
// rate-increase event.
func (r *RP) OnSent(now time.Time, n int) {
	r.Advance(now)
	r.bytes += int64(n)
	for r.bytes >= r.p.ByteCounter {
		r.bytes -= r.p.ByteCounter
		r.bStage++
		r.increase()
	}
}

// maxCatchUp bounds the increase events Advance evaluates one by one
// after an idle spell (about 60 ms at the default timer). An idle QP's
// byte stage does not move, so each later event raises Rt by the same
// step; those are applied in closed form, Rc ending one step below Rt
// (the fixed point of Rc = (Rc+Rt)/2 while Rt grows by a step) or at
// line rate.
const maxCatchUp = 1024

// Advance brings the RP up to now: alpha decays once per AlphaPeriod
// elapsed without a CNP, and each elapsed Timer period is one increase
// event. OnCNP and OnSent call it; call it before reading Rate after
// time passed without either. Time going backwards changes nothing.
func (r *RP) Advance(now time.Time) {
	if d := now.Sub(r.alphaAt); d >= r.p.AlphaPeriod {
		k := d / r.p.AlphaPeriod
		r.alpha *= math.Pow(1-r.p.G, float64(k))
		r.alphaAt = r.alphaAt.Add(k * r.p.AlphaPeriod)
	}
	d := now.Sub(r.timerAt)
	if d < r.p.Timer {
		return
	}
	k := int64(d / r.p.Timer)
	r.timerAt = r.timerAt.Add(time.Duration(k) * r.p.Timer)
	for ; k > 0; k-- {
		if r.rc >= r.p.LineRate && r.rt >= r.p.LineRate {
			r.addStages(k)
			return
		}
		if k > maxCatchUp && r.tStage > maxCatchUp {
			r.tStage++
			step := r.step()
			r.addStages(k - 1)
			r.rt = min(r.p.LineRate, r.rt+float64(k)*step)
			if r.rt >= r.p.LineRate {
				r.rc = r.rt
			} else {
				r.rc = max(r.rc, r.rt-step)
			}
			return
		}
		r.tStage++
		r.increase()
	}
}

func (r *RP) addStages(k int64) { r.tStage = int(min(int64(r.tStage)+k, math.MaxInt32)) }

// step is what the current increase event adds to Rt (the stage
// counters already count it).
func (r *RP) step() float64 {
	f := r.p.F
	switch {
	case r.tStage <= f && r.bStage <= f:
		return 0 // fast recovery: Rt stays, Rc closes half the gap
	case r.tStage > f && r.bStage > f:
		return r.p.HAI * float64(min(r.tStage, r.bStage)-f)
	}
	return r.p.AI
}

// increase is one rate-increase event (DCQCN's rate increase): fast
// recovery while both stage counters are at most F, hyper increase once
// both exceed F, additive increase in between; Rc then moves half way to
// Rt. Both are capped at line rate.
func (r *RP) increase() {
	r.rt = min(r.rt+r.step(), r.p.LineRate)
	r.rc = (r.rc + r.rt) / 2
	if r.rt-r.rc < 1 { // within a bit per second: done, rather than halving forever
		r.rc = r.rt
	}
}
