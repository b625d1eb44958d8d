package interop

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestABIUDUCSRQAgainstRxe runs the distribution's ibv_ud_pingpong,
// ibv_uc_pingpong and ibv_srq_pingpong on the host, unmodified, through
// softroce's libibverbs.so.1 and daemon, against the same tool on the rxe
// guest, both roles: UD address handles and the GRH of each receive, UC
// QPs, and RC QPs on a shared receive queue.
func TestABIUDUCSRQAgainstRxe(t *testing.T) {
	needVM(t)
	for _, c := range []struct{ tool, flags string }{
		{"ibv_ud_pingpong", "-s 1024"},
		{"ibv_uc_pingpong", "-s 4096"},
		{"ibv_srq_pingpong", "-s 4096 -q 4"},
	} {
		host, err := exec.LookPath(c.tool)
		if err != nil {
			t.Skipf("%s is not installed on the host (Debian: apt-get install ibverbs-utils)", c.tool)
		}
		for _, role := range []string{"host-client", "host-server"} {
			t.Run(c.tool+"/"+role, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
				defer cancel()
				env := abiDaemon(t)
				const iters = 50
				common := fmt.Sprintf("-n %d -r 50 %s", iters, c.flags)
				guestCmd := fmt.Sprintf("timeout 80 %s -d rxe0 -g 1 -e %s", c.tool, common)
				hostArgs := append([]string{"-g", "0"}, strings.Fields(common)...)
				want := fmt.Sprintf("%d iters in", iters)
				if role == "host-client" {
					proc, err := vm.Start(ctx, guestCmd)
					if err != nil {
						t.Fatal(err)
					}
					defer proc.Kill()
					if err := vm.WaitListening(ctx, 18515); err != nil {
						t.Fatalf("%s did not listen: %v", c.tool, err)
					}
					cmd := vm.HostCommand(ctx, host, append(hostArgs, vm.GuestAddr().String())...)
					cmd.Env = env
					out, err := cmd.CombinedOutput()
					gout, gerr := proc.Wait(ctx)
					if err != nil || gerr != nil || !strings.Contains(string(out), want) || !strings.Contains(gout, want) {
						t.Fatalf("host %s: %v\n%s\nguest: %v\n%s", c.tool, err, out, gerr, gout)
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
				if err != nil || gerr != nil || !strings.Contains(out.String(), want) || !strings.Contains(gout, want) {
					t.Fatalf("host %s server: %v\n%s\nguest client: %v\n%s", c.tool, err, out.String(), gerr, gout)
				}
				t.Logf("host: %s; guest: %s", lastLines(out.String(), 2), lastLines(gout, 2))
			})
		}
	}
}

// TestABIPerftestUDUCAgainstRxe runs perftest's SEND over UD and RDMA
// WRITE over UC on the host through softroce's libibverbs against the
// same tools on the rxe guest, both roles.
func TestABIPerftestUDUCAgainstRxe(t *testing.T) {
	needVM(t)
	for _, c := range []struct{ tool, flags string }{
		{"ib_send_bw", "-c UD -s 1024"},
		{"ib_write_bw", "-c UC -s 4096"},
	} {
		host, err := exec.LookPath(c.tool)
		if err != nil {
			t.Skipf("%s is not installed on the host (Debian: apt-get install perftest)", c.tool)
		}
		for _, role := range []string{"host-client", "host-server"} {
			t.Run(c.tool+"/"+role, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
				defer cancel()
				env := abiDaemon(t)
				common := "-m 1024 -n 100 -p 18516 " + c.flags
				guestCmd := "timeout 100 " + c.tool + " -d rxe0 -x 1 -F " + common
				if c.tool == "ib_send_bw" {
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
						t.Fatalf("%s did not listen: %v", c.tool, err)
					}
					cmd := vm.HostCommand(ctx, host, append(hostArgs, vm.GuestAddr().String())...)
					cmd.Env = env
					out, err := cmd.CombinedOutput()
					gout, gerr := proc.Wait(ctx)
					if err != nil || gerr != nil || !strings.Contains(string(out), "#bytes") {
						t.Fatalf("host %s: %v\n%s\nguest: %v\n%s", c.tool, err, out, gerr, gout)
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
					t.Fatalf("host %s server: %v\n%s\nguest client: %v\n%s", c.tool, err, out.String(), gerr, gout)
				}
				t.Logf("guest: %s", lastLines(gout, 2))
			})
		}
	}
}
