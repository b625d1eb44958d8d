package apps

// MPI jobs across two softroce hosts: Open MPI (pml ucx with osc ucx, and
// pml cm with mtl ofi), MPICH (ch4:ucx) and mpi4py, each running the
// project's checking program (testdata/mpicheck.c, testdata/mpicheck.py)
// with rank 0 on host A and rank 1 on host B, both as nobody.
//
// The launcher is the MPI's own ssh/rsh launcher: mpirun (or mpiexec) runs
// in host A, starts rank 0 itself and reaches host B through its remote
// shell agent, here a test stand-in for ssh (mpiRshd below: the agent
// sends the command to a server the test runs in host B, which runs it
// there as nobody with a login's environment). Each rank's command is
// `softroce run -- PROGRAM`, which finds its own host's daemon on the
// default socket of its network namespace. The jobs set only their
// transport selection (UCX_TLS, FI_PROVIDER, --mca pml/osc/mtl) and the
// launcher's plumbing; each test checks, from the ranks' own report, that
// no other UCX_*, FI_*, OMPI_MCA_* or MPIR_CVAR_* variable reached them.
//
// These tests carry a small two-host rig of their own (mpiRig).

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/softroce/softroce/abi"
	"github.com/softroce/softroce/internal/netnstest"
)

// mpiUID is the unprivileged user the daemons and the jobs run as.
const mpiUID = 65534

// mpiRshName is the name the test binary answers to as the remote shell
// agent (see init).
const mpiRshName = "softroce-mpi-rsh"

func init() {
	if filepath.Base(os.Args[0]) == mpiRshName {
		os.Exit(mpiRshAgent(os.Args[1:]))
	}
}

// mpiBuild builds softroce and its libraries into dir and copies the test
// binary there as the remote shell agent. The Go build cache makes all
// but the first build quick.
func mpiBuild(t *testing.T, dir string) {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, gobin, "build", "-o", filepath.Join(dir, "softroce"), "github.com/softroce/softroce/cmd/softroce").CombinedOutput(); err != nil {
		t.Fatalf("build softroce: %v\n%s", err, out)
	}
	if _, err := abi.Build(filepath.Join(dir, "abi")); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err == nil {
		err = mpiCopy(self, filepath.Join(dir, mpiRshName))
	}
	if err == nil {
		err = filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
			if err == nil && fi.IsDir() {
				err = os.Chmod(p, 0o755)
			}
			return err
		})
	}
	if err != nil {
		t.Fatal(err)
	}
}

func mpiCopy(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// mpiNeed skips the test unless it can run: as root, with softroce's
// library buildable and progs installed (pkgs: the Debian packages).
func mpiNeed(t *testing.T, pkgs string, progs ...string) {
	t.Helper()
	netnstest.Require(t)
	if m := abi.Missing(); m != "" {
		t.Skip("cannot build softroce's libibverbs.so.1: " + m)
	}
	for _, p := range progs {
		if _, err := exec.LookPath(p); err != nil {
			t.Skipf("%s is not installed (Debian: apt-get install %s)", p, pkgs)
		}
	}
}

// mpiHost is one host: a network namespace with nobody's daemon on its
// default socket.
type mpiHost struct {
	end   *netnstest.End
	netns string // its /proc/self/ns/net link, as the ranks print it
}

// mpiRig is two hosts joined by a veth, the environment nobody's programs
// get in both (a login's: PATH with softroce, HOME, TMPDIR, SHELL), and
// the remote shell: rsh is the agent's path for the launchers.
type mpiRig struct {
	a, b *mpiHost
	env  []string
	rsh  string
	dir  string // the test's directory, readable by nobody: softroce, the agent, the programs
}

func newMPIRig(t *testing.T) *mpiRig {
	t.Helper()
	dir := t.TempDir()
	// t.TempDir's parent is made 0700; nobody runs the programs here.
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mpiBuild(t, dir)
	home, tmp := filepath.Join(dir, "home"), filepath.Join(dir, "tmp")
	for _, d := range []string{home, tmp} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(d, mpiUID, mpiUID); err != nil {
			t.Fatal(err)
		}
	}
	r := &mpiRig{dir: dir, env: []string{
		"PATH=" + dir + ":/usr/local/bin:/usr/bin:/bin",
		"HOME=" + home,
		"TMPDIR=" + tmp, // the daemons' default sockets, and the MPIs' session directories
		"SHELL=/bin/sh",
		"SOFTROCE_ABI_DIR=" + filepath.Join(dir, "abi"),
	}}
	v := netnstest.Connect(t, netnstest.NewNSTagged(t, "mpiA"), netnstest.NewNSTagged(t, "mpiB"), netnstest.VethConfig{})
	r.a, r.b = &mpiHost{end: v.A}, &mpiHost{end: v.B}
	for _, h := range []*mpiHost{r.a, r.b} {
		h.end.NS.Run(t, func() (err error) {
			h.netns, err = os.Readlink("/proc/thread-self/ns/net")
			return err
		})
		d := r.start(t, h, filepath.Join(dir, "softroce"), "serve", "--addr", h.end.Addr().String())
		for deadline := time.Now().Add(30 * time.Second); !strings.Contains(d.output(), "listening on"); time.Sleep(20 * time.Millisecond) {
			if d.exited() || time.Now().After(deadline) {
				t.Fatalf("softroce serve in %s did not start:\n%s", h.end.NS.Name, d.output())
			}
		}
		t.Cleanup(func() {
			syscall.Kill(-d.cmd.Process.Pid, syscall.SIGTERM)
			if d.wait(20*time.Second) == errMPITimeout {
				t.Errorf("softroce serve in %s did not stop on SIGTERM", h.end.NS.Name)
			}
			if t.Failed() {
				t.Logf("daemon in %s:\n%s", h.end.NS.Name, d.output())
			}
		})
	}
	port := r.rshd(t, r.b)
	r.rsh = filepath.Join(dir, "rsh")
	script := fmt.Sprintf("#!/bin/sh\nexec %s -p %d \"$@\"\n", filepath.Join(dir, mpiRshName), port)
	if err := os.WriteFile(r.rsh, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return r
}

// mpiProc is a process the rig started, its output collected.
type mpiProc struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  strings.Builder
	done chan struct{}
	err  error
}

func (p *mpiProc) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.Write(b)
}

func (p *mpiProc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

func (p *mpiProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

var errMPITimeout = fmt.Errorf("did not finish in time (killed)")

// wait waits for the process's end, killing its process group after d.
func (p *mpiProc) wait(d time.Duration) error {
	select {
	case <-p.done:
		return p.err
	case <-time.After(d):
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
		return errMPITimeout
	}
}

// start runs argv as nobody in h's namespace with the rig's environment,
// in a process group of its own that is killed at cleanup.
func (r *mpiRig) start(t *testing.T, h *mpiHost, path string, args ...string) *mpiProc {
	t.Helper()
	return r.startIO(t, h, nil, path, args...)
}

func (r *mpiRig) startIO(t *testing.T, h *mpiHost, out io.Writer, path string, args ...string) *mpiProc {
	t.Helper()
	cmd := exec.Command(path, args...)
	cmd.Env = r.env
	cmd.Dir = r.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: mpiUID, Gid: mpiUID}, Setpgid: true}
	p := &mpiProc{cmd: cmd, done: make(chan struct{})}
	if out == nil {
		out = p
	}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.WaitDelay = 5 * time.Second
	// Forked from a thread in the namespace, which the child keeps.
	if err := h.end.NS.Do(cmd.Start); err != nil {
		t.Fatalf("start %s in %s: %v", path, h.end.NS.Name, err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		if !p.exited() {
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
		}
	})
	return p
}

// The remote shell: the agent (`softroce-mpi-rsh -p PORT HOST COMMAND...`,
// as a launcher calls ssh) connects to HOST:PORT and sends the command as
// a JSON array; the server runs it with /bin/sh as nobody in its host and
// sends back frames: a kind byte (1 stdout, 2 stderr, 3 exit status), a
// 32-bit big-endian length, the bytes. When the agent's connection
// closes, the command's process group is killed.

// rshd serves h's remote shell on a free TCP port of h's address.
func (r *mpiRig) rshd(t *testing.T, h *mpiHost) int {
	t.Helper()
	var l net.Listener
	h.end.NS.Run(t, func() (err error) {
		l, err = net.Listen("tcp4", net.JoinHostPort(h.end.Addr().String(), "0"))
		return err
	})
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go r.rshServe(t, h, c)
		}
	}()
	return l.Addr().(*net.TCPAddr).Port
}

type mpiFrames struct {
	mu sync.Mutex
	c  net.Conn
}

func (f *mpiFrames) send(kind byte, b []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	h := make([]byte, 5, 5+len(b))
	h[0] = kind
	binary.BigEndian.PutUint32(h[1:], uint32(len(b)))
	_, err := f.c.Write(append(h, b...))
	return err
}

type mpiFrameWriter struct {
	f    *mpiFrames
	kind byte
}

func (w mpiFrameWriter) Write(b []byte) (int, error) {
	if err := w.f.send(w.kind, b); err != nil {
		return 0, err
	}
	return len(b), nil
}

func (r *mpiRig) rshServe(t *testing.T, h *mpiHost, c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	line, err := br.ReadBytes('\n')
	var argv []string
	if err != nil || json.Unmarshal(line, &argv) != nil || len(argv) == 0 {
		return
	}
	f := &mpiFrames{c: c}
	cmd := exec.Command("/bin/sh", "-c", strings.Join(argv, " "))
	cmd.Env = r.env
	cmd.Dir = r.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: mpiUID, Gid: mpiUID}, Setpgid: true}
	cmd.Stdout, cmd.Stderr = mpiFrameWriter{f, 1}, mpiFrameWriter{f, 2}
	cmd.WaitDelay = 5 * time.Second
	if err := h.end.NS.Do(cmd.Start); err != nil {
		f.send(2, []byte(err.Error()+"\n"))
		f.send(3, []byte{0, 0, 0, 127})
		return
	}
	done := make(chan struct{})
	go func() {
		// The agent's end closes: it died or the launcher killed it.
		io.Copy(io.Discard, br)
		select {
		case <-done:
		default:
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
	}()
	err = cmd.Wait()
	close(done)
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		if code = ee.ExitCode(); code < 0 {
			code = 255
		}
	}
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], uint32(code))
	f.send(3, b[:])
}

// mpiRshAgent is the remote shell agent: -p PORT HOST COMMAND...
func mpiRshAgent(args []string) int {
	if len(args) < 4 || args[0] != "-p" {
		fmt.Fprintf(os.Stderr, "usage: %s -p PORT HOST COMMAND...\n", mpiRshName)
		return 255
	}
	c, err := net.Dial("tcp", net.JoinHostPort(args[2], args[1]))
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", mpiRshName, err)
		return 255
	}
	b, _ := json.Marshal(args[3:])
	if _, err := c.Write(append(b, '\n')); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", mpiRshName, err)
		return 255
	}
	br := bufio.NewReader(c)
	for {
		var h [5]byte
		if _, err := io.ReadFull(br, h[:]); err != nil {
			fmt.Fprintf(os.Stderr, "%s: connection lost: %v\n", mpiRshName, err)
			return 255
		}
		data := make([]byte, binary.BigEndian.Uint32(h[1:]))
		if _, err := io.ReadFull(br, data); err != nil {
			return 255
		}
		switch h[0] {
		case 1:
			os.Stdout.Write(data)
		case 2:
			os.Stderr.Write(data)
		case 3:
			return int(int32(binary.BigEndian.Uint32(data)))
		}
	}
}

// compile builds src (in testdata) with the MPI's compiler wrapper into
// the rig's directory.
func (r *mpiRig) compile(t *testing.T, mpicc, src string) string {
	t.Helper()
	abs, err := filepath.Abs(filepath.Join("testdata", src))
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(r.dir, strings.TrimSuffix(src, ".c")+"-"+filepath.Base(mpicc))
	if b, err := exec.Command(mpicc, "-O2", "-Wall", "-o", out, abs).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", mpicc, err, b)
	}
	return out
}

// job runs a launcher command in host A until it ends (limit d) and
// returns its output; a failure or a timeout fails the test.
func (r *mpiRig) job(t *testing.T, d time.Duration, argv ...string) string {
	t.Helper()
	t.Logf("host A (%s, %s) and B (%s, %s): %s", r.a.end.NS.Name, r.a.end.Addr(), r.b.end.NS.Name, r.b.end.Addr(), strings.Join(argv, " "))
	start := time.Now()
	p := r.start(t, r.a, argv[0], argv[1:]...)
	err := p.wait(d)
	out := p.output()
	if err != nil {
		t.Fatalf("%s: %v after %v\n%s", argv[0], err, time.Since(start).Round(time.Millisecond), out)
	}
	t.Logf("the job took %v", time.Since(start).Round(time.Millisecond))
	return out
}

var mpiRankLine = regexp.MustCompile(`(?m)^rank ([01]) netns (\S+) softroce_socket (\S+)$`)

// mpiLauncherVars are the variables the launchers set in every rank
// themselves (their runtime's wiring, not a setting of the test's):
// Open MPI's ORTE and PMIx, Hydra's address of the rank's host.
var mpiLauncherVars = regexp.MustCompile(`^(OMPI_MCA_(orte_\w+|ess\w*|pmix\w*|plm|routed|initial_wdir|mpi_oversubscribe|shmem_RUNTIME_QUERY_hint)|MPIR_CVAR_CH3_INTERFACE_HOSTNAME)$`)

// checkRanks checks the job's output: its success line, both ranks'
// reports (rank 0 in host A, rank 1 in host B, each through softroce
// run), and that each rank's UCX_*, FI_*, OMPI_MCA_* and MPIR_CVAR_*
// variables are exactly want and the launcher's own. It logs the figures.
func (r *mpiRig) checkRanks(t *testing.T, out, okLine string, want map[string]string) {
	t.Helper()
	if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(okLine) + `$`).MatchString(out) {
		t.Fatalf("no %q in the job's output:\n%s", okLine, out)
	}
	ranks := mpiRankLine.FindAllStringSubmatch(out, -1)
	if len(ranks) != 2 || ranks[0][1] == ranks[1][1] {
		t.Fatalf("want one report of each rank, got %q:\n%s", ranks, out)
	}
	for _, m := range ranks {
		h := r.a
		if m[1] == "1" {
			h = r.b
		}
		if m[2] != h.netns {
			t.Errorf("rank %s ran in %s, want host %s's %s", m[1], m[2], h.end.NS.Name, h.netns)
		}
		if m[3] == "(none)" {
			t.Errorf("rank %s did not run through softroce run (no SOFTROCE_SOCKET)", m[1])
		}
	}
	for _, rank := range []string{"0", "1"} {
		got := map[string]string{}
		for _, m := range regexp.MustCompile(`(?m)^rank `+rank+` env ([A-Z_a-z0-9]+)=(.*)$`).FindAllStringSubmatch(out, -1) {
			got[m[1]] = m[2]
		}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("rank %s: %s=%q, want %q", rank, k, got[k], v)
			}
		}
		for k, v := range got {
			if _, ok := want[k]; !ok && !mpiLauncherVars.MatchString(k) {
				t.Errorf("rank %s has %s=%s: the test sets no such variable", rank, k, v)
			}
		}
	}
	if strings.Contains(out, "softroce run:") {
		t.Errorf("softroce run complained:\n%s", out)
	}
	var figs []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "pingpong ") || strings.HasPrefix(l, "allreduce ") || strings.HasPrefix(l, "win ") || strings.HasPrefix(l, "exchange ") {
			figs = append(figs, l)
		}
	}
	t.Logf("rank 0's figures:\n%s", strings.Join(figs, "\n"))
}

// ompiRun is mpirun.openmpi's command line for the two hosts: rank 0 in
// A, rank 1 in B through the agent, each rank `softroce run -- prog`;
// mca are the test's --mca settings, xenv the variables for the ranks.
func (r *mpiRig) ompiRun(mca [][2]string, xenv map[string]string, prog ...string) []string {
	argv := []string{"mpirun.openmpi", "-np", "2", "--host", r.a.end.Addr().String() + "," + r.b.end.Addr().String(),
		"--mca", "plm_rsh_agent", r.rsh}
	for _, m := range mca {
		argv = append(argv, "--mca", m[0], m[1])
	}
	for k, v := range xenv {
		argv = append(argv, "-x", k+"="+v)
	}
	return append(append(argv, "softroce", "run", "--"), prog...)
}

// ompiWant is what the ranks' environment holds of the test's settings.
func ompiWant(r *mpiRig, mca [][2]string, xenv map[string]string) map[string]string {
	w := map[string]string{"OMPI_MCA_plm_rsh_agent": r.rsh}
	for _, m := range mca {
		w["OMPI_MCA_"+m[0]] = m[1]
	}
	for k, v := range xenv {
		w[k] = v
	}
	return w
}

// UCX's verbs transports only: both hosts are namespaces of one machine,
// which UCX would otherwise take for one host and join by shared memory.
const mpiUCXTLS = "rc_verbs,ud_verbs,self"

// Open MPI over UCX: pml ucx for the messages, osc ucx for the window
// (its own UCX worker). -f: a 4 MiB exchange freed before the window
// opens, so that the second worker's buffers and the window may take
// addresses the first worker's registration cache still holds.
func TestMPIOpenMPIUCX(t *testing.T) {
	mpiNeed(t, "openmpi-bin libopenmpi-dev libucx0", "mpirun.openmpi", "mpicc.openmpi")
	r := newMPIRig(t)
	prog := r.compile(t, "mpicc.openmpi", "mpicheck.c")
	mca := [][2]string{{"pml", "ucx"}, {"osc", "ucx"}}
	xenv := map[string]string{"UCX_TLS": mpiUCXTLS}
	out := r.job(t, 100*time.Second, r.ompiRun(mca, xenv, prog, "-n", "4", "-f", "4194304")...)
	r.checkRanks(t, out, "mpicheck: ok", ompiWant(r, mca, xenv))
}

// Open MPI over libfabric: pml cm with mtl ofi on the verbs provider's
// datagram endpoints under ofi_rxd (FI_EP_RDM over UD); MPI_Win by osc
// pt2pt over that pml. Messages up to 64 KiB: see docs for rxd's rate.
func TestMPIOpenMPIOFI(t *testing.T) {
	mpiNeed(t, "openmpi-bin libopenmpi-dev libfabric1", "mpirun.openmpi", "mpicc.openmpi")
	r := newMPIRig(t)
	prog := r.compile(t, "mpicc.openmpi", "mpicheck.c")
	mca := [][2]string{{"pml", "cm"}, {"mtl", "ofi"}, {"osc", "pt2pt"}}
	// ofi_rxd (RDM over UD) is slow from 64 KiB up: its messages stop
	// there; ofi_rxm (RDM over RC) runs the whole check.
	for _, c := range []struct{ provider, maxSize string }{{"verbs;ofi_rxd", "65536"}, {"verbs;ofi_rxm", "1048576"}} {
		xenv := map[string]string{"FI_PROVIDER": c.provider}
		out := r.job(t, 100*time.Second, r.ompiRun(mca, xenv, prog, "-n", "4", "-m", c.maxSize)...)
		r.checkRanks(t, out, "mpicheck: ok", ompiWant(r, mca, xenv))
	}
}

// MPICH (Debian's is ch4:ucx) through Hydra's rsh launcher.
func TestMPIMPICH(t *testing.T) {
	mpiNeed(t, "mpich libmpich-dev libucx0", "mpiexec.mpich", "mpicc.mpich")
	r := newMPIRig(t)
	prog := r.compile(t, "mpicc.mpich", "mpicheck.c")
	argv := []string{"mpiexec.mpich", "-n", "2", "-hosts", r.a.end.Addr().String() + "," + r.b.end.Addr().String(),
		"-launcher", "rsh", "-launcher-exec", r.rsh, "-genv", "UCX_TLS", mpiUCXTLS,
		"softroce", "run", "--", prog, "-n", "4"}
	out := r.job(t, 100*time.Second, argv...)
	r.checkRanks(t, out, "mpicheck: ok", map[string]string{"UCX_TLS": mpiUCXTLS})
}

// mpi4py (Debian's is built on Open MPI) with pml ucx and osc ucx.
func TestMPI4Py(t *testing.T) {
	mpiNeed(t, "openmpi-bin python3-mpi4py", "mpirun.openmpi", "/usr/bin/python3")
	if out, err := exec.Command("/usr/bin/python3", "-c", "import mpi4py").CombinedOutput(); err != nil {
		t.Skipf("/usr/bin/python3 has no mpi4py (Debian: apt-get install python3-mpi4py): %v\n%s", err, out)
	}
	r := newMPIRig(t)
	script := filepath.Join(r.dir, "mpicheck.py")
	b, err := os.ReadFile(filepath.Join("testdata", "mpicheck.py"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(script, b, 0o644); err != nil {
		t.Fatal(err)
	}
	mca := [][2]string{{"pml", "ucx"}, {"osc", "ucx"}}
	xenv := map[string]string{"UCX_TLS": mpiUCXTLS}
	out := r.job(t, 100*time.Second, r.ompiRun(mca, xenv, "/usr/bin/python3", script, "3")...)
	r.checkRanks(t, out, "mpicheck.py: ok", ompiWant(r, mca, xenv))
}
