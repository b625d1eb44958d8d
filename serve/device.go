package serve

import (
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/cm"
	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/internal/rawsys"
	"github.com/softroce/softroce/transport/engine"
	"github.com/softroce/softroce/verbs"
)

const (
	// goCQDepth is the depth of the device-wide verbs CQs every client QP
	// completes into; the poller moves each completion to its client's
	// ring at once. The QPs' send and receive capacities together may not
	// exceed it, so these CQs cannot overrun.
	goCQDepth = 1 << 17
	// spinPasses is how many empty passes the poller makes before it
	// announces it sleeps. Short: on a host with few cores a spinning
	// poller takes the CPU from the transport's goroutines and from the
	// programs (on two loaded cores, 16 passes gave ibv_rc_pingpong
	// 48-100 us per iteration, 256 passes 144-183 us, 4096 passes 1 ms).
	spinPasses = 16
	// backstop bounds a sleep when no doorbell or completion comes: WQEs
	// the transport refused as over max_send_wr are retried then.
	backstop = 20 * time.Millisecond
)

// device is one verbs device and the clients' objects on it. mu guards
// everything the poller reads (the QP list, the clients' MR tables) and is
// held for each control operation and each poller pass.
//
// Completions take another way: the device's verbs CQs hand each one, as
// the transport pushes it, to route (cq.CQ's push hook), which writes it
// into its client's CQ ring at once, on the transport's goroutine and
// under its engine lock. route therefore cannot take mu (the poller holds
// mu while it posts, which takes the engine lock); rmu guards what it
// reads: byQPN (written under both mu and rmu) and the CQ rings' producer
// state. Locks nest mu, then the engine's, then rmu.
type device struct {
	s     *Server
	index int
	v     *verbs.Device
	name  string
	guid  uint64

	mu        sync.Mutex
	qps       []*qpObj
	byQPN     map[uint32]*qpObj      // written under mu and rmu
	reserved  int                    // send+recv capacity the QPs and SRQs claim of goCQDepth
	userSlots map[int]int            // reserved by uid: Limits.QueueSlotsPerUser
	srqs      []*srqObj              // srq.go
	bySRQ     map[*verbs.SRQ]*srqObj // srq.go: for the limit event
	// retired sums the counters of destroyed client QPs: a port's
	// counters (rdmaview.go) outlive the QPs that moved them.
	retired engine.QPStats

	rmu sync.Mutex
	// overruns are QPs whose client CQ ring was full when route wrote a
	// completion: moving them to ERR takes the engine lock, which route
	// runs under, so the poller does it (errPending tells it to look).
	overruns, overrunsWork []overrun
	errPending             atomic.Bool

	drainFn   func() // d.drainAll, made once: Batch takes it without allocating
	drainWork bool   // what drainAll found

	sendCQ, recvCQ *verbs.CQ
	gidIndex       int       // the GID of the address the device serves (cm.DefaultSGID)
	ll             linkLocal // its IPv6 link-local GID, if it has one (linklocal.go)
	cm             cmDev     // rdma_cm's CM on QP1, opened on first use (serve/cm.go)
	wcs            [64]verbs.WC

	epfd int // the clients' doorbell eventfds, wakeFD and quitFD
	// epf owns epfd; eprc, if the network poller took it (an epoll fd is
	// readable while one of its descriptors is), is where the poller
	// sleeps rather than in a blocking epoll_wait.
	epf    *os.File
	eprc   syscall.RawConn
	evs    [32]unix.EpollEvent
	evn    int
	everr  error
	epoll0 func(uintptr) bool // d.epollNow, made once: no allocation per sleep
	wakeFD int                // route's request for a pass (overruns)
	quitFD int
	quit   chan struct{}
	done   sync.WaitGroup
}

// overrun is a QP to move to ERR for a completion its client CQ could not
// hold; first says the CQ's CQ_ERR event is still to be raised.
type overrun struct {
	qpn, cq uint32
	first   bool
}

func newDevice(s *Server, i int, v *verbs.Device) (*device, error) {
	d := &device{s: s, index: i, v: v, name: v.Name(), byQPN: map[uint32]*qpObj{}, bySRQ: map[*verbs.SRQ]*srqObj{}, userSlots: map[int]int{},
		quit: make(chan struct{})}
	if g := v.GIDTable(); len(g) > 0 {
		// The address the device serves, whatever its index: rdma_cm's
		// (not the link-local one a device may have at index 0).
		d.gidIndex = cm.DefaultSGID(g)
		// An EUI-64-like GUID from it: stable per address.
		a := g[d.gidIndex].GID
		d.guid = 0x0200000000000000 | uint64(a[12])<<24 | uint64(a[13])<<16 | uint64(a[14])<<8 | uint64(a[15]) | uint64(a[11])<<32
	}
	d.ll = linkLocalOf(v)
	var err error
	if d.sendCQ, err = v.CreateCQ(goCQDepth); err != nil {
		return nil, err
	}
	if d.recvCQ, err = v.CreateCQ(goCQDepth); err != nil {
		return nil, err
	}
	d.drainFn = d.drainAll
	d.sendCQ.SetPushHook(d.routeSend)
	d.recvCQ.SetPushHook(d.routeRecv)
	if d.epfd, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		return nil, err
	}
	for _, p := range []*int{&d.quitFD, &d.wakeFD} {
		if *p, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC); err != nil {
			unix.Close(d.epfd)
			return nil, err
		}
		unix.EpollCtl(d.epfd, unix.EPOLL_CTL_ADD, *p, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(*p)})
	}
	d.pollable()
	d.done.Add(2)
	go d.poll()
	go d.events()
	return d, nil
}

func (d *device) close() {
	d.cmClose()
	close(d.quit)
	ring(d.quitFD)
	d.done.Wait()
	d.sendCQ.SetPushHook(nil)
	d.recvCQ.SetPushHook(nil)
	if d.epf != nil {
		d.epf.Close() // closes epfd
	} else {
		unix.Close(d.epfd)
	}
	unix.Close(d.quitFD)
	unix.Close(d.wakeFD)
	d.v.Close()
}

// ring writes an eventfd.
func ring(fd int) {
	var one [8]byte
	one[0] = 1
	rawsys.Write(fd, one[:])
}

// pollable puts epfd into Go's network poller, so that the poller's sleep
// holds no P. Blocked in a raw epoll_wait, it held its P in a system call,
// as the UDP link's receive goroutine holds one in ppoll: on a 2-core host
// that is every P, so the runtime's monitor (sysmon) found none idle, kept
// polling every 20 us and retook a P from the system call to hand it to
// another thread, each a context switch that, on cores spinning programs
// hold, delays the packet or doorbell a round trip waits for.
func (d *device) pollable() {
	if err := unix.SetNonblock(d.epfd, true); err != nil {
		return
	}
	d.epf = os.NewFile(uintptr(d.epfd), "softroce-doorbells")
	rc, err := d.epf.SyscallConn()
	if err == nil {
		err = d.epf.SetReadDeadline(time.Time{}) // fails unless the poller took it
	}
	if err != nil {
		return // wait blocks in epoll_wait (which ignores O_NONBLOCK)
	}
	d.eprc = rc
	d.epoll0 = d.epollNow
}

// epollNow collects the ready descriptors without waiting; false asks the
// network poller to wait until epfd is readable.
func (d *device) epollNow(fd uintptr) bool {
	d.evn, d.everr = rawsys.EpollNow(int(fd), d.evs[:])
	return d.evn != 0 || d.everr != nil
}

// wait sleeps until a doorbell, wakeFD or quitFD is written, or the
// backstop passes, and reads the eventfds that were; it reports false on
// quit.
func (d *device) wait() bool {
	evs := d.evs[:]
	var n int
	var err error
	if d.eprc == nil {
		n, err = unix.EpollWait(d.epfd, evs, int(backstop/time.Millisecond))
	} else {
		d.epf.SetReadDeadline(time.Now().Add(backstop))
		if d.eprc.Read(d.epoll0) == nil {
			n, err = d.evn, d.everr
		} else { // the backstop
			n, err = unix.EpollWait(d.epfd, evs, 0)
		}
	}
	if n == 0 && err == nil {
		d.s.backstops.Add(1)
	}
	var buf [8]byte
	for i := range max(n, 0) {
		fd := int(evs[i].Fd)
		if fd == d.quitFD {
			return false
		}
		rawsys.Read(fd, buf[:])
	}
	return true
}

// addDoorbell makes the poller wake when fd (a client's eventfd) is
// written.
func (d *device) addDoorbell(fd int) error {
	return unix.EpollCtl(d.epfd, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)})
}

func (d *device) removeDoorbell(fd int) {
	unix.EpollCtl(d.epfd, unix.EPOLL_CTL_DEL, fd, nil)
}

// poll is the device's data path: it runs the clients' rings until quit.
// Asleep, it waits in epoll on every client's doorbell at once (one
// goroutine per device, not per client), so a doorbell wakes the goroutine
// that posts the WQEs: no hand-off between a doorbell waiter and a poller.
func (d *device) poll() {
	defer d.done.Done()
	idle := 0
	for {
		d.mu.Lock()
		work := d.pass()
		d.mu.Unlock()
		if work {
			idle = 0
			continue
		}
		if idle++; idle < spinPasses {
			select {
			case <-d.quit:
				return
			default:
			}
			continue
		}
		// Announce the sleep, then look once more: a WQE posted before the
		// announcement was seen is found now, one posted after it rings.
		d.setAsleep(true)
		d.mu.Lock()
		work = d.pass()
		d.mu.Unlock()
		if !work && !d.wait() {
			return
		}
		d.setAsleep(false)
		idle = 0
	}
}

func (d *device) setAsleep(v bool) {
	d.mu.Lock()
	f := uint32(0)
	if v {
		f = 1
	}
	for _, q := range d.qps {
		store32(q.mem.b, offSleeping, f)
	}
	for _, o := range d.srqs {
		store32(o.mem.b, offSleeping, f)
	}
	d.mu.Unlock()
}

// pass runs every QP's rings once; d.mu is held. It reports whether it did
// anything.
func (d *device) pass() bool {
	work := false
	if d.errPending.Load() {
		d.moveOverrunsToErr()
		work = true
	}
	if d.posted() {
		// Post, then send what that built, on this goroutine: no wake-up
		// of the transport's transmitter per post.
		d.v.Batch(d.drainFn)
		work = work || d.drainWork
	}
	// route takes every completion as it is pushed; the verbs CQs hold
	// some only if it ever declined one.
	for _, c := range [2]*verbs.CQ{d.sendCQ, d.recvCQ} {
		recv := c == d.recvCQ
		for {
			n := c.Poll(d.wcs[:])
			if n == 0 {
				break
			}
			work = true
			for i := range d.wcs[:n] {
				d.route(&d.wcs[i], recv)
			}
		}
	}
	return work
}

// posted reports whether a client has posted WQEs the poller has not
// taken; d.mu is held.
func (d *device) posted() bool {
	for _, q := range d.qps {
		if q.sq.pending(q.mem.b) || q.rq.pending(q.mem.b) {
			return true
		}
	}
	for _, o := range d.srqs {
		if o.rq.pending(o.mem.b) {
			return true
		}
	}
	return false
}

// drainAll moves every ring's new WQEs into verbs; d.mu is held.
func (d *device) drainAll() {
	work := false
	for _, q := range d.qps {
		if q.drain() {
			work = true
		}
	}
	for _, o := range d.srqs {
		if o.rq.drain(o.mem.b) {
			work = true
		}
	}
	d.drainWork = work
}

func (d *device) routeSend(wc verbs.WC, _ bool) bool { d.route(&wc, false); return true }
func (d *device) routeRecv(wc verbs.WC, _ bool) bool { d.route(&wc, true); return true }

// route writes a completion into the ring of the client CQ its QP names.
// A completion of a QP destroyed meanwhile is dropped, as a RNIC drops it.
// It runs on the goroutine that pushed the completion, under the engine
// lock (see device): what needs more is left to the poller.
func (d *device) route(wc *verbs.WC, recv bool) {
	d.rmu.Lock()
	q := d.byQPN[wc.QPNum]
	if q == nil {
		d.rmu.Unlock()
		return
	}
	c := q.sendCQ
	if recv {
		c = q.recvCQ
		if q.typ == verbs.QPTypeUD && wc.Status == cq.Success {
			wc.SL = rocePktType(wc.IPVersion)
		}
	}
	if !c.push(wc) {
		d.s.overruns.Add(1)
		if !q.errQueued {
			q.errQueued = true
			d.overruns = append(d.overruns, overrun{qpn: q.qpn, cq: c.handle, first: !c.overran})
			c.overran = true
			d.errPending.Store(true)
			ring(d.wakeFD)
		}
	}
	d.rmu.Unlock()
}

// moveOverrunsToErr raises CQ_ERR and moves to ERR the QPs route found a
// full CQ ring for, as rxe does on a CQ overrun; d.mu is held.
func (d *device) moveOverrunsToErr() {
	d.rmu.Lock()
	d.errPending.Store(false)
	work := d.overruns
	d.overruns = d.overrunsWork[:0]
	d.rmu.Unlock()
	for _, o := range work {
		q := d.byQPN[o.qpn]
		if q == nil {
			continue
		}
		if o.first {
			q.c.raise(evCQErr, o.cq)
		}
		q.toErr() // its flushed WQEs overrun too, but find errQueued set
		d.rmu.Lock()
		q.errQueued = false
		d.rmu.Unlock()
	}
	d.overrunsWork = work[:0]
}

// events forwards the device's async events to the clients they concern:
// a QP's to its owner, a device's to every client of the device.
func (d *device) events() {
	defer d.done.Done()
	for {
		select {
		case <-d.quit:
			return
		case ev := <-d.v.AsyncEvents():
			switch ev.Type {
			case verbs.EventQPFatal:
				d.mu.Lock()
				if q := d.byQPN[ev.QPNum]; q != nil {
					q.c.raise(evQPFatal, q.handle)
				}
				d.mu.Unlock()
			case verbs.EventQPLastWQEReached:
				d.mu.Lock()
				if q := d.byQPN[ev.QPNum]; q != nil {
					q.c.raise(evQPLastWQE, q.handle)
				}
				d.mu.Unlock()
			case verbs.EventSRQLimitReached:
				d.srqEvent(ev.SRQ)
			case verbs.EventDeviceFatal:
				d.s.mu.Lock()
				for c := range d.s.clients {
					if c.dev == d {
						c.raise(evDeviceFatal, 0)
					}
				}
				d.s.mu.Unlock()
			}
		}
	}
}

// isQueueFull reports the transport refusing a WQE over max_send_wr or
// max_recv_wr: the ring keeps it and the poller retries.
func isQueueFull(err error) bool { return errors.Is(err, engine.ErrQueueFull) }
