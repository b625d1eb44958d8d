package afxdp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/icrc"
	"github.com/softroce/softroce/internal/netnstest"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/nic/internal/linktest"
	"github.com/softroce/softroce/nic/udp"
)

// openIn opens an AF_XDP link on end e inside its namespace.
func openIn(t testing.TB, e *netnstest.End, cfg Config) *Link {
	t.Helper()
	cfg.Interface = e.Name
	var l *Link
	e.NS.Run(t, func() (err error) {
		l, err = Open(cfg)
		return err
	})
	t.Cleanup(func() { l.Close() })
	return l
}

// openUDPIn opens a kernel UDP link on end e as an unprivileged user gets
// it (IPv4 checked by solving for the ID).
func openUDPIn(t testing.TB, e *netnstest.End) *udp.Link {
	t.Helper()
	var l *udp.Link
	e.NS.Run(t, func() (err error) {
		l, err = udp.Open(udp.Config{Addr: e.Addr(), IPv4Check: udp.IPv4CheckSolve})
		return err
	})
	t.Cleanup(func() { l.Close() })
	return l
}

func fill(b []byte, n int, seq uint32) []byte {
	b = b[:n]
	clear(b)
	b[0] = 0x0a
	binary.BigEndian.PutUint16(b[2:], 0xffff)
	binary.BigEndian.PutUint32(b[8:], seq)
	for i := 12; i < n-icrc.Len; i++ {
		b[i] = byte(int(seq)*7 + i)
	}
	return b
}

func packets(n, size int) []nic.Packet {
	p := make([]nic.Packet, n)
	for i := range p {
		p[i].Buf = make([]byte, size)
	}
	return p
}

// sizes include a 4096-byte-payload RoCE packet (BTH+RETH+4096+ICRC),
// larger than one UMEM frame with its headers: multi-buffer.
var sizes = []int{16, 100, 1024, 3000, 4096 + 12 + 16 + 4, 8000}

// transfer sends len(sizes) packets from a to b's address and checks
// what b receives.
func transfer(t *testing.T, a, b nic.Link, dst netip.Addr, want nic.ICRCStatus, maxSize int) {
	t.Helper()
	var out []nic.Packet
	for i, s := range sizes {
		if s > maxSize {
			continue
		}
		p := nic.Packet{Buf: make([]byte, s), N: s, Remote: netip.AddrPortFrom(dst, nic.RoCEv2Port)}
		fill(p.Buf, s, uint32(i))
		out = append(out, p)
	}
	// An AF_XDP sender resolves its peer first: Send would drop the first
	// packet while resolving in the background.
	if r, ok := a.(interface{ Resolve(netip.Addr) error }); ok {
		if err := r.Resolve(dst); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan []nic.Packet, 1)
	go func() {
		in := packets(len(out), 9000)
		got := 0
		for got < len(out) {
			n, err := b.Recv(in[got:])
			if err != nil {
				break
			}
			got += n
		}
		done <- in[:got]
	}()
	// The receiver may need a moment to be polling; send once, resend
	// nothing: AF_XDP and veth do not drop on an idle path.
	if n, err := a.Send(out); err != nil || n != len(out) {
		t.Fatalf("Send = %d, %v", n, err)
	}
	var in []nic.Packet
	select {
	case in = <-done:
	case <-linktest.Patience(t):
		b.Close()
		in = <-done
		t.Fatalf("received %d of %d packets; sender %+v receiver %+v", len(in), len(out), a.Stats(), b.Stats())
	}
	for i := range in {
		if string(in[i].Bytes()) != string(out[i].Bytes()) {
			t.Errorf("packet %d (%d bytes, got %d) differs", i, out[i].N, in[i].N)
		}
		if in[i].ICRC != want {
			t.Errorf("packet %d: ICRC %v, want %v", i, in[i].ICRC, want)
		}
		if in[i].Local != dst {
			t.Errorf("packet %d: local %v, want %v", i, in[i].Local, dst)
		}
	}
}

func xdpAttached(t *testing.T, e *netnstest.End) bool {
	t.Helper()
	var on bool
	e.NS.Run(t, func() error {
		l, err := netlink.LinkByName(e.Name)
		if err != nil {
			return err
		}
		x := l.Attrs().Xdp
		on = x != nil && (x.Attached || x.ProgId != 0)
		return nil
	})
	return on
}

func TestAFXDPBothEnds(t *testing.T) {
	for _, mode := range []Mode{ModeNative, ModeGeneric} {
		t.Run(mode.String(), func(t *testing.T) {
			v := netnstest.Pair(t, netnstest.VethConfig{MTU: 9000})
			a := openIn(t, v.A, Config{Mode: mode, ResolveWait: 2 * time.Second})
			b := openIn(t, v.B, Config{Mode: mode, ResolveWait: 2 * time.Second})
			if a.Mode() != mode || !a.Frags() {
				t.Errorf("mode %v frags %v", a.Mode(), a.Frags())
			}
			transfer(t, a, b, v.B.Addr(), nic.ICRCVerified, 9000)
			transfer(t, b, a, v.A.Addr(), nic.ICRCVerified, 9000)
			if st := b.Stats(); st.RxICRCBad != 0 || st.RxMalformed != 0 {
				t.Errorf("receiver stats %+v", st)
			}
			// ARP and ICMP still reach the kernel with the program attached.
			if err := netnstest.Ping(v.A.NS, v.B.Addr(), 3*time.Second); err != nil {
				t.Error(err)
			}
			if !xdpAttached(t, v.A) {
				t.Fatal("no XDP program attached while open")
			}
			a.Close()
			if xdpAttached(t, v.A) {
				t.Error("XDP program still attached after Close")
			}
			if _, err := a.Send(packets(1, 64)); !errors.Is(err, errClosed()) {
				t.Errorf("Send after Close: %v", err)
			}
		})
	}
}

func TestAFXDPWithUDP(t *testing.T) {
	t.Run("checksum", func(t *testing.T) { testWithUDP(t, false) })
	t.Run("no-checksum", func(t *testing.T) { testWithUDP(t, true) })
}

func testWithUDP(t *testing.T, noCsum bool) {
	v := netnstest.Pair(t, netnstest.VethConfig{MTU: 9000})
	a := openIn(t, v.A, Config{NoUDPChecksum: noCsum})
	b := openUDPIn(t, v.B)
	// afxdp -> kernel UDP: the kernel accepts the frames (IPv4 header
	// checksum, UDP checksum, lengths); the UDP link cannot see the IPv4 ID
	// and checks 16 bits of the ICRC.
	transfer(t, a, b, v.B.Addr(), nic.ICRCPartial, b.MaxPacket())
	// kernel UDP -> afxdp: the ICRC that nic/udp computed for ID 0 is
	// verified over the real header the kernel sent.
	transfer(t, b, a, v.A.Addr(), nic.ICRCVerified, b.MaxPacket())
	if st := a.Stats(); st.RxICRCBad != 0 {
		t.Errorf("afxdp receiver stats %+v", st)
	}
}

func TestAFXDPWithUDPIPv6(t *testing.T) {
	v := netnstest.Pair(t, netnstest.VethConfig{MTU: 9000,
		AddrA: netip.MustParsePrefix("fd77::1/64"), AddrB: netip.MustParsePrefix("fd77::2/64")})
	a := openIn(t, v.A, Config{ResolveWait: 3 * time.Second})
	b := openUDPIn(t, v.B)
	// The kernel drops IPv6 UDP with a zero or wrong checksum: arriving
	// proves the link computes it; nic/udp verifies the ICRC over IPv6.
	transfer(t, a, b, v.B.Addr(), nic.ICRCVerified, b.MaxPacket())
	transfer(t, b, a, v.A.Addr(), nic.ICRCVerified, b.MaxPacket())
}

func TestAFXDPCorruptDropped(t *testing.T) {
	v := netnstest.Pair(t, netnstest.VethConfig{MTU: 1500})
	a := openIn(t, v.A, Config{})
	b := openIn(t, v.B, Config{})
	out := packets(2, 200)
	for i := range out {
		out[i].N = 200
		fill(out[i].Buf, 200, uint32(i))
		out[i].Remote = netip.AddrPortFrom(v.B.Addr(), 0)
		if err := a.PutICRC(&out[i]); err != nil {
			t.Fatal(err)
		}
	}
	out[0].Buf[50] ^= 1
	if err := a.Resolve(v.B.Addr()); err != nil {
		t.Fatal(err)
	}
	a.SendRaw(out)
	in := packets(2, 200)
	n, err := b.Recv(in)
	if err != nil || n != 1 || binary.BigEndian.Uint32(in[0].Buf[8:]) != 1 {
		t.Fatalf("Recv = %d, %v", n, err)
	}
	if b.Stats().RxICRCBad != 1 {
		t.Errorf("stats %+v", b.Stats())
	}
}

func TestAFXDPErrors(t *testing.T) {
	v := netnstest.Pair(t, netnstest.VethConfig{})
	v.A.NS.Run(t, func() error {
		_, err := Open(Config{Interface: "nosuch0"})
		if err == nil || !strings.Contains(err.Error(), `no such interface "nosuch0"`) {
			t.Errorf("Open(nosuch0) = %v", err)
		}
		_, err = Open(Config{Interface: v.A.Name, Addr: netip.MustParseAddr("192.0.2.1")})
		if err == nil || !strings.Contains(err.Error(), "is not an address of") {
			t.Errorf("Open with a foreign address = %v", err)
		}
		return nil
	})
	if xdpAttached(t, v.A) {
		t.Error("XDP program left attached after a failed Open")
	}
	// A failure after the program is attached (binding a queue the
	// interface does not have) must detach it again.
	v.A.NS.Run(t, func() error {
		l, err := Open(Config{Interface: v.A.Name, Queues: 3})
		if err == nil {
			l.Close()
			t.Error("Open with 3 queues on a 1-queue veth succeeded")
		} else if !strings.Contains(err.Error(), "queue 1") {
			t.Errorf("Open with 3 queues = %v", err)
		}
		return nil
	})
	if xdpAttached(t, v.A) {
		t.Error("XDP program left attached after Open failed past attaching")
	}
	a := openIn(t, v.A, Config{ResolveWait: 300 * time.Millisecond})
	// A second link on the same interface: the program slot is taken.
	v.A.NS.Run(t, func() error {
		l, err := Open(Config{Interface: v.A.Name, Mode: ModeNative})
		if err == nil {
			l.Close()
			t.Error("second Open on the same interface succeeded")
		} else if !strings.Contains(err.Error(), "another XDP program is attached") {
			t.Logf("second Open: %v", err)
		}
		return nil
	})
	ghost := netip.MustParseAddr(strings.TrimSuffix(v.B.Addr().String(), ".2") + ".99")
	out := packets(1, 64)
	out[0].N = 64
	out[0].Remote = netip.AddrPortFrom(ghost, 0)
	// Send does not wait: the packet fails at once while the resolution
	// runs in the background, then fails with the resolution's verdict.
	n, err := a.Send(out)
	var ne *NeighbourError
	if n != 0 || !errors.As(err, &ne) || !errors.Is(err, ErrResolving) || ne.Dst != ghost {
		t.Fatalf("first Send to a ghost = %d, %v", n, err)
	}
	for errors.Is(err, ErrResolving) {
		time.Sleep(10 * time.Millisecond)
		n, err = a.Send(out)
	}
	if n != 0 || !errors.As(err, &ne) || ne.NextHop != ghost {
		t.Fatalf("Send to a ghost = %d, %v", n, err)
	}
	t.Log(err)
	if err := a.Resolve(v.B.Addr()); err != nil {
		t.Errorf("Resolve(peer): %v", err)
	}
	if err := a.Resolve(netip.MustParseAddr("198.51.100.1")); err == nil {
		t.Error("Resolve off-link succeeded")
	} else {
		var re *RouteError
		if !errors.As(err, &re) {
			t.Errorf("Resolve off-link: %v", err)
		}
	}
}

func errClosed() error { return netErrClosed }

// TestAFXDPMultiQueue: one socket per RX queue; flows from many source
// ports spread over both queues of the veth and all arrive.
func TestAFXDPMultiQueue(t *testing.T) {
	v := netnstest.Pair(t, netnstest.VethConfig{MTU: 1500, Queues: 2})
	a := openIn(t, v.A, Config{})
	if a.Queues() != 2 {
		t.Fatalf("%d queues", a.Queues())
	}
	const flows, per = 16, 20
	var senders []*udp.Link
	for i := 0; i < flows; i++ {
		var l *udp.Link
		v.B.NS.Run(t, func() (err error) {
			l, err = udp.Open(udp.Config{Addr: v.B.Addr(), Port: 20000 + i})
			return err
		})
		defer l.Close()
		senders = append(senders, l)
	}
	done := make(chan int, 1)
	go func() {
		in := packets(64, 1500)
		got := 0
		for got < flows*per {
			n, err := a.Recv(in)
			if err != nil {
				break
			}
			got += n
		}
		done <- got
	}()
	out := packets(per, 200)
	for i := range out {
		out[i].N = 200
		fill(out[i].Buf, 200, uint32(i))
		out[i].Remote = netip.AddrPortFrom(v.A.Addr(), 0)
	}
	for _, s := range senders {
		if _, err := s.Send(out); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case got := <-done:
		if got != flows*per {
			t.Fatalf("received %d of %d", got, flows*per)
		}
	case <-linktest.Patience(t):
		a.Close()
		t.Fatalf("received %d of %d", <-done, flows*per)
	}
	qp := a.QueuePackets()
	t.Logf("packets per queue: %v", qp)
	if qp[0] == 0 || qp[1] == 0 {
		t.Errorf("traffic did not reach both queues: %v", qp)
	}
	st, err := a.SocketStats()
	if err != nil {
		t.Fatal(err)
	}
	for q, s := range st {
		if s.Rx_dropped != 0 || s.Rx_invalid_descs != 0 {
			t.Errorf("queue %d: %+v", q, s)
		}
	}
}

// TestStatsWhileReceiving: the diagnostics must not wait for a blocked
// Recv, and Close must still wake it.
func TestStatsWhileReceiving(t *testing.T) {
	v := netnstest.Pair(t, netnstest.VethConfig{})
	a := openIn(t, v.A, Config{})
	errc := make(chan error, 1)
	go func() {
		_, err := a.Recv(packets(4, 2000))
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond)
	done := make(chan struct{})
	go func() {
		a.SocketStats()
		a.QueuePackets()
		close(done)
	}()
	select {
	case <-done:
	case <-linktest.Patience(t):
		t.Fatal("SocketStats blocked behind Recv")
	}
	a.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, errClosed()) {
			t.Errorf("Recv after Close: %v", err)
		}
	case <-linktest.Patience(t):
		t.Fatal("Close did not wake Recv")
	}
}

// TestMTUTooLarge: native XDP on veth refuses a single-buffer program above
// about 3.5 KB MTU (docs/platform.md); the error says so, and nothing is
// left attached. The frags-aware program the link normally loads attaches.
func TestMTUTooLarge(t *testing.T) {
	v := netnstest.Pair(t, netnstest.VethConfig{MTU: 9000})
	v.A.NS.Run(t, func() error {
		l, err := Open(Config{Interface: v.A.Name, Mode: ModeNative, noFrags: true})
		if err == nil {
			l.Close()
			t.Skip("this kernel attaches a single-buffer program at MTU 9000")
		}
		if !strings.Contains(err.Error(), "MTU 9000 is too large for this program type") {
			t.Errorf("Open = %v", err)
		}
		return nil
	})
	if xdpAttached(t, v.A) {
		t.Error("XDP program left attached after a failed Open")
	}
}

// TestNotPermitted runs Open as an unprivileged user (the test binary
// re-executed as nobody) and checks that the error says what is missing.
func TestNotPermitted(t *testing.T) {
	if os.Getenv("AFXDP_UNPRIVILEGED_CHILD") == "1" {
		ifname := ""
		ifs, _ := net.Interfaces()
		for _, i := range ifs {
			if len(i.HardwareAddr) == 6 {
				ifname = i.Name
				break
			}
		}
		if ifname == "" {
			fmt.Println("SKIP: no Ethernet interface")
			return
		}
		_, err := Open(Config{Interface: ifname})
		if err == nil || !strings.Contains(err.Error(), "not permitted: run as root or with CAP_NET_ADMIN, CAP_BPF and CAP_NET_RAW") {
			fmt.Printf("UNEXPECTED: %v\n", err)
			os.Exit(1)
		}
		fmt.Printf("ERROR: %v\n", err)
		return
	}
	if os.Geteuid() != 0 {
		// Already unprivileged: check directly.
		_, err := Open(Config{Interface: "lo"})
		if err == nil || !strings.Contains(err.Error(), "not permitted") {
			t.Fatalf("Open as user %d = %v", os.Geteuid(), err)
		}
		return
	}
	bin := copySelf(t)
	cmd := exec.Command(bin, "-test.run=^TestNotPermitted$", "-test.count=1")
	cmd.Env = append(os.Environ(), "AFXDP_UNPRIVILEGED_CHILD=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("unprivileged Open: %v\n%s", err, out)
	}
	if bytes.Contains(out, []byte("SKIP:")) {
		t.Skipf("%s", bytes.TrimSpace(out))
	}
	t.Logf("%s", bytes.TrimSpace(out))
}

// TestMemlockLimit: without CAP_IPC_LOCK the UMEM is charged to
// RLIMIT_MEMLOCK; a limit too low for it gives an error that says so.
// The test binary re-runs itself inside a test namespace as nobody with
// only CAP_NET_ADMIN, CAP_NET_RAW and CAP_BPF, and a 1 MiB hard limit.
func TestMemlockLimit(t *testing.T) {
	if ifname := os.Getenv("AFXDP_CAPS_CHILD"); ifname != "" {
		// With the documented capabilities (and CAP_IPC_LOCK for the
		// UMEM), an unprivileged user opens the link.
		l, err := Open(Config{Interface: ifname})
		if err != nil {
			fmt.Printf("UNEXPECTED: %v\n", err)
			os.Exit(1)
		}
		l.Close()
		fmt.Println("opened with CAP_NET_ADMIN, CAP_NET_RAW, CAP_BPF and CAP_IPC_LOCK")
		return
	}
	if os.Getenv("AFXDP_MEMLOCK_CHILD") != "" {
		lim := unix.Rlimit{Cur: 1 << 20, Max: 1 << 20}
		if err := unix.Setrlimit(unix.RLIMIT_MEMLOCK, &lim); err != nil {
			fmt.Printf("UNEXPECTED: setrlimit: %v\n", err)
			os.Exit(1)
		}
		_, err := Open(Config{Interface: os.Getenv("AFXDP_MEMLOCK_CHILD")})
		if err == nil || !strings.Contains(err.Error(), "memlock limit too low") {
			fmt.Printf("UNEXPECTED: %v\n", err)
			os.Exit(1)
		}
		fmt.Printf("ERROR: %v\n", err)
		return
	}
	netnstest.Require(t)
	v := netnstest.Pair(t, netnstest.VethConfig{})
	bin := copySelf(t)
	var out []byte
	v.A.NS.Run(t, func() error {
		// Started from this thread, the child is in the namespace.
		cmd := exec.Command(bin, "-test.run=^TestMemlockLimit$", "-test.count=1")
		cmd.Env = append(os.Environ(), "AFXDP_MEMLOCK_CHILD="+v.A.Name)
		cmd.SysProcAttr = &syscall.SysProcAttr{
			Credential:  &syscall.Credential{Uid: 65534, Gid: 65534},
			AmbientCaps: []uintptr{unix.CAP_NET_ADMIN, unix.CAP_NET_RAW, unix.CAP_BPF},
		}
		var err error
		out, err = cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("child: %v\n%s", err, out)
		}
		return nil
	})
	t.Logf("%s", bytes.TrimSpace(out))
	if xdpAttached(t, v.A) {
		t.Error("XDP program left attached after the failed Open")
	}
	v.A.NS.Run(t, func() error {
		cmd := exec.Command(bin, "-test.run=^TestMemlockLimit$", "-test.count=1")
		cmd.Env = append(os.Environ(), "AFXDP_CAPS_CHILD="+v.A.Name)
		cmd.SysProcAttr = &syscall.SysProcAttr{
			Credential:  &syscall.Credential{Uid: 65534, Gid: 65534},
			AmbientCaps: []uintptr{unix.CAP_NET_ADMIN, unix.CAP_NET_RAW, unix.CAP_BPF, unix.CAP_IPC_LOCK},
		}
		var err error
		out, err = cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("child with capabilities: %v\n%s", err, out)
		}
		return nil
	})
	t.Logf("%s", bytes.TrimSpace(out))
}

// copySelf copies the test binary where an unprivileged user can run it.
func copySelf(t *testing.T) string {
	dir, err := os.MkdirTemp("", "afxdp-child")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	self, err := os.ReadFile("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "afxdp.test")
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

// A kernel before 6.6 refuses XDP_USE_SG in bind with EINVAL (the guest
// kernels of Debian 12 do): the link binds without multi-buffer and works
// at an MTU whose frames fit one UMEM frame; at a larger MTU Open says
// what is missing and leaves nothing attached.
func TestBindWithoutMultiBuffer(t *testing.T) {
	old := xskBind
	refused := 0
	xskBind = func(fd int, sa unix.Sockaddr) error {
		if x, ok := sa.(*unix.SockaddrXDP); ok && x.Flags&unix.XDP_USE_SG != 0 {
			refused++
			return unix.EINVAL
		}
		return old(fd, sa)
	}
	t.Cleanup(func() { xskBind = old })

	v := netnstest.Pair(t, netnstest.VethConfig{MTU: 1500})
	a := openIn(t, v.A, Config{Mode: ModeGeneric, ResolveWait: 2 * time.Second})
	b := openIn(t, v.B, Config{Mode: ModeGeneric, ResolveWait: 2 * time.Second})
	if refused == 0 || a.multiBuffer() || b.multiBuffer() {
		t.Fatalf("%d binds refused; multi-buffer %v, %v", refused, a.multiBuffer(), b.multiBuffer())
	}
	transfer(t, a, b, v.B.Addr(), nic.ICRCVerified, a.MaxPacket())
	transfer(t, b, a, v.A.Addr(), nic.ICRCVerified, b.MaxPacket())

	big := netnstest.Pair(t, netnstest.VethConfig{MTU: 9000})
	big.A.NS.Run(t, func() error {
		l, err := Open(Config{Interface: big.A.Name, Mode: ModeGeneric})
		if err == nil {
			l.Close()
			t.Fatal("Open at MTU 9000 without multi-buffer sockets succeeded")
		}
		if !strings.Contains(err.Error(), "MTU 9000") || !strings.Contains(err.Error(), "XDP_USE_SG") {
			t.Errorf("Open = %v", err)
		}
		return nil
	})
	if xdpAttached(t, big.A) {
		t.Error("XDP program left attached after a failed Open")
	}
}

// A device with more RX queues than it uses (a multi-queue virtio-net NIC
// in a guest with fewer vCPUs; here a veth set to one channel of four)
// gets sockets on the queues in use only: the kernel refuses a bind
// beyond them.
func TestQueuesInUse(t *testing.T) {
	if _, err := exec.LookPath("ethtool"); err != nil {
		t.Skip("needs ethtool")
	}
	v := netnstest.Pair(t, netnstest.VethConfig{MTU: 1500, Queues: 4})
	for _, e := range []*netnstest.End{v.A, v.B} {
		if out, err := exec.Command("ip", "netns", "exec", e.NS.Name, "ethtool", "-L", e.Name, "rx", "1", "tx", "1").CombinedOutput(); err != nil {
			t.Skipf("ethtool -L %s rx 1 tx 1: %v %s", e.Name, err, out)
		}
	}
	v.A.NS.Run(t, func() error {
		n, err := rxQueuesInUse(v.A.Name)
		if err != nil || n != 1 {
			t.Errorf("rxQueuesInUse = %d, %v; want 1", n, err)
		}
		return nil
	})
	for _, mode := range []Mode{ModeGeneric, ModeNative} {
		t.Run(mode.String(), func(t *testing.T) {
			a := openIn(t, v.A, Config{Mode: mode, ResolveWait: 2 * time.Second})
			b := openIn(t, v.B, Config{Mode: mode, ResolveWait: 2 * time.Second})
			if a.Queues() != 1 || b.Queues() != 1 {
				t.Fatalf("sockets on %d and %d queues, want 1", a.Queues(), b.Queues())
			}
			transfer(t, a, b, v.B.Addr(), nic.ICRCVerified, 1500)
			a.Close()
			b.Close()
		})
	}
}

// A kick that the kernel answers without taking the frames (a full
// device queue: virtio-net in a slow guest) leaves them on the TX ring;
// nothing in the kernel resumes copy-mode transmission when the queue
// drains, so the link kicks again on its own and the packets arrive
// without another Send.
func TestTxRetryAfterFullQueue(t *testing.T) {
	// Installed first, so that it is restored after the links closed.
	old := xskSendto
	var full atomic.Bool
	xskSendto = func(fd int) unix.Errno {
		if full.Load() {
			return unix.EAGAIN // what the kernel answers at a full queue
		}
		return old(fd)
	}
	t.Cleanup(func() { xskSendto = old })
	v := netnstest.Pair(t, netnstest.VethConfig{MTU: 1500})
	a := openIn(t, v.A, Config{Mode: ModeGeneric, ResolveWait: 2 * time.Second})
	b := openIn(t, v.B, Config{Mode: ModeGeneric, ResolveWait: 2 * time.Second})
	if err := a.Resolve(v.B.Addr()); err != nil {
		t.Fatal(err)
	}

	full.Store(true)
	out := packets(3, 200)
	for i := range out {
		out[i].N = 200
		fill(out[i].Buf, 200, uint32(i))
		out[i].Remote = netip.AddrPortFrom(v.B.Addr(), nic.RoCEv2Port)
	}
	if n, err := a.Send(out); err != nil || n != len(out) {
		t.Fatalf("Send = %d, %v", n, err)
	}
	// The queue stays full for a while: the retries back off and keep
	// the frames.
	patience := linktest.Patience(t)
	for a.txRetries.Load() < 3 {
		select {
		case <-patience:
			t.Fatalf("%d TX retries while the queue was full", a.txRetries.Load())
		case <-time.After(time.Millisecond):
		}
	}
	full.Store(false)
	in := packets(len(out), 1500)
	got := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		for got < len(out) {
			n, err := b.Recv(in[got:])
			if err != nil {
				return
			}
			got += n
		}
	}()
	select {
	case <-done:
	case <-linktest.Patience(t):
		b.Close()
		<-done
		t.Fatalf("received %d of %d packets after the queue drained; %d retries", got, len(out), a.txRetries.Load())
	}
	for i := range in[:got] {
		if string(in[i].Bytes()) != string(out[i].Bytes()) {
			t.Errorf("packet %d differs", i)
		}
	}
}
