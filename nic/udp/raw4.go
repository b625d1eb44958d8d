package udp

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/icrc"
	"github.com/softroce/softroce/nic"
)

// rawHdrLen is what the receiver puts aside for each datagram on the raw
// socket: an IPv4 header without options and the UDP header.
const rawHdrLen = 20 + 8

// openRaw4 sets up IPv4CheckRaw: a raw IPv4 socket, bound to the
// link's address and filtered (classic BPF) to unfragmented UDP to the
// link's port, receives the datagrams with their IPv4 header, so the ICRC
// is verified over the ID the peer really sent. The UDP socket stays
// bound, so the kernel does not answer ICMP port unreachable, but a
// filter that accepts nothing keeps it from queueing a second copy.
func (l *Link) openRaw4(sockBuf int) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, unix.IPPROTO_UDP)
	if err != nil {
		return fmt.Errorf("udp: IPv4CheckRaw (VerifyIPv4) needs a raw IPv4 socket (root or CAP_NET_RAW): %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			unix.Close(fd)
		}
	}()
	if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: l.local.Addr().As4()}); err != nil {
		return fmt.Errorf("udp: bind raw socket to %v: %w", l.local.Addr(), err)
	}
	// The raw socket sees packets from the IPv4 header on.
	accept, err := bpf.Assemble([]bpf.Instruction{
		bpf.LoadAbsolute{Off: 6, Size: 2},                           // flags, fragment offset
		bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: 0x3fff, SkipTrue: 4}, // MF or offset: a fragment
		bpf.LoadMemShift{Off: 0},                                    // X = IHL*4
		bpf.LoadIndirect{Off: 2, Size: 2},                           // UDP destination port
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(l.local.Port()), SkipFalse: 1},
		bpf.RetConstant{Val: 0x40000},
		bpf.RetConstant{Val: 0},
	})
	if err != nil {
		return fmt.Errorf("udp: assemble socket filter: %w", err)
	}
	if err := attachFilter(fd, accept); err != nil {
		return fmt.Errorf("udp: filter raw socket: %w", err)
	}
	if sockBuf > 0 && unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, sockBuf) != nil {
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, sockBuf)
	}
	drop, _ := bpf.Assemble([]bpf.Instruction{bpf.RetConstant{Val: 0}})
	var ferr error
	if err := l.sock.Control(func(ufd uintptr) { ferr = attachFilter(int(ufd), drop) }); err != nil || ferr != nil {
		return fmt.Errorf("udp: filter UDP socket: %v %v", err, ferr)
	}
	if l.raw, err = newSock(fd); err != nil {
		return err
	}
	ok = true
	l.rx = newReceiver(l.raw, l.batch, rawHdrLen)
	l.rawScratch = make([]byte, 60+8+l.mtu)
	return nil
}

func attachFilter(fd int, prog []bpf.RawInstruction) error {
	f := make([]unix.SockFilter, len(prog))
	for i, ins := range prog {
		f[i] = unix.SockFilter{Code: ins.Op, Jt: ins.Jt, Jf: ins.Jf, K: ins.K}
	}
	return unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &unix.SockFprog{Len: uint16(len(f)), Filter: &f[0]})
}

// acceptRaw fills p from datagram i of the raw socket (IPv4 header, UDP
// header, payload) and verifies the ICRC over the header as received.
func (l *Link) acceptRaw(n int, flags int32, h []byte, p *nic.Packet) bool {
	if flags&unix.MSG_TRUNC != 0 {
		l.rxTruncated.Add(1)
		return false
	}
	if n < rawHdrLen || h[0]>>4 != 4 || h[9] != unix.IPPROTO_UDP {
		l.rxMalformed.Add(1)
		return false
	}
	ihl := int(h[0]&0x0f) * 4
	body := p.Buf[:n-rawHdrLen]
	ip, udp := h[:20], h[20:28]
	if ihl != 20 {
		// IP options: the header runs on into the packet buffer. Stage
		// the whole header aside and move the payload down.
		extra := ihl - 20
		if ihl < 20 || len(body) < extra {
			l.rxMalformed.Add(1)
			return false
		}
		full := l.rawScratch[:ihl+8]
		copy(full, h)
		copy(full[rawHdrLen:], body[:extra])
		ip, udp = full[:ihl], full[ihl:ihl+8]
		body = p.Buf[:copy(p.Buf, body[extra:])]
	}
	tl := int(binary.BigEndian.Uint16(ip[2:]))
	ulen := int(binary.BigEndian.Uint16(udp[4:]))
	if ulen < 8+12+icrc.Len || ulen-8 > len(body) || ihl+ulen > tl {
		l.rxMalformed.Add(1)
		return false
	}
	roce := body[:ulen-8]
	src := netip.AddrPortFrom(netip.AddrFrom4([4]byte(ip[12:16])), binary.BigEndian.Uint16(udp[0:]))
	dst := netip.AddrPortFrom(netip.AddrFrom4([4]byte(ip[16:20])), binary.BigEndian.Uint16(udp[2:]))
	var crc uint32
	var err error
	if ihl == 20 && ip[6]&^0x40 == 0 && ip[7] == 0 {
		crc, err = synthV4(src, dst, binary.BigEndian.Uint16(ip[4:]), ip[6]&0x40 != 0, roce)
	} else {
		// Options or odd flags: hash the real header with the UDP
		// segment staged after it.
		seg := l.rawScratch[ihl+8 : ihl+8+8+len(roce)]
		copy(seg, udp)
		copy(seg[8:], roce)
		crc, err = icrc.IPv4(ip, seg)
	}
	if err != nil {
		l.rxMalformed.Add(1)
		return false
	}
	if crc != icrc.Wire(roce) {
		l.rxBad.Add(1)
		return false
	}
	p.N = len(roce)
	p.Remote = src
	p.Local = dst.Addr()
	p.SrcPort = 0
	p.ICRC = nic.ICRCVerified
	// The header as received, for a UD receiver's GRH (which holds a
	// 20-byte header only).
	p.IPKnown, p.HopLimit, p.TClass, p.IPID, p.FlowLabel = ihl == 20, ip[8], ip[1], binary.BigEndian.Uint16(ip[4:]), 0
	l.rxVerified.Add(1)
	l.rxPackets.Add(1)
	l.rxBytes.Add(uint64(p.N))
	return true
}

// synthV4 is synth for a received IPv4 header: the peer's ID and DF.
func synthV4(src, dst netip.AddrPort, id uint16, df bool, roce []byte) (uint32, error) {
	s, d := src.Addr().As4(), dst.Addr().As4()
	h := icrc.Header{Src: s[:], Dst: d[:], ID: id, DF: df, SrcPort: src.Port(), DstPort: dst.Port()}
	return icrc.Synth(&h, roce)
}
