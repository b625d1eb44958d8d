package serve

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// DaemonUIDEnv names the environment variable that lets a client use a
// daemon run by another user (a shared daemon started with --group): a uid
// or a user name. Without it a client accepts only a daemon of its own
// uid or of root. abi/c/softroce_sock.h reads the same variable.
const DaemonUIDEnv = "SOFTROCE_DAEMON_UID"

// DefaultSocket is where clients look for the daemon by default:
// $SOFTROCE_SOCKET if set, else the socket of the daemon's uid in this
// network namespace (SocketFor), the daemon's uid being
// $SOFTROCE_DAEMON_UID if set, else the caller's own. A daemon listens
// on SocketFor(its own uid) unless told otherwise.
func DefaultSocket() string {
	if p := os.Getenv("SOFTROCE_SOCKET"); p != "" {
		return p
	}
	uid := os.Geteuid()
	if u, ok, err := DaemonUID(); err == nil && ok {
		uid = u
	}
	return SocketFor(uid)
}

// SocketFor is the default socket of a daemon run by uid in the caller's
// network namespace: /run/softroce/softroce-net<INODE>.sock for root,
// else $TMPDIR/softroce-<UID>/softroce-net<INODE>.sock ($TMPDIR defaults
// to /tmp), where INODE is the inode of /proc/self/ns/net. It depends on
// uid and the namespace only, not on who asks: root and other users find
// the same shared daemon, and a daemon in each namespace gets its own
// socket. The C library computes the same path.
func SocketFor(uid int) string {
	dir := "/run/softroce"
	if uid != 0 {
		tmp := os.Getenv("TMPDIR")
		if tmp == "" {
			tmp = "/tmp"
		}
		dir = filepath.Join(tmp, "softroce-"+strconv.Itoa(uid))
	}
	name := "softroce.sock"
	if ns, ok := ownNetNS(); ok {
		name = fmt.Sprintf("softroce-net%d.sock", ns.Ino)
	}
	return filepath.Join(dir, name)
}

// DaemonUID is the uid $SOFTROCE_DAEMON_UID names; ok is false when it is
// unset.
func DaemonUID() (uid int, ok bool, err error) {
	v := os.Getenv(DaemonUIDEnv)
	if v == "" {
		return 0, false, nil
	}
	if n, err := strconv.ParseUint(v, 10, 32); err == nil {
		return int(n), true, nil
	}
	u, err := user.Lookup(v)
	if err != nil {
		return 0, false, fmt.Errorf("%s=%s: no such user", DaemonUIDEnv, v)
	}
	n, err := strconv.Atoi(u.Uid)
	if err != nil {
		return 0, false, fmt.Errorf("%s=%s: uid %q", DaemonUIDEnv, v, u.Uid)
	}
	return n, true, nil
}

// NetNS identifies a network namespace: the device and inode of its
// nsfs file (/proc/PID/ns/net).
type NetNS struct{ Dev, Ino uint64 }

func (n NetNS) String() string { return fmt.Sprintf("net:[%d]", n.Ino) }

// ownNetNS is the calling thread's network namespace (a Go program may
// run a thread in another namespace, as tests do).
func ownNetNS() (NetNS, bool) {
	var st unix.Stat_t
	if unix.Stat("/proc/thread-self/ns/net", &st) != nil && unix.Stat("/proc/self/ns/net", &st) != nil {
		return NetNS{}, false
	}
	return NetNS{Dev: st.Dev, Ino: st.Ino}, true
}

// RefusedError is a daemon a client will not use: it runs as another user
// or serves another network namespace.
type RefusedError struct {
	Path   string
	UID    int   // the daemon's uid
	NetNS  NetNS // the daemon's namespace, when that is the reason
	Reason string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("refusing the daemon on %s: %s", e.Path, e.Reason)
}

// Dial connects to the daemon on path and checks it before anything is
// sent: its uid (SO_PEERCRED) is the caller's, root's or the one
// $SOFTROCE_DAEMON_UID names, and its HELLO says it serves the caller's
// network namespace. Every Go client of the daemon dials through here, as
// the C library does through sr_connect.
func Dial(path string) (*net.UnixConn, error) {
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("no daemon on %s: %w", path, err)
	}
	if err := checkDaemon(c, path); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func checkDaemon(c *net.UnixConn, path string) error {
	uid, err := PeerUID(c)
	if err != nil {
		return fmt.Errorf("the daemon on %s: credentials: %w", path, err)
	}
	me := os.Geteuid()
	if uid != me && uid != 0 {
		want, named, err := DaemonUID()
		if err != nil {
			return &RefusedError{Path: path, UID: uid, Reason: fmt.Sprintf(
				"it runs as uid %d and %v; set %s=%d if you trust that user's daemon", uid, err, DaemonUIDEnv, uid)}
		}
		if named && uid == want {
			return helloCheck(c, path, uid)
		}
		return &RefusedError{Path: path, UID: uid, Reason: fmt.Sprintf(
			"it runs as uid %d, not as you (uid %d) or root; set %s=%d if you trust that user's daemon", uid, me, DaemonUIDEnv, uid)}
	}
	return helloCheck(c, path, uid)
}

// helloCheck says HELLO and checks the daemon serves the caller's network
// namespace.
func helloCheck(c *net.UnixConn, path string, uid int) error {
	req := le.AppendUint32(le.AppendUint32(nil, opHello), 0)
	req = le.AppendUint32(le.AppendUint32(req, protoVersion), 0)
	if _, err := c.Write(req); err != nil {
		return fmt.Errorf("the daemon on %s: %w", path, err)
	}
	b := make([]byte, maxMsg+1)
	n, err := c.Read(b)
	if err != nil {
		return fmt.Errorf("the daemon on %s: %w", path, err)
	}
	if n < sizeResp {
		return fmt.Errorf("the daemon on %s: short HELLO answer", path)
	}
	if e := le.Uint32(b); e != 0 {
		return fmt.Errorf("the daemon on %s refused HELLO (protocol version %d): %w; restart it from this softroce", path, protoVersion, syscall.Errno(e))
	}
	b = b[sizeResp:n]
	if len(b) < sizeHelloResp {
		return fmt.Errorf("the daemon on %s: short HELLO answer", path)
	}
	theirs := NetNS{Dev: le.Uint64(b[8:]), Ino: le.Uint64(b[16:])}
	if mine, ok := ownNetNS(); ok && theirs != (NetNS{}) && theirs != mine {
		return &RefusedError{Path: path, UID: uid, NetNS: theirs, Reason: fmt.Sprintf(
			"it serves network namespace %v and this program is in %v; start a daemon in this namespace (softroce serve) or point SOFTROCE_SOCKET at the one that serves it", theirs, mine)}
	}
	return nil
}

// PeerUID is the uid of the process on c's other end (SO_PEERCRED): for
// a connection Dial made, the daemon's.
func PeerUID(c syscall.Conn) (int, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var serr error
	if err := rc.Control(func(fd uintptr) {
		cred, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if serr != nil {
		return 0, serr
	}
	return int(cred.Uid), nil
}

// errUnsafeDir is a socket directory the daemon will not use.
var errUnsafeDir = errors.New("unsafe socket directory")

// socketDir makes sure the socket's directory is the daemon's own and
// only the daemon's user can write it: else another user could replace
// the socket with theirs. It creates a missing directory 0700, or 0711
// with group (the group's members need to reach the socket, never to
// write next to it).
func socketDir(dir string, group bool) error {
	mode := os.FileMode(0o700)
	if group {
		mode = 0o711
	}
	if _, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
			return fmt.Errorf("serve: socket directory: %w", err)
		}
		if err := os.Mkdir(dir, mode); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("serve: socket directory: %w", err)
		}
		if err := os.Chmod(dir, mode); err != nil { // whatever the umask
			return fmt.Errorf("serve: socket directory: %w", err)
		}
	}
	me := os.Geteuid()
	var lst, st unix.Stat_t
	if err := unix.Lstat(dir, &lst); err != nil {
		return fmt.Errorf("serve: socket directory: %w", err)
	}
	if lst.Mode&unix.S_IFMT == unix.S_IFLNK && int(lst.Uid) != me && lst.Uid != 0 {
		return fmt.Errorf("serve: %w %s: it is a symbolic link of uid %d, who could point it elsewhere; remove it or choose another --socket", errUnsafeDir, dir, lst.Uid)
	}
	if err := unix.Stat(dir, &st); err != nil {
		return fmt.Errorf("serve: socket directory: %w", err)
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		return fmt.Errorf("serve: %w %s: not a directory", errUnsafeDir, dir)
	case int(st.Uid) != me:
		return fmt.Errorf("serve: %w %s: it belongs to uid %d, not to the daemon's user (uid %d), who could replace the socket; remove it (or ask its owner or root to) or choose another --socket", errUnsafeDir, dir, st.Uid, me)
	case st.Mode&0o022 != 0:
		return fmt.Errorf("serve: %w %s: mode %04o lets other users replace the socket; chmod go-w %s or choose another --socket", errUnsafeDir, dir, st.Mode&0o7777, dir)
	}
	return nil
}

// devNetNS is the network namespace of the first device's socket, which
// may differ from the daemon's own when its links were opened in
// another namespace (asking a socket needs CAP_NET_ADMIN there), else the
// namespace of the thread that calls it.
func (s *Server) devNetNS() NetNS {
	if sc, ok := s.devs[0].v.Link().(interface{ ControlSocket(func(fd uintptr)) error }); ok {
		var ns NetNS
		sc.ControlSocket(func(fd uintptr) {
			nfd, err := unix.IoctlRetInt(int(fd), unix.SIOCGSKNS)
			if err != nil {
				return
			}
			var st unix.Stat_t
			if unix.Fstat(nfd, &st) == nil {
				ns = NetNS{Dev: st.Dev, Ino: st.Ino}
			}
			unix.Close(nfd)
		})
		if ns != (NetNS{}) {
			return ns
		}
	}
	ns, _ := ownNetNS()
	return ns
}
