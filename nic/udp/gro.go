package udp

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/icrc"
	"github.com/softroce/softroce/nic"
)

// setupOffload probes the kernel and turns GSO and GRO on as cfg asks.
func (l *Link) setupOffload(cfg Config) error {
	raw := l.raw != nil
	var gsoOK, groOK bool
	err := l.sock.Control(func(fd uintptr) {
		gsoOK = probeGSO(int(fd))
		// The raw socket of IPv4CheckRaw receives instead of the UDP
		// socket: coalescing would only hide the IDs of real peers'
		// packets from it.
		if cfg.GRO != OffloadOff && !raw {
			groOK = unix.SetsockoptInt(int(fd), unix.SOL_UDP, udpGRO, 1) == nil
		}
	})
	if err != nil {
		return fmt.Errorf("udp: raw socket: %w", err)
	}
	switch cfg.GSO {
	case OffloadOn:
		if !gsoOK {
			return fmt.Errorf("udp: GSO (UDP_SEGMENT) is not supported by this kernel")
		}
		l.gsoOn = true
	case OffloadAuto:
		l.gsoOn = gsoOK
	case OffloadOff:
	default:
		return fmt.Errorf("udp: unknown GSO setting %d", cfg.GSO)
	}
	switch cfg.GRO {
	case OffloadOn, OffloadAuto:
		if raw {
			// Splitting needs nothing of the kernel here.
			l.gro = true
		} else if groOK {
			l.gro = true
		} else if cfg.GRO == OffloadOn {
			return fmt.Errorf("udp: GRO (UDP_GRO) is not supported by this kernel")
		}
	case OffloadOff:
	default:
		return fmt.Errorf("udp: unknown GRO setting %d", cfg.GRO)
	}
	if l.gro {
		l.rx.big = make([]byte, len(l.rx.hdrs)*groBufSize)
	}
	return nil
}

// GSO reports whether Send sends runs of packets as GSO super-packets now
// (it turns off when the path refuses one).
func (l *Link) GSO() bool {
	l.txMu.Lock()
	defer l.txMu.Unlock()
	return l.gsoOn
}

// GRO reports whether Recv takes coalesced datagrams and splits them.
func (l *Link) GRO() bool { return l.gro }

// OffloadStats are the counters of the offloads.
type OffloadStats struct {
	GSOSends     uint64 // super-packets sent
	GSOSegments  uint64 // packets sent in them
	GSOFallbacks uint64 // GSO sends the path refused (GSO is then off)
	RxSplit      uint64 // coalesced datagrams received and split
}

// OffloadStats returns the offload counters.
func (l *Link) OffloadStats() OffloadStats {
	return OffloadStats{GSOSends: l.gsoSends.Load(), GSOSegments: l.gsoSegments.Load(),
		GSOFallbacks: l.gsoFallbacks.Load(), RxSplit: l.rxSplit.Load()}
}

// recvBig reads up to a batch of datagrams, each into its own 64 KiB
// buffer, for drain to split.
func (r *receiver) recvBig() error {
	if !r.bigSet {
		r.setupBig()
	}
	if err := r.wait(); err != nil {
		return err
	}
	if r.errno != 0 {
		r.n = 0
		return r.errno
	}
	return nil
}

// setupBig points the message headers at the 64 KiB buffers.
func (r *receiver) setupBig() {
	n := len(r.hdrs)
	for i := 0; i < n; i++ {
		h := &r.hdrs[i].Hdr
		iov := &r.iovs[2*i]
		iov.Base = &r.big[i*groBufSize]
		iov.SetLen(groBufSize)
		h.Iov = iov
		h.SetIovlen(1)
		h.Name = (*byte)(unsafe.Pointer(&r.names[i]))
		h.Namelen = unix.SizeofSockaddrInet6
		h.Control = &r.oob[i*oobSize]
		h.SetControllen(oobSize)
		h.Flags = 0
		r.hdrs[i].Len = 0
	}
	r.want, r.n, r.errno = n, 0, 0
	r.cur, r.off = 0, 0
	r.bigSet = true
}

// groSize finds the UDP_GRO control message: the segment size of a
// coalesced datagram, or 0.
func groSize(oob []byte) int {
	for len(oob) >= unix.SizeofCmsghdr {
		ln := int(binary.NativeEndian.Uint64(oob))
		level := int32(binary.NativeEndian.Uint32(oob[8:]))
		typ := int32(binary.NativeEndian.Uint32(oob[12:]))
		if ln < unix.SizeofCmsghdr || ln > len(oob) {
			return 0
		}
		if level == unix.SOL_UDP && typ == udpGRO && ln >= unix.SizeofCmsghdr+2 {
			data := oob[unix.SizeofCmsghdr:ln]
			if len(data) >= 4 {
				return int(binary.NativeEndian.Uint32(data))
			}
			return int(binary.NativeEndian.Uint16(data))
		}
		adv := cmsgAlign(ln)
		if adv > len(oob) {
			return 0
		}
		oob = oob[adv:]
	}
	return 0
}

// drain delivers the packets of the datagrams recvBig read, splitting
// coalesced ones, into pkts; what does not fit waits for the next Recv.
func (l *Link) drain(pkts []nic.Packet) int {
	r := l.rx
	k := 0
	if r.alias {
		// Only as many packets as there are saved slots can alias.
		pkts = pkts[:min(len(pkts), len(r.saved))]
	}
	for k < len(pkts) && r.cur < r.n {
		n, flags, src, oob := r.message(r.cur)
		if flags&unix.MSG_TRUNC != 0 || n > groBufSize {
			l.rxTruncated.Add(1)
			r.nextMessage()
			continue
		}
		d := r.big[r.cur*groBufSize : r.cur*groBufSize+n]
		if r.alias && k < len(r.saved) && r.saved[k] == nil {
			r.saved[k] = pkts[k].Buf
		}
		var ok bool
		if l.raw != nil {
			ok = l.drainRaw(d, flags, &pkts[k])
		} else {
			ok = l.drainUDP(d, flags, src, oob, &pkts[k])
		}
		if ok {
			k++
		}
	}
	return k
}

func (r *receiver) nextMessage() { r.cur, r.off, r.seg = r.cur+1, 0, 0 }

// take gives p the bytes src: in place with alias (p.Buf becomes src,
// capped at its length), or copied into p.Buf. It reports false (and
// counts a truncation) when they do not fit p.Buf.
func (l *Link) take(p *nic.Packet, src []byte) bool {
	if l.rx.alias {
		p.Buf = src[:len(src):len(src)]
		return true
	}
	if len(src) > cap(p.Buf) {
		l.rxTruncated.Add(1)
		return false
	}
	p.Buf = p.Buf[:cap(p.Buf)]
	copy(p.Buf, src)
	return true
}

// restore puts the caller's buffers back into pkts after an aliased
// delivery.
func (r *receiver) restore(pkts []nic.Packet) {
	for i, b := range r.saved {
		if b == nil {
			continue
		}
		pkts[i].Buf, r.saved[i] = b, nil
	}
}

// drainUDP takes the next segment of datagram d from the UDP socket.
func (l *Link) drainUDP(d []byte, flags int32, src netip.AddrPort, oob []byte, p *nic.Packet) bool {
	r := l.rx
	if r.off == 0 {
		r.seg = groSize(oob)
		if r.seg <= 0 || r.seg >= len(d) {
			r.seg = len(d)
		} else {
			l.rxSplit.Add(1)
		}
	}
	seg := d[r.off:min(r.off+r.seg, len(d))]
	r.off += len(seg)
	if r.off >= len(d) {
		r.nextMessage()
	}
	if !l.take(p, seg) {
		return false
	}
	return l.accept(len(seg), flags, src, oob, p)
}

// drainRaw takes the next packet of datagram d (IPv4 header on) from the
// raw socket. A datagram longer than the MTU allows is a GSO super-packet
// that crossed to this host unsegmented: its segments are the sender's
// packets, segment j carrying the super-packet's ID plus j. The raw
// socket does not say the segment size, so it is found as the length
// whose ICRC is right for the first segment.
func (l *Link) drainRaw(d []byte, flags int32, p *nic.Packet) bool {
	r := l.rx
	if len(d) < rawHdrLen {
		l.rxMalformed.Add(1)
		r.nextMessage()
		return false
	}
	ihl := int(d[0]&0x0f) * 4
	ulen := int(binary.BigEndian.Uint16(d[24:]))
	if r.off == 0 && (ihl != 20 || ulen-8 <= l.MaxPacket() || ulen+20 != len(d) || d[6] != 0x40 || d[7] != 0) {
		// One packet, as acceptRaw takes it. A super-packet has DF
		// set; a large datagram without it was reassembled from
		// fragments, and is not searched for segments (a peer could
		// make every such datagram cost a full search).
		r.nextMessage()
		if !l.take(p, d[rawHdrLen:]) {
			return false
		}
		return l.acceptRaw(len(d), flags, d[:rawHdrLen], p)
	}
	payload := d[rawHdrLen:]
	src := netip.AddrPortFrom(netip.AddrFrom4([4]byte(d[12:16])), binary.BigEndian.Uint16(d[20:]))
	dst := netip.AddrPortFrom(netip.AddrFrom4([4]byte(d[16:20])), binary.BigEndian.Uint16(d[22:]))
	base, df := binary.BigEndian.Uint16(d[4:]), d[6]&0x40 != 0
	if r.off == 0 {
		r.seg = l.findSegment(src, dst, base, df, payload)
		if r.seg == 0 {
			l.rxBad.Add(1)
			r.nextMessage()
			return false
		}
		l.rxSplit.Add(1)
	}
	j := r.off / r.seg
	seg := payload[r.off:min(r.off+r.seg, len(payload))]
	r.off += len(seg)
	if r.off >= len(payload) {
		r.nextMessage()
	}
	if !l.take(p, seg) {
		return false
	}
	h := r.segHdr[:]
	copy(h, d[:rawHdrLen])
	binary.BigEndian.PutUint16(h[2:], uint16(rawHdrLen+len(seg)))
	binary.BigEndian.PutUint16(h[4:], base+uint16(j))
	binary.BigEndian.PutUint16(h[24:], uint16(8+len(seg)))
	return l.acceptRaw(rawHdrLen+len(seg), 0, h, p)
}

// findSegment returns the segment size of a super-packet's payload: the
// length s (a multiple of 4, as every RoCE packet is) for which the first
// s bytes carry a right ICRC under ID id, or 0. It tries the last size
// found, then full path-MTU packets behind the usual headers, then every
// length: the ICRC's 32 bits make a false match unlikely, and each
// following segment is checked on its own.
func (l *Link) findSegment(src, dst netip.AddrPort, id uint16, df bool, payload []byte) int {
	r := l.rx
	hi := min(l.MaxPacket(), len(payload)-1)
	try := func(s int) bool {
		if s < 12+icrc.Len || s > hi || s%4 != 0 {
			return false
		}
		crc, err := synthV4(src, dst, id, df, payload[:s])
		return err == nil && crc == icrc.Wire(payload[:s])
	}
	if try(r.lastSeg) {
		return r.lastSeg
	}
	found := 0
	// BTH; BTH+ImmDt or +AETH; BTH+RETH; BTH+RETH+ImmDt.
	for _, hdr := range [...]int{12, 16, 28, 32} {
		for pmtu := 256; pmtu <= 4096 && found == 0; pmtu <<= 1 {
			if try(hdr + pmtu + icrc.Len) {
				found = hdr + pmtu + icrc.Len
			}
		}
	}
	for s := 12 + icrc.Len; s <= hi && found == 0; s += 4 {
		if try(s) {
			found = s
		}
	}
	if found != 0 {
		r.lastSeg = found
	}
	return found
}
