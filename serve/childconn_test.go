package serve

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/user"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// childConn speaks the control protocol raw from a child process, where
// there is no *testing.T: every failure is an error.
type childConn struct{ c *net.UnixConn }

func childDial() (*childConn, error) {
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: os.Getenv("SOFTROCE_SOCKET"), Net: "unixpacket"})
	if err != nil {
		return nil, err
	}
	return &childConn{c}, nil
}

func (c *childConn) send(op uint32, body []byte, fds ...int) error {
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	msg := append(le.AppendUint32(le.AppendUint32(nil, op), 0), body...)
	_, _, err := c.c.WriteMsgUnix(msg, oob, nil)
	return err
}

func (c *childConn) recv() (syscall.Errno, []byte, []int, error) {
	buf := make([]byte, maxMsg)
	ob := make([]byte, unix.CmsgSpace(4*4))
	n, on, _, _, err := c.c.ReadMsgUnix(buf, ob)
	if err != nil || n < sizeResp {
		return 0, nil, nil, fmt.Errorf("read answer: %d bytes, %v", n, err)
	}
	return syscall.Errno(le.Uint32(buf)), buf[sizeResp:n], parseFDs(ob[:on]), nil
}

func (c *childConn) call(op uint32, body []byte, fds ...int) (syscall.Errno, []byte, []int, error) {
	if err := c.send(op, body, fds...); err != nil {
		return 0, nil, nil, err
	}
	return c.recv()
}

// handle runs op and returns the handle its answer begins with.
func (c *childConn) handle(op uint32, body []byte) (uint32, []byte, error) {
	e, b, fds, err := c.call(op, body)
	closeAll(fds)
	if err == nil && (e != 0 || len(b) < 4) {
		err = fmt.Errorf("op %d: %v", op, e)
	}
	if err != nil {
		return 0, nil, err
	}
	return le.Uint32(b), b, nil
}

// open opens device 0 and keeps its doorbell and event pipe.
func (c *childConn) open() error {
	e, _, fds, err := c.call(opOpen, u32s(0, 0))
	if err == nil && (e != 0 || len(fds) != 2) {
		err = fmt.Errorf("OPEN: %v, %d fds", e, len(fds))
	}
	return err
}

// childLines reads a child's stdout line by line into a channel.
func childLines(r *bufio.Reader) <-chan string {
	ch := make(chan string, 16)
	go func() {
		defer close(ch)
		for {
			l, err := r.ReadString('\n')
			if err != nil {
				return
			}
			ch <- strings.TrimSpace(l)
		}
	}()
	return ch
}

// expectLine waits for the next line of a child, failing on another one,
// on the child's end or after d.
func expectLine(t *testing.T, ch <-chan string, prefix string, d time.Duration) string {
	t.Helper()
	select {
	case l, ok := <-ch:
		if !ok {
			t.Fatalf("the child ended before saying %q", prefix)
		}
		if !strings.HasPrefix(l, prefix) {
			t.Fatalf("the child said %q, want %q", l, prefix)
		}
		return l
	case <-time.After(d):
		t.Fatalf("the child did not say %q within %v", prefix, d)
	}
	return ""
}

// otherUsers starts a daemon on a socket group nogroup may use and
// returns it with the credentials of two users of that group (uids 1001
// and 1002, no passwd entries needed).
func otherUsers(t *testing.T) (s *Server, u1001, u1002 *syscall.Credential) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to run processes as other users")
	}
	g, err := user.LookupGroup("nogroup")
	if err != nil {
		t.Skip("no group nogroup")
	}
	gid, _ := strconv.Atoi(g.Gid)
	s = startUDPOn(t, Config{Socket: sharedSocket(t), Group: "nogroup"})
	return s, &syscall.Credential{Uid: 1001, Gid: uint32(gid)}, &syscall.Credential{Uid: 1002, Gid: uint32(gid)}
}
