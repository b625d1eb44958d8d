package udp

import (
	"encoding/binary"
	"net/netip"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/nic"
)

// receiver reads batches with recvmmsg(2) straight into the caller's
// packet buffers. It exists because x/net's ReadBatch allocates a
// *net.UDPAddr for every datagram's source; here the source is decoded
// from a reused sockaddr buffer, so receiving allocates nothing. Waiting
// goes through the runtime poller (RawConn.Read), as with any net.Conn.
type receiver struct {
	rc   *sock
	hdrs []unix.Mmsghdr
	iovs []unix.Iovec // per message: [header scratch,] packet buffer
	// hdrLen > 0 puts the first hdrLen bytes of each datagram (the IPv4
	// and UDP headers on a raw socket) in hdr, the rest in the caller's
	// buffer.
	hdrLen int
	hdr    []byte
	names  []unix.RawSockaddrInet6 // large enough for IPv4 too
	oob    []byte
	fn     func(fd uintptr) bool // r.read, bound once
	ctl    func(fd uintptr)      // r.read for Control, bound once
	// nonblock makes recv and recvBig try once instead of waiting.
	nonblock bool
	n        int // messages in the last call
	want     int // messages asked for
	errno    syscall.Errno
	calls    uint64 // recvmmsg system calls made (tests count them)

	// With GRO, datagrams land in big (a groBufSize buffer each) and are
	// handed out segment by segment: cur is the next message, off the
	// offset in it, seg its segment size.
	big          []byte
	cur, off     int
	seg, lastSeg int
	segHdr       [rawHdrLen]byte
	// alias (RecvEach only) hands out segments in place: a delivered
	// packet's Buf points into big, which stays untouched until deliver
	// returns, instead of a copy in the caller's buffer. saved keeps the
	// caller's buffers to put back after deliver.
	alias bool
	saved [][]byte
	// bigSet: the headers are as setupBig left them. A read that found
	// nothing (EAGAIN) does not touch them, so a busy poll of an empty
	// socket skips setting up the whole batch again.
	bigSet bool
}

func newReceiver(rc *sock, batch, hdrLen int) *receiver {
	r := &receiver{rc: rc, hdrs: make([]unix.Mmsghdr, batch), iovs: make([]unix.Iovec, 2*batch),
		names: make([]unix.RawSockaddrInet6, batch), oob: make([]byte, batch*oobSize),
		hdrLen: hdrLen, hdr: make([]byte, batch*hdrLen), saved: make([][]byte, batch)}
	r.fn = r.read
	r.ctl = func(fd uintptr) { r.read(fd) }
	return r
}

// recv fills the buffers of pkts (up to the batch size) and returns how
// many datagrams arrived.
func (r *receiver) recv(pkts []nic.Packet) (int, error) {
	r.setup(pkts)
	if err := r.wait(); err != nil {
		return 0, err
	}
	if r.errno != 0 {
		return 0, r.errno
	}
	return r.n, nil
}

// setup points the message headers at the buffers of pkts for the next
// read.
func (r *receiver) setup(pkts []nic.Packet) {
	n := min(len(pkts), len(r.hdrs))
	for i := 0; i < n; i++ {
		b := pkts[i].Buf[:cap(pkts[i].Buf)]
		h := &r.hdrs[i].Hdr
		iov := r.iovs[2*i : 2*i+2]
		k := 0
		if r.hdrLen > 0 {
			iov[0].Base = &r.hdr[i*r.hdrLen]
			iov[0].SetLen(r.hdrLen)
			k = 1
		}
		iov[k].Base = nil
		if len(b) > 0 {
			iov[k].Base = &b[0]
		}
		iov[k].SetLen(len(b))
		h.Iov = &iov[0]
		h.SetIovlen(k + 1)
		h.Name = (*byte)(unsafe.Pointer(&r.names[i]))
		h.Namelen = unix.SizeofSockaddrInet6
		h.Control = &r.oob[i*oobSize]
		h.SetControllen(oobSize)
		h.Flags = 0
		r.hdrs[i].Len = 0
	}
	r.want, r.n, r.errno = n, 0, 0
	r.bigSet = false
}

// wait runs read through the poller (blocking) or once (nonblock).
func (r *receiver) wait() error {
	if r.nonblock {
		return r.rc.Control(r.ctl)
	}
	for {
		// An Interrupt is for RecvEachUntil: a plain receive waits on.
		if err := r.rc.Read(r.fn); err != errInterrupted {
			return err
		}
	}
}

// read is called by the runtime poller; false means "would block: wait".
//
// The call is raw, as is sender.write's sendmmsg: neither blocks
// (MSG_DONTWAIT), and one made through the runtime's syscall entry, in
// a process that was idle, wakes the runtime's monitor thread (sysmon),
// which then polls every 20 us for a while: in a daemon answering a
// ping-pong that was a thread wake-up per message on a busy core, and
// `ib_write_lat` through two daemons went from 128-141 to 68-73 us
// (docs/performance.md).
func (r *receiver) read(fd uintptr) bool {
	r.calls++
	n, _, errno := unix.RawSyscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&r.hdrs[0])), uintptr(r.want), unix.MSG_DONTWAIT, 0, 0)
	if errno == unix.EAGAIN {
		return false
	}
	if errno == unix.EINTR {
		return false
	}
	r.n, r.errno = int(n), errno
	r.bigSet = false
	return true
}

// header returns the header scratch of message i (hdrLen > 0).
func (r *receiver) header(i int) []byte { return r.hdr[i*r.hdrLen : (i+1)*r.hdrLen] }

// message returns what recvmmsg reported for message i: length (header
// scratch included), flags, source, and the control bytes.
func (r *receiver) message(i int) (n int, flags int32, src netip.AddrPort, oob []byte) {
	h := &r.hdrs[i].Hdr
	oob = r.oob[i*oobSize : i*oobSize+min(int(h.Controllen), oobSize)]
	return int(r.hdrs[i].Len), h.Flags, sockaddrToAddrPort(&r.names[i], h.Namelen), oob
}

// sockaddrToAddrPort decodes a sockaddr_in or sockaddr_in6.
func sockaddrToAddrPort(sa *unix.RawSockaddrInet6, namelen uint32) netip.AddrPort {
	switch sa.Family {
	case unix.AF_INET:
		if namelen < unix.SizeofSockaddrInet4 {
			return netip.AddrPort{}
		}
		sa4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&sa4.Port))[:])
		return netip.AddrPortFrom(netip.AddrFrom4(sa4.Addr), port)
	case unix.AF_INET6:
		if namelen < unix.SizeofSockaddrInet6 {
			return netip.AddrPort{}
		}
		port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:])
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr).Unmap(), port)
	}
	return netip.AddrPort{}
}
