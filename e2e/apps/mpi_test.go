package apps

// MPI jobs across two hosts: Open MPI (pml ucx with osc ucx, and pml cm
// with mtl ofi), MPICH (ch4:ucx) and mpi4py, each running the project's
// checking program (testdata/mpicheck.c, testdata/mpicheck.py) with rank 0
// on softroce host A and rank 1 on host B: another softroce host
// (TestMPI...), or kernel rxe in the qemu guest (Test...AgainstRxe).
//
// The launcher is the MPI's own ssh/rsh launcher: mpirun (or mpiexec) runs
// in host A as nobody, starts rank 0 itself and reaches host B through its
// remote shell agent, here a test stand-in for ssh (rshd below: the agent
// sends the command to a server the test runs, which runs it in host B:
// as nobody with a login's environment in a softroce host, as root over
// the guest's command channel in the rxe guest). A job has one part per
// rank (MPMD), since the ranks' commands differ: `softroce run --socket
// SOCKET -- PROGRAM` to its own host's daemon in a softroce host, PROGRAM
// itself in the guest. The jobs set only their transport selection
// (UCX_TLS, FI_PROVIDER, --mca pml/osc/mtl) and the launcher's plumbing;
// each test checks, from the ranks' own report, that no other UCX_*, FI_*,
// OMPI_MCA_* or MPIR_CVAR_* variable reached them. The guest's rank gets
// one more where rxe needs it (hostEnv).

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/softroce/softroce/conformance/rxevm"
)

// mpiRshName is the name the test binary answers to as the remote shell
// agent (see init).
const mpiRshName = "softroce-mpi-rsh"

func init() {
	if filepath.Base(os.Args[0]) == mpiRshName {
		os.Exit(mpiRshAgent(os.Args[1:]))
	}
}

// mpiHost is one host of a job: a softroce host (a network namespace of
// this machine with nobody's daemon) or the kernel rxe guest.
type mpiHost struct {
	name  string
	addr  netip.Addr
	netns string // its network namespace as the ranks print it
	soft  *Host  // the softroce host; nil in the guest
	guest *RxePeer
}

// rank is a rank's command in h for the program argv: through softroce
// run to the host's daemon, or, in the guest, the program itself (ship
// put the rig's files at the same paths there).
func (h *mpiHost) rank(argv []string) []string {
	if h.soft != nil {
		return append([]string{"softroce", "run", "--socket", h.soft.Socket, "--"}, argv...)
	}
	return argv
}

// mpiRig is a job's two hosts: A (a softroce host) runs the launcher and
// rank 0, B (another softroce host, or the rxe guest) rank 1. env is the
// environment of nobody's programs in A (a login's: PATH with softroce,
// HOME, TMPDIR, SHELL); rsh is the remote shell agent's path for the
// launchers.
type mpiRig struct {
	a, b *mpiHost
	env  []string
	rsh  string
	dir  string // the test's directory, readable by nobody: the agent, the programs
}

// newMPIRig is two softroce hosts joined by a veth.
func newMPIRig(t *testing.T) *mpiRig {
	t.Helper()
	hs := NewTwoHosts(t)
	return newRig(t, &mpiHost{name: "A", addr: hs.A.Addr(), soft: hs.A}, &mpiHost{name: "B", addr: hs.B.Addr(), soft: hs.B})
}

// newMPIRxeRig is the softroce host beside the rxe guest (A) and the
// guest (B), whose rank runs as root with the guest's Debian libibverbs
// and rxe provider on rxe0.
func newMPIRxeRig(t *testing.T, p *RxePeer) *mpiRig {
	t.Helper()
	return newRig(t, &mpiHost{name: "softroce", addr: p.Soft.Addr(), soft: p.Soft}, &mpiHost{name: "rxe guest", addr: p.GuestAddr(), guest: p})
}

func newRig(t *testing.T, a, b *mpiHost) *mpiRig {
	t.Helper()
	bin, abiRoot := build(t)
	dir := t.TempDir()
	// t.TempDir's parent is made 0700; nobody runs the programs here.
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	self, err := os.Executable()
	if err == nil {
		err = mpiCopy(self, filepath.Join(dir, mpiRshName))
	}
	if err != nil {
		t.Fatal(err)
	}
	home, tmp := filepath.Join(dir, "home"), filepath.Join(dir, "tmp")
	for _, d := range []string{home, tmp} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(d, User, User); err != nil {
			t.Fatal(err)
		}
	}
	r := &mpiRig{a: a, b: b, dir: dir, env: []string{
		"PATH=" + filepath.Dir(bin) + ":" + dir + ":/usr/local/bin:/usr/bin:/bin",
		"HOME=" + home,
		"TMPDIR=" + tmp, // the MPIs' session directories
		"SHELL=/bin/sh",
		"SOFTROCE_ABI_DIR=" + abiRoot,
	}}
	for _, h := range []*mpiHost{a, b} {
		if h.soft != nil {
			if err := h.soft.do(func() (err error) {
				h.netns, err = os.Readlink("/proc/thread-self/ns/net")
				return err
			}); err != nil {
				t.Fatal(err)
			}
			continue
		}
		out, err := h.guest.GuestRun(t, time.Minute, "readlink /proc/self/ns/net")
		if err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		h.netns = strings.TrimSpace(out)
	}
	srv := r.rshd(t)
	r.rsh = filepath.Join(dir, "rsh")
	script := fmt.Sprintf("#!/bin/sh\nexec %s -s %s \"$@\"\n", filepath.Join(dir, mpiRshName), srv)
	if err := os.WriteFile(r.rsh, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	if b.guest != nil {
		// Open MPI's daemon in the guest checks that the agent it would
		// pass its own children to exists; it has none to start.
		r.shipData(t, r.rsh, []byte("#!/bin/sh\necho \"$0: no remote shell from the rxe guest\" >&2\nexit 255\n"))
	}
	return r
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

// ship copies a file of the rig's directory to the same path in the
// guest's host root (its /tmp is the guest's own), if B is the guest,
// over its command channel: base64 in the command line, in pieces well
// below a shell argument's limit.
func (r *mpiRig) ship(t *testing.T, file string) {
	t.Helper()
	if r.b.guest == nil {
		return
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	r.shipData(t, file, b)
}

func (r *mpiRig) shipData(t *testing.T, dst string, b []byte) {
	t.Helper()
	enc := base64.StdEncoding.EncodeToString(b)
	const piece = 64 << 10
	for i := 0; i == 0 || i < len(enc); i += piece {
		redir := ">"
		if i > 0 {
			redir = ">>"
		}
		chunk := enc[i:min(i+piece, len(enc))]
		cmd := fmt.Sprintf("mkdir -p %s && echo %s | base64 -d %s %s", path.Dir(dst), chunk, redir, dst)
		if out, err := r.b.guest.GuestRun(t, time.Minute, cmd); err != nil {
			t.Fatalf("ship %s to the guest: %v: %s", dst, err, out)
		}
	}
	sum := fmt.Sprintf("%x", sha256.Sum256(b))
	out, err := r.b.guest.GuestRun(t, time.Minute, fmt.Sprintf("chmod 755 %s && sha256sum %s", dst, dst))
	if err != nil || !strings.HasPrefix(out, sum) {
		t.Fatalf("ship %s to the guest: %v: %s, want sha256 %s", dst, err, out, sum)
	}
}

// start runs argv as nobody in h (a softroce host) with the rig's
// environment, in a process group of its own that is killed at cleanup.
func (r *mpiRig) start(t *testing.T, h *mpiHost, path string, args ...string) *Proc {
	t.Helper()
	cmd := exec.Command(path, args...)
	cmd.Env = r.env
	cmd.Dir = r.dir
	cmd.WaitDelay = 5 * time.Second
	return startAsUser(t, "host "+h.name, h.soft.do, cmd)
}

// The remote shell: the agent (`softroce-mpi-rsh -s ADDR:PORT HOST
// COMMAND...`, as a launcher calls ssh) connects to the rig's server at
// ADDR:PORT in host A and sends HOST and the command as JSON; the server
// runs the command with /bin/sh in that host (as nobody in a softroce
// host, as root in the rxe guest's host root) and sends back frames: a
// kind byte (1 stdout, 2 stderr, 3 exit status), a 32-bit big-endian
// length, the bytes. When the agent's connection closes, the command's
// process group is killed.

type mpiRshRequest struct {
	Host string   `json:"host"`
	Argv []string `json:"argv"`
}

// rshd serves the remote shell on a free TCP port of A's address and
// returns that address.
func (r *mpiRig) rshd(t *testing.T) string {
	t.Helper()
	var l net.Listener
	if err := r.a.soft.do(func() (err error) {
		l, err = net.Listen("tcp4", net.JoinHostPort(r.a.addr.String(), "0"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go r.rshServe(c)
		}
	}()
	return l.Addr().String()
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

func (r *mpiRig) rshServe(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	line, err := br.ReadBytes('\n')
	var req mpiRshRequest
	if err != nil || json.Unmarshal(line, &req) != nil || len(req.Argv) == 0 {
		return
	}
	f := &mpiFrames{c: c}
	// The agent's end closes: it died or the launcher killed it.
	gone := make(chan struct{})
	go func() {
		io.Copy(io.Discard, br)
		close(gone)
	}()
	var code int
	switch req.Host {
	case r.b.addr.String():
		if r.b.guest != nil {
			code = r.rshGuest(f, r.b.guest, req.Argv, gone)
		} else {
			code = r.rshSoft(f, r.b, req.Argv, gone)
		}
	default:
		f.send(2, []byte(fmt.Sprintf("%s: no host %q in this rig\n", mpiRshName, req.Host)))
		code = 255
	}
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], uint32(code))
	f.send(3, b[:])
}

// rshSoft runs a remote shell command in softroce host h as nobody with a
// login's environment.
func (r *mpiRig) rshSoft(f *mpiFrames, h *mpiHost, argv []string, gone <-chan struct{}) int {
	cmd := exec.Command("/bin/sh", "-c", strings.Join(argv, " "))
	cmd.Env = r.env
	cmd.Dir = r.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: User, Gid: User}, Setpgid: true}
	cmd.Stdout, cmd.Stderr = mpiFrameWriter{f, 1}, mpiFrameWriter{f, 2}
	cmd.WaitDelay = 5 * time.Second
	if err := h.soft.do(cmd.Start); err != nil {
		f.send(2, []byte(err.Error()+"\n"))
		return 127
	}
	done := make(chan struct{})
	go func() {
		select {
		case <-gone:
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		case <-done:
		}
	}()
	err := cmd.Wait()
	close(done)
	if ee, ok := err.(*exec.ExitError); ok {
		if code := ee.ExitCode(); code >= 0 {
			return code
		}
		return 255
	}
	return 0
}

// rshGuest runs a remote shell command in the rxe guest's host root as
// root, over the guest's command channel. The channel returns stdout and
// stderr when the command ends, so the frames come then. Open MPI needs
// no consent to root there: only mpirun checks, and it runs as nobody.
func (r *mpiRig) rshGuest(f *mpiFrames, g *RxePeer, argv []string, gone <-chan struct{}) int {
	p, err := g.VM.Start(context.Background(), rxevm.InHostRoot(strings.Join(argv, " ")))
	if err != nil {
		f.send(2, []byte(err.Error()+"\n"))
		return 127
	}
	select {
	case <-p.Done():
	case <-gone:
		p.Kill()
	}
	_, err = p.Wait(context.Background())
	stdout, stderr := p.Output()
	f.send(1, []byte(stdout))
	f.send(2, []byte(stderr))
	if ee, ok := err.(*rxevm.ExitError); ok {
		return ee.Code
	}
	if err != nil {
		f.send(2, []byte(err.Error()+"\n"))
		return 255
	}
	return 0
}

// mpiRshAgent is the remote shell agent: -s ADDR:PORT HOST COMMAND...
func mpiRshAgent(args []string) int {
	if len(args) < 4 || args[0] != "-s" {
		fmt.Fprintf(os.Stderr, "usage: %s -s ADDR:PORT HOST COMMAND...\n", mpiRshName)
		return 255
	}
	c, err := net.Dial("tcp", args[1])
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", mpiRshName, err)
		return 255
	}
	b, _ := json.Marshal(mpiRshRequest{Host: args[2], Argv: args[3:]})
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
// the rig's directory (and the guest).
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
	r.ship(t, out)
	return out
}

// script copies a testdata file into the rig's directory (and the guest).
func (r *mpiRig) script(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(r.dir, name)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	r.ship(t, p)
	return p
}

// rxeCounters are rxe0's packet counters in the guest.
func rxeCounters(t *testing.T, g *RxePeer) (sent, rcvd int64) {
	t.Helper()
	out, err := g.GuestRun(t, time.Minute, "cat /sys/class/infiniband/rxe0/ports/1/hw_counters/sent_pkts /sys/class/infiniband/rxe0/ports/1/hw_counters/rcvd_pkts")
	f := strings.Fields(out)
	if err != nil || len(f) != 2 {
		t.Fatalf("rxe0's counters: %v: %q", err, out)
	}
	sent, _ = strconv.ParseInt(f[0], 10, 64)
	rcvd, _ = strconv.ParseInt(f[1], 10, 64)
	return sent, rcvd
}

// job runs a launcher command in host A until it ends (limit d) and
// returns its output; a failure or a timeout fails the test. Against the
// guest, rxe0 must have sent and received packets meanwhile.
func (r *mpiRig) job(t *testing.T, d time.Duration, argv ...string) string {
	t.Helper()
	var sent, rcvd int64
	if r.b.guest != nil {
		sent, rcvd = rxeCounters(t, r.b.guest)
	}
	out, err := r.run(t, d, argv...)
	if err != nil {
		t.Fatalf("%s: %v\n%s", argv[0], err, out)
	}
	if r.b.guest != nil {
		s, c := rxeCounters(t, r.b.guest)
		t.Logf("rxe0 sent %d and received %d packets", s-sent, c-rcvd)
		if s == sent || c == rcvd {
			t.Errorf("rxe0 sent %d and received %d packets during the job: the guest's rank did not use it", s-sent, c-rcvd)
		}
	}
	return out
}

// run runs a launcher command in host A until it ends (limit d): its
// output and its error.
func (r *mpiRig) run(t *testing.T, d time.Duration, argv ...string) (string, error) {
	t.Helper()
	t.Logf("host %s (%s) and %s (%s): %s", r.a.name, r.a.addr, r.b.name, r.b.addr, strings.Join(argv, " "))
	start := time.Now()
	p := r.start(t, r.a, argv[0], argv[1:]...)
	err := p.WaitTimeout(d)
	t.Logf("the job took %v", time.Since(start).Round(time.Millisecond))
	return p.Output(), err
}

// apps is the ranks' part of a launcher's command line, one rank in each
// host (rank 0 in A), each with its host's command for prog: np and host
// are the launcher's options for a rank count and a host (host "": the
// launcher places the ranks by its global host list), opts gives what
// goes into each rank's part (Open MPI's -x holds for its own part only).
func (r *mpiRig) apps(np, host string, opts func(h *mpiHost) []string, prog ...string) []string {
	var argv []string
	for i, h := range []*mpiHost{r.a, r.b} {
		if i > 0 {
			argv = append(argv, ":")
		}
		argv = append(argv, np, "1")
		if host != "" {
			argv = append(argv, host, h.addr.String())
		}
		if opts != nil {
			argv = append(argv, opts(h)...)
		}
		argv = append(argv, h.rank(prog)...)
	}
	return argv
}

var mpiRankLine = regexp.MustCompile(`(?m)^rank ([01]) netns (\S+) softroce_socket (\S+)$`)

// mpiLauncherVars are the variables the launchers set in every rank
// themselves (their runtime's wiring, not a setting of the test's):
// Open MPI's ORTE and PMIx, Hydra's address of the rank's host.
var mpiLauncherVars = regexp.MustCompile(`^(OMPI_MCA_(orte_\w+|ess\w*|pmix\w*|plm|routed|initial_wdir|mpi_oversubscribe|shmem_RUNTIME_QUERY_hint)|MPIR_CVAR_CH3_INTERFACE_HOSTNAME)$`)

// checkRanks checks the job's output: its success line, both ranks'
// reports (rank 0 in host A, rank 1 in host B, each through softroce run
// in a softroce host and without it in the guest), and that each rank's
// UCX_*, FI_*, OMPI_MCA_* and MPIR_CVAR_* variables are exactly want and
// the launcher's own (and the rank's host's own, hostEnv). It logs the
// figures.
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
			t.Errorf("rank %s ran in %s, want host %s's %s", m[1], m[2], h.name, h.netns)
		}
		if h.soft != nil && m[3] != h.soft.Socket {
			t.Errorf("rank %s ran with SOFTROCE_SOCKET %s, want host %s's daemon at %s", m[1], m[3], h.name, h.soft.Socket)
		}
		if h.guest != nil && m[3] != "(none)" {
			t.Errorf("rank %s in the guest has SOFTROCE_SOCKET %s", m[1], m[3])
		}
	}
	for i, rank := range []string{"0", "1"} {
		want := []*mpiHost{r.a, r.b}[i].hostEnv(want)
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

// ompiRun is mpirun.openmpi's command line for the two hosts (rank 1's
// through the agent); mca are the test's --mca settings, xenv the
// variables for the ranks (and each host's own, hostEnv).
func (r *mpiRig) ompiRun(mca [][2]string, xenv map[string]string, prog ...string) []string {
	argv := []string{"mpirun.openmpi", "--mca", "plm_rsh_agent", r.rsh}
	for _, m := range mca {
		argv = append(argv, "--mca", m[0], m[1])
	}
	return append(argv, r.apps("-np", "--host", func(h *mpiHost) []string {
		var x []string
		for k, v := range h.hostEnv(xenv) {
			x = append(x, "-x", k+"="+v)
		}
		return x
	}, prog...)...)
}

// mpichRun is mpiexec.mpich's (Hydra's) command line for the two hosts,
// with UCX_TLS for the ranks (and each host's own variables, hostEnv).
// Hydra's host list is global: one slot on each host places rank 0 in A
// and rank 1 in B.
func (r *mpiRig) mpichRun(tls string, prog ...string) []string {
	argv := []string{"mpiexec.mpich", "-launcher", "rsh", "-launcher-exec", r.rsh, "-genv", "UCX_TLS", tls,
		"-hosts", r.a.addr.String() + ":1," + r.b.addr.String() + ":1"}
	return append(argv, r.apps("-n", "", func(h *mpiHost) []string {
		var x []string
		for k, v := range h.hostEnv(map[string]string{"UCX_TLS": tls}) {
			if k != "UCX_TLS" {
				x = append(x, "-env", k, v)
			}
		}
		return x
	}, prog...)...)
}

// hostEnv is env and what a rank in h needs beside it. In the rxe guest,
// UCX's ud_verbs needs its destination GID check off: rxe reports a UD
// receive's sl as 0 where mlx5 (and softroce) give the packet's network
// header type, so UCX 1.13 reads an IPv4 datagram's GRH as an IPv6 one,
// finds a destination GID not its own and drops every datagram (wire-up
// then ends with "UD endpoint ...: unhandled timeout error"). A limit of
// UCX on rxe, set in the guest's rank only (docs/apps.md).
func (h *mpiHost) hostEnv(env map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range env {
		out[k] = v
	}
	if h.guest != nil && strings.Contains(env["UCX_TLS"], "ud_verbs") {
		out["UCX_UD_VERBS_ETH_DGID_CHECK"] = "n"
	}
	return out
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

// mpiJob is one job of the matrix, run between two softroce hosts and
// against the rxe guest.
type mpiJob struct {
	pkgs    string   // the Debian packages
	progs   []string // what must be installed
	timeout time.Duration
	run     func(t *testing.T, r *mpiRig, j mpiJob)
}

// Open MPI over UCX: pml ucx for the messages, osc ucx for the window
// (its own UCX worker). -f: a 4 MiB exchange freed before the window
// opens, so that the second worker's buffers and the window may take
// addresses the first worker's registration cache still holds.
var mpiOpenMPIUCX = mpiJob{
	pkgs: "openmpi-bin libopenmpi-dev libucx0", progs: []string{"mpirun.openmpi", "mpicc.openmpi"},
	run: func(t *testing.T, r *mpiRig, j mpiJob) {
		prog := r.compile(t, "mpicc.openmpi", "mpicheck.c")
		mca := [][2]string{{"pml", "ucx"}, {"osc", "ucx"}}
		xenv := map[string]string{"UCX_TLS": mpiUCXTLS}
		out := r.job(t, j.timeout, r.ompiRun(mca, xenv, prog, "-n", "4", "-f", "4194304")...)
		r.checkRanks(t, out, "mpicheck: ok", ompiWant(r, mca, xenv))
	},
}

// Open MPI over libfabric: pml cm with mtl ofi on the verbs provider,
// MPI_Win by osc pt2pt over that pml: on its datagram endpoints under
// ofi_rxd (FI_EP_RDM over UD), whose messages stop at 64 KiB (see docs
// for rxd's rate), and under ofi_rxm (RDM over RC), which runs the whole
// check.
func mpiOpenMPIOFI(providers ...string) mpiJob {
	return mpiJob{
		pkgs: "openmpi-bin libopenmpi-dev libfabric1", progs: []string{"mpirun.openmpi", "mpicc.openmpi"},
		run: func(t *testing.T, r *mpiRig, j mpiJob) {
			prog := r.compile(t, "mpicc.openmpi", "mpicheck.c")
			mca := [][2]string{{"pml", "cm"}, {"mtl", "ofi"}, {"osc", "pt2pt"}}
			for _, p := range providers {
				maxSize := map[string]string{"verbs;ofi_rxd": "65536", "verbs;ofi_rxm": "1048576"}[p]
				xenv := map[string]string{"FI_PROVIDER": p}
				out := r.job(t, j.timeout, r.ompiRun(mca, xenv, prog, "-n", "4", "-m", maxSize)...)
				r.checkRanks(t, out, "mpicheck: ok", ompiWant(r, mca, xenv))
			}
		},
	}
}

// MPICH (Debian's is ch4:ucx) through Hydra's rsh launcher.
var mpiMPICH = mpiJob{
	pkgs: "mpich libmpich-dev libucx0", progs: []string{"mpiexec.mpich", "mpicc.mpich"},
	run: func(t *testing.T, r *mpiRig, j mpiJob) {
		prog := r.compile(t, "mpicc.mpich", "mpicheck.c")
		out := r.job(t, j.timeout, r.mpichRun(mpiUCXTLS, prog, "-n", "4")...)
		r.checkRanks(t, out, "mpicheck: ok", map[string]string{"UCX_TLS": mpiUCXTLS})
	},
}

// mpi4py (Debian's is built on Open MPI) with pml ucx and osc ucx.
var mpiMPI4Py = mpiJob{
	pkgs: "openmpi-bin python3-mpi4py", progs: []string{"mpirun.openmpi", "/usr/bin/python3"},
	run: func(t *testing.T, r *mpiRig, j mpiJob) {
		script := r.script(t, "mpicheck.py")
		mca := [][2]string{{"pml", "ucx"}, {"osc", "ucx"}}
		xenv := map[string]string{"UCX_TLS": mpiUCXTLS}
		out := r.job(t, j.timeout, r.ompiRun(mca, xenv, "/usr/bin/python3", script, "3")...)
		r.checkRanks(t, out, "mpicheck.py: ok", ompiWant(r, mca, xenv))
	},
}

// need skips the test unless the job's packages are installed.
func (j mpiJob) need(t *testing.T) {
	t.Helper()
	Need(t, j.pkgs, j.progs...)
	if j.pkgs == mpiMPI4Py.pkgs {
		if out, err := exec.Command("/usr/bin/python3", "-c", "import mpi4py").CombinedOutput(); err != nil {
			t.Skipf("/usr/bin/python3 has no mpi4py (Debian: apt-get install python3-mpi4py): %v\n%s", err, out)
		}
	}
}

// twoHosts runs the job between two softroce hosts.
func (j mpiJob) twoHosts(t *testing.T) {
	j.need(t)
	j.timeout = 100 * time.Second
	j.run(t, newMPIRig(t), j)
}

// againstRxe runs the job with rank 1 in the rxe guest. The guest is
// emulated (TCG, one vCPU): its runtime's start-up alone takes tens of
// seconds.
func (j mpiJob) againstRxe(t *testing.T) {
	j.need(t)
	j.timeout = 4 * time.Minute
	j.run(t, newMPIRxeRig(t, NewRxePeer(t)), j)
}

func TestMPIOpenMPIUCX(t *testing.T) { mpiOpenMPIUCX.twoHosts(t) }
func TestMPIOpenMPIOFI(t *testing.T) { mpiOpenMPIOFI("verbs;ofi_rxd", "verbs;ofi_rxm").twoHosts(t) }
func TestMPIMPICH(t *testing.T)      { mpiMPICH.twoHosts(t) }
func TestMPI4Py(t *testing.T)        { mpiMPI4Py.twoHosts(t) }

func TestMPIOpenMPIUCXAgainstRxe(t *testing.T) { mpiOpenMPIUCX.againstRxe(t) }

// Open MPI's mtl ofi against rxe over ofi_rxd (FI_EP_RDM over UD). The
// verbs provider's datagram endpoint names itself by GID index 0: on rxe
// the interface's IPv6 link-local GID, and on softroce, whose device has
// the kernel's GID order (docs/apps.md), its link-local GID too, so both
// ends name the same fabric (fi_info's, after GID 0's prefix) and reach
// each other over RoCEv2 on IPv6 link-local. ofi_rxm is not run: rxe
// cannot open its CQ (see the docs).
func TestMPIOpenMPIOFIAgainstRxe(t *testing.T) {
	j := mpiOpenMPIOFI("verbs;ofi_rxd")
	j.need(t)
	p := NewRxePeer(t)
	gout, err := p.GuestRun(t, time.Minute, "fi_info -p 'verbs;ofi_rxd' -v | grep -A1 fi_fabric_attr")
	sout, serr := p.Soft.Run(t, time.Minute, nil, "fi_info", "-p", "verbs;ofi_rxd", "-v")
	const fabric = "name: IB-0xfe80000000000000"
	if err != nil || serr != nil || !strings.Contains(gout, fabric) || !strings.Contains(sout, fabric) {
		t.Errorf("want ofi_rxd's fabric IB-0xfe80000000000000 (GID 0 link-local) on rxe and softroce:\nrxe: %v\n%s\nsoftroce: %v\n%s", err, gout, serr, sout)
	}
	j.timeout = 4 * time.Minute
	j.run(t, newMPIRxeRig(t, p), j)
}

func TestMPIMPICHAgainstRxe(t *testing.T) { mpiMPICH.againstRxe(t) }
func TestMPI4PyAgainstRxe(t *testing.T)   { mpiMPI4Py.againstRxe(t) }
