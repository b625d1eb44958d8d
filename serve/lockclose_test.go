package serve

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func init() {
	// lingerRegMR passes, as the memfd of a REG_MR, a TCP socket with
	// SO_LINGER whose send queue cannot drain (the peer, its own, reads
	// nothing): the last close of that socket blocks for the linger time.
	// It says "sent", then "closed" once its own copy is closed (the
	// daemon's is then the last), and on "drain" on stdin whether the
	// REG_MR was answered before it let the peer read ("early" or
	// "late", with the errno).
	childRoles["linger-regmr"] = func() int {
		fail := func(err error) int { fmt.Println("error", err); return 1 }
		c, err := childDial()
		if err != nil {
			return fail(err)
		}
		if err := c.open(); err != nil {
			return fail(err)
		}
		pd, _, err := c.handle(opAllocPD, nil)
		if err != nil {
			return fail(err)
		}
		lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
			return rc.Control(func(fd uintptr) { unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 4096) })
		}}
		ln, err := lc.Listen(context.Background(), "tcp4", "127.0.0.1:0")
		if err != nil {
			return fail(err)
		}
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
		if err != nil {
			return fail(err)
		}
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF, 4096)
		port := ln.Addr().(*net.TCPAddr).Port
		if err := unix.Connect(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}, Port: port}); err != nil {
			return fail(err)
		}
		peer, err := ln.Accept()
		if err != nil {
			return fail(err)
		}
		unix.SetNonblock(fd, true)
		chunk := make([]byte, 1<<16)
		for {
			if _, err := unix.Write(fd, chunk); err == unix.EAGAIN {
				break
			} else if err != nil {
				return fail(err)
			}
		}
		unix.SetNonblock(fd, false)
		if err := unix.SetsockoptLinger(fd, unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 60}); err != nil {
			return fail(err)
		}
		const va = 1 << 30
		answered := make(chan syscall.Errno, 1)
		result := make(chan string, 1)
		go func() {
			in := bufio.NewReader(os.Stdin)
			if l, _ := in.ReadString('\n'); strings.TrimSpace(l) != "drain" {
				result <- fmt.Sprintf("error stdin said %q", l)
				return
			}
			select {
			case e := <-answered:
				result <- fmt.Sprint("early ", int(e))
				return
			default:
			}
			go io.Copy(io.Discard, peer)
			select {
			case e := <-answered:
				result <- fmt.Sprint("late ", int(e))
			case <-time.After(2 * time.Minute):
				result <- "error REG_MR unanswered 2 minutes after the peer drained"
			}
		}()
		// The daemon must not take the REG_MR before this process closed
		// its own copy of the socket (or this close would be the last, the
		// lingering one): it is queued behind hundreds of requests whose
		// answers fill the daemon's socket buffer, so the daemon waits to
		// write until this process reads them.
		ahead, err := c.stall()
		if err != nil {
			return fail(err)
		}
		if err := c.send(opRegMR, regMRBody(pd, va, pageSize, extent{va: va, len: pageSize}), fd); err != nil {
			return fail(err)
		}
		// At once: the message in flight holds a reference, so this close
		// does not linger unless the daemon has closed its copy already.
		unix.Close(fd)
		fmt.Println("sent")
		fmt.Println("closed")
		go func() {
			for range ahead {
				if _, _, _, err := c.recv(); err != nil {
					answered <- syscall.EIO
					return
				}
			}
			e, _, fds, err := c.recv()
			closeAll(fds)
			if err != nil {
				e = syscall.EIO
			}
			answered <- e
		}()
		r := <-result
		fmt.Println(r)
		if strings.HasPrefix(r, "error") {
			return 1
		}
		return 0
	}
	// queryDevice opens the device, says "ready", and on "go" on stdin
	// asks QUERY_DEVICE and says "answered" with the errno.
	childRoles["query-device"] = func() int {
		c, err := childDial()
		if err == nil {
			err = c.open()
		}
		if err != nil {
			fmt.Println("error", err)
			return 1
		}
		fmt.Println("ready")
		bufio.NewReader(os.Stdin).ReadString('\n')
		e, _, _, err := c.call(opQueryDevice, nil)
		if err != nil {
			fmt.Println("error", err)
			return 1
		}
		fmt.Println("answered", int(e))
		return 0
	}
}

// stall sends QUERY_DEVICE requests without reading the answers until
// the daemon stops taking them (it waits to write answers this process
// does not read), then reads a few so that one more request fits. It
// returns how many answers are still to be read.
func (c *childConn) stall() (int, error) {
	rc, err := c.c.SyscallConn()
	if err != nil {
		return 0, err
	}
	msg := le.AppendUint32(le.AppendUint32(nil, opQueryDevice), 0)
	sent := 0
	for {
		var serr error
		rc.Write(func(fd uintptr) bool {
			serr = unix.Sendmsg(int(fd), msg, nil, nil, unix.MSG_DONTWAIT)
			return true
		})
		if serr == unix.EAGAIN {
			break
		}
		if serr != nil {
			return 0, serr
		}
		if sent++; sent > 1<<16 {
			return 0, fmt.Errorf("the daemon took %d requests without its answers being read", sent)
		}
	}
	const read = 16
	for range read {
		if _, _, _, err := c.recv(); err != nil {
			return 0, err
		}
	}
	return sent - read, nil
}

// piped starts cmd with its stdin and stdout piped; the process is killed
// when the test ends.
func piped(t *testing.T, cmd *exec.Cmd) (io.WriteCloser, <-chan string) {
	t.Helper()
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return in, childLines(bufio.NewReader(out))
}

// A client whose REG_MR descriptor blocks in close (a lingering socket
// passed as a memfd) stalls only itself: another user's process is
// answered, and another user's ibv_rc_pingpong pair runs 5000
// iterations, while the daemon's close of that descriptor is still
// pending, which is before the hostile REG_MR is answered.
func TestBlockingCloseStallsOnlyItsClient(t *testing.T) {
	s, u1001, u1002 := otherUsers(t)
	sock := "SOFTROCE_SOCKET=" + s.Socket()
	vin, vout := piped(t, childCmd(t, "query-device", u1001, sock))
	expectLine(t, vout, "ready", 30*time.Second)

	var hin io.WriteCloser
	var hout <-chan string
	for attempt := 0; ; attempt++ {
		hin, hout = piped(t, childCmd(t, "linger-regmr", u1002, sock))
		expectLine(t, hout, "sent", 30*time.Second)
		select {
		case l := <-hout:
			if l != "closed" {
				t.Fatalf("the hostile process said %q", l)
			}
		case <-time.After(3 * time.Second):
			// The daemon closed its copy first, so the hostile's own
			// close is the lingering one: nothing was tested; again.
			fmt.Fprintln(hin, "drain")
			if attempt == 4 {
				t.Fatal("in 5 attempts the daemon never held the last reference to the lingering socket")
			}
			continue
		}
		break
	}
	// Now only the daemon's copy of the socket is left: closing it blocks
	// up to 60 s, until the hostile lets its peer read.
	fmt.Fprintln(vin, "go")
	select {
	case l := <-vout:
		if l != "answered 0" {
			t.Fatalf("victim: %q", l)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("another user's QUERY_DEVICE was not answered in 20 s while a hostile REG_MR descriptor was being closed")
	}
	// Unmodified programs of that user run a whole exchange meanwhile.
	t.Run("ibv_rc_pingpong", func(t *testing.T) {
		p, lib := tool(t, "ibv_rc_pingpong")
		for d := lib; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
			os.Chmod(d, 0o755)
		}
		port := fmt.Sprint(freeTCPPort(t))
		args := []string{"-g", "0", "-p", port, "-n", "5000"}
		srv := startPingpongAs(t, s, lib, u1001, p, args...)
		waitTCPListen(t, srv, port)
		cli := startPingpongAs(t, s, lib, u1001, p, append(args, "127.0.0.1")...)
		cli.wait(t, "ibv_rc_pingpong client")
		srv.wait(t, "ibv_rc_pingpong server")
		if o := cli.output(); !strings.Contains(o, "5000 iters in") {
			t.Errorf("no result:\n%s", o)
		}
	})
	fmt.Fprintln(hin, "drain")
	l := expectLine(t, hout, "", 90*time.Second)
	if want := fmt.Sprintf("late %d", int(syscall.EINVAL)); l != want {
		t.Fatalf("the hostile process said %q, want %q: its REG_MR must be refused, and answered only after its socket's close returned", l, want)
	}
}
