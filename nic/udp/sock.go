package udp

import (
	"errors"
	"net"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// sock is a socket (or epoll) descriptor kept out of the Go runtime's
// poller: its waits are ppoll system calls on the descriptor and an
// eventfd.
//
// Why: a descriptor in the runtime poller is registered edge-triggered
// for input and output, so every datagram sent (its buffer freed when the
// peer reads it) and every one received wakes the thread blocked in the
// runtime's epoll, whether or not a goroutine waits for it, and a
// goroutine that does wait is woken on that thread and then handed to
// another. On an idle host each of those thread wake-ups costs more than
// the system calls around it; a ping-pong paid two to three of them per
// hop. Blocked in ppoll, the thread the packet wakes is the one that
// reads it, and it keeps its P, so the goroutine runs on at once; sends
// wake nobody.
//
// The runtime hands the P of a thread blocked in a system call to other
// goroutines when they need one (as for any blocking system call), so a
// reader blocked here costs an OS thread, not a P.
//
// sock implements syscall.RawConn. Close wakes the waiters and closes the
// descriptors once the last call using them has returned.
type sock struct {
	mu     sync.Mutex
	fd     int
	ev     int // eventfd: Interrupt and Close
	users  int // calls in progress with fd
	closed bool
}

var _ syscall.RawConn = (*sock)(nil)

// errInterrupted is what Read returns when Interrupt woke its wait.
var errInterrupted = errors.New("udp: wait interrupted")

// newSock takes fd over (non-blocking, close-on-exec).
func newSock(fd int) (*sock, error) {
	ev, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return nil, err
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(ev)
		return nil, err
	}
	return &sock{fd: fd, ev: ev}, nil
}

// detach moves a socket out of the runtime poller into a sock: it keeps a
// duplicate of conn's descriptor and closes conn, whose close removes the
// original from the poller's epoll set.
func detach(conn syscall.Conn, closer interface{ Close() error }) (*sock, error) {
	rc, err := conn.SyscallConn()
	if err != nil {
		return nil, err
	}
	dup, derr := -1, error(nil)
	if err := rc.Control(func(fd uintptr) {
		dup, derr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0)
	}); err != nil {
		return nil, err
	}
	if derr != nil {
		return nil, derr
	}
	closer.Close()
	s, err := newSock(dup)
	if err != nil {
		unix.Close(dup)
		return nil, err
	}
	return s, nil
}

func (s *sock) enter() bool {
	s.mu.Lock()
	ok := !s.closed
	if ok {
		s.users++
	}
	s.mu.Unlock()
	return ok
}

func (s *sock) leave() {
	s.mu.Lock()
	s.users--
	if s.closed && s.users == 0 {
		s.release()
	}
	s.mu.Unlock()
}

// release closes the descriptors (under mu, with no user left).
func (s *sock) release() {
	if s.fd >= 0 {
		unix.Close(s.fd)
		unix.Close(s.ev)
		s.fd, s.ev = -1, -1
	}
}

// Control implements syscall.RawConn.
func (s *sock) Control(f func(fd uintptr)) error {
	if !s.enter() {
		return net.ErrClosed
	}
	defer s.leave()
	f(uintptr(s.fd))
	return nil
}

// Read implements syscall.RawConn: it calls f until f reports done,
// waiting for input in between. It returns errInterrupted when Interrupt
// woke the wait, and net.ErrClosed once closed.
func (s *sock) Read(f func(fd uintptr) (done bool)) error {
	if !s.enter() {
		return net.ErrClosed
	}
	defer s.leave()
	for {
		if f(uintptr(s.fd)) {
			return nil
		}
		fds := [2]unix.PollFd{{Fd: int32(s.fd), Events: unix.POLLIN}, {Fd: int32(s.ev), Events: unix.POLLIN}}
		if err := ppoll(fds[:], nil); err != nil {
			return err
		}
		if fds[1].Revents != 0 {
			if s.isClosed() {
				return net.ErrClosed
			}
			var b [8]byte
			unix.Read(s.ev, b[:])
			return errInterrupted
		}
	}
}

// writeWait bounds a sender's wait for buffer space: the eventfd is the
// readers', so a sender looks whether the sock was closed this often.
var writeWait = unix.Timespec{Nsec: 10e6}

// Write implements syscall.RawConn: it calls f until f reports done,
// waiting for buffer space in between.
func (s *sock) Write(f func(fd uintptr) (done bool)) error {
	if !s.enter() {
		return net.ErrClosed
	}
	defer s.leave()
	for {
		if f(uintptr(s.fd)) {
			return nil
		}
		if s.isClosed() {
			return net.ErrClosed
		}
		fds := [1]unix.PollFd{{Fd: int32(s.fd), Events: unix.POLLOUT}}
		t := writeWait
		if err := ppoll(fds[:], &t); err != nil {
			return err
		}
	}
}

func (s *sock) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

var one = [8]byte{1}

// Interrupt wakes a Read waiting for input, or makes the next wait of one
// return at once.
func (s *sock) Interrupt() {
	if !s.enter() {
		return
	}
	unix.Write(s.ev, one[:])
	s.leave()
}

// Close wakes every waiter; the descriptors close when the last call
// using them returns.
func (s *sock) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return net.ErrClosed
	}
	s.closed = true
	if s.users == 0 {
		s.release()
		return nil
	}
	unix.Write(s.ev, one[:])
	return nil
}

// ppoll waits in the kernel (a blocking system call, so the runtime can
// hand this thread's P on) until one of fds is ready or t passes (nil:
// no limit). EINTR is no error.
func ppoll(fds []unix.PollFd, t *unix.Timespec) error {
	_, _, errno := unix.Syscall6(unix.SYS_PPOLL, uintptr(unsafe.Pointer(&fds[0])), uintptr(len(fds)), uintptr(unsafe.Pointer(t)), 0, 0, 0)
	if errno != 0 && errno != unix.EINTR {
		return errno
	}
	return nil
}
