package rc

import (
	"fmt"
	"testing"
	"time"

	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/memreg"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/qpstate"
	"github.com/softroce/softroce/wr"
)

// wire connects two engines back to back without copying: what one
// engine's Progress returns is handed straight to the other's Receive.
// It is the in-process link for benchmarks: no loss, no allocation.
type wire struct {
	ep  [2]*simEP
	now time.Time
	typ qpstate.Type // service of the QPs connect makes (zero: RC)
}

func newWire(tb testing.TB) *wire {
	s := newSim(tb, 1, impairment{})
	return &wire{ep: s.ep, now: simEpoch}
}

func (w *wire) connect(tb testing.TB, n, pmtu, depth int) [][2]*QP {
	s := &sim{t: tb, ep: w.ep, now: w.now}
	var out [][2]*QP
	for i := 0; i < n; i++ {
		out = append(out, s.connect(qpOpts{typ: w.typ, pmtu: pmtu, timeout: 14, retry: 7, rnrRetry: 7, depth: depth, maxRD: 16}))
	}
	return out
}

// step moves every pending packet once in each direction.
func (w *wire) step() int {
	w.now = w.now.Add(time.Microsecond)
	moved := 0
	for i := 0; i < 2; i++ {
		for {
			out, more := w.ep[i].e.Progress(w.now)
			for j := range out {
				out[j].ICRC = nic.ICRCVerified
				out[j].Remote = Remote(w.ep[i].addr)
			}
			if len(out) > 0 {
				w.ep[1-i].e.Receive(w.now, out)
			}
			moved += len(out)
			w.ep[i].e.Release(out)
			if !more {
				break
			}
		}
	}
	return moved
}

func benchmarkOp(b *testing.B, nqp int, op wr.Opcode, size, pmtu int) {
	benchmarkService(b, qpstate.RC, nqp, op, size, pmtu)
}

// benchmarkService runs op over QPs of service typ.
func benchmarkService(b *testing.B, typ qpstate.Type, nqp int, op wr.Opcode, size, pmtu int) {
	w := newWire(b)
	w.typ = typ
	const depth = 128
	pairs := w.connect(b, nqp, pmtu, depth)
	lbuf := make([]byte, size)
	rbuf := make([]byte, size)
	lmr, _ := w.ep[0].mrs.RegMR(w.ep[0].pd, lbuf, allAccess)
	rmr, _ := w.ep[1].mrs.RegMR(w.ep[1].pd, rbuf, allAccess)
	swr := wr.SendWR{Opcode: op, Flags: wr.Signaled, SGL: []wr.SGE{{Addr: lmr.Addr(), Length: uint32(size), LKey: lmr.LKey()}},
		RemoteAddr: rmr.Addr(), RKey: rmr.RKey()}
	rwr := wr.RecvWR{SGL: []wr.SGE{{Addr: rmr.Addr(), Length: uint32(size), LKey: rmr.LKey()}}}
	wcs := make([]cq.WC, 256)
	posted, done := 0, 0
	inflight := make([]int, nqp)
	post := func() {
		for q := range pairs {
			for inflight[q] < depth/2 && posted < b.N {
				if op.IsSend() {
					if err := pairs[q][1].PostRecv(&rwr); err != nil {
						b.Fatal(err)
					}
				}
				if err := pairs[q][0].PostSend(&swr); err != nil {
					b.Fatal(err)
				}
				inflight[q]++
				posted++
			}
		}
	}
	qidx := map[uint32]int{}
	for i, p := range pairs {
		qidx[p[0].Num()] = i
	}
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for done < b.N {
		post()
		if w.step() == 0 && done < posted {
			b.Fatalf("stalled with %d of %d done", done, posted)
		}
		for {
			n := w.ep[0].scq.Poll(wcs)
			for _, wc := range wcs[:n] {
				if wc.Status != cq.Success {
					b.Fatalf("completion %v", wc.Status)
				}
				inflight[qidx[wc.QPNum]]--
			}
			done += n
			if n < len(wcs) {
				break
			}
		}
		w.ep[1].rcq.Poll(wcs)
		for w.ep[1].rcq.Poll(wcs) > 0 {
		}
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msg/s")
}

func BenchmarkSend64(b *testing.B) {
	for _, n := range []int{1, 16} {
		b.Run(fmt.Sprintf("qps=%d", n), func(b *testing.B) { benchmarkOp(b, n, wr.Send, 64, 4096) })
	}
}

func BenchmarkWrite64K(b *testing.B) {
	for _, n := range []int{1, 16} {
		b.Run(fmt.Sprintf("qps=%d", n), func(b *testing.B) { benchmarkOp(b, n, wr.RDMAWrite, 64<<10, 4096) })
	}
}

func BenchmarkRead64K(b *testing.B) { benchmarkOp(b, 1, wr.RDMARead, 64<<10, 4096) }

// TestSteadyStateNoAlloc: once buffers are warm, moving WRITE traffic
// allocates nothing per packet.
func TestSteadyStateNoAlloc(t *testing.T) {
	w := newWire(t)
	pairs := w.connect(t, 1, 1024, 64)
	buf := make([]byte, 8192)
	lmr, _ := w.ep[0].mrs.RegMR(w.ep[0].pd, buf, allAccess)
	rmr, _ := w.ep[1].mrs.RegMR(w.ep[1].pd, make([]byte, 8192), allAccess)
	swr := wr.SendWR{Opcode: wr.RDMAWrite, Flags: wr.Signaled, SGL: []wr.SGE{{Addr: lmr.Addr(), Length: 8192, LKey: lmr.LKey()}}, RemoteAddr: rmr.Addr(), RKey: rmr.RKey()}
	wcs := make([]cq.WC, 8)
	round := func() {
		for i := 0; i < 4; i++ {
			if err := pairs[0][0].PostSend(&swr); err != nil {
				t.Fatal(err)
			}
		}
		for got := 0; got < 4; {
			w.step()
			got += w.ep[0].scq.Poll(wcs)
		}
	}
	for i := 0; i < 10; i++ {
		round() // warm up buffer pools and slices
	}
	if a := testing.AllocsPerRun(50, round); a != 0 {
		t.Fatalf("%.1f allocations per round of 4 x 8 KiB WRITEs (32 packets + ACKs), want 0", a)
	}
}

var _ = qpstate.RTS
var _ = memreg.AccessLocalWrite
