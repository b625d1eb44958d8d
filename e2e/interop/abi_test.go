package interop

import (
	"context"
	"fmt"
	"io/fs"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/softroce/softroce/abi"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/nic/udp"
	"github.com/softroce/softroce/serve"
	"github.com/softroce/softroce/verbs"
)

var (
	abiOnce sync.Once
	abiRoot string // removed by TestMain
	abiLib  string
	abiErr  error
)

// abiLibrary builds softroce's libraries once for the package, in a
// directory every user may read: the unprivileged tests load them too.
func abiLibrary(t *testing.T) string {
	t.Helper()
	if m := abi.Missing(); m != "" {
		t.Skip("cannot build softroce's libibverbs.so.1: " + m)
	}
	abiOnce.Do(func() {
		if abiRoot, abiErr = os.MkdirTemp("", "softroce-interop-abi-"); abiErr != nil {
			return
		}
		if abiLib, abiErr = abi.Build(abiRoot); abiErr != nil {
			return
		}
		// Whatever the umask: readable (and the directories searchable) by all.
		abiErr = filepath.WalkDir(abiRoot, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			fi, err := d.Info()
			if err != nil {
				return err
			}
			if d.IsDir() {
				return os.Chmod(p, fi.Mode().Perm()|0o755)
			}
			return os.Chmod(p, fi.Mode().Perm()|0o444)
		})
	})
	if abiErr != nil {
		t.Fatal(abiErr)
	}
	return abiLib
}

// abiDaemon starts softroce's daemon on the host end of the VM's tap and
// returns the environment that makes a host program use it through
// softroce's libibverbs.so.1.
func abiDaemon(t *testing.T) []string {
	_, env := abiServe(t, "")
	return env
}

// abiServe is abiDaemon whose socket, when group is set, that group may
// use (and whose socket's directory anyone may enter); it returns the
// daemon too.
func abiServe(t *testing.T, group string) (*serve.Server, []string) {
	t.Helper()
	var link *udp.Link
	if err := vm.Do(func() error {
		var err error
		link, err = udp.Open(udp.Config{Addr: vm.HostAddr()})
		return err
	}); err != nil {
		t.Fatalf("open UDP link in the VM namespace: %v", err)
	}
	return abiServeOn(t, group, link)
}

// abiServeOn is abiServe on link.
func abiServeOn(t *testing.T, group string, link nic.Link) (*serve.Server, []string) {
	t.Helper()
	lib := abiLibrary(t)
	dev, err := verbs.Open(link, nil)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if group != "" {
		for _, d := range []string{dir, filepath.Dir(dir)} {
			if err := os.Chmod(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	s, err := serve.New([]*verbs.Device{dev}, serve.Config{Socket: filepath.Join(dir, "softroce.sock"), Group: group,
		Log: log.New(os.Stderr, "softroce serve: ", log.Lmicroseconds)})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	go s.Serve()
	t.Cleanup(func() { s.Close() })
	return s, append(os.Environ(), "SOFTROCE_SOCKET="+s.Socket(), "LD_LIBRARY_PATH="+lib)
}

// TestABIPingpongAgainstRxe runs the distribution's ibv_rc_pingpong on the
// host, unmodified, through softroce's libibverbs.so.1 and daemon, against
// the same tool on the rxe guest, both roles, in each of its modes:
// polling, sleeping on a completion channel (-e) and posting through the
// extended send API (-N: ibv_create_qp_ex, ibv_wr_*). Both sides check the
// bytes of every message they receive (-c).
func TestABIPingpongAgainstRxe(t *testing.T) {
	needVM(t)
	host, err := exec.LookPath("ibv_rc_pingpong")
	if err != nil {
		t.Skip("ibv_rc_pingpong is not installed on the host (Debian: apt-get install ibverbs-utils)")
	}
	for _, mode := range []struct{ name, flag string }{{"poll", ""}, {"events", "-e"}, {"new-send-api", "-N"}} {
		for _, role := range []string{"host-client", "host-server"} {
			t.Run(mode.name+"/"+role, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
				defer cancel()
				env := abiDaemon(t)
				const iters = 50
				guestCmd := fmt.Sprintf("timeout 80 ibv_rc_pingpong -d rxe0 -g 1 -e -c -n %d -r 50", iters)
				hostArgs := []string{"-g", "0", "-c", "-n", fmt.Sprint(iters), "-r", "50"}
				if mode.flag != "" {
					hostArgs = append(hostArgs, mode.flag)
				}
				out, gout, err, gerr := abiPair(t, ctx, env, host, hostArgs, guestCmd, 18515, role, 500*time.Millisecond)
				if err != nil || gerr != nil || !strings.Contains(out, fmt.Sprintf("%d iters in", iters)) || !strings.Contains(gout, "iters in") {
					t.Fatalf("host ibv_rc_pingpong %s (%s): %v\n%s\nguest: %v\n%s", mode.flag, role, err, out, gerr, gout)
				}
				t.Logf("host: %s; guest: %s", lastLines(out, 2), lastLines(gout, 2))
			})
		}
	}
}

// TestABIPerftestAgainstRxe runs the distribution's perftest tools on the
// host through softroce's libibverbs against the same tools on the rxe
// guest, both roles: RDMA WRITE, READ, SEND and atomics.
func TestABIPerftestAgainstRxe(t *testing.T) {
	needVM(t)
	for _, tool := range []string{"ib_write_bw", "ib_read_bw", "ib_send_bw", "ib_atomic_bw"} {
		host, err := exec.LookPath(tool)
		if err != nil {
			t.Skipf("%s is not installed on the host (Debian: apt-get install perftest)", tool)
		}
		for _, role := range []string{"host-client", "host-server"} {
			t.Run(tool+"/"+role, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
				defer cancel()
				env := abiDaemon(t)
				common := "-m 1024 -n 100 -p 18516"
				if tool != "ib_atomic_bw" {
					common += " -s 4096"
				}
				guestCmd := "timeout 100 " + tool + " -d rxe0 -x 1 -F " + common
				if tool != "ib_write_bw" {
					guestCmd += " -e" // keeps the tool from spinning on the guest's only CPU
				}
				hostArgs := append([]string{"-x", "0", "-F"}, strings.Fields(common)...)
				out, gout, err, gerr := abiPair(t, ctx, env, host, hostArgs, guestCmd, 18516, role, time.Second)
				client := gout // only the client prints the result row
				if role == "host-client" {
					client = out
				}
				if err != nil || gerr != nil || !strings.Contains(client, "#bytes") {
					t.Fatalf("host %s (%s): %v\n%s\nguest: %v\n%s", tool, role, err, out, gerr, gout)
				}
				t.Logf("host: %s; guest: %s", lastLines(out, 2), lastLines(gout, 2))
			})
		}
	}
}

// abiPair runs the host's tool through softroce's library (env) against
// guestCmd on the guest, the host in role: as the client it dials the
// guest's server once that listens on port; as the server it has settle
// to create its QP before the guest's client dials. It returns both
// outputs and errors.
func abiPair(t *testing.T, ctx context.Context, env []string, host string, hostArgs []string, guestCmd string, port int, role string, settle time.Duration) (out, gout string, err, gerr error) {
	t.Helper()
	if role == "host-client" {
		proc, err := vm.Start(ctx, guestCmd)
		if err != nil {
			t.Fatal(err)
		}
		defer proc.Kill()
		if err := vm.WaitListening(ctx, port); err != nil {
			t.Fatalf("%s did not listen: %v", filepath.Base(host), err)
		}
		cmd := vm.HostCommand(ctx, host, append(hostArgs, vm.GuestAddr().String())...)
		cmd.Env = env
		b, err := cmd.CombinedOutput()
		gout, gerr := proc.Wait(ctx)
		return string(b), gout, err, gerr
	}
	cmd := vm.HostCommand(ctx, host, hostArgs...)
	cmd.Env = env
	var b strings.Builder
	cmd.Stdout, cmd.Stderr = &b, &b
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	time.Sleep(settle) // the host server listens once its QP exists
	gout, gerr = vm.Run(ctx, guestCmd+" "+vm.HostAddr().String())
	err = cmd.Wait()
	return b.String(), gout, err, gerr
}

// TestABIWriteLatAgainstRxe runs perftest's ib_write_lat on the host
// through softroce's libibverbs against the same tool on the rxe guest,
// both roles: each side RDMA WRITEs into the other's buffer and polls that
// buffer for the peer's next WRITE (no completion channel: the tool has
// none). The client's result row must be there; its typical latency goes
// to the log.
func TestABIWriteLatAgainstRxe(t *testing.T) {
	needVM(t)
	host, err := exec.LookPath("ib_write_lat")
	if err != nil {
		t.Skip("ib_write_lat is not installed on the host (Debian: apt-get install perftest)")
	}
	for _, role := range []string{"host-client", "host-server"} {
		t.Run(role, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
			defer cancel()
			env := abiDaemon(t)
			const iters = 200
			common := fmt.Sprintf("-m 1024 -s 2 -n %d -p 18516", iters)
			guestCmd := "timeout 100 ib_write_lat -d rxe0 -x 1 -F " + common
			hostArgs := append([]string{"-x", "0", "-F"}, strings.Fields(common)...)
			out, gout, err, gerr := abiPair(t, ctx, env, host, hostArgs, guestCmd, 18516, role, time.Second)
			client := gout
			if role == "host-client" {
				client = out
			}
			typical, ok := latTypical(client, 2, iters)
			if err != nil || gerr != nil || !ok {
				t.Fatalf("host ib_write_lat (%s): %v\n%s\nguest: %v\n%s", role, err, out, gerr, gout)
			}
			t.Logf("ib_write_lat %s, 2 bytes, %d iterations: t_typical %s usec (host: %s; guest: %s)", role, iters, typical, lastLines(out, 2), lastLines(gout, 2))
		})
	}
}

// latTypical finds perftest's latency table in out (its header names the
// columns, which differ between perftest versions) and returns the
// t_typical column of the row for size bytes and iters iterations.
func latTypical(out string, size, iters int) (string, bool) {
	h, row := perftestRow(out, size, iters)
	for i, name := range h {
		if strings.HasPrefix(name, "t_typical") && i < len(row) {
			if _, err := strconv.ParseFloat(row[i], 64); err == nil {
				return row[i], true
			}
		}
	}
	return "", false
}

// perftestRow returns the fields of perftest's result row for size bytes
// and iters iterations in out, and those of the header above it (nil
// when there is none).
func perftestRow(out string, size, iters int) (header, row []string) {
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) > 0 && f[0] == "#bytes":
			header = f
		case header != nil && len(f) >= 2 && f[0] == fmt.Sprint(size) && f[1] == fmt.Sprint(iters):
			return header, f
		}
	}
	return nil, nil
}
