package serve

import (
	"log"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/nic/pipe"
	"github.com/softroce/softroce/nic/udp"
	"github.com/softroce/softroce/verbs"
)

// freeUDPPort returns a UDP port that was free on 127.0.0.1 a moment ago.
func freeUDPPort(t testing.TB) int {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).Port
}

// startUDP runs a daemon with one device on 127.0.0.1 (a free UDP port,
// which every QP also sends to) on a socket in a temporary directory.
func startUDP(t testing.TB) *Server {
	t.Helper()
	return startUDPOn(t, Config{Socket: filepath.Join(t.TempDir(), "s.sock")})
}

// startUDPOn is startUDP with c (its RemotePort is set to the device's).
func startUDPOn(t testing.TB, c Config) *Server {
	t.Helper()
	port := freeUDPPort(t)
	l, err := udp.Open(udp.Config{Addr: netip.MustParseAddr("127.0.0.1"), Port: port})
	if err != nil {
		t.Fatal(err)
	}
	d, err := verbs.Open(l, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.RemotePort = uint16(port)
	return serveOn(t, []*verbs.Device{d}, c)
}

// startPipe runs a daemon on one end of an in-memory link.
func startPipe(t testing.TB) *Server {
	t.Helper()
	return startPipeOn(t, Config{Socket: filepath.Join(t.TempDir(), "s.sock")})
}

// startPipeOn is startPipe with c.
func startPipeOn(t testing.TB, c Config) *Server {
	t.Helper()
	a, b := pipe.New(pipe.Config{})
	b.Close()
	d, err := verbs.Open(a, nil)
	if err != nil {
		t.Fatal(err)
	}
	return serveOn(t, []*verbs.Device{d}, c)
}

// keptLog is a logger for a daemon whose log a test reads: logged
// returns what it wrote so far.
func keptLog() (l *log.Logger, logged func() string) {
	var buf strings.Builder
	var mu sync.Mutex
	l = log.New(writerFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return buf.Write(p) }), "", 0)
	return l, func() string { mu.Lock(); defer mu.Unlock(); return buf.String() }
}

// start runs a daemon with device d, its QPs sending to UDP port (0:
// 4791), on a socket in a temporary directory.
func start(t testing.TB, d *verbs.Device, port uint16) *Server {
	t.Helper()
	return serveOn(t, []*verbs.Device{d}, Config{Socket: filepath.Join(t.TempDir(), "s.sock"), RemotePort: port})
}

// serveOn runs a daemon with devs and c until the test ends, when Serve
// must return no error.
func serveOn(t testing.TB, devs []*verbs.Device, c Config) *Server {
	t.Helper()
	s, err := New(devs, c)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen(); err != nil {
		s.Close()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve() }()
	t.Cleanup(func() {
		s.Close()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return s
}

// sharedSocket is a socket path in a temporary directory anyone may
// enter, for a daemon whose --group lets other users in.
func sharedSocket(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	for _, p := range []string{dir, filepath.Dir(dir)} {
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(dir, "s.sock")
}

// cqRing creates a CQ of slots entries and maps its ring until the test
// ends; it returns the CQ's handle, the slots it has and the ring.
func (r *rawClient) cqRing(slots uint32) (cq, got uint32, ring []byte) {
	r.t.Helper()
	e, body, fds := r.call(opCreateCQ, u32s(slots, 0))
	if e != 0 || len(fds) != 1 {
		r.t.Fatalf("CREATE_CQ of %d slots: %v", slots, e)
	}
	ring, err := unix.Mmap(fds[0], 0, int(le.Uint64(body[8:])), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	closeAll(fds)
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { unix.Munmap(ring) })
	return le.Uint32(body), le.Uint32(body[4:]), ring
}

func unsafePointer(b []byte) unsafe.Pointer { return unsafe.Pointer(&b[0]) }

func writeFile(p, s string) error { return os.WriteFile(p, []byte(s), 0o644) }
