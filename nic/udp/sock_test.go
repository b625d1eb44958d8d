package udp

import (
	"net"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/nic"
)

// TestSocketOutOfPoller: a Link's sockets are in no epoll set of the
// process but their socks' own: the runtime poller would wake a thread
// for every datagram sent and received (sock).
func TestSocketOutOfPoller(t *testing.T) {
	l := open(t, "127.0.0.1", 9000)
	var fds, own []int
	for _, s := range []*sock{l.sock, l.raw} {
		if s != nil {
			s.Control(func(fd uintptr) { fds = append(fds, int(fd)) })
			own = append(own, s.epfd)
		}
	}
	if len(fds) == 0 {
		t.Fatal("no socket")
	}
	watched := epollTargets(t, own...)
	if len(watched) == 0 {
		t.Fatal("found no epoll set in /proc/self/fdinfo (the runtime's poller has one)")
	}
	for _, fd := range fds {
		if watched[fd] {
			t.Errorf("socket %d is in an epoll set", fd)
		}
	}
	// The check itself: a net socket is found there.
	c := pollerSocket(t)
	if !epollTargets(t)[c] {
		t.Errorf("a net.UDPConn's socket (%d) is in no epoll set: the check finds nothing", c)
	}
}

// epollTargets lists the descriptors each epoll set of this process
// watches (the "tfd:" lines of /proc/self/fdinfo).
func epollTargets(t *testing.T, except ...int) map[int]bool {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("/proc: %v", err)
	}
	out := map[int]bool{}
	for _, e := range ents {
		if target, _ := os.Readlink("/proc/self/fd/" + e.Name()); target != "anon_inode:[eventpoll]" {
			continue
		}
		if n, _ := strconv.Atoi(e.Name()); slices.Contains(except, n) {
			continue
		}
		b, err := os.ReadFile("/proc/self/fdinfo/" + e.Name())
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) >= 2 && f[0] == "tfd:" {
				if n, err := strconv.Atoi(f[1]); err == nil {
					out[n] = true
				}
			}
		}
	}
	return out
}

// pollerSocket opens a net.UDPConn (in the runtime poller) for the test's
// life and returns its descriptor.
func pollerSocket(t *testing.T) int {
	t.Helper()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	rc, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	fd := -1
	rc.Control(func(f uintptr) { fd = int(f) })
	return fd
}

// waiter runs RecvEachUntil's sequence through WaitEachUntil.
type waiter struct{ *Link }

func (w waiter) RecvEachUntil(pkts []nic.Packet, deliver func(n int), stop func() bool) error {
	return w.WaitEachUntil(pkts, deliver, stop)
}

// TestWaitEachUntil: WaitEachUntil delivers, stops, is interrupted and
// ends at Close as RecvEachUntil does, waiting in ppoll (the only such
// reader in the process).
func TestWaitEachUntil(t *testing.T) {
	a := open(t, "127.0.0.1", 9000)
	b := open(t, "127.0.0.1", 9000)
	if n := kernelReaders.Load(); n != 0 {
		t.Fatalf("%d socks counted as kernel readers before the test", n)
	}
	w0 := kernelWaits.Load()
	recvEachUntil(t, a, waiter{b}, func(uint32) netip.AddrPort { return b.LocalAddrPort() })
	if kernelWaits.Load() == w0 {
		t.Error("no wait in ppoll")
	}
	if n := kernelReaders.Load(); n != 0 {
		t.Errorf("%d socks still counted after Close", n)
	}
}

// TestWaitEachUntilTwoReaders: with two kernel readers in the process
// WaitEachUntil waits in the poller (kernelWaitOK), and still works.
func TestWaitEachUntilTwoReaders(t *testing.T) {
	a := open(t, "127.0.0.1", 9000)
	b := open(t, "127.0.0.1", 9000)
	other := open(t, "127.0.0.1", 9000)
	// other becomes a kernel reader: it waits once, interrupted.
	other.Interrupt()
	asked := 0
	if err := other.WaitEachUntil(packets(1, 300), func(int) {}, func() bool { asked++; return asked > 1 }); err != nil {
		t.Fatal(err)
	}
	if n := kernelReaders.Load(); n != 1 {
		t.Fatalf("%d kernel readers, want 1", n)
	}
	w0 := kernelWaits.Load()
	recvEachUntil(t, a, waiter{b}, func(uint32) netip.AddrPort { return b.LocalAddrPort() })
	if d := kernelWaits.Load() - w0; d != 0 {
		t.Errorf("%d waits in ppoll with two kernel readers", d)
	}
}

// lateSender returns a channel: each send on it makes a datagram reach b
// 200 us later, while b's reader waits.
func lateSender(t *testing.T, b *Link) chan<- struct{} {
	a := open(t, "127.0.0.1", 9000)
	out := packets(1, 300)
	kick := make(chan struct{})
	t.Cleanup(func() { close(kick) })
	go func() {
		for range kick {
			time.Sleep(200 * time.Microsecond)
			out[0].N, out[0].Remote = 64, b.LocalAddrPort()
			a.Send(out)
		}
	}()
	return kick
}

// TestSockWaitNoAllocs: a wait in ppoll and one in the poller allocate
// nothing.
func TestSockWaitNoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under the race detector")
	}
	b := open(t, "127.0.0.1", 9000)
	kick := lateSender(t, b)
	var buf [512]byte
	read := func(fd uintptr) bool {
		n, err := unix.Read(int(fd), buf[:])
		return err == nil && n > 0
	}
	s := b.readSock()
	for _, kernel := range []bool{true, false} {
		once := func() {
			kick <- struct{}{} // the packet arrives while the reader waits
			var err error
			if kernel {
				err = s.ReadKernel(read)
			} else {
				err = s.Read(read)
			}
			if err != nil {
				t.Fatal(err)
			}
		}
		w0 := kernelWaits.Load()
		if n := mallocsIn50(once); n >= 25 {
			t.Errorf("kernel %v: %d allocations in 50 waits", kernel, n)
		}
		if kernel != (kernelWaits.Load() > w0) {
			t.Errorf("kernel %v: %d waits in ppoll", kernel, kernelWaits.Load()-w0)
		}
	}
}

// TestWaitEachUntilAllocs: a Link's WaitEachUntil or RecvEachUntil call
// that waits once allocates nothing.
func TestWaitEachUntilAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under the race detector")
	}
	b := open(t, "127.0.0.1", 9000)
	kick := lateSender(t, b)
	in := packets(4, 300)
	got := 0
	deliver := func(n int) { got += n }
	stop := func() bool { return got > 0 }
	for _, kernel := range []bool{true, false} {
		recv := b.RecvEachUntil
		if kernel {
			recv = b.WaitEachUntil
		}
		once := func() {
			got = 0
			kick <- struct{}{}
			if err := recv(in, deliver, stop); err != nil {
				t.Fatal(err)
			}
		}
		w0 := kernelWaits.Load()
		if n := mallocsIn50(once); n >= 25 {
			t.Errorf("kernel %v: %d allocations in 50 calls", kernel, n)
		}
		if kernel != (kernelWaits.Load() > w0) {
			t.Errorf("kernel %v: %d waits in ppoll", kernel, kernelWaits.Load()-w0)
		}
	}
}

// mallocsIn50 runs f once to warm up, then 50 times, and returns the heap
// allocations the process made meanwhile. Not testing.AllocsPerRun: it
// sets GOMAXPROCS to 1, where waits in ppoll are not granted. The runtime
// and a sender goroutine allocate now and then; one allocation a call
// would be 50.
func mallocsIn50(f func()) uint64 {
	f()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	for range 50 {
		f()
	}
	runtime.ReadMemStats(&m1)
	return m1.Mallocs - m0.Mallocs
}
