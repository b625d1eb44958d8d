package netns

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/internal/netnstest"
)

// The path limit: what the veth pair carries when the kernel does all the
// work it can per system call. The sender hands the kernel 15 datagrams
// of 4 KiB at a time as one UDP_SEGMENT super-packet (sendmsg, blocking,
// no poller); the receiver, with UDP_GRO, takes the coalesced datagrams
// in batches with recvmmsg (blocking, MSG_WAITFORONE). No Go net code,
// no read deadlines, nothing copied or checked in user space: a program
// cannot move UDP over this path much faster, so it is the reference RC
// throughput is held against (BenchmarkRawUDPGSO is a Go net program and
// reaches less than half of it).
const (
	pathSegs  = 15   // segments per super-packet: 15 x 4096 fits 64 KiB
	pathSize  = 4096 // bytes per segment (datagram)
	pathBatch = 16   // datagrams per recvmmsg
	pathPort  = 4800 // beside RoCE's 4791, so RC links can stay open
	// pathMinBytes is the least a measurement moves (about 35 ms at
	// 30 Gbit/s): shorter ones measure start-up.
	pathMinBytes = 128 << 20
)

// pathLimit is the reference's pair of sockets, made once per veth pair.
type pathLimit struct {
	tx, rx int
	dst    unix.RawSockaddrInet4
	super  []byte
	oob    []byte
	msg    unix.Msghdr
	iov    unix.Iovec
	rhdrs  []unix.Mmsghdr
	riovs  []unix.Iovec
	rbufs  []byte
}

// newPathLimit opens the reference's sockets on v, closed when t ends: a
// blocking UDP socket at each end on pathPort, the sender's with
// don't-fragment (IPv4 ID 0, as nic/udp sends), the receiver's with
// UDP_GRO and a 4 MiB buffer (as nic/udp's in the benchmarks). It skips
// when the kernel has no UDP GSO/GRO.
func newPathLimit(t testing.TB, v *netnstest.Veth) *pathLimit {
	p := &pathLimit{}
	p.tx, p.rx = bulkPair(t, v, pathPort)
	p.dst = sockaddr4(v.B, pathPort)
	p.super = make([]byte, pathSegs*pathSize)
	p.oob = segmentControl(pathSize)
	p.iov.Base = &p.super[0]
	p.iov.SetLen(len(p.super))
	p.msg.Name = (*byte)(unsafe.Pointer(&p.dst))
	p.msg.Namelen = unix.SizeofSockaddrInet4
	p.msg.Iov = &p.iov
	p.msg.SetIovlen(1)
	p.msg.Control = &p.oob[0]
	p.msg.SetControllen(len(p.oob))

	p.rhdrs, p.riovs, p.rbufs = recvBatch(pathBatch, 1<<16)
	return p
}

// bulkPair opens a blocking UDP socket on port at each end of v, closed
// when t ends: tx at A with don't-fragment (IPv4 ID 0, as nic/udp sends)
// and a 4 MiB send buffer, rx at B with UDP_GRO, a 4 MiB receive buffer
// and a 5 s receive timeout. It skips when the kernel has no UDP GSO/GRO.
func bulkPair(t testing.TB, v *netnstest.Veth, port int) (tx, rx int) {
	tx, rx = udpSocket(t, v.A, port), udpSocket(t, v.B, port)
	if err := unix.SetsockoptInt(tx, unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.GetsockoptInt(tx, unix.SOL_UDP, unix.UDP_SEGMENT); err != nil {
		t.Skipf("no UDP GSO (UDP_SEGMENT): %v", err)
	}
	if err := unix.SetsockoptInt(rx, unix.SOL_UDP, unix.UDP_GRO, 1); err != nil {
		t.Skipf("no UDP GRO: %v", err)
	}
	for _, o := range [][3]int{{tx, unix.SO_SNDBUFFORCE, unix.SO_SNDBUF}, {rx, unix.SO_RCVBUFFORCE, unix.SO_RCVBUF}} {
		if unix.SetsockoptInt(o[0], unix.SOL_SOCKET, o[1], 4<<20) != nil {
			unix.SetsockoptInt(o[0], unix.SOL_SOCKET, o[2], 4<<20)
		}
	}
	receiveTimeout(t, rx)
	return tx, rx
}

// udpSocket opens a blocking UDP socket bound to e's address and port,
// closed when t ends.
func udpSocket(t testing.TB, e *netnstest.End, port int) (fd int) {
	e.NS.Run(t, func() (err error) {
		if fd, err = unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0); err != nil {
			return err
		}
		t.Cleanup(func() { unix.Close(fd) })
		return unix.Bind(fd, &unix.SockaddrInet4{Addr: e.Addr().As4(), Port: port})
	})
	return fd
}

// receiveTimeout makes a receive on fd that waits 5 s fail: the path is
// broken then, and the benchmark must not hang.
func receiveTimeout(t testing.TB, fd int) {
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 5}); err != nil {
		t.Fatal(err)
	}
}

// sockaddr4 is e's address and port for a msghdr's name.
func sockaddr4(e *netnstest.End, port int) unix.RawSockaddrInet4 {
	a := unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: e.Addr().As4()}
	binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&a.Port))[:], uint16(port))
	return a
}

// segmentControl is a UDP_SEGMENT control message for segments of size
// bytes.
func segmentControl(size int) []byte {
	oob := make([]byte, unix.CmsgSpace(2))
	h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
	h.Level, h.Type = unix.SOL_UDP, unix.UDP_SEGMENT
	h.SetLen(unix.CmsgLen(2))
	binary.NativeEndian.PutUint16(oob[unix.CmsgLen(0):], uint16(size))
	return oob
}

// recvBatch makes n receive headers, each with one buffer of size bytes.
func recvBatch(n, size int) ([]unix.Mmsghdr, []unix.Iovec, []byte) {
	hdrs, iovs, bufs := make([]unix.Mmsghdr, n), make([]unix.Iovec, n), make([]byte, n*size)
	for i := range hdrs {
		iovs[i].Base = &bufs[i*size]
		iovs[i].SetLen(size)
		hdrs[i].Hdr.Iov = &iovs[i]
		hdrs[i].Hdr.SetIovlen(1)
	}
	return hdrs, iovs, bufs
}

// measure moves at least bytes of 4 KiB datagrams (rounded up to whole
// receive batches) and returns what the receiver counted and the time it
// took, from the first datagram received to the last.
func (p *pathLimit) measure(t testing.TB, bytes int64) (got int64, el time.Duration) {
	var stop atomic.Bool
	var wg sync.WaitGroup
	var serr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		for !stop.Load() {
			_, _, e := unix.Syscall(unix.SYS_SENDMSG, uintptr(p.tx), uintptr(unsafe.Pointer(&p.msg)), 0)
			if e != 0 && e != unix.ENOBUFS && e != unix.EINTR {
				serr = e
				return
			}
		}
	}()
	var start time.Time
	for got < bytes {
		n, _, e := unix.Syscall6(unix.SYS_RECVMMSG, uintptr(p.rx), uintptr(unsafe.Pointer(&p.rhdrs[0])), pathBatch, unix.MSG_WAITFORONE, 0, 0)
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			stop.Store(true)
			wg.Wait()
			t.Fatalf("path limit: recvmmsg: %v (sender: %v)", e, serr)
		}
		if start.IsZero() {
			// The first batch waited for the sender to start.
			start = time.Now()
			continue
		}
		for i := range int(n) {
			got += int64(p.rhdrs[i].Len)
		}
	}
	el = time.Since(start)
	stop.Store(true)
	wg.Wait()
	if serr != nil {
		t.Fatalf("path limit: sendmsg: %v", serr)
	}
	// What is still queued must not count in the next measurement.
	for {
		_, _, e := unix.Syscall6(unix.SYS_RECVMMSG, uintptr(p.rx), uintptr(unsafe.Pointer(&p.rhdrs[0])), pathBatch, unix.MSG_DONTWAIT, 0, 0)
		if e != 0 && e != unix.EINTR {
			break
		}
	}
	return got, el
}

// gbits is bytes over el in Gbit/s.
func gbits(bytes int64, el time.Duration) float64 { return float64(bytes) * 8 / el.Seconds() / 1e9 }

// BenchmarkPathLimit is the path-limit reference on its own veth pair at
// MTU 9000: b.N 4 KiB datagrams, counted at the receiver. txcsum=on is
// the veth as the kernel makes it, with TX checksum offload: the
// super-packet crosses whole (as it leaves a host through a NIC with
// UDP segmentation offload). txcsum=off is the pair as netnstest makes it
// by default (for AF_PACKET and AF_XDP readers): the sending kernel
// segments each super-packet and checksums every segment in software.
func BenchmarkPathLimit(b *testing.B) {
	netnstest.Require(b)
	for _, on := range []bool{true, false} {
		b.Run(fmt.Sprintf("txcsum=%s", onOff(on)), func(b *testing.B) {
			p := newPathLimit(b, netnstest.Pair(b, netnstest.VethConfig{MTU: 9000, KeepTxChecksum: on}))
			b.SetBytes(pathSize)
			b.ResetTimer()
			got, el := p.measure(b, int64(b.N)*pathSize)
			b.StopTimer()
			b.ReportMetric(gbits(got, el), "Gbit/s")
			b.ReportMetric(float64(got)/pathSize/el.Seconds(), "pkt/s")
		})
	}
}

func onOff(on bool) string {
	if on {
		return "on"
	}
	return "off"
}

// pathRef measures the path limit beside an RC run on the same veth pair:
// half of it before the run, half after, each moving max(bytes/2,
// pathMinBytes), so that a change of the host's load during the run
// shows in both.
type pathRef struct {
	p    *pathLimit
	half int64
	got  int64
	el   time.Duration
	cpu  time.Duration // process CPU time over the measurements
}

func startPathRef(b *testing.B, v *netnstest.Veth, bytes int64) *pathRef {
	r := &pathRef{p: newPathLimit(b, v), half: max(bytes/2, pathMinBytes)}
	r.add(b)
	return r
}

func (r *pathRef) add(b *testing.B) {
	c0 := procCPU()
	got, el := r.p.measure(b, r.half)
	r.cpu += procCPU() - c0
	r.got += got
	r.el += el
}

// report finishes the reference after the RC run and reports it, and the
// RC run's ratio to it, beside the RC run's Gbit/s.
func (r *pathRef) report(b *testing.B, rcGbits, rcCPUPerPkt float64) {
	r.add(b)
	ref := gbits(r.got, r.el)
	b.ReportMetric(ref, "path-Gbit/s")
	b.ReportMetric(rcGbits/ref, "x-path")
	pathCPU := float64(r.cpu.Nanoseconds()) / float64(r.got/pathSize)
	b.ReportMetric(pathCPU, "path-cpu-ns/pkt")
	if rcCPUPerPkt > 0 {
		// The same ratio in CPU per packet, which the host's load moves
		// less than it moves either run's wall time.
		b.ReportMetric(pathCPU/rcCPUPerPkt, "x-path-cpu")
	}
}

// procCPU is the process's CPU time so far (user and system, all
// threads): what a run costs, which other load on the host does not
// inflate as it does wall time.
func procCPU() time.Duration {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_PROCESS_CPUTIME_ID, &ts) != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}
