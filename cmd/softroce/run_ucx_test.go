package main

import (
	"fmt"
	"io"
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
	"github.com/softroce/softroce/internal/netnstest"
)

// nobodyRig is what a test needs to run softroce as nobody: a copy of the
// test binary (acting as softroce) and a built library, both where nobody
// can read them, and a socket directory of nobody's own.
type nobodyRig struct {
	dir, bin, abiDir, sock string
}

func newNobodyRig(t *testing.T) *nobodyRig {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to run programs as nobody in a network namespace")
	}
	if m := abi.Missing(); m != "" {
		t.Skip("cannot build softroce's libibverbs.so.1: " + m)
	}
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skip("setpriv (util-linux) is not installed")
	}
	dir, err := os.MkdirTemp("", "softroce-nobody-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	r := &nobodyRig{dir: dir, bin: filepath.Join(dir, "softroce"), abiDir: filepath.Join(dir, "abi"), sock: filepath.Join(dir, "sock", "softroce.sock")}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	in, err := os.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(r.bin, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	out.Close()
	if _, err := abi.Build(r.abiDir); err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755)
	r.sockDir(t, "sock")
	filepath.Walk(r.abiDir, func(p string, _ os.FileInfo, _ error) error { return os.Lchown(p, 65534, 65534) })
	return r
}

// sockDir makes dir/name, nobody's own (mode 0700), and returns the path
// of a socket in it.
func (r *nobodyRig) sockDir(t *testing.T, name string) string {
	t.Helper()
	d := filepath.Join(r.dir, name)
	if err := os.Mkdir(d, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(d, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(d, "softroce.sock")
}

// cmd is argv run as nobody:nogroup inside ns (ip netns exec), with the
// test binary acting as softroce.
func (r *nobodyRig) cmd(ns *netnstest.NS, argv ...string) *exec.Cmd {
	args := []string{"netns", "exec", ns.Name, "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"}
	cmd := exec.Command("ip", append(args, argv...)...)
	cmd.Env = append(os.Environ(), "SOFTROCE_TEST_AS_MAIN=1", "SOFTROCE_ABI_DIR="+r.abiDir, "HOME="+r.dir)
	// Its own process group, so that a kill reaches the program under
	// ip, setpriv and softroce run; and Wait returns even if one of them
	// keeps the output open.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// kill kills cmd's process group.
func kill(cmd *exec.Cmd) { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }

// daemon starts `softroce serve` as nobody in ns on addr and waits for
// its socket.
func (r *nobodyRig) daemon(t *testing.T, ns *netnstest.NS, addr string) {
	t.Helper()
	r.daemonOn(t, ns, addr, r.sock)
}

// daemonOn is daemon on socket sock.
func (r *nobodyRig) daemonOn(t *testing.T, ns *netnstest.NS, addr, sock string) {
	t.Helper()
	d := r.cmd(ns, r.bin, "serve", "-q", "--socket", sock, "--addr", addr)
	d.Stderr = os.Stderr
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Kill(-d.Process.Pid, syscall.SIGTERM)
		d.Wait()
	})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(sock); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the daemon made no socket in 10 s")
		}
	}
}

// ucxDomain is the part of `ucx_info -d` output about memory domain md.
func ucxDomain(out, md string) string {
	i := strings.Index(out, "# Memory domain: "+md+"\n")
	if i < 0 {
		return ""
	}
	s := out[i+1:]
	if j := strings.Index(s, "# Memory domain:"); j >= 0 {
		s = s[:j]
	}
	return s
}

// UCX 1.13 lists an IB device only when /dev/infiniband/<dev_name> is a
// character device the program may read and write: `softroce run` gives
// the program one in namespaces of its own, unprivileged. Here as nobody,
// in a network namespace with a veth address and nobody's daemon.
func TestRunUCXInfoAsNobody(t *testing.T) {
	if _, err := exec.LookPath("ucx_info"); err != nil {
		t.Skip("ucx_info is not installed (Debian: apt-get install ucx-utils)")
	}
	netnstest.Require(t)
	r := newNobodyRig(t)
	v := netnstest.Pair(t, netnstest.VethConfig{})
	r.daemon(t, v.A.NS, v.A.Addr().String())
	cmd := r.cmd(v.A.NS, r.bin, "run", "--socket", r.sock, "--", "ucx_info", "-d")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("softroce run -- ucx_info -d: %v\n%s", err, out)
	}
	md := ucxDomain(string(out), "softroce0")
	if md == "" {
		t.Fatalf("ucx_info -d lists no memory domain softroce0:\n%s", out)
	}
	for _, tl := range []string{"rc_verbs", "ud_verbs"} {
		if !strings.Contains(md, "#      Transport: "+tl+"\n#         Device: softroce0:1\n") {
			t.Errorf("softroce0 lacks transport %s on device softroce0:1:\n%s", tl, md)
		}
	}
	if strings.Contains(string(out), "softroce run:") {
		t.Errorf("softroce run complained:\n%s", out)
	}
}

// Where no user namespace can be made, `softroce run` says so once and
// runs the program without one. The test makes that so inside a user
// namespace of its own whose limit of nested ones is 0, mapping root and
// nobody to themselves.
func TestRunWithoutUserNamespace(t *testing.T) {
	if _, err := exec.LookPath("ucx_info"); err != nil {
		t.Skip("ucx_info is not installed (Debian: apt-get install ucx-utils)")
	}
	netnstest.Require(t)
	r := newNobodyRig(t)
	v := netnstest.Pair(t, netnstest.VethConfig{})
	r.daemon(t, v.A.NS, v.A.Addr().String())
	script := `echo 0 > /proc/sys/user/max_user_namespaces && exec setpriv --reuid=65534 --regid=65534 --clear-groups -- "$@"`
	cmd := exec.Command("sh", "-c", script, "sh", r.bin, "run", "--socket", r.sock, "--", "ucx_info", "-d")
	cmd.Env = append(os.Environ(), "SOFTROCE_TEST_AS_MAIN=1", "SOFTROCE_ABI_DIR="+r.abiDir, "HOME="+r.dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:                 syscall.CLONE_NEWUSER,
		UidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}, {ContainerID: 65534, HostID: 65534, Size: 1}},
		GidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}, {ContainerID: 65534, HostID: 65534, Size: 1}},
		GidMappingsEnableSetgroups: true,
	}
	var buf strings.Builder
	cmd.Stdout, cmd.Stderr = &buf, &buf
	// Started from a thread in the network namespace, which the child
	// inherits (a process in the new user namespace may not enter it).
	v.A.NS.Run(t, cmd.Start)
	err := cmd.Wait()
	out := buf.String()
	if err != nil {
		t.Fatalf("softroce run -- ucx_info -d: %v\n%s", err, out)
	}
	if n := strings.Count(out, "softroce run: no namespace for /dev/infiniband"); n != 1 {
		t.Errorf("softroce run said %d times that it made no namespace, want once:\n%s", n, out)
	}
	t.Logf("%s", lastLine(out, "softroce run:"))
	if ucxDomain(out, "self") == "" {
		t.Errorf("ucx_info did not run:\n%s", out)
	}
	if ucxDomain(out, "softroce0") != "" {
		t.Errorf("ucx_info lists softroce0 without a device node:\n%s", out)
	}
}

// lastLine is the last line of out that starts with prefix.
func lastLine(out, prefix string) string {
	l := ""
	for _, s := range strings.Split(out, "\n") {
		if strings.HasPrefix(s, prefix) {
			l = s
		}
	}
	return l
}

// syncBuf is an output buffer two goroutines share.
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

// UCX host to host, unprivileged: two network namespaces joined by a veth,
// a daemon of nobody's in each, and ucx_perftest through `softroce run` as
// nobody on both sides (its own TCP rendezvous over the veth), with UCX's
// verbs transports: rc_verbs and ud_verbs together, and ud_verbs alone.
func TestRunUCXPerftestTwoHosts(t *testing.T) {
	if _, err := exec.LookPath("ucx_perftest"); err != nil {
		t.Skip("ucx_perftest is not installed (Debian: apt-get install ucx-utils)")
	}
	netnstest.Require(t)
	r := newNobodyRig(t)
	v := netnstest.Pair(t, netnstest.VethConfig{})
	sa, sb := r.sockDir(t, "a"), r.sockDir(t, "b")
	r.daemonOn(t, v.A.NS, v.A.Addr().String(), sa)
	r.daemonOn(t, v.B.NS, v.B.Addr().String(), sb)
	port := 13337
	for _, tls := range []string{"rc_verbs,ud_verbs,self", "ud_verbs"} {
		for _, c := range []struct {
			test  string
			iters int
			size  int
		}{
			{"tag_lat", 200, 8},
			{"ucp_put_bw", 200, 65536},
		} {
			t.Run(tls+"/"+c.test, func(t *testing.T) {
				port++
				p := strconv.Itoa(port)
				srv := r.cmd(v.A.NS, r.bin, "run", "--socket", sa, "--", "ucx_perftest", "-p", p)
				srv.Env = append(srv.Env, "UCX_TLS="+tls)
				var so syncBuf
				srv.Stdout, srv.Stderr = &so, &so
				if err := srv.Start(); err != nil {
					t.Fatal(err)
				}
				srvDone := make(chan error, 1)
				go func() { srvDone <- srv.Wait() }()
				defer func() {
					kill(srv)
					<-srvDone
				}()
				for deadline := time.Now().Add(20 * time.Second); !tcpListening(t, v.A.NS, port); time.Sleep(20 * time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatalf("the ucx_perftest server did not listen:\n%s", so.String())
					}
				}
				cli := r.cmd(v.B.NS, r.bin, "run", "--socket", sb, "--", "ucx_perftest", v.A.Addr().String(), "-p", p,
					"-t", c.test, "-n", strconv.Itoa(c.iters), "-s", strconv.Itoa(c.size))
				cli.Env = append(cli.Env, "UCX_TLS="+tls)
				var co syncBuf
				cli.Stdout, cli.Stderr = &co, &co
				if err := cli.Start(); err != nil {
					t.Fatal(err)
				}
				cliDone := make(chan error, 1)
				go func() { cliDone <- cli.Wait() }()
				select {
				case err := <-cliDone:
					if err != nil {
						t.Fatalf("ucx_perftest client: %v\n%s\nserver:\n%s", err, co.String(), so.String())
					}
				case <-time.After(2 * time.Minute):
					kill(cli)
					<-cliDone
					t.Fatalf("ucx_perftest client did not finish in 2 minutes:\n%s\nserver:\n%s", co.String(), so.String())
				}
				select {
				case err := <-srvDone:
					srvDone <- err
					if err != nil {
						t.Errorf("ucx_perftest server: %v\n%s", err, so.String())
					}
				case <-time.After(30 * time.Second):
					t.Errorf("ucx_perftest server did not finish:\n%s", so.String())
				}
				out := co.String()
				final := lastLine(out, "Final:")
				if f := strings.Fields(final); len(f) < 2 || f[1] != strconv.Itoa(c.iters) || !strings.Contains(out, "| # iterations |") {
					t.Fatalf("ucx_perftest printed no result table:\n%s", out)
				}
				if strings.Contains(out, "softroce run:") || strings.Contains(so.String(), "softroce run:") {
					t.Errorf("softroce run complained:\n%s\n%s", out, so.String())
				}
				t.Logf("%s", final)
			})
		}
	}
}

// tcpListening says whether a TCP socket listens on port in ns (its stdout
// a pipe, ucx_perftest's "Waiting for connection" comes only at exit).
func tcpListening(t *testing.T, ns *netnstest.NS, port int) bool {
	var b []byte
	ns.Run(t, func() (err error) {
		b, err = os.ReadFile("/proc/thread-self/net/tcp")
		return err
	})
	want := fmt.Sprintf(":%04X ", port)
	for _, l := range strings.Split(string(b), "\n") {
		// sl local_address rem_address st: LISTEN is 0A.
		if f := strings.Fields(l); len(f) > 3 && strings.HasSuffix(f[1]+" ", want) && f[3] == "0A" {
			return true
		}
	}
	return false
}
