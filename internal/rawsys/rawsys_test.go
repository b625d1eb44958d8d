package rawsys

import (
	"testing"

	"golang.org/x/sys/unix"
)

// An eventfd written raw is ready in its epoll set and reads back the
// count; an empty one reads EAGAIN and is not ready, and nothing waits.
func TestEventfdRoundTrip(t *testing.T) {
	ev, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ev)
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ep)
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, ev, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(ev)}); err != nil {
		t.Fatal(err)
	}
	evs := make([]unix.EpollEvent, 4)
	var b [8]byte
	if n, err := EpollNow(ep, evs); n != 0 || err != nil {
		t.Fatalf("EpollNow on an idle set = %d, %v", n, err)
	}
	if n, err := Read(ev, b[:]); n != 0 || err != unix.EAGAIN {
		t.Fatalf("Read of an empty eventfd = %d, %v; want EAGAIN", n, err)
	}
	b[0] = 3
	if n, err := Write(ev, b[:]); n != 8 || err != nil {
		t.Fatalf("Write = %d, %v", n, err)
	}
	if n, err := EpollNow(ep, evs); n != 1 || err != nil || int(evs[0].Fd) != ev {
		t.Fatalf("EpollNow after the write = %d, %v, %+v", n, err, evs[0])
	}
	b = [8]byte{}
	if n, err := Read(ev, b[:]); n != 8 || err != nil || b[0] != 3 {
		t.Fatalf("Read = %d, %v, %v; want the count 3", n, err, b)
	}
	if n, err := EpollNow(ep, evs); n != 0 || err != nil {
		t.Fatalf("EpollNow after the read = %d, %v", n, err)
	}
}
