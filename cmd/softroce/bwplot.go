package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/softroce/softroce/cc/rateplot"
	"github.com/softroce/softroce/nic/congest"
	"github.com/softroce/softroce/verbs"
)

// plotStep is how often bw --plot samples the QPs' rates.
const plotStep = 2 * time.Millisecond

// plotFormat is the rateplot format a --plot file's name asks for.
func plotFormat(file string) (string, bool) {
	switch strings.ToLower(filepath.Ext(file)) {
	case ".html", ".htm":
		return "html", true
	case ".svg":
		return "svg", true
	}
	return "", false
}

// plotRecorder samples the client's QPs' DCQCN rates, and the --congest
// queue when there is one, every plotStep while bw runs (bw --plot). A
// nil *plotRecorder does nothing.
type plotRecorder struct {
	file, format string
	link         atomic.Pointer[congest.Link] // the --congest bottleneck, if any
	qps          int
	rec          *rateplot.Recorder
	done         chan struct{}
	wg           sync.WaitGroup
}

// start is perf.Config.Started: it samples qps until stop.
func (r *plotRecorder) start(qps []*verbs.QP) {
	names := make([]string, len(qps))
	for i, q := range qps {
		names[i] = fmt.Sprintf("QP %d", q.Num())
	}
	r.qps, r.rec, r.done = len(qps), rateplot.NewRecorder(plotStep, names...), make(chan struct{})
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		t := time.NewTicker(plotStep)
		defer t.Stop()
		rates := make([]float64, len(qps))
		for {
			select {
			case <-r.done:
				return
			case <-t.C:
			}
			for i, q := range qps {
				rates[i] = q.Stats().CC.RateBPS
			}
			queue := -1.0
			if l := r.link.Load(); l != nil {
				queue = float64(l.QueueLen())
			}
			r.rec.Add(rates, queue)
		}
	}()
}

func (r *plotRecorder) stop() {
	if r == nil || r.done == nil {
		return
	}
	close(r.done)
	r.wg.Wait()
}

// write draws what was recorded; it returns bw's exit code on failure.
func (r *plotRecorder) write(kind string) int {
	if r == nil {
		return 0
	}
	if r.rec == nil || r.rec.Len() < 2 {
		fmt.Fprintf(os.Stderr, "softroce %s: --plot %s: the run was too short to sample (give -D SECONDS or more -n)\n", kind, r.file)
		return 1
	}
	title := fmt.Sprintf("softroce %s --cc dcqcn: %d QP(s)", kind, r.qps)
	p := r.rec.Plot("")
	if l := r.link.Load(); l != nil {
		c := l.Config()
		title += fmt.Sprintf(", bottleneck %g Mb/s, queue %d KB, marks %d-%d KB", c.Rate/1e6, c.Queue/1000, c.Kmin/1000, c.Kmax/1000)
		p.Kmin, p.Kmax = float64(c.Kmin), float64(c.Kmax)
	}
	p.Title = title
	f, err := os.Create(r.file)
	if err == nil {
		err = rateplot.Write(f, p, r.format)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "softroce %s: --plot: %v\n", kind, err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "softroce %s: rates of %d QP(s), %d samples every %v, drawn in %s\n", kind, r.qps, r.rec.Len(), plotStep, r.file)
	return 0
}
