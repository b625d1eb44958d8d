package afxdp

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ring is one of the four single-producer single-consumer rings the kernel
// shares with an AF_XDP socket. For the fill and TX rings this process is
// the producer, for the RX and completion rings the consumer.
type ring struct {
	mem   []byte
	prod  *uint32
	cons  *uint32
	flags *uint32
	mask  uint32
	size  uint32
	descs []unix.XDPDesc // RX and TX rings
	addrs []uint64       // fill and completion rings
}

func (r *ring) loadProd() uint32   { return atomic.LoadUint32(r.prod) }
func (r *ring) loadCons() uint32   { return atomic.LoadUint32(r.cons) }
func (r *ring) storeProd(v uint32) { atomic.StoreUint32(r.prod, v) }
func (r *ring) storeCons(v uint32) { atomic.StoreUint32(r.cons, v) }
func (r *ring) needWakeup() bool   { return atomic.LoadUint32(r.flags)&unix.XDP_RING_NEED_WAKEUP != 0 }

// xsk is one AF_XDP socket with its own UMEM, bound to one queue.
type xsk struct {
	fd         int
	queue      int
	umem       []byte
	frameSize  uint64
	fill, comp ring
	rx, tx     ring
	zeroCopy   bool
	sg         bool // bound with XDP_USE_SG: a packet may span frames

	// txFree holds the UMEM addresses of TX frames not in flight.
	txFree []uint64
	// txOut counts TX frames handed to the kernel and not yet completed.
	txOut int
	// rxPackets counts packets taken off this socket's RX ring.
	rxPackets atomic.Uint64
}

type xskConfig struct {
	ifindex   int
	queue     int
	frames    int // UMEM frames; half for RX, half for TX
	frameSize int
	ringSize  int
	zeroCopy  bool // try zero-copy first
}

// newXSK creates, configures and binds one AF_XDP socket. On error
// everything made so far is released.
func newXSK(c xskConfig) (x *xsk, err error) {
	fd, err := unix.Socket(unix.AF_XDP, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.EAFNOSUPPORT) {
			return nil, fmt.Errorf("create AF_XDP socket: kernel without AF_XDP (CONFIG_XDP_SOCKETS): %w", err)
		}
		return nil, fmt.Errorf("create AF_XDP socket: %w", permErr(err))
	}
	x = &xsk{fd: fd, queue: c.queue, frameSize: uint64(c.frameSize)}
	made := x
	defer func() {
		if err != nil {
			made.close() // x is nil by now: every error return sets it
		}
	}()
	size := c.frames * c.frameSize
	x.umem, err = unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("allocate %d-byte UMEM: %w", size, err)
	}
	reg := unix.XDPUmemReg{
		Addr: uint64(uintptr(unsafe.Pointer(&x.umem[0]))), Len: uint64(size), Size: uint32(c.frameSize),
	}
	if err := setsockopt(fd, unix.XDP_UMEM_REG, unsafe.Pointer(&reg), unsafe.Sizeof(reg)); err != nil {
		if errors.Is(err, unix.ENOMEM) || errors.Is(err, unix.EPERM) || errors.Is(err, unix.ENOBUFS) {
			var rl unix.Rlimit
			unix.Getrlimit(unix.RLIMIT_MEMLOCK, &rl)
			return nil, fmt.Errorf("register %d-byte UMEM: memlock limit too low (RLIMIT_MEMLOCK %d bytes; raise it with ulimit -l, or run with CAP_IPC_LOCK or as root): %w", size, rl.Cur, err)
		}
		return nil, fmt.Errorf("register UMEM: %w", err)
	}
	for _, o := range []struct {
		opt  int
		name string
	}{{unix.XDP_UMEM_FILL_RING, "fill"}, {unix.XDP_UMEM_COMPLETION_RING, "completion"}, {unix.XDP_RX_RING, "RX"}, {unix.XDP_TX_RING, "TX"}} {
		if err := unix.SetsockoptInt(fd, unix.SOL_XDP, o.opt, c.ringSize); err != nil {
			return nil, fmt.Errorf("size %s ring: %w", o.name, err)
		}
	}
	var off unix.XDPMmapOffsets
	if err := getsockopt(fd, unix.XDP_MMAP_OFFSETS, unsafe.Pointer(&off), unsafe.Sizeof(off)); err != nil {
		return nil, fmt.Errorf("get ring offsets: %w", err)
	}
	n := uint32(c.ringSize)
	if err := x.fill.mmap(fd, unix.XDP_UMEM_PGOFF_FILL_RING, off.Fr, n, false); err != nil {
		return nil, fmt.Errorf("map fill ring: %w", err)
	}
	if err := x.comp.mmap(fd, unix.XDP_UMEM_PGOFF_COMPLETION_RING, off.Cr, n, false); err != nil {
		return nil, fmt.Errorf("map completion ring: %w", err)
	}
	if err := x.rx.mmap(fd, unix.XDP_PGOFF_RX_RING, off.Rx, n, true); err != nil {
		return nil, fmt.Errorf("map RX ring: %w", err)
	}
	if err := x.tx.mmap(fd, unix.XDP_PGOFF_TX_RING, off.Tx, n, true); err != nil {
		return nil, fmt.Errorf("map TX ring: %w", err)
	}
	// The first half of the frames receive, the second half transmit.
	nrx := c.frames / 2
	if nrx > c.ringSize {
		nrx = c.ringSize
	}
	prod := x.fill.loadProd()
	for i := 0; i < nrx; i++ {
		x.fill.addrs[(prod+uint32(i))&x.fill.mask] = uint64(i) * x.frameSize
	}
	x.fill.storeProd(prod + uint32(nrx))
	for i := c.frames / 2; i < c.frames; i++ {
		x.txFree = append(x.txFree, uint64(i)*x.frameSize)
	}

	// Multi-buffer (XDP_USE_SG) lets a frame larger than one UMEM frame
	// (a 4096-byte RoCE MTU packet with its headers) span several
	// descriptors chained with XDP_PKT_CONTD. Kernels before 6.6 know no
	// XDP_USE_SG and refuse the bind with EINVAL: bind again without it
	// (Open then checks that the MTU fits one frame).
	x.sg = true
	bind := func(mode uint16) error {
		err := xskBind(fd, &unix.SockaddrXDP{Flags: unix.XDP_USE_NEED_WAKEUP | unix.XDP_USE_SG | mode, Ifindex: uint32(c.ifindex), QueueID: uint32(c.queue)})
		if !errors.Is(err, unix.EINVAL) {
			return err
		}
		if xskBind(fd, &unix.SockaddrXDP{Flags: unix.XDP_USE_NEED_WAKEUP | mode, Ifindex: uint32(c.ifindex), QueueID: uint32(c.queue)}) != nil {
			return err
		}
		x.sg = false
		return nil
	}
	if c.zeroCopy {
		if err = bind(unix.XDP_ZEROCOPY); err == nil {
			x.zeroCopy = true
			return x, nil
		}
	}
	// Copy mode: veth and generic XDP support nothing else. A queue whose
	// previous socket was just closed stays busy until the kernel's
	// deferred release of its buffer pool has run: retry for a moment.
	for deadline := time.Now().Add(time.Second); ; time.Sleep(10 * time.Millisecond) {
		err = bind(unix.XDP_COPY)
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		if errors.Is(err, unix.EBUSY) {
			return nil, fmt.Errorf("bind AF_XDP socket to queue %d: another AF_XDP socket holds it: %w", c.queue, err)
		}
		return nil, fmt.Errorf("bind AF_XDP socket to queue %d: %w", c.queue, err)
	}
	return x, nil
}

// xskBind binds an AF_XDP socket (a variable so that tests can play an
// older kernel).
var xskBind = unix.Bind

func (r *ring) mmap(fd int, pgoff int64, off unix.XDPRingOffset, n uint32, desc bool) error {
	elem := uint64(8)
	if desc {
		elem = uint64(unsafe.Sizeof(unix.XDPDesc{}))
	}
	length := off.Desc + uint64(n)*elem
	mem, err := unix.Mmap(fd, pgoff, int(length), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return err
	}
	r.mem = mem
	base := unsafe.Pointer(&mem[0])
	r.prod = (*uint32)(unsafe.Add(base, off.Producer))
	r.cons = (*uint32)(unsafe.Add(base, off.Consumer))
	r.flags = (*uint32)(unsafe.Add(base, off.Flags))
	r.size, r.mask = n, n-1
	if desc {
		r.descs = unsafe.Slice((*unix.XDPDesc)(unsafe.Add(base, off.Desc)), n)
	} else {
		r.addrs = unsafe.Slice((*uint64)(unsafe.Add(base, off.Desc)), n)
	}
	return nil
}

func (r *ring) unmap() {
	if r.mem != nil {
		unix.Munmap(r.mem)
		*r = ring{}
	}
}

func (x *xsk) close() {
	for _, r := range []*ring{&x.fill, &x.comp, &x.rx, &x.tx} {
		r.unmap()
	}
	if x.fd >= 0 {
		unix.Close(x.fd)
		x.fd = -1
	}
	if x.umem != nil {
		unix.Munmap(x.umem)
		x.umem = nil
	}
}

// frame returns the UMEM bytes of a descriptor, or nil when it points
// outside the UMEM (the kernel never does that, but the bound is cheap).
func (x *xsk) frame(addr uint64, n uint32) []byte {
	end := addr + uint64(n)
	if end > uint64(len(x.umem)) || end < addr {
		return nil
	}
	return x.umem[addr:end:end]
}

// refill returns RX frames to the fill ring.
func (x *xsk) refill(addrs []uint64) {
	prod := x.fill.loadProd()
	for i, a := range addrs {
		// In aligned mode the kernel takes any address inside a frame;
		// hand back the frame's start.
		x.fill.addrs[(prod+uint32(i))&x.fill.mask] = a - a%x.frameSize
	}
	x.fill.storeProd(prod + uint32(len(addrs)))
}

// reclaim moves completed TX frames back to the free list.
func (x *xsk) reclaim() {
	cons, prod := x.comp.loadCons(), x.comp.loadProd()
	for c := cons; c != prod; c++ {
		a := x.comp.addrs[c&x.comp.mask]
		x.txFree = append(x.txFree, a-a%x.frameSize)
	}
	x.txOut -= int(prod - cons)
	x.comp.storeCons(prod)
}

// kick asks the kernel to process the TX ring. In copy mode it always
// needs this sendto (docs/platform.md); in zero-copy mode only when the
// driver set need-wakeup.
//
// In copy mode one sendto transmits at most a small batch of descriptors
// (32 in current kernels) and answers EAGAIN when more are left, or when
// the completion ring is full; the rest would wait for the next send, which
// in a request/response protocol may be a long time. So it keeps kicking,
// reclaiming completions in between, until the kernel has taken
// everything or stops making progress.
func (x *xsk) kick() error {
	if x.zeroCopy && !x.tx.needWakeup() {
		return nil
	}
	prod := x.tx.loadProd()
	for tries := 0; ; tries++ {
		before := x.tx.loadCons()
		errno := xskSendto(x.fd)
		switch errno {
		case 0, unix.EAGAIN, unix.EBUSY, unix.ENOBUFS:
		default:
			return errno
		}
		x.reclaim()
		cons := x.tx.loadCons()
		if cons == prod || x.zeroCopy || (cons == before && tries > 0) || tries >= 64 {
			// Done, or the kernel is not taking more now (a full
			// device queue): the frames stay queued for the next kick,
			// which the link's TX retry timer makes if no send does.
			return nil
		}
	}
}

// txPending reports whether the TX ring holds frames the kernel has not
// taken.
func (x *xsk) txPending() bool { return x.tx.loadCons() != x.tx.loadProd() }

// xskSendto is the TX kick (a variable so that tests can play a device
// whose queue is full). It and wakeRx's call never block: raw, so that
// they do not wake the runtime's monitor (internal/rawsys).
var xskSendto = func(fd int) unix.Errno {
	_, _, errno := unix.RawSyscall6(unix.SYS_SENDTO, uintptr(fd), 0, 0, unix.MSG_DONTWAIT, 0, 0)
	return errno
}

// wakeRx tells the kernel the fill ring has frames again when it asked
// to be told.
func (x *xsk) wakeRx() {
	if x.fill.needWakeup() {
		unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(x.fd), 0, 0, unix.MSG_DONTWAIT, 0, 0)
	}
}

// Statistics are the kernel's counters for one AF_XDP socket.
type Statistics = unix.XDPStatistics

func (x *xsk) stats() (Statistics, error) {
	var s Statistics
	err := getsockopt(x.fd, unix.XDP_STATISTICS, unsafe.Pointer(&s), unsafe.Sizeof(s))
	return s, err
}

func setsockopt(fd, opt int, p unsafe.Pointer, n uintptr) error {
	_, _, errno := unix.Syscall6(unix.SYS_SETSOCKOPT, uintptr(fd), unix.SOL_XDP, uintptr(opt), uintptr(p), n, 0)
	if errno != 0 {
		return errno
	}
	return nil
}

func getsockopt(fd, opt int, p unsafe.Pointer, n uintptr) error {
	l := uint32(n)
	_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_XDP, uintptr(opt), uintptr(p), uintptr(unsafe.Pointer(&l)), 0)
	if errno != 0 {
		return errno
	}
	return nil
}
