package main

import (
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/serve"
)

// UCX lists an IB device only when /dev/infiniband/<ibv_device.dev_name>
// is a character device the program may read and write (it stat()s and
// access()es it, and opens nothing). softroce's devices have no kernel
// node, so softroce run gives the program a mount namespace — and, unless
// the caller is root, a user namespace mapping the caller's uid and gid to
// themselves — in which /dev is a tmpfs holding the original entries,
// bind-mounted back, and /dev/infiniband/uverbsN, one per device, is bound
// to /dev/null. docs/abi.md, "UCX and the device node", says what else
// changes for the program.

// devNodeChild is the hidden command that runs inside the new namespaces:
// it makes the nodes, then becomes the program.
const devNodeChild = "__run-devnodes"

func init() { hidden[devNodeChild] = runDevNodeChild }

// devNodeCount is how many /dev/infiniband nodes the program should get
// from a namespace: the daemon's device count, or 0 when it needs none
// (no device, or every node exists already) or cannot use one, which it
// says on stderr.
func devNodeCount(path string) int {
	c, err := serve.Dial(path)
	if err != nil {
		return 0
	}
	uid, err := serve.PeerUID(c)
	c.Close()
	if err != nil {
		return 0
	}
	st, err := serve.QueryStatus(path)
	if err != nil || len(st.Devices) == 0 || !devNodesMissing(len(st.Devices)) {
		return 0
	}
	if me := os.Geteuid(); me != 0 && uid != me {
		// In a user namespace that maps only the caller, the daemon's uid
		// reads as the overflow uid and the library would refuse it.
		fmt.Fprintf(os.Stderr, "softroce run: the daemon runs as uid %d, not as you (uid %d): no /dev/infiniband for the program; programs that look for the device node there (UCX) will not see softroce's devices\n", uid, me)
		return 0
	}
	return len(st.Devices)
}

// devNodesMissing says whether UCX's check fails for one of the first n
// nodes.
func devNodesMissing(n int) bool {
	for i := range n {
		p := fmt.Sprintf("/dev/infiniband/uverbs%d", i)
		var st unix.Stat_t
		if unix.Stat(p, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || unix.Access(p, unix.R_OK|unix.W_OK) != nil {
			return true
		}
	}
	return false
}

// devNodeCommand runs bin (argv) through devNodeChild in a new mount
// namespace, and a new user namespace unless the caller is root (who
// keeps its privileges over other users' files that way).
func devNodeCommand(self string, ndev int, bin string, argv []string) *exec.Cmd {
	cmd := exec.Command(self, append([]string{devNodeChild, strconv.Itoa(ndev), bin}, argv...)...)
	attr := &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}
	if uid := os.Geteuid(); uid != 0 {
		gid := os.Getegid()
		attr.Cloneflags |= syscall.CLONE_NEWUSER
		attr.UidMappings = []syscall.SysProcIDMap{{ContainerID: uid, HostID: uid, Size: 1}}
		attr.GidMappings = []syscall.SysProcIDMap{{ContainerID: gid, HostID: gid, Size: 1}}
		// The helper keeps CAP_SYS_ADMIN of its own user namespace across
		// its exec to mount; the program gets no capability.
		attr.AmbientCaps = []uintptr{unix.CAP_SYS_ADMIN}
	}
	cmd.SysProcAttr = attr
	return cmd
}

// runDevNodeChild: NDEV PATH ARGV0 ARGS...
func runDevNodeChild(args []string) int {
	if len(args) < 3 {
		fmt.Fprintf(os.Stderr, "softroce: %s is softroce run's own helper\n", devNodeChild)
		return 2
	}
	ndev, err := strconv.Atoi(args[0])
	if err != nil {
		return 2
	}
	// The capabilities dropped below are this thread's, and exec runs on it.
	runtime.LockOSThread()
	if err := makeDevNodes(ndev); err != nil {
		fmt.Fprintf(os.Stderr, "softroce run: no /dev/infiniband for the program (%v); programs that look for the device node there (UCX) will not see softroce's devices\n", err)
	}
	if os.Geteuid() != 0 {
		dropCaps()
	}
	err = syscall.Exec(args[1], args[2:], os.Environ())
	fmt.Fprintf(os.Stderr, "softroce run: exec %s: %v\n", args[1], err)
	return 126
}

// dropCaps leaves the calling thread no capability to pass on: an exec
// by a uid other than 0 then keeps none.
func dropCaps() {
	unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if unix.Capget(&hdr, &data[0]) == nil {
		for i := range data {
			data[i].Inheritable = 0
		}
		unix.Capset(&hdr, &data[0])
	}
}

// makeDevNodes puts a tmpfs over /dev, binds every original entry back
// (directories recursively, so /dev/pts and /dev/shm keep their mounts;
// symbolic links are copied) and adds /dev/infiniband/uverbs0..ndev-1,
// each bound to /dev/null, then makes the tmpfs read-only. On failure
// /dev is left as it was.
func makeDevNodes(ndev int) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("private mounts: %w", err)
	}
	type entry struct {
		name, link string
		mode       fs.FileMode
	}
	des, err := os.ReadDir("/dev")
	if err != nil {
		return err
	}
	var ents []entry
	for _, de := range des {
		// softroce's nodes take the place of a host's own: the program
		// sees only softroce's devices, numbered from 0.
		if de.Name() == "infiniband" {
			continue
		}
		fi, err := de.Info()
		if err != nil {
			continue // gone meanwhile
		}
		e := entry{name: de.Name(), mode: fi.Mode()}
		if e.mode&fs.ModeSymlink != 0 {
			if e.link, err = os.Readlink("/dev/" + e.name); err != nil {
				return err
			}
		}
		ents = append(ents, e)
	}
	old, err := unix.Open("/dev", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(old)
	from := func(name string) string { return fmt.Sprintf("/proc/self/fd/%d/%s", old, name) }
	if err := unix.Mount("softroce", "/dev", "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "mode=755,size=64k"); err != nil {
		return fmt.Errorf("tmpfs on /dev: %w", err)
	}
	fail := func(err error) error {
		unix.Unmount("/dev", unix.MNT_DETACH)
		return err
	}
	bind := func(src, dst string, dir bool, perm fs.FileMode) error {
		if dir {
			if err := os.Mkdir(dst, perm); err != nil {
				return err
			}
			return unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, "")
		}
		f, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o600)
		if err != nil {
			return err
		}
		f.Close()
		return unix.Mount(src, dst, "", unix.MS_BIND, "")
	}
	for _, e := range ents {
		dst := "/dev/" + e.name
		var err error
		if e.mode&fs.ModeSymlink != 0 {
			err = os.Symlink(e.link, dst)
		} else {
			err = bind(from(e.name), dst, e.mode.IsDir(), e.mode.Perm())
		}
		if err != nil {
			return fail(fmt.Errorf("%s: %w", dst, err))
		}
	}
	if err := os.Mkdir("/dev/infiniband", 0o755); err != nil {
		return fail(err)
	}
	for i := range ndev {
		if err := bind(from("null"), fmt.Sprintf("/dev/infiniband/uverbs%d", i), false, 0); err != nil {
			return fail(fmt.Errorf("/dev/infiniband/uverbs%d: %w", i, err))
		}
	}
	if err := unix.Mount("", "/dev", "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NOEXEC, ""); err != nil {
		return fail(fmt.Errorf("read-only /dev: %w", err))
	}
	return nil
}
