package main

import (
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/softroce/softroce/abi"
	"golang.org/x/sys/unix"
)

// TestMain lets a test run the test binary as the softroce command, as
// softroce run does when it starts a private daemon (os.Executable).
func TestMain(m *testing.M) {
	if os.Getenv("SOFTROCE_TEST_AS_MAIN") == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

// privateRun is `softroce run PROG ARGS...` (this test binary as softroce)
// with no daemon on its socket, so that it starts a private one on a free
// UDP port of 127.0.0.1.
func privateRun(t *testing.T, prog ...string) *exec.Cmd {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	port := c.LocalAddr().(*net.UDPAddr).Port
	c.Close()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"run", "--socket", filepath.Join(t.TempDir(), "none.sock"), "--addr", "127.0.0.1", "--udp-port", strconv.Itoa(port), "--"}
	return exec.Command(self, append(args, prog...)...)
}

// softroce run -- ibv_devinfo with no daemon running: a private daemon is
// started for it, the program prints the device, the daemon is stopped.
func TestRunIbvDevinfoPrivateDaemon(t *testing.T) {
	if m := abi.Missing(); m != "" {
		t.Skip("cannot build softroce's libibverbs.so.1: " + m)
	}
	if _, err := exec.LookPath("ibv_devinfo"); err != nil {
		t.Skip("ibv_devinfo is not installed (Debian: apt-get install ibverbs-utils)")
	}
	cmd := privateRun(t, "ibv_devinfo")
	cmd.Env = append(os.Environ(), "SOFTROCE_TEST_AS_MAIN=1", "SOFTROCE_ABI_DIR="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("softroce run: %v\n%s", err, out)
	}
	for _, want := range []string{"hca_id:\tsoftroce0", "state:\t\t\tPORT_ACTIVE (4)", "link_layer:\t\tEthernet"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	t.Logf("%s", out)
}

// With the library cache somewhere this user cannot write (a system
// user's HOME), softroce run names the directory and the variable that
// moves it. Under a regular file, mkdir fails for root too.
func TestRunUnwritableLibraryCache(t *testing.T) {
	if m := abi.Missing(); m != "" {
		t.Skip("cannot build softroce's libibverbs.so.1: " + m)
	}
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		env  []string
		want string
	}{
		{[]string{"SOFTROCE_ABI_DIR=", "XDG_CACHE_HOME=" + file}, "set SOFTROCE_ABI_DIR to a directory this user can write"},
		{[]string{"SOFTROCE_ABI_DIR=" + filepath.Join(file, "abi")}, "SOFTROCE_ABI_DIR names it"},
	} {
		for _, kv := range c.env {
			k, v, _ := strings.Cut(kv, "=")
			t.Setenv(k, v)
		}
		var code int
		_, errOut := runOut(t, func() { code = run([]string{"run", "--", "true"}) })
		if code != 1 || !strings.Contains(errOut, "cannot write the library cache "+file) || !strings.Contains(errOut, c.want) {
			t.Errorf("softroce run with %v: exit %d, want 1 naming the cache under %s and %q:\n%s", c.env, code, file, c.want, errOut)
		}
	}
}

// runSignalled starts `softroce run` (a private daemon, so that it stays
// and forwards signals) with a shell script that counts the signal it gets
// and prints "ready" first and "got N" at the end; signal delivers one
// after "ready". start sets the process up (stdio, session, group).
func runSignalled(t *testing.T, trap string, start func(*exec.Cmd) (io.Reader, func())) string {
	t.Helper()
	if m := abi.Missing(); m != "" {
		t.Skip("cannot build softroce's libibverbs.so.1: " + m)
	}
	script := `n=0; trap 'n=$((n+1))' ` + trap + `; echo ready; i=0; while [ $i -lt 30 ]; do sleep 0.1; i=$((i+1)); done; echo "got $n"`
	cmd := privateRun(t, "sh", "-c", script)
	cmd.Env = append(os.Environ(), "SOFTROCE_TEST_AS_MAIN=1", "SOFTROCE_ABI_DIR="+abiTestDir(t))
	out, signal := start(cmd)
	var got strings.Builder
	buf := make([]byte, 4096)
	signalled := false
	deadline := time.Now().Add(60 * time.Second)
	for !strings.Contains(got.String(), "got ") && time.Now().Before(deadline) {
		n, err := out.Read(buf)
		got.Write(buf[:n])
		if !signalled && strings.Contains(got.String(), "ready") {
			signal()
			signalled = true
		}
		if err != nil {
			break
		}
	}
	cmd.Wait()
	return got.String()
}

var abiOnce struct {
	sync.Once
	dir string
}

// abiTestDir is one library cache for the tests of this binary.
func abiTestDir(t *testing.T) string {
	abiOnce.Do(func() {
		d, err := os.MkdirTemp("", "softroce-run-test-abi-")
		if err == nil {
			abiOnce.dir = d
		}
	})
	if abiOnce.dir == "" {
		t.Fatal("no library cache directory")
	}
	return abiOnce.dir
}

// A signal sent to softroce run's process group reaches the program once:
// it used to get it from the group and again forwarded, and Ceph, which
// shuts down on the first SIGTERM, died of the second.
func TestRunGroupSignalOnce(t *testing.T) {
	out := runSignalled(t, "TERM", func(cmd *exec.Cmd) (io.Reader, func()) {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		r, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return r, func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) }
	})
	if !strings.Contains(out, "got 1\n") {
		t.Errorf("the program counted other than one SIGTERM sent to softroce run's group:\n%s", out)
	}
}

// Ctrl-C on softroce run's terminal reaches the program once: the program
// runs in the foreground group of its own.
func TestRunTerminalInterruptOnce(t *testing.T) {
	ptm, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminal: %v", err)
	}
	defer ptm.Close()
	if err := unix.IoctlSetPointerInt(int(ptm.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(ptm.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	pts, err := os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer pts.Close()
	out := runSignalled(t, "INT", func(cmd *exec.Cmd) (io.Reader, func()) {
		cmd.Stdin, cmd.Stdout, cmd.Stderr = pts, pts, pts
		// A session of its own with the terminal as its controlling one:
		// softroce run is the foreground group, as started from a shell.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return ptm, func() { ptm.Write([]byte{3}) } // ^C: VINTR
	})
	if !strings.Contains(out, "got 1") {
		t.Errorf("the program counted other than one SIGINT from ^C on the terminal:\n%s", out)
	}
}
