// Package verbs is softroce's public API: the libibverbs object model
// (device, protection domain, memory region, completion queue, queue pair,
// work requests and completions) in idiomatic Go, over any nic.Link.
//
// The nouns, rules and error classes are those of libibverbs, so code
// reads like a verbs program:
//
//	dev, _ := verbs.Open(link, nil)
//	pd, _ := dev.AllocPD()
//	mr, _ := pd.RegMR(buf, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
//	cq, _ := dev.CreateCQ(64)
//	qp, _ := pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 64, MaxRecvWR: 64}})
//	qp.Connect(peerInfo, nil) // RESET -> INIT -> RTR -> RTS
//	qp.PostSend(&verbs.SendWR{Opcode: verbs.WRRDMAWrite, ...})
//	n := cq.Poll(wcs)
//
// UD QPs (QPTypeUD, brought up by QP.ReadyUD) send datagrams through
// address handles (PD.CreateAH; SendWR{AH: ah.AV(), RemoteQPN, RemoteQKey})
// and receive them behind a GRHLen-byte GRH; Device.CreateGSI makes QP1.
//
// The device runs on two goroutines (receive, timers), never one per QP.
// Work requests, SGEs, opcodes and send flags are package wr's, re-exported
// here. The transport itself is not handed out: Device.Stats and QP.Stats
// return snapshots of its counters, and Device.SetPacketTrace shows its
// packets.
package verbs

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/softroce/softroce/cc/dcqcn"
	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/internal/devsync"
	"github.com/softroce/softroce/memreg"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/qpstate"
	"github.com/softroce/softroce/transport/engine"
	// The transport services register with the engine when linked in.
	_ "github.com/softroce/softroce/transport/rc"
	_ "github.com/softroce/softroce/transport/uc"
	_ "github.com/softroce/softroce/transport/ud"
	"github.com/softroce/softroce/wr"
)

// Re-exported types, so a program needs only this package.
type (
	// SendWR is a send work request (struct ibv_send_wr).
	SendWR = wr.SendWR
	// RecvWR is a receive work request (struct ibv_recv_wr).
	RecvWR = wr.RecvWR
	// SGE is a scatter/gather element (struct ibv_sge).
	SGE = wr.SGE
	// WROpcode is enum ibv_wr_opcode.
	WROpcode = wr.Opcode
	// SendFlags are enum ibv_send_flags.
	SendFlags = wr.SendFlags
	// WC is a work completion (struct ibv_wc).
	WC = cq.WC
	// CQ is a completion queue.
	CQ = cq.CQ
	// MR is a registered memory region.
	MR = memreg.MR
	// Access are memory and QP access flags (enum ibv_access_flags).
	Access = memreg.Access
	// QPAttr are modify-QP attributes (struct ibv_qp_attr).
	QPAttr = qpstate.Attr
	// AttrMask selects attributes (enum ibv_qp_attr_mask).
	AttrMask = qpstate.AttrMask
	// QPState is enum ibv_qp_state.
	QPState = qpstate.State
	// QPCap are the queue capacities (struct ibv_qp_cap).
	QPCap = qpstate.Cap
	// AddressVector is the RoCEv2 address handle part of QPAttr.
	AddressVector = qpstate.AddressVector
)

// Work request opcodes, flags, access flags and states, re-exported.
const (
	WRRDMAWrite         = wr.RDMAWrite
	WRRDMAWriteWithImm  = wr.RDMAWriteWithImm
	WRSend              = wr.Send
	WRSendWithImm       = wr.SendWithImm
	WRRDMARead          = wr.RDMARead
	WRAtomicCmpAndSwp   = wr.AtomicCmpAndSwp
	WRAtomicFetchAndAdd = wr.AtomicFetchAndAdd
	WRSendWithInv       = wr.SendWithInv
	WRAtomicWrite       = wr.AtomicWrite
	WRLocalInv          = wr.LocalInv // invalidate InvRKey (a type 2 window or an MR)
	WRBindMW            = wr.BindMW   // bind a type 2 window (Bind, see MW.BindWR)

	SendFence     = wr.Fence
	SendSignaled  = wr.Signaled
	SendSolicited = wr.Solicited
	SendInline    = wr.Inline

	AccessLocalWrite   = memreg.AccessLocalWrite
	AccessRemoteWrite  = memreg.AccessRemoteWrite
	AccessRemoteRead   = memreg.AccessRemoteRead
	AccessRemoteAtomic = memreg.AccessRemoteAtomic
	AccessMWBind       = memreg.AccessMWBind

	StateReset = qpstate.Reset
	StateInit  = qpstate.Init
	StateRTR   = qpstate.RTR
	StateRTS   = qpstate.RTS
	StateSQD   = qpstate.SQD
	StateSQE   = qpstate.SQE
	StateErr   = qpstate.Err
)

// Device limits reported by QueryDevice and enforced by the API.
const (
	MaxQPWR     = 16384
	MaxSGE      = 32
	MaxCQE      = cq.MaxDepth
	MaxInline   = 256
	MaxQPRDAtom = 128
	MaxMsgSize  = 1 << 31
	VendorID    = 0x5052 // arbitrary, not a registered OUI
	deviceName  = "softroce0"

	// DefaultMaxQP and DefaultMaxCQ are max_qp and max_cq when Options
	// leave them zero: how many QPs and CQs may exist at once.
	DefaultMaxQP = 1 << 16
	DefaultMaxCQ = 1 << 16

	// asyncQueueLen is how many async events wait for AsyncEvents' reader.
	asyncQueueLen = 64
)

// Options tune Open. The zero value (or nil) is fine.
type Options struct {
	// Name is the device name (default "softroce0").
	Name string
	// Limits of the memory-region table.
	Limits memreg.Limits
	// MaxQP and MaxCQ bound the QPs and CQs alive at once (max_qp, max_cq
	// in QueryDevice); 0 means DefaultMaxQP, DefaultMaxCQ.
	MaxQP, MaxCQ int
	// BusyPoll, if positive, makes the device's receive loop poll the
	// link for up to this long before it sleeps (engine.DriverConfig.BusyPoll):
	// lower latency for a core's worth of CPU. Off by default.
	//
	// In this mode a Poll of the device's CQs that finds one empty also
	// runs the device's receive path once on the polling goroutine
	// (engine.Driver.PollInline): a consumer that spins on CQ.Poll receives
	// its completion, and sends what follows from it, without a hand-off
	// from the receive goroutine, which sleeps while consumers poll. The
	// goroutine calling Poll must then hold no lock that a completion's
	// delivery (a CQ push hook) takes.
	BusyPoll time.Duration
	// NoInlineWait keeps a consumer blocked in CQ.Wait off the receive
	// path: the device's receive goroutine receives every packet and
	// hands completions over (a second wake-up per hop). By default, in
	// blocking mode on a link that supports it (nic/udp), a consumer
	// waiting on an empty CQ receives and handles packets on its own
	// goroutine until its completion comes (engine.Driver.WaitInline); it
	// must then hold no lock that a completion's delivery takes. For
	// comparisons.
	NoInlineWait bool
	// CC, if set, turns congestion control on for every RC QP of the
	// device: DCQCN with these parameters (dcqcn.Default gives the
	// authors' published set; docs/congestion.md). Such a QP's packets
	// leave ECN-capable, CE marks it receives are answered with CNPs, and
	// the CNPs it receives slow its requester down. Nil (the default)
	// leaves it off: packets carry the address vector's traffic class as
	// given and CNPs are counted and dropped. ConnectOptions.CC overrides
	// it per QP.
	CC *dcqcn.Params
}

// CCDefaults are the DCQCN parameters a QP gets when ConnectOptions.CC
// asks for DCQCN on a device without Options.CC: the authors' published
// set (dcqcn.Default) at a line rate of 10 Gb/s, about what one core of a
// software RoCE stack sends.
func CCDefaults() dcqcn.Params { return dcqcn.Default(10e9) }

// Error classes of the verbs; test with errors.Is.
var (
	// ErrClosed: the device was closed.
	ErrClosed = errors.New("verbs: device closed")
	// ErrDeviceFatal: the link failed (IBV_EVENT_DEVICE_FATAL was raised);
	// the error also wraps the link's own error.
	ErrDeviceFatal = errors.New("verbs: device fatal error")
	// ErrBusy: a resource cannot be freed while others use it (PD.Dealloc
	// with QPs, SRQs, address handles or MRs, DestroyCQ with QPs,
	// SRQ.Destroy with QPs), or exists once per device (CreateGSI while
	// QP1 exists), like EBUSY from libibverbs.
	ErrBusy = memreg.ErrBusy
)

// deviceError is the error of a verb on a closed or failed device.
type deviceError struct {
	op    string // the verb; empty for Device.Err
	dev   string
	kind  error // ErrClosed or ErrDeviceFatal
	cause error // the link's error, with ErrDeviceFatal
}

func (e *deviceError) Error() string {
	s := "verbs: "
	if e.op != "" {
		s += e.op + ": "
	}
	if e.kind == ErrClosed {
		return s + "device " + e.dev + " is closed"
	}
	return s + "device " + e.dev + " failed: link error: " + e.cause.Error()
}

func (e *deviceError) Unwrap() []error {
	if e.cause != nil {
		return []error{e.kind, e.cause}
	}
	return []error{e.kind}
}

// busyError is the error of freeing a resource still in use.
type busyError struct{ msg string }

func (e *busyError) Error() string        { return e.msg }
func (e *busyError) Is(target error) bool { return target == ErrBusy }

// Device is an open softroce device on one Link (ibv_context).
type Device struct {
	name         string
	link         nic.Link
	mrs          *memreg.Table
	eng          *engine.Engine
	drv          *engine.Driver
	gids         []GIDEntry
	maxQP, maxCQ int
	busyPoll     bool // Options.BusyPoll > 0: CQ polls run the receive path
	// cc is the device's congestion-control parameters (Options.CC), nil
	// when off; ccDefault is what ConnectOptions.CC asks for without it.
	cc, ccDefault *dcqcn.Params

	events        chan AsyncEvent
	eventsDropped atomic.Uint64
	// estQPs maps QP numbers to the QPs whose Established channel the
	// engine's OnCommEst closes: read under the engine lock, where d.mu
	// cannot be taken.
	estQPs sync.Map
	closed atomic.Bool

	// mu guards the bookkeeping below and the PDs' QP counts. It is taken
	// before the engine lock, never while holding it: the engine's hooks
	// (async errors, CQ errors) run under the engine lock and use only the
	// event channel and atomics.
	mu   sync.Mutex
	qps  map[uint32]*QP
	cqs  map[*CQ]int // live CQs of this device: how many QP queues use each
	nSRQ int
}

// AsyncEvent is an asynchronous event (struct ibv_async_event). The
// element it concerns is QPNum for QP events, CQ for EventCQErr, SRQ for
// EventSRQLimitReached; a device event names none.
type AsyncEvent struct {
	Type   AsyncEventType
	QPNum  uint32
	CQ     *CQ
	SRQ    *SRQ
	Reason string
}

// AsyncEventType is enum ibv_event_type, with its values; softroce raises
// the types defined here.
type AsyncEventType uint8

const (
	// EventCQErr (IBV_EVENT_CQ_ERR): a CQ overran; the CQ is in error and
	// the QP whose completion it rejected moves to ERR.
	EventCQErr AsyncEventType = AsyncEventType(cq.EventCQErr)
	// EventQPFatal (IBV_EVENT_QP_FATAL): a QP entered ERR on a transport
	// error; Reason says which.
	EventQPFatal AsyncEventType = 1
	// EventCommEst (IBV_EVENT_COMM_EST): an RC or UC QP in RTR received
	// the first packet from its peer. QP.Established is closed then, and
	// also for a first packet that finds the QP already in RTS (where no
	// event is raised, as with hardware).
	EventCommEst AsyncEventType = 4
	// EventDeviceFatal (IBV_EVENT_DEVICE_FATAL): the link failed; every QP
	// was moved to ERR and later verbs fail with ErrDeviceFatal.
	EventDeviceFatal AsyncEventType = 8
	// EventSRQLimitReached (IBV_EVENT_SRQ_LIMIT_REACHED): fewer WQEs than
	// the armed limit are left on the SRQ; the limit is now disarmed.
	EventSRQLimitReached AsyncEventType = 15
	// EventQPLastWQEReached (IBV_EVENT_QP_LAST_WQE_REACHED): a QP created
	// on an SRQ entered ERR and takes no more WQEs from it.
	EventQPLastWQEReached AsyncEventType = 16
)

// String describes the event type in a few words, as ibv_event_type_str
// does for the C enum.
func (t AsyncEventType) String() string {
	switch t {
	case EventCQErr:
		return "CQ error"
	case EventCommEst:
		return "communication established"
	case EventQPFatal:
		return "QP fatal error"
	case EventDeviceFatal:
		return "device fatal error"
	case EventSRQLimitReached:
		return "SRQ limit reached"
	case EventQPLastWQEReached:
		return "last WQE reached"
	}
	return fmt.Sprintf("unknown event type %d", uint8(t))
}

// Open starts a device on link. The device owns the link: Close closes it.
func Open(link nic.Link, opts *Options) (*Device, error) {
	if link == nil {
		return nil, errors.New("verbs: Open needs a nic.Link")
	}
	if opts == nil {
		opts = &Options{}
	}
	name := opts.Name
	if name == "" {
		name = deviceName
	}
	if opts.MaxQP < 0 || opts.MaxCQ < 0 {
		return nil, fmt.Errorf("verbs: Options.MaxQP %d / MaxCQ %d must not be negative", opts.MaxQP, opts.MaxCQ)
	}
	if nic.IBMTU(link.MTU()) == 0 {
		return nil, fmt.Errorf("verbs: link MTU %d is too small for RoCE (need at least 336 for a 256-byte IB MTU)", link.MTU())
	}
	var cc *dcqcn.Params
	if opts.CC != nil {
		p := *opts.CC
		if err := p.Validate(); err != nil {
			return nil, fmt.Errorf("verbs: Options.CC: %w", err)
		}
		cc = &p
	}
	ccDefault := cc
	if ccDefault == nil {
		p := CCDefaults()
		ccDefault = &p
	}
	mrs := memreg.NewTable(opts.Limits)
	d := &Device{name: name, link: link, mrs: mrs, eng: engine.NewEngine(mrs), events: make(chan AsyncEvent, asyncQueueLen),
		maxQP: cmp.Or(opts.MaxQP, DefaultMaxQP), maxCQ: cmp.Or(opts.MaxCQ, DefaultMaxCQ), qps: map[uint32]*QP{}, cqs: map[*CQ]int{},
		busyPoll: opts.BusyPoll > 0, cc: cc, ccDefault: ccDefault}
	for _, a := range link.Addrs() {
		d.gids = append(d.gids, GIDEntry{GID: GIDFromAddr(a), Type: GIDTypeRoCEv2, Addr: a})
	}
	d.eng.OnAsyncError = func(qpn uint32, reason string) {
		d.raise(AsyncEvent{Type: EventQPFatal, QPNum: qpn, Reason: reason})
	}
	d.eng.OnCommEst = func(qpn uint32, rtr bool) {
		if q, ok := d.estQPs.Load(qpn); ok {
			q.(*QP).notifyEst()
		}
		if rtr {
			d.raise(AsyncEvent{Type: EventCommEst, QPNum: qpn})
		}
	}
	d.eng.OnLastWQE = func(qpn uint32) {
		d.raise(AsyncEvent{Type: EventQPLastWQEReached, QPNum: qpn})
	}
	d.drv = engine.NewDriverWith(d.eng, link, engine.DriverConfig{BusyPoll: opts.BusyPoll, NoInlineWait: opts.NoInlineWait, OnLinkError: func(err error) {
		if d.closed.Load() {
			return // an error from a link being closed is no news
		}
		d.raise(AsyncEvent{Type: EventDeviceFatal, Reason: "link failed: " + err.Error()})
	}})
	return d, nil
}

// raise queues an async event. It never blocks, because it runs under the
// engine lock: a full queue drops the event and counts it.
func (d *Device) raise(ev AsyncEvent) {
	select {
	case d.events <- ev:
	default:
		d.eventsDropped.Add(1)
	}
}

// Close destroys the device: every QP moves to ERR, so its outstanding work
// requests complete with WR_FLUSH_ERR on its CQs (where a waiter sees them),
// then the driver stops and the link is closed. Verbs on the device and
// its objects fail with ErrClosed afterwards; CQs can still be polled.
// Closing a closed device does nothing.
func (d *Device) Close() error {
	if d.closed.Swap(true) {
		return nil
	}
	d.drv.ErrorAllQPs()
	return d.drv.Close()
}

// Err is nil while the device works. After a link failure it is an error
// matching ErrDeviceFatal and the link's error; after Close, ErrClosed.
func (d *Device) Err() error { return d.unusable("") }

// unusable returns the error of verb op on a closed or failed device, nil
// on a working one.
func (d *Device) unusable(op string) error {
	if d.closed.Load() {
		return &deviceError{op: op, dev: d.name, kind: ErrClosed}
	}
	if err := d.drv.Err(); err != nil {
		return &deviceError{op: op, dev: d.name, kind: ErrDeviceFatal, cause: err}
	}
	return nil
}

// isClosed returns ErrClosed's error for op after Close. Verbs that free
// resources use it rather than unusable: after a device-fatal error they
// must still work, so that a program can clean up.
func (d *Device) isClosed(op string) error {
	if d.closed.Load() {
		return &deviceError{op: op, dev: d.name, kind: ErrClosed}
	}
	return nil
}

// Name is the device name.
func (d *Device) Name() string { return d.name }

// Link is the device's link.
func (d *Device) Link() nic.Link { return d.link }

// EngineStats count the packets the device's transport received and sent,
// and those it dropped and why.
type EngineStats = engine.EngineStats

// Stats returns a snapshot of the transport's counters (QP.Stats has the
// per-QP ones), congestion control's in CC.
func (d *Device) Stats() EngineStats { return d.eng.Stats() }

// CC returns a copy of the device's congestion-control parameters
// (Options.CC), nil when it is off.
func (d *Device) CC() *dcqcn.Params {
	if d.cc == nil {
		return nil
	}
	p := *d.cc
	return &p
}

// SetPacketTrace makes f see every packet the transport sends (dir 'T')
// and receives (dir 'R'), parsed or not; nil stops tracing. f is called on
// the device's goroutines with the transport locked: it must not block,
// call verbs on the device, or keep p or its buffer after it returns.
func (d *Device) SetPacketTrace(f func(dir byte, p *nic.Packet)) { d.eng.SetPacketTrace(f) }

func init() {
	// For the module's tests and tools that must order their memory
	// accesses with the transport's; see package devsync for why this is
	// not a method of Device.
	devsync.Register(func(dev any, f func()) { dev.(*Device).eng.Sync(f) })
}

// AsyncEvents delivers asynchronous events (ibv_get_async_event). It holds
// up to 64 events; events raised while it is full are dropped and counted
// by AsyncEventsDropped. The channel is never closed.
func (d *Device) AsyncEvents() <-chan AsyncEvent { return d.events }

// AsyncEventsDropped counts the async events dropped because AsyncEvents
// was full.
func (d *Device) AsyncEventsDropped() uint64 { return d.eventsDropped.Load() }

// DriverStats returns the counters of the driver that runs the device on
// its link (packets the link refused).
func (d *Device) DriverStats() engine.DriverStats { return d.drv.Stats() }

// DeviceAttr is the subset of struct ibv_device_attr that softroce fills.
type DeviceAttr struct {
	Name                         string
	VendorID                     uint32
	MaxMRSize                    uint64
	MaxQP, MaxQPWR, MaxSGE       int
	MaxCQ, MaxCQE, MaxMR, MaxPD  int
	MaxQPRDAtom, MaxQPInitRDAtom int
	MaxMsgSize                   int
	MaxInline                    int
	AtomicCap                    string // "ATOMIC_HCA": atomic with respect to other RDMA atomics
	PhysPortCnt                  int
	MaxSRQ, MaxSRQWR, MaxSRQSGE  int
	MaxMW                        int
	DeviceCapFlags               DeviceCapFlags
}

// DeviceCapFlags are enum ibv_device_cap_flags.
type DeviceCapFlags uint32

// Device capabilities softroce reports.
const (
	DeviceSRQResize        DeviceCapFlags = 1 << 13 // IBV_DEVICE_SRQ_RESIZE: SRQ.Modify with SRQMaxWR
	DeviceMemWindow        DeviceCapFlags = 1 << 17 // IBV_DEVICE_MEM_WINDOW: type 1 windows
	DeviceMemWindowType2B  DeviceCapFlags = 1 << 24 // IBV_DEVICE_MEM_WINDOW_TYPE_2B
	deviceCapFlagsSoftroce                = DeviceSRQResize | DeviceMemWindow | DeviceMemWindowType2B
)

// QueryDevice returns the device attributes (ibv_query_device).
func (d *Device) QueryDevice() DeviceAttr {
	lim := d.mrs.Limits()
	return DeviceAttr{Name: d.name, VendorID: VendorID, MaxMRSize: lim.MaxMRSize, MaxQP: d.maxQP, MaxQPWR: MaxQPWR,
		MaxSGE: MaxSGE, MaxCQ: d.maxCQ, MaxCQE: MaxCQE, MaxMR: lim.MaxMR, MaxPD: lim.MaxPD, MaxQPRDAtom: MaxQPRDAtom,
		MaxQPInitRDAtom: MaxQPRDAtom, MaxMsgSize: MaxMsgSize, MaxInline: MaxInline, AtomicCap: "ATOMIC_HCA", PhysPortCnt: 1,
		MaxSRQ: MaxSRQ, MaxSRQWR: MaxSRQWR, MaxSRQSGE: MaxSRQSGE, MaxMW: lim.MaxMW, DeviceCapFlags: deviceCapFlagsSoftroce}
}

// PortAttr is the subset of struct ibv_port_attr that matters on RoCE.
type PortAttr struct {
	State     string // "PORT_ACTIVE"
	MaxMTU    int    // bytes (IB MTU)
	ActiveMTU int    // bytes: the largest IB MTU the link carries
	GIDTblLen int
	// PKeyTblLen is 1: the default partition (P_Key 0xFFFF) is the only
	// one, so a QP's pkey_index must be 0.
	PKeyTblLen int
	LinkMTU    int // the link's IP MTU
}

// QueryPort returns port 1's attributes (ibv_query_port). The active MTU
// follows rxe's rule: the largest IB MTU not above the link MTU minus 80.
func (d *Device) QueryPort() PortAttr {
	return PortAttr{State: "PORT_ACTIVE", MaxMTU: 4096, ActiveMTU: nic.IBMTU(d.link.MTU()), GIDTblLen: len(d.gids), PKeyTblLen: 1, LinkMTU: d.link.MTU()}
}

// GIDType is the RoCE version of a GID table entry.
type GIDType uint8

const (
	GIDTypeRoCEv2 GIDType = 2
)

// GID is a 128-bit global identifier: for RoCEv2, an IPv6 address or an
// IPv4-mapped one (::ffff:a.b.c.d).
type GID [16]byte

// GIDFromAddr maps an IP address to its RoCEv2 GID.
func GIDFromAddr(a netip.Addr) GID { return GID(netip.AddrFrom16(a.As16()).As16()) }

// Addr is the IP address the GID stands for (IPv4 for mapped GIDs).
func (g GID) Addr() netip.Addr { return netip.AddrFrom16(g).Unmap() }

// String formats the GID the way ibv_devinfo -v shows it.
func (g GID) String() string {
	return fmt.Sprintf("%04x:%04x:%04x:%04x:%04x:%04x:%04x:%04x", uint16(g[0])<<8|uint16(g[1]), uint16(g[2])<<8|uint16(g[3]),
		uint16(g[4])<<8|uint16(g[5]), uint16(g[6])<<8|uint16(g[7]), uint16(g[8])<<8|uint16(g[9]), uint16(g[10])<<8|uint16(g[11]),
		uint16(g[12])<<8|uint16(g[13]), uint16(g[14])<<8|uint16(g[15]))
}

// GIDEntry is one row of the GID table.
type GIDEntry struct {
	GID  GID
	Type GIDType
	Addr netip.Addr
}

// GIDTable returns the port's GID table, derived from the link's addresses.
func (d *Device) GIDTable() []GIDEntry { return append([]GIDEntry(nil), d.gids...) }

// QueryGID returns the GID at index (ibv_query_gid).
func (d *Device) QueryGID(index int) (GID, error) {
	if index < 0 || index >= len(d.gids) {
		return GID{}, fmt.Errorf("verbs: GID index %d out of range: the table has %d entries (one per link address)", index, len(d.gids))
	}
	return d.gids[index].GID, nil
}

// PD is a protection domain.
type PD struct {
	d  *Device
	pd *memreg.PD
	// Guarded by d.mu.
	nQP, nSRQ, nAH int
	dead           bool
}

// AllocPD allocates a protection domain (ibv_alloc_pd).
func (d *Device) AllocPD() (*PD, error) {
	if err := d.unusable("alloc PD"); err != nil {
		return nil, err
	}
	pd, err := d.mrs.AllocPD()
	if err != nil {
		return nil, err
	}
	return &PD{d: d, pd: pd}, nil
}

// Dealloc frees the PD (ibv_dealloc_pd). It fails with an error matching
// ErrBusy while QPs, SRQs or MRs still use it, and changes nothing then.
func (pd *PD) Dealloc() error {
	d := pd.d
	if err := d.isClosed("dealloc PD"); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if pd.dead {
		return fmt.Errorf("verbs: dealloc PD %d: already deallocated", pd.pd.Handle())
	}
	if pd.nQP > 0 {
		return &busyError{fmt.Sprintf("verbs: dealloc PD %d: %d QPs still use it (destroy them first)", pd.pd.Handle(), pd.nQP)}
	}
	if pd.nSRQ > 0 {
		return &busyError{fmt.Sprintf("verbs: dealloc PD %d: %d SRQs still use it (destroy them first)", pd.pd.Handle(), pd.nSRQ)}
	}
	if pd.nAH > 0 {
		return &busyError{fmt.Sprintf("verbs: dealloc PD %d: %d address handles still use it (destroy them first)", pd.pd.Handle(), pd.nAH)}
	}
	if err := d.mrs.DeallocPD(pd.pd); err != nil {
		return err
	}
	pd.dead = true
	return nil
}

// RegMR registers buf for access (ibv_reg_mr). The MR's Addr is buf's
// address, which peers use as the RDMA virtual address.
func (pd *PD) RegMR(buf []byte, access Access) (*MR, error) {
	if err := pd.d.unusable("reg MR"); err != nil {
		return nil, err
	}
	return pd.d.mrs.RegMR(pd.pd, buf, access)
}

// RegMRIOVA registers buf for access with iova as the address of buf[0]
// (ibv_reg_mr_iova2): peers, local SGEs and window binds address the
// region in [iova, iova+len(buf)), and Addr reports iova.
func (pd *PD) RegMRIOVA(buf []byte, iova uint64, access Access) (*MR, error) {
	if err := pd.d.unusable("reg MR"); err != nil {
		return nil, err
	}
	return pd.d.mrs.RegMRIOVA(pd.pd, buf, iova, access)
}

// DeregMR deregisters mr (ibv_dereg_mr). It fails with ErrBusy while
// memory windows are bound to mr. In-flight remote accesses finish
// first; later ones fail with a remote access error.
func (d *Device) DeregMR(mr *MR) error {
	if err := d.isClosed("dereg MR"); err != nil {
		return err
	}
	return d.mrs.DeregMR(mr)
}

// CreateCQ creates a completion queue with room for depth completions
// (ibv_create_cq). At most max_cq CQs exist at once. A CQ overrun is
// reported on the CQ's own Events channel and on the device's AsyncEvents
// (EventCQErr naming the CQ), and moves the QPs that could not complete
// into ERR.
func (d *Device) CreateCQ(depth int) (*CQ, error) {
	if err := d.unusable("create CQ"); err != nil {
		return nil, err
	}
	if depth > MaxCQE {
		return nil, fmt.Errorf("verbs: CQ depth %d exceeds max_cqe %d", depth, MaxCQE)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.cqs) >= d.maxCQ {
		return nil, fmt.Errorf("verbs: create CQ: device %s already has max_cq %d CQs", d.name, d.maxCQ)
	}
	c, err := cq.New(depth)
	if err != nil {
		return nil, err
	}
	c.SetErrorHook(func(ev cq.Event) {
		d.raise(AsyncEvent{Type: EventCQErr, CQ: c, Reason: ev.Err.Error()})
	})
	if d.busyPoll {
		c.SetPollHook(d.drv.PollInline)
	} else {
		c.SetWaitHook(d.drv)
	}
	d.cqs[c] = 0
	return c, nil
}

// DestroyCQ destroys a CQ of this device (ibv_destroy_cq). It fails with
// an error matching ErrBusy while a QP uses the CQ, and changes nothing
// then. Completions still stored are discarded with it.
func (d *Device) DestroyCQ(c *CQ) error {
	if err := d.isClosed("destroy CQ"); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	n, ok := d.cqs[c]
	if !ok {
		return fmt.Errorf("verbs: destroy CQ: not a CQ of device %s (destroyed already, or never created by it)", d.name)
	}
	if n > 0 {
		return &busyError{fmt.Sprintf("verbs: destroy CQ: %d QP work queues still use it (destroy those QPs first)", n)}
	}
	c.SetErrorHook(nil)
	delete(d.cqs, c)
	return nil
}
