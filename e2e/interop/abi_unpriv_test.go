package interop

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/softroce/softroce/serve"
)

// nobodyUID is the user the unprivileged runs use.
const nobodyUID = 65534

// asNobody runs the host's tools as nobody:nogroup with no supplementary
// groups, through setpriv inside `ip netns exec` (both exec, so the
// tool keeps the process the test started), against a daemon whose
// socket group nogroup may use. Every run's daemon checks, as the run
// ends, that each process it served was nobody.
func asNobody(t *testing.T) abiHost {
	t.Helper()
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("setpriv is not installed (Debian: util-linux)")
	}
	g, err := user.LookupGroup("nogroup")
	if err != nil {
		t.Skip("no group nogroup")
	}
	if u, err := user.LookupId(fmt.Sprint(nobodyUID)); err != nil || u.Username != "nobody" {
		t.Skipf("uid %d is not nobody: %v", nobodyUID, err)
	}
	return abiHost{
		daemon: func(t *testing.T) []string {
			s, env := abiServe(t, "nogroup")
			w := watchClients(s)
			t.Cleanup(func() { w.check(t) }) // before the daemon closes
			return env
		},
		argv: func(tool string, args []string) (string, []string) {
			return setpriv, append([]string{fmt.Sprintf("--reuid=%d", nobodyUID), "--regid=" + g.Gid, "--clear-groups", "--", tool}, args...)
		},
	}
}

// clientWatch records the credentials of every process a daemon serves.
type clientWatch struct {
	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	seen map[int]string // pid: "name uid-real uid-effective"
}

// watchClients polls s's clients until check and reads each one's
// /proc/<pid>/status: the program really running, with its real and
// effective user.
func watchClients(s *serve.Server) *clientWatch {
	return watchClientList(func() []serve.ClientStatus { return s.Status().Clients })
}

// watchClientList is watchClients for a daemon whose clients list tells.
func watchClientList(list func() []serve.ClientStatus) *clientWatch {
	w := &clientWatch{stop: make(chan struct{}), done: make(chan struct{}), seen: map[int]string{}}
	go func() {
		defer close(w.done)
		for {
			for _, c := range list() {
				w.mu.Lock()
				_, ok := w.seen[c.PID]
				w.mu.Unlock()
				if ok || c.PID == 0 {
					continue
				}
				if who, ok := procWho(c.PID); ok {
					w.mu.Lock()
					w.seen[c.PID] = who
					w.mu.Unlock()
				}
			}
			select {
			case <-w.stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	return w
}

// procWho is "name uid euid" of a running process, from its status file.
func procWho(pid int) (string, bool) {
	b, err := os.ReadFile(filepath.Join("/proc", fmt.Sprint(pid), "status"))
	if err != nil {
		return "", false
	}
	var name, uids string
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Name:"); ok {
			name = strings.TrimSpace(v)
		}
		if v, ok := strings.CutPrefix(l, "Uid:"); ok {
			if f := strings.Fields(v); len(f) >= 2 {
				uids = f[0] + " " + f[1]
			}
		}
	}
	return name + " " + uids, name != "" && uids != ""
}

// check fails t unless the daemon served at least one process and every
// one of them ran as nobody, really and effectively.
func (w *clientWatch) check(t *testing.T) {
	close(w.stop)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.seen) == 0 {
		t.Errorf("the daemon served no process it could see")
	}
	want := fmt.Sprintf(" %d %d", nobodyUID, nobodyUID)
	for pid, who := range w.seen {
		if !strings.HasSuffix(who, want) {
			t.Errorf("client pid %d: %q, want uid and euid %d", pid, who, nobodyUID)
		}
	}
	t.Logf("the daemon's clients (pid: name uid euid): %v", w.seen)
}

// TestABIUnprivilegedAgainstRxe runs the host's unmodified
// ibv_rc_pingpong (polling, -e, -N), ibv_ud_pingpong, ib_write_bw, rping
// and ucmatose as nobody through softroce's libraries and a daemon whose
// socket group nogroup may use, against the same tools on the rxe guest,
// both roles: nothing on the program's side needs privileges.
func TestABIUnprivilegedAgainstRxe(t *testing.T) {
	needVM(t)
	h := asNobody(t)
	for _, c := range []struct{ name, tool, host, guest string }{ // the guest sleeps on events (-e) always
		{"ibv_rc_pingpong", "ibv_rc_pingpong", "-c", "-c"},
		{"ibv_rc_pingpong-e", "ibv_rc_pingpong", "-c -e", "-c"},
		{"ibv_rc_pingpong-N", "ibv_rc_pingpong", "-c -N", "-c"},
		{"ibv_ud_pingpong", "ibv_ud_pingpong", "-s 1024", "-s 1024"},
	} {
		for _, role := range []string{"host-client", "host-server"} {
			t.Run(c.name+"/"+role, func(t *testing.T) {
				out, gout := abiPairAs(t, h, c.tool, append([]string{"-g", "0", "-n", "50", "-r", "50"}, strings.Fields(c.host)...),
					"timeout 80 "+c.tool+" -d rxe0 -g 1 -e -n 50 -r 50 "+c.guest, 18515, role, 500*time.Millisecond)
				if !strings.Contains(out, "50 iters in") || !strings.Contains(gout, "50 iters in") {
					t.Fatalf("no result:\nhost:\n%s\nguest:\n%s", out, gout)
				}
				t.Logf("host: %s", lastLines(out, 1))
			})
		}
	}
	writeBWBothRoles(t, h, 1024, 4096)
	t.Run("rping", func(t *testing.T) {
		cmBothRolesAs(t, h, "rping", "rping -s -C 10 -v", "rping -c -C 10 -v -a", []string{"-s", "-C", "10", "-v", "-a", "HOST"},
			[]string{"-c", "-C", "10", "-v", "-a"}, "ping data: rdma-ping-9", "REJECTED")
	})
	t.Run("ucmatose", func(t *testing.T) {
		cmBothRolesAs(t, h, "ucmatose", "ucmatose", "ucmatose -s", []string{"-b", "HOST"}, []string{"-s"}, "return status 0", "REJECTED, error: 8")
	})
}

// abiPairAs runs the host's tool (skipping when it is not installed) the
// way h says, with hostArgs, against guestCmd on the rxe guest in role,
// on a daemon of h's, and fails t unless both succeed.
func abiPairAs(t *testing.T, h abiHost, tool string, hostArgs []string, guestCmd string, port int, role string, settle time.Duration) (out, gout string) {
	t.Helper()
	p, err := exec.LookPath(tool)
	if err != nil {
		t.Skipf("%s is not installed on the host", tool)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	env := h.daemon(t)
	path, args := h.argv(p, hostArgs)
	out, gout, err, gerr := abiPair(t, ctx, env, path, args, guestCmd, port, role, settle)
	if err != nil || gerr != nil {
		t.Fatalf("host %s (%s): %v\n%s\nguest: %v\n%s", tool, role, err, out, gerr, gout)
	}
	return out, gout
}

// writeBWBothRoles runs ib_write_bw -F of 100 messages of size bytes at
// path MTU mtu through abiPairAs, the host as client then as server, and
// checks the client's result row.
func writeBWBothRoles(t *testing.T, h abiHost, mtu, size int) {
	for _, role := range []string{"host-client", "host-server"} {
		t.Run("ib_write_bw/"+role, func(t *testing.T) {
			common := fmt.Sprintf("-m %d -s %d -n 100 -p 18516", mtu, size)
			out, gout := abiPairAs(t, h, "ib_write_bw", append([]string{"-x", "0", "-F"}, strings.Fields(common)...),
				"timeout 100 ib_write_bw -d rxe0 -x 1 -F "+common, 18516, role, time.Second)
			client := gout // only the client prints the result row
			if role == "host-client" {
				client = out
			}
			if _, row := perftestRow(client, size, 100); row == nil {
				t.Fatalf("no result row:\nhost:\n%s\nguest:\n%s", out, gout)
			}
			t.Logf("client: %s", lastLines(client, 2))
		})
	}
}

// procWho reads this process's own name and users the way the
// unprivileged runs read the tools'.
func TestProcWho(t *testing.T) {
	who, ok := procWho(os.Getpid())
	want := fmt.Sprintf(" %d %d", os.Getuid(), os.Geteuid())
	if !ok || !strings.HasSuffix(who, want) || strings.HasPrefix(who, " ") {
		t.Fatalf("procWho(self) = %q, %v; want a name and %q", who, ok, want)
	}
	if _, ok := procWho(1 << 30); ok {
		t.Fatal("procWho of a pid that cannot exist succeeded")
	}
}
