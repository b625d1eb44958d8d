package congest

import (
	"math"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func ns(n int) time.Time { return t0.Add(time.Duration(n)) }

func TestParse(t *testing.T) {
	tests := []struct {
		in   string
		want Config
		err  string
	}{
		{"rate=10G", Config{Rate: 10e9}, ""},
		{"rate=2.5Gbit,queue=1MiB,kmin=40KB,kmax=200KB,pmax=20%,seed=7",
			Config{Rate: 2.5e9, Queue: 1 << 20, Kmin: 40000, Kmax: 200000, Pmax: 0.2, Seed: 7}, ""},
		{" rate = 100Mbit , kmin=5KiB, kmax=10KiB, pmax=0.01 ", Config{Rate: 100e6, Kmin: 5120, Kmax: 10240, Pmax: 0.01}, ""},
		{"rate=1e9,queue=65536B", Config{Rate: 1e9, Queue: 65536}, ""},
		{"", Config{}, "rate 0"},
		{"rate=fast", Config{}, "positive rate"},
		{"rate=1G,kmin=10KB,kmax=5KB,pmax=1", Config{}, "kmin 10000, kmax 5000"},
		{"rate=1G,kmax=5KB", Config{}, "pmax 0"},
		{"rate=1G,pmax=150%", Config{}, "probability"},
		{"rate=1G,queue=-1", Config{}, "size in bytes"},
		{"rate=1G,loss=1%", Config{}, "unknown key"},
		{"rate", Config{}, "key=value"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			c, err := Parse(tt.in)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Errorf("Parse(%q) = %+v, %v; want an error containing %q", tt.in, c, err, tt.err)
				}
				return
			}
			if err != nil || c != tt.want {
				t.Fatalf("Parse(%q) = %+v, %v; want %+v", tt.in, c, err, tt.want)
			}
			back, err := Parse(c.String())
			if err != nil || back != c {
				t.Errorf("round trip through %q: %+v, %v", c.String(), back, err)
			}
		})
	}
}

// TestEnqueue offers packets back to back at one instant to a 1 B/ns
// bottleneck (so the queue a packet finds is the bytes offered before
// it) with Kmin 2000 and Kmax 4000; Pmax 1e-9 makes marking between the
// thresholds practically never happen, so every verdict is exact.
func TestEnqueue(t *testing.T) {
	q := NewQueue(Config{Rate: 8e9, Queue: 6500, Kmin: 2000, Kmax: 4000, Pmax: 1e-9, Seed: 1})
	steps := []struct {
		name    string
		at      int // ns
		size    int
		tc      uint8
		v       Verdict
		out     uint8
		departs int // ns
		qlen    int // queue found
	}{
		{"empty", 0, 1000, ECT0, Passed, ECT0, 1000, 0},
		{"below kmin", 0, 1000, ECT1, Passed, ECT1, 2000, 1000},
		{"at kmin: no mark", 0, 1000, NotECT, Passed, NotECT, 3000, 2000},
		{"between, not ECT passes", 0, 1000, NotECT, Passed, NotECT, 4000, 3000},
		{"at kmax, not ECT: RED drop", 0, 500, NotECT, Dropped, NotECT, 0, 4000},
		{"at kmax, ECT(0): marked", 0, 500, 26<<2 | ECT0, Marked, 26<<2 | CE, 4500, 4000},
		{"above kmax, already CE: passes", 0, 500, CE, Passed, CE, 5000, 4500},
		{"above kmax, ECT(1): marked", 0, 1000, ECT1, Marked, CE, 6000, 5000},
		{"full: tail drop", 0, 501, ECT0, Dropped, ECT0, 0, 6000},
		{"fits exactly", 0, 500, ECT0, Marked, CE, 6500, 6000},
		{"drained to 1500 (kmin): passes", 5000, 1000, ECT0, Passed, ECT0, 7500, 1500},
		{"idle: starts now", 9000, 100, ECT0, Passed, ECT0, 9100, 0},
	}
	for _, s := range steps {
		if got := q.Len(ns(s.at)); got != s.qlen {
			t.Errorf("%s: queue %d bytes, want %d", s.name, got, s.qlen)
		}
		v, out, departs := q.Enqueue(ns(s.at), s.size, s.tc)
		if v != s.v || out != s.out || (s.departs != 0 && !departs.Equal(ns(s.departs))) {
			t.Errorf("%s: %v tclass %#x departs +%v; want %v %#x +%dns", s.name, v, out, departs.Sub(t0), s.v, s.out, s.departs)
		}
	}
	c := q.Counters()
	want := Counters{Enqueued: 10, Marked: 3, Dropped: 2, DroppedFull: 1, DroppedRED: 1, MaxQueue: 6500}
	if c != want {
		t.Errorf("counters %+v, want %+v", c, want)
	}
}

// TestMarkProbability holds the queue at a fixed length between the
// thresholds (one packet in per packet out) and checks the marked share
// against RED's line: Pmax (q-Kmin)/(Kmax-Kmin).
func TestMarkProbability(t *testing.T) {
	tests := []struct {
		qlen int
		pmax float64
		want float64
	}{
		{10000, 1, 0},
		{30000, 0.5, 0.25},
		{45000, 0.2, 0.175},
		{25000, 1, 0.375},
	}
	for _, tt := range tests {
		q := NewQueue(Config{Rate: 8e9, Kmin: 10000, Kmax: 50000, Pmax: tt.pmax, Seed: 42})
		// Fill at one instant to qlen plus the packet that leaves before
		// the first arrival (marking is not drawn for non-ECT packets).
		for q.Len(t0) < tt.qlen+1000 {
			q.Enqueue(t0, min(1000, tt.qlen+1000-q.Len(t0)), NotECT)
		}
		const n = 20000
		marked := 0
		for i := 1; i <= n; i++ {
			// One 1000-byte packet left each microsecond: the queue found is qlen.
			if v, _, _ := q.Enqueue(t0.Add(time.Duration(i)*time.Microsecond), 1000, ECT0); v == Marked {
				marked++
			}
		}
		got := float64(marked) / n
		if math.Abs(got-tt.want) > 0.01 {
			t.Errorf("queue %d, pmax %g: marked %.3f, want %.3f", tt.qlen, tt.pmax, got, tt.want)
		}
	}
}

// TestSeedRepeats: the same seed and arrivals give the same marks.
func TestSeedRepeats(t *testing.T) {
	run := func(seed uint64) []Verdict {
		q := NewQueue(Config{Rate: 1e9, Kmin: 1000, Kmax: 100000, Pmax: 0.5, Seed: seed})
		var vs []Verdict
		for i := range 2000 {
			v, _, _ := q.Enqueue(ns(i*100), 1000, ECT0)
			vs = append(vs, v)
		}
		return vs
	}
	a, b, c := run(3), run(3), run(4)
	if strings.Compare(verdicts(a), verdicts(b)) != 0 {
		t.Error("seed 3 gave different marks twice")
	}
	if verdicts(a) == verdicts(c) {
		t.Error("seeds 3 and 4 gave the same marks")
	}
}

func verdicts(vs []Verdict) string {
	b := make([]byte, len(vs))
	for i, v := range vs {
		b[i] = byte('0' + v)
	}
	return string(b)
}
