package afxdp

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/icrc"
	"github.com/softroce/softroce/nic"
)

// These tests run the frame builder and parser without a kernel: a fake
// socket whose UMEM and RX ring are plain memory.

func testLink() *Link {
	return &Link{ifname: "test0", mac: [6]byte{2, 0, 0, 0, 0, 1}, mtu: 9000, port: 4791, udpCsum4: true,
		addr4: netip.MustParseAddr("10.77.0.1"), addr6: netip.MustParseAddr("fd77::1"), scratch: make([]byte, 100)}
}

// fakeRX puts frags into a fake socket's UMEM and RX ring as one packet
// (chained with XDP_PKT_CONTD) and returns the socket and the end index.
func fakeRX(frags [][]byte) (*xsk, uint32) {
	x := &xsk{frameSize: frameSize, umem: make([]byte, frameSize*max(len(frags), 1))}
	prod, cons, flags := new(uint32), new(uint32), new(uint32)
	x.rx = ring{prod: prod, cons: cons, flags: flags, size: 32, mask: 31, descs: make([]unix.XDPDesc, 32)}
	for i, f := range frags {
		copy(x.umem[i*frameSize:], f)
		x.rx.descs[i] = unix.XDPDesc{Addr: uint64(i * frameSize), Len: uint32(len(f))}
		if i < len(frags)-1 {
			x.rx.descs[i].Options = unix.XDP_PKT_CONTD
		}
	}
	return x, uint32(len(frags))
}

// split cuts frame into pieces of at most n bytes.
func split(frame []byte, n int) [][]byte {
	var out [][]byte
	for len(frame) > n {
		out = append(out, frame[:n])
		frame = frame[n:]
	}
	return append(out, frame)
}

// build makes the frame Send would put on the wire for p.
func build(t testing.TB, l *Link, p *nic.Packet) []byte {
	if err := l.PutICRC(p); err != nil {
		t.Fatal(err)
	}
	src, dst, sport, dport, ok := l.endpoints(p)
	if !ok {
		t.Fatal("endpoints")
	}
	b := make([]byte, 62+p.N)
	h := l.writeHeaders(b, [6]byte{2, 0, 0, 0, 0, 2}, src, dst, sport, dport, p.HopLimit, p.TClass, p.Buf[:p.N])
	return b[:h+copy(b[h:], p.Buf[:p.N])]
}

func roce(n int, seq byte) []byte {
	b := make([]byte, n)
	b[0] = 0x0a
	for i := 12; i < n-4; i++ {
		b[i] = seq + byte(i)
	}
	return b
}

func TestFrameRoundTrip(t *testing.T) {
	l := testLink()
	for _, dst := range []string{"10.77.0.2", "fd77::2"} {
		for _, n := range []int{16, 1000, 4128, 8900} {
			for _, fragSize := range []int{3840, 1500, frameSize} {
				p := nic.Packet{Buf: roce(n, byte(n)), N: n, Remote: netip.AddrPortFrom(netip.MustParseAddr(dst), 0), SrcPort: 50000}
				frame := build(t, l, &p)
				if len(frame)-14 > l.mtu {
					continue
				}
				x, e := fakeRX(split(frame, fragSize))
				in := nic.Packet{Buf: make([]byte, 9000)}
				if !l.rxPacket(x, 0, e, &in) {
					t.Fatalf("%s %d bytes in %d-byte frags: rejected (%+v)", dst, n, fragSize, l.Stats())
				}
				if string(in.Bytes()) != string(p.Bytes()) || in.ICRC != nic.ICRCVerified ||
					in.Remote != netip.AddrPortFrom(l.addrs4or6(dst), 50000) || in.Local.String() != dst {
					t.Fatalf("%s %d bytes: got %d bytes from %v to %v (%v)", dst, n, in.N, in.Remote, in.Local, in.ICRC)
				}
				if !in.IPKnown || in.HopLimit != 64 {
					t.Fatalf("%s: IP fields known %v, hop limit %d", dst, in.IPKnown, in.HopLimit)
				}
				// The UDP checksum is right: summing the pseudo-header and
				// the segment with its checksum gives all ones.
				if err := checkUDP(frame); err != "" {
					t.Fatalf("%s %d bytes: %s", dst, n, err)
				}
			}
		}
	}
}

// TestFrameHopLimitTClass: a packet's HopLimit and TClass (an address
// vector's) are the frame's IPv4 TTL and TOS or IPv6 hop limit and
// traffic class; the receiver reads them back and the ICRC, which masks
// them, still verifies; HopLimit 0 sends 64.
func TestFrameHopLimitTClass(t *testing.T) {
	l := testLink()
	for _, dst := range []string{"10.77.0.2", "fd77::2"} {
		for _, c := range []struct{ hop, tc, wantHop uint8 }{{7, 46<<2 | 1, 7}, {0, 3, 64}, {255, 0xff, 255}} {
			p := nic.Packet{Buf: roce(100, 1), N: 100, Remote: netip.AddrPortFrom(netip.MustParseAddr(dst), 0), HopLimit: c.hop, TClass: c.tc}
			frame := build(t, l, &p)
			ip := frame[14:]
			if dst == "10.77.0.2" && (ip[1] != c.tc || ip[8] != c.wantHop || fold(sum(0, ip[:20])) != 0xffff) ||
				dst == "fd77::2" && (ip[0]<<4|ip[1]>>4 != c.tc || ip[0]>>4 != 6 || ip[1]&0xf != 0 || ip[7] != c.wantHop) {
				t.Fatalf("%s hop %d tc %#x: IP header %x", dst, c.hop, c.tc, ip[:8])
			}
			x, e := fakeRX(split(frame, frameSize))
			in := nic.Packet{Buf: make([]byte, 9000)}
			if !l.rxPacket(x, 0, e, &in) || in.ICRC != nic.ICRCVerified || in.HopLimit != c.wantHop || in.TClass != c.tc {
				t.Fatalf("%s hop %d tc %#x: received %v TTL %d TOS %#x", dst, c.hop, c.tc, in.ICRC, in.HopLimit, in.TClass)
			}
		}
	}
}

// addrs4or6 returns the link's own address of dst's family (the source of
// frames it built).
func (l *Link) addrs4or6(dst string) netip.Addr {
	if netip.MustParseAddr(dst).Is4() {
		return l.addr4
	}
	return l.addr6
}

func checkUDP(f []byte) string {
	var addrs, seg []byte
	switch binary.BigEndian.Uint16(f[12:]) {
	case unix.ETH_P_IP:
		ip := f[14:]
		if fold(sum(0, ip[:20])) != 0xffff {
			return "bad IPv4 header checksum"
		}
		if ip[4] != 0 || ip[5] != 0 || ip[6] != 0x40 || ip[8] != 64 {
			return "IPv4 ID/flags/TTL not 0/DF/64"
		}
		addrs, seg = ip[12:20], ip[20:]
	default:
		addrs, seg = f[14+8:14+40], f[14+40:]
	}
	if binary.BigEndian.Uint16(seg[6:]) == 0 {
		return "UDP checksum missing"
	}
	c := sum(0, addrs) + uint64(len(seg)) + unix.IPPROTO_UDP
	if fold(sum(c, seg)) != 0xffff {
		return "bad UDP checksum"
	}
	return ""
}

// TestRxRealIPv4Header: frames from rdma_rxe or a NIC carry a non-zero
// IPv4 ID, and may carry IP options: the ICRC is checked over the header
// as received.
func TestRxRealIPv4Header(t *testing.T) {
	l := testLink()
	for _, ihl := range []int{5, 6} {
		payload := roce(300, 9)
		ip := make([]byte, ihl*4)
		ip[0] = 0x40 | byte(ihl)
		binary.BigEndian.PutUint16(ip[2:], uint16(len(ip)+8+len(payload)))
		binary.BigEndian.PutUint16(ip[4:], 0x1234) // rxe-style ID
		ip[6], ip[8], ip[9] = 0x40, 64, 17
		copy(ip[12:], []byte{10, 77, 0, 2, 10, 77, 0, 1})
		udp := make([]byte, 8, 8+len(payload))
		binary.BigEndian.PutUint16(udp[0:], 49152)
		binary.BigEndian.PutUint16(udp[2:], 4791)
		binary.BigEndian.PutUint16(udp[4:], uint16(8+len(payload)))
		seg := append(udp, payload...)
		crc, err := icrc.IPv4(ip, seg)
		if err != nil {
			t.Fatal(err)
		}
		icrc.Put(seg, crc)
		frame := append(append(make([]byte, 14), ip...), seg...)
		binary.BigEndian.PutUint16(frame[12:], unix.ETH_P_IP)
		x, e := fakeRX([][]byte{frame})
		in := nic.Packet{Buf: make([]byte, 2000)}
		if !l.rxPacket(x, 0, e, &in) || in.ICRC != nic.ICRCVerified || in.N != len(payload) {
			t.Fatalf("IHL %d: rejected or wrong (%+v)", ihl, l.Stats())
		}
		// The header's fields, for a UD receiver's GRH (20-byte headers only).
		if in.IPKnown != (ihl == 5) || in.IPID != 0x1234 || in.HopLimit != 64 {
			t.Fatalf("IHL %d: IP fields known %v ID %#x TTL %d", ihl, in.IPKnown, in.IPID, in.HopLimit)
		}
		frame[len(frame)-10] ^= 1
		x, e = fakeRX([][]byte{frame})
		if l.rxPacket(x, 0, e, &in) {
			t.Fatalf("IHL %d: a corrupted packet was delivered", ihl)
		}
	}
	if st := l.Stats(); st.RxICRCBad != 2 {
		t.Errorf("stats %+v", st)
	}
}

func TestRxMalformed(t *testing.T) {
	l := testLink()
	good := build(t, l, &nic.Packet{Buf: roce(100, 1), N: 100, Remote: netip.MustParseAddrPort("10.77.0.2:4791")})
	cases := map[string][]byte{
		"empty":         {},
		"short":         good[:13],
		"not IP":        append([]byte{}, good[:12]...),
		"truncated":     good[:len(good)-10],
		"IPv4 fragment": append([]byte{}, good...),
		"UDP too long":  append([]byte{}, good...),
		"UDP too short": append([]byte{}, good...),
	}
	cases["not IP"] = append(cases["not IP"], 0x08, 0x06)
	cases["IPv4 fragment"][14+6] = 0x20
	binary.BigEndian.PutUint16(cases["UDP too long"][14+20+4:], 2000)
	binary.BigEndian.PutUint16(cases["UDP too short"][14+20+4:], 8+10)
	for name, f := range cases {
		x, e := fakeRX([][]byte{f})
		if l.rxPacket(x, 0, e, &nic.Packet{Buf: make([]byte, 2000)}) {
			t.Errorf("%s: delivered", name)
		}
	}
	x, e := fakeRX([][]byte{good})
	if l.rxPacket(x, 0, e, &nic.Packet{Buf: make([]byte, 50)}) || l.Stats().RxTruncated != 1 {
		t.Errorf("small buffer: %+v", l.Stats())
	}
}

// FuzzRxPacket feeds arbitrary frames, cut into up to three buffers, to
// the receive parser: it must never panic, and what it delivers must fit
// the buffer and carry a verified ICRC.
func FuzzRxPacket(f *testing.F) {
	l := testLink()
	for _, dst := range []string{"10.77.0.2:4791", "[fd77::2]:4791"} {
		f.Add(build(f, l, &nic.Packet{Buf: roce(64, 3), N: 64, Remote: netip.MustParseAddrPort(dst)}), uint16(40), uint16(80))
	}
	f.Fuzz(func(t *testing.T, frame []byte, cut1, cut2 uint16) {
		var frags [][]byte
		a, b := int(cut1)%(len(frame)+1), int(cut2)%(len(frame)+1)
		if a > b {
			a, b = b, a
		}
		for _, fr := range [][]byte{frame[:a], frame[a:b], frame[b:]} {
			if len(fr) > 0 {
				frags = append(frags, fr)
			}
		}
		if len(frags) == 0 {
			frags = [][]byte{nil}
		}
		x, e := fakeRX(frags)
		p := nic.Packet{Buf: make([]byte, 256)}
		if l.rxPacket(x, 0, e, &p) {
			if p.N > 256 || p.N < 16 || p.ICRC != nic.ICRCVerified {
				t.Fatalf("delivered %d bytes, %v", p.N, p.ICRC)
			}
		}
	})
}
