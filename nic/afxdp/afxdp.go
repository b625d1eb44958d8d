// Package afxdp is the fast nic.Link: AF_XDP sockets fed by an XDP program,
// both driven from Go (github.com/cilium/ebpf for the program,
// golang.org/x/sys/unix for the sockets and their rings).
//
// The XDP program (written with cilium/ebpf's asm package, so building
// needs no clang) redirects UDP packets to the RoCEv2 port into an XSKMAP
// slot per receive queue and passes everything else to the kernel, so ARP,
// NDP, ICMP and other traffic keep working. One AF_XDP socket is bound per
// receive queue, each with its own UMEM and fill, completion, RX and TX
// rings, need-wakeup, and multi-buffer (XDP_USE_SG) so that frames larger
// than a UMEM frame (a 4096-byte RoCE MTU packet with its headers) work.
//
// The link writes the Ethernet, IP and UDP headers itself (IPv4: ID 0, DF,
// TTL 64; a UDP checksum, which rdma_rxe omits over IPv4 but which lets a
// kernel-UDP peer drop damaged packets) and computes the ICRC over exactly those
// headers. On receive it sees the real headers, so it verifies the whole
// ICRC over IPv4 and IPv6 alike (nic.ICRCVerified). Next hops and their
// MAC addresses come from the kernel's routing and neighbour tables
// through netlink.
//
// Open needs root, or CAP_NET_ADMIN, CAP_BPF and CAP_NET_RAW plus either
// CAP_IPC_LOCK or an RLIMIT_MEMLOCK that holds the UMEM (16 MiB per queue
// by default); both are tested. It must be called in the network namespace
// of the interface; the link keeps working from any goroutine afterwards.
package afxdp

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/nic"
)

// Mode is the XDP attach mode.
type Mode int

const (
	// ModeAuto tries native (driver) mode and falls back to generic.
	ModeAuto Mode = iota
	// ModeNative attaches in the driver's receive path.
	ModeNative
	// ModeGeneric attaches after the kernel built an skb: slower, works
	// on every interface.
	ModeGeneric
)

func (m Mode) String() string {
	switch m {
	case ModeNative:
		return "native"
	case ModeGeneric:
		return "generic"
	}
	return "auto"
}

// ParseMode reads "auto", "native" (or "drv") and "generic" (or "skb").
func ParseMode(s string) (Mode, error) {
	switch s {
	case "", "auto":
		return ModeAuto, nil
	case "native", "drv", "driver":
		return ModeNative, nil
	case "generic", "skb":
		return ModeGeneric, nil
	}
	return 0, fmt.Errorf("afxdp: unknown XDP mode %q (want auto, native or generic)", s)
}

// Config describes the link to open.
type Config struct {
	// Interface is the network interface's name.
	Interface string
	// Addr is the local address to use (default: the interface's first
	// IPv4 address, and its first global IPv6 address as well).
	Addr netip.Addr
	// Port is the UDP port redirected to the sockets and used as the
	// source port (0: 4791).
	Port int
	// Mode chooses the XDP attach mode.
	Mode Mode
	// ZeroCopy tries a zero-copy bind first (falls back to copy mode;
	// veth only has copy mode).
	ZeroCopy bool
	// Queues is how many receive queues get a socket (0: all of the
	// interface's RX queues).
	Queues int
	// Frames is the UMEM size per socket in 4 KiB frames (0: 4096 for up
	// to 4 queues, fewer per socket beyond, at least 512); half receive,
	// half transmit.
	Frames int
	// RingSize is the size of each ring (0: Frames/2; a power of two).
	RingSize int
	// Batch is what BatchSize reports (0: 64).
	Batch int
	// NoUDPChecksum sends IPv4 packets with UDP checksum 0, as rdma_rxe
	// does, saving a pass over each packet. By default the checksum is
	// computed so that a peer on kernel UDP sockets, which without
	// privilege checks only 16 bits of an IPv4 ICRC (nic/udp), also has
	// its kernel drop damaged packets. (IPv6 always carries a checksum.)
	NoUDPChecksum bool
	// noFrags loads a single-buffer program (tests of the MTU limit).
	noFrags bool
	// ResolveWait bounds how long a resolution waits for the kernel to
	// resolve an unknown neighbour (0: 1s). Send never waits: it resolves
	// in the background (see Send); Resolve waits.
	ResolveWait time.Duration
}

const frameSize = 4096 // the largest UMEM frame size on x86 (a page)

// Link is an AF_XDP nic.Link.
type Link struct {
	ifname   string
	ifindex  int
	mac      [6]byte
	mtu      int
	port     uint16
	addr4    netip.Addr
	addr6    netip.Addr
	addrs    []netip.Addr
	batch    int
	mode     Mode
	frags    bool
	udpCsum4 bool
	prog     *ebpf.Program
	xsks     *ebpf.Map
	xdp      link.Link
	socks    []*xsk
	neigh    *neighbours
	// ep is an epoll instance watching every socket, handed to the Go
	// runtime's poller so that a waiting Recv parks its goroutine instead
	// of blocking a thread in poll(2); closing it wakes Recv on Close.
	ep        *os.File
	epRaw     syscall.RawConn
	closed    atomic.Bool
	closeOnce sync.Once

	rxMu     sync.Mutex
	epEvents []unix.EpollEvent
	rxFn     func(fd uintptr) bool // l.rxReady, bound once
	rxPkts   []nic.Packet          // Recv's argument, for rxFn
	rxN      int
	rxNext   int      // socket to look at first, for fairness
	rxDone   []uint64 // scratch: RX frames to give back
	scratch  []byte   // scratch for the rare IPv4 header with options

	txMu sync.Mutex
	// txRetry kicks the TX ring again while the kernel has left frames
	// on it. In copy mode a kick stops at a full device queue (virtio-net
	// in a slow guest fills its 256 entries) and nothing in the kernel
	// resumes when the queue drains: without a retry the frames, often
	// the last of a burst, the one asking for an ACK, wait for the next
	// send, which in a request/response protocol is the sender's
	// retransmission after an ACK timeout. Armed and run under txMu.
	txRetry      *time.Timer
	txRetryDelay time.Duration
	txRetries    atomic.Uint64
	// statsMu keeps the sockets alive for SocketStats and QueuePackets.
	statsMu sync.RWMutex

	rxPackets, txPackets atomic.Uint64
	rxBytes, txBytes     atomic.Uint64
	rxBad, rxMalformed   atomic.Uint64
	rxTruncated          atomic.Uint64
	txErrors             atomic.Uint64
}

var _ nic.RawSender = (*Link)(nil)

// permErr adds what privileges are needed to a permission error.
func permErr(err error) error {
	if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) {
		return fmt.Errorf("not permitted: run as root or with CAP_NET_ADMIN, CAP_BPF and CAP_NET_RAW: %w", err)
	}
	return err
}

// checkCaps reports missing capabilities up front, so that the first error
// a user sees is the one that matters. XDP attach and the XSKMAP need
// CAP_NET_ADMIN and CAP_BPF (CAP_SYS_ADMIN before 5.8), the AF_XDP socket
// CAP_NET_RAW.
func checkCaps() error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return nil // cannot tell: let the operations themselves fail
	}
	eff := uint64(data[0].Effective) | uint64(data[1].Effective)<<32
	has := func(c int) bool { return eff&(1<<uint(c)) != 0 }
	var missing []string
	if !has(unix.CAP_NET_ADMIN) {
		missing = append(missing, "CAP_NET_ADMIN")
	}
	if !has(unix.CAP_BPF) && !has(unix.CAP_SYS_ADMIN) {
		missing = append(missing, "CAP_BPF")
	}
	if !has(unix.CAP_NET_RAW) {
		missing = append(missing, "CAP_NET_RAW")
	}
	if len(missing) > 0 {
		return fmt.Errorf("afxdp: not permitted: run as root or with CAP_NET_ADMIN, CAP_BPF and CAP_NET_RAW (missing %s)", strings.Join(missing, ", "))
	}
	return nil
}

// raiseMemlock lifts RLIMIT_MEMLOCK, which the UMEM is charged to unless
// the process has CAP_IPC_LOCK (8 MiB by default here: less than one
// socket's UMEM). BPF maps and programs are charged to the memory cgroup
// on current kernels.
func raiseMemlock() {
	inf := unix.Rlimit{Cur: unix.RLIM_INFINITY, Max: unix.RLIM_INFINITY}
	if unix.Setrlimit(unix.RLIMIT_MEMLOCK, &inf) == nil {
		return
	}
	var rl unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_MEMLOCK, &rl) == nil && rl.Cur < rl.Max {
		rl.Cur = rl.Max
		unix.Setrlimit(unix.RLIMIT_MEMLOCK, &rl)
	}
}

// Open attaches the XDP program to the interface and binds the sockets.
// Everything is torn down again if any step fails.
func Open(cfg Config) (l *Link, err error) {
	if cfg.Port == 0 {
		cfg.Port = nic.RoCEv2Port
	}
	if cfg.Port < 1 || cfg.Port > 65535 {
		return nil, fmt.Errorf("afxdp: bad port %d", cfg.Port)
	}
	if cfg.RingSize != 0 && (cfg.RingSize&(cfg.RingSize-1) != 0 || cfg.RingSize < 4) {
		return nil, fmt.Errorf("afxdp: ring size %d must be a power of two", cfg.RingSize)
	}
	if cfg.Frames != 0 && cfg.Frames < 4 {
		return nil, fmt.Errorf("afxdp: %d UMEM frames are too few", cfg.Frames)
	}
	if cfg.Batch == 0 {
		cfg.Batch = 64
	}
	if cfg.ResolveWait == 0 {
		cfg.ResolveWait = time.Second
	}
	nl, err := netlink.LinkByName(cfg.Interface)
	if err != nil {
		return nil, fmt.Errorf("afxdp: no such interface %q: %w", cfg.Interface, err)
	}
	if err := checkCaps(); err != nil {
		return nil, err
	}
	at := nl.Attrs()
	if len(at.HardwareAddr) != 6 {
		return nil, fmt.Errorf("afxdp: %s is not an Ethernet interface", cfg.Interface)
	}
	l = &Link{ifname: at.Name, ifindex: at.Index, mac: [6]byte(at.HardwareAddr), mtu: at.MTU,
		port: uint16(cfg.Port), batch: cfg.Batch, mode: cfg.Mode, udpCsum4: !cfg.NoUDPChecksum}
	built := l
	defer func() {
		if err != nil {
			built.teardown() // every return below sets err; l is nil by then
		}
	}()
	if err := l.pickAddrs(nl, cfg.Addr); err != nil {
		return nil, err
	}
	// The kernel chains at most MAX_SKB_FRAGS+1 (18) descriptors per
	// packet, each a UMEM frame less the headroom copy mode keeps.
	if limit := 18*frameSize - 512; l.mtu+14 > limit {
		return nil, fmt.Errorf("afxdp: MTU %d of %s is too large for AF_XDP multi-buffer frames", l.mtu, l.ifname)
	}
	// The XSKMAP has a slot for every RX queue the device could use;
	// sockets go on the queues in use (see below).
	slots := cfg.Queues
	if slots == 0 {
		slots = max(at.NumRxQueues, 1)
	}
	queues := slots
	if cfg.Frames == 0 {
		// 16 MiB of UMEM per socket for a few queues, less per socket
		// on a NIC with many queues: 64 MiB in all, 2 MiB at least.
		cfg.Frames = 4096
		for cfg.Frames > 512 && cfg.Frames*queues > 16384 {
			cfg.Frames /= 2
		}
	}
	if cfg.RingSize == 0 {
		// The largest power of two that holds half the frames.
		cfg.RingSize = 4
		for cfg.RingSize*2 <= cfg.Frames/2 {
			cfg.RingSize *= 2
		}
	}
	raiseMemlock()

	l.prog, l.xsks, l.frags, err = loadProgram(l.port, slots, xdpPass, !cfg.noFrags)
	if err != nil {
		return nil, fmt.Errorf("afxdp: %s: %w", l.ifname, err)
	}
	if err := l.attach(); err != nil {
		return nil, err
	}
	if cfg.Queues == 0 {
		// A device may have more RX queues than it uses: a multi-queue
		// virtio-net NIC in a guest with fewer vCPUs uses one pair per
		// vCPU, and the kernel refuses a bind to a queue beyond those
		// (EINVAL). Native XDP may add queues, so count after the
		// attach.
		if n, err := rxQueuesInUse(l.ifname); err == nil && n >= 1 && n < queues {
			queues = n
		}
	}
	for q := 0; q < queues; q++ {
		x, err := newXSK(xskConfig{ifindex: l.ifindex, queue: q, frames: cfg.Frames, frameSize: frameSize,
			ringSize: cfg.RingSize, zeroCopy: cfg.ZeroCopy})
		if err != nil {
			return nil, fmt.Errorf("afxdp: %s queue %d: %w", l.ifname, q, err)
		}
		l.socks = append(l.socks, x)
		if err := l.xsks.Put(uint32(q), uint32(x.fd)); err != nil {
			return nil, fmt.Errorf("afxdp: %s: insert queue %d socket into XSKMAP: %w", l.ifname, q, err)
		}
	}
	// Without multi-buffer sockets the kernel drops every frame longer
	// than one UMEM frame less the XDP headroom (256 bytes).
	if !l.multiBuffer() {
		if limit := frameSize - 256 - 14; l.mtu > limit {
			return nil, fmt.Errorf("afxdp: MTU %d of %s needs multi-buffer AF_XDP sockets (XDP_USE_SG, Linux 6.6 and later), which this kernel refuses: lower the MTU to %d or less", l.mtu, l.ifname, limit)
		}
	}
	if err := l.setupPoll(); err != nil {
		return nil, fmt.Errorf("afxdp: %s: %w", l.ifname, err)
	}
	l.txRetry = time.AfterFunc(time.Hour, l.retryTx)
	l.txRetry.Stop()
	l.txRetryDelay = txRetryMin
	l.neigh, err = newNeighbours(l.ifindex, l.ifname, cfg.ResolveWait)
	if err != nil {
		return nil, fmt.Errorf("afxdp: %s: %w", l.ifname, err)
	}
	l.rxDone = make([]uint64, 0, cfg.RingSize)
	l.scratch = make([]byte, 60+8+l.mtu)
	return l, nil
}

func (l *Link) pickAddrs(nl netlink.Link, want netip.Addr) error {
	as, err := netlink.AddrList(nl, netlink.FAMILY_ALL)
	if err != nil {
		return fmt.Errorf("afxdp: list addresses of %s: %w", l.ifname, err)
	}
	want = want.Unmap()
	found := false
	for _, a := range as {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		if want.IsValid() {
			if ip == want {
				found = true
			}
			continue
		}
		if ip.Is4() && !l.addr4.IsValid() {
			l.addr4 = ip
		}
		if ip.Is6() && !ip.IsLinkLocalUnicast() && !l.addr6.IsValid() {
			l.addr6 = ip
		}
	}
	if want.IsValid() {
		if !found {
			return fmt.Errorf("afxdp: %v is not an address of %s", want, l.ifname)
		}
		if want.Is4() {
			l.addr4 = want
		} else {
			l.addr6 = want
		}
	}
	for _, a := range []netip.Addr{l.addr4, l.addr6} {
		if a.IsValid() {
			l.addrs = append(l.addrs, a)
		}
	}
	if len(l.addrs) == 0 {
		return fmt.Errorf("afxdp: %s has no IPv4 or global IPv6 address", l.ifname)
	}
	return nil
}

// attach links the program to the interface in the configured mode.
func (l *Link) attach() error {
	try := func(flags link.XDPAttachFlags, what string) error {
		xl, err := link.AttachXDP(link.XDPOptions{Program: l.prog, Interface: l.ifindex, Flags: flags})
		if err == nil {
			l.xdp = xl
			return nil
		}
		switch {
		case errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES):
			return fmt.Errorf("afxdp: attach XDP to %s: %w", l.ifname, permErr(err))
		case errors.Is(err, unix.EBUSY) || errors.Is(err, unix.EEXIST):
			return fmt.Errorf("afxdp: attach XDP to %s: another XDP program is attached (see `ip link show dev %s`; remove it with `ip link set dev %s xdp off`): %w", l.ifname, l.ifname, l.ifname, err)
		case errors.Is(err, unix.ERANGE) || (errors.Is(err, unix.EINVAL) && !l.frags && l.mtu > 3506):
			return fmt.Errorf("afxdp: attach XDP to %s in %s mode: MTU %d is too large for this program type (frags-aware program: %v; lower the MTU or use generic mode): %w", l.ifname, what, l.mtu, l.frags, err)
		}
		return fmt.Errorf("afxdp: attach XDP to %s in %s mode: %w", l.ifname, what, err)
	}
	switch l.mode {
	case ModeNative:
		return try(link.XDPDriverMode, "native")
	case ModeGeneric:
		return try(link.XDPGenericMode, "generic")
	}
	errNative := try(link.XDPDriverMode, "native")
	if errNative == nil {
		l.mode = ModeNative
		return nil
	}
	if err := try(link.XDPGenericMode, "generic"); err != nil {
		return fmt.Errorf("%w (native mode: %v)", err, errNative)
	}
	l.mode = ModeGeneric
	return nil
}

// teardown releases everything, in the reverse order of Open. The
// program is detached first so that no packet is redirected to a socket
// being closed.
func (l *Link) teardown() {
	if l.xdp != nil {
		l.xdp.Close()
		l.xdp = nil
	}
	for _, x := range l.socks {
		x.close()
	}
	l.socks = nil
	if l.xsks != nil {
		l.xsks.Close()
	}
	if l.prog != nil {
		l.prog.Close()
	}
	if l.neigh != nil {
		l.neigh.close()
	}
	if l.ep != nil {
		l.ep.Close()
	}
}

// ControlSocket runs f with the descriptor of the link's first AF_XDP
// socket, for what needs a socket of the link (the daemon asks it for its
// network namespace). Like SocketStats it holds statsMu, so Close waits.
func (l *Link) ControlSocket(f func(fd uintptr)) error {
	l.statsMu.RLock()
	defer l.statsMu.RUnlock()
	if l.closed.Load() || len(l.socks) == 0 {
		return net.ErrClosed
	}
	f(uintptr(l.socks[0].fd))
	return nil
}

// Close implements nic.Link: it unblocks Recv, detaches the XDP program
// and closes the sockets.
func (l *Link) Close() error {
	err := net.ErrClosed
	l.closeOnce.Do(func() {
		l.closed.Store(true)
		if l.txRetry != nil {
			l.txRetry.Stop()
		}
		if l.ep != nil {
			l.ep.Close() // wakes a Recv parked on it
		}
		l.rxMu.Lock()
		l.txMu.Lock()
		l.statsMu.Lock()
		l.teardown()
		l.statsMu.Unlock()
		l.txMu.Unlock()
		l.rxMu.Unlock()
		err = nil
	})
	return err
}

// The TX retry starts soon after a kick that left frames and backs off,
// doubling, while the kernel takes none (a device that is down).
const (
	txRetryMin = 50 * time.Microsecond
	txRetryMax = 10 * time.Millisecond
)

// armTxRetry schedules a kick if the kernel left frames on x's TX ring.
// Called with txMu held.
func (l *Link) armTxRetry(x *xsk) {
	if x.zeroCopy || !x.txPending() || l.closed.Load() {
		return
	}
	l.txRetry.Reset(l.txRetryDelay)
}

// retryTx is the TX retry timer's function.
func (l *Link) retryTx() {
	l.txMu.Lock()
	defer l.txMu.Unlock()
	if l.closed.Load() || len(l.socks) == 0 {
		return
	}
	x := l.socks[0]
	l.txRetries.Add(1)
	before := x.tx.loadCons()
	if err := x.kick(); err != nil {
		return // the device refuses: the next send reports it
	}
	if x.tx.loadCons() != before {
		l.txRetryDelay = txRetryMin
	} else {
		l.txRetryDelay = min(2*l.txRetryDelay, txRetryMax)
	}
	l.armTxRetry(x)
}

// setupPoll makes the epoll instance over all sockets and gives it to the
// runtime poller.
func (l *Link) setupPoll() error {
	epfd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return fmt.Errorf("epoll: %w", err)
	}
	for _, x := range l.socks {
		ev := unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(x.fd)}
		if err := unix.EpollCtl(epfd, unix.EPOLL_CTL_ADD, x.fd, &ev); err != nil {
			unix.Close(epfd)
			return fmt.Errorf("epoll: add queue %d: %w", x.queue, err)
		}
	}
	if err := unix.SetNonblock(epfd, true); err != nil {
		unix.Close(epfd)
		return fmt.Errorf("epoll: %w", err)
	}
	l.ep = os.NewFile(uintptr(epfd), "afxdp-"+l.ifname)
	if l.epRaw, err = l.ep.SyscallConn(); err != nil {
		return fmt.Errorf("epoll: %w", err)
	}
	l.epEvents = make([]unix.EpollEvent, len(l.socks))
	l.rxFn = l.rxReady
	return nil
}

// Mode returns the XDP mode the program is attached in.
func (l *Link) Mode() Mode { return l.mode }

// ZeroCopy reports whether the sockets are bound in zero-copy mode.
func (l *Link) ZeroCopy() bool { return len(l.socks) > 0 && l.socks[0].zeroCopy }

// multiBuffer reports whether every socket was bound with XDP_USE_SG.
func (l *Link) multiBuffer() bool {
	for _, x := range l.socks {
		if !x.sg {
			return false
		}
	}
	return true
}

// Frags reports whether the XDP program is frags-aware.
func (l *Link) Frags() bool { return l.frags }

// Interface returns the interface name.
func (l *Link) Interface() string { return l.ifname }

// Queues returns how many queues have a socket.
func (l *Link) Queues() int { return len(l.socks) }

// SocketStats returns the kernel's counters of each socket (drops, invalid
// descriptors, full rings).
func (l *Link) SocketStats() ([]Statistics, error) {
	// Not under rxMu: a waiting Recv holds it. The sockets live until
	// Close, which takes statsMu.
	l.statsMu.RLock()
	defer l.statsMu.RUnlock()
	var out []Statistics
	for _, x := range l.socks {
		s, err := x.stats()
		if err != nil {
			return nil, fmt.Errorf("afxdp: statistics of queue %d: %w", x.queue, err)
		}
		out = append(out, s)
	}
	return out, nil
}

// QueuePackets returns how many packets each queue's socket has taken off
// its RX ring (delivered or dropped), to see how traffic spreads.
func (l *Link) QueuePackets() []uint64 {
	l.statsMu.RLock()
	defer l.statsMu.RUnlock()
	out := make([]uint64, len(l.socks))
	for i, x := range l.socks {
		out[i] = x.rxPackets.Load()
	}
	return out
}

// MaxPacket is the largest RoCE packet (BTH through ICRC) the link sends
// over IPv4 (IPv6 packets are 20 bytes smaller).
func (l *Link) MaxPacket() int { return l.mtu - nic.Overhead(false) }

// BatchSize implements nic.Link.
func (l *Link) BatchSize() int { return l.batch }

// MTU implements nic.Link.
func (l *Link) MTU() int { return l.mtu }

// Addrs implements nic.Link. The slice is shared: do not modify it.
func (l *Link) Addrs() []netip.Addr { return l.addrs }

// Stats implements nic.Link.
func (l *Link) Stats() nic.Stats {
	return nic.Stats{
		RxPackets: l.rxPackets.Load(), TxPackets: l.txPackets.Load(),
		RxBytes: l.rxBytes.Load(), TxBytes: l.txBytes.Load(),
		RxICRCBad: l.rxBad.Load(), RxMalformed: l.rxMalformed.Load(),
		RxTruncated: l.rxTruncated.Load(), TxErrors: l.txErrors.Load(),
		// Every delivered packet had its whole ICRC checked.
		RxICRCVerified: l.rxPackets.Load(),
	}
}

// Resolve looks up (and if needed has the kernel resolve, waiting up to
// Config.ResolveWait) the MAC address of dst's next hop, so that a caller
// can report an unreachable peer when it connects, and its first packets
// are not dropped while Send resolves it in the background.
func (l *Link) Resolve(dst netip.Addr) error {
	if l.closed.Load() {
		return net.ErrClosed
	}
	_, err := l.neigh.lookup(dst.Unmap())
	return err
}

// rxQueuesInUse is the number of RX queues the device uses (ethtool's
// channels: RX-only plus combined), from ETHTOOL_GCHANNELS. Drivers
// without it return an error.
func rxQueuesInUse(ifname string) (int, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	// struct ethtool_channels: cmd, then max_rx, max_tx, max_other,
	// max_combined, rx_count, tx_count, other_count, combined_count.
	ch := new([9]uint32)
	ch[0] = unix.ETHTOOL_GCHANNELS
	var ifr struct {
		name [unix.IFNAMSIZ]byte
		data unsafe.Pointer
		_    [16]byte // the rest of struct ifreq's union
	}
	if len(ifname) >= unix.IFNAMSIZ {
		return 0, unix.EINVAL
	}
	copy(ifr.name[:], ifname)
	ifr.data = unsafe.Pointer(ch)
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr)))
	runtime.KeepAlive(ch)
	if e != 0 {
		return 0, e
	}
	return int(ch[5] + ch[8]), nil
}
