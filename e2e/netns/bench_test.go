package netns

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"runtime/metrics"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/internal/netnstest"
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
)

func BenchmarkRCWrite(b *testing.B) {
	netnstest.Require(b)
	for _, be := range []backend{udpBackend, udpNoGSOBackend, afxdpBackend, afxdpNoCsumBackend} {
		for _, nqp := range []int{1, 8} {
			b.Run(fmt.Sprintf("%s/qps=%d", be.name, nqp), func(b *testing.B) { benchWrite(b, be, nqp) })
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
	v := netnstest.Pair(b, netnstest.VethConfig{MTU: 9000})
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
	return la, lb, da, db
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

func benchWrite(b *testing.B, be backend, nqp int) {
	la, lb, da, db := devicePair(b, be)
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
		o := &verbs.ConnectOptions{PathMTU: 4096, SQPSN: 1, Timeout: 12}
		connectRC(b, qpa[i], qpb[i], gidA, gidB, o)
	}
	post := func(q, slot int, id uint64) {
		off := q*region + slot*writeSize
		err := qpa[q].PostSend(&verbs.SendWR{ID: id, Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled,
			SGL:        []verbs.SGE{{Addr: mra.Addr() + uint64(off), Length: writeSize, LKey: mra.LKey()}},
			RemoteAddr: mrb.Addr() + uint64(off), RKey: mrb.RKey()})
		if err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(writeSize)
	b.ResetTimer()
	tx0 := la.Stats().TxPackets
	w0 := wakeups()
	posted := 0
	// Fill the pipes, then post one WRITE for every completion.
	for q := 0; q < nqp; q++ {
		for s := 0; s < depth && posted < b.N; s++ {
			post(q, s, uint64(q)<<32|uint64(s))
			posted++
		}
	}
	wcs := make([]verbs.WC, 64)
	start := time.Now()
	done := drain(b, cqa, wcs, "WRITE", posted, func(id uint64) { post(int(id>>32), int(id&0xffffffff), id) },
		func() any { return la.Stats() })
	el := time.Since(start)
	b.StopTimer()
	reportWakeups(b, w0, done)
	if x, ok := la.(*udp.Link); ok && testing.Verbose() {
		b.Logf("offloads a %+v b %+v", x.OffloadStats(), lb.(*udp.Link).OffloadStats())
	}
	if testing.Verbose() {
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
	b.ReportMetric(float64(done)*writeSize*8/el.Seconds()/1e9, "Gbit/s")
	// Counted: every packet A sent in the timed part (all data packets:
	// the requester sends nothing else).
	b.ReportMetric(float64(la.Stats().TxPackets-tx0)/el.Seconds(), "pkt/s")
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
		b.Run(be.name, func(b *testing.B) { benchSend64(b, be) })
	}
}

func benchSend64(b *testing.B, be backend) {
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
	o := &verbs.ConnectOptions{PathMTU: 4096, SQPSN: 1, Timeout: 12, RNRRetry: 7}
	connectRC(b, qpa, qpb, gidA, gidB, o)
	recv := func(slot int) {
		if err := qpb.PostRecv(&verbs.RecvWR{ID: uint64(slot), SGL: []verbs.SGE{{Addr: mrb.Addr() + uint64(slot*size), Length: size, LKey: mrb.LKey()}}}); err != nil {
			b.Fatal(err)
		}
	}
	for s := 0; s < 2*depth; s++ {
		recv(s)
	}
	// The receiver reposts what completes, on its own goroutine.
	quit := make(chan struct{})
	rdone := make(chan struct{})
	go func() {
		defer close(rdone)
		wcs := make([]verbs.WC, 2*depth)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			n, _ := cqb.Wait(ctx, wcs)
			cancel()
			for _, wc := range wcs[:n] {
				recv(int(wc.WRID))
			}
			select {
			case <-quit:
				return
			default:
			}
		}
	}()
	defer func() { close(quit); <-rdone }()
	post := func(slot int) {
		err := qpa.PostSend(&verbs.SendWR{ID: uint64(slot), Opcode: verbs.WRSend, Flags: verbs.SendSignaled,
			SGL: []verbs.SGE{{Addr: mra.Addr() + uint64(slot*size), Length: size, LKey: mra.LKey()}}})
		if err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(size)
	b.ResetTimer()
	w0 := wakeups()
	posted := 0
	for ; posted < depth && posted < b.N; posted++ {
		post(posted)
	}
	wcs := make([]verbs.WC, depth)
	start := time.Now()
	done := drain(b, cqa, wcs, "SEND", posted, func(id uint64) { post(int(id)) }, func() any { return qpa.Stats() })
	el := time.Since(start)
	b.StopTimer()
	reportWakeups(b, w0, done)
	b.ReportMetric(float64(done)/el.Seconds(), "msg/s")
	if st := qpa.Stats(); st.Retransmits != 0 && testing.Verbose() {
		b.Logf("QP a %+v", st)
	}
}

// drain waits on cq, len(wcs) completions at a time, for b.N successful
// completions of what, reposting each through repost while fewer than
// b.N are posted (posted already are); stats describes the sender when a
// wait times out. It returns the completions counted.
func drain(b *testing.B, cq *verbs.CQ, wcs []verbs.WC, what string, posted int, repost func(wrid uint64), stats func() any) int {
	done := 0
	for done < b.N {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		n, err := cq.Wait(ctx, wcs)
		cancel()
		if err != nil {
			b.Fatalf("after %d of %d %ss: %v (%+v)", done, b.N, what, err, stats())
		}
		for _, wc := range wcs[:n] {
			if wc.Status.String() != "success" {
				b.Fatalf("%s completed with %v", what, wc.Status)
			}
			done++
			if posted < b.N {
				repost(wc.WRID)
				posted++
			}
		}
	}
	return done
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
