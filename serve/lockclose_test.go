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
	"strconv"
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
	// daemon's is then the last); on "peek" on stdin whether the REG_MR
	// was answered yet ("pending" or "answered E"), and on "drain" it
	// lets the peer read and says "late E" once the REG_MR is answered.
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
		port := ln.Addr().(*net.TCPAddr).Port
		if err := unix.Connect(fd, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}, Port: port}); err != nil {
			return fail(err)
		}
		peer, err := ln.Accept()
		if err != nil {
			return fail(err)
		}
		// Written until far more bytes wait unsent than the peer's small
		// receive buffer could ever take: the FIN cannot go while the peer
		// reads nothing, and the last close lingers.
		unix.SetNonblock(fd, true)
		chunk := make([]byte, 1<<16)
		for round := 0; ; round++ {
			for {
				if _, err := unix.Write(fd, chunk); err == unix.EAGAIN {
					break
				} else if err != nil {
					return fail(err)
				}
			}
			unsent, err := unix.IoctlGetInt(fd, unix.SIOCOUTQNSD)
			if err != nil {
				return fail(err)
			}
			if unsent >= 1<<18 {
				break
			}
			if round == 100 {
				return fail(fmt.Errorf("only %d bytes wait unsent", unsent))
			}
			time.Sleep(20 * time.Millisecond)
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
			if l, _ := in.ReadString('\n'); strings.TrimSpace(l) != "peek" {
				result <- fmt.Sprintf("error stdin said %q", l)
				return
			}
			select {
			case e := <-answered:
				fmt.Println("answered", int(e))
				answered <- e
			default:
				fmt.Println("pending")
			}
			if l, _ := in.ReadString('\n'); strings.TrimSpace(l) != "drain" {
				result <- fmt.Sprintf("error stdin said %q", l)
				return
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
		// lingering one).
		ahead, err := c.sendStalled(opRegMR, regMRBody(pd, va, pageSize, extent{va: va, len: pageSize}), fd)
		if err != nil {
			return fail(err)
		}
		fmt.Println("sent")
		// The message in flight holds a reference, and the daemon cannot
		// take it yet: this close does not linger.
		unix.Close(fd)
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

func init() {
	// pingpongPair runs an ibv_rc_pingpong server and client ($PP_TOOL,
	// on TCP port $PP_PORT, $PP_ITERS iterations) and says "done N" with
	// the client's iterations, then stays until killed, so that the
	// process that started it gets no SIGCHLD.
	childRoles["pingpong-pair"] = func() int {
		say := func(f string, a ...any) int {
			fmt.Printf(f+"\n", a...)
			select {}
		}
		tool, port, iters := os.Getenv("PP_TOOL"), os.Getenv("PP_PORT"), os.Getenv("PP_ITERS")
		args := []string{"-g", "0", "-p", port, "-n", iters}
		var sout, cout strings.Builder
		srv := exec.Command(tool, args...)
		srv.Stdout, srv.Stderr = &sout, &sout
		if err := srv.Start(); err != nil {
			return say("error %v", err)
		}
		n, _ := strconv.Atoi(port)
		want := fmt.Sprintf(":%04X ", n)
		listening := func() bool {
			for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
				b, _ := os.ReadFile(f)
				for _, line := range strings.Split(string(b), "\n") {
					if fs := strings.Fields(line); len(fs) > 3 && strings.HasSuffix(fs[1]+" ", want) && fs[3] == "0A" {
						return true
					}
				}
			}
			return false
		}
		for start := time.Now(); !listening(); time.Sleep(5 * time.Millisecond) {
			if time.Since(start) > time.Minute {
				return say("error the server does not listen: %q", sout.String())
			}
		}
		cli := exec.Command(tool, append(args, "127.0.0.1")...)
		cli.Stdout, cli.Stderr = &cout, &cout
		if err := cli.Run(); err != nil {
			return say("error client: %v %q", err, cout.String())
		}
		if err := srv.Wait(); err != nil {
			return say("error server: %v %q", err, sout.String())
		}
		var got int
		for _, l := range strings.Split(cout.String(), "\n") {
			if i := strings.Index(l, " iters in "); i > 0 {
				got, _ = strconv.Atoi(strings.TrimSpace(l[:i]))
			}
		}
		return say("done %d", got)
	}
}

// sendStalled sends op (with fds) so that the daemon cannot take it
// before this process reads hundreds of answers: it sends STATUS
// requests without reading the answers until the daemon stops taking
// them (it waits to write answers nobody reads; a STATUS answer takes
// more of the daemon's socket buffer than a request takes of this
// one's), then reads answers until op fits behind those requests. It
// returns how many answers are still to be read before op's.
func (c *childConn) sendStalled(op uint32, body []byte, fds ...int) (int, error) {
	rc, err := c.c.SyscallConn()
	if err != nil {
		return 0, err
	}
	try := func(msg, oob []byte) error {
		var serr error
		rc.Write(func(fd uintptr) bool {
			serr = unix.Sendmsg(int(fd), msg, oob, nil, unix.MSG_DONTWAIT)
			return true
		})
		return serr
	}
	status := le.AppendUint32(le.AppendUint32(nil, opStatus), 0)
	sent := 0
	for {
		err := try(status, nil)
		if err == unix.EAGAIN {
			break
		}
		if err != nil {
			return 0, err
		}
		if sent++; sent > 1<<16 {
			return 0, fmt.Errorf("the daemon took %d requests without its answers being read", sent)
		}
	}
	msg := append(le.AppendUint32(le.AppendUint32(nil, op), 0), body...)
	for {
		if _, _, _, err := c.recv(); err != nil {
			return 0, err
		}
		sent--
		err := try(msg, unix.UnixRights(fds...))
		if err == nil {
			return sent, nil
		}
		if err != unix.EAGAIN {
			return 0, err
		}
		if sent == 0 {
			return 0, fmt.Errorf("every answer read and REG_MR still does not fit")
		}
	}
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
	// The library is built first: the build's processes exiting while
	// the close lingers would interrupt it (SIGCHLD), losing the order
	// tested.
	var pingpong, lib string
	t.Run("build", func(t *testing.T) { pingpong, lib = tool(t, "ibv_rc_pingpong") })
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
			fmt.Fprintln(hin, "peek\ndrain")
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
	fmt.Fprintln(hin, "peek")
	if l := expectLine(t, hout, "", 30*time.Second); l != "pending" {
		t.Fatalf("the hostile REG_MR was answered (%q) before another user's QUERY_DEVICE: its descriptor's close did not linger", l)
	}
	// Unmodified programs of that user run a whole exchange meanwhile.
	// They are not this process's children: a SIGCHLD would interrupt
	// the daemon's lingering close, and the order tested would be lost.
	t.Run("ibv_rc_pingpong", func(t *testing.T) {
		if lib == "" {
			t.Skip("no library or no ibv_rc_pingpong (see the build subtest)")
		}
		p := pingpong
		for d := lib; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
			os.Chmod(d, 0o755)
		}
		_, out := piped(t, childCmd(t, "pingpong-pair", u1001, sock, "LD_LIBRARY_PATH="+lib, "PP_TOOL="+p,
			"PP_PORT="+fmt.Sprint(freeTCPPort(t)), "PP_ITERS=5000"))
		if l := expectLine(t, out, "", 2*time.Minute); l != "done 5000" {
			t.Errorf("ibv_rc_pingpong pair: %q", l)
		}
	})
	fmt.Fprintln(hin, "drain")
	l := expectLine(t, hout, "", 90*time.Second)
	if want := fmt.Sprintf("late %d", int(syscall.EINVAL)); l != want {
		t.Fatalf("the hostile process said %q, want %q: its REG_MR must be refused", l, want)
	}
}
