// Package netnstest builds throw-away network topologies for tests that
// need real kernel networking: network namespaces joined by veth pairs,
// with addresses in 10.77.0.0/16 that exist only inside those namespaces.
//
// Everything a test makes is removed by t.Cleanup, on success and failure
// alike. Tests skip with a clear message when not run as root. Names are
// unique per process and per call, so packages testing in parallel do not
// collide.
//
// Code that must run inside a namespace (opening sockets, attaching XDP,
// netlink lookups) goes through NS.Do: it runs on an OS thread switched
// into the namespace. Sockets keep the namespace they were made in, so a
// link opened inside Do is used from any goroutine afterwards.
package netnstest

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"
)

var counter atomic.Uint32

// Require skips the test unless it runs as root (namespaces, veth and
// XDP need CAP_SYS_ADMIN and CAP_NET_ADMIN).
func Require(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to create network namespaces and veth pairs (CI runs this as root; run: sudo go test ...)")
	}
}

// NS is a network namespace made for one test.
type NS struct {
	// Name is the namespace's name under /var/run/netns, so that
	// `ip netns exec NAME ...` works for the test's lifetime.
	Name string
	h    netns.NsHandle
}

var sweepOnce sync.Once

// sweep removes namespaces left by test processes that died before their
// cleanup ran (a panic, a kill): names carry the creating process's id.
func sweep() {
	ents, err := os.ReadDir("/var/run/netns")
	if err != nil {
		return
	}
	for _, e := range ents {
		var pid, n int
		if _, err := fmt.Sscanf(e.Name(), "srt-%d-%d", &pid, &n); err != nil || pid == os.Getpid() {
			continue
		}
		if err := unix.Kill(pid, 0); errors.Is(err, unix.ESRCH) {
			netns.DeleteNamed(e.Name())
		}
	}
}

// NewNS makes an empty namespace with lo up, removed at cleanup.
func NewNS(t testing.TB) *NS {
	t.Helper()
	return NewNSTagged(t, "")
}

// NewNSTagged is NewNS with tag appended to the namespace's name, so that
// `ip netns list` tells whose namespaces are whose.
func NewNSTagged(t testing.TB, tag string) *NS {
	t.Helper()
	Require(t)
	sweepOnce.Do(sweep)
	name := fmt.Sprintf("srt-%d-%d", os.Getpid(), counter.Add(1))
	if tag != "" {
		name += "-" + tag // sweep reads the leading srt-PID-N only
	}
	h, err := inNewThread(func() (netns.NsHandle, error) { return netns.NewNamed(name) })
	if err != nil {
		t.Fatalf("netnstest: create namespace %s: %v", name, err)
	}
	ns := &NS{Name: name, h: h}
	t.Cleanup(func() {
		h.Close()
		if err := netns.DeleteNamed(name); err != nil {
			t.Errorf("netnstest: delete namespace %s: %v", name, err)
		}
	})
	if err := ns.Do(func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	}); err != nil {
		t.Fatalf("netnstest: bring up lo in %s: %v", name, err)
	}
	return ns
}

// inNewThread runs fn on a locked thread that is thrown away afterwards,
// for calls that switch the calling thread's namespace (netns.NewNamed).
func inNewThread(fn func() (netns.NsHandle, error)) (netns.NsHandle, error) {
	type res struct {
		h   netns.NsHandle
		err error
	}
	c := make(chan res, 1)
	go func() {
		runtime.LockOSThread()
		// No UnlockOSThread: the thread is in the new namespace, so the
		// runtime must discard it when this goroutine ends.
		h, err := fn()
		c <- res{h, err}
	}()
	r := <-c
	return r.h, r.err
}

// Handle is the namespace's file descriptor handle.
func (ns *NS) Handle() netns.NsHandle { return ns.h }

// Do runs fn on an OS thread switched into the namespace and returns its
// error. Goroutines started by fn do not inherit the namespace.
func (ns *NS) Do(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- fmt.Errorf("netnstest: get current namespace: %w", err)
			return
		}
		defer orig.Close()
		if err := netns.Set(ns.h); err != nil {
			errc <- fmt.Errorf("netnstest: enter namespace %s: %w", ns.Name, err)
			return
		}
		err = fn()
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		} // else the thread stays locked and dies with the goroutine
		errc <- err
	}()
	return <-errc
}

// Run is Do for tests: an error fails the test.
func (ns *NS) Run(t testing.TB, fn func() error) {
	t.Helper()
	if err := ns.Do(fn); err != nil {
		t.Fatal(err)
	}
}

// End is one end of a veth pair.
type End struct {
	NS    *NS
	Name  string
	Index int
	MAC   net.HardwareAddr
	MTU   int
	// Prefix is the end's address and subnet (zero when Bare).
	Prefix netip.Prefix
}

// Addr is the end's IP address.
func (e *End) Addr() netip.Addr { return e.Prefix.Addr() }

// Veth is a veth pair between two namespaces.
type Veth struct {
	A, B *End
}

// VethConfig describes a veth pair. The zero value is a 1500-byte MTU,
// one queue, addresses 10.77.K.1/24 on A and 10.77.K.2/24 on B.
type VethConfig struct {
	MTU    int
	Queues int // RX and TX queues per end (AF_XDP binds one socket per RX queue)
	// AddrA and AddrB override the automatic addresses.
	AddrA, AddrB netip.Prefix
	// Bare leaves both ends without IP addresses; BareA and BareB only
	// one end (the end in the middle namespace of a relay, which forwards
	// frames between two veths).
	Bare, BareA, BareB bool
	// KeepTxChecksum leaves TX checksum offload on. By default it is
	// turned off: with it on, the kernel leaves UDP checksums partial on
	// a veth, which AF_PACKET and AF_XDP readers see as wrong.
	KeepTxChecksum bool
	// NoDAD turns off IPv6 duplicate address detection on both ends
	// (accept_dad 0) before they come up, so that their link-local
	// addresses are usable at once instead of tentative for a second.
	NoDAD bool
}

// Connect joins a and b with a veth pair, brings both ends up with their
// addresses, and removes it at cleanup.
func Connect(t testing.TB, a, b *NS, cfg VethConfig) *Veth {
	t.Helper()
	k := counter.Add(1)
	if cfg.MTU == 0 {
		cfg.MTU = 1500
	}
	if cfg.Queues == 0 {
		cfg.Queues = 1
	}
	if !cfg.Bare {
		sub := byte(k % 250)
		if !cfg.AddrA.IsValid() {
			cfg.AddrA = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 77, sub, 1}), 24)
		}
		if !cfg.AddrB.IsValid() {
			cfg.AddrB = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 77, sub, 2}), 24)
		}
	}
	if cfg.Bare || cfg.BareA {
		cfg.AddrA = netip.Prefix{}
	}
	if cfg.Bare || cfg.BareB {
		cfg.AddrB = netip.Prefix{}
	}
	v := &Veth{
		A: &End{NS: a, Name: fmt.Sprintf("sr%da", k), Prefix: cfg.AddrA},
		B: &End{NS: b, Name: fmt.Sprintf("sr%db", k), Prefix: cfg.AddrB},
	}
	ha, err := netlink.NewHandleAt(a.h)
	if err != nil {
		t.Fatalf("netnstest: netlink handle in %s: %v", a.Name, err)
	}
	defer ha.Delete()
	link := &netlink.Veth{
		LinkAttrs: netlink.LinkAttrs{Name: v.A.Name, MTU: cfg.MTU, NumTxQueues: cfg.Queues, NumRxQueues: cfg.Queues},
		PeerName:  v.B.Name, PeerNamespace: netlink.NsFd(int(b.h)), PeerMTU: uint32(cfg.MTU),
		PeerNumTxQueues: uint32(cfg.Queues), PeerNumRxQueues: uint32(cfg.Queues),
	}
	if err := ha.LinkAdd(link); err != nil {
		t.Fatalf("netnstest: add veth %s/%s: %v", v.A.Name, v.B.Name, err)
	}
	t.Cleanup(func() {
		// Deleting one end deletes the pair; the namespace's removal
		// would too, but a test may keep namespaces longer.
		if h, err := netlink.NewHandleAt(a.h); err == nil {
			if l, err := h.LinkByName(v.A.Name); err == nil {
				h.LinkDel(l)
			}
			h.Delete()
		}
	})
	for _, e := range []*End{v.A, v.B} {
		e := e
		if err := e.NS.Do(func() error { return e.setUp(!cfg.KeepTxChecksum, cfg.NoDAD) }); err != nil {
			t.Fatalf("netnstest: set up %s in %s: %v", e.Name, e.NS.Name, err)
		}
	}
	for _, e := range []*End{v.A, v.B} {
		e := e
		if err := e.NS.Do(e.waitUp); err != nil {
			t.Fatalf("netnstest: %s in %s: %v", e.Name, e.NS.Name, err)
		}
	}
	return v
}

// waitUp waits until the kernel reports the interface operationally up.
// Until then (the link-watch work runs asynchronously, up to a second
// later) its queueing discipline is a no-op that silently drops what
// kernel sockets send, while AF_XDP, which bypasses it, gets through.
func (e *End) waitUp() error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		l, err := netlink.LinkByName(e.Name)
		if err != nil {
			return err
		}
		if l.Attrs().OperState == netlink.OperUp {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("still %v after 5s", l.Attrs().OperState)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (e *End) setUp(txOff, noDAD bool) error {
	l, err := netlink.LinkByName(e.Name)
	if err != nil {
		return err
	}
	if noDAD {
		// net sysctls act in the namespace of the thread that opens them.
		if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+e.Name+"/accept_dad", []byte("0"), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("turn off DAD: %w", err)
		}
	}
	if e.Prefix.IsValid() {
		a := &netlink.Addr{IPNet: &net.IPNet{IP: e.Prefix.Addr().AsSlice(), Mask: net.CIDRMask(e.Prefix.Bits(), e.Prefix.Addr().BitLen())}}
		if e.Prefix.Addr().Is6() {
			a.Flags = unix.IFA_F_NODAD // usable at once
		}
		if err := netlink.AddrAdd(l, a); err != nil {
			return fmt.Errorf("add address %v: %w", e.Prefix, err)
		}
	}
	if txOff {
		if err := SetTxChecksum(e.Name, false); err != nil {
			return err
		}
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return fmt.Errorf("set up: %w", err)
	}
	l, err = netlink.LinkByName(e.Name)
	if err != nil {
		return err
	}
	e.Index, e.MAC, e.MTU = l.Attrs().Index, l.Attrs().HardwareAddr, l.Attrs().MTU
	return nil
}

// ethtool ioctl constants (linux/ethtool.h, linux/sockios.h).
const (
	ethtoolGTXCSUM = 0x16 // ETHTOOL_GTXCSUM
	ethtoolSTXCSUM = 0x17 // ETHTOOL_STXCSUM
	siocETHTOOL    = 0x8946
)

// TxChecksum reports whether TX checksum offload of interface name is on
// (ETHTOOL_GTXCSUM), in the calling thread's namespace.
func TxChecksum(name string) (bool, error) {
	v, err := ethtool(name, ethtoolGTXCSUM, 0)
	return v != 0, err
}

// SetTxChecksum turns TX checksum offload of interface name on or off, as
// `ethtool -K NAME tx on|off` does (ethtool is not installed everywhere).
// It acts in the calling thread's namespace.
func SetTxChecksum(name string, on bool) error {
	var v uint32
	if on {
		v = 1
	}
	_, err := ethtool(name, ethtoolSTXCSUM, v)
	return err
}

// ethtool issues one SIOCETHTOOL request with a struct ethtool_value.
func ethtool(name string, cmd, data uint32) (uint32, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("ethtool socket: %w", err)
	}
	defer unix.Close(fd)
	val := struct{ cmd, data uint32 }{cmd: cmd, data: data}
	var ifr struct {
		name [unix.IFNAMSIZ]byte
		data unsafe.Pointer
		_    [16]byte
	}
	copy(ifr.name[:], name)
	ifr.data = unsafe.Pointer(&val)
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), siocETHTOOL, uintptr(unsafe.Pointer(&ifr)))
	runtime.KeepAlive(&val)
	if errno != 0 {
		return 0, fmt.Errorf("ethtool command %#x on %s: %w", cmd, name, errno)
	}
	return val.data, nil
}

// Pair makes two namespaces joined by one veth pair.
func Pair(t testing.TB, cfg VethConfig) *Veth {
	t.Helper()
	return Connect(t, NewNS(t), NewNS(t), cfg)
}

// Ping sends ICMP echo requests from ns to dst until one is answered or
// timeout passes. A reply proves ARP (and the path) works.
func Ping(ns *NS, dst netip.Addr, timeout time.Duration) error {
	return ns.Do(func() error {
		c, err := icmp.ListenPacket("ip4:icmp", "0.0.0.0")
		if err != nil {
			return fmt.Errorf("ping: open ICMP socket: %w", err)
		}
		defer c.Close()
		id := os.Getpid() & 0xffff
		buf := make([]byte, 1500)
		deadline := time.Now().Add(timeout)
		for seq := 1; time.Now().Before(deadline); seq++ {
			msg := icmp.Message{Type: ipv4.ICMPTypeEcho, Body: &icmp.Echo{ID: id, Seq: seq, Data: []byte("softroce")}}
			wb, err := msg.Marshal(nil)
			if err != nil {
				return err
			}
			if _, err := c.WriteTo(wb, &net.IPAddr{IP: dst.AsSlice()}); err != nil {
				return fmt.Errorf("ping %v: %w", dst, err)
			}
			c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
			for {
				n, from, err := c.ReadFrom(buf)
				if err != nil {
					break
				}
				m, err := icmp.ParseMessage(1, buf[:n])
				if err != nil || m.Type != ipv4.ICMPTypeEchoReply {
					continue
				}
				if e, ok := m.Body.(*icmp.Echo); ok && e.Seq == seq && from.String() == dst.String() {
					return nil
				}
			}
		}
		return fmt.Errorf("ping %v: no reply within %v", dst, timeout)
	})
}
