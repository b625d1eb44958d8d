package serve

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/abitest"
	"github.com/softroce/softroce/nic/udp"
	"github.com/softroce/softroce/verbs"
)

// tool skips unless the C library can be built and the Debian tool is
// installed, and returns the tool's path and the library's directory.
func tool(t *testing.T, name string) (string, string) {
	t.Helper()
	return abitest.Tool(t, name, "ibverbs-utils")
}

func env(s *Server, lib string) []string {
	return append(os.Environ(), "SOFTROCE_SOCKET="+s.Socket(), "LD_LIBRARY_PATH="+lib)
}

func TestIbvDevinfo(t *testing.T) {
	p, lib := tool(t, "ibv_devinfo")
	s := startUDP(t)
	cmd := exec.Command(p, "-v")
	cmd.Env = env(s, lib)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("ibv_devinfo: %v\n%s", err, out)
	}
	for _, want := range []string{"hca_id:\tsoftroce0", "PORT_ACTIVE (4)", "link_layer:\t\tEthernet", "GID[  0]:\t\t::ffff:127.0.0.1, RoCE v2"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("ibv_devinfo -v lacks %q:\n%s", want, out)
		}
	}
}

func freeTCPPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// pingpong is one ibv_rc_pingpong process with its output collected.
type pingpong struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  strings.Builder
	done chan error
}

func startPingpong(t *testing.T, s *Server, lib, p string, args ...string) *pingpong {
	return startPingpongAs(t, s, lib, nil, p, args...)
}

func startPingpongAs(t *testing.T, s *Server, lib string, cred *syscall.Credential, p string, args ...string) *pingpong {
	t.Helper()
	pp := &pingpong{cmd: exec.Command(p, args...), done: make(chan error, 1)}
	pp.cmd.Env = env(s, lib)
	if cred != nil {
		pp.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	r, w := io.Pipe()
	pp.cmd.Stdout, pp.cmd.Stderr = w, w
	if err := pp.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			pp.mu.Lock()
			pp.out.WriteString(sc.Text() + "\n")
			pp.mu.Unlock()
		}
	}()
	go func() { err := pp.cmd.Wait(); w.Close(); pp.done <- err }()
	t.Cleanup(func() { pp.cmd.Process.Kill() })
	return pp
}

func (pp *pingpong) output() string {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	return pp.out.String()
}

func (pp *pingpong) wait(t *testing.T, what string) {
	t.Helper()
	select {
	case err := <-pp.done:
		time.Sleep(50 * time.Millisecond) // let the reader drain
		if err != nil {
			t.Fatalf("%s: %v\n%s", what, err, pp.output())
		}
	case <-time.After(2 * time.Minute): // a hang, not a performance bound
		t.Fatalf("%s did not finish:\n%s", what, pp.output())
	}
}

func runPair(t *testing.T, s *Server, lib, p string, iters int, extra ...string) (*pingpong, *pingpong) {
	port := fmt.Sprint(freeTCPPort(t))
	args := append([]string{"-g", "0", "-p", port, "-n", fmt.Sprint(iters)}, extra...)
	srv := startPingpong(t, s, lib, p, args...)
	// The server listens on TCP once its QPs exist (16 for ibv_srq_pingpong,
	// which takes a while on a loaded machine); a probe connection would be
	// taken for the client, so watch the socket table instead.
	waitTCPListen(t, srv, port)
	cli := startPingpong(t, s, lib, p, append(args, "127.0.0.1")...)
	return srv, cli
}

// Two unmodified ibv_rc_pingpong processes on one daemon: polling,
// sleeping on completion channels (-e), and posting through the extended
// send API (-N: ibv_create_qp_ex, ibv_wr_*).
func TestIbvRCPingpong(t *testing.T) {
	t.Run("poll", func(t *testing.T) { testPingpong(t) })
	t.Run("events", func(t *testing.T) { testPingpong(t, "-e") })
	t.Run("new-send-api", func(t *testing.T) { testPingpong(t, "-N") })
}

func testPingpong(t *testing.T, extra ...string) {
	p, lib := tool(t, "ibv_rc_pingpong")
	s := startUDP(t)
	srv, cli := runPair(t, s, lib, p, 1000, extra...)
	cli.wait(t, "ibv_rc_pingpong client")
	srv.wait(t, "ibv_rc_pingpong server")
	for _, pp := range []*pingpong{srv, cli} {
		o := pp.output()
		if !strings.Contains(o, "8192000 bytes in") || !strings.Contains(o, "1000 iters in") {
			t.Errorf("no throughput lines:\n%s", o)
		}
		t.Logf("%s", o)
	}
	for s.Stats().Clients != 0 {
		time.Sleep(time.Millisecond)
	}
	if n := s.QPs(); n != 0 {
		t.Errorf("%d QPs left after both programs exited", n)
	}
	t.Logf("daemon: %+v", s.Stats())
}

// kill -9 of one program mid-run: its QPs are gone, the other pair
// finishes.
func TestKillClient(t *testing.T) {
	p, lib := tool(t, "ibv_rc_pingpong")
	s := startUDP(t)
	srv1, cli1 := runPair(t, s, lib, p, 100000000)
	// The programs' stdout is a pipe, so their lines come at exit: watch
	// the daemon instead until both QPs exist and traffic flows.
	for s.QPs() < 2 {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond) // mid-transfer
	st, err := QueryStatus(s.Socket())
	if err != nil {
		t.Fatal(err)
	}
	pids := map[int]string{}
	for _, c := range st.Clients {
		for _, q := range c.QPs {
			pids[c.PID] = q.State
		}
	}
	if pids[cli1.cmd.Process.Pid] != "RTS" || pids[srv1.cmd.Process.Pid] != "RTS" {
		t.Errorf("status does not show both programs with an RTS QP: %+v", st)
	}
	srv2, cli2 := runPair(t, s, lib, p, 2000)
	cli1.cmd.Process.Signal(syscall.SIGKILL)
	<-cli1.done
	cli2.wait(t, "the other client")
	srv2.wait(t, "the other server")
	if !strings.Contains(cli2.output(), "2000 iters in") {
		t.Errorf("the other pair did not complete:\n%s", cli2.output())
	}
	// The killed program's connection is gone (the daemon notices the
	// closed socket on its own schedule: wait for it).
	for gone := false; !gone; time.Sleep(time.Millisecond) {
		st, err = QueryStatus(s.Socket())
		if err != nil {
			t.Fatal(err)
		}
		gone = true
		for _, c := range st.Clients {
			if c.PID == cli1.cmd.Process.Pid {
				gone = false
			}
		}
	}
	srv1.cmd.Process.Signal(syscall.SIGKILL)
	<-srv1.done
	for s.Stats().Clients != 0 {
		time.Sleep(time.Millisecond)
	}
	if n := s.QPs(); n != 0 {
		t.Errorf("%d QPs left after the killed programs", n)
	}
}

// startPorts runs a daemon on 127.0.0.1:port whose QPs send to remote:
// two of them are two hosts on one loopback.
func startPorts(t *testing.T, port, remote int) *Server {
	t.Helper()
	l, err := udp.Open(udp.Config{Addr: netip.MustParseAddr("127.0.0.1"), Port: port})
	if err != nil {
		t.Fatal(err)
	}
	d, err := verbs.Open(l, nil)
	if err != nil {
		t.Fatal(err)
	}
	return start(t, d, uint16(remote))
}

// perftest's tools, unmodified, between two daemons: RDMA WRITE, READ,
// SEND and atomics to and from the peer program's own addresses (the
// daemon maps its memory at them).
func TestPerftest(t *testing.T) {
	for _, c := range []struct{ tool, size, n string }{
		{"ib_write_bw", "65536", "2000"},
		{"ib_read_bw", "65536", "1000"},
		{"ib_send_bw", "65536", "1000"},
		{"ib_atomic_bw", "8", "1000"},
		{"ib_write_lat", "2", "1000"},
	} {
		t.Run(c.tool, func(t *testing.T) { testPerftest(t, c.tool, c.size, c.n) })
	}
}

func testPerftest(t *testing.T, tool_, size, n string) {
	_, lib := tool(t, "ibv_devinfo")
	p, err := exec.LookPath(tool_)
	if err != nil {
		t.Skipf("%s is not installed (Debian: apt-get install perftest)", tool_)
	}
	x, y := freeUDPPort(t), freeUDPPort(t)
	s1, s2 := startPorts(t, x, y), startPorts(t, y, x)
	port := fmt.Sprint(freeTCPPort(t))
	args := []string{"-x", "0", "-s", size, "-n", n, "-p", port}
	srv := startPingpong(t, s1, lib, p, args...)
	waitTCPListen(t, srv, port)
	cli := startPingpong(t, s2, lib, p, append(args, "127.0.0.1")...)
	defer func() {
		if t.Failed() { // the client's error is often the server's doing
			t.Logf("%s server:\n%s", tool_, srv.output())
		}
	}()
	cli.wait(t, tool_+" client")
	srv.wait(t, tool_+" server")
	if !strings.Contains(cli.output(), " "+size+" ") || !strings.Contains(cli.output(), "#bytes") {
		t.Errorf("no result line:\n%s", cli.output())
	}
	t.Logf("%s", lastLines(cli.output(), 3))
}

// With --group, unprivileged members of the group use the daemon; others
// cannot connect.
func TestUnprivilegedGroupMembers(t *testing.T) {
	p, lib := tool(t, "ibv_rc_pingpong")
	if os.Geteuid() != 0 {
		t.Skip("needs root to run programs as other users")
	}
	g, err := user.LookupGroup("nogroup")
	if err != nil {
		t.Skip("no group nogroup")
	}
	gid, _ := strconv.Atoi(g.Gid)
	// The library directory must be readable by them.
	for d := lib; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		os.Chmod(d, 0o755)
	}
	l, err := udp.Open(udp.Config{Addr: netip.MustParseAddr("127.0.0.1"), Port: freeUDPPort(t)})
	if err != nil {
		t.Fatal(err)
	}
	port := l.LocalAddrPort().Port()
	d, err := verbs.Open(l, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := serveOn(t, []*verbs.Device{d}, Config{Socket: sharedSocket(t), Group: "nogroup", RemotePort: port})
	if fi, err := os.Stat(s.Socket()); err != nil || fi.Mode().Perm() != 0o770 {
		t.Fatalf("socket mode: %v %v", fi.Mode(), err)
	}
	member := &syscall.Credential{Uid: 65534, Gid: uint32(gid)}
	tcp := fmt.Sprint(freeTCPPort(t))
	srv := startPingpongAs(t, s, lib, member, p, "-g", "0", "-p", tcp, "-n", "200")
	waitTCPListen(t, srv, tcp)
	cli := startPingpongAs(t, s, lib, member, p, "-g", "0", "-p", tcp, "-n", "200", "127.0.0.1")
	cli.wait(t, "ibv_rc_pingpong client as nobody")
	srv.wait(t, "ibv_rc_pingpong server as nobody")
	if !strings.Contains(cli.output(), "200 iters in") {
		t.Errorf("no result:\n%s", cli.output())
	}
	// Someone outside the group finds no device.
	devinfo, _ := exec.LookPath("ibv_devinfo")
	cmd := exec.Command(devinfo)
	cmd.Env = env(s, lib)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65533, Gid: 65533}}
	out, _ := cmd.CombinedOutput()
	if strings.Contains(string(out), "softroce0") {
		t.Errorf("a user outside the group reached the daemon:\n%s", out)
	}
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

// A C program built against the system's verbs.h and linked with
// softroce's library: a WQE naming a foreign key raises QP_FATAL through
// ibv_get_async_event, the QP's other WQEs flush, unsupported verbs fail
// cleanly, registration keeps the memory around the buffer.
func TestCProgramAsyncEvent(t *testing.T) { runC(t, "async.c") }

// The memory rules of docs/abi.md: shared file mappings and read-only
// memory are refused, buffers sharing a page register and keep the page's
// contents, malloc'd and stack memory register.
func TestCProgramMemory(t *testing.T) { runC(t, "memory.c", filepath.Join(t.TempDir(), "file")) }

// ibv_create_cq_ex (start/next/end_poll) and ibv_query_device_ex.
func TestCProgramCQEx(t *testing.T) { runC(t, "cqex.c") }

// runC builds testdata/src against the system's verbs.h, links it with
// softroce's library and runs it on a daemon: it must print "ok".
func runC(t *testing.T, src string, args ...string) {
	_, lib := tool(t, "ibv_devinfo")
	bin := filepath.Join(t.TempDir(), "prog")
	if out, err := exec.Command("gcc", "-O1", "-o", bin, filepath.Join("testdata", src), "-L"+lib, "-l:libibverbs.so.1").CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	s := startUDP(t)
	cmd := exec.Command(bin, args...)
	cmd.Env = env(s, lib)
	out, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("%v\n%s", err, out)
	}
}

// One daemon, two devices (IPv4 and IPv6 loopback): both are listed, and
// ibv_rc_pingpong runs on the second over an IPv6 GID.
func TestTwoDevicesIPv6(t *testing.T) {
	p, lib := tool(t, "ibv_rc_pingpong")
	port := freeUDPPort(t)
	var devs []*verbs.Device
	for _, a := range []string{"127.0.0.1", "::1"} {
		l, err := udp.Open(udp.Config{Addr: netip.MustParseAddr(a), Port: port})
		if err != nil {
			t.Skipf("open %s: %v", a, err)
		}
		d, err := verbs.Open(l, &verbs.Options{Name: fmt.Sprintf("softroce%d", len(devs))})
		if err != nil {
			t.Fatal(err)
		}
		devs = append(devs, d)
	}
	s := serveOn(t, devs, Config{Socket: filepath.Join(t.TempDir(), "s.sock"), RemotePort: uint16(port)})
	list, _ := exec.LookPath("ibv_devices")
	cmd := exec.Command(list)
	cmd.Env = env(s, lib)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "softroce0") || !strings.Contains(string(out), "softroce1") {
		t.Fatalf("ibv_devices: %v\n%s", err, out)
	}
	tcp := fmt.Sprint(freeTCPPort(t))
	args := []string{"-d", "softroce1", "-g", "0", "-p", tcp, "-n", "500"}
	srv := startPingpong(t, s, lib, p, args...)
	waitTCPListen(t, srv, tcp)
	cli := startPingpong(t, s, lib, p, append(args, "localhost")...)
	cli.wait(t, "client")
	srv.wait(t, "server")
	if o := cli.output(); !strings.Contains(o, "GID ::1") || !strings.Contains(o, "500 iters in") {
		t.Errorf("no IPv6 exchange:\n%s", o)
	}
}

// Memory windows through the library (testdata/mw.c): type 1 bound with
// ibv_bind_mw, type 2 with IBV_WR_BIND_MW and ibv_wr_bind_mw; accesses
// inside a window succeed, outside it or after LOCAL_INV, SEND_WITH_INV
// or dealloc they fail with a remote access error.
func TestCProgramMW(t *testing.T) { runC(t, "mw.c") }

// One type 1 window bound with ibv_bind_mw alternately on two QPs, four
// binds in flight at a time (testdata/mw1two.c): the daemon may drain the
// two send rings in either order, and each bind gives the window the key
// the library computed, so none is refused and the last bind's key works.
func TestCProgramMWTwoQPs(t *testing.T) { runC(t, "mw1two.c") }

// ibv_reg_mr_iova2 with an IOVA other than the address (testdata/iova.c):
// a WRITE and a READ addressed by the IOVA land at the right bytes.
func TestCProgramIOVA(t *testing.T) { runC(t, "iova.c") }

// waitTCPListen waits until a socket listens on TCP port (decimal) in this
// network namespace, as /proc/net/tcp and tcp6 show it: for up to a minute,
// or until the server pp exits.
func waitTCPListen(t *testing.T, pp *pingpong, port string) {
	t.Helper()
	n, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	for start := time.Now(); time.Since(start) < time.Minute; time.Sleep(5 * time.Millisecond) {
		if tcpListening(n) {
			return
		}
		select {
		case err := <-pp.done:
			pp.done <- err // for wait
			time.Sleep(50 * time.Millisecond)
			t.Fatalf("the server exited before it listened on TCP port %s: %v\n%s", port, err, pp.output())
		default:
		}
	}
	t.Fatalf("nothing listens on TCP port %s after a minute; the server printed:\n%s", port, pp.output())
}

// tcpListening says whether a socket listens on TCP port in this thread's
// network namespace.
func tcpListening(port int) bool {
	want := fmt.Sprintf(":%04X ", port)
	// thread-self: /proc/net is the main thread's namespace, which a
	// test that entered another namespace on that thread may have left.
	for _, f := range []string{"/proc/thread-self/net/tcp", "/proc/thread-self/net/tcp6"} {
		b, _ := os.ReadFile(f)
		for _, line := range strings.Split(string(b), "\n") {
			// Fields: sl local_address rem_address st ...; st 0A is LISTEN.
			if fs := strings.Fields(line); len(fs) > 3 && strings.HasSuffix(fs[1]+" ", want) && fs[3] == "0A" {
				return true
			}
		}
	}
	return false
}

// ibv_resize_cq and ibv_modify_srq with IBV_SRQ_MAX_WR through the
// library: queued completions and posted receives keep their order across
// a resize, resizes run while a peer sends, and rxe's refusals hold.
func TestCProgramResize(t *testing.T) { runC(t, "resize.c") }

// Memory unmapped while registered, new memory at the same address
// registered before the old MR's dereg (a registration cache's freed and
// reused buffer): RDMA reaches the new memory, the old dereg leaves it be.
func TestCProgramRemapWhileRegistered(t *testing.T) { runC(t, "remap.c") }
