// Package dcqcn is the logic of DCQCN congestion control for RoCEv2 (Zhu
// et al., "Congestion Control for Large-Scale RDMA Deployments", SIGCOMM
// 2015), as pieces the engine embeds per QP: the reaction point (RP, the
// sender's rate), a pacer (a token bucket that turns the rate into send
// times) and the notification point's CNP limiter (NP, the receiver).
//
// Everything here is pure logic on injected time: no goroutines, no
// timers, no sleeping, no allocation per packet. The periodic parts of
// DCQCN (alpha decay, the rate-increase timer) are evaluated lazily: every
// call first catches up with the periods that have elapsed since the last
// one, so the result does not depend on how often the caller's own timer
// fires, only on the times it passes in. The caller arms its timer from
// Pacer.Allow's next time.
//
// The wire side (CNP format) is in package bth (BuildCNP, ParseCNP); the
// ECN-marking queue used to test all this is nic/congest.
package dcqcn

import (
	"errors"
	"fmt"
	"time"
)

// Params are the DCQCN parameters of a device (every QP on it shares
// them). Rates are in bits per second.
//
// Default returns the configuration the DCQCN authors published with their
// simulator (ns3-rdma mix/config.txt): g = 1/256, alpha period 55 us,
// rate-increase timer 60 us, byte counter 300000 bytes, F = 5 fast-recovery
// stages, R_AI 40 Mb/s, R_HAI 200 Mb/s, and a CNP interval of 50 us. Why
// that set: it is the one whose behaviour the authors evaluated and
// published (convergence and fairness at tens of Gb/s), and its periods
// are tens of microseconds, which lazy evaluation honours exactly whatever
// the engine's timer granularity. The simulator's code defaults
// (ReferenceCode: g = 1/16, timer 1500 us, byte counter 150 KB, R_AI
// 5 Mb/s, R_HAI 50 Mb/s) recover far more slowly than the published runs,
// and ConnectX's firmware defaults (alpha update every 1 us, rate-reduce
// monitor period 4 us, CNPs at most every 4 us) assume hardware that acts
// per microsecond, which a userspace engine batching packets does not.
// The authors' set has no minimum rate; MinRate is the simulator's
// default, 100 Mb/s.
type Params struct {
	// LineRate is the starting rate of a QP and the cap on every increase.
	LineRate float64 `json:"line_rate"`
	// MinRate (R_min) is the floor of a rate cut.
	MinRate float64 `json:"min_rate"`
	// G is the gain of the alpha (congestion estimate) filter, in (0, 1].
	G float64 `json:"g"`
	// InitialAlpha is alpha before the first CNP, in [0, 1]: 1 makes the
	// first cut halve the rate, as in the authors' code and ConnectX
	// (initial alpha 1023/1024).
	InitialAlpha float64 `json:"initial_alpha"`
	// AlphaPeriod: alpha decays by (1-G) once per period without a CNP.
	AlphaPeriod time.Duration `json:"alpha_period"`
	// Timer (T) is the rate-increase timer: one increase event per period.
	Timer time.Duration `json:"timer"`
	// ByteCounter (B): one increase event per ByteCounter bytes sent.
	ByteCounter int64 `json:"byte_counter"`
	// F is the number of fast-recovery stages before additive increase.
	F int `json:"fast_recovery_stages"`
	// AI (R_AI) is the additive increase of the target rate per event.
	AI float64 `json:"rate_ai"`
	// HAI (R_HAI) is the hyper increase step: the target grows by HAI*i
	// at the i-th hyper-increase event.
	HAI float64 `json:"rate_hai"`
	// RateReducePeriod, if set, is the shortest time between two rate
	// cuts; a CNP arriving sooner is ignored (counted in RPCNPIgnored),
	// as ConnectX's rate-reduce monitor period does. Zero: every CNP cuts.
	RateReducePeriod time.Duration `json:"rate_reduce_period"`
	// CNPInterval is the notification point's shortest time between two
	// CNPs for one QP (np_min_time_between_cnps): 50 us in the authors'
	// configuration, 4 us in ConnectX firmware (docs/congestion.md,
	// Parameters).
	CNPInterval time.Duration `json:"cnp_interval"`
}

// Default returns the authors' published configuration (see Params) for
// a QP whose line rate is lineRate bits per second.
func Default(lineRate float64) Params {
	return Params{
		LineRate: lineRate, MinRate: 100e6,
		G: 1.0 / 256, InitialAlpha: 1,
		AlphaPeriod: 55 * time.Microsecond, Timer: 60 * time.Microsecond, ByteCounter: 300000,
		F: 5, AI: 40e6, HAI: 200e6,
		CNPInterval: 50 * time.Microsecond,
	}
}

// ReferenceCode returns the defaults of the authors' simulator code
// (qbb-net-device.cc), for comparison: slower increase, a faster alpha.
func ReferenceCode(lineRate float64) Params {
	return Params{
		LineRate: lineRate, MinRate: 100e6,
		G: 1.0 / 16, InitialAlpha: 1,
		AlphaPeriod: 55 * time.Microsecond, Timer: 1500 * time.Microsecond, ByteCounter: 150000,
		F: 5, AI: 5e6, HAI: 50e6,
		CNPInterval: 50 * time.Microsecond,
	}
}

// Validate reports every parameter that makes no sense, one error each.
func (p *Params) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf("dcqcn: "+format, a...)) }
	if !(p.LineRate > 0) {
		bad("line rate %g b/s: must be positive", p.LineRate)
	}
	if !(p.MinRate > 0) || p.MinRate > p.LineRate {
		bad("minimum rate %g b/s: must be positive and at most the line rate %g b/s", p.MinRate, p.LineRate)
	}
	if !(p.G > 0 && p.G <= 1) {
		bad("g %g: must be in (0, 1]", p.G)
	}
	if !(p.InitialAlpha >= 0 && p.InitialAlpha <= 1) {
		bad("initial alpha %g: must be in [0, 1]", p.InitialAlpha)
	}
	if p.AlphaPeriod <= 0 {
		bad("alpha period %v: must be positive", p.AlphaPeriod)
	}
	if p.Timer <= 0 {
		bad("rate-increase timer %v: must be positive", p.Timer)
	}
	if p.ByteCounter <= 0 {
		bad("byte counter %d: must be positive", p.ByteCounter)
	}
	if p.F < 0 {
		bad("fast-recovery stages %d: must not be negative", p.F)
	}
	if !(p.AI > 0) || !(p.HAI > 0) {
		bad("rate increase steps AI %g b/s, HAI %g b/s: must be positive", p.AI, p.HAI)
	}
	if p.RateReducePeriod < 0 || p.CNPInterval < 0 {
		bad("rate-reduce period %v, CNP interval %v: must not be negative", p.RateReducePeriod, p.CNPInterval)
	}
	return errors.Join(errs...)
}

// Counters are the congestion-control counters of a device, named as
// ConnectX names them (mlx5 hw_counters), so that tools reading both
// compare like with like.
type Counters struct {
	// NPECNMarkedRoCEPackets: received RoCE packets marked CE.
	NPECNMarkedRoCEPackets uint64 `json:"np_ecn_marked_roce_packets"`
	// NPCNPSent: CNPs the notification point decided to send.
	NPCNPSent uint64 `json:"np_cnp_sent"`
	// RPCNPHandled: CNPs that cut a QP's rate.
	RPCNPHandled uint64 `json:"rp_cnp_handled"`
	// RPCNPIgnored: CNPs received and not acted on (within the rate-reduce
	// period, or for a QP without congestion control).
	RPCNPIgnored uint64 `json:"rp_cnp_ignored"`
}
