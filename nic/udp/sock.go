package udp

import (
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/internal/rawsys"
)

// sock is a socket (or Multi's epoll set) kept out of the Go runtime's
// poller, with two ways to wait for input.
//
// Why out: the runtime registers a descriptor edge-triggered for input and
// output, so every datagram sent (its buffer is freed when the peer reads
// it) woke the thread blocked in the runtime's epoll, whether or not any
// goroutine waited for it. On an idle host such a wake-up costs more than
// the system calls around it.
//
// Read waits in the runtime poller after all, through a private epoll set
// holding the descriptor (input only) and an eventfd (Interrupt, Close):
// the goroutine parks and its thread runs other goroutines, or spins
// briefly for new work before it sleeps, which suits a process with other
// busy goroutines.
//
// ReadKernel waits in a ppoll system call on the descriptor and the
// eventfd, with the descriptor out of the private set meanwhile: the
// thread the packet wakes is the one that reads it, and it keeps its P,
// so the goroutine runs on at once, where a wait in the poller wakes the
// thread blocked in epoll, which hands the goroutine on to another. That
// takes one thread wake-up a hop instead of two or three. It is granted
// only where it pays (kernelWaitOK); otherwise ReadKernel is Read.
//
// sock implements syscall.RawConn. Close wakes the waiters and closes the
// descriptors once the last call using them has returned. Reads are
// serialized by the caller.
type sock struct {
	mu     sync.Mutex
	fd     int
	ev     int // eventfd: Interrupt and Close
	users  int // calls in progress with the descriptors
	closed bool
	// kicked is set before the eventfd is written, so that a reader
	// needs no system call to tell an interrupt from input.
	kicked atomic.Bool

	epfd    int      // the private epoll set
	ep      *os.File // epfd in the runtime poller
	eprc    syscall.RawConn
	inSet   bool // fd is in the private set (under the reader)
	counted bool // counted in kernelReaders (under mu)
	// The poller's callback and its state (under the reader), set up
	// once: a closure per wait would allocate.
	pollFn func(uintptr) bool
	pollF  func(fd uintptr) bool
	fired  bool
}

var _ syscall.RawConn = (*sock)(nil)

// errInterrupted is what Read returns when Interrupt woke its wait.
var errInterrupted = errors.New("udp: wait interrupted")

// newSock takes fd over (made non-blocking).
func newSock(fd int) (*sock, error) {
	if err := unix.SetNonblock(fd, true); err != nil {
		return nil, err
	}
	ev, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return nil, err
	}
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		unix.Close(ev)
		return nil, err
	}
	s := &sock{fd: fd, ev: ev, epfd: epfd}
	s.pollFn = s.pollStep
	err = unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, ev, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(ev)})
	if err == nil {
		// Non-blocking, so that os.NewFile puts it in the runtime poller.
		err = unix.SetNonblock(epfd, true)
	}
	if err != nil {
		unix.Close(epfd)
		unix.Close(ev)
		return nil, fmt.Errorf("epoll: %w", err)
	}
	s.ep = os.NewFile(uintptr(epfd), "udp-wait")
	if s.eprc, err = s.ep.SyscallConn(); err != nil {
		s.ep.Close()
		unix.Close(ev)
		return nil, err
	}
	return s, nil
}

// detach moves a socket out of the runtime poller into a sock: it keeps a
// duplicate of conn's descriptor and closes conn, whose close takes the
// original out of the poller's epoll set.
func detach(conn interface {
	SyscallConn() (syscall.RawConn, error)
	Close() error
}) (*sock, error) {
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
	conn.Close()
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
		s.ep.Close()
		unix.Close(s.fd)
		unix.Close(s.ev)
		s.fd, s.ev = -1, -1
	}
	if s.counted {
		kernelReaders.Add(-1)
		s.counted = false
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
// waiting for input in the runtime poller in between. It returns
// errInterrupted when Interrupt woke the wait, and net.ErrClosed once
// closed.
func (s *sock) Read(f func(fd uintptr) (done bool)) error {
	if !s.enter() {
		return net.ErrClosed
	}
	defer s.leave()
	return s.readPoller(f)
}

// ReadKernel is Read waiting in a ppoll system call where that pays
// (kernelWaitOK).
func (s *sock) ReadKernel(f func(fd uintptr) (done bool)) error {
	if !s.enter() {
		return net.ErrClosed
	}
	defer s.leave()
	s.countReader()
	if !kernelWaitOK() {
		return s.readPoller(f)
	}
	if s.inSet {
		// Input would also wake the runtime's epoll thread.
		unix.EpollCtl(s.epfd, unix.EPOLL_CTL_DEL, s.fd, nil)
		s.inSet = false
	}
	for {
		if f(uintptr(s.fd)) {
			return nil
		}
		fds := [2]unix.PollFd{{Fd: int32(s.fd), Events: unix.POLLIN}, {Fd: int32(s.ev), Events: unix.POLLIN}}
		kernelWaits.Add(1)
		if err := ppoll(fds[:], nil); err != nil {
			return err
		}
		if fds[1].Revents != 0 {
			return s.interrupted()
		}
	}
}

// readPoller is Read (with the descriptors held).
func (s *sock) readPoller(f func(fd uintptr) (done bool)) error {
	if !s.inSet {
		if err := unix.EpollCtl(s.epfd, unix.EPOLL_CTL_ADD, s.fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(s.fd)}); err != nil {
			return fmt.Errorf("epoll: %w", err)
		}
		s.inSet = true
	}
	s.pollF, s.fired = f, false
	err := s.eprc.Read(s.pollFn)
	s.pollF = nil
	if err != nil {
		return err
	}
	if s.fired {
		return s.interrupted()
	}
	return nil
}

// pollStep is readPoller's callback. f runs inside the poller's Read,
// after it cleared the set's readiness, so input that arrives after an
// empty f wakes the wait.
func (s *sock) pollStep(uintptr) bool {
	if s.kicked.Load() {
		s.fired = true
		return true
	}
	return s.pollF(uintptr(s.fd))
}

// waitEach is RecvEachUntil's wait loop on s (Link's socket or Multi's
// epoll set): it waits with fn, a receive loop that sets *stopped or
// *fail when it returns true, asking stop before each wait; an Interrupt
// only makes it ask again. done reports a clean end (stop, or the loop
// stopped); otherwise err is the wait's error (nil if the loop failed).
func (s *sock) waitEach(fn func(uintptr) bool, stop func() bool, kernel bool, stopped *bool, fail *error) (done bool, err error) {
	for {
		if stop != nil && stop() {
			return true, nil
		}
		if kernel {
			err = s.ReadKernel(fn)
		} else {
			err = s.Read(fn)
		}
		if err == nil && *fail == nil && *stopped {
			return true, nil
		}
		if err != errInterrupted {
			return false, err
		}
	}
}

// interrupted consumes an Interrupt (or reports the Close).
func (s *sock) interrupted() error {
	if s.isClosed() {
		return net.ErrClosed
	}
	s.kicked.Store(false)
	var b [8]byte
	rawsys.Read(s.ev, b[:])
	return errInterrupted
}

// kernelWaits counts ppoll waits, process-wide (for tests).
var kernelWaits atomic.Uint64

// kernelReaders counts the socks ReadKernel was asked to wait on,
// process-wide.
var kernelReaders atomic.Int32

func (s *sock) countReader() {
	s.mu.Lock()
	if !s.counted {
		s.counted = true
		kernelReaders.Add(1)
	}
	s.mu.Unlock()
}

// kernelWaitOK reports whether a wait in ppoll pays: with one such reader
// in the process and a P to spare. A thread blocked in a system call keeps
// its P until sysmon notices (20 us or more), and every wait puts a thread
// to sleep and wakes it, where in the poller a thread with other
// goroutines to run, or spinning briefly for them, catches input without
// sleeping. With two devices receiving in one process (both ends of a
// benchmark) ppoll waits cost a quarter of RC WRITE's throughput; with one
// they take a thread wake-up out of every hop.
func kernelWaitOK() bool {
	return kernelReaders.Load() <= 1 && runtime.GOMAXPROCS(0) > 1
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

// Interrupt wakes a read waiting for input, or makes the next wait of one
// return at once.
func (s *sock) Interrupt() {
	if !s.enter() {
		return
	}
	s.kicked.Store(true)
	rawsys.Write(s.ev, one[:])
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
	s.kicked.Store(true)
	rawsys.Write(s.ev, one[:])
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
