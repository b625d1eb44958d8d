package afxdp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"net"
	"net/netip"
	"os"
	"runtime"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/icrc"
	"github.com/softroce/softroce/internal/rawsys"
	"github.com/softroce/softroce/nic"
)

const (
	ethLen  = 14
	ipv4Len = 20
	ipv6Len = 40
	udpLen  = 8
	ttl     = 64
)

// endpoints returns the addresses and ports p goes out with, or false when
// the link cannot send it.
func (l *Link) endpoints(p *nic.Packet) (src, dst netip.Addr, sport, dport uint16, ok bool) {
	dst = p.Remote.Addr().Unmap()
	if !dst.IsValid() || dst.IsUnspecified() || p.N < 12+icrc.Len || p.N > len(p.Buf) {
		return
	}
	src = l.addr4
	if dst.Is6() {
		src = l.addr6
	}
	if p.Local.IsValid() {
		if lc := p.Local.Unmap(); lc == l.addr4 || lc == l.addr6 {
			src = lc
		} else {
			return
		}
	}
	if !src.IsValid() || src.Is4() != dst.Is4() || p.N > l.mtu-nic.Overhead(dst.Is6()) {
		return
	}
	sport, dport = p.SrcPort, p.Remote.Port()
	if sport == 0 {
		sport = l.port
	}
	if dport == 0 {
		dport = nic.RoCEv2Port
	}
	return src, dst, sport, dport, true
}

// synth computes the ICRC over a 20-byte IPv4 header with DF and the given
// ID (this link sends ID 0), or an IPv6 header without extension headers;
// the masked fields (TOS, TTL, checksums, traffic class, flow label, hop
// limit) do not matter.
func synth(src, dst netip.Addr, id, sport, dport uint16, roce []byte) (uint32, error) {
	var s, d [16]byte
	h := icrc.Header{ID: id, DF: true, SrcPort: sport, DstPort: dport}
	if src.Is4() {
		s4, d4 := src.As4(), dst.As4()
		copy(s[:], s4[:])
		copy(d[:], d4[:])
		h.Src, h.Dst = s[:4], d[:4]
	} else {
		s, d = src.As16(), dst.As16()
		h.Src, h.Dst = s[:], d[:]
	}
	return icrc.Synth(&h, roce)
}

// PutICRC implements nic.RawSender.
func (l *Link) PutICRC(p *nic.Packet) error {
	src, dst, sport, dport, ok := l.endpoints(p)
	if !ok {
		return fmt.Errorf("afxdp: cannot send a %d-byte packet to %v from %v on %s (MTU %d)", p.N, p.Remote, p.Local, l.ifname, l.mtu)
	}
	crc, err := synth(src, dst, 0, sport, dport, p.Buf[:p.N])
	if err != nil {
		return fmt.Errorf("afxdp: compute ICRC: %w", err)
	}
	icrc.Put(p.Buf[:p.N], crc)
	return nil
}

// Send implements nic.Link. Packets the link cannot send (no destination,
// wrong family, too large) are dropped and counted in TxErrors. When the
// next hop of a destination is not known, Send does not wait for it: it
// starts resolving it in the background and, as nic.Link specifies,
// returns the index of that packet (every packet before it is on the TX
// ring) with a *NeighbourError whose Err is ErrResolving (or, once the
// resolution has failed, the cached *NeighbourError or *RouteError, for
// a second). The caller skips that packet and sends the rest; a reliable
// transport retransmits it once the neighbour is known.
func (l *Link) Send(pkts []nic.Packet) (int, error) {
	for i := range pkts {
		_ = l.PutICRC(&pkts[i]) // failures are counted by SendRaw
	}
	return l.SendRaw(pkts)
}

// SendRaw implements nic.RawSender.
func (l *Link) SendRaw(pkts []nic.Packet) (int, error) {
	l.txMu.Lock()
	defer l.txMu.Unlock()
	if l.closed.Load() {
		return 0, net.ErrClosed
	}
	x := l.socks[0]
	defer l.armTxRetry(x) // runs before the unlock
	x.reclaim()
	var (
		lastDst netip.Addr
		lastMAC [6]byte
		queued  int
		bytes   uint64
	)
	flush := func() error {
		if queued == 0 {
			return nil
		}
		if err := x.kick(); err != nil {
			return fmt.Errorf("afxdp: transmit on %s: %w", l.ifname, err)
		}
		l.txPackets.Add(uint64(queued))
		l.txBytes.Add(bytes)
		queued, bytes = 0, 0
		return nil
	}
	for i := range pkts {
		p := &pkts[i]
		src, dst, sport, dport, ok := l.endpoints(p)
		if !ok {
			l.txErrors.Add(1)
			continue
		}
		if dst != lastDst {
			mac, err := l.neigh.lookupNoWait(dst)
			if err != nil {
				l.txErrors.Add(1)
				if ferr := flush(); ferr != nil {
					return i, ferr
				}
				return i, err
			}
			lastDst, lastMAC = dst, mac
		}
		hdr := ethLen + ipv4Len + udpLen
		if dst.Is6() {
			hdr = ethLen + ipv6Len + udpLen
		}
		nfrag := (hdr + p.N + frameSize - 1) / frameSize
		if !l.txRoom(x, nfrag) {
			if err := flush(); err != nil {
				return i, err
			}
			if !l.waitTxRoom(x, nfrag) {
				l.txErrors.Add(1) // the kernel is not taking frames: drop
				continue
			}
		}
		l.writeFrame(x, p, lastMAC, src, dst, sport, dport, hdr, nfrag)
		queued++
		bytes += uint64(p.N)
	}
	if err := flush(); err != nil {
		// The device refused the kick: report it on the last packet, so
		// that n stays an index into pkts.
		return len(pkts) - 1, err
	}
	x.reclaim()
	return len(pkts), nil
}

func (l *Link) txRoom(x *xsk, nfrag int) bool {
	free := x.tx.size - (x.tx.loadProd() - x.tx.loadCons())
	return len(x.txFree) >= nfrag && int(free) >= nfrag
}

// waitTxRoom reclaims completed frames, kicking the kernel, for up to a
// few milliseconds. In copy mode the kernel transmits during the kick, so
// this normally succeeds at once.
func (l *Link) waitTxRoom(x *xsk, nfrag int) bool {
	deadline := time.Now().Add(5 * time.Millisecond)
	for {
		x.reclaim()
		if l.txRoom(x, nfrag) {
			return true
		}
		if x.kick() != nil || time.Now().After(deadline) {
			return false
		}
		runtime.Gosched()
	}
}

// writeFrame builds Ethernet/IP/UDP headers and copies the packet into
// nfrag UMEM frames, chained with XDP_PKT_CONTD, and queues them on the TX
// ring. Room was checked by the caller.
func (l *Link) writeFrame(x *xsk, p *nic.Packet, mac [6]byte, src, dst netip.Addr, sport, dport uint16, hdr, nfrag int) {
	roce := p.Buf[:p.N]
	prod := x.tx.loadProd()
	for f := 0; f < nfrag; f++ {
		a := x.txFree[len(x.txFree)-1]
		x.txFree = x.txFree[:len(x.txFree)-1]
		b := x.umem[a : a+frameSize]
		h := 0
		if f == 0 {
			h = l.writeHeaders(b, mac, src, dst, sport, dport, p.HopLimit, p.TClass, roce)
		}
		c := copy(b[h:], roce)
		roce = roce[c:]
		n := h + c
		d := &x.tx.descs[(prod+uint32(f))&x.tx.mask]
		d.Addr, d.Len, d.Options = a, uint32(n), 0
		if f < nfrag-1 {
			d.Options = unix.XDP_PKT_CONTD
		}
	}
	x.tx.storeProd(prod + uint32(nfrag))
	x.txOut += nfrag
}

// writeHeaders writes Ethernet, IP and UDP headers at the start of b and
// returns their length. hop and tc are the packet's address vector's
// TTL (hop limit; 0: 64) and TOS (traffic class), as rxe writes them.
func (l *Link) writeHeaders(b []byte, mac [6]byte, src, dst netip.Addr, sport, dport uint16, hop, tc uint8, roce []byte) int {
	if hop == 0 {
		hop = ttl
	}
	copy(b[0:6], mac[:])
	copy(b[6:12], l.mac[:])
	ulen := udpLen + len(roce)
	if dst.Is4() {
		binary.BigEndian.PutUint16(b[12:], unix.ETH_P_IP)
		ip := b[ethLen : ethLen+ipv4Len]
		ip[0], ip[1] = 0x45, tc
		binary.BigEndian.PutUint16(ip[2:], uint16(ipv4Len+ulen))
		// ID 0 with DF, as Linux sends from an unconnected UDP socket with
		// IP_PMTUDISC_DO: the ICRC covers the ID (docs/platform.md).
		ip[4], ip[5], ip[6], ip[7] = 0, 0, 0x40, 0
		ip[8], ip[9] = hop, unix.IPPROTO_UDP
		ip[10], ip[11] = 0, 0
		s, d := src.As4(), dst.As4()
		copy(ip[12:16], s[:])
		copy(ip[16:20], d[:])
		binary.BigEndian.PutUint16(ip[10:], ^fold(sum(0, ip)))
		u := b[ethLen+ipv4Len:]
		binary.BigEndian.PutUint16(u[0:], sport)
		binary.BigEndian.PutUint16(u[2:], dport)
		binary.BigEndian.PutUint16(u[4:], uint16(ulen))
		u[6], u[7] = 0, 0
		if l.udpCsum4 {
			// rdma_rxe sends 0 (none) and relies on the ICRC, but a peer
			// on kernel UDP sockets cannot check an IPv4 ICRC (nic/udp):
			// a real checksum lets its kernel drop damaged packets.
			binary.BigEndian.PutUint16(u[6:], udpChecksum(ip[12:20], u[:udpLen], roce))
		}
		return ethLen + ipv4Len + udpLen
	}
	binary.BigEndian.PutUint16(b[12:], unix.ETH_P_IPV6)
	ip := b[ethLen : ethLen+ipv6Len]
	ip[0], ip[1], ip[2], ip[3] = 0x60|tc>>4, tc<<4, 0, 0
	binary.BigEndian.PutUint16(ip[4:], uint16(ulen))
	ip[6], ip[7] = unix.IPPROTO_UDP, hop
	s, d := src.As16(), dst.As16()
	copy(ip[8:24], s[:])
	copy(ip[24:40], d[:])
	u := b[ethLen+ipv6Len:]
	binary.BigEndian.PutUint16(u[0:], sport)
	binary.BigEndian.PutUint16(u[2:], dport)
	binary.BigEndian.PutUint16(u[4:], uint16(ulen))
	u[6], u[7] = 0, 0
	// IPv6 forbids a zero UDP checksum (RFC 8200 8.1): a kernel UDP
	// socket peer would drop the packet.
	binary.BigEndian.PutUint16(u[6:], udpChecksum(ip[8:40], u[:udpLen], roce))
	return ethLen + ipv6Len + udpLen
}

// udpChecksum computes the UDP checksum over the pseudo-header (source and
// destination addresses, protocol, length), the header (checksum field 0)
// and the payload.
func udpChecksum(addrs, udpHdr, payload []byte) uint16 {
	c := sum(0, addrs)
	c += uint64(len(udpHdr)+len(payload)) + unix.IPPROTO_UDP
	c = sum(c, udpHdr)
	c = sum(c, payload)
	cs := ^fold(c)
	if cs == 0 {
		cs = 0xffff // 0 means "no checksum"
	}
	return cs
}

// sum adds b to a ones'-complement accumulator as big-endian 16-bit
// words. Ones'-complement addition does not care about the word size, so
// it adds 64-bit words with end-around carry and leaves the folding to
// fold; b must start on an even offset of the summed data.
func sum(acc uint64, b []byte) uint64 {
	var carry uint64
	for len(b) >= 32 {
		acc, carry = bits.Add64(acc, binary.BigEndian.Uint64(b[0:]), carry)
		acc, carry = bits.Add64(acc, binary.BigEndian.Uint64(b[8:]), carry)
		acc, carry = bits.Add64(acc, binary.BigEndian.Uint64(b[16:]), carry)
		acc, carry = bits.Add64(acc, binary.BigEndian.Uint64(b[24:]), carry)
		b = b[32:]
	}
	for len(b) >= 8 {
		acc, carry = bits.Add64(acc, binary.BigEndian.Uint64(b), carry)
		b = b[8:]
	}
	acc, carry = bits.Add64(acc, carry, 0)
	acc += carry
	var tail uint64
	for i, v := range b {
		tail |= uint64(v) << (56 - 8*i)
	}
	acc, carry = bits.Add64(acc, tail, 0)
	return acc + carry
}

// fold reduces a 64-bit ones'-complement sum to 16 bits.
func fold(acc uint64) uint16 {
	acc = acc>>32 + acc&0xffffffff
	acc = acc>>32 + acc&0xffffffff
	for acc > 0xffff {
		acc = acc>>16 + acc&0xffff
	}
	return uint16(acc)
}

// Recv implements nic.Link. It blocks until at least one packet with a
// good ICRC arrives; the ICRC is verified over the real IPv4 or IPv6
// header, and packets with a bad ICRC are dropped and counted.
func (l *Link) Recv(pkts []nic.Packet) (int, error) {
	if len(pkts) == 0 {
		return 0, nil
	}
	l.rxMu.Lock()
	defer l.rxMu.Unlock()
	if l.closed.Load() {
		return 0, net.ErrClosed
	}
	l.rxPkts, l.rxN = pkts, 0
	err := l.epRaw.Read(l.rxFn)
	l.rxPkts = nil
	if err != nil {
		if l.closed.Load() || errors.Is(err, os.ErrClosed) {
			return 0, net.ErrClosed
		}
		return 0, fmt.Errorf("afxdp: wait for packets on %s: %w", l.ifname, err)
	}
	return l.rxN, nil
}

// rxReady is called by the runtime poller: it takes what the RX rings hold
// and reports whether there was anything; if not, the goroutine parks until
// a socket becomes readable.
func (l *Link) rxReady(epfd uintptr) bool {
	if l.rxN = l.rxAll(l.rxPkts); l.rxN > 0 {
		return true
	}
	// Consume the epoll readiness so that the next packet makes a new edge
	// for the runtime poller, then look once more for a packet that came
	// in between.
	rawsys.EpollNow(int(epfd), l.epEvents)
	l.rxN = l.rxAll(l.rxPkts)
	return l.rxN > 0
}

// rxAll takes packets from every socket, starting with a different one
// each time for fairness.
func (l *Link) rxAll(pkts []nic.Packet) int {
	n := 0
	for i := 0; i < len(l.socks) && n < len(pkts); i++ {
		x := l.socks[(l.rxNext+i)%len(l.socks)]
		n += l.rxSock(x, pkts[n:])
	}
	l.rxNext++
	return n
}

// rxSock takes complete packets off one socket's RX ring.
func (l *Link) rxSock(x *xsk, pkts []nic.Packet) int {
	cons, prod := x.rx.loadCons(), x.rx.loadProd()
	done := l.rxDone[:0]
	k := 0
	c := cons
	for c != prod && k < len(pkts) {
		// A packet is one descriptor, or several chained by XDP_PKT_CONTD.
		e := c
		complete := false
		for e != prod {
			d := x.rx.descs[e&x.rx.mask]
			e++
			if d.Options&unix.XDP_PKT_CONTD == 0 {
				complete = true
				break
			}
		}
		if !complete {
			break // the rest of the packet is not published yet
		}
		x.rxPackets.Add(1)
		if l.rxPacket(x, c, e, &pkts[k]) {
			k++
		}
		for ; c != e; c++ {
			done = append(done, x.rx.descs[c&x.rx.mask].Addr)
		}
	}
	x.rx.storeCons(c)
	if len(done) > 0 {
		x.refill(done)
		x.wakeRx()
	}
	l.rxDone = done
	return k
}

// rxPacket parses the frame in descriptors [c, e) into p and verifies its
// ICRC. It reports whether p is delivered.
func (l *Link) rxPacket(x *xsk, c, e uint32, p *nic.Packet) bool {
	d0 := x.rx.descs[c&x.rx.mask]
	f0 := x.frame(d0.Addr, d0.Len)
	total := 0
	for i := c; i != e; i++ {
		total += int(x.rx.descs[i&x.rx.mask].Len)
	}
	if len(f0) < ethLen {
		l.rxMalformed.Add(1)
		return false
	}
	var (
		hdr      int
		src, dst netip.Addr
		ulen     int
		id       uint16
		simpleV4 bool
		ipHdr    []byte
		// What a UD receiver writes into its GRH.
		ipKnown     bool
		ttl, tclass uint8
		flowLabel   uint32
	)
	switch binary.BigEndian.Uint16(f0[12:]) {
	case unix.ETH_P_IP:
		ip := f0[ethLen:]
		if len(ip) < ipv4Len || ip[0]>>4 != 4 {
			l.rxMalformed.Add(1)
			return false
		}
		ihl := int(ip[0]&0x0f) * 4
		tl := int(binary.BigEndian.Uint16(ip[2:]))
		if ihl < ipv4Len || len(ip) < ihl+udpLen || ip[9] != unix.IPPROTO_UDP || tl < ihl+udpLen ||
			binary.BigEndian.Uint16(ip[6:])&0x3fff != 0 {
			l.rxMalformed.Add(1)
			return false
		}
		hdr = ethLen + ihl
		ulen = int(binary.BigEndian.Uint16(ip[ihl+4:]))
		if ulen > tl-ihl {
			l.rxMalformed.Add(1)
			return false
		}
		src, dst = netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
		id = binary.BigEndian.Uint16(ip[4:])
		simpleV4 = ihl == ipv4Len && ip[6] == 0x40 // DF, nothing else
		ipHdr = ip[:ihl]
		ipKnown, ttl, tclass = ihl == ipv4Len, ip[8], ip[1]
	case unix.ETH_P_IPV6:
		ip := f0[ethLen:]
		if len(ip) < ipv6Len+udpLen || ip[0]>>4 != 6 || ip[6] != unix.IPPROTO_UDP {
			l.rxMalformed.Add(1)
			return false
		}
		hdr = ethLen + ipv6Len
		ulen = int(binary.BigEndian.Uint16(ip[ipv6Len+4:]))
		if ulen != int(binary.BigEndian.Uint16(ip[4:])) {
			l.rxMalformed.Add(1)
			return false
		}
		src, dst = netip.AddrFrom16([16]byte(ip[8:24])), netip.AddrFrom16([16]byte(ip[24:40]))
		v := binary.BigEndian.Uint32(ip[0:])
		ipKnown, ttl, tclass, flowLabel = true, ip[7], uint8(v>>20), v&0xfffff
	default:
		l.rxMalformed.Add(1)
		return false
	}
	u := f0[hdr:]
	sport, dport := binary.BigEndian.Uint16(u[0:]), binary.BigEndian.Uint16(u[2:])
	roceLen := ulen - udpLen
	if roceLen < 12+icrc.Len || hdr+udpLen+roceLen > total {
		l.rxMalformed.Add(1)
		return false
	}
	if roceLen > cap(p.Buf) {
		l.rxTruncated.Add(1)
		return false
	}
	// Gather the RoCE bytes from the chain of frames.
	buf := p.Buf[:roceLen]
	n := copy(buf, f0[hdr+udpLen:])
	for i := c + 1; i != e && n < roceLen; i++ {
		d := x.rx.descs[i&x.rx.mask]
		n += copy(buf[n:], x.frame(d.Addr, d.Len))
	}
	var crc uint32
	var err error
	switch {
	case src.Is6() || simpleV4:
		crc, err = synth(src, dst, id, sport, dport, buf)
	default:
		// IP options or unusual flags: hash the real header, staged
		// with the payload in scratch.
		crc, err = l.icrcV4(ipHdr, u[:udpLen], buf)
	}
	if err != nil {
		l.rxMalformed.Add(1)
		return false
	}
	if crc != icrc.Wire(buf) {
		l.rxBad.Add(1)
		return false
	}
	p.N = roceLen
	p.Remote = netip.AddrPortFrom(src, sport)
	p.Local = dst
	p.SrcPort = 0
	p.ICRC = nic.ICRCVerified
	p.IPKnown, p.HopLimit, p.TClass, p.IPID, p.FlowLabel = ipKnown, ttl, tclass, id, flowLabel
	l.rxPackets.Add(1)
	l.rxBytes.Add(uint64(roceLen))
	return true
}

// icrcV4 computes the ICRC over a real IPv4 header by staging the UDP
// header and payload contiguously after it.
func (l *Link) icrcV4(ip, udp, roce []byte) (uint32, error) {
	need := udpLen + len(roce)
	if cap(l.scratch) < need {
		l.scratch = make([]byte, need)
	}
	s := l.scratch[:need]
	copy(s, udp)
	copy(s[udpLen:], roce)
	return icrc.IPv4(ip, s)
}
