package serve

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/softroce/softroce/nic/udp"
	"github.com/softroce/softroce/verbs"
)

// startToolAs is startTool for a program run with cred.
func startToolAs(t *testing.T, s *Server, lib string, cred *syscall.Credential, path string, args ...string) *toolProc {
	t.Helper()
	p := &toolProc{cmd: exec.Command(path, args...), done: make(chan error, 1)}
	p.cmd.Env = env(s, lib)
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	p.cmd.Stdout, p.cmd.Stderr = p, p
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() { p.cmd.Process.Kill() })
	return p
}

// The tools the root tests run (ibv_devinfo, ibv_rc_pingpong, ib_write_bw
// with and without rdma_cm, rping, ucmatose), run as nobody against a daemon whose
// --group is nogroup: nothing on the client side needs privileges. The
// daemon is on UDP 4791 of 127.0.0.1, where the CM reaches its peers.
func TestUnprivilegedTools(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run programs as other users")
	}
	_, lib := cmTool(t, "rping")
	g, err := user.LookupGroup("nogroup")
	if err != nil {
		t.Skip("no group nogroup")
	}
	gid, _ := strconv.Atoi(g.Gid)
	for d := lib; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		os.Chmod(d, 0o755)
	}
	var l *udp.Link
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		if l, err = udp.Open(udp.Config{Addr: netip.MustParseAddr("127.0.0.1"), Port: 4791}); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatalf("UDP 4791 on 127.0.0.1 stayed taken for 2 minutes: %v", err)
	}
	d, err := verbs.Open(l, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := serveOn(t, []*verbs.Device{d}, Config{Socket: sharedSocket(t), Group: "nogroup"})
	nobody := &syscall.Credential{Uid: 65534, Gid: uint32(gid)}
	look := func(t *testing.T, name string) string {
		p, err := exec.LookPath(name)
		if err != nil {
			t.Skipf("%s is not installed", name)
		}
		return p
	}
	pair := func(t *testing.T, name string, srvArgs, cliArgs []string, listen func()) (string, string) {
		p := look(t, name)
		srv := startToolAs(t, s, lib, nobody, p, srvArgs...)
		listen()
		cli := startToolAs(t, s, lib, nobody, p, cliArgs...)
		co := waitTool(t, cli, name+" client as nobody")
		so := waitTool(t, srv, name+" server as nobody")
		t.Logf("%s", lastLines(co, 2))
		return co, so
	}
	sleep := func(d time.Duration) func() { return func() { time.Sleep(d) } }

	t.Run("ibv_devinfo", func(t *testing.T) {
		cmd := exec.Command(look(t, "ibv_devinfo"))
		cmd.Env = env(s, lib)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: nobody}
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "hca_id:\tsoftroce0") || !strings.Contains(string(out), "PORT_ACTIVE (4)") {
			t.Errorf("ibv_devinfo as nobody: %v\n%s", err, out)
		}
	})
	t.Run("ibv_rc_pingpong", func(t *testing.T) {
		args := []string{"-g", "0", "-p", fmt.Sprint(freeTCPPort(t)), "-n", "200"}
		co, _ := pair(t, "ibv_rc_pingpong", args, append(args, "127.0.0.1"), sleep(200*time.Millisecond))
		if !strings.Contains(co, "200 iters in") {
			t.Errorf("no result:\n%s", co)
		}
	})
	t.Run("ib_write_bw", func(t *testing.T) {
		args := []string{"-x", "0", "-s", "65536", "-n", "1000", "-p", fmt.Sprint(freeTCPPort(t))}
		co, _ := pair(t, "ib_write_bw", args, append(args, "127.0.0.1"), sleep(time.Second))
		if !strings.Contains(co, " 65536      1000") {
			t.Errorf("no result line:\n%s", co)
		}
	})
	t.Run("ib_write_bw-R", func(t *testing.T) {
		p := look(t, "ib_write_bw")
		for attempt := 0; ; attempt++ {
			port := 18619 + attempt
			args := []string{"-R", "-F", "-n", "100", "-s", "4096", "-p", fmt.Sprint(port)}
			srv := startToolAs(t, s, lib, nobody, p, args...)
			waitListening(t, s, uint16(port))
			cli := startToolAs(t, s, lib, nobody, p, append(args, "127.0.0.1")...)
			<-cli.done
			cli.mu.Lock()
			co := cli.out.String()
			cli.mu.Unlock()
			if strings.Contains(co, "RDMA_CM_EVENT_REJECTED; error: 8") && attempt < 4 {
				srv.cmd.Process.Kill()
				<-srv.done
				continue
			}
			so := waitTool(t, srv, "ib_write_bw -R server as nobody")
			for _, o := range []string{co, so} {
				if !strings.Contains(o, " 4096       100") {
					t.Errorf("ib_write_bw -R as nobody printed no result:\n%s", o)
				}
			}
			return
		}
	})
	t.Run("ucmatose", func(t *testing.T) {
		co, so := pair(t, "ucmatose", []string{"-b", "127.0.0.1", "-p", "7485", "-c", "2", "-C", "20"},
			[]string{"-s", "127.0.0.1", "-p", "7485", "-c", "2", "-C", "20"}, func() { waitListening(t, s, 7485) })
		for _, o := range []string{co, so} {
			if !strings.Contains(o, "data transfers complete") || !strings.Contains(o, "return status 0") {
				t.Errorf("ucmatose as nobody did not complete:\n%s", o)
			}
		}
	})
	t.Run("rping", func(t *testing.T) {
		co, so := pair(t, "rping", []string{"-s", "-a", "127.0.0.1", "-p", "7484", "-C", "10", "-v"},
			[]string{"-c", "-a", "127.0.0.1", "-p", "7484", "-C", "10", "-v"}, func() { waitListening(t, s, 7484) })
		if !strings.Contains(co, "ping data: rdma-ping-9") || !strings.Contains(so, "server ping data: rdma-ping-9") {
			t.Errorf("rping as nobody did not complete 10 pings:\nclient:\n%s\nserver:\n%s", co, so)
		}
	})
}
