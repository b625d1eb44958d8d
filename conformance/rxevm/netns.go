package rxevm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// netnsDir is where iproute2 (and netns.NewNamed) bind-mount named
// namespaces.
const netnsDir = "/run/netns"

// inNetns runs fn on an OS thread switched into ns. Sockets and child
// processes created by fn stay in ns. The thread is thrown away (its
// goroutine exits locked) if it cannot be switched back.
// onThreadInNetns runs fn in ns on the calling goroutine's thread, which
// the caller has locked, and switches back. Should switching back fail,
// the thread stays in ns: the caller must not unlock it.
func onThreadInNetns(ns netns.NsHandle, fn func() error) error {
	orig, err := netns.Get()
	if err != nil {
		return fmt.Errorf("get current netns: %w", err)
	}
	defer orig.Close()
	if err := netns.Set(ns); err != nil {
		return fmt.Errorf("enter netns: %w", err)
	}
	ferr := fn()
	if err := netns.Set(orig); err != nil {
		return errors.Join(ferr, fmt.Errorf("leave netns: %w", err))
	}
	return ferr
}

func inNetns(ns netns.NsHandle, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- fmt.Errorf("get current netns: %w", err)
			return
		}
		defer orig.Close()
		if err := netns.Set(ns); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("enter netns: %w", err)
			return
		}
		ferr := fn()
		if err := netns.Set(orig); err != nil {
			errc <- errors.Join(ferr, fmt.Errorf("leave netns: %w", err))
			return // stay locked: the runtime ends this thread
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// netLayout is what createNetns puts into a new namespace: one tap per
// guest, each up at the MTU, and the host address either on the single tap
// or, for more than one guest, on a bridge that joins the taps (so that the
// guests reach each other through the host's bridge, as two hosts on one
// switch).
type netLayout struct {
	mtu    int
	taps   []string
	bridge string // empty: the host address goes on taps[0]
	queues int    // > 1: multi-queue taps, for qemu's queues=
}

func singleLayout(mtu, queues int) netLayout {
	return netLayout{mtu: mtu, taps: []string{TapName}, queues: queues}
}

// BridgeName is the bridge joining the taps of a Pair in its namespace.
const BridgeName = "br0"

func pairLayout(mtu, queues int) netLayout {
	return netLayout{mtu: mtu, taps: []string{TapName, "tap1"}, bridge: BridgeName, queues: queues}
}

// createNetns creates the named namespace with lo up and the links of l
// addressed, up and at l's MTU.
//
// The namespace is made by `ip netns add`, not netns.NewNamed: iproute2
// first turns /run/netns into a shared bind mount of itself, and when a
// later `ip netns add` (from anyone) does that after another tool bind-mounted
// a namespace file into the plain directory, that namespace's mount is
// shadowed and can no longer be unmounted or removed by name.
func createNetns(ctx context.Context, name string, l netLayout) (netns.NsHandle, error) {
	if out, err := exec.CommandContext(ctx, "ip", "netns", "add", name).CombinedOutput(); err != nil {
		return -1, fmt.Errorf("create netns %s: %w: %s", name, err, strings.TrimSpace(string(out)))
	}
	ns, err := netns.GetFromName(name)
	if err == nil {
		err = inNetns(ns, func() error { return setupLinks(l) })
		if err != nil {
			ns.Close()
		}
	}
	if err != nil {
		deleteNamed(name)
		return -1, fmt.Errorf("set up netns %s: %w", name, err)
	}
	return ns, nil
}

// setupLinks runs inside the new namespace.
func setupLinks(l netLayout) error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find lo: %w", err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return fmt.Errorf("set lo up: %w", err)
	}
	var br netlink.Link
	if l.bridge != "" {
		// STP off (the default): ports forward as soon as they are up.
		if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: l.bridge, MTU: l.mtu}}); err != nil {
			return fmt.Errorf("create bridge %s: %w", l.bridge, err)
		}
		if br, err = netlink.LinkByName(l.bridge); err != nil {
			return fmt.Errorf("find %s: %w", l.bridge, err)
		}
	}
	hostLink := br
	for _, name := range l.taps {
		tap := &netlink.Tuntap{
			LinkAttrs: netlink.LinkAttrs{Name: name, MTU: l.mtu},
			Mode:      netlink.TUNTAP_MODE_TAP,
			Flags:     netlink.TUNTAP_NO_PI,
		}
		if l.queues > 1 {
			// qemu's queues=N opens a persistent tap only if it was
			// created multi-queue.
			tap.Flags = netlink.TUNTAP_MULTI_QUEUE_DEFAULTS
		}
		if err := netlink.LinkAdd(tap); err != nil {
			return fmt.Errorf("create %s: %w", name, err)
		}
		for _, f := range tap.Fds {
			f.Close() // the device is persistent; qemu opens it by name
		}
		link, err := netlink.LinkByName(name)
		if err != nil {
			return fmt.Errorf("find %s: %w", name, err)
		}
		if err := netlink.LinkSetMTU(link, l.mtu); err != nil {
			return fmt.Errorf("set %s mtu %d: %w", name, l.mtu, err)
		}
		if br != nil {
			if err := netlink.LinkSetMaster(link, br); err != nil {
				return fmt.Errorf("add %s to %s: %w", name, l.bridge, err)
			}
		} else if hostLink == nil {
			hostLink = link
		}
		if err := netlink.LinkSetUp(link); err != nil {
			return fmt.Errorf("set %s up: %w", name, err)
		}
	}
	if br != nil {
		// A bridge takes the smallest MTU of its ports; set it again
		// now that they are in.
		if err := netlink.LinkSetMTU(br, l.mtu); err != nil {
			return fmt.Errorf("set %s mtu %d: %w", l.bridge, l.mtu, err)
		}
	}
	addr, err := netlink.ParseAddr(hostPrefix.String())
	if err != nil {
		return err
	}
	if err := netlink.AddrAdd(hostLink, addr); err != nil {
		return fmt.Errorf("address %s: %w", hostLink.Attrs().Name, err)
	}
	if err := netlink.LinkSetUp(hostLink); err != nil {
		return fmt.Errorf("set %s up: %w", hostLink.Attrs().Name, err)
	}
	return nil
}

// Do runs fn on an OS thread inside the VM's network namespace: sockets
// opened and processes started by fn live there (a socket keeps the
// namespace it was created in). fn must not start goroutines that expect to
// inherit the namespace.
func (vm *VM) Do(fn func() error) error {
	return inNetns(vm.ns, fn)
}

// DialContext connects from the VM's network namespace, e.g. to
// GuestAddr(); its signature fits net.Dialer users.
func (vm *VM) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := vm.Do(func() error {
		var d net.Dialer
		var err error
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// Listen opens a listener inside the VM's network namespace, e.g. on
// HostAddr() for a guest tool that connects to the host.
func (vm *VM) Listen(network, addr string) (net.Listener, error) {
	var l net.Listener
	err := vm.Do(func() error {
		var err error
		l, err = net.Listen(network, addr)
		return err
	})
	return l, err
}

// ListenPacket opens a packet socket (e.g. UDP 4791) inside the VM's
// network namespace.
func (vm *VM) ListenPacket(network, addr string) (net.PacketConn, error) {
	var l net.PacketConn
	err := vm.Do(func() error {
		var err error
		l, err = net.ListenPacket(network, addr)
		return err
	})
	return l, err
}

// HostCommand prepares a host command that runs inside the VM's network
// namespace (through `ip netns exec`).
func (vm *VM) HostCommand(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", vm.name, name}, args...)...)
}

// SweepStale removes what earlier processes left behind when they died
// without cleaning up: network namespaces named NetnsPrefix<pid>-<n> whose
// pid no longer runs (killing any process still inside, e.g. an orphaned
// qemu), and their scratch directories. It returns the number of
// namespaces removed.
func SweepStale() (int, error) {
	ents, err := os.ReadDir(netnsDir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return 0, nil
		}
		return 0, fmt.Errorf("list %s: %w", netnsDir, err)
	}
	n := 0
	var errs []error
	for _, e := range ents {
		pid, ok := ownerPid(e.Name())
		if !ok || pidAlive(pid) {
			continue
		}
		killNetnsProcs(filepath.Join(netnsDir, e.Name()))
		if err := deleteNamed(e.Name()); err != nil {
			if errors.Is(err, errShadowed) {
				continue // nothing anyone can do by name; it holds no process
			}
			errs = append(errs, fmt.Errorf("delete stale netns %s: %w", e.Name(), err))
			continue
		}
		n++
	}
	if dirs, err := filepath.Glob(filepath.Join(os.TempDir(), NetnsPrefix+"*")); err == nil {
		for _, d := range dirs {
			if pid, ok := ownerPid(filepath.Base(d)); ok && !pidAlive(pid) {
				os.RemoveAll(d)
			}
		}
	}
	return n, errors.Join(errs...)
}

// deleteNamed removes a named namespace: detach its bind mount and remove
// the file. A file that is no longer a mount point (its mount was detached
// but the file not removed) is removed all the same.
func deleteNamed(name string) error {
	p := filepath.Join(netnsDir, name)
	uerr := unix.Unmount(p, unix.MNT_DETACH)
	if uerr != nil && !errors.Is(uerr, unix.EINVAL) {
		return fmt.Errorf("unmount %s: %w", p, uerr)
	}
	if err := os.Remove(p); err != nil {
		if uerr != nil && errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("remove %s: %w", p, errShadowed)
		}
		return fmt.Errorf("remove %s: %w", p, err)
	}
	return nil
}

// errShadowed is a namespace file whose mount lies under a later bind mount
// of /run/netns (see createNetns).
var errShadowed = errors.New("namespace mount shadowed by a later bind mount of " + netnsDir)

// ownerPid extracts the pid from NetnsPrefix<pid>-<rest>.
func ownerPid(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, NetnsPrefix)
	if !ok {
		return 0, false
	}
	p, _, ok := strings.Cut(rest, "-")
	if !ok {
		return 0, false
	}
	pid, err := strconv.Atoi(p)
	return pid, err == nil && pid > 0
}

func pidAlive(pid int) bool {
	err := unix.Kill(pid, 0)
	return err == nil || errors.Is(err, unix.EPERM)
}

// killNetnsProcs SIGKILLs every process whose network namespace is the one
// bind-mounted at nsPath.
func killNetnsProcs(nsPath string) {
	var st unix.Stat_t
	if err := unix.Stat(nsPath, &st); err != nil {
		return
	}
	want := fmt.Sprintf("net:[%d]", st.Ino)
	procs, _ := filepath.Glob("/proc/[0-9]*/ns/net")
	for _, p := range procs {
		if l, err := os.Readlink(p); err == nil && l == want {
			if pid, err := strconv.Atoi(strings.Split(p, "/")[2]); err == nil && pid != os.Getpid() {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
}
