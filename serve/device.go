package serve

import (
	"errors"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/transport/rc"
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
type device struct {
	s     *Server
	index int
	v     *verbs.Device
	name  string
	guid  uint64

	mu       sync.Mutex
	qps      []*qpObj
	byQPN    map[uint32]*qpObj
	reserved int                    // send+recv capacity the QPs and SRQs claim of goCQDepth
	srqs     []*srqObj              // srq.go
	bySRQ    map[*verbs.SRQ]*srqObj // srq.go: for the limit event
	asleep   bool

	sendCQ, recvCQ *verbs.CQ
	cm             cmDev // rdma_cm's CM on QP1, opened on first use (serve/cm.go)
	wcs            [64]verbs.WC

	epfd   int // the clients' doorbell eventfds, and quitFD
	quitFD int
	dbCh   chan struct{}
	quit   chan struct{}
	done   sync.WaitGroup
}

func newDevice(s *Server, i int, v *verbs.Device) (*device, error) {
	d := &device{s: s, index: i, v: v, name: v.Name(), byQPN: map[uint32]*qpObj{}, bySRQ: map[*verbs.SRQ]*srqObj{},
		dbCh: make(chan struct{}, 1), quit: make(chan struct{})}
	if g := v.GIDTable(); len(g) > 0 {
		// An EUI-64-like GUID from the first address: stable per address.
		a := g[0].GID
		d.guid = 0x0200000000000000 | uint64(a[12])<<24 | uint64(a[13])<<16 | uint64(a[14])<<8 | uint64(a[15]) | uint64(a[11])<<32
	}
	var err error
	if d.sendCQ, err = v.CreateCQ(goCQDepth); err != nil {
		return nil, err
	}
	if d.recvCQ, err = v.CreateCQ(goCQDepth); err != nil {
		return nil, err
	}
	if d.epfd, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		return nil, err
	}
	if d.quitFD, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC); err != nil {
		unix.Close(d.epfd)
		return nil, err
	}
	unix.EpollCtl(d.epfd, unix.EPOLL_CTL_ADD, d.quitFD, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(d.quitFD)})
	d.done.Add(3)
	go d.doorbells()
	go d.poll()
	go d.events()
	return d, nil
}

func (d *device) close() {
	d.cmClose()
	close(d.quit)
	var one [8]byte
	one[0] = 1
	unix.Write(d.quitFD, one[:])
	d.done.Wait()
	unix.Close(d.epfd)
	unix.Close(d.quitFD)
	d.v.Close()
}

// addDoorbell makes the poller wake when fd (a client's eventfd) is
// written.
func (d *device) addDoorbell(fd int) error {
	return unix.EpollCtl(d.epfd, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)})
}

func (d *device) removeDoorbell(fd int) {
	unix.EpollCtl(d.epfd, unix.EPOLL_CTL_DEL, fd, nil)
}

// doorbells waits on every client's eventfd at once (one goroutine per
// device, not per client) and wakes the poller.
func (d *device) doorbells() {
	defer d.done.Done()
	var evs [32]unix.EpollEvent
	var buf [8]byte
	for {
		n, err := unix.EpollWait(d.epfd, evs[:], -1)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return
		}
		for i := range n {
			fd := int(evs[i].Fd)
			if fd == d.quitFD {
				return
			}
			unix.Read(fd, buf[:])
		}
		// Post the rung QPs' WQEs from here at once rather than after
		// waking the poller: one hand-off less on the way to the wire.
		d.mu.Lock()
		d.pass()
		d.mu.Unlock()
		select {
		case d.dbCh <- struct{}{}:
		default:
		}
	}
}

// poll is the device's data path: it runs the clients' rings until quit.
func (d *device) poll() {
	defer d.done.Done()
	t := time.NewTimer(backstop)
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
		d.sendCQ.ReqNotify(false)
		d.recvCQ.ReqNotify(false)
		d.mu.Lock()
		work = d.pass()
		d.mu.Unlock()
		if !work && d.sendCQ.Len() == 0 && d.recvCQ.Len() == 0 {
			t.Reset(backstop)
			select {
			case <-d.quit:
				return
			case <-d.dbCh:
			case <-d.sendCQ.Notify():
			case <-d.recvCQ.Notify():
			case <-t.C:
				d.s.backstops.Add(1)
			}
			t.Stop()
		}
		d.setAsleep(false)
		idle = 0
	}
}

func (d *device) setAsleep(v bool) {
	d.mu.Lock()
	d.asleep = v
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

// pass runs every QP's rings once and delivers every completion; d.mu is
// held. It reports whether it did anything.
func (d *device) pass() bool {
	work := false
	for _, q := range d.qps {
		if q.drain() {
			work = true
		}
	}
	for _, o := range d.srqs {
		if o.drain() {
			work = true
		}
	}
	for _, c := range [2]*verbs.CQ{d.sendCQ, d.recvCQ} {
		recv := c == d.recvCQ
		for {
			n := c.Poll(d.wcs[:])
			if n == 0 {
				break
			}
			work = true
			for i := range d.wcs[:n] {
				d.deliver(&d.wcs[i], recv)
			}
		}
	}
	return work
}

// deliver writes a completion into the ring of the client CQ its QP names.
// A completion of a QP destroyed meanwhile is dropped, as a RNIC drops it.
func (d *device) deliver(wc *verbs.WC, recv bool) {
	q := d.byQPN[wc.QPNum]
	if q == nil {
		return
	}
	c := q.sendCQ
	if recv {
		c = q.recvCQ
	}
	if !c.push(wc) {
		d.s.overruns.Add(1)
		if !c.overran {
			c.overran = true
			q.c.raise(evCQErr, c.handle)
		}
		q.toErr() // as rxe does when a CQ overruns
	}
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
func isQueueFull(err error) bool { return errors.Is(err, rc.ErrQueueFull) }
