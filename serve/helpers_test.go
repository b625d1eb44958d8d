package serve

import (
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

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
	port := freeUDPPort(t)
	l, err := udp.Open(udp.Config{Addr: netip.MustParseAddr("127.0.0.1"), Port: port})
	if err != nil {
		t.Fatal(err)
	}
	d, err := verbs.Open(l, nil)
	if err != nil {
		t.Fatal(err)
	}
	return start(t, d, uint16(port))
}

// startPipe runs a daemon on one end of an in-memory link.
func startPipe(t testing.TB) *Server {
	t.Helper()
	a, b := pipe.New(pipe.Config{})
	b.Close()
	d, err := verbs.Open(a, nil)
	if err != nil {
		t.Fatal(err)
	}
	return start(t, d, 0)
}

func start(t testing.TB, d *verbs.Device, port uint16) *Server {
	t.Helper()
	s, err := New([]*verbs.Device{d}, Config{Socket: filepath.Join(t.TempDir(), "s.sock"), RemotePort: port})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen(); err != nil {
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

func unsafePointer(b []byte) unsafe.Pointer { return unsafe.Pointer(&b[0]) }

func writeFile(p, s string) error { return os.WriteFile(p, []byte(s), 0o644) }
