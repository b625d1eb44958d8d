package udp

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/icrc"
	"github.com/softroce/softroce/nic"
)

// Offload chooses whether the link uses a kernel UDP offload (GSO on send,
// GRO on receive).
type Offload uint8

const (
	// OffloadAuto uses the offload when the kernel supports it (probed
	// at Open).
	OffloadAuto Offload = iota
	// OffloadOn requires it: Open fails without kernel support.
	OffloadOn
	// OffloadOff never uses it.
	OffloadOff
)

func (o Offload) String() string {
	switch o {
	case OffloadAuto:
		return "auto"
	case OffloadOn:
		return "on"
	case OffloadOff:
		return "off"
	}
	return "unknown"
}

// UDP_SEGMENT and UDP_GRO (linux/udp.h), at level SOL_UDP.
const (
	udpSegment = 103
	udpGRO     = 104
)

// maxGSOSegments is the kernel's UDP_MAX_SEGMENTS of Linux 4.18 on (later
// kernels allow more; this many is always accepted).
const maxGSOSegments = 64

// groBufSize holds the largest datagram a socket can return: a UDP payload
// of up to 65535 bytes minus headers, or a whole IPv4 packet on the raw
// socket.
const groBufSize = 1 << 16

// maxGSOPayload is the largest UDP payload of one super-packet: the IPv4
// total length (or IPv6 payload length) is 16 bits.
func maxGSOPayload(v6 bool) int {
	if v6 {
		return 65535 - 8
	}
	return 65535 - 20 - 8
}

// gsoIovs bounds the iovecs of one sendmmsg call (one per packet).
const gsoIovs = 1024

// sender issues sendmmsg(2) directly: a message is either one packet or,
// with GSO, a run of packets to one peer laid end to end (one iovec each,
// no copy) with a UDP_SEGMENT control message, which the kernel (or the
// NIC) splits back into those packets. It allocates nothing.
type sender struct {
	rc    syscall.RawConn
	hdrs  []unix.Mmsghdr
	iovs  []unix.Iovec
	names []unix.RawSockaddrInet6
	oob   []byte // per message: UDP_SEGMENT, TTL and TOS cmsgs (oobPerMsg bytes)
	first []int  // per message: index in the caller's batch of its first packet
	count []int  // per message: packets in it
	bytes []int  // per message: bytes in it
	fn    func(fd uintptr) bool
	from  int // first message to send
	want  int // messages to send
	n     int // messages sent by the last call
	errno syscall.Errno
}

var (
	gsoCmsgSpace = unix.CmsgSpace(2)
	// oobPerMsg fits a message's UDP_SEGMENT and, for an address
	// vector's non-default values, its TTL and TOS (IPv6: hop limit and
	// traffic class), each an int.
	oobPerMsg = gsoCmsgSpace + 2*unix.CmsgSpace(4)
)

func newSender(rc syscall.RawConn, batch int) *sender {
	s := &sender{rc: rc, hdrs: make([]unix.Mmsghdr, batch), iovs: make([]unix.Iovec, gsoIovs),
		names: make([]unix.RawSockaddrInet6, batch), oob: make([]byte, batch*oobPerMsg),
		first: make([]int, batch), count: make([]int, batch), bytes: make([]int, batch)}
	s.fn = s.write
	return s
}

func (s *sender) write(fd uintptr) bool {
	// Raw (see receiver.read): MSG_DONTWAIT never blocks.
	n, _, errno := unix.RawSyscall6(unix.SYS_SENDMMSG, fd, uintptr(unsafe.Pointer(&s.hdrs[s.from])), uintptr(s.want), unix.MSG_DONTWAIT, 0, 0)
	if errno == unix.EAGAIN || errno == unix.EINTR {
		return false
	}
	s.n, s.errno = int(n), errno
	return true
}

// putName writes dst as the sockaddr of message m.
func (s *sender) putName(m int, dst netip.AddrPort, v6 bool) uint32 {
	sa := &s.names[m]
	if !v6 {
		sa4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		*sa4 = unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: dst.Addr().As4()}
		binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&sa4.Port))[:], dst.Port())
		return unix.SizeofSockaddrInet4
	}
	*sa = unix.RawSockaddrInet6{Family: unix.AF_INET6, Addr: dst.Addr().As16()}
	binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:], dst.Port())
	return unix.SizeofSockaddrInet6
}

// cmsg appends a control message of n data bytes to message m and
// returns its data.
func (s *sender) cmsg(m int, level, typ int32, n int) []byte {
	hd := &s.hdrs[m].Hdr
	base, off := m*oobPerMsg, int(hd.Controllen)
	b := s.oob[base+off : base+off+unix.CmsgSpace(n)]
	clear(b)
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
	h.Level, h.Type = level, typ
	h.SetLen(unix.CmsgLen(n))
	hd.Control = &s.oob[base]
	hd.SetControllen(off + len(b))
	return b[unix.CmsgLen(0):]
}

// putSegment sets the UDP_SEGMENT control message of message m.
func (s *sender) putSegment(m int, size int) {
	binary.NativeEndian.PutUint16(s.cmsg(m, unix.SOL_UDP, udpSegment, 2), uint16(size))
}

// putIPFields gives message m the TTL and TOS (IPv6: hop limit and
// traffic class) p asks for, each only when it differs from what the
// socket sends anyway (HopLimit 0 or the socket's default, TClass 0).
func (s *sender) putIPFields(m int, p *nic.Packet, v6 bool, defHop uint8) {
	level, ttl, tos := int32(unix.IPPROTO_IP), int32(unix.IP_TTL), int32(unix.IP_TOS)
	if v6 {
		level, ttl, tos = unix.IPPROTO_IPV6, unix.IPV6_HOPLIMIT, unix.IPV6_TCLASS
	}
	if p.HopLimit != 0 && p.HopLimit != defHop {
		binary.NativeEndian.PutUint32(s.cmsg(m, level, ttl, 4), uint32(p.HopLimit))
	}
	if p.TClass != 0 {
		binary.NativeEndian.PutUint32(s.cmsg(m, level, tos, 4), uint32(p.TClass))
	}
}

// sendmmsg sends messages [from, to) and returns how many went out.
func (s *sender) sendmmsg(from, to int) (int, error) {
	s.from, s.want, s.n, s.errno = from, to-from, 0, 0
	if err := s.rc.Write(s.fn); err != nil {
		return 0, err
	}
	if s.errno != 0 {
		return 0, s.errno
	}
	return s.n, nil
}

// probeGSO reports whether the kernel knows UDP_SEGMENT (Linux 4.18 on).
func probeGSO(fd int) bool {
	_, err := unix.GetsockoptInt(fd, unix.SOL_UDP, udpSegment)
	return err == nil
}

// gsoRefused reports whether err says the kernel or the route cannot
// segment (no checksum offload on the path, an xfrm route, an old
// kernel): the link then falls back to one packet per message.
func gsoRefused(err error) bool {
	return errors.Is(err, syscall.EIO) || errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ENOPROTOOPT) || errors.Is(err, syscall.EOPNOTSUPP)
}

// synthID is synth with the IPv4 ID the segment will carry.
func synthID(src, dst netip.AddrPort, id uint16, roce []byte) (uint32, error) {
	if !src.Addr().Is4() {
		return synth(src, dst, roce)
	}
	return synthV4(src, dst, id, true, roce)
}

// gatherRun returns the end (exclusive) of the GSO run that starts at
// pkts[i], sent to dst: following packets to the same peer, each exactly
// as long as the first except the last, which may be shorter, up to the
// kernel's segment and size limits and the iovecs left. A run must be
// longer than one packet can be, or it is sent as single packets.
func (l *Link) gatherRun(pkts []nic.Packet, i int, dst netip.AddrPort, iovLeft int) int {
	size := pkts[i].N
	limit := min(maxGSOSegments, iovLeft, maxGSOPayload(l.v6)/size)
	j, total := i+1, size
	for j < len(pkts) && j-i < limit {
		p := &pkts[j]
		if p.N > size {
			break
		}
		d, ok := l.dest(p)
		if !ok || d != dst || p.HopLimit != pkts[i].HopLimit || p.TClass != pkts[i].TClass {
			break // a run shares one header's TTL and TOS
		}
		total += p.N
		j++
		if p.N < size {
			break // a shorter packet ends the run
		}
	}
	if total <= l.MaxPacket() {
		// A raw-socket receiver (IPv4CheckRaw) sees a super-packet
		// whole and can tell it from a packet only by its length.
		return i + 1
	}
	return j
}

// sendPackets is Send (computeICRC) and SendRaw: packets go out in runs
// (GSO) or one per message.
func (l *Link) sendPackets(pkts []nic.Packet, computeICRC bool) (int, error) {
	l.txMu.Lock()
	defer l.txMu.Unlock()
	s := l.tx
	done := 0
	for done < len(pkts) {
		// Gather up to one batch of messages.
		m, iov, next := 0, 0, done
		for next < len(pkts) && m < len(s.hdrs) && iov < len(s.iovs) {
			p := &pkts[next]
			dst, ok := l.dest(p)
			if !ok {
				l.txErrors.Add(1)
				next++
				continue
			}
			end := next + 1
			// SendRaw keeps the caller's ICRCs, computed for ID 0:
			// one packet per message.
			if l.gsoOn && computeICRC {
				end = l.gatherRun(pkts, next, dst, len(s.iovs)-iov)
			}
			h := &s.hdrs[m]
			h.Hdr = unix.Msghdr{}
			h.Len = 0
			bytes := 0
			for k := next; k < end; k++ {
				q := &pkts[k]
				if computeICRC {
					// Segment k-next carries IPv4 ID k-next: the kernel
					// numbers segments upward from the super-packet's
					// ID, which is 0 for this socket (docs/platform.md).
					if crc, err := synthID(l.local, dst, uint16(k-next), q.Buf[:q.N]); err == nil {
						icrc.Put(q.Buf[:q.N], crc)
					}
				}
				s.iovs[iov+k-next].Base = &q.Buf[0]
				s.iovs[iov+k-next].SetLen(q.N)
				bytes += q.N
			}
			h.Hdr.Iov = &s.iovs[iov]
			h.Hdr.SetIovlen(end - next)
			h.Hdr.Name = (*byte)(unsafe.Pointer(&s.names[m]))
			h.Hdr.Namelen = s.putName(m, dst, l.v6)
			if end-next > 1 {
				s.putSegment(m, pkts[next].N)
			}
			if q := &pkts[next]; q.HopLimit|q.TClass != 0 {
				s.putIPFields(m, q, l.v6, l.defHop)
			}
			s.first[m], s.count[m], s.bytes[m] = next, end-next, bytes
			iov += end - next
			m++
			next = end
		}
		sent := 0
		var err error
		for sent < m && err == nil {
			var n int
			n, err = s.sendmmsg(sent, m)
			if err == nil && n <= 0 {
				err = errNoProgress
			}
			for k := sent; k < sent+n; k++ {
				l.txPackets.Add(uint64(s.count[k]))
				l.txBytes.Add(uint64(s.bytes[k]))
				if s.count[k] > 1 {
					l.gsoSends.Add(1)
					l.gsoSegments.Add(uint64(s.count[k]))
				}
			}
			sent += n
		}
		for k := 0; k < iov; k++ {
			s.iovs[k].Base = nil // do not pin the caller's buffers
		}
		if err != nil {
			if l.closed.Load() || errors.Is(err, errClosed) {
				return s.first[sent], errClosed
			}
			if s.count[sent] > 1 && gsoRefused(err) {
				// The path cannot segment: send the rest, this run
				// included, one packet per message (ICRCs recomputed
				// for ID 0) from now on.
				l.gsoOn = false
				l.gsoFallbacks.Add(1)
				done = s.first[sent]
				continue
			}
			// sendmmsg reports the error of the first message it could
			// not send: that one failed, the ones after it were not tried.
			l.txErrors.Add(1)
			return s.first[sent], sendError(l, pkts[s.first[sent]].Remote, err)
		}
		done = next
	}
	return len(pkts), nil
}
