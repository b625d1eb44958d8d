// Package rawsys makes the data path's system calls that never block
// (reads and writes of non-blocking eventfds and pipes, a look at an
// epoll set that does not wait) without the runtime's syscall entry.
//
// Through that entry, the first system call after the process went idle
// wakes the runtime's monitor thread (sysmon), which then polls every
// 20 us for a while: in a daemon answering a ping-pong that was a thread
// wake-up per message, on cores that busy programs hold. A raw call keeps
// its P for its duration, which is harmless for calls that return at
// once. Calls that may block must not come here.
package rawsys

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// Read reads b from the non-blocking descriptor fd.
func Read(fd int, b []byte) (int, error) { return rw(unix.SYS_READ, fd, b) }

// Write writes b to the non-blocking descriptor fd.
func Write(fd int, b []byte) (int, error) { return rw(unix.SYS_WRITE, fd, b) }

func rw(op uintptr, fd int, b []byte) (int, error) {
	n, _, e := unix.RawSyscall(op, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)))
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// EpollNow collects epfd's ready events into evs without waiting.
func EpollNow(epfd int, evs []unix.EpollEvent) (int, error) {
	n, _, e := unix.RawSyscall6(unix.SYS_EPOLL_PWAIT, uintptr(epfd), uintptr(unsafe.Pointer(unsafe.SliceData(evs))), uintptr(len(evs)), 0, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}
