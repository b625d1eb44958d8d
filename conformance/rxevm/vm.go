package rxevm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vishvananda/netns"
)

// Fixed addressing of the link between the host side of the tap and the
// guest's eth0. The addresses exist only inside the VM's network namespace,
// so every VM can use the same ones.
var (
	hostPrefix  = netip.MustParsePrefix("10.88.0.1/24")
	guestPrefix = netip.MustParsePrefix("10.88.0.2/24")
)

// TapName is the name of the tap device inside the VM's network namespace.
const TapName = "tap0"

// NetnsPrefix starts the name of every network namespace Boot creates; the
// rest is the creating process's pid and a sequence number, so that
// SweepStale can tell leftovers of dead processes from live VMs.
const NetnsPrefix = "softroce-vm-"

// File is an extra file placed into the guest at boot, through a second
// initramfs archive appended to the cached base one (the kernel unpacks
// concatenated archives in order), so adding files never invalidates the
// cached image.
type File struct {
	// Path is the absolute path inside the guest. Put libraries under
	// /usr/lib, not /lib (a symlink in the guest).
	Path string
	// Src is a host file to copy; Data is used when Src is empty.
	Src  string
	Data []byte
	// Mode is the permission; 0 means 0755 for Src and 0644 for Data.
	Mode fs.FileMode
	// WithLibs also ships the shared libraries Src needs (DT_NEEDED,
	// transitively) that the base image lacks, taken from the host's
	// /lib/x86_64-linux-gnu and /usr/lib/x86_64-linux-gnu. Static
	// binaries need nothing.
	WithLibs bool
}

// Options configure one VM.
type Options struct {
	// MTU of the tap device and of the guest's eth0; 0 means 1500. rxe
	// derives its active MTU from the netdev's MTU: raise it to 9000 to
	// test a 4096-byte path MTU.
	MTU int
	// MemoryMB is the guest memory; 0 means 384.
	MemoryMB int
	// NICQueues is the number of queue pairs of the guest's virtio-net
	// eth0 (and of its multi-queue tap); 0 or 1 means one. With one vCPU
	// the guest uses one pair for traffic, and native XDP needs more:
	// XDP_TX and AF_XDP transmit on queues of their own.
	NICQueues int
	// Files are added to the guest. An executable /etc/softroce/init.d/*
	// among them runs at boot, after rxe0 exists.
	Files []File
	// Env words are added to the kernel command line as key=value; the
	// guest's init and its boot hooks see them as environment variables.
	Env map[string]string
	// HostPrograms shares the host's /usr and /etc, read-only over
	// virtio-9p, as the root of a chroot at HostRoot in the guest (with
	// the guest's own /proc, /sys, /dev and fresh /tmp, /run, /root and
	// /var): the distribution's application stacks the host has installed
	// (UCX, libfabric, MPI, qperf) run in the guest against kernel rxe
	// with Debian's libibverbs and rxe provider, without copying them
	// into the image. InHostRoot wraps a guest command to run there.
	HostPrograms bool
	// ReadyTimeout bounds the boot; 0 means 3 minutes (TCG on a busy
	// host can be slow).
	ReadyTimeout time.Duration
	// CommandPort is the guest's command server port; 0 means 7000.
	CommandPort int
	// Log receives progress lines; nil discards them.
	Log io.Writer
	// KeepDir keeps the VM's scratch directory (console log, initramfs)
	// after Close, for debugging.
	KeepDir bool
}

// VM is a running qemu guest with kernel rdma_rxe (device rxe0 on eth0),
// reachable only inside its own network namespace.
type VM struct {
	name    string
	dir     string
	opts    Options
	ns      netns.NsHandle
	qemu    *exec.Cmd
	qdone   chan struct{}
	qerr    error
	wd      *exec.Cmd
	wdIn    io.WriteCloser
	closing sync.Once
	closed  atomic.Bool
	console string // saved at Close
	logw    io.Writer

	tap      string       // host side of the guest's eth0
	guest    netip.Prefix // the guest's eth0 address
	mac      string       // the guest's eth0 MAC; empty: qemu's default
	sharedNs bool         // the namespace belongs to a Pair, not to this VM

	procMu sync.Mutex
	procs  map[*GuestProc]struct{} // started and not yet exited
}

var vmSeq atomic.Int64

// Boot starts img in a new network namespace and returns when the guest's
// rxe0 port is ACTIVE with its IPv4 GID (index 1) in place. On error
// everything created so far is removed again.
func Boot(ctx context.Context, img *Image, opts Options) (_ *VM, err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("rxevm: booting a VM needs root (network namespaces, tap)")
	}
	opts = opts.withDefaults()
	logw := opts.logw()
	sweepBeforeBoot(logw)
	name := newNetnsName()
	ns, err := createNetns(ctx, name, singleLayout(opts.MTU, opts.NICQueues))
	if err != nil {
		return nil, err
	}
	return boot(ctx, img, opts, vmNet{name: name, ns: ns, tap: TapName, guest: guestPrefix})
}

// withDefaults fills in the documented defaults.
func (opts Options) withDefaults() Options {
	if opts.MTU == 0 {
		opts.MTU = 1500
	}
	if opts.MemoryMB == 0 {
		opts.MemoryMB = 384
	}
	if opts.ReadyTimeout == 0 {
		opts.ReadyTimeout = 3 * time.Minute
	}
	if opts.CommandPort == 0 {
		opts.CommandPort = 7000
	}
	return opts
}

func (opts Options) logw() io.Writer {
	if opts.Log == nil {
		return io.Discard
	}
	return opts.Log
}

func sweepBeforeBoot(logw io.Writer) {
	if n, err := SweepStale(); err != nil {
		fmt.Fprintf(logw, "rxevm: sweeping stale VMs: %v\n", err)
	} else if n > 0 {
		fmt.Fprintf(logw, "rxevm: removed %d stale VM namespace(s)\n", n)
	}
}

func newNetnsName() string {
	return fmt.Sprintf("%s%d-%d", NetnsPrefix, os.Getpid(), vmSeq.Add(1))
}

// vmNet is where one guest's eth0 ends on the host: a tap in a namespace
// the VM owns (Boot) or shares with the other guest of a Pair.
type vmNet struct {
	name   string // namespace
	ns     netns.NsHandle
	tap    string
	guest  netip.Prefix
	mac    string
	shared bool
}

// boot starts one guest on n; it takes over n.ns. On error it removes what
// it created (and the namespace unless it is shared).
func boot(ctx context.Context, img *Image, opts Options, n vmNet) (_ *VM, err error) {
	logw := opts.logw()
	vm := &VM{name: n.name, opts: opts, ns: n.ns, logw: logw, qdone: make(chan struct{}),
		tap: n.tap, guest: n.guest, mac: n.mac, sharedNs: n.shared}
	dir, err := os.MkdirTemp("", n.name+"-"+n.tap+"-")
	if err != nil {
		vm.Close()
		return nil, fmt.Errorf("rxevm: create VM dir: %w", err)
	}
	vm.dir = dir
	defer func() {
		if err != nil {
			log := vm.consoleTail(40)
			vm.Close()
			err = fmt.Errorf("%w\n--- guest console (last lines) ---\n%s", err, log)
		}
	}()

	if opts.HostPrograms {
		opts.Files = append(slices.Clone(opts.Files), hostRootHook)
		vm.opts = opts
		// Unprivileged programs on the host reach the share through
		// the scratch directory, which they may not list.
		if err := os.Chmod(dir, 0o711); err != nil {
			return nil, fmt.Errorf("rxevm: %w", err)
		}
		if err := os.Mkdir(vm.SharedDir(), 0o777); err != nil {
			return nil, fmt.Errorf("rxevm: create shared dir: %w", err)
		}
		if err := os.Chmod(vm.SharedDir(), 0o1777); err != nil {
			return nil, fmt.Errorf("rxevm: %w", err)
		}
	}
	initrd := img.Initramfs
	if len(opts.Files) > 0 {
		initrd = filepath.Join(dir, "initramfs.cpio.gz")
		if err := writeInitrd(img, opts.Files, initrd, filepath.Join(dir, "extra.cpio.gz")); err != nil {
			return nil, err
		}
	}
	cmdline, err := vm.cmdline()
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(logw, "rxevm: booting %s in netns %s (%s, %s)\n", img.KernelVersion, n.name, n.tap, n.guest.Addr())
	if err := vm.startQemu(img.Kernel, initrd, cmdline); err != nil {
		return nil, err
	}
	if err := vm.startWatchdog(); err != nil {
		return nil, err
	}
	start := time.Now()
	if err := vm.waitReady(ctx); err != nil {
		return nil, err
	}
	fmt.Fprintf(logw, "rxevm: rxe0 of %s ACTIVE after %s\n", n.guest.Addr(), time.Since(start).Round(100*time.Millisecond))
	return vm, nil
}

func (vm *VM) cmdline() (string, error) {
	words := []string{"console=ttyS0", "quiet", "panic=-1",
		"sr_addr=" + vm.guest.String(),
		"sr_mtu=" + strconv.Itoa(vm.opts.MTU),
		"sr_port=" + strconv.Itoa(vm.opts.CommandPort)}
	for _, k := range slices.Sorted(maps.Keys(vm.opts.Env)) {
		v := vm.opts.Env[k]
		if !envKey.MatchString(k) || strings.ContainsAny(v, " \t\n\"'") {
			return "", fmt.Errorf("rxevm: kernel command-line env %q=%q: key must be a plain word, value without blanks or quotes", k, v)
		}
		words = append(words, k+"="+v)
	}
	return strings.Join(words, " "), nil
}

// writeInitrd writes the extra files as their own archive and appends it to
// a copy of the base archive.
func writeInitrd(img *Image, files []File, out, extra string) error {
	t := newTree()
	var roots []string
	for _, f := range files {
		if !strings.HasPrefix(f.Path, "/") {
			return fmt.Errorf("rxevm: extra file path %q is not absolute", f.Path)
		}
		mode := f.Mode
		if f.Src != "" {
			if mode == 0 {
				mode = 0o755
			}
			if _, err := os.Stat(f.Src); err != nil {
				return fmt.Errorf("rxevm: extra file: %w", err)
			}
			t.addFile(f.Path, f.Src, mode)
			if f.WithLibs {
				roots = append(roots, f.Src)
			}
		} else {
			if mode == 0 {
				mode = 0o644
			}
			t.addData(f.Path, f.Data, mode)
		}
	}
	if len(roots) > 0 {
		res := libResolver{dirs: []string{"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu"}}
		libs, _, err := res.closure(roots, func(so string) bool { return img.has(guestLibDir + "/" + so) })
		if err != nil {
			return fmt.Errorf("rxevm: libraries of extra files: %w", err)
		}
		for so, p := range libs {
			t.addFile(guestLibDir+"/"+so, p, 0o755)
		}
	}
	// Parent directories the base archive already has must not be
	// repeated: that is harmless for real directories, but /lib is a
	// symlink.
	for _, n := range t.names() {
		if t.entries[n].mode.IsDir() && img.has(n) {
			delete(t.entries, n)
		}
	}
	if err := t.writeGzipCpio(extra); err != nil {
		return err
	}
	dst, err := os.Create(out)
	if err != nil {
		return fmt.Errorf("create initramfs: %w", err)
	}
	for _, src := range []string{img.Initramfs, extra} {
		f, err := os.Open(src)
		if err != nil {
			dst.Close()
			return fmt.Errorf("concatenate initramfs: %w", err)
		}
		_, err = io.Copy(dst, f)
		f.Close()
		if err != nil {
			dst.Close()
			return fmt.Errorf("concatenate initramfs: %w", err)
		}
	}
	return dst.Close()
}

func (vm *VM) startQemu(kernel, initrd, cmdline string) error {
	cmd := exec.Command("qemu-system-x86_64", vm.qemuArgs(kernel, initrd, cmdline)...)
	qlog, err := os.Create(filepath.Join(vm.dir, "qemu.log"))
	if err != nil {
		return fmt.Errorf("create qemu log: %w", err)
	}
	defer qlog.Close()
	cmd.Stdout, cmd.Stderr = qlog, qlog
	// qemu dies with the process that started it, even on SIGKILL.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	// Pdeathsig fires when the thread that forked qemu ends, not the
	// process: on a pooled thread, any later goroutine that throws its
	// thread away (a namespace switch, as netnstest makes) could kill the
	// guest. This goroutine keeps its thread, locked, until qemu exits.
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := onThreadInNetns(vm.ns, cmd.Start); err != nil {
			started <- err
			return // the thread is discarded with the goroutine
		}
		started <- nil
		vm.qerr = cmd.Wait()
		close(vm.qdone)
	}()
	if err := <-started; err != nil {
		return fmt.Errorf("start qemu-system-x86_64: %w", err)
	}
	vm.qemu = cmd
	return nil
}

func (vm *VM) qemuArgs(kernel, initrd, cmdline string) []string {
	nic := "virtio-net-pci,netdev=n0,romfile="
	netdev := "tap,id=n0,ifname=" + vm.tap + ",script=no,downscript=no"
	if q := vm.opts.NICQueues; q > 1 {
		// One MSI-X vector per queue, one per direction, plus config
		// and control.
		netdev += ",queues=" + strconv.Itoa(q)
		nic += ",mq=on,vectors=" + strconv.Itoa(2*q+2)
	}
	if vm.mac != "" {
		// Two guests on one bridge need distinct MACs; qemu gives
		// every guest the same default one.
		nic += ",mac=" + vm.mac
	}
	args := []string{
		// KVM is not available for stock kernels here: TCG, one vCPU so
		// that the emulation leaves host cores for the host side.
		"-accel", "tcg,thread=multi", "-cpu", "qemu64", "-smp", "1",
		"-m", strconv.Itoa(vm.opts.MemoryMB),
		"-nodefaults", "-display", "none", "-no-reboot",
		"-kernel", kernel, "-initrd", initrd, "-append", cmdline,
		"-netdev", netdev,
		"-device", nic,
		"-serial", "file:" + vm.ConsoleLogPath(),
	}
	if vm.opts.HostPrograms {
		args = append(args, hostRootDevices(vm.SharedDir())...)
	}
	return append(args, "-monitor", "none")
}

// startWatchdog starts a shell outside the process group that waits for
// this process to die (its stdin is a pipe whose write end only this
// process holds) and then removes the qemu, the namespace and the scratch
// directory. It covers exits that run no cleanup: go test -timeout,
// SIGKILL, os.Exit.
func (vm *VM) startWatchdog() error {
	script := `read _ ; kill -9 "$1" 2>/dev/null; sleep 0.2; ip netns del "$2" 2>/dev/null; rm -rf "$3"`
	if vm.opts.KeepDir {
		script = `read _ ; kill -9 "$1" 2>/dev/null; sleep 0.2; ip netns del "$2" 2>/dev/null`
	}
	cmd := exec.Command("/bin/sh", "-c", script, "softroce-vm-watchdog", strconv.Itoa(vm.qemu.Process.Pid), vm.name, vm.dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	in, err := cmd.StdinPipe()
	if err != nil {
		return fmt.Errorf("start watchdog: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start watchdog: %w", err)
	}
	vm.wd, vm.wdIn = cmd, in
	return nil
}

func (vm *VM) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, vm.opts.ReadyTimeout)
	defer cancel()
	var last error
	for {
		select {
		case <-vm.qdone:
			return fmt.Errorf("rxevm: qemu exited during boot: %v (qemu log: %s)", vm.qerr, vm.readFile("qemu.log"))
		case <-ctx.Done():
			return fmt.Errorf("rxevm: guest not ready after %s: %w (last check: %v)", vm.opts.ReadyTimeout, ctx.Err(), last)
		case <-time.After(300 * time.Millisecond):
		}
		rctx, rcancel := context.WithTimeout(ctx, 20*time.Second)
		out, err := vm.Run(rctx, "cat /sys/class/infiniband/rxe0/ports/1/state /sys/class/infiniband/rxe0/ports/1/gids/1")
		rcancel()
		if err != nil {
			last = err
			continue
		}
		lines := strings.Fields(out)
		// "4: ACTIVE" then the IPv4-mapped GID, e.g. ::ffff:10.88.0.2.
		if len(lines) == 3 && lines[1] == "ACTIVE" && strings.HasSuffix(lines[2], gidSuffix(vm.guest.Addr())) {
			return nil
		}
		last = fmt.Errorf("rxe0 port/GID not ready: %q", out)
	}
}

// gidSuffix is how the sysfs GID file of an IPv4 address ends: the last
// two groups of its IPv4-mapped IPv6 form, e.g. "ffff:0a58:0002".
func gidSuffix(a netip.Addr) string {
	b := a.As4()
	return fmt.Sprintf("ffff:%02x%02x:%02x%02x", b[0], b[1], b[2], b[3])
}

// Name is the VM's name, also the name of its network namespace.
func (vm *VM) Name() string { return vm.name }

// Netns is the name of the VM's network namespace (see `ip netns`).
func (vm *VM) Netns() string { return vm.name }

// HostAddr is the address of the host side of the tap (in the namespace).
func (vm *VM) HostAddr() netip.Addr { return hostPrefix.Addr() }

// GuestAddr is the guest's eth0 address, the address of rxe0's GID 1.
func (vm *VM) GuestAddr() netip.Addr { return vm.guest.Addr() }

// QemuPID is the process id of the guest's qemu, for reading its host-side
// scheduling statistics (/proc/<pid>/task/*/schedstat).
func (vm *VM) QemuPID() int { return vm.qemu.Process.Pid }

// Tap is the name of the host side of the guest's eth0 in the namespace:
// TapName for a VM from Boot.
func (vm *VM) Tap() string { return vm.tap }

// MTU is the link MTU of the tap and the guest's eth0.
func (vm *VM) MTU() int { return vm.opts.MTU }

// Dir is the VM's scratch directory (console log, qemu log).
func (vm *VM) Dir() string { return vm.dir }

// ConsoleLogPath is the file the guest's serial console is written to.
func (vm *VM) ConsoleLogPath() string { return filepath.Join(vm.dir, "console.log") }

// ConsoleLog returns the guest's serial console output so far (or, after
// Close, as it was at Close).
func (vm *VM) ConsoleLog() string {
	if vm.closed.Load() {
		return vm.console
	}
	return vm.readFile("console.log")
}

func (vm *VM) readFile(name string) string {
	b, _ := os.ReadFile(filepath.Join(vm.dir, name))
	return string(b)
}

func (vm *VM) consoleTail(n int) string {
	lines := strings.Split(strings.TrimRight(vm.ConsoleLog(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Close kills qemu and removes the network namespace (with its tap) and the
// scratch directory. It is safe to call more than once.
func (vm *VM) Close() error {
	var errs []error
	vm.closing.Do(func() {
		vm.console = vm.readFile("console.log")
		vm.closed.Store(true)
		if vm.qemu != nil {
			vm.qemu.Process.Kill()
			select {
			case <-vm.qdone:
			case <-time.After(10 * time.Second):
				errs = append(errs, errors.New("rxevm: qemu did not exit after SIGKILL"))
			}
		}
		if vm.wd != nil {
			vm.wd.Process.Kill()
			vm.wdIn.Close()
			vm.wd.Wait()
		}
		if vm.ns >= 0 {
			vm.ns.Close()
		}
		if !vm.sharedNs {
			if err := deleteNamed(vm.name); err != nil && !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, fmt.Errorf("rxevm: delete netns %s: %w", vm.name, err))
			}
		}
		if !vm.opts.KeepDir && vm.dir != "" {
			if err := os.RemoveAll(vm.dir); err != nil {
				errs = append(errs, fmt.Errorf("rxevm: remove %s: %w", vm.dir, err))
			}
		}
	})
	return errors.Join(errs...)
}

// CloseOnSignal closes the VM when the process gets SIGINT or SIGTERM and
// then exits with status 130 (for command-line tools; tests rely on Close
// and the watchdog). The returned function uninstalls the handler.
func (vm *VM) CloseOnSignal() (stop func()) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case <-ch:
			vm.Close()
			os.Exit(130)
		case <-done:
		}
	}()
	return func() { signal.Stop(ch); close(done) }
}

// Alive reports whether qemu is still running.
func (vm *VM) Alive() bool {
	select {
	case <-vm.qdone:
		return false
	default:
		return vm.qemu != nil
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func randToken() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// envKey is what a kernel command-line word must look like to reach init
// as an environment variable (no dots: those are module parameters).
var envKey = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
