package cases

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"
)

// expectVerdict asserts the documented behaviour of a target: a pass where
// no deviation is documented, the deviation where one is.
func expectVerdict(t *testing.T, c *Case, r *Result) {
	t.Helper()
	want := VerdictPass
	switch {
	case c.Known[r.Target] != "":
		want = VerdictDeviation
	case c.Bugs[r.Target] != "":
		// A known bug is expected to fail; once it is fixed the case passes
		// and the entry should go (logged, not failed, so that a fix in the
		// transport does not break this package's tests).
		if r.Verdict == VerdictPass {
			t.Logf("known %s bug no longer reproduces (remove it from Case.Bugs): %s", r.Target, c.Bugs[r.Target])
			return
		}
		want = VerdictFail
		t.Logf("known %s bug: %s", r.Target, c.Bugs[r.Target])
	}
	if r.Verdict != want {
		t.Errorf("%s on %s: verdict %s, want %s\nobserved: %s\nfailures: %s\nerror: %s\nnotes: %s\ntrace:\n  %s",
			c.ID, r.Target, r.Verdict, want, r.Observed, strings.Join(r.Failures, "; "), r.Error,
			strings.Join(r.Notes, "; "), strings.Join(r.Trace, "\n  "))
	}
}

// TestSoftroceResponder runs every case against softroce's own transport
// over an in-process pipe (no privileges needed). Cases mostly wait for
// answers or silence, so eight run at a time, each on a device of its own.
// They are started from eight goroutines rather than with t.Parallel,
// which would allow only GOMAXPROCS at a time: waiting needs no CPU.
func TestSoftroceResponder(t *testing.T) {
	next := make(chan *Case)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c := range next {
				t.Run(c.ID, func(t *testing.T) { runSoftroce(t, c) })
			}
		}()
	}
	for _, c := range All {
		next <- c
	}
	close(next)
	wg.Wait()
}

// runSoftroce runs c on a softroce device of its own.
func runSoftroce(t *testing.T, c *Case) {
	tgt, err := NewSoftroceTarget()
	if err != nil {
		t.Fatal(err)
	}
	defer tgt.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r := Run(ctx, tgt, c)
	t.Logf("%s: %s (%s)", r.Verdict, r.Observed, strings.Join(r.Notes, "; "))
	expectVerdict(t, c, r)
}

// TestRxe runs every case against kernel rdma_rxe and asserts the
// behaviour docs/rxe-behaviour.md documents: a pass where rxe follows the
// spec, the labelled deviation where it does not.
func TestRxe(t *testing.T) {
	if rxeTarget == nil {
		t.Skip("no rdma_rxe VM: set SOFTROCE_RXE=1 and run as root")
	}
	for _, c := range All {
		t.Run(c.ID, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			r := Run(ctx, rxeTarget, c)
			t.Logf("%s: %s (%s)", r.Verdict, r.Observed, strings.Join(r.Notes, "; "))
			expectVerdict(t, c, r)
		})
	}
}
