// Package apps runs real RDMA application stacks, unmodified, on softroce:
// the distribution's binaries (libfabric's fi_info and fi_pingpong, qperf,
// ...) between two softroce hosts. A host is a network namespace with one
// `softroce serve` daemon; the two are joined by a veth pair, so the
// applications' own out-of-band exchanges (TCP rendezvous, rdma_cm) and the
// RoCE traffic cross a real kernel link, as between two machines. Each
// program runs as an unprivileged user through `softroce run`, which adds
// only the daemon's socket and the library path to its environment.
//
// Each test sets only the application's own transport selection (a
// provider flag or FI_PROVIDER, UCX_TLS, an MPI's --mca ...), nothing
// else: what an application needs beyond that to run on softroce is a
// softroce bug or a documented limit (docs/apps.md). Tests skip, saying
// why, when not run as root (namespaces) or when their program is not
// installed; .ci/run installs the Debian packages and runs them as root.
//
// The harness (TwoHosts, Host, Proc) is for every application's tests:
// NewTwoHosts builds softroce and its libraries once per test binary,
// makes the hosts and starts their daemons; Host.Start and Host.Run run a
// program in a host as User.
package apps

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/softroce/softroce/abi"
	"github.com/softroce/softroce/internal/netnstest"
)

// User is the unprivileged user (nobody) the daemons and programs run as.
const User = 65534

// TwoHosts is two softroce hosts, A and B, on one veth pair.
type TwoHosts struct {
	A, B *Host
}

// Host is one network namespace with its softroce daemon.
type Host struct {
	Name   string // "A" or "B"; "softroce" beside the rxe guest
	Socket string // the daemon's socket
	addr   netip.Addr
	do     func(func() error) error // runs a function in the namespace
	home   string                   // the programs' HOME, the user's
	daemon *Proc
}

// Addr is the host's IP address (its softroce device's).
func (h *Host) Addr() netip.Addr { return h.addr }

// daemonGID is a GID of the device as softroce serve reports it.
var daemonGID = regexp.MustCompile(`GID (\d+) (\S+?)[,) ]`)

// GIDIndex is the GID index of the host's address: 1 when the device has
// the interface's IPv6 link-local GID at index 0, as rxe has (softroce
// serve's default on an interface with one), 0 otherwise.
func (h *Host) GIDIndex() int {
	for _, m := range daemonGID.FindAllStringSubmatch(h.daemon.Output(), -1) {
		if a, err := netip.ParseAddr(m[2]); err == nil && a == h.addr {
			i, _ := strconv.Atoi(m[1])
			return i
		}
	}
	return 0
}

var (
	buildOnce            sync.Once
	softroceBin, abiDir  string
	buildErr             error
	goBuildTimeout       = 10 * time.Minute
	daemonStartupTimeout = 30 * time.Second
)

// Need skips the test unless it can run: as root, with the C library
// buildable and every program in progs installed (pkg names the Debian
// package that has them).
func Need(t testing.TB, pkg string, progs ...string) {
	t.Helper()
	netnstest.Require(t)
	if m := abi.Missing(); m != "" {
		t.Skip("cannot build softroce's libibverbs.so.1: " + m)
	}
	for _, p := range progs {
		if _, err := exec.LookPath(p); err != nil {
			t.Skipf("%s is not installed (Debian: apt-get install %s)", p, pkg)
		}
	}
}

// build makes the softroce binary and its libraries once per test binary,
// in a directory every user can read.
func build(t testing.TB) (bin, abiRoot string) {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "softroce-apps-")
		if err != nil {
			buildErr = err
			return
		}
		if err = os.Chmod(dir, 0o755); err != nil {
			buildErr = err
			return
		}
		softroceBin = filepath.Join(dir, "softroce")
		ctx, cancel := context.WithTimeout(context.Background(), goBuildTimeout)
		defer cancel()
		cmd := exec.CommandContext(ctx, goTool(), "build", "-o", softroceBin, "github.com/softroce/softroce/cmd/softroce")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("build softroce: %v\n%s", err, out)
			return
		}
		// softroce run builds the library on first use; building it here,
		// as root, leaves it where the unprivileged user reads it.
		abiDir = filepath.Join(dir, "abi")
		if _, err := abi.Build(abiDir); err != nil {
			buildErr = err
			return
		}
		buildErr = filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
			if err != nil {
				return err
			}
			if fi.IsDir() {
				return os.Chmod(p, 0o755)
			}
			return nil
		})
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return softroceBin, abiDir
}

// Main is TestMain for the package's tests: it runs them, then removes
// what build made.
func Main(m *testing.M) int {
	code := m.Run()
	closeRxe()
	if softroceBin != "" {
		os.RemoveAll(filepath.Dir(softroceBin))
	}
	return code
}

func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}

// NewTwoHosts makes hosts A and B, each with a daemon on its veth end,
// all removed at cleanup. A failing test's log gets both daemons' logs.
func NewTwoHosts(t testing.TB) *TwoHosts {
	t.Helper()
	netnstest.Require(t)
	build(t)
	v := netnstest.Connect(t, netnstest.NewNSTagged(t, "appA"), netnstest.NewNSTagged(t, "appB"), netnstest.VethConfig{NoDAD: true})
	th := &TwoHosts{A: newHost(t, "A", v.A.Addr(), v.A.NS.Do), B: newHost(t, "B", v.B.Addr(), v.B.NS.Do)}
	t.Cleanup(func() {
		for _, h := range []*Host{th.A, th.B} {
			h.stopDaemon(t)
		}
	})
	return th
}

// stopDaemon ends the host's daemon, which must exit on SIGTERM, and logs
// what it said when the test failed.
func (h *Host) stopDaemon(t testing.TB) {
	h.daemon.Signal(syscall.SIGTERM)
	if err := h.daemon.WaitTimeout(20 * time.Second); err != nil {
		t.Errorf("host %s: softroce serve: %v", h.Name, err)
	}
	if t.Failed() {
		t.Logf("host %s daemon log:\n%s", h.Name, h.daemon.Output())
	}
}

// newHost starts a daemon on addr in the namespace that do runs in.
func newHost(t testing.TB, name string, addr netip.Addr, do func(func() error) error) *Host {
	t.Helper()
	dir, err := os.MkdirTemp("", "softroce-apps-"+strings.ToLower(name)+"-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	h := &Host{Name: name, addr: addr, do: do, Socket: filepath.Join(dir, "softroce.sock"), home: filepath.Join(dir, "home")}
	if err := os.Mkdir(h.home, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{dir, h.home} {
		if err := os.Chown(d, User, User); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	h.daemon = h.start(t, nil, softroceBin, "serve", "--addr", addr.String(), "--socket", h.Socket)
	deadline := time.Now().Add(daemonStartupTimeout)
	for !strings.Contains(h.daemon.Output(), "listening on") {
		if h.daemon.Exited() || time.Now().After(deadline) {
			t.Fatalf("host %s: softroce serve did not start:\n%s", name, h.daemon.Output())
		}
		time.Sleep(10 * time.Millisecond)
	}
	return h
}

// DaemonLog is what the host's daemon has logged so far.
func (h *Host) DaemonLog() string { return h.daemon.Output() }

// Start runs `softroce run --socket SOCKET -- prog args...` in the host as
// User, its output (stdout and stderr) collected. env is added to the
// program's environment (the application's transport selection; nothing
// else). The process is killed at cleanup.
func (h *Host) Start(t testing.TB, env []string, prog string, args ...string) *Proc {
	t.Helper()
	checkTransportEnv(t, env)
	return h.start(t, env, softroceBin, append([]string{"run", "--socket", h.Socket, "--", prog}, args...)...)
}

// appVar is an application stack's tuning variable; selection lists the
// ones that only choose a transport, all a test may set (the MPI launchers
// pass --mca settings as OMPI_MCA_pml, _osc, _mtl themselves).
var (
	appVar    = regexp.MustCompile(`^(UCX_|FI_|OMPI_MCA_|MPIR_CVAR_)`)
	selection = map[string]bool{"UCX_TLS": true, "FI_PROVIDER": true, "OMPI_MCA_pml": true, "OMPI_MCA_osc": true, "OMPI_MCA_mtl": true}
)

// checkTransportEnv fails the test if env tunes an application stack
// beyond choosing its transport: what else it needs on softroce is a bug
// or a documented limit, never a test's workaround.
func checkTransportEnv(t testing.TB, env []string) {
	t.Helper()
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if appVar.MatchString(k) && !selection[k] {
			t.Fatalf("a program is given %s: tests may set only the transport selection (%v)", kv, slices.Sorted(maps.Keys(selection)))
		}
	}
}

// Run is Start and Wait with a timeout.
func (h *Host) Run(t testing.TB, timeout time.Duration, env []string, prog string, args ...string) (string, error) {
	t.Helper()
	p := h.Start(t, env, prog, args...)
	err := p.WaitTimeout(timeout)
	return p.Output(), err
}

// start runs path as User inside the host's namespace.
func (h *Host) start(t testing.TB, env []string, path string, args ...string) *Proc {
	t.Helper()
	cmd := exec.Command(path, args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + h.home, "SOFTROCE_ABI_DIR=" + abiDir}, env...)
	cmd.Dir = h.home
	return startAsUser(t, "host "+h.Name, h.do, cmd)
}

// startAsUser starts cmd as User, in a process group of its own, inside
// the namespace do runs in: the child is forked from a thread switched
// into it, and keeps it. Its output (stdout and stderr) is collected; it
// is killed at cleanup if still running.
func startAsUser(t testing.TB, where string, do func(func() error) error, cmd *exec.Cmd) *Proc {
	t.Helper()
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: &syscall.Credential{Uid: User, Gid: User},
		Setpgid:    true,
	}
	p := &Proc{cmd: cmd, done: make(chan struct{})}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = w, w
	if err := do(cmd.Start); err != nil {
		r.Close()
		w.Close()
		t.Fatalf("%s: start %s: %v", where, cmd.Path, err)
	}
	w.Close()
	go func() {
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			p.mu.Lock()
			p.out.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
		}
		r.Close()
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		if !p.Exited() {
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
		}
	})
	return p
}

// Proc is one program started in a host.
type Proc struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  strings.Builder
	done chan struct{}
	err  error
}

// Output is what the program printed so far.
func (p *Proc) Output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// Pid is the process id (of softroce run, which becomes the program).
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Exited reports whether the program has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Signal sends sig to the program's process group.
func (p *Proc) Signal(sig syscall.Signal) { syscall.Kill(-p.cmd.Process.Pid, sig) }

// ErrTimeout is WaitTimeout's error for a program still running.
var ErrTimeout = errors.New("did not finish in time (killed)")

// WaitTimeout waits for the program's end, killing it after d: its exit
// error, or ErrTimeout.
func (p *Proc) WaitTimeout(d time.Duration) error {
	select {
	case <-p.done:
		return p.err
	case <-time.After(d):
		p.Signal(syscall.SIGKILL)
		<-p.done
		return ErrTimeout
	}
}

// WaitListen waits until the program listens on TCP port (its namespace's
// socket table, /proc/PID/net/tcp and tcp6), failing the test if it ends
// or d passes first. A probe connection could be taken for its client.
func (p *Proc) WaitListen(t testing.TB, port int, d time.Duration) {
	t.Helper()
	want := fmt.Sprintf(":%04X ", port)
	deadline := time.Now().Add(d)
	for {
		for _, f := range []string{"tcp", "tcp6"} {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", p.Pid(), f))
			for _, l := range strings.Split(string(b), "\n")[1:] {
				fs := strings.Fields(l)
				// local_address is field 1, st field 3 (0A: LISTEN).
				if len(fs) > 3 && strings.HasSuffix(fs[1]+" ", want) && fs[3] == "0A" {
					return
				}
			}
		}
		if p.Exited() {
			t.Fatalf("%s ended before listening on TCP %d: %v\n%s", p.cmd.Args, port, p.err, p.Output())
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not listen on TCP %d within %v:\n%s", p.cmd.Args, port, d, p.Output())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// FreeTCPPort is a TCP port the host's kernel had free a moment ago, for
// an application's rendezvous: a fixed port may be anyone's.
func (h *Host) FreeTCPPort(t testing.TB) int {
	t.Helper()
	var port int
	err := h.do(func() error {
		l, err := net.Listen("tcp4", net.JoinHostPort(h.Addr().String(), "0"))
		if err != nil {
			return err
		}
		defer l.Close()
		port = l.Addr().(*net.TCPAddr).Port
		return nil
	})
	if err != nil {
		t.Fatalf("host %s: free TCP port: %v", h.Name, err)
	}
	return port
}
