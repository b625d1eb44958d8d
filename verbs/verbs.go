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
// The device runs on two goroutines (receive, timers), never one per QP.
package verbs

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"

	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/memreg"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/qpstate"
	"github.com/softroce/softroce/transport/rc"
)

// Re-exported types, so a program needs only this package.
type (
	// SendWR is a send work request (struct ibv_send_wr).
	SendWR = rc.SendWR
	// RecvWR is a receive work request (struct ibv_recv_wr).
	RecvWR = rc.RecvWR
	// SGE is a scatter/gather element (struct ibv_sge).
	SGE = rc.SGE
	// WROpcode is enum ibv_wr_opcode.
	WROpcode = rc.WROpcode
	// SendFlags are enum ibv_send_flags.
	SendFlags = rc.SendFlags
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
	WRRDMAWrite         = rc.WRRDMAWrite
	WRRDMAWriteWithImm  = rc.WRRDMAWriteWithImm
	WRSend              = rc.WRSend
	WRSendWithImm       = rc.WRSendWithImm
	WRRDMARead          = rc.WRRDMARead
	WRAtomicCmpAndSwp   = rc.WRAtomicCmpAndSwp
	WRAtomicFetchAndAdd = rc.WRAtomicFetchAndAdd
	WRSendWithInv       = rc.WRSendWithInv
	WRAtomicWrite       = rc.WRAtomicWrite

	SendFence     = rc.SendFence
	SendSignaled  = rc.SendSignaled
	SendSolicited = rc.SendSolicited
	SendInline    = rc.SendInline

	AccessLocalWrite   = memreg.AccessLocalWrite
	AccessRemoteWrite  = memreg.AccessRemoteWrite
	AccessRemoteRead   = memreg.AccessRemoteRead
	AccessRemoteAtomic = memreg.AccessRemoteAtomic

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
)

// Options tune Open. The zero value (or nil) is fine.
type Options struct {
	// Name is the device name (default "softroce0").
	Name string
	// Limits of the memory-region table.
	Limits memreg.Limits
}

// Device is an open softroce device on one Link (ibv_context).
type Device struct {
	name   string
	link   nic.Link
	mrs    *memreg.Table
	eng    *rc.Engine
	drv    *rc.Driver
	gids   []GIDEntry
	events chan AsyncEvent

	mu     sync.Mutex
	qps    map[uint32]*QP
	closed bool
}

// AsyncEvent is an asynchronous event (struct ibv_async_event).
type AsyncEvent struct {
	Type   AsyncEventType
	QPNum  uint32
	Reason string
}

// AsyncEventType is enum ibv_event_type (the subset softroce raises).
type AsyncEventType uint8

const (
	EventQPFatal AsyncEventType = 1 // IBV_EVENT_QP_FATAL: a QP entered ERR on a transport error
)

func (t AsyncEventType) String() string { return "QP fatal error" }

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
	if nic.IBMTU(link.MTU()) == 0 {
		return nil, fmt.Errorf("verbs: link MTU %d is too small for RoCE (need at least 336 for a 256-byte IB MTU)", link.MTU())
	}
	mrs := memreg.NewTable(opts.Limits)
	d := &Device{name: name, link: link, mrs: mrs, eng: rc.NewEngine(mrs), events: make(chan AsyncEvent, 64), qps: map[uint32]*QP{}}
	for _, a := range link.Addrs() {
		d.gids = append(d.gids, GIDEntry{GID: GIDFromAddr(a), Type: GIDTypeRoCEv2, Addr: a})
	}
	d.eng.OnAsyncError = func(qpn uint32, reason string) {
		select {
		case d.events <- AsyncEvent{Type: EventQPFatal, QPNum: qpn, Reason: reason}:
		default: // a full event queue must never stall the transport
		}
	}
	d.drv = rc.NewDriver(d.eng, link)
	return d, nil
}

// Close destroys the device and closes its link.
func (d *Device) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	d.closed = true
	d.mu.Unlock()
	return d.drv.Close()
}

// Name is the device name.
func (d *Device) Name() string { return d.name }

// Link is the device's link.
func (d *Device) Link() nic.Link { return d.link }

// Engine exposes the transport engine (statistics, tracing hooks).
func (d *Device) Engine() *rc.Engine { return d.eng }

// AsyncEvents delivers asynchronous events (ibv_get_async_event).
func (d *Device) AsyncEvents() <-chan AsyncEvent { return d.events }

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
}

// QueryDevice returns the device attributes (ibv_query_device).
func (d *Device) QueryDevice() DeviceAttr {
	lim := d.mrs.Limits()
	return DeviceAttr{Name: d.name, VendorID: VendorID, MaxMRSize: lim.MaxMRSize, MaxQP: 1 << 16, MaxQPWR: MaxQPWR,
		MaxSGE: MaxSGE, MaxCQ: 1 << 16, MaxCQE: MaxCQE, MaxMR: lim.MaxMR, MaxPD: lim.MaxPD, MaxQPRDAtom: MaxQPRDAtom,
		MaxQPInitRDAtom: MaxQPRDAtom, MaxMsgSize: MaxMsgSize, MaxInline: MaxInline, AtomicCap: "ATOMIC_HCA", PhysPortCnt: 1}
}

// PortAttr is the subset of struct ibv_port_attr that matters on RoCE.
type PortAttr struct {
	State     string // "PORT_ACTIVE"
	MaxMTU    int    // bytes (IB MTU)
	ActiveMTU int    // bytes: the largest IB MTU the link carries
	GIDTblLen int
	LinkMTU   int // the link's IP MTU
}

// QueryPort returns port 1's attributes (ibv_query_port). The active MTU
// follows rxe's rule: the largest IB MTU not above the link MTU minus 80.
func (d *Device) QueryPort() PortAttr {
	return PortAttr{State: "PORT_ACTIVE", MaxMTU: 4096, ActiveMTU: nic.IBMTU(d.link.MTU()), GIDTblLen: len(d.gids), LinkMTU: d.link.MTU()}
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
}

// AllocPD allocates a protection domain (ibv_alloc_pd).
func (d *Device) AllocPD() (*PD, error) {
	pd, err := d.mrs.AllocPD()
	if err != nil {
		return nil, err
	}
	return &PD{d: d, pd: pd}, nil
}

// Dealloc frees the PD; it fails while MRs or QPs still use it.
func (pd *PD) Dealloc() error { return pd.d.mrs.DeallocPD(pd.pd) }

// RegMR registers buf for access (ibv_reg_mr). The MR's Addr is buf's
// address, which peers use as the RDMA virtual address.
func (pd *PD) RegMR(buf []byte, access Access) (*MR, error) {
	return pd.d.mrs.RegMR(pd.pd, buf, access)
}

// DeregMR deregisters mr (ibv_dereg_mr). In-flight remote accesses finish
// first; later ones fail with a remote access error.
func (d *Device) DeregMR(mr *MR) error { return d.mrs.DeregMR(mr) }

// CreateCQ creates a completion queue with room for depth completions.
// A CQ overrun is reported on the CQ's own Events channel (IBV_EVENT_CQ_ERR)
// and moves the QPs that could not complete into ERR.
func (d *Device) CreateCQ(depth int) (*CQ, error) {
	if depth > MaxCQE {
		return nil, fmt.Errorf("verbs: CQ depth %d exceeds max_cqe %d", depth, MaxCQE)
	}
	c, err := cq.New(depth)
	if err != nil {
		return nil, err
	}
	return c, nil
}
