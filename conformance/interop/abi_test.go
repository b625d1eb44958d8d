package interop

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/softroce/softroce/abi"
	"github.com/softroce/softroce/nic/udp"
	"github.com/softroce/softroce/serve"
	"github.com/softroce/softroce/verbs"
)

// abiDaemon starts softroce's daemon on the host end of the VM's tap and
// returns the environment that makes a host program use it through
// softroce's libibverbs.so.1.
func abiDaemon(t *testing.T) []string {
	t.Helper()
	if m := abi.Missing(); m != "" {
		t.Skip("cannot build softroce's libibverbs.so.1: " + m)
	}
	lib, err := abi.Build(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var link *udp.Link
	if err := vm.Do(func() error {
		var err error
		link, err = udp.Open(udp.Config{Addr: vm.HostAddr()})
		return err
	}); err != nil {
		t.Fatalf("open UDP link in the VM namespace: %v", err)
	}
	dev, err := verbs.Open(link, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := serve.New([]*verbs.Device{dev}, serve.Config{Socket: filepath.Join(t.TempDir(), "softroce.sock")})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	go s.Serve()
	t.Cleanup(func() { s.Close() })
	return append(os.Environ(), "SOFTROCE_SOCKET="+s.Socket(), "LD_LIBRARY_PATH="+lib)
}

// TestABIPingpongAgainstRxe runs the distribution's ibv_rc_pingpong on the
// host, unmodified, through softroce's libibverbs.so.1 and daemon, against
// the same tool on the rxe guest: both roles.
func TestABIPingpongAgainstRxe(t *testing.T) {
	needVM(t)
	host, err := exec.LookPath("ibv_rc_pingpong")
	if err != nil {
		t.Skip("ibv_rc_pingpong is not installed on the host (Debian: apt-get install ibverbs-utils)")
	}
	for _, role := range []string{"host-client", "host-server"} {
		t.Run(role, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			env := abiDaemon(t)
			const iters = 50
			guestCmd := fmt.Sprintf("timeout 80 ibv_rc_pingpong -d rxe0 -g 1 -e -n %d -r 50", iters)
			hostArgs := []string{"-g", "0", "-n", fmt.Sprint(iters), "-r", "50"}
			if role == "host-client" {
				proc, err := vm.Start(ctx, guestCmd)
				if err != nil {
					t.Fatal(err)
				}
				defer proc.Kill()
				if err := vm.WaitListening(ctx, 18515); err != nil {
					t.Fatalf("ibv_rc_pingpong did not listen: %v", err)
				}
				cmd := vm.HostCommand(ctx, host, append(hostArgs, vm.GuestAddr().String())...)
				cmd.Env = env
				out, err := cmd.CombinedOutput()
				gout, gerr := proc.Wait(ctx)
				if err != nil || gerr != nil || !strings.Contains(string(out), fmt.Sprintf("%d iters in", iters)) || !strings.Contains(gout, "iters in") {
					t.Fatalf("host ibv_rc_pingpong: %v\n%s\nguest: %v\n%s", err, out, gerr, gout)
				}
				t.Logf("host: %s; guest: %s", lastLines(string(out), 2), lastLines(gout, 2))
				return
			}
			cmd := vm.HostCommand(ctx, host, hostArgs...)
			cmd.Env = env
			var out strings.Builder
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer cmd.Process.Kill()
			time.Sleep(500 * time.Millisecond) // the host server listens once its QP exists
			gout, gerr := vm.Run(ctx, guestCmd+" "+vm.HostAddr().String())
			err := cmd.Wait()
			if err != nil || gerr != nil || !strings.Contains(out.String(), fmt.Sprintf("%d iters in", iters)) || !strings.Contains(gout, "iters in") {
				t.Fatalf("host ibv_rc_pingpong server: %v\n%s\nguest client: %v\n%s", err, out.String(), gerr, gout)
			}
			t.Logf("host: %s; guest: %s", lastLines(out.String(), 2), lastLines(gout, 2))
		})
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
				if role == "host-client" {
					proc, err := vm.Start(ctx, guestCmd)
					if err != nil {
						t.Fatal(err)
					}
					defer proc.Kill()
					if err := vm.WaitListening(ctx, 18516); err != nil {
						t.Fatalf("%s did not listen: %v", tool, err)
					}
					cmd := vm.HostCommand(ctx, host, append(hostArgs, vm.GuestAddr().String())...)
					cmd.Env = env
					out, err := cmd.CombinedOutput()
					gout, gerr := proc.Wait(ctx)
					if err != nil || gerr != nil || !strings.Contains(string(out), "#bytes") {
						t.Fatalf("host %s: %v\n%s\nguest: %v\n%s", tool, err, out, gerr, gout)
					}
					t.Logf("host: %s", lastLines(string(out), 2))
					return
				}
				cmd := vm.HostCommand(ctx, host, hostArgs...)
				cmd.Env = env
				var out strings.Builder
				cmd.Stdout, cmd.Stderr = &out, &out
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				defer cmd.Process.Kill()
				time.Sleep(time.Second) // the host server listens once its QP exists
				gout, gerr := vm.Run(ctx, guestCmd+" "+vm.HostAddr().String())
				err := cmd.Wait()
				if err != nil || gerr != nil || !strings.Contains(gout, "#bytes") {
					t.Fatalf("host %s server: %v\n%s\nguest client: %v\n%s", tool, err, out.String(), gerr, gout)
				}
				t.Logf("guest: %s", lastLines(gout, 2))
			})
		}
	}
}
