package enginetest

import (
	"testing"
	"time"

	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/icrc"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/qpstate"
	"github.com/softroce/softroce/transport/engine"
	"github.com/softroce/softroce/wr"
	"golang.org/x/sys/unix"
)

// Wire connects two engines back to back without copying: what one
// engine's Progress returns is handed straight to the other's Receive.
// It is the in-process link for benchmarks: no loss, no allocation. With
// ICRC set (NewWire's default) it does what a UDP link does to every
// packet: computes the ICRC over the IPv4/UDP header a kernel socket
// would send, and on the other side computes it again and compares
// before it marks the packet ICRCVerified; a mismatch fails the test.
// Without it packets are marked verified unchecked, which measures the
// engines alone.
type Wire struct {
	EP   [2]*EP
	Now  time.Time
	Type qpstate.Type // service of the QPs Connect makes (zero: RC)
	ICRC bool
	// Moved counts the packets carried from each endpoint.
	Moved [2]int
	// Tap, if set, sees every packet as it crosses, after its ICRC is in.
	Tap func(from int, p *nic.Packet)

	tb   testing.TB
	addr [2][4]byte
}

// NewWire is a Wire between two new endpoints, computing and checking
// the ICRC.
func NewWire(tb testing.TB) *Wire {
	s := NewSim(tb, 1, Impairment{})
	w := &Wire{tb: tb, EP: s.EP, Now: Epoch, ICRC: true}
	for i := range w.addr {
		w.addr[i] = s.EP[i].Addr.As4()
	}
	return w
}

// Sim is a Sim on the wire's endpoints, to make QPs with; the wire, not
// the Sim, carries their packets.
func (w *Wire) Sim(tb testing.TB) *Sim {
	return &Sim{T: tb, EP: w.EP, Now: w.Now}
}

// Connect makes n connected pairs of QPs of the wire's service.
func (w *Wire) Connect(tb testing.TB, n, pmtu, depth int) [][2]*engine.QP {
	s := w.Sim(tb)
	var out [][2]*engine.QP
	for i := 0; i < n; i++ {
		out = append(out, s.Connect(QPOpts{Type: w.Type, PMTU: pmtu, Timeout: 14, Retry: 7, RNRRetry: 7, Depth: depth, MaxRD: 16}))
	}
	return out
}

// header is the IPv4/UDP header a packet from ep[from] travels with.
func (w *Wire) header(from int, sport uint16) icrc.Header {
	return icrc.Header{Src: w.addr[from][:], Dst: w.addr[1-from][:], DF: true, SrcPort: sport, DstPort: nic.RoCEv2Port}
}

// Step moves every pending packet once in each direction and returns how
// many it moved.
func (w *Wire) Step() int {
	w.Now = w.Now.Add(time.Microsecond)
	moved := 0
	for i := 0; i < 2; i++ {
		for {
			out, more := w.EP[i].E.Progress(w.Now)
			for j := range out {
				p := out[j].Bytes()
				if w.ICRC {
					h := w.header(i, out[j].SrcPort)
					crc, err := icrc.Synth(&h, p) // sender
					if err != nil {
						w.tb.Fatalf("engine %d sent a %d-byte packet: %v", i, len(p), err)
					}
					icrc.Put(p, crc)
					if got, _ := icrc.Synth(&h, p); got != icrc.Wire(p) { // receiver
						w.tb.Fatalf("ICRC %08x, computed %08x", icrc.Wire(p), got)
					}
				}
				out[j].ICRC = nic.ICRCVerified
				out[j].Remote = engine.Remote(w.EP[i].Addr)
				if w.Tap != nil {
					w.Tap(i, &out[j])
				}
			}
			if len(out) > 0 {
				w.EP[1-i].E.Receive(w.Now, out)
			}
			moved += len(out)
			w.Moved[i] += len(out)
			w.EP[i].E.Release(out)
			if !more {
				break
			}
		}
	}
	return moved
}

// WithICRC runs f twice, labelled: icrc=on, the wire computing and
// checking every packet's ICRC as a link does, and icrc=off, the engines
// alone.
func WithICRC(b *testing.B, f func(b *testing.B, icrc bool)) {
	b.Run("icrc=on", func(b *testing.B) { f(b, true) })
	b.Run("icrc=off", func(b *testing.B) { f(b, false) })
}

// processCPU is the CPU time the process has used.
func processCPU() time.Duration {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_PROCESS_CPUTIME_ID, &ts) != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

// Rates measures a benchmark's loop: start it after ResetTimer, report
// when the loop is done.
type Rates struct {
	wall time.Time
	cpu  time.Duration
}

// StartRates starts measuring what w carries.
func StartRates(w *Wire) Rates {
	w.Moved = [2]int{}
	return Rates{time.Now(), processCPU()}
}

// Report reports what the wire carried: messages (n) and packets counted
// as they crossed, all of them (pkt/s, both directions) and those from
// endpoint 0, the requester (req-pkt/s), per second of wall time; and
// the process's CPU time per packet (cpu-ns/pkt), which other load on
// the machine does not inflate.
func (r Rates) Report(b *testing.B, w *Wire, n int) {
	sec := time.Since(r.wall).Seconds()
	cpu := processCPU() - r.cpu
	pkts := w.Moved[0] + w.Moved[1]
	b.ReportMetric(float64(n)/sec, "msg/s")
	b.ReportMetric(float64(pkts)/sec, "pkt/s")
	b.ReportMetric(float64(w.Moved[0])/sec, "req-pkt/s")
	if pkts > 0 {
		b.ReportMetric(float64(cpu.Nanoseconds())/float64(pkts), "cpu-ns/pkt")
	}
}

// BenchService runs op of size bytes over nqp pairs of QPs of service
// typ at the given PMTU, each pair keeping half its send queue in flight;
// checkICRC sets Wire.ICRC.
func BenchService(b *testing.B, typ qpstate.Type, nqp int, op wr.Opcode, size, pmtu int, checkICRC bool) {
	w := NewWire(b)
	w.Type = typ
	w.ICRC = checkICRC
	const depth = 128
	pairs := w.Connect(b, nqp, pmtu, depth)
	lbuf := make([]byte, size)
	rbuf := make([]byte, size)
	lmr, _ := w.EP[0].MRs.RegMR(w.EP[0].PD, lbuf, AllAccess)
	rmr, _ := w.EP[1].MRs.RegMR(w.EP[1].PD, rbuf, AllAccess)
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
	r := StartRates(w)
	for done < b.N {
		post()
		if w.Step() == 0 && done < posted {
			b.Fatalf("stalled with %d of %d done", done, posted)
		}
		for {
			n := w.EP[0].SCQ.Poll(wcs)
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
		w.EP[1].RCQ.Poll(wcs)
		for w.EP[1].RCQ.Poll(wcs) > 0 {
		}
	}
	r.Report(b, w, b.N)
}
