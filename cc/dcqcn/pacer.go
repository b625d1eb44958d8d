package dcqcn

import (
	"math"
	"time"
)

// Pacer is a token bucket on injected time that turns a QP's rate into
// send times. It never sleeps and never allocates: Allow says how much may
// go now and when the next may, and the caller (the engine's driver) arms
// its own timer for that time. The zero Pacer is unusable; Init it.
//
// Credit accrues at the rate up to Burst bytes. A request is granted
// whole while the credit is positive, and the credit may go negative by
// that request: packets are never split, the long-run rate is exact, and
// a burst exceeds Burst by at most one request.
type Pacer struct {
	bps    float64 // rate, bits per second
	burst  float64 // bytes
	credit float64 // bytes; negative: owed
	at     time.Time
}

// Init sets the rate (bits per second) and burst (bytes) at time now and
// starts with a full bucket.
func (p *Pacer) Init(now time.Time, bps float64, burst int) {
	*p = Pacer{bps: bps, burst: float64(burst), credit: float64(burst), at: now}
}

// Rate returns the rate in bits per second.
func (p *Pacer) Rate() float64 { return p.bps }

// SetRate changes the rate from now on; credit earned so far is kept.
func (p *Pacer) SetRate(now time.Time, bps float64) {
	p.refill(now)
	p.bps = bps
}

func (p *Pacer) refill(now time.Time) {
	if d := now.Sub(p.at); d > 0 {
		p.credit = min(p.burst, p.credit+p.bps/8*d.Seconds())
		p.at = now
	}
}

// Allow asks to send want bytes (one packet or a batch) at now. It grants
// all of them (grant = want) while the bucket has credit, else none
// (grant = 0). next is the earliest time another Allow can grant: now if
// credit remains, otherwise when the debt is paid.
func (p *Pacer) Allow(now time.Time, want int) (grant int, next time.Time) {
	p.refill(now)
	if p.credit > 0 {
		p.credit -= float64(want)
		grant = want
	}
	return grant, p.ready(now)
}

// AllowN asks to send up to n packets of size bytes each and grants the
// first k that may go now (each while credit remains), debiting them. next
// is as for Allow.
func (p *Pacer) AllowN(now time.Time, size, n int) (k int, next time.Time) {
	p.refill(now)
	if p.credit > 0 && n > 0 && size > 0 {
		k = min(n, int(math.Ceil(p.credit/float64(size))))
		p.credit -= float64(k * size)
	} else if p.credit > 0 && n > 0 {
		k = n
	}
	return k, p.ready(now)
}

// ready is the time the credit turns positive again.
func (p *Pacer) ready(now time.Time) time.Time {
	if p.credit > 0 {
		return now
	}
	if p.bps <= 0 {
		return time.Time{} // never: the caller sees a zero time
	}
	// The credit must exceed zero: one nanosecond past the exact time.
	ns := math.Floor(-p.credit*8/p.bps*1e9) + 1
	return now.Add(time.Duration(ns))
}

// Ready reports whether a packet may leave at now (the credit is
// positive) and, if not, when it may. It debits nothing: the caller,
// which learns a packet's size only once it has built it, charges it with
// Spend. Together they grant what Allow grants.
func (p *Pacer) Ready(now time.Time) (ok bool, next time.Time) {
	p.refill(now)
	return p.credit > 0, p.ready(now)
}

// Spend debits n bytes sent.
func (p *Pacer) Spend(n int) { p.credit -= float64(n) }
