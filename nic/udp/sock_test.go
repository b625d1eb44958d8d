package udp

import (
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
)

// TestSocketOutOfPoller: a Link's sockets are in no epoll set of the
// process but its own Multi's: the runtime poller would wake a thread for
// every datagram sent and received (sock).
func TestSocketOutOfPoller(t *testing.T) {
	l := open(t, "127.0.0.1", 9000)
	var fds []int
	for _, s := range []*sock{l.sock, l.raw} {
		if s != nil {
			s.Control(func(fd uintptr) { fds = append(fds, int(fd)) })
		}
	}
	if len(fds) == 0 {
		t.Fatal("no socket")
	}
	watched := epollTargets(t)
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
func epollTargets(t *testing.T) map[int]bool {
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
