package udp

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/icrc"
	"github.com/softroce/softroce/internal/netnstest"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/nic/internal/linktest"
)

// freePort returns a UDP port that was free on addr a moment ago.
func freePort(t testing.TB, addr netip.Addr) int {
	t.Helper()
	c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(addr, 0)))
	if err != nil {
		t.Skipf("no %v on this host: %v", addr, err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).Port
}

// open opens a link as an unprivileged user gets it: IPv4 checked by
// solving for the ID.
func open(t testing.TB, addr string, mtu int) *Link {
	return openCheck(t, addr, mtu, IPv4CheckSolve)
}

func openCheck(t testing.TB, addr string, mtu int, check IPv4Check) *Link {
	t.Helper()
	a := netip.MustParseAddr(addr)
	l, err := Open(Config{Addr: a, Port: freePort(t, a), MTU: mtu, Batch: 16, IPv4Check: check})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func fill(b []byte, n int, seq uint32) {
	clear(b[:n])
	b[0] = 0x0a // RC RDMA WRITE ONLY
	binary.BigEndian.PutUint32(b[8:], seq)
	for i := 12; i < n-icrc.Len; i++ {
		b[i] = byte(int(seq) * i)
	}
}

func packets(n, size int) []nic.Packet {
	p := make([]nic.Packet, n)
	for i := range p {
		p[i].Buf = make([]byte, size)
	}
	return p
}

// batchAllocs is the allocations of a sending the batch out and b
// receiving all of it into in, averaged over 50 rounds.
func batchAllocs(t *testing.T, a, b *Link, out, in []nic.Packet) float64 {
	t.Helper()
	return testing.AllocsPerRun(50, func() {
		if _, err := a.Send(out); err != nil {
			t.Fatal(err)
		}
		for got := 0; got < len(out); {
			n, err := b.Recv(in)
			if err != nil {
				t.Fatal(err)
			}
			got += n
		}
	})
}

// recvN receives n packets (or fails shortly before the test times out).
func recvN(t *testing.T, l *Link, in []nic.Packet, n int) []nic.Packet {
	t.Helper()
	var got []nic.Packet
	done := make(chan error, 1)
	go func() {
		for len(got) < n {
			k, err := l.Recv(in[len(got):])
			if err != nil {
				done <- err
				return
			}
			got = in[:len(got)+k]
		}
		done <- nil
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-linktest.Patience(t):
		l.Close()
		<-done
		t.Fatalf("received %d of %d packets", len(got), n)
	}
	return got
}

func exchange(t *testing.T, addr string) (a, b *Link, out, in []nic.Packet) {
	a, b = open(t, addr, 9000), open(t, addr, 9000)
	out = packets(40, 4200)
	for i := range out {
		out[i].N = 16 + i*100
		fill(out[i].Buf, out[i].N, uint32(i))
		out[i].Remote = b.LocalAddrPort()
	}
	if n, err := a.Send(out); n != len(out) || err != nil {
		t.Fatalf("Send = %d, %v", n, err)
	}
	in = recvN(t, b, packets(40, 4200), len(out))
	for i := range in {
		p, o := &in[i], &out[i]
		if string(p.Bytes()) != string(o.Bytes()) {
			t.Errorf("packet %d differs", i)
		}
		if p.Remote != a.LocalAddrPort() || p.Local != b.LocalAddrPort().Addr() {
			t.Errorf("packet %d: remote %v local %v", i, p.Remote, p.Local)
		}
		// Send filled the ICRC of the header the kernel sends: ID 0, DF.
		want, _ := synth(a.LocalAddrPort(), b.LocalAddrPort(), o.Bytes())
		if icrc.Wire(p.Bytes()) != want {
			t.Errorf("packet %d: ICRC %08x, want %08x", i, icrc.Wire(p.Bytes()), want)
		}
	}
	if st := a.Stats(); st.TxPackets != 40 || st.TxErrors != 0 {
		t.Errorf("sender stats %+v", st)
	}
	return a, b, out, in
}

// TestIPv4 exchanges packets over IPv4 as an unprivileged user does: the
// ICRC is checked by solving for the ID (16 bits), and a packet damaged
// after its ICRC was computed is dropped.
func TestIPv4(t *testing.T) {
	a, b, out, in := exchange(t, "127.0.0.1")
	for i := range in {
		if in[i].ICRC != nic.ICRCPartial || in[i].ICRC.CheckBits() != 16 {
			t.Fatalf("IPv4 packet %d marked %v", i, in[i].ICRC)
		}
		// TTL from a control message, the ID as solved (Linux sends 0).
		if !in[i].IPKnown || in[i].HopLimit != 64 || in[i].IPID != 0 {
			t.Fatalf("IPv4 packet %d: IP fields known %v TTL %d ID %#x", i, in[i].IPKnown, in[i].HopLimit, in[i].IPID)
		}
	}
	if st := b.Stats(); st.RxPackets != 40 || st.RxICRCPartial != 40 || st.RxICRCUnverified != 0 || st.RxICRCVerified != 0 || st.RxICRCBad != 0 {
		t.Errorf("receiver stats %+v", st)
	}
	for i := range out[:3] {
		if err := a.PutICRC(&out[i]); err != nil {
			t.Fatal(err)
		}
	}
	out[0].Buf[13] ^= 0x80
	out[1].Buf[out[1].N-1] ^= 0x01 // the ICRC itself
	a.SendRaw(out[:3])
	got := recvN(t, b, packets(4, 4200), 1)
	if binary.BigEndian.Uint32(got[0].Buf[8:]) != 2 || got[0].ICRC != nic.ICRCPartial {
		t.Errorf("delivered the wrong packet")
	}
	if st := b.Stats(); st.RxICRCBad != 2 || st.RxICRCPartial != 41 {
		t.Errorf("stats %+v, want 2 bad", st)
	}
}

// TestIPv4CheckModes: IPv4CheckNone delivers unchecked and says why;
// IPv4CheckAuto takes the raw socket when permitted and solves otherwise.
func TestIPv4CheckModes(t *testing.T) {
	a := open(t, "127.0.0.1", 9000)
	none := openCheck(t, "127.0.0.1", 9000, IPv4CheckNone)
	auto := openCheck(t, "127.0.0.1", 9000, IPv4CheckAuto)
	want := nic.ICRCPartial
	if os.Geteuid() == 0 {
		want = nic.ICRCVerified
	}
	if none.IPv4Check() != IPv4CheckNone || (auto.IPv4Check() == IPv4CheckRaw) != (want == nic.ICRCVerified) {
		t.Fatalf("checks %v %v", none.IPv4Check(), auto.IPv4Check())
	}
	for _, c := range []struct {
		l    *Link
		want nic.ICRCStatus
	}{{none, nic.ICRCUnverified}, {auto, want}} {
		out := packets(3, 300)
		for i := range out {
			out[i].N = 200
			fill(out[i].Buf, 200, uint32(i))
			out[i].Remote = c.l.LocalAddrPort()
		}
		if n, err := a.Send(out); n != 3 || err != nil {
			t.Fatalf("Send = %d, %v", n, err)
		}
		for _, p := range recvN(t, c.l, packets(3, 300), 3) {
			if p.ICRC != c.want {
				t.Errorf("%v: packet marked %v, want %v", c.l.IPv4Check(), p.ICRC, c.want)
			}
			// The raw socket shows the header, the solving socket its
			// TTL and solved ID; unchecked, the ID is unknown (for a UD GRH).
			if known := c.want != nic.ICRCUnverified; p.IPKnown != known || known && p.HopLimit != 64 {
				t.Errorf("%v: IPKnown %v TTL %d", c.l.IPv4Check(), p.IPKnown, p.HopLimit)
			}
		}
		st := c.l.Stats()
		if st.RxICRCVerified+st.RxICRCPartial+st.RxICRCUnverified != st.RxPackets || st.RxPackets != 3 {
			t.Errorf("%v: classes do not add up: %+v", c.l.IPv4Check(), st)
		}
	}
	if st := none.Stats(); st.RxUnverifiedOff != 3 || st.RxICRCUnverified != 3 {
		t.Errorf("none: %+v", st)
	}
}

func TestIPv6(t *testing.T) {
	a, b, out, in := exchange(t, "::1")
	for i := range in {
		if in[i].ICRC != nic.ICRCVerified {
			t.Fatalf("IPv6 packet %d marked %v", i, in[i].ICRC)
		}
		if !in[i].IPKnown || in[i].HopLimit != 64 {
			t.Fatalf("IPv6 packet %d: IP fields known %v hop limit %d", i, in[i].IPKnown, in[i].HopLimit)
		}
	}
	if st := b.Stats(); st.RxPackets != 40 || st.RxICRCUnverified != 0 || st.RxICRCVerified != 40 {
		t.Errorf("receiver stats %+v", st)
	}
	// A flipped bit after the ICRC was computed is caught and dropped.
	for i := range out[:3] {
		if err := a.PutICRC(&out[i]); err != nil {
			t.Fatal(err)
		}
	}
	out[0].Buf[13] ^= 0x80
	out[1].Buf[out[1].N-1] ^= 0x01 // the ICRC itself
	a.SendRaw(out[:3])
	got := recvN(t, b, packets(4, 4200), 1)
	if binary.BigEndian.Uint32(got[0].Buf[8:]) != 2 {
		t.Errorf("delivered the wrong packet")
	}
	if st := b.Stats(); st.RxICRCBad != 2 {
		t.Errorf("RxICRCBad = %d, want 2", st.RxICRCBad)
	}
}

func TestSendErrors(t *testing.T) {
	a, b := open(t, "127.0.0.1", 1500), open(t, "127.0.0.1", 1500)
	if a.MaxPacket() != 1472 {
		t.Errorf("MaxPacket %d", a.MaxPacket())
	}
	out := packets(5, 2000)
	for i := range out {
		out[i].N = 100
		out[i].Remote = b.LocalAddrPort()
	}
	out[0].N = 1473                                       // over the MTU
	out[1].Remote = netip.MustParseAddrPort("[::1]:4791") // wrong family
	out[2].Remote = netip.AddrPort{}                      // no destination
	out[3].Local = netip.MustParseAddr("127.0.0.2")       // not our address
	if n, err := a.Send(out); n != 5 || err != nil {
		t.Fatalf("Send = %d, %v", n, err)
	}
	if st := a.Stats(); st.TxErrors != 4 || st.TxPackets != 1 {
		t.Errorf("stats %+v", st)
	}
	recvN(t, b, packets(1, 2000), 1)
	// A receive buffer smaller than the packet: truncated, dropped.
	out[4].N = 1000
	a.Send(out[4:])
	out[4].N = 200
	a.Send(out[4:])
	got := recvN(t, b, packets(1, 500), 1)
	if got[0].N != 200 || b.Stats().RxTruncated != 1 {
		t.Errorf("N %d, stats %+v", got[0].N, b.Stats())
	}
}

func TestOpenErrors(t *testing.T) {
	lo := netip.MustParseAddr("127.0.0.1")
	port := freePort(t, lo)
	l, err := Open(Config{Addr: lo, Port: port})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if l.MTU() != 65536 {
		t.Logf("loopback MTU %d", l.MTU())
	}
	_, err = Open(Config{Addr: lo, Port: port})
	if err == nil || !strings.Contains(err.Error(), "is in use: is another RoCE stack (rdma_rxe) or softroce running? choose another UDP port (Config.Port)") ||
		!errors.Is(err, unix.EADDRINUSE) {
		t.Errorf("second bind: %v", err)
	}
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, "no local address"},
		{Config{Addr: netip.MustParseAddr("0.0.0.0")}, "specific unicast address"},
		{Config{Addr: netip.MustParseAddr("192.0.2.77")}, "no interface has address 192.0.2.77"},
		{Config{Addr: netip.MustParseAddr("192.0.2.77"), MTU: 1500}, "not an address of any interface"},
		{Config{Addr: lo, Port: 70000}, "bad port"},
		{Config{Addr: lo, MTU: 40}, "too small"},
	} {
		l, err := Open(c.cfg)
		if err == nil {
			l.Close()
			t.Errorf("Open(%+v) succeeded", c.cfg)
		} else if !strings.Contains(err.Error(), c.want) {
			t.Errorf("Open(%+v) = %v, want %q", c.cfg, err, c.want)
		}
	}
}

func TestCloseUnblocksRecv(t *testing.T) {
	l := open(t, "127.0.0.1", 0)
	errc := make(chan error, 1)
	go func() {
		_, err := l.Recv(packets(1, 100))
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond)
	l.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("Recv after Close: %v", err)
		}
	case <-linktest.Patience(t):
		t.Fatal("Recv still blocked")
	}
}

func TestPktinfo(t *testing.T) {
	// A hand-made IP_PKTINFO message after an unrelated one.
	oob := make([]byte, 64)
	binary.NativeEndian.PutUint64(oob[0:], 16+4)
	binary.NativeEndian.PutUint32(oob[8:], unix.SOL_SOCKET)
	binary.NativeEndian.PutUint64(oob[24:], 16+12)
	binary.NativeEndian.PutUint32(oob[32:], unix.IPPROTO_IP)
	binary.NativeEndian.PutUint32(oob[36:], unix.IP_PKTINFO)
	copy(oob[24+16+8:], []byte{10, 1, 2, 3})
	if a, ok := pktinfoDst(oob[:24+28], false); !ok || a != netip.MustParseAddr("10.1.2.3") {
		t.Errorf("pktinfoDst = %v %v", a, ok)
	}
	for _, bad := range [][]byte{nil, oob[:10], oob[:24+20]} {
		if _, ok := pktinfoDst(bad, false); ok {
			t.Errorf("pktinfoDst(%d bytes) succeeded", len(bad))
		}
	}
	binary.NativeEndian.PutUint64(oob[0:], 1000) // a length past the end
	if _, ok := pktinfoDst(oob, false); ok {
		t.Error("overlong cmsg accepted")
	}
}

// TestIPv4ICRCOnTheWire captures what the kernel really sends on lo with an
// AF_PACKET socket and checks the ICRC Send computed against the real IPv4
// header: the ID is 0 and the peer's check (rxe, a NIC) would pass.
func TestIPv4ICRCOnTheWire(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for an AF_PACKET capture on lo")
	}
	a, b := open(t, "127.0.0.1", 9000), open(t, "127.0.0.1", 9000)
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
	if err != nil {
		t.Skipf("AF_PACKET socket: %v", err)
	}
	defer unix.Close(fd)
	lo, err := net.InterfaceByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: lo.Index}); err != nil {
		t.Fatal(err)
	}
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 0, Usec: 200000})
	out := packets(3, 4200)
	for i := range out {
		out[i].N = 16 + 1000*i
		fill(out[i].Buf, out[i].N, uint32(i))
		out[i].Remote = b.LocalAddrPort()
	}
	a.Send(out)
	frame := make([]byte, 10000)
	seen := 0
	impatient := linktest.Patience(t)
	for seen < len(out) && len(impatient) == 0 {
		n, from, err := unix.Recvfrom(fd, frame, 0)
		if err != nil {
			continue
		}
		// lo shows each packet twice, leaving and arriving; count it once.
		if ll, ok := from.(*unix.SockaddrLinklayer); !ok || ll.Pkttype != unix.PACKET_OUTGOING {
			continue
		}
		f := frame[:n]
		// lo frames carry a 14-byte all-zero Ethernet header.
		if n < 14+20+8 || binary.BigEndian.Uint16(f[12:]) != unix.ETH_P_IP {
			continue
		}
		ip := f[14:]
		ihl := int(ip[0]&0x0f) * 4
		if ip[9] != unix.IPPROTO_UDP || len(ip) < ihl+8 || binary.BigEndian.Uint16(ip[ihl+2:]) != b.LocalAddrPort().Port() {
			continue
		}
		tot := int(binary.BigEndian.Uint16(ip[2:]))
		id, flags := binary.BigEndian.Uint16(ip[4:]), ip[6]>>5
		if id != 0 || flags != 0b010 {
			t.Errorf("IPv4 ID %d flags %03b: want ID 0 and DF (IP_PMTUDISC_DO on an unconnected socket)", id, flags)
		}
		want, err := icrc.IPv4(ip[:ihl], ip[ihl:tot])
		if err != nil {
			t.Fatal(err)
		}
		if got := icrc.Wire(ip[:tot]); got != want {
			t.Errorf("wire ICRC %08x, ICRC over the real header %08x", got, want)
		}
		seen++
	}
	if seen < len(out) {
		t.Fatalf("captured %d of %d packets", seen, len(out))
	}
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// FuzzPktinfo: control messages come from the kernel, but the parser must
// stay in bounds whatever the bytes.
func FuzzPktinfo(f *testing.F) {
	oob := make([]byte, 28)
	binary.NativeEndian.PutUint64(oob[0:], 28)
	binary.NativeEndian.PutUint32(oob[8:], unix.IPPROTO_IP)
	binary.NativeEndian.PutUint32(oob[12:], unix.IP_PKTINFO)
	f.Add(oob, false)
	f.Add(make([]byte, 40), true)
	f.Fuzz(func(t *testing.T, b []byte, v6 bool) {
		if a, ok := pktinfoDst(b, v6); ok && a.Is4() == v6 {
			t.Fatalf("family mismatch: %v for v6=%v", a, v6)
		}
	})
}

// TestNoAllocs: a batch sent and received in steady state allocates
// nothing (the receive path decodes sources itself for this reason).
func TestNoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under the race detector")
	}
	for _, addr := range []string{"127.0.0.1", "::1", "raw"} {
		var a, b *Link
		if addr == "raw" {
			if os.Geteuid() != 0 {
				continue
			}
			lo := netip.MustParseAddr("127.0.0.1")
			a = open(t, "127.0.0.1", 9000)
			var err error
			if b, err = Open(Config{Addr: lo, Port: freePort(t, lo), MTU: 9000, VerifyIPv4: true}); err != nil {
				t.Fatal(err)
			}
			defer b.Close()
		} else {
			a, b = open(t, addr, 9000), open(t, addr, 9000)
		}
		out, in := packets(16, 4200), packets(16, 4200)
		for i := range out {
			out[i].N = 4128
			fill(out[i].Buf, out[i].N, uint32(i))
			out[i].Remote = b.LocalAddrPort()
		}
		allocs := batchAllocs(t, a, b, out, in)
		if allocs != 0 {
			t.Errorf("%s: %v allocations per batch of %d", addr, allocs, len(out))
		}
	}
}

// TestVerifyIPv4 receives IPv4 through the raw socket: the ICRC is
// verified over the real header (ID 0 from a peer like this link, IP
// options from another sender), and damaged packets are dropped.
func TestVerifyIPv4(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("VerifyIPv4 needs root (a raw socket)")
	}
	lo := netip.MustParseAddr("127.0.0.1")
	a := open(t, "127.0.0.1", 9000)
	b, err := Open(Config{Addr: lo, Port: freePort(t, lo), MTU: 9000, VerifyIPv4: true})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	out := packets(4, 4200)
	for i := range out {
		out[i].N = 100 + 1000*i
		fill(out[i].Buf, out[i].N, uint32(i))
		out[i].Remote = b.LocalAddrPort()
		if err := a.PutICRC(&out[i]); err != nil {
			t.Fatal(err)
		}
	}
	out[1].Buf[40] ^= 0x10 // damaged after the ICRC
	a.SendRaw(out)
	got := recvN(t, b, packets(8, 4200), 3)
	for i, want := range []int{0, 2, 3} {
		if string(got[i].Bytes()) != string(out[want].Bytes()) || got[i].ICRC != nic.ICRCVerified ||
			got[i].Remote != a.LocalAddrPort() || got[i].Local != lo {
			t.Errorf("packet %d: %d bytes, %v, from %v to %v", i, got[i].N, got[i].ICRC, got[i].Remote, got[i].Local)
		}
	}
	if st := b.Stats(); st.RxICRCBad != 1 || st.RxICRCUnverified != 0 || st.RxPackets != 3 || st.RxICRCVerified != 3 {
		t.Errorf("stats %+v", st)
	}

	// A sender with IP options (IHL 6) and an ICRC over that header.
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	opts := []byte{1, 1, 1, 0} // NOP NOP NOP EOL
	rc, _ := c.SyscallConn()
	rc.Control(func(fd uintptr) {
		unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO)
		unix.SetsockoptString(int(fd), unix.IPPROTO_IP, unix.IP_OPTIONS, string(opts))
	})
	payload := make([]byte, 200)
	fill(payload, len(payload), 77)
	ip := make([]byte, 24)
	ip[0] = 0x46
	binary.BigEndian.PutUint16(ip[2:], uint16(24+8+len(payload)))
	ip[6], ip[8], ip[9] = 0x40, 64, 17
	copy(ip[12:], []byte{127, 0, 0, 1, 127, 0, 0, 1})
	copy(ip[20:], opts)
	seg := make([]byte, 8+len(payload))
	binary.BigEndian.PutUint16(seg[0:], uint16(c.LocalAddr().(*net.UDPAddr).Port))
	binary.BigEndian.PutUint16(seg[2:], b.LocalAddrPort().Port())
	binary.BigEndian.PutUint16(seg[4:], uint16(len(seg)))
	copy(seg[8:], payload)
	crc, err := icrc.IPv4(ip, seg)
	if err != nil {
		t.Fatal(err)
	}
	icrc.Put(payload, crc)
	if _, err := c.WriteToUDPAddrPort(payload, b.LocalAddrPort()); err != nil {
		t.Fatal(err)
	}
	got = recvN(t, b, packets(2, 4200), 1)
	if string(got[0].Bytes()) != string(payload) || got[0].ICRC != nic.ICRCVerified {
		t.Errorf("packet with IP options: %d bytes, %v (stats %+v)", got[0].N, got[0].ICRC, b.Stats())
	}
}

// TestSendFailsOnePacket: a packet the kernel refuses in the middle of a
// batch (here EMSGSIZE: larger than any UDP datagram, though within the
// MTU the link was told) fails alone. Send returns its index and the
// error; the packets before it were sent, and sending the rest works.
func TestSendFailsOnePacket(t *testing.T) {
	a, b := open(t, "127.0.0.1", 70000), open(t, "127.0.0.1", 9000)
	out := packets(4, 66000)
	for i := range out {
		out[i].N = 200
		fill(out[i].Buf, out[i].N, uint32(i))
		out[i].Remote = b.LocalAddrPort()
	}
	out[1].N = 66000
	n, err := a.Send(out)
	if n != 1 || !errors.Is(err, unix.EMSGSIZE) {
		t.Fatalf("Send = %d, %v; want 1 and EMSGSIZE", n, err)
	}
	if n, err := a.Send(out[n+1:]); n != 2 || err != nil {
		t.Fatalf("Send of the rest = %d, %v", n, err)
	}
	got := recvN(t, b, packets(4, 300), 3)
	for i, want := range []uint32{0, 2, 3} {
		if seq := binary.BigEndian.Uint32(got[i].Buf[8:]); seq != want {
			t.Errorf("packet %d: seq %d, want %d", i, seq, want)
		}
	}
	if st := a.Stats(); st.TxPackets != 3 || st.TxErrors != 1 || st.TxBytes != 600 {
		t.Errorf("sender stats %+v", st)
	}
}

// TestSendUnreachableInBatch: a destination without a route in the middle
// of a batch fails alone; the packets to the reachable peer around it go.
func TestSendUnreachableInBatch(t *testing.T) {
	netnstest.Require(t)
	v := netnstest.Pair(t, netnstest.VethConfig{MTU: 1500})
	var a, b *Link
	v.A.NS.Run(t, func() (err error) {
		if err := netlink.RouteAdd(&netlink.Route{Dst: &net.IPNet{IP: net.IPv4(10, 99, 0, 0), Mask: net.CIDRMask(16, 32)},
			Type: unix.RTN_UNREACHABLE}); err != nil {
			return err
		}
		a, err = Open(Config{Addr: v.A.Addr(), IPv4Check: IPv4CheckSolve})
		return err
	})
	t.Cleanup(func() { a.Close() })
	v.B.NS.Run(t, func() (err error) {
		b, err = Open(Config{Addr: v.B.Addr(), IPv4Check: IPv4CheckSolve})
		return err
	})
	t.Cleanup(func() { b.Close() })
	out := packets(4, 300)
	for i := range out {
		out[i].N = 200
		fill(out[i].Buf, out[i].N, uint32(i))
		out[i].Remote = b.LocalAddrPort()
	}
	out[1].Remote = netip.MustParseAddrPort("10.99.0.1:4791")
	n, err := a.Send(out)
	if n != 1 || err == nil {
		t.Fatalf("Send = %d, %v; want 1 and an error", n, err)
	}
	t.Log(err)
	if n, err := a.Send(out[n+1:]); n != 2 || err != nil {
		t.Fatalf("Send of the rest = %d, %v", n, err)
	}
	got := recvN(t, b, packets(4, 300), 3)
	for i, want := range []uint32{0, 2, 3} {
		if seq := binary.BigEndian.Uint32(got[i].Buf[8:]); seq != want || got[i].ICRC != nic.ICRCPartial {
			t.Errorf("packet %d: seq %d (%v), want %d", i, seq, got[i].ICRC, want)
		}
	}
}
