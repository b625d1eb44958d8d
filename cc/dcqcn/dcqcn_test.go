package dcqcn

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func us(n float64) time.Time { return t0.Add(time.Duration(n * float64(time.Microsecond))) }

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(math.Abs(a), math.Abs(b))+1e-9 }

func TestValidate(t *testing.T) {
	tests := []struct {
		name   string
		change func(*Params)
		want   string // "" valid, else a substring of the error
	}{
		{"default", func(*Params) {}, ""},
		{"reference code", func(p *Params) { *p = ReferenceCode(10e9) }, ""},
		{"no line rate", func(p *Params) { p.LineRate = 0 }, "line rate"},
		{"min above line", func(p *Params) { p.MinRate = 20e9 }, "minimum rate"},
		{"g zero", func(p *Params) { p.G = 0 }, "g 0"},
		{"g NaN", func(p *Params) { p.G = math.NaN() }, "g NaN"},
		{"alpha above 1", func(p *Params) { p.InitialAlpha = 1.5 }, "initial alpha"},
		{"no alpha period", func(p *Params) { p.AlphaPeriod = 0 }, "alpha period"},
		{"no timer", func(p *Params) { p.Timer = 0 }, "timer"},
		{"no byte counter", func(p *Params) { p.ByteCounter = 0 }, "byte counter"},
		{"negative F", func(p *Params) { p.F = -1 }, "fast-recovery"},
		{"no AI", func(p *Params) { p.AI = 0 }, "AI 0"},
		{"negative CNP interval", func(p *Params) { p.CNPInterval = -1 }, "CNP interval"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := Default(10e9)
			tt.change(&p)
			err := p.Validate()
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("Validate: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("Validate: %v, want an error about %q", err, tt.want)
			}
		})
	}
}

// TestOnCNP follows the rate cut: alpha = (1-g)alpha + g, Rt = Rc,
// Rc = max(Rmin, Rc(1-alpha/2)).
func TestOnCNP(t *testing.T) {
	p := Default(10e9)
	p.G = 1.0 / 16
	p.InitialAlpha = 0.5
	var r RP
	r.Init(&p, t0)
	alpha, rc := 0.5, 10e9
	steps := []struct {
		at float64 // microseconds
	}{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}, {10}, {11}, {12}}
	var c Counters
	for i, s := range steps {
		if !r.OnCNP(us(s.at), &c) {
			t.Fatalf("CNP %d ignored", i)
		}
		alpha = (1-p.G)*alpha + p.G
		rt := rc
		rc = math.Max(p.MinRate, rc*(1-alpha/2))
		if !near(r.Alpha(), alpha) || !near(r.Rate(), rc) || !near(r.Target(), rt) {
			t.Fatalf("CNP %d: alpha %g rc %g rt %g, want %g %g %g", i, r.Alpha(), r.Rate(), r.Target(), alpha, rc, rt)
		}
	}
	if r.Rate() != p.MinRate {
		t.Errorf("rate %g after %d cuts, want the floor %g", r.Rate(), len(steps), p.MinRate)
	}
	if c.RPCNPHandled != uint64(len(steps)) || c.RPCNPIgnored != 0 {
		t.Errorf("counters %+v", c)
	}
}

func TestRateReducePeriod(t *testing.T) {
	p := Default(10e9)
	p.RateReducePeriod = 4 * time.Microsecond
	var r RP
	r.Init(&p, t0)
	var c Counters
	for _, tt := range []struct {
		at      float64
		handled bool
	}{{0, true}, {1, false}, {3.9, false}, {4, true}, {7, false}, {8.5, true}} {
		if got := r.OnCNP(us(tt.at), &c); got != tt.handled {
			t.Errorf("CNP at %vus: handled %v, want %v", tt.at, got, tt.handled)
		}
	}
	if c.RPCNPHandled != 3 || c.RPCNPIgnored != 3 {
		t.Errorf("counters %+v", c)
	}
}

func TestAlphaDecay(t *testing.T) {
	p := Default(10e9)
	var r RP
	r.Init(&p, t0)
	r.OnCNP(t0, nil)
	a0 := r.Alpha()
	for _, tt := range []struct {
		at      float64
		periods int
	}{{54, 0}, {55, 1}, {109, 1}, {110, 2}, {55 * 100, 100}, {55*100 + 30, 100}} {
		r.Advance(us(tt.at))
		if want := a0 * math.Pow(1-p.G, float64(tt.periods)); !near(r.Alpha(), want) {
			t.Errorf("at %vus: alpha %g, want %g (%d periods)", tt.at, r.Alpha(), want, tt.periods)
		}
	}
	// A CNP restarts the alpha period.
	r.OnCNP(us(55*100+40), nil)
	a1 := r.Alpha()
	r.Advance(us(55*100 + 40 + 54))
	if r.Alpha() != a1 {
		t.Errorf("alpha decayed %g -> %g within a period of the CNP", a1, r.Alpha())
	}
}

// TestIncrease walks the increase stages after one cut from 10 Gb/s:
// fast recovery, additive increase on the timer alone (the byte stage
// stays at 0), then hyper increase once both stages pass F.
func TestIncrease(t *testing.T) {
	p := Default(10e9)
	p.F = 2
	p.AI, p.HAI = 100e6, 500e6
	p.ByteCounter = 1000
	var r RP
	r.Init(&p, t0)
	r.OnCNP(t0, nil) // alpha 1: Rc 5G, Rt 10G
	if r.Rate() != 5e9 || r.Target() != 10e9 {
		t.Fatalf("after the cut: %g %g", r.Rate(), r.Target())
	}
	// Cut again from a lower rate so that Rt has room below line rate.
	r.Init(&p, t0)
	r.rc, r.rt = 4e9, 4e9
	r.OnCNP(t0, nil) // Rc 2G, Rt 4G
	tm := func(k int) time.Time { return t0.Add(time.Duration(k) * p.Timer) }
	steps := []struct {
		name       string
		do         func()
		rc, rt     float64
		tst, bytes int
	}{
		{"fast 1", func() { r.Advance(tm(1)) }, 3e9, 4e9, 1, 0},
		{"fast 2", func() { r.Advance(tm(2)) }, 3.5e9, 4e9, 2, 0},
		{"additive 1", func() { r.Advance(tm(3)) }, (3.5e9 + 4.1e9) / 2, 4.1e9, 3, 0},
		{"bytes, below a counter", func() { r.OnSent(tm(3), 999) }, (3.5e9 + 4.1e9) / 2, 4.1e9, 3, 0},
		// Timer stage 3 > F, byte stage 1 <= F: additive.
		{"byte event 1", func() { r.OnSent(tm(3), 1) }, ((3.5e9+4.1e9)/2 + 4.2e9) / 2, 4.2e9, 3, 1},
		{"byte events 2,3", func() { r.OnSent(tm(3), 2000) }, 0, 4.2e9 + 100e6 + 500e6, 3, 3},
		// Both stages past F: hyper, i = min(4, 3) - 2 = 1.
		{"hyper by timer", func() { r.Advance(tm(4)) }, 0, 4.8e9 + 500e6, 4, 3},
		// i = min(4, 4) - 2 = 2.
		{"hyper by bytes", func() { r.OnSent(tm(4), 1000) }, 0, 5.3e9 + 1000e6, 4, 4},
	}
	for _, s := range steps {
		s.do()
		tst, bst := r.Stages()
		if s.rc != 0 && !near(r.Rate(), s.rc) || !near(r.Target(), s.rt) || tst != s.tst || bst != s.bytes {
			t.Errorf("%s: rc %g rt %g stages %d/%d, want %g %g %d/%d", s.name, r.Rate(), r.Target(), tst, bst, s.rc, s.rt, s.tst, s.bytes)
		}
	}
	// Long enough: capped at line rate, Rc reaching it too.
	r.Advance(tm(1000))
	if r.Rate() != p.LineRate || r.Target() != p.LineRate {
		t.Errorf("after 1000 timer periods: rc %g rt %g, want line rate %g", r.Rate(), r.Target(), p.LineRate)
	}
}

// TestAdvanceLazy: the state depends on the times passed in, not on how
// often Advance is called.
func TestAdvanceLazy(t *testing.T) {
	p := Default(25e9)
	var a, b RP
	a.Init(&p, t0)
	b.Init(&p, t0)
	for i := range 3 {
		at := us(float64(i) * 7)
		a.OnCNP(at, nil)
		b.OnCNP(at, nil)
	}
	end := us(3000)
	for at := us(14); at.Before(end); at = at.Add(3 * time.Microsecond) {
		a.Advance(at)
	}
	a.Advance(end)
	b.Advance(end)
	at, ab := a.Stages()
	bt, bb := b.Stages()
	if !near(a.Rate(), b.Rate()) || !near(a.Target(), b.Target()) || !near(a.Alpha(), b.Alpha()) || at != bt || ab != bb {
		t.Errorf("stepped: %g %g %g %d/%d; one call: %g %g %g %d/%d",
			a.Rate(), a.Target(), a.Alpha(), at, ab, b.Rate(), b.Target(), b.Alpha(), bt, bb)
	}
}

// TestAdvanceIdle: a QP idle for an hour catches up at once, at line rate
// (the closed form for events past maxCatchUp), and an idle spell just
// past maxCatchUp lands where stepping would, within one AI step.
func TestAdvanceIdle(t *testing.T) {
	p := ReferenceCode(100e9) // slow AI: 20000 events from the floor to line rate
	var r RP
	r.Init(&p, t0)
	for i := range 40 {
		r.OnCNP(us(float64(i)), nil)
	}
	if r.Rate() != p.MinRate {
		t.Fatalf("rate %g, want the floor", r.Rate())
	}
	r.Advance(t0.Add(time.Hour))
	if r.Rate() != p.LineRate {
		t.Errorf("after an hour idle: %g, want %g", r.Rate(), p.LineRate)
	}
	var a, b RP
	a.Init(&p, t0)
	b.Init(&p, t0)
	a.OnCNP(t0, nil)
	b.OnCNP(t0, nil)
	n := maxCatchUp + 500
	for k := 1; k <= n; k++ {
		a.Advance(t0.Add(time.Duration(k) * p.Timer))
	}
	b.Advance(t0.Add(time.Duration(n) * p.Timer))
	if math.Abs(a.Target()-b.Target()) > 1 || math.Abs(a.Rate()-b.Rate()) > p.AI {
		t.Errorf("stepped rc %g rt %g; closed form rc %g rt %g", a.Rate(), a.Target(), b.Rate(), b.Target())
	}
}

func TestPacer(t *testing.T) {
	var p Pacer
	p.Init(t0, 8e9, 3000) // one byte per nanosecond
	ns := func(n int) time.Time { return t0.Add(time.Duration(n)) }
	steps := []struct {
		at, want, grant int
		next            int // ns after t0
	}{
		{0, 2000, 2000, 0},    // from the full bucket: 1000 left
		{0, 4000, 4000, 3001}, // credit positive: granted whole, now owes 3000
		{10, 100, 0, 3001},    // owes 2990
		{3000, 100, 0, 3001},  // credit exactly 0: not positive
		{3001, 1500, 1500, 4501},
		{100000, 10000, 10000, 107001}, // refilled to the burst (3000), not more
	}
	for i, s := range steps {
		g, next := p.Allow(ns(s.at), s.want)
		if g != s.grant || !next.Equal(ns(s.next)) {
			t.Errorf("step %d: Allow(%d ns, %d) = %d, +%v; want %d, +%dns", i, s.at, s.want, g, next.Sub(t0), s.grant, s.next)
		}
	}
}

func TestPacerAllowN(t *testing.T) {
	var p Pacer
	p.Init(t0, 8e9, 4096)
	k, next := p.AllowN(t0, 1024, 10) // 4 packets fit the credit exactly
	if k != 4 || !next.Equal(t0.Add(1)) {
		t.Errorf("AllowN = %d, %v; want 4, t0+1ns", k, next.Sub(t0))
	}
	p.SetRate(t0.Add(100), 16e9) // 100 bytes earned at 1 B/ns, then 2 B/ns
	k, next = p.AllowN(t0.Add(200), 1000, 10)
	if k != 1 || !next.Equal(t0.Add(200+350+1)) { // credit 300, then -700: paid in 350 ns
		t.Errorf("AllowN = %d, +%v; want 1, +551ns", k, next.Sub(t0))
	}
	// The long-run rate is the configured one, whatever the batch size.
	p.Init(t0, 10e9, 8192)
	sent, now := 0, t0
	for now.Before(t0.Add(time.Millisecond)) {
		k, next := p.AllowN(now, 1500, 7)
		sent += k * 1500
		now = next
	}
	if got := float64(sent-8192) * 8 / 1e-3; math.Abs(got-10e9) > 10e9*0.01 {
		t.Errorf("paced %g b/s, want 10e9", got)
	}
}

// TestPacerReadySpend: Ready and Spend, asked per packet, grant what
// Allow grants.
func TestPacerReadySpend(t *testing.T) {
	var a, b Pacer
	a.Init(t0, 8e9, 3000)
	b.Init(t0, 8e9, 3000)
	for i, at := range []int{0, 0, 10, 3000, 3001, 3002, 100000} {
		now := t0.Add(time.Duration(at))
		g, na := a.Allow(now, 2000)
		ok, nb := b.Ready(now)
		if ok {
			b.Spend(2000)
			_, nb = b.Ready(now)
		}
		if ok != (g == 2000) || !na.Equal(nb) {
			t.Errorf("step %d at %d ns: Allow %d next +%v; Ready %v next +%v", i, at, g, na.Sub(t0), ok, nb.Sub(t0))
		}
	}
}

// TestPacerNoAlloc: pacing and rate updates allocate nothing.
func TestPacerNoAlloc(t *testing.T) {
	prm := Default(10e9)
	var r RP
	var p Pacer
	var np NP
	var c Counters
	r.Init(&prm, t0)
	p.Init(t0, r.Rate(), 16384)
	now := t0
	n := testing.AllocsPerRun(1000, func() {
		now = now.Add(700 * time.Nanosecond)
		if np.OnMarked(now, prm.CNPInterval, &c) {
			r.OnCNP(now, &c)
		}
		r.OnSent(now, 1024)
		p.SetRate(now, r.Rate())
		p.Allow(now, 1024)
	})
	if n != 0 {
		t.Errorf("%v allocations per packet", n)
	}
}

func TestNP(t *testing.T) {
	var np NP
	var c Counters
	iv := 50 * time.Microsecond
	for _, s := range []struct {
		at   float64
		send bool
	}{{0, true}, {10, false}, {49.9, false}, {50, true}, {60, false}, {200, true}} {
		if got := np.OnMarked(us(s.at), iv, &c); got != s.send {
			t.Errorf("marked at %vus: send %v, want %v", s.at, got, s.send)
		}
	}
	if c.NPECNMarkedRoCEPackets != 6 || c.NPCNPSent != 3 {
		t.Errorf("counters %+v", c)
	}
	// Interval 0: a CNP per marked packet.
	var np0 NP
	if !np0.OnMarked(t0, 0, nil) || !np0.OnMarked(t0, 0, nil) {
		t.Error("interval 0 suppressed a CNP")
	}
}

func TestNPTable(t *testing.T) {
	tb := NPTable[uint32]{Interval: 50 * time.Microsecond, Max: 100}
	var c Counters
	for _, s := range []struct {
		at   float64
		qp   uint32
		send bool
	}{{0, 1, true}, {1, 2, true}, {2, 1, false}, {49, 2, false}, {50, 1, true}, {51, 2, true}, {52, 3, true}} {
		if got := tb.OnMarked(us(s.at), s.qp, &c); got != s.send {
			t.Errorf("QP %d at %vus: send %v, want %v", s.qp, s.at, got, s.send)
		}
	}
	// Many QPs marked once: the table forgets them an interval later.
	for qp := range uint32(1000) {
		tb.OnMarked(us(1000+float64(qp)/100), qp+10, nil)
	}
	if tb.Len() != 100 {
		t.Errorf("%d keys held, want the bound 100", tb.Len())
	}
	tb.OnMarked(us(2000), 5, nil)
	if tb.Len() != 1 {
		t.Errorf("%d keys after a quiet interval, want 1", tb.Len())
	}
}

func TestCountersJSON(t *testing.T) {
	b, err := json.Marshal(Counters{1, 2, 3, 4})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"np_ecn_marked_roce_packets":1,"np_cnp_sent":2,"rp_cnp_handled":3,"rp_cnp_ignored":4}`
	if string(b) != want {
		t.Errorf("%s, want %s", b, want)
	}
}
