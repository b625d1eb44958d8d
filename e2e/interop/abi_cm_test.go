package interop

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/softroce/softroce/nic/udp"
)

// cmTool finds a host tool for the librdmacm tests.
func cmHostTool(t *testing.T, name string) string {
	t.Helper()
	needVM(t)
	p, err := exec.LookPath(name)
	if err != nil {
		t.Skipf("%s is not installed on the host (Debian: apt-get install rdmacm-utils perftest)", name)
	}
	return p
}

// hostUntil runs a host client through softroce's libraries until its
// output has ok, retrying while the guest's server is not listening yet
// (its CM answers REJ 8 then, quickly).
func hostUntil(ctx context.Context, t *testing.T, env []string, ok, notYet string, p string, args ...string) (string, error) {
	t.Helper()
	for {
		cmd := vm.HostCommand(ctx, p, args...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if strings.Contains(string(out), ok) || !strings.Contains(string(out), notYet) || ctx.Err() != nil {
			return string(out), err
		}
		t.Logf("not listening yet: %s", lastLines(string(out), 1))
		time.Sleep(300 * time.Millisecond)
	}
}

// cmBothRoles runs an unmodified rdma_cm tool on the host, through
// softroce's librdmacm.so.1 and libibverbs.so.1, against the same tool on
// the rxe guest: host client then host server. A run whose client was
// answered REJ 8 because the server did not listen (yet, or again:
// perftest connects twice) is tried again, up to six times, the guest
// given longer to start each time.
func cmBothRoles(t *testing.T, tool, guestServer, guestClient string, hostServer, hostClient []string, ok, notYet string) {
	cmBothRolesAs(t, asRoot, tool, guestServer, guestClient, hostServer, hostClient, ok, notYet)
}

// abiHost is how a test runs the host's tools: the daemon of a run, and
// the command line that starts a tool with its arguments.
type abiHost struct {
	daemon func(t *testing.T) []string
	argv   func(tool string, args []string) (string, []string)
	// addrs, when set, are the addresses the tools name instead of the
	// IPv4 ones: the guest's and the host's as the host names them, and
	// the host's as the guest names it.
	addrs *cmAddrs
}

type cmAddrs struct{ guest, host, hostFromGuest string }

// addrsOf is h's addresses, the VM's IPv4 ones unless h says otherwise.
func (h abiHost) addrsOf() cmAddrs {
	if h.addrs != nil {
		return *h.addrs
	}
	return cmAddrs{vm.GuestAddr().String(), vm.HostAddr().String(), vm.HostAddr().String()}
}

// asRoot runs the tools as the test does, on a daemon of its own.
var asRoot = abiHost{daemon: abiDaemon, argv: func(tool string, args []string) (string, []string) { return tool, args }}

// cmBothRolesAs is cmBothRoles running the host's tool the way h says.
func cmBothRolesAs(t *testing.T, h abiHost, tool, guestServer, guestClient string, hostServer, hostClient []string, ok, notYet string) {
	host := cmHostTool(t, tool)
	addrs := h.addrsOf()
	t.Run("host-client", func(t *testing.T) {
		env := h.daemon(t) // one for all attempts: it holds UDP 4791 until the test ends
		for attempt := 0; ; attempt++ {
			ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
			proc, err := vm.Start(ctx, "timeout 120 "+guestServer)
			if err != nil {
				t.Fatal(err)
			}
			// The guest's tool starts slowly under TCG, more slowly on a
			// loaded host: each attempt gives it longer.
			time.Sleep(time.Duration(2+2*attempt) * time.Second)
			p, a := h.argv(host, append(hostClient, addrs.guest))
			out, err := hostUntil(ctx, t, env, ok, notYet, p, a...)
			if !strings.Contains(out, ok) && strings.Contains(out, "REJECTED") && attempt < 5 {
				t.Logf("attempt %d: rejected, again:\n%s", attempt, out)
				proc.Kill()
				cancel()
				continue
			}
			gout, gerr := proc.Wait(ctx)
			proc.Kill()
			cancel()
			if err != nil || gerr != nil || !strings.Contains(out, ok) || !strings.Contains(gout, ok) {
				t.Fatalf("host %s: %v\n%s\nguest: %v\n%s", tool, err, out, gerr, gout)
			}
			t.Logf("host: %s; guest: %s", lastLines(out, 2), lastLines(gout, 2))
			return
		}
	})
	t.Run("host-server", func(t *testing.T) {
		env := h.daemon(t)
		for attempt := 0; ; attempt++ {
			ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
			args := make([]string, len(hostServer))
			for i, a := range hostServer {
				args[i] = strings.ReplaceAll(a, "HOST", addrs.host)
			}
			p, a := h.argv(host, args)
			cmd := vm.HostCommand(ctx, p, a...)
			cmd.Env = env
			var out strings.Builder
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Duration(1+attempt) * time.Second) // the host server listens
			gout, gerr := vm.Run(ctx, "timeout 120 "+guestClient+" "+addrs.hostFromGuest)
			said := gout // a failed guest command's output is in its error
			if gerr != nil {
				said += gerr.Error()
			}
			if !strings.Contains(said, ok) && strings.Contains(said, "REJECTED") && attempt < 5 {
				t.Logf("attempt %d: rejected, again:\n%s", attempt, said)
				cmd.Process.Kill()
				cmd.Wait()
				cancel()
				continue
			}
			err := cmd.Wait()
			cancel()
			if err != nil || gerr != nil || !strings.Contains(out.String(), ok) || !strings.Contains(gout, ok) {
				t.Fatalf("host %s server: %v\n%s\nguest client: %v\n%s", tool, err, out.String(), gerr, gout)
			}
			t.Logf("host: %s; guest: %s", lastLines(out.String(), 2), lastLines(gout, 2))
			return
		}
	})
}

// TestABIUcmatoseAgainstRxe: ucmatose (RC by rdma_cm, SENDs both ways,
// the server disconnects), both roles.
func TestABIUcmatoseAgainstRxe(t *testing.T) {
	cmBothRoles(t, "ucmatose", "ucmatose", "ucmatose -s", []string{"-b", "HOST"}, []string{"-s"}, "return status 0", "REJECTED, error: 8")
}

// TestABILinkLocalAgainstRxe: ucmatose, rping and udaddy over the IPv6 link-local
// addresses, both roles: GID 0 on both sides, the host's daemon serving
// the tap's link-local and IPv4 addresses (the kernel's GID order, as
// softroce serve opens it), its programs naming addresses with the tap's
// scope id and the guest's with eth0's.
func TestABILinkLocalAgainstRxe(t *testing.T) {
	needVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Just after boot the guest's address may still be tentative
	// (duplicate address detection) or not there yet.
	var guestLL netip.Addr
	var out string
	var err error
	for end := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		out, err = vm.Run(ctx, "ip -6 -o addr show dev eth0 scope link")
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, "tentative") {
				continue
			}
			for _, f := range strings.Fields(l) {
				if p, perr := netip.ParsePrefix(f); perr == nil && p.Addr().IsLinkLocalUnicast() {
					guestLL = p.Addr()
				}
			}
		}
		if guestLL.IsValid() || time.Now().After(end) {
			break
		}
	}
	if err != nil || !guestLL.IsValid() {
		t.Fatalf("the guest's eth0 has no usable link-local address after 20 s: %v\n%s", err, out)
	}
	var hostLL netip.Addr
	var link *udp.Multi
	if err := vm.Do(func() (err error) {
		if hostLL, err = udp.LinkLocalOf(vm.HostAddr(), 5*time.Second); err != nil {
			return err
		}
		link, err = udp.OpenMulti(udp.Config{}, hostLL, vm.HostAddr())
		return err
	}); err != nil {
		t.Fatalf("open the tap's link-local and IPv4 sockets in the VM namespace: %v", err)
	}
	ll := hostLL.WithZone("").String()
	h := abiHost{argv: asRoot.argv, addrs: &cmAddrs{guest: guestLL.String() + "%" + vm.Tap(), host: ll + "%" + vm.Tap(),
		hostFromGuest: ll + "%eth0"}}
	// One daemon for every run: the link's sockets are opened once.
	_, env := abiServeOn(t, "", link)
	h.daemon = func(*testing.T) []string { return env }
	t.Logf("host %s%%%s, guest %s%%eth0", ll, vm.Tap(), guestLL)
	gb := "-b " + guestLL.String() + "%eth0"
	// run runs a tool both ways and checks that its traffic went through
	// the host's link-local socket.
	run := func(name string, both func(t *testing.T)) {
		t.Run(name, func(t *testing.T) {
			before := link.Links()[0].Stats().RxPackets
			both(t)
			if got := link.Links()[0].Stats().RxPackets - before; got < 20 {
				t.Errorf("the host's link-local socket received %d packets, want at least 20", got)
			} else {
				t.Logf("the host's link-local socket received %d packets", got)
			}
		})
	}
	run("ucmatose", func(t *testing.T) {
		cmBothRolesAs(t, h, "ucmatose", "ucmatose "+gb, "ucmatose -s", []string{"-b", "HOST"}, []string{"-s"},
			"return status 0", "REJECTED, error: 8")
	})
	run("rping", func(t *testing.T) {
		cmBothRolesAs(t, h, "rping", "rping -s -C 10 -v -a "+guestLL.String()+"%eth0", "rping -c -C 10 -v -a",
			[]string{"-s", "-C", "10", "-v", "-a", "HOST"}, []string{"-c", "-C", "10", "-v", "-a"}, "ping data: rdma-ping-9", "REJECTED")
	})
	// SIDR over link-local GIDs, then 10 datagrams each way whose GRHs
	// carry them.
	run("udaddy", func(t *testing.T) {
		cmBothRolesAs(t, h, "udaddy", "udaddy "+gb, "udaddy -s", []string{"-b", "HOST"}, []string{"-s"}, "return status 0", "REJECTED")
	})
}

// TestABIRpingAgainstRxe: rping (SEND, RDMA READ and WRITE of the
// buffers it advertises), both roles.
func TestABIRpingAgainstRxe(t *testing.T) {
	cmBothRoles(t, "rping", "rping -s -C 10 -v", "rping -c -C 10 -v -a", []string{"-s", "-C", "10", "-v", "-a", "HOST"},
		[]string{"-c", "-C", "10", "-v", "-a"}, "ping data: rdma-ping-9", "REJECTED")
}

// perftestNotListening is what a perftest -R client prints when its first
// REQ is answered REJ 8 (the server does not listen yet): trying the
// client again is right then. A REJ 8 of its second REQ (the server has
// not listened again yet) prints RDMA_CM_EVENT_REJECTED instead, and then
// the server is inside a session with the dead client: cmBothRoles starts
// both again.
const perftestNotListening = "Unexpected CM event bl blka 8"

// TestABIPerftestCMAgainstRxe: perftest's -R variants (connecting with
// rdma_cm): RDMA WRITE, READ, SEND and atomics, both roles.
func TestABIPerftestCMAgainstRxe(t *testing.T) {
	for i, c := range []struct{ tool, size string }{
		{"ib_write_bw", "4096"},
		{"ib_read_bw", "4096"},
		{"ib_send_bw", "4096"},
		{"ib_atomic_bw", "8"},
	} {
		t.Run(c.tool, func(t *testing.T) {
			common := fmt.Sprintf("-R -F -n 100 -s %s -p %d", c.size, 18517+i)
			cmBothRoles(t, c.tool, c.tool+" -d rxe0 "+common, c.tool+" -d rxe0 "+common,
				strings.Fields(common), strings.Fields(common), "#bytes", perftestNotListening)
		})
	}
}

// TestABIUdaddyAgainstRxe: udaddy (UD QPs found by SIDR, 10 datagrams
// each way), both roles; skipped while softroce's libibverbs makes no UD
// QPs.
func TestABIUdaddyAgainstRxe(t *testing.T) {
	host := cmHostTool(t, "udaddy")
	ud := true
	t.Run("probe", func(t *testing.T) { // its daemon goes before the roles' start
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		cmd := vm.HostCommand(ctx, host, "-s", vm.HostAddr().String())
		cmd.Env = abiDaemon(t)
		out, _ := cmd.CombinedOutput()
		ud = !strings.Contains(string(out), "unable to create QP: Operation not supported")
	})
	if !ud {
		t.Skip("softroce's libibverbs makes no UD QPs yet")
	}
	cmBothRoles(t, "udaddy", "udaddy", "udaddy -s", []string{"-b", "HOST"}, []string{"-s"}, "return status 0", "REJECTED")
}
