package serve

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func init() {
	// hijackConn connects to the daemon, hands the connection to its
	// parent over descriptor 3 and exits: the connection's SO_PEERCRED pid
	// is then free for another process.
	childRoles["hijack-conn"] = func() int {
		c, err := childDial()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		f, err := c.c.File()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if err := unix.Sendmsg(3, []byte{1}, unix.UnixRights(int(f.Fd())), nil, 0); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return 0
	}
	// hijacker holds a connection made by its exited child (it says "pid
	// P" with the child's pid), makes it an rdma_cm channel, and on
	// "attack QPN" tries ATTACH_QP of that QP with no token and a guessed
	// one ("attack E1 E2", the errnos). Then it checks the same rule on
	// its own QP from another connection: no token, then the right one
	// ("own E1 E2").
	childRoles["hijacker"] = func() int {
		fail := func(err error) int { fmt.Println("error", err); return 1 }
		sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_DGRAM, 0)
		if err != nil {
			return fail(err)
		}
		exe, _ := os.Executable()
		cmd := exec.Command(exe)
		cmd.Env = append(os.Environ(), childEnv+"=hijack-conn")
		cmd.ExtraFiles = []*os.File{os.NewFile(uintptr(sp[1]), "sp")}
		cmd.Stderr = os.Stderr
		if err := cmd.Run(); err != nil {
			return fail(fmt.Errorf("hijack-conn: %v", err))
		}
		oob := make([]byte, unix.CmsgSpace(4))
		_, on, _, _, err := unix.Recvmsg(sp[0], make([]byte, 1), oob, 0)
		if err != nil {
			return fail(err)
		}
		fds := parseFDs(oob[:on])
		if len(fds) != 1 {
			return fail(fmt.Errorf("got %d descriptors", len(fds)))
		}
		fc, err := net.FileConn(os.NewFile(uintptr(fds[0]), "conn"))
		if err != nil {
			return fail(err)
		}
		held := &childConn{fc.(*net.UnixConn)}
		cmID := func(c *childConn) (uint32, error) {
			if e, _, fds, err := c.call(opCMOpen, make([]byte, sizeCMReq)); err != nil || e != 0 {
				return 0, fmt.Errorf("CM_OPEN: %v %v", e, err)
			} else {
				closeAll(fds)
			}
			b := make([]byte, sizeCMReq)
			le.PutUint32(b[4:], psTCP)
			id, _, err := c.handle(opCMCreateID, b)
			if err != nil {
				return 0, err
			}
			b = make([]byte, sizeCMReq)
			le.PutUint32(b, id)
			copy(b[40+sizeSockaddr:], appendSockaddr(nil, netip.MustParseAddrPort("127.0.0.1:7471")))
			if _, _, err := c.handle(opCMResolveAddr, b); err != nil {
				return 0, err
			}
			return id, nil
		}
		attach := func(c *childConn, id, qpn uint32, token uint64) syscall.Errno {
			b := make([]byte, sizeCMReq)
			le.PutUint32(b, id)
			le.PutUint32(b[12:], qpn)
			le.PutUint64(b[40+2*sizeSockaddr+cmPrivate:], token)
			e, _, fds, err := c.call(opCMAttachQP, b)
			closeAll(fds)
			if err != nil {
				return syscall.EIO
			}
			return e
		}
		hid, err := cmID(held)
		if err != nil {
			return fail(err)
		}
		fmt.Println("pid", cmd.Process.Pid)
		in := bufio.NewReader(os.Stdin)
		l, _ := in.ReadString('\n')
		var qpn uint32
		if _, err := fmt.Sscanf(l, "attack %d", &qpn); err != nil {
			return fail(fmt.Errorf("stdin said %q", l))
		}
		fmt.Println("attack", int(attach(held, hid, qpn, 0)), int(attach(held, hid, qpn, 0x5eed5eed5eed5eed)))

		// The same rule on this process's own QP.
		v, err := childDial()
		if err != nil {
			return fail(err)
		}
		_, qpn, token, err := v.rcQP()
		if err != nil {
			return fail(err)
		}
		cm, err := childDial()
		if err != nil {
			return fail(err)
		}
		id, err := cmID(cm)
		if err != nil {
			return fail(err)
		}
		fmt.Println("own", int(attach(cm, id, qpn, 0)), int(attach(cm, id, qpn, token)))
		return 0
	}
	// hijackVictim creates an RC QP (it says "qpn N") and on "check"
	// says "state S", the QP's state.
	childRoles["hijack-victim"] = func() int {
		fail := func(err error) int { fmt.Println("error", err); return 1 }
		c, err := childDial()
		if err != nil {
			return fail(err)
		}
		h, qpn, _, err := c.rcQP()
		if err != nil {
			return fail(err)
		}
		fmt.Println("qpn", qpn)
		bufio.NewReader(os.Stdin).ReadString('\n')
		_, b, err := c.handle(opQueryQP, u32s(h, 0))
		if err != nil {
			return fail(err)
		}
		fmt.Println("state", le.Uint32(b))
		return 0
	}
}

// rcQP opens device 0 and creates an RC QP; it returns the QP's handle,
// number and token.
func (c *childConn) rcQP() (h, qpn uint32, token uint64, err error) {
	if err = c.open(); err != nil {
		return
	}
	pd, _, err := c.handle(opAllocPD, nil)
	if err != nil {
		return
	}
	cq, _, err := c.handle(opCreateCQ, u32s(16, 0))
	if err != nil {
		return
	}
	h, b, err := c.handle(opCreateQP, u32s(pd, cq, cq, 2, 4, 4, 1, 1, 0, 0))
	if err != nil {
		return
	}
	if len(b) != sizeQP {
		return 0, 0, 0, fmt.Errorf("CREATE_QP answered %d bytes, want %d", len(b), sizeQP)
	}
	return h, le.Uint32(b[4:]), le.Uint64(b[72:]), nil
}

// A connection whose process exited keeps that process's pid; another
// user's program that gets the pid must not have its QP taken through
// that connection, whatever token is guessed. Nor may a connection of
// the QP's own process take it without the token.
func TestAttachQPNotByReusedPID(t *testing.T) {
	s, u1001, u1002 := otherUsers(t)
	sock := "SOFTROCE_SOCKET=" + s.Socket()
	for attempt := 0; ; attempt++ {
		if attempt == 10 {
			t.Fatal("in 10 attempts the victim never got the pid of the attacker's exited child")
		}
		ain, aout := piped(t, childCmd(t, "hijacker", u1002, sock))
		l := expectLine(t, aout, "pid ", 30*time.Second)
		p, _ := strconv.Atoi(strings.TrimPrefix(l, "pid "))
		victim := childCmd(t, "hijack-victim", u1001, sock)
		// The next pid the kernel gives is P: the victim's, unless
		// another fork takes it first (then all again).
		if err := os.WriteFile("/proc/sys/kernel/ns_last_pid", []byte(strconv.Itoa(p-1)), 0); err != nil {
			t.Skipf("cannot choose the next pid: %v", err)
		}
		vin, vout := piped(t, victim)
		if victim.Process.Pid != p {
			victim.Process.Kill()
			ain.Close()
			continue
		}
		l = expectLine(t, vout, "qpn ", 30*time.Second)
		qpn, _ := strconv.Atoi(strings.TrimPrefix(l, "qpn "))
		fmt.Fprintln(ain, "attack", qpn)
		l = expectLine(t, aout, "attack ", 30*time.Second)
		if want := fmt.Sprintf("attack %d %d", int(syscall.EINVAL), int(syscall.EINVAL)); l != want {
			t.Errorf("uid 1002 through a connection of pid %d (now uid 1001's) attached uid 1001's QP %d: %q, want %q", p, qpn, l, want)
		}
		fmt.Fprintln(vin, "check")
		if l := expectLine(t, vout, "state ", 30*time.Second); l != "state 0" {
			t.Errorf("the victim's QP is in %q, want RESET (0): another user moved it", l)
		}
		l = expectLine(t, aout, "own ", 30*time.Second)
		if want := fmt.Sprintf("own %d 0", int(syscall.EINVAL)); l != want {
			t.Errorf("ATTACH_QP of the process's own QP without and with its token: %q, want %q", l, want)
		}
		return
	}
}
