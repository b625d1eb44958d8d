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

// The RC-shaped floor: RC WRITE's datagrams on the wire with none of
// softroce's work. A 64 KiB WRITE at path MTU 4096 is 16 packets: a
// FIRST of 4128 bytes (BTH, RETH, payload, ICRC) and 15 MIDDLE and LAST
// packets of 4112. 16 x 4112 would not fit one UDP datagram and FIRST is
// longer than the rest, so nic/udp sends each WRITE as two messages of
// one sendmmsg: FIRST alone and a 15-segment UDP_SEGMENT run. This
// benchmark sends exactly that from blocking system calls, with zeroed
// payloads (no BTH, no ICRC, no copy from an MR, no engine), into a
// UDP_GRO receiver that reads with recvmmsg as the path limit does.
//
// acks=on adds RC's flow: at most rcShapeWindow WRITEs in flight, and the
// receiver sends one 20-byte datagram (an ACK's size) after each batch
// that completed a WRITE, which the sender waits for when its window is
// full. Both threads then sleep and are woken as RC's do. acks=off is
// the shape alone: the sender loops blindly, as the path limit's does.
//
// The path limit is measured on the same veth pair, half before and half
// after; x-path is this floor's ratio to it. What RC WRITE loses against
// this floor is softroce's own; what this floor loses against the path
// limit comes with RC's packets and acknowledgements on this kernel.
const (
	rcShapeFirst  = 12 + 16 + 4096 + 4 // BTH, RETH, payload, ICRC
	rcShapeMiddle = 12 + 4096 + 4      // BTH, payload, ICRC
	rcShapeRun    = 15                 // MIDDLE and LAST packets per run
	rcShapeWrite  = rcShapeFirst + rcShapeRun*rcShapeMiddle
	rcShapeWindow = inFlight // WRITEs in flight, as BenchmarkRCWrite
	rcShapeAckLen = 20       // BTH, AETH, ICRC
	rcShapePort   = pathPort + 1
)

func BenchmarkRCShape(b *testing.B) {
	netnstest.Require(b)
	for _, acks := range []bool{false, true} {
		b.Run("acks="+onOff(acks), func(b *testing.B) {
			v := netnstest.Pair(b, netnstest.VethConfig{MTU: 9000, KeepTxChecksum: true})
			s := newRCShape(b, v)
			ref := startPathRef(b, v, int64(b.N)*writeSize)
			b.SetBytes(writeSize)
			b.ResetTimer()
			c0 := procCPU()
			el, nacks := s.run(b, b.N, acks)
			cpu := procCPU() - c0
			b.StopTimer()
			g := float64(b.N) * writeSize * 8 / el.Seconds() / 1e9
			b.ReportMetric(g, "Gbit/s")
			cpuPerPkt := float64(cpu.Nanoseconds()) / float64(b.N*(1+rcShapeRun))
			b.ReportMetric(cpuPerPkt, "cpu-ns/pkt")
			ref.report(b, g, cpuPerPkt)
			if acks {
				b.ReportMetric(float64(nacks)/float64(b.N), "acks/op")
			}
		})
	}
}

// rcShape is the floor's sockets and buffers: data from A to B, ACKs from
// B to A, each way a blocking UDP socket at each end.
type rcShape struct {
	txData, rxData int // A's sender, B's receiver (UDP_GRO)
	txAck, rxAck   int // B's ACK sender, A's ACK receiver
	first, rest    []byte
	ack            []byte
	oob            []byte
	dataDst        unix.RawSockaddrInet4
	ackDst         unix.RawSockaddrInet4
	whdrs          []unix.Mmsghdr // two per WRITE, rcShapeWindow WRITEs
	wiovs          []unix.Iovec
	rhdrs          []unix.Mmsghdr
	riovs          []unix.Iovec
	rbufs          []byte
	ahdrs          []unix.Mmsghdr
	aiovs          []unix.Iovec
	abufs          []byte
}

func newRCShape(t testing.TB, v *netnstest.Veth) *rcShape {
	s := &rcShape{}
	s.txData, s.rxData = bulkPair(t, v, rcShapePort)
	s.txAck, s.rxAck = udpSocket(t, v.B, rcShapePort+1), udpSocket(t, v.A, rcShapePort+1)
	receiveTimeout(t, s.rxAck)
	s.dataDst, s.ackDst = sockaddr4(v.B, rcShapePort), sockaddr4(v.A, rcShapePort+1)
	s.first, s.rest = make([]byte, rcShapeFirst), make([]byte, rcShapeRun*rcShapeMiddle)
	s.ack = make([]byte, rcShapeAckLen)
	s.oob = segmentControl(rcShapeMiddle)

	s.whdrs, s.wiovs = make([]unix.Mmsghdr, 2*rcShapeWindow), make([]unix.Iovec, 2*rcShapeWindow)
	for i := range s.whdrs {
		m := &s.whdrs[i].Hdr
		m.Name, m.Namelen = (*byte)(unsafe.Pointer(&s.dataDst)), unix.SizeofSockaddrInet4
		m.Iov = &s.wiovs[i]
		m.SetIovlen(1)
		if i%2 == 0 {
			s.wiovs[i].Base = &s.first[0]
			s.wiovs[i].SetLen(len(s.first))
		} else {
			s.wiovs[i].Base = &s.rest[0]
			s.wiovs[i].SetLen(len(s.rest))
			m.Control = &s.oob[0]
			m.SetControllen(len(s.oob))
		}
	}
	s.rhdrs, s.riovs, s.rbufs = recvBatch(pathBatch, 1<<16)
	s.ahdrs, s.aiovs, s.abufs = recvBatch(rcShapeWindow, 64)
	return s
}

// run moves n WRITEs' worth of datagrams and returns the time from the
// first send until the receiver has them all, and the ACKs the receiver
// sent.
func (s *rcShape) run(t testing.TB, n int, acks bool) (el time.Duration, nacks int) {
	var wg sync.WaitGroup
	var stop atomic.Bool // the receiver has had n WRITEs (acks=off)
	var rerr error
	var done int // WRITEs the receiver completed (after wg.Wait)
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer stop.Store(true)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		var bytes int64
		for done < n {
			k, _, e := unix.Syscall6(unix.SYS_RECVMMSG, uintptr(s.rxData), uintptr(unsafe.Pointer(&s.rhdrs[0])), uintptr(len(s.rhdrs)), unix.MSG_WAITFORONE, 0, 0)
			if e == unix.EINTR {
				continue
			}
			if e != 0 {
				rerr = fmt.Errorf("receiver: recvmmsg: %w after %d WRITEs", e, done)
				return
			}
			for i := range int(k) {
				bytes += int64(s.rhdrs[i].Len)
			}
			if now := int(bytes / rcShapeWrite); now > done {
				done = now
				if acks {
					binary.NativeEndian.PutUint64(s.ack, uint64(done))
					nacks++
					if err := unix.Sendto(s.txAck, s.ack, 0, &unix.SockaddrInet4{Addr: s.ackDst.Addr, Port: rcShapePort + 1}); err != nil {
						rerr = fmt.Errorf("receiver: ACK: %w", err)
						return
					}
				}
			}
		}
	}()

	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	start := time.Now()
	sent, acked := 0, 0
	var serr error
	for acks && sent < n || !acks && !stop.Load() {
		// Without ACKs the sender loops until the receiver has had n
		// WRITEs: what the receiver's queue drops is not counted.
		k := rcShapeWindow
		if acks {
			k = min(n-sent, rcShapeWindow-(sent-acked))
		}
		if k > 0 {
			m, _, e := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(s.txData), uintptr(unsafe.Pointer(&s.whdrs[0])), uintptr(2*k), 0, 0, 0)
			if e != 0 && e != unix.ENOBUFS && e != unix.EINTR {
				serr = fmt.Errorf("sender: sendmmsg: %w", e)
				break
			}
			if e == 0 {
				sent += int(m) / 2 // a FIRST sent without its run is sent again whole
			}
			if !acks {
				continue
			}
		}
		if sent-acked < rcShapeWindow {
			continue
		}
		m, _, e := unix.Syscall6(unix.SYS_RECVMMSG, uintptr(s.rxAck), uintptr(unsafe.Pointer(&s.ahdrs[0])), uintptr(len(s.ahdrs)), unix.MSG_WAITFORONE, 0, 0)
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			serr = fmt.Errorf("sender: ACK recvmmsg: %w after %d WRITEs, %d acknowledged", e, sent, acked)
			break
		}
		for i := range int(m) {
			acked = max(acked, int(binary.NativeEndian.Uint64(s.abufs[i*64:])))
		}
	}
	if serr != nil {
		// Whatever the receiver still waits for will not come.
		unix.Shutdown(s.rxData, unix.SHUT_RD)
	}
	wg.Wait()
	el = time.Since(start)
	if serr != nil {
		t.Fatal(serr)
	}
	if rerr != nil {
		t.Fatal(rerr)
	}
	// Drain what is left, so the next round starts empty.
	for _, fd := range []int{s.rxData, s.rxAck} {
		for {
			_, _, e := unix.Syscall6(unix.SYS_RECVMMSG, uintptr(fd), uintptr(unsafe.Pointer(&s.rhdrs[0])), uintptr(len(s.rhdrs)), unix.MSG_DONTWAIT, 0, 0)
			if e != 0 && e != unix.EINTR {
				break
			}
		}
	}
	return el, nacks
}

// TestRCShapeRuns runs the floor's exchange both ways on a veth pair:
// every WRITE's bytes arrive, and with ACKs the receiver acknowledges at
// least once and at most once per WRITE.
func TestRCShapeRuns(t *testing.T) {
	netnstest.Require(t)
	s := newRCShape(t, netnstest.Pair(t, netnstest.VethConfig{MTU: 9000, KeepTxChecksum: true}))
	const n = 300
	if el, nacks := s.run(t, n, true); nacks < 1 || nacks > n || el <= 0 {
		t.Errorf("acks=on: %d ACKs for %d WRITEs in %v", nacks, n, el)
	}
	if el, nacks := s.run(t, n, false); nacks != 0 || el <= 0 {
		t.Errorf("acks=off: %d ACKs in %v", nacks, el)
	}
}
