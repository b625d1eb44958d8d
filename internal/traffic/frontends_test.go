package traffic_test

import (
	"bytes"
	"context"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/traffic"
	"github.com/softroce/softroce/nic/udp"
	"github.com/softroce/softroce/perf"
	"github.com/softroce/softroce/tools/perftest"
	"github.com/softroce/softroce/verbs"
)

// watch records the engine's results while f runs.
func watch(t *testing.T, f func()) []traffic.Result {
	t.Helper()
	var mu sync.Mutex
	var seen []traffic.Result
	before := traffic.Runs()
	stop := traffic.Observe(func(r traffic.Result) {
		mu.Lock()
		seen = append(seen, r)
		mu.Unlock()
	})
	f()
	stop()
	if got := traffic.Runs() - before; got != uint64(len(seen)) {
		t.Fatalf("%d runs counted, %d observed", got, len(seen))
	}
	return seen
}

// TestBothFrontEndsMeasureHere: `softroce bw` (perf) and `softroce
// perftest` (tools/perftest) print figures that are exactly the
// engine's, run for run: a front end with a loop or arithmetic of its own
// fails this.
func TestBothFrontEndsMeasureHere(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// softroce bw, both sides in this process.
	var l *perf.Local
	seen := watch(t, func() {
		var err error
		l, err = perf.RunLocal(ctx, perf.Config{Test: perf.Write, Sizes: []int{4096, 65536}, Iters: 300}, false, nil, [2]uint16{}, nil)
		if err != nil {
			t.Fatal(err)
		}
	})
	l.Close()
	if len(seen) != 2 || len(l.Report.BW) != 2 {
		t.Fatalf("bw: %d engine runs, %d rows", len(seen), len(l.Report.BW))
	}
	for i, row := range l.Report.BW {
		e := seen[i]
		if row.Iterations != e.Messages || row.Iterations != 300 || row.AvgMBps != e.Avg/traffic.MiB || row.PeakMBps != e.Peak/traffic.MiB ||
			row.MsgRateMpps != e.MsgRate/1e6 || row.Elapsed != e.Elapsed || row.TxPackets != e.Stats.TxPackets ||
			row.Retransmits != e.Stats.Retransmits || row.TxPktRateMpps != e.TxPktRate/1e6 {
			t.Fatalf("bw row %d %+v is not the engine's %+v", i, row, e)
		}
		// A 4 KiB or 64 KiB WRITE at MTU 1024 is 4 or 64 packets: the
		// counted packets cover at least the requests.
		if min := uint64(300 * row.Bytes / 1024); row.TxPackets < min {
			t.Fatalf("bw row %d: %d packets sent, want at least %d", i, row.TxPackets, min)
		}
	}

	// softroce perftest, both roles over loopback UDP.
	addr := netip.MustParseAddr("127.0.0.1")
	var devs [2]*verbs.Device
	for i := range devs {
		lk, err := udp.Open(udp.Config{Addr: addr, Port: 48231 + i, SocketBuffer: 4 << 20})
		if err != nil {
			t.Skipf("loopback UDP: %v", err)
		}
		if devs[i], err = verbs.Open(lk, nil); err != nil {
			t.Fatal(err)
		}
		defer devs[i].Close()
	}
	for i, test := range []perftest.Test{perftest.Write, perftest.Send} {
		t.Run(test.String(), func(t *testing.T) {
			var res [2]*perftest.Result
			var errs [2]error
			var outs [2]bytes.Buffer
			seen := watch(t, func() {
				var wg sync.WaitGroup
				for side := range 2 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						c := perftest.Config{Test: test, Port: 48235 + i, Size: 4096, Iters: 400, MTU: 1024,
							RemotePort: uint16(48232 - side), Timeout: 30 * time.Second}
						if side == 1 {
							c.Server = "127.0.0.1"
						}
						res[side], errs[side] = perftest.Run(ctx, devs[side], c, &outs[side])
					}()
				}
				wg.Wait()
			})
			if errs[0] != nil || errs[1] != nil {
				t.Fatalf("server: %v\n%s\nclient: %v\n%s", errs[0], &outs[0], errs[1], &outs[1])
			}
			// The active side measures; a send receiver measures too.
			measured := []*perftest.Result{res[1]}
			if test == perftest.Send {
				measured = append(measured, res[0])
			} else if res[0].Engine != nil {
				t.Fatalf("the passive side of %v ran the engine", test)
			}
			if len(seen) != len(measured) {
				t.Fatalf("%d engine runs, want %d", len(seen), len(measured))
			}
			for _, r := range measured {
				e := r.Engine
				found := false
				for _, s := range seen {
					found = found || (e != nil && s == *e)
				}
				if !found {
					t.Fatalf("result's engine figures %+v were not an engine run's (%+v)", e, seen)
				}
				if rep := r.Report; rep.Iters != uint64(e.Messages) || rep.AvgBW != e.Avg/traffic.MiB ||
					rep.PeakBW != e.Peak/traffic.MiB || rep.MsgRate != e.MsgRate/1e6 || e.Messages != 400 {
					t.Fatalf("perftest report %+v is not the engine's %+v", rep, e)
				}
			}
		})
	}
}
