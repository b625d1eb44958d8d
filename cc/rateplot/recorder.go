package rateplot

import (
	"sync"
	"time"
)

// Recorder collects samples while a run goes, one Add per Step from a
// sampling loop, for a Plot at the end. It is safe for concurrent use.
type Recorder struct {
	mu       sync.Mutex
	step     time.Duration
	names    []string
	flows    [][]float64
	queue    []float64
	hasQueue bool
}

// NewRecorder records the rates of the named flows every step.
func NewRecorder(step time.Duration, names ...string) *Recorder {
	return &Recorder{step: step, names: names, flows: make([][]float64, len(names))}
}

// Add appends one sample: each flow's rate in bits per second, in the
// order of the names, and the bottleneck's queue in bytes (negative when
// not known: a plot of the rates alone, unless some sample knew it).
func (r *Recorder) Add(rates []float64, queue float64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range r.flows {
		v := 0.0
		if i < len(rates) {
			v = rates[i]
		}
		r.flows[i] = append(r.flows[i], v)
	}
	if queue >= 0 {
		r.hasQueue = true
	}
	r.queue = append(r.queue, max(queue, 0))
}

// Len is the number of samples so far.
func (r *Recorder) Len() int { r.mu.Lock(); defer r.mu.Unlock(); return len(r.queue) }

// Plot returns what was recorded as a Plot titled title (the caller sets
// Kmin and Kmax if it knows them).
func (r *Recorder) Plot(title string) *Plot {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := &Plot{Title: title, Step: r.step}
	for i, n := range r.names {
		p.Flows = append(p.Flows, Series{Name: n, Values: append([]float64(nil), r.flows[i]...)})
	}
	if r.hasQueue {
		p.Queue = append([]float64(nil), r.queue...)
	}
	return p
}
