package netns

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"runtime/metrics"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/internal/netnstest"
	"github.com/softroce/softroce/internal/traffic"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/nic/afxdp"
	"github.com/softroce/softroce/nic/udp"
	"github.com/softroce/softroce/verbs"
)

// Issue 5's benchmark: one veth pair at MTU 9000 (4096-byte RoCE MTU),
// RC WRITE throughput with 1 and 8 QPs over nic/udp and nic/afxdp, against
// raw batched Go UDP sockets moving 4 KiB datagrams. Run as root:
//
//	go test -run '^$' -bench . -benchtime 3s ./e2e/netns
const (
	writeSize = 64 << 10 // bytes per RDMA WRITE
	inFlight  = 16       // WRITEs in flight in all (spread over the QPs)
	// benchTimeout is the QPs' IBTA local ACK timeout attribute in the
	// benchmarks: 4.096 us x 2^12, 16.8 ms.
	benchTimeout = 12
)

func BenchmarkRCWrite(b *testing.B) {
	netnstest.Require(b)
	for _, be := range []backend{udpBackend, udpSolveBackend, udpNoGSOBackend, afxdpBackend, afxdpNoCsumBackend} {
		for _, nqp := range []int{1, 8} {
			b.Run(fmt.Sprintf("%s/qps=%d", be.name, nqp), func(b *testing.B) { benchWrite(b, be, nqp, benchTimeout) })
		}
	}
}

// udpNoGSOBackend is nic/udp with GSO and GRO off: one datagram per
// packet each way (udpBackend probes and uses both).
var udpNoGSOBackend = backend{"udp-nogso", func(t testing.TB, e *netnstest.End) nic.Link {
	var l *udp.Link
	e.NS.Run(t, func() (err error) {
		l, err = udp.Open(udp.Config{Addr: e.Addr(), SocketBuffer: 4 << 20, GSO: udp.OffloadOff, GRO: udp.OffloadOff})
		return err
	})
	return l
}}

// udpSolveBackend is nic/udp as an unprivileged process gets it: IPv4
// read from the UDP socket (with GRO) and its ICRC checked by solving for
// the ID, instead of the raw socket that root gets by default.
var udpSolveBackend = backend{"udp-solve", func(t testing.TB, e *netnstest.End) nic.Link {
	var l *udp.Link
	e.NS.Run(t, func() (err error) {
		l, err = udp.Open(udp.Config{Addr: e.Addr(), SocketBuffer: 4 << 20, IPv4Check: udp.IPv4CheckSolve})
		return err
	})
	return l
}}

// afxdpNoCsumBackend sends IPv4 without a UDP checksum, as rdma_rxe does.
var afxdpNoCsumBackend = backend{"afxdp-nocsum", func(t testing.TB, e *netnstest.End) nic.Link {
	var l *afxdp.Link
	e.NS.Run(t, func() (err error) {
		l, err = afxdp.Open(afxdp.Config{Interface: e.Name, NoUDPChecksum: true})
		return err
	})
	return l
}}

// devicePair opens be's links at the two ends of a veth pair and a
// device on each, closed when b ends.
func devicePair(b *testing.B, be backend) (la, lb nic.Link, da, db *verbs.Device) {
	_, la, lb, da, db = vethDevicePair(b, be)
	return la, lb, da, db
}

// vethDevicePair is devicePair that also returns the veth pair. Between
// nic/udp links the pair keeps TX checksum offload, as a NIC has it: a
// GSO super-packet then crosses whole instead of being segmented and
// checksummed in software by the sending kernel (BenchmarkPathLimit
// shows what that costs). AF_XDP readers would see the partial
// checksums as wrong, so the afxdp backends run with it off.
func vethDevicePair(b *testing.B, be backend) (v *netnstest.Veth, la, lb nic.Link, da, db *verbs.Device) {
	v = netnstest.Pair(b, netnstest.VethConfig{MTU: 9000, KeepTxChecksum: strings.HasPrefix(be.name, "udp")})
	la, lb = be.open(b, v.A), be.open(b, v.B)
	da, err := verbs.Open(la, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { da.Close() })
	db, err = verbs.Open(lb, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	return v, la, lb, da, db
}

// connectRC connects RC QPs qa (on the device with GID ga) and qb (gb)
// with o, both starting at PSN 1.
func connectRC(b *testing.B, qa, qb *verbs.QP, ga, gb verbs.GID, o *verbs.ConnectOptions) {
	if err := qa.Connect(verbs.RemoteInfo{QPN: qb.Num(), PSN: 1, GID: gb}, o); err != nil {
		b.Fatal(err)
	}
	if err := qb.Connect(verbs.RemoteInfo{QPN: qa.Num(), PSN: 1, GID: ga}, o); err != nil {
		b.Fatal(err)
	}
}

// benchWrite measures RDMA WRITEs on nqp RC QPs whose local ACK timeout
// attribute is timeout. Over nic/udp it also measures the path limit on
// the same veth pair, half before the WRITEs and half after, and reports
// it (path-Gbit/s) and the WRITEs' ratio to it (x-path).
func benchWrite(b *testing.B, be backend, nqp int, timeout uint8) {
	v, la, lb, da, db := vethDevicePair(b, be)
	// The transport has no congestion control: bound what is in flight
	// in all, or the receiver's queues overflow and go-back-N thrashes.
	depth := max(2, inFlight/nqp)
	region := writeSize * depth
	bufA, bufB := make([]byte, region*nqp), make([]byte, region*nqp)
	pda, _ := da.AllocPD()
	pdb, _ := db.AllocPD()
	mra, err := pda.RegMR(bufA, verbs.AccessLocalWrite)
	if err != nil {
		b.Fatal(err)
	}
	mrb, err := pdb.RegMR(bufB, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	if err != nil {
		b.Fatal(err)
	}
	cqa, _ := da.CreateCQ(nqp*depth + 16)
	cqb, _ := db.CreateCQ(16)
	qpa, qpb := make([]*verbs.QP, nqp), make([]*verbs.QP, nqp)
	gidA, _ := da.QueryGID(0)
	gidB, _ := db.QueryGID(0)
	for i := range qpa {
		if qpa[i], err = pda.CreateQP(verbs.QPInitAttr{SendCQ: cqa, RecvCQ: cqa, Cap: verbs.QPCap{MaxSendWR: depth, MaxRecvWR: 1}}); err != nil {
			b.Fatal(err)
		}
		if qpb[i], err = pdb.CreateQP(verbs.QPInitAttr{SendCQ: cqb, RecvCQ: cqb, Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1}}); err != nil {
			b.Fatal(err)
		}
		o := &verbs.ConnectOptions{PathMTU: 4096, SQPSN: 1, Timeout: timeout}
		connectRC(b, qpa[i], qpb[i], gidA, gidB, o)
	}
	s := traffic.Sender{CQ: stallCQ{cqa}, Size: writeSize, Iters: b.N, TxDepth: depth}
	for _, q := range qpa {
		s.QPs = append(s.QPs, q)
		s.WRs = append(s.WRs, verbs.SendWR{Opcode: verbs.WRRDMAWrite,
			SGL: []verbs.SGE{{Length: writeSize, LKey: mra.LKey()}}, RKey: mrb.RKey()})
	}
	// QP q's n-th WRITE uses slot n mod depth of its region on both
	// sides: a QP has at most depth outstanding, so a slot is free again
	// when the engine reuses it.
	s.Prepare = func(q, n int, wr *verbs.SendWR) {
		off := uint64(q*region + n%depth*writeSize)
		wr.SGL[0].Addr, wr.RemoteAddr = mra.Addr()+off, mrb.Addr()+off
	}
	var ref *pathRef
	if _, ok := la.(*udp.Link); ok {
		ref = startPathRef(b, v, int64(b.N)*writeSize)
	}
	b.SetBytes(writeSize)
	b.ResetTimer()
	w0, c0 := wakeups(), procCPU()
	res, err := traffic.Send(context.Background(), &s)
	cpu := procCPU() - c0
	b.StopTimer()
	if err != nil {
		b.Fatalf("%v (link a %+v)", err, la.Stats())
	}
	cpuPerPkt := 0.0
	if res.Stats.TxPackets > 0 {
		// Both ends' CPU time (they share the process) per packet sent.
		cpuPerPkt = float64(cpu.Nanoseconds()) / float64(res.Stats.TxPackets)
		b.ReportMetric(cpuPerPkt, "cpu-ns/pkt")
		b.ReportMetric(cpu.Seconds()/res.Elapsed.Seconds(), "cores")
	}
	if ref != nil {
		ref.report(b, res.Avg*8/1e9, cpuPerPkt)
	}
	reportWakeups(b, w0, int(res.Messages))
	if x, ok := la.(*udp.Link); ok && testing.Verbose() {
		b.Logf("offloads a %+v b %+v", x.OffloadStats(), lb.(*udp.Link).OffloadStats())
	}
	if testing.Verbose() {
		b.Logf("run: %d WRITEs in %v, QP a counters moved by %+v", res.Messages, res.Elapsed, res.Stats)
		b.Logf("link a %+v", la.Stats())
		b.Logf("link b %+v", lb.Stats())
		b.Logf("engine a %+v, b %+v", da.Stats(), db.Stats())
		for _, q := range qpa {
			b.Logf("QP a %+v", q.Stats())
		}
		for _, l := range []nic.Link{la, lb} {
			if x, ok := l.(*afxdp.Link); ok {
				st, _ := x.SocketStats()
				b.Logf("%s sockets %+v", x.Interface(), st)
			}
		}
	}
	reportRC(b, res)
}

// reportRC reports the traffic engine's figures of an RC run: the bytes
// of the completed messages over the engine's elapsed time, and the
// packets the sending QPs counted (every one they sent, retransmissions
// included: counted, not derived from the bytes).
func reportRC(b *testing.B, res traffic.Result) {
	b.ReportMetric(res.Avg*8/1e9, "Gbit/s")
	b.ReportMetric(res.TxPktRate, "pkt/s")
}

// stallCQ bounds every wait for completions, so that a stalled run fails
// with the QPs' counters (the engine puts them in its error) instead of
// hanging until the test binary's timeout.
type stallCQ struct{ cq *verbs.CQ }

func (s stallCQ) Wait(ctx context.Context, wcs []verbs.WC) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return s.cq.Wait(ctx, wcs)
}

// BenchmarkRawUDP is the reference: 4096-byte datagrams between two plain
// UDP sockets with x/net batched I/O (32 per call), one sender goroutine,
// counted at the receiver.
func BenchmarkRawUDP(b *testing.B) {
	netnstest.Require(b)
	v, tx, rx := rawUDPPair(b)
	const batch = 32
	dst := net.UDPAddrFromAddrPort(netip.AddrPortFrom(v.B.Addr(), nic.RoCEv2Port))
	out, in := make([]ipv4.Message, batch), make([]ipv4.Message, batch)
	for i := range out {
		out[i] = ipv4.Message{Buffers: [][]byte{make([]byte, 4096)}, Addr: dst}
		in[i] = ipv4.Message{Buffers: [][]byte{make([]byte, 9000)}}
	}
	ptx, prx := ipv4.NewPacketConn(tx), ipv4.NewPacketConn(rx)
	defer spin(func() { ptx.WriteBatch(out, 0) })()
	b.SetBytes(4096)
	b.ResetTimer()
	start := time.Now()
	for got := 0; got < b.N; {
		rx.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err := prx.ReadBatch(in, 0)
		if err != nil {
			b.Fatal(err)
		}
		got += n
	}
	reportRaw(b, 4096, time.Since(start))
}

// rawUDPPair opens a plain UDP socket on port 4791 at each end of a veth
// pair, closed when b ends; rx has a 4 MiB receive buffer.
func rawUDPPair(b *testing.B) (v *netnstest.Veth, tx, rx *net.UDPConn) {
	v = netnstest.Pair(b, netnstest.VethConfig{MTU: 9000})
	v.A.NS.Run(b, func() (err error) {
		tx, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(v.A.Addr(), 4791)))
		return err
	})
	b.Cleanup(func() { tx.Close() })
	v.B.NS.Run(b, func() (err error) {
		rx, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(v.B.Addr(), 4791)))
		return err
	})
	b.Cleanup(func() { rx.Close() })
	rx.SetReadBuffer(4 << 20)
	return v, tx, rx
}

// spin calls send in a goroutine until the returned stop is called.
func spin(send func()) (stop func()) {
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-done:
				return
			default:
			}
			send()
		}
	}()
	return func() { close(done) }
}

// reportRaw stops b's timer and reports b.N datagrams of size bytes
// received in el.
func reportRaw(b *testing.B, size int, el time.Duration) {
	b.StopTimer()
	b.ReportMetric(float64(b.N)*float64(size)*8/el.Seconds()/1e9, "Gbit/s")
	b.ReportMetric(float64(b.N)/el.Seconds(), "pkt/s")
}

// BenchmarkRawUDPGSO is the offload reference: the same 4096-byte
// datagrams as BenchmarkRawUDP, sent 15 to a sendmsg as one UDP_SEGMENT
// super-packet into a UDP_GRO receiver (batches of 8 coalesced
// datagrams), counted at the receiver by segment.
func BenchmarkRawUDPGSO(b *testing.B) {
	netnstest.Require(b)
	v, tx, rx := rawUDPPair(b)
	const segs, size, batch = 15, 4096, 8
	var serr error
	for _, c := range []*net.UDPConn{tx, rx} {
		rc, _ := c.SyscallConn()
		rc.Control(func(fd uintptr) {
			if c == rx {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_UDP, unix.UDP_GRO, 1)
			} else {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO)
			}
		})
		if serr != nil {
			b.Skipf("no UDP GRO: %v", serr)
		}
	}
	dst := net.UDPAddrFromAddrPort(netip.AddrPortFrom(v.B.Addr(), nic.RoCEv2Port))
	oob := make([]byte, unix.CmsgSpace(2))
	h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
	h.Level, h.Type = unix.SOL_UDP, unix.UDP_SEGMENT
	h.SetLen(unix.CmsgLen(2))
	*(*uint16)(unsafe.Pointer(&oob[unix.CmsgLen(0)])) = size
	super := make([]byte, segs*size)
	in := make([]ipv4.Message, batch)
	for i := range in {
		in[i] = ipv4.Message{Buffers: [][]byte{make([]byte, 1<<16)}, OOB: make([]byte, 64)}
	}
	prx := ipv4.NewPacketConn(rx)
	defer spin(func() { tx.WriteMsgUDP(super, oob, dst) })()
	b.SetBytes(size)
	b.ResetTimer()
	start := time.Now()
	for got := 0; got < b.N; {
		rx.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err := prx.ReadBatch(in, 0)
		if err != nil {
			b.Fatal(err)
		}
		for _, m := range in[:n] {
			got += (m.N + size - 1) / size
		}
	}
	reportRaw(b, size, time.Since(start))
}

// BenchmarkRCSend64 streams 64-byte SENDs over one QP (16 in flight), the
// receiver reposting a receive for each, for per-message costs
// (wake-ups/op; system calls with perf, docs/performance.md).
func BenchmarkRCSend64(b *testing.B) {
	netnstest.Require(b)
	for _, be := range []backend{udpBackend, udpNoGSOBackend} {
		b.Run(be.name, func(b *testing.B) { benchSend64(b, be, benchTimeout) })
	}
}

// benchSend64 measures 64-byte SENDs on one RC QP whose local ACK
// timeout attribute is timeout.
func benchSend64(b *testing.B, be backend, timeout uint8) {
	const size, depth = 64, 16
	_, _, da, db := devicePair(b, be)
	bufA, bufB := make([]byte, size*depth), make([]byte, size*2*depth)
	pda, _ := da.AllocPD()
	pdb, _ := db.AllocPD()
	mra, err := pda.RegMR(bufA, verbs.AccessLocalWrite)
	if err != nil {
		b.Fatal(err)
	}
	mrb, err := pdb.RegMR(bufB, verbs.AccessLocalWrite)
	if err != nil {
		b.Fatal(err)
	}
	cqa, _ := da.CreateCQ(4 * depth)
	cqb, _ := db.CreateCQ(4 * depth)
	qpa, err := pda.CreateQP(verbs.QPInitAttr{SendCQ: cqa, RecvCQ: cqa, Cap: verbs.QPCap{MaxSendWR: depth, MaxRecvWR: 1}})
	if err != nil {
		b.Fatal(err)
	}
	qpb, err := pdb.CreateQP(verbs.QPInitAttr{SendCQ: cqb, RecvCQ: cqb, Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 2 * depth}})
	if err != nil {
		b.Fatal(err)
	}
	gidA, _ := da.QueryGID(0)
	gidB, _ := db.QueryGID(0)
	o := &verbs.ConnectOptions{PathMTU: 4096, SQPSN: 1, Timeout: timeout, RNRRetry: 7}
	connectRC(b, qpa, qpb, gidA, gidB, o)
	// One receive per slot, reposted as it completes; the work requests
	// are built once (PostRecv copies them).
	recvs := make([]verbs.RecvWR, 2*depth)
	for i := range recvs {
		recvs[i] = verbs.RecvWR{ID: traffic.WRID(0, i), SGL: []verbs.SGE{{Addr: mrb.Addr() + uint64(i*size), Length: size, LKey: mrb.LKey()}}}
		if err := qpb.PostRecv(&recvs[i]); err != nil {
			b.Fatal(err)
		}
	}
	r := traffic.Receiver{QPs: []traffic.QP{qpb}, CQ: stallCQ{cqb}, Size: size, Total: b.N,
		OnRecv: func(_, n int, _ *verbs.WC) error { return qpb.PostRecv(&recvs[n]) }}
	s := traffic.Sender{QPs: []traffic.QP{qpa}, CQ: stallCQ{cqa}, Size: size, Iters: b.N, TxDepth: depth,
		WRs: []verbs.SendWR{{Opcode: verbs.WRSend, SGL: []verbs.SGE{{Length: size, LKey: mra.LKey()}}}}}
	s.Prepare = func(_, n int, wr *verbs.SendWR) { wr.SGL[0].Addr = mra.Addr() + uint64(n%depth*size) }
	b.SetBytes(size)
	b.ResetTimer()
	w0 := wakeups()
	// The receiver reposts on its own goroutine, as a peer would.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type recvResult struct {
		res traffic.Result
		err error
	}
	rdone := make(chan recvResult, 1)
	go func() {
		res, err := traffic.Receive(ctx, &r)
		rdone <- recvResult{res, err}
	}()
	res, err := traffic.Send(ctx, &s)
	b.StopTimer()
	if err != nil {
		cancel()
		<-rdone
		b.Fatal(err)
	}
	rr := <-rdone
	if rr.err != nil {
		b.Fatal(rr.err)
	}
	reportWakeups(b, w0, int(res.Messages))
	b.ReportMetric(res.MsgRate, "msg/s")
	b.ReportMetric(res.TxPktRate, "pkt/s")
	if st := res.Stats; (st.Retransmits != 0 || st.Timeouts != 0 || rr.res.Stats.RNRNAKsSent != 0) && testing.Verbose() {
		b.Logf("QP a counters moved by %+v", st)
		b.Logf("QP b counters moved by %+v", rr.res.Stats)
	}
}

// wakeups estimates how many times goroutines were scheduled to run so
// far: the runtime samples one scheduling in 8 into the
// /sched/latencies:seconds histogram.
func wakeups() uint64 {
	s := []metrics.Sample{{Name: "/sched/latencies:seconds"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindFloat64Histogram {
		return 0
	}
	var n uint64
	for _, c := range s[0].Value.Float64Histogram().Counts {
		n += c
	}
	return 8 * n
}

func reportWakeups(b *testing.B, w0 uint64, ops int) {
	if ops > 0 {
		b.ReportMetric(float64(wakeups()-w0)/float64(ops), "wakeups/op")
	}
}

// TestBenchmarkFiguresFromEngine runs the RC benchmarks once each and
// checks that what they report is the traffic engine's measurement of
// their last round: b.N messages through it, Gbit/s and msg/s its rates,
// pkt/s the packets its QPs counted (at least one per 4096 bytes). The
// QPs wait 1.07 s for an ACK (timeout 18), not the benchmarks' 16.8 ms:
// this checks where the figures come from, and a slow run (the race
// detector, a loaded machine) must not exhaust the retries.
func TestBenchmarkFiguresFromEngine(t *testing.T) {
	netnstest.Require(t)
	const timeout = 18
	var mu sync.Mutex
	var round []traffic.Result // what the engine measured in the latest round
	defer traffic.Observe(func(r traffic.Result) {
		mu.Lock()
		round = append(round, r)
		mu.Unlock()
	})()
	bench := func(f func(b *testing.B)) func(b *testing.B) {
		return func(b *testing.B) {
			mu.Lock()
			round = nil
			mu.Unlock()
			f(b)
		}
	}
	for _, c := range []struct {
		name  string
		f     func(b *testing.B)
		runs  int // engine runs per round: the sender, and a receiver for SENDs
		pkts  uint64
		check func(r traffic.Result, m map[string]float64) bool
	}{
		{"RCWrite/udp/qps=2", func(b *testing.B) { benchWrite(b, udpBackend, 2, timeout) }, 1, writeSize / 4096,
			func(r traffic.Result, m map[string]float64) bool {
				return m["Gbit/s"] == r.Avg*8/1e9 && m["pkt/s"] == r.TxPktRate
			}},
		{"RCSend64/udp", func(b *testing.B) { benchSend64(b, udpBackend, timeout) }, 2, 1,
			func(r traffic.Result, m map[string]float64) bool {
				return m["msg/s"] == r.MsgRate && m["pkt/s"] == r.TxPktRate
			}},
	} {
		br := testing.Benchmark(bench(c.f))
		if br.N == 0 {
			t.Fatalf("%s failed", c.name)
		}
		mu.Lock()
		got := round
		mu.Unlock()
		if len(got) != c.runs {
			t.Fatalf("%s: %d engine runs in the last round, want %d", c.name, len(got), c.runs)
		}
		from := -1
		for i, r := range got {
			if r.Messages != int64(br.N) {
				t.Errorf("%s: engine run %d moved %d messages, b.N %d", c.name, i, r.Messages, br.N)
			}
			if c.check(r, br.Extra) {
				from = i
			}
		}
		if from < 0 {
			t.Fatalf("%s: metrics %v are none of the engine's results %+v", c.name, br.Extra, got)
		}
		if r := got[from]; r.Stats.TxPackets < c.pkts*uint64(br.N) || r.TxPktRate <= 0 {
			t.Errorf("%s: %d packets counted for %d messages", c.name, r.Stats.TxPackets, br.N)
		}
		t.Logf("%s: N=%d %v", c.name, br.N, br.Extra)
	}
}
