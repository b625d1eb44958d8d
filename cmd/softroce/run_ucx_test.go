package main

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
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
	for _, d := range []string{dir, filepath.Dir(r.sock)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.Chmod(dir, 0o755)
	os.Chown(filepath.Dir(r.sock), 65534, 65534)
	os.Chmod(filepath.Dir(r.sock), 0o700)
	filepath.Walk(r.abiDir, func(p string, _ os.FileInfo, _ error) error { return os.Lchown(p, 65534, 65534) })
	return r
}

// cmd is argv run as nobody:nogroup inside ns (ip netns exec), with the
// test binary acting as softroce.
func (r *nobodyRig) cmd(ns *netnstest.NS, argv ...string) *exec.Cmd {
	args := []string{"netns", "exec", ns.Name, "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"}
	cmd := exec.Command("ip", append(args, argv...)...)
	cmd.Env = append(os.Environ(), "SOFTROCE_TEST_AS_MAIN=1", "SOFTROCE_ABI_DIR="+r.abiDir, "HOME="+r.dir)
	return cmd
}

// daemon starts `softroce serve` as nobody in ns on addr and waits for
// its socket.
func (r *nobodyRig) daemon(t *testing.T, ns *netnstest.NS, addr string) {
	t.Helper()
	d := r.cmd(ns, r.bin, "serve", "-q", "--socket", r.sock, "--addr", addr)
	d.Stderr = os.Stderr
	if err := d.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.Process.Signal(syscall.SIGTERM)
		d.Wait()
	})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(r.sock); err == nil {
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
