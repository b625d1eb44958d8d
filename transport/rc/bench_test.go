package rc

import (
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/icrc"
	"github.com/softroce/softroce/memreg"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/qpstate"
	"github.com/softroce/softroce/transport/engine"
	"github.com/softroce/softroce/wr"
	"golang.org/x/sys/unix"
)

// wire connects two engines back to back without copying: what one
// engine's Progress returns is handed straight to the other's Receive.
// It is the in-process link for benchmarks: no loss, no allocation. With
// icrc set (newWire's default) it does what a UDP link does to every
// packet: computes the ICRC over the IPv4/UDP header a kernel socket
// would send, and on the other side computes it again and compares
// before it marks the packet ICRCVerified; a mismatch fails the test.
// Without it packets are marked verified unchecked, which measures the
// engines alone.
type wire struct {
	tb   testing.TB
	ep   [2]*simEP
	now  time.Time
	typ  qpstate.Type // service of the QPs connect makes (zero: RC)
	icrc bool
	addr [2][4]byte
	// moved counts the packets carried from each endpoint.
	moved [2]int
	// tap, if set, sees every packet as it crosses, after its ICRC is in.
	tap func(from int, p *nic.Packet)
}

func newWire(tb testing.TB) *wire {
	s := newSim(tb, 1, impairment{})
	w := &wire{tb: tb, ep: s.ep, now: simEpoch, icrc: true}
	for i := range w.addr {
		w.addr[i] = s.ep[i].addr.As4()
	}
	return w
}

func (w *wire) connect(tb testing.TB, n, pmtu, depth int) [][2]*engine.QP {
	s := &sim{t: tb, ep: w.ep, now: w.now}
	var out [][2]*engine.QP
	for i := 0; i < n; i++ {
		out = append(out, s.connect(qpOpts{typ: w.typ, pmtu: pmtu, timeout: 14, retry: 7, rnrRetry: 7, depth: depth, maxRD: 16}))
	}
	return out
}

// header is the IPv4/UDP header a packet from ep[from] travels with.
func (w *wire) header(from int, sport uint16) icrc.Header {
	return icrc.Header{Src: w.addr[from][:], Dst: w.addr[1-from][:], DF: true, SrcPort: sport, DstPort: nic.RoCEv2Port}
}

// step moves every pending packet once in each direction.
func (w *wire) step() int {
	w.now = w.now.Add(time.Microsecond)
	moved := 0
	for i := 0; i < 2; i++ {
		for {
			out, more := w.ep[i].e.Progress(w.now)
			for j := range out {
				p := out[j].Bytes()
				if w.icrc {
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
				out[j].Remote = engine.Remote(w.ep[i].addr)
				if w.tap != nil {
					w.tap(i, &out[j])
				}
			}
			if len(out) > 0 {
				w.ep[1-i].e.Receive(w.now, out)
			}
			moved += len(out)
			w.moved[i] += len(out)
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

// withICRC runs f twice, labelled: icrc=on, the wire computing and
// checking every packet's ICRC as a link does, and icrc=off, the engines
// alone.
func withICRC(b *testing.B, f func(b *testing.B, icrc bool)) {
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

// rates measures a benchmark's loop: start it after ResetTimer, report
// when the loop is done.
type rates struct {
	wall time.Time
	cpu  time.Duration
}

func startRates(w *wire) rates {
	w.moved = [2]int{}
	return rates{time.Now(), processCPU()}
}

// report reports what the wire carried: messages (n) and packets counted
// as they crossed, all of them (pkt/s, both directions) and those from
// endpoint 0, the requester (req-pkt/s), per second of wall time; and
// the process's CPU time per packet (cpu-ns/pkt), which other load on
// the machine does not inflate.
func (r rates) report(b *testing.B, w *wire, n int) {
	sec := time.Since(r.wall).Seconds()
	cpu := processCPU() - r.cpu
	pkts := w.moved[0] + w.moved[1]
	b.ReportMetric(float64(n)/sec, "msg/s")
	b.ReportMetric(float64(pkts)/sec, "pkt/s")
	b.ReportMetric(float64(w.moved[0])/sec, "req-pkt/s")
	if pkts > 0 {
		b.ReportMetric(float64(cpu.Nanoseconds())/float64(pkts), "cpu-ns/pkt")
	}
}

// benchmarkService runs op over QPs of service typ, the ICRC computed
// and checked on the wire.
func benchmarkService(b *testing.B, typ qpstate.Type, nqp int, op wr.Opcode, size, pmtu int) {
	benchmarkServiceICRC(b, typ, nqp, op, size, pmtu, true)
}

func benchmarkServiceICRC(b *testing.B, typ qpstate.Type, nqp int, op wr.Opcode, size, pmtu int, checkICRC bool) {
	w := newWire(b)
	w.typ = typ
	w.icrc = checkICRC
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
	r := startRates(w)
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
	r.report(b, w, b.N)
}

// The RC benchmarks over the in-process wire, each with the ICRC on and
// off (withICRC): BenchmarkSend64/qps=1/icrc=on and so on.

func BenchmarkSend64(b *testing.B) {
	for _, n := range []int{1, 16} {
		b.Run(fmt.Sprintf("qps=%d", n), func(b *testing.B) {
			withICRC(b, func(b *testing.B, on bool) { benchmarkServiceICRC(b, qpstate.RC, n, wr.Send, 64, 4096, on) })
		})
	}
}

func BenchmarkWrite64K(b *testing.B) {
	for _, n := range []int{1, 16} {
		b.Run(fmt.Sprintf("qps=%d", n), func(b *testing.B) {
			withICRC(b, func(b *testing.B, on bool) { benchmarkServiceICRC(b, qpstate.RC, n, wr.RDMAWrite, 64<<10, 4096, on) })
		})
	}
}

func BenchmarkRead64K(b *testing.B) {
	withICRC(b, func(b *testing.B, on bool) { benchmarkServiceICRC(b, qpstate.RC, 1, wr.RDMARead, 64<<10, 4096, on) })
}

// TestWireICRC: the wire puts a correct ICRC on every packet it carries,
// checked independently of icrc.Synth against the IPv4 and UDP header a
// kernel socket would send, and both directions carry packets.
func TestWireICRC(t *testing.T) {
	w := newWire(t)
	pairs := w.connect(t, 1, 1024, 64)
	lmr, _ := w.ep[0].mrs.RegMR(w.ep[0].pd, make([]byte, 8192), allAccess)
	rmr, _ := w.ep[1].mrs.RegMR(w.ep[1].pd, make([]byte, 8192), allAccess)
	var seen [2]int
	w.tap = func(from int, p *nic.Packet) {
		roce := p.Bytes()
		ip := make([]byte, 20)
		ip[0] = 0x45
		binary.BigEndian.PutUint16(ip[2:], uint16(20+8+len(roce)))
		ip[6] = 0x40 // DF; ID 0, as Linux sends with IP_PMTUDISC_DO
		ip[8], ip[9] = 64, 17
		copy(ip[12:], w.addr[from][:])
		copy(ip[16:], w.addr[1-from][:])
		udp := make([]byte, 8, 8+len(roce))
		binary.BigEndian.PutUint16(udp[0:], p.SrcPort)
		binary.BigEndian.PutUint16(udp[2:], nic.RoCEv2Port)
		binary.BigEndian.PutUint16(udp[4:], uint16(8+len(roce)))
		udp = append(udp, roce...)
		want, err := icrc.IPv4(ip, udp)
		if err != nil || icrc.Wire(roce) != want {
			t.Fatalf("packet from %d: ICRC %08x, want %08x (%v)", from, icrc.Wire(roce), want, err)
		}
		if p.ICRC != nic.ICRCVerified {
			t.Fatalf("packet from %d marked %v", from, p.ICRC)
		}
		seen[from]++
	}
	swr := wr.SendWR{Opcode: wr.RDMAWrite, Flags: wr.Signaled, SGL: []wr.SGE{{Addr: lmr.Addr(), Length: 8192, LKey: lmr.LKey()}}, RemoteAddr: rmr.Addr(), RKey: rmr.RKey()}
	wcs := make([]cq.WC, 8)
	for i := 0; i < 4; i++ {
		if err := pairs[0][0].PostSend(&swr); err != nil {
			t.Fatal(err)
		}
	}
	for got := 0; got < 4; {
		if w.step() == 0 {
			t.Fatal("stalled")
		}
		got += w.ep[0].scq.Poll(wcs)
	}
	if seen[0] < 4*8 || seen[1] == 0 || seen != w.moved {
		t.Fatalf("checked %v packets, the wire moved %v; want at least 32 requests and an ACK", seen, w.moved)
	}
}

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
