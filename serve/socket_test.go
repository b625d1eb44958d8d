package serve

import (
	"bufio"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/netnstest"
	"github.com/softroce/softroce/nic/udp"
	"github.com/softroce/softroce/verbs"
)

// Who may answer on the daemon's socket: the daemon's socket path, the
// directory it lives in and the clients' checks of the daemon, with the
// attacker and the victim as separate processes under their own uids.

const (
	sockVictimUID = 1001
	netnsUID      = 1002
	squatterUID   = 65534
)

func init() {
	// socket-daemon: a daemon on SOCKET_TEST_ADDR:SOCKET_TEST_PORT,
	// listening on SOCKET_TEST_SOCKET (its default when empty). With
	// SOCKET_TEST_SQUAT set it behaves as a squatter would: it makes the
	// socket's directory itself and opens it and the socket to everyone.
	// It prints "listening PATH" (or "listen: ERROR") and serves until
	// SIGTERM.
	childRoles["socket-daemon"] = func() int {
		port, _ := strconv.Atoi(os.Getenv("SOCKET_TEST_PORT"))
		l, err := udp.Open(udp.Config{Addr: netip.MustParseAddr(os.Getenv("SOCKET_TEST_ADDR")), Port: port})
		if err != nil {
			fmt.Printf("listen: %v\n", err)
			return 1
		}
		d, err := verbs.Open(l, nil)
		if err != nil {
			fmt.Printf("listen: %v\n", err)
			return 1
		}
		sock := os.Getenv("SOCKET_TEST_SOCKET")
		squat := os.Getenv("SOCKET_TEST_SQUAT") != ""
		if squat {
			if err := os.MkdirAll(filepath.Dir(sock), 0o700); err != nil {
				fmt.Printf("listen: %v\n", err)
				return 1
			}
		}
		s, err := New([]*verbs.Device{d}, Config{Socket: sock})
		if err != nil {
			fmt.Printf("listen: %v\n", err)
			return 1
		}
		if err := s.Listen(); err != nil {
			fmt.Printf("listen: %v\n", err)
			s.Close()
			return 1
		}
		if squat {
			os.Chmod(filepath.Dir(s.Socket()), 0o777)
			os.Chmod(s.Socket(), 0o777)
		}
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM)
		go func() { <-sig; s.Close() }()
		fmt.Printf("listening %s\n", s.Socket())
		if err := s.Serve(); err != nil {
			return 1
		}
		return 0
	}
	// socket-status: what `softroce status` does with the default socket.
	childRoles["socket-status"] = func() int {
		st, err := QueryStatus(DefaultSocket())
		if err != nil {
			fmt.Printf("status: %v\n", err)
			return 1
		}
		fmt.Printf("devices %d\n", len(st.Devices))
		return 0
	}
}

// socketEnv is the environment of a test's processes: TMPDIR set, none of
// the variables that would choose a socket.
func socketEnv(tmp string, extra ...string) []string {
	var env []string
	for _, e := range os.Environ() {
		if k, _, _ := strings.Cut(e, "="); k == "TMPDIR" || k == "XDG_RUNTIME_DIR" || strings.HasPrefix(k, "SOFTROCE_") {
			continue
		}
		env = append(env, e)
	}
	return append(append(env, "TMPDIR="+tmp), extra...)
}

// daemonChild starts the socket-daemon role as uid with env (through
// start, which may start it from a thread in a namespace) and returns the
// socket it listens on, or the error it gave.
func daemonChild(t *testing.T, uid uint32, start func(*exec.Cmd) error, env ...string) (sock, failed string, stop func()) {
	t.Helper()
	cmd := childCmd(t, "socket-daemon", &syscall.Credential{Uid: uid, Gid: uid})
	cmd.Env = append(env, childEnv+"=socket-daemon")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if start == nil {
		start = (*exec.Cmd).Start
	}
	if err := start(cmd); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	stop = func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	}
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		sc.Scan()
		line <- sc.Text()
		for sc.Scan() {
		}
		cmd.Wait()
		close(done)
	}()
	t.Cleanup(stop)
	select {
	case l := <-line:
		if p, ok := strings.CutPrefix(l, "listening "); ok {
			return p, "", stop
		}
		<-done
		return "", l, stop
	case <-time.After(30 * time.Second):
		t.Fatal("the daemon child said nothing in 30 s")
	}
	return
}

// runAs runs path with args as uid, started by start (nil: here), and
// returns its combined output.
func runAs(t *testing.T, uid uint32, start func(*exec.Cmd) error, env []string, path string, args ...string) string {
	t.Helper()
	cmd := exec.Command(path, args...)
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
	var b strings.Builder
	cmd.Stdout, cmd.Stderr = &b, &b
	if start == nil {
		start = (*exec.Cmd).Start
	}
	if err := start(cmd); err != nil {
		t.Fatal(err)
	}
	wait := make(chan struct{})
	go func() { cmd.Wait(); close(wait) }()
	select {
	case <-wait:
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		<-wait
		t.Fatalf("%s ran over 60 s:\n%s", path, b.String())
	}
	return b.String()
}

// sharedTmp is a directory like /tmp (everyone may create in it, sticky)
// whose parents other users may enter.
func sharedTmp(t *testing.T) string {
	t.Helper()
	d := t.TempDir()
	if err := os.Chmod(filepath.Dir(d), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(d, 0o1777); err != nil {
		t.Fatal(err)
	}
	return d
}

// openLib makes the library's directory readable by other users.
func openLib(lib string) {
	for d := lib; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		os.Chmod(d, 0o755)
	}
}

var noDaemonOn = regexp.MustCompile(`softroce: no daemon on (\S+):`)

// Another user made the victim's fallback socket directory first (mode
// 0777, as /tmp lets anyone) and runs a daemon there. The victim's
// unmodified program (no XDG_RUNTIME_DIR, as under sudo -u, su or cron)
// must not use it: the library refuses a daemon of another uid, unless the
// victim names that uid in SOFTROCE_DAEMON_UID. `softroce status` refuses
// it too, and the victim's own `softroce serve` refuses the directory.
func TestSocketSquatter(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run processes as other users")
	}
	devinfo, lib := tool(t, "ibv_devinfo")
	openLib(lib)
	tmp := sharedTmp(t)
	lenv := func(extra ...string) []string {
		return socketEnv(tmp, append([]string{"LD_LIBRARY_PATH=" + lib}, extra...)...)
	}

	// Where the victim's library looks when nothing answers.
	out := runAs(t, sockVictimUID, nil, lenv("SOFTROCE_DEBUG=1"), devinfo)
	m := noDaemonOn.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("ibv_devinfo with SOFTROCE_DEBUG=1 named no socket:\n%s", out)
	}
	victimSock := m[1]
	if want := filepath.Join(tmp, "softroce-"+strconv.Itoa(sockVictimUID)) + "/"; !strings.HasPrefix(filepath.Clean(victimSock), want) {
		t.Fatalf("uid %d's library looks on %s, not in its fallback directory %s", sockVictimUID, victimSock, want)
	}
	if got := runAs(t, sockVictimUID, nil, lenv(childEnv+"=socket-status"), exposeBinary(t, mustExe(t))); !strings.Contains(got, victimSock) {
		t.Errorf("the Go client (softroce status) does not look where the library does (%s):\n%s", victimSock, got)
	}

	sock, failed, stop := daemonChild(t, squatterUID, nil, socketEnv(tmp, "SOCKET_TEST_ADDR=127.0.0.1",
		"SOCKET_TEST_PORT="+strconv.Itoa(freeUDPPort(t)), "SOCKET_TEST_SOCKET="+victimSock, "SOCKET_TEST_SQUAT=1")...)
	if failed != "" {
		t.Fatalf("the squatter's daemon did not start: %s", failed)
	}
	t.Logf("uid %d squats %s", squatterUID, sock)

	refusal := fmt.Sprintf("refusing the daemon on %s: it runs as uid %d", victimSock, squatterUID)
	accept := fmt.Sprintf("SOFTROCE_DAEMON_UID=%d", squatterUID)
	t.Run("library", func(t *testing.T) {
		out := runAs(t, sockVictimUID, nil, lenv(), devinfo)
		if strings.Contains(out, "hca_id:") {
			t.Fatalf("uid %d's ibv_devinfo was served by uid %d's daemon:\n%s", sockVictimUID, squatterUID, out)
		}
		if !strings.Contains(out, refusal) || !strings.Contains(out, accept) {
			t.Errorf("ibv_devinfo does not say it refused the daemon (%q, %q):\n%s", refusal, accept, out)
		}
		t.Logf("uid %d's ibv_devinfo:\n%s", sockVictimUID, out)
		if n := strings.Count(out, "refusing"); n != 1 {
			t.Errorf("%d refusal lines, want one:\n%s", n, out)
		}
	})
	t.Run("named path still checked", func(t *testing.T) {
		out := runAs(t, sockVictimUID, nil, lenv("SOFTROCE_SOCKET="+victimSock), devinfo)
		if strings.Contains(out, "hca_id:") || !strings.Contains(out, refusal) {
			t.Fatalf("with SOFTROCE_SOCKET naming the squatted socket, ibv_devinfo was served or said nothing:\n%s", out)
		}
	})
	t.Run("accepted by name", func(t *testing.T) {
		for _, v := range []string{strconv.Itoa(squatterUID), "nobody"} {
			out := runAs(t, sockVictimUID, nil, lenv("SOFTROCE_SOCKET="+victimSock, "SOFTROCE_DAEMON_UID="+v), devinfo)
			if !strings.Contains(out, "hca_id:\tsoftroce0") || strings.Contains(out, "refusing") {
				t.Errorf("with SOFTROCE_DAEMON_UID=%s the daemon was not used:\n%s", v, out)
			}
		}
	})
	t.Run("status", func(t *testing.T) {
		out := runAs(t, sockVictimUID, nil, lenv(childEnv+"=socket-status"), exposeBinary(t, mustExe(t)))
		if strings.Contains(out, "devices ") || !strings.Contains(out, refusal) || !strings.Contains(out, accept) {
			t.Errorf("softroce status as uid %d did not refuse uid %d's daemon:\n%s", sockVictimUID, squatterUID, out)
		}
	})

	// The squatter leaves; its directory stays. The victim's daemon must
	// not move in.
	stop()
	t.Run("serve", func(t *testing.T) {
		_, failed, _ := daemonChild(t, sockVictimUID, nil, socketEnv(tmp, "SOCKET_TEST_ADDR=127.0.0.1", "SOCKET_TEST_PORT="+strconv.Itoa(freeUDPPort(t)))...)
		if !strings.Contains(failed, fmt.Sprintf("belongs to uid %d", squatterUID)) {
			t.Errorf("serve as uid %d in uid %d's directory: %q, want a refusal naming the owner", sockVictimUID, squatterUID, failed)
		}
		// Its own directory, but writable by others.
		own := sharedTmp(t)
		dir := filepath.Join(own, "softroce-"+strconv.Itoa(sockVictimUID))
		if err := os.Mkdir(dir, 0o777); err != nil {
			t.Fatal(err)
		}
		os.Chmod(dir, 0o777)
		os.Chown(dir, sockVictimUID, sockVictimUID)
		_, failed, _ = daemonChild(t, sockVictimUID, nil, socketEnv(own, "SOCKET_TEST_ADDR=127.0.0.1", "SOCKET_TEST_PORT="+strconv.Itoa(freeUDPPort(t)))...)
		if !strings.Contains(failed, "lets other users replace the socket") {
			t.Errorf("serve in its own directory of mode 0777: %q, want a refusal", failed)
		}
		// A directory it makes is its user's only.
		fresh := sharedTmp(t)
		sock, failed, stop := daemonChild(t, sockVictimUID, nil, socketEnv(fresh, "SOCKET_TEST_ADDR=127.0.0.1", "SOCKET_TEST_PORT="+strconv.Itoa(freeUDPPort(t)))...)
		if failed != "" {
			t.Fatalf("serve with a fresh TMPDIR: %s", failed)
		}
		defer stop()
		fi, err := os.Stat(filepath.Dir(sock))
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); fi.Mode().Perm() != 0o700 || st.Uid != sockVictimUID {
			t.Errorf("the fallback directory %s is mode %v of uid %d, want 0700 of uid %d", filepath.Dir(sock), fi.Mode().Perm(), st.Uid, sockVictimUID)
		}
	})
}

func mustExe(t *testing.T) string {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return exe
}

// Two network namespaces on one host. With a daemon in A only, a program
// in B is not served by it (its default socket is another one, and a
// socket named explicitly is refused as A's); with a daemon in each, each
// program is served by its own namespace's, with that namespace's address.
func TestSocketPerNetNS(t *testing.T) {
	netnstest.Require(t)
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("ip (iproute2) is not installed")
	}
	devinfo, lib := tool(t, "ibv_devinfo")
	openLib(lib)
	tmp := sharedTmp(t)
	type side struct {
		ns   *netnstest.NS
		addr string
	}
	a := side{netnstest.NewNSTagged(t, "socket"), "10.77.211.1"}
	b := side{netnstest.NewNSTagged(t, "socket"), "10.77.212.1"}
	for _, s := range []side{a, b} {
		if out, err := exec.Command("ip", "-n", s.ns.Name, "addr", "add", s.addr+"/32", "dev", "lo").CombinedOutput(); err != nil {
			t.Fatalf("ip addr add in %s: %v\n%s", s.ns.Name, err, out)
		}
	}
	in := func(s side) func(*exec.Cmd) error {
		return func(c *exec.Cmd) error { return s.ns.Do(c.Start) }
	}
	startDaemon := func(s side) string {
		sock, failed, _ := daemonChild(t, netnsUID, in(s), socketEnv(tmp, "SOCKET_TEST_ADDR="+s.addr, "SOCKET_TEST_PORT=4791")...)
		if failed != "" {
			t.Fatalf("the daemon in %s did not start: %s", s.ns.Name, failed)
		}
		return sock
	}
	devinfoIn := func(s side, extra ...string) string {
		return runAs(t, netnsUID, in(s), socketEnv(tmp, append([]string{"LD_LIBRARY_PATH=" + lib}, extra...)...), devinfo, "-v")
	}
	gid := func(addr string) string { return "::ffff:" + addr + ", RoCE v2" }

	sockA := startDaemon(a)
	t.Run("daemon in A only", func(t *testing.T) {
		out := devinfoIn(b)
		if strings.Contains(out, "hca_id:") {
			t.Fatalf("a program in B was served by A's daemon on %s:\n%s", sockA, out)
		}
		out = devinfoIn(b, "SOFTROCE_SOCKET="+sockA)
		if strings.Contains(out, "hca_id:") || !strings.Contains(out, "network namespace") {
			t.Fatalf("a program in B pointed at A's socket was served, or not told why not:\n%s", out)
		}
		t.Logf("in B, pointed at A's socket:\n%s", out)
		if out := devinfoIn(a); !strings.Contains(out, gid(a.addr)) {
			t.Errorf("a program in A is not served by A's daemon:\n%s", out)
		}
	})
	sockB := startDaemon(b)
	t.Run("a daemon in each", func(t *testing.T) {
		if sockA == sockB {
			t.Fatalf("both daemons listen on %s", sockA)
		}
		for _, c := range []struct {
			s     side
			other string
		}{{a, b.addr}, {b, a.addr}} {
			out := devinfoIn(c.s)
			if !strings.Contains(out, gid(c.s.addr)) || strings.Contains(out, c.other) {
				t.Errorf("a program in %s is not served by its own namespace's daemon (GID %s):\n%s", c.s.ns.Name, gid(c.s.addr), out)
			}
		}
	})
}

// The Go dialer (softroce status, softroce run) refuses a daemon of
// another network namespace too, and accepts one of its own.
func TestSocketDialNetNS(t *testing.T) {
	netnstest.Require(t)
	s := startUDP(t)
	c, err := Dial(s.Socket())
	if err != nil {
		t.Fatalf("Dial from the daemon's namespace: %v", err)
	}
	c.Close()
	other := netnstest.NewNSTagged(t, "socket")
	var refused *RefusedError
	other.Run(t, func() error {
		c, err := Dial(s.Socket())
		if err == nil {
			c.Close()
			return fmt.Errorf("Dial from %s accepted the daemon of another namespace", other.Name)
		}
		if !errors.As(err, &refused) || refused.NetNS == (NetNS{}) {
			return fmt.Errorf("Dial from %s: %v, want a refusal naming the daemon's namespace", other.Name, err)
		}
		return nil
	})
	t.Logf("%v", refused)
}
