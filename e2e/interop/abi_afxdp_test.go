package interop

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/softroce/softroce/conformance/rxevm"
	"github.com/softroce/softroce/serve"
)

// syncBuf is a strings.Builder that a process writes while the test reads.
type syncBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// softroceBinary builds cmd/softroce for the host into a directory of t.
func softroceBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "softroce")
	cmd := exec.Command(goTool(), "build", "-o", bin, "./cmd/softroce")
	cmd.Dir = "../.."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build softroce: %v\n%s", err, out)
	}
	return bin
}

// serveAFXDP runs the real daemon, `softroce serve --backend afxdp`, as
// root inside the VM's namespace on the host end of the tap, its socket
// usable by group nogroup. It returns the socket and the environment that
// makes a host program use it. At cleanup the daemon gets SIGTERM and
// must exit with status 0.
func serveAFXDP(t *testing.T, bin, mode string) (sock string, env []string, startup string) {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{dir, filepath.Dir(dir)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	sock = filepath.Join(dir, "softroce.sock")
	cmd := vm.HostCommand(context.Background(), bin, "serve", "--backend", "afxdp", "--addr", vm.HostAddr().String(), "--xdp-mode", mode, "--socket", sock, "--group", "nogroup")
	var log syncBuf
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("softroce serve --backend afxdp: %v\n%s", err, log.String())
			}
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			t.Errorf("softroce serve did not stop on SIGTERM:\n%s", log.String())
		}
	})
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if _, err := queryStatusIn(sock); err == nil {
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("softroce serve --backend afxdp exited: %v\n%s", err, log.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("softroce serve --backend afxdp does not answer on %s:\n%s", sock, log.String())
		}
	}
	startup = strings.TrimSpace(log.String())
	t.Logf("%s", startup)
	return sock, append(os.Environ(), "SOFTROCE_SOCKET="+sock, "LD_LIBRARY_PATH="+abiLibrary(t)), startup
}

// tapCounters reads counters of the host end of the tap.
func tapCounters(t *testing.T, names ...string) []uint64 {
	t.Helper()
	var v []uint64
	for _, n := range names {
		out, err := vm.HostCommand(context.Background(), "cat", "/sys/class/net/"+rxevm.TapName+"/statistics/"+n).Output()
		x, perr := strconv.ParseUint(strings.TrimSpace(string(out)), 10, 64)
		if err != nil || perr != nil {
			t.Fatalf("read %s of %s: %v %v", n, rxevm.TapName, err, perr)
		}
		v = append(v, x)
	}
	return v
}

// TestABIAFXDPAgainstRxe runs the daemon as root with the AF_XDP backend
// (`softroce serve --backend afxdp`, XDP on the host end of the guest's
// tap, in the default mode, which is native on a tap, and in generic
// mode) and the host's unmodified ibv_rc_pingpong -c and ib_write_bw (and
// in the default mode rping) as nobody through it against the same tools
// on the rxe guest, both roles:
// only the daemon is privileged. Every client the daemon served must be
// nobody.
func TestABIAFXDPAgainstRxe(t *testing.T) {
	needVM(t)
	h := asNobody(t)
	bin := softroceBinary(t)
	for _, m := range []struct{ flag, want string }{{"auto", "xdp"}, {"generic", "xdpgeneric"}} {
		t.Run(m.flag, func(t *testing.T) { testABIAFXDP(t, h, bin, m.flag, m.want) })
	}
}

func testABIAFXDP(t *testing.T, h abiHost, bin, mode, want string) {
	sock, env, startup := serveAFXDP(t, bin, mode)
	wantLine := "(afxdp on " + rxevm.TapName + ", native XDP"
	if mode == "generic" {
		wantLine = "(afxdp on " + rxevm.TapName + ", generic XDP"
	}
	if !strings.Contains(startup, wantLine) {
		t.Errorf("softroce serve's start-up lines lack %q:\n%s", wantLine, startup)
	}
	// ip link names the attach mode before the program's id: "xdp"
	// (native), "xdpgeneric", "xdpoffload".
	if out, err := vm.HostCommand(context.Background(), "ip", "link", "show", "dev", rxevm.TapName).CombinedOutput(); err != nil {
		t.Fatalf("ip link show %s: %v\n%s", rxevm.TapName, err, out)
	} else if !strings.Contains(string(out), " "+want+" ") && !strings.Contains(string(out), " "+want+"/") {
		t.Fatalf("%s has no %s program attached:\n%s", rxevm.TapName, want, out)
	} else {
		t.Logf("%s", strings.TrimSpace(string(out)))
	}
	w := watchClientList(func() []serve.ClientStatus {
		st, err := queryStatusIn(sock)
		if err != nil {
			return nil
		}
		// The test's own status connections (the one asking is left out,
		// the one before may not be closed yet) are not tools.
		return slices.DeleteFunc(st.Clients, func(c serve.ClientStatus) bool { return c.PID == os.Getpid() })
	})
	before := tapCounters(t, "tx_packets", "tx_dropped", "rx_packets")
	// The tools run as h says on this one daemon.
	onThis := abiHost{daemon: func(*testing.T) []string { return env }, argv: h.argv}
	for _, role := range []string{"host-client", "host-server"} {
		t.Run("ibv_rc_pingpong/"+role, func(t *testing.T) {
			out, gout := abiPairAs(t, onThis, "ibv_rc_pingpong", []string{"-g", "0", "-c", "-n", "50", "-r", "50"},
				"timeout 80 ibv_rc_pingpong -d rxe0 -g 1 -e -c -n 50 -r 50", 18515, role, 500*time.Millisecond)
			for _, o := range []string{out, gout} {
				if !strings.Contains(o, "50 iters in") || strings.Contains(o, "invalid data") {
					t.Fatalf("no result, or invalid data:\nhost:\n%s\nguest:\n%s", out, gout)
				}
			}
			t.Logf("host: %s", lastLines(out, 1))
		})
	}
	writeBWBothRoles(t, onThis, 4096, 65536)
	if mode == "auto" {
		// rdma_cm: CM MADs to and from rxe's QP1 through the AF_XDP link.
		t.Run("rping", func(t *testing.T) {
			cmBothRolesAs(t, onThis, "rping", "rping -s -C 10 -v", "rping -c -C 10 -v -a", []string{"-s", "-C", "10", "-v", "-a", "HOST"},
				[]string{"-c", "-C", "10", "-v", "-a"}, "ping data: rdma-ping-9", "REJECTED")
		})
	}
	w.check(t)
	after := tapCounters(t, "tx_packets", "tx_dropped", "rx_packets")
	st, err := queryStatusIn(sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("tap %s: %d packets to the guest, %d dropped by the tap, %d from the guest; daemon: %+v",
		rxevm.TapName, after[0]-before[0], after[1]-before[1], after[2]-before[2], st.Devices)
}

// queryStatusIn asks the daemon for its status from the VM's namespace,
// which the daemon serves: clients refuse a daemon of another namespace.
func queryStatusIn(sock string) (serve.Status, error) {
	var st serve.Status
	var err error
	vm.Do(func() error { st, err = serve.QueryStatus(sock); return nil })
	return st, err
}
