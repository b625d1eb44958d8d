package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/internal/netnstest"
	"github.com/softroce/softroce/serve"
)

// An XDP mode softroce does not know stops serve before it opens
// anything, with the usage status.
func TestServeBadXDPMode(t *testing.T) {
	if rc := runServe([]string{"--backend", "afxdp", "--xdp-mode", "zerocopy", "--socket", t.TempDir() + "/s"}); rc != 2 {
		t.Fatalf("serve --xdp-mode zerocopy: status %d, want 2", rc)
	}
}

// A congestion control softroce does not know stops serve before it
// opens anything, with the usage status.
func TestServeBadCC(t *testing.T) {
	if rc := runServe([]string{"--cc", "reno", "--socket", t.TempDir() + "/s"}); rc != 2 {
		t.Fatalf("serve --cc reno: status %d, want 2", rc)
	}
}

// softroce serve --backend afxdp needs the capabilities AF_XDP needs,
// not root: as nobody with CAP_NET_ADMIN, CAP_NET_RAW, CAP_BPF and
// CAP_IPC_LOCK (as a service manager grants them) the daemon opens its
// device on a veth end, serves, and stops cleanly on SIGTERM.
func TestServeAFXDPWithCapabilities(t *testing.T) {
	netnstest.Require(t)
	v := netnstest.Pair(t, netnstest.VethConfig{})
	dir := t.TempDir()
	if err := os.Chmod(filepath.Dir(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	self, err := os.ReadFile("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "softroce")
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "s.sock")
	var cmd *exec.Cmd
	var out strings.Builder
	v.A.NS.Run(t, func() error {
		// Started from this thread, the daemon is in the namespace.
		cmd = exec.Command(bin, "serve", "--backend", "afxdp", "--addr", v.A.Addr().String(), "--socket", sock)
		cmd.Env = append(os.Environ(), "SOFTROCE_TEST_AS_MAIN=1")
		cmd.Stdout, cmd.Stderr = &out, &out
		cmd.SysProcAttr = &syscall.SysProcAttr{
			Credential:  &syscall.Credential{Uid: 65534, Gid: 65534},
			AmbientCaps: []uintptr{unix.CAP_NET_ADMIN, unix.CAP_NET_RAW, unix.CAP_BPF, unix.CAP_IPC_LOCK},
		}
		return cmd.Start()
	})
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() { cmd.Process.Kill() })
	// The daemon is nobody's and serves namespace A: ask from there, as
	// a client that accepts nobody's daemon.
	t.Setenv(serve.DaemonUIDEnv, "65534")
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		var st serve.Status
		var err error
		v.A.NS.Do(func() error { st, err = serve.QueryStatus(sock); return nil })
		if err == nil {
			if len(st.Devices) != 1 || len(st.Devices[0].Addrs) == 0 || st.Devices[0].Addrs[0] != v.A.Addr().String() {
				t.Fatalf("devices %+v, want one on %v", st.Devices, v.A.Addr())
			}
			break
		}
		select {
		case err := <-exited:
			t.Fatalf("softroce serve --backend afxdp as nobody with capabilities: %v\n%s", err, out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no daemon on %s: %v", sock, err)
		}
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if err := <-exited; err != nil {
		t.Fatalf("softroce serve on SIGTERM: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "XDP") {
		t.Errorf("no start-up line naming the XDP mode:\n%s", out.String())
	}
	t.Logf("%s", out.String())
}

// softroce serve on an interface with an IPv6 link-local address gives
// its device the kernel's GID order (0: the link-local address, 1: the
// --addr address); --link-local=false, or loopback, keeps the one GID.
func TestServeLinkLocalGID(t *testing.T) {
	netnstest.Require(t)
	v := netnstest.Pair(t, netnstest.VethConfig{NoDAD: true})
	self, err := os.ReadFile("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "softroce")
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	for i, c := range []struct {
		addr  string
		flags []string
		want  func(as []string) bool
	}{
		{v.A.Addr().String(), nil, func(as []string) bool {
			return len(as) == 2 && strings.HasPrefix(as[0], "fe80::") && as[1] == v.A.Addr().String()
		}},
		{v.A.Addr().String(), []string{"--link-local=false"}, func(as []string) bool { return len(as) == 1 && as[0] == v.A.Addr().String() }},
		{"127.0.0.1", nil, func(as []string) bool { return len(as) == 1 && as[0] == "127.0.0.1" }},
	} {
		sock := filepath.Join(dir, fmt.Sprintf("s%d.sock", i))
		var cmd *exec.Cmd
		var out strings.Builder
		v.A.NS.Run(t, func() error {
			cmd = exec.Command(bin, append([]string{"serve", "--addr", c.addr, "--socket", sock}, c.flags...)...)
			cmd.Env = append(os.Environ(), "SOFTROCE_TEST_AS_MAIN=1")
			cmd.Stdout, cmd.Stderr = &out, &out
			return cmd.Start()
		})
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		var st serve.Status
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
			var err error
			v.A.NS.Do(func() error { st, err = serve.QueryStatus(sock); return nil })
			if err == nil {
				break
			}
			select {
			case err := <-exited:
				t.Fatalf("softroce serve %v: %v\n%s", c.flags, err, out.String())
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("no daemon on %s: %v", sock, err)
			}
		}
		cmd.Process.Signal(syscall.SIGTERM)
		if err := <-exited; err != nil {
			t.Errorf("softroce serve on SIGTERM: %v\n%s", err, out.String())
		}
		if len(st.Devices) != 1 || !c.want(st.Devices[0].Addrs) {
			t.Errorf("serve --addr %s %v: devices %+v\n%s", c.addr, c.flags, st.Devices, out.String())
		}
		t.Logf("%s", out.String())
	}
}
