package cases

import (
	"context"
	"fmt"
	"net/netip"
	"time"
)

// Access is a set of memory-region and QP access flags, with the values of
// enum ibv_access_flags (both targets take them unchanged).
type Access uint32

// Access flags.
const (
	AccessLocalWrite   Access = 1
	AccessRemoteWrite  Access = 2
	AccessRemoteRead   Access = 4
	AccessRemoteAtomic Access = 8
	AccessMWBind       Access = 16 // the MR may carry memory windows
	AccessAll                 = AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic
)

// QPSpec says how a case wants the target's QP created and connected to
// the fake peer. Zero fields take the defaults in brackets.
type QPSpec struct {
	// PeerQPN is the fake peer's QP number: the target's destination QP.
	PeerQPN uint32
	// RecvPSN is the first PSN the target's responder expects (rq_psn).
	RecvPSN uint32
	// SendPSN is the target requester's first PSN (sq_psn).
	SendPSN uint32
	// MTU is the path MTU in bytes [1024].
	MTU int
	// MinRNRTimer is the RNR NAK timer code the responder sends [12].
	MinRNRTimer uint8
	// MaxDestRdAtomic is the number of responder READ/atomic resources [4].
	MaxDestRdAtomic int
	// Access are the QP's remote access flags [AccessAll].
	Access Access
	// Timeout is the local ACK timeout exponent [14, ~67 ms].
	Timeout uint8
	// Retry and RNRRetry are retry_cnt and rnr_retry [3, 3].
	Retry, RNRRetry uint8
	// MRs are the memory regions to register: their lengths and access.
	MRs []MRSpec
	// Type is the QP's transport service: "" (RC), "uc" or "ud".
	Type string
	// QKey is a UD QP's Q_Key.
	QKey uint32
	// CC asks for congestion control (DCQCN) on the QP, on targets that
	// have it; others ignore it.
	CC bool
	// SRQ, if set, puts the QP on a shared receive queue: Open creates it
	// as SRQSpec says; OpenQP attaches the new QP to the session's SRQ
	// (the spec's sizes are then ignored).
	SRQ *SRQSpec
}

// SRQSpec sizes a shared receive queue: MaxWR WQEs of one SGE, the limit
// armed at Limit (0: not armed).
type SRQSpec struct {
	MaxWR, Limit int
}

func (s *QPSpec) fill() {
	if s.MTU == 0 {
		s.MTU = 1024
	}
	if s.MinRNRTimer == 0 {
		s.MinRNRTimer = 12
	}
	if s.MaxDestRdAtomic == 0 {
		s.MaxDestRdAtomic = 4
	}
	if s.Access == 0 {
		s.Access = AccessAll
	}
	if s.Timeout == 0 {
		s.Timeout = 14
	}
	if s.Retry == 0 {
		s.Retry = 3
	}
	if s.RNRRetry == 0 {
		s.RNRRetry = 3
	}
	if len(s.MRs) == 0 {
		s.MRs = []MRSpec{{Len: 16384, Access: AccessAll}}
	}
}

// MRSpec is one memory region to register on the target.
type MRSpec struct {
	Len    int
	Access Access
}

// MR is a registered region of the target: the virtual address and rkey a
// peer puts into a RETH or AtomicETH.
type MR struct {
	Index int // position in QPSpec.MRs
	Addr  uint64
	RKey  uint32
	Len   int
}

// Completion is a work completion of the target, in libibverbs terms.
type Completion struct {
	WRID    uint64
	Status  int // enum ibv_wc_status: 0 is success
	Opcode  int // enum ibv_wc_opcode
	ByteLen uint32
	// Imm is the immediate data as read big-endian off the wire, valid
	// when WithImm is set.
	Imm     uint32
	WithImm bool
	// WithInv says the completion reports a remote invalidation
	// (IBV_WC_WITH_INV) of InvRKey.
	WithInv bool
	InvRKey uint32
	// Flags are the wc_flags as the target reported them.
	Flags uint32
	// SrcQP is the sender's QP number (UD receives).
	SrcQP uint32
}

// String is the completion as the cases print it, its status named the
// one way the report names statuses: "wr 71 status REM_INV_REQ_ERR (9)
// opcode 0 0 bytes".
func (c Completion) String() string {
	s := fmt.Sprintf("wr %d status %s opcode %d %d bytes", c.WRID, wcStatusName(c.Status), c.Opcode, c.ByteLen)
	if c.WithImm {
		s += fmt.Sprintf(" imm 0x%08x", c.Imm)
	}
	if c.WithInv {
		s += fmt.Sprintf(" invalidated rkey 0x%08x", c.InvRKey)
	}
	if c.SrcQP != 0 {
		s += fmt.Sprintf(" src qp 0x%06x", c.SrcQP)
	}
	if c.Flags != 0 {
		s += fmt.Sprintf(" flags 0x%x", c.Flags)
	}
	return s
}

// Async event types (enum ibv_event_type) the cases look for.
const (
	EventQPFatal         = 1
	EventSRQLimitReached = 15
	EventLastWQEReached  = 16
)

// Event is an asynchronous event of the target (ibv_get_async_event).
type Event struct {
	Type int // enum ibv_event_type
	// QPN names the QP of a QP event; SRQ is set when the event names the
	// session's SRQ.
	QPN  uint32
	SRQ  bool
	Name string
}

// MW is a memory window of the target.
type MW struct {
	Type int    // 1 or 2 (type 2 windows are type 2B)
	RKey uint32 // the current R_Key (after the last successful bind)
	h    any    // the target's handle
}

// SendOp is a send work request opcode the target can post.
type SendOp string

// Send opcodes a case can post on the target.
const (
	SendWrite SendOp = "write"
	SendRead  SendOp = "read"
	SendSend  SendOp = "send"
)

// SendReq is a work request a case posts on the target's send queue: Len
// bytes of MR MR at Off, to the peer's RemoteAddr/RKey.
type SendReq struct {
	WRID       uint64
	Op         SendOp
	MR         int // index into the session's MRs
	Off, Len   int
	RemoteAddr uint64
	RKey       uint32
}

// Target is an RC implementation under test: kernel rdma_rxe (through the
// verbs agent in its VM) or softroce's own transport. A case opens one
// Session per run and talks to its QP through the fake peer.
type Target interface {
	// Name is "rxe" or "softroce".
	Name() string
	// Peer is the fake peer on the host side of the target's link.
	Peer() *Peer
	// Addr is the target's IP address (the peer sends there).
	Addr() netip.Addr
	// Open creates and connects a QP as spec says, with its MRs.
	Open(ctx context.Context, spec QPSpec) (Session, error)
	// Close releases the target (not the VM behind it).
	Close() error
}

// Session is one QP of a target, connected to the fake peer, with the
// memory regions and the CQ a case needs.
// CCSession is a session whose target can report a QP's congestion
// control counters, under ConnectX's names.
type CCSession interface {
	// CCCounters returns the QP's np_ecn_marked_roce_packets and
	// np_cnp_sent.
	CCCounters(ctx context.Context) (marked, cnpSent uint64, err error)
}

type Session interface {
	// QPN is the target QP's number.
	QPN() uint32
	// MR returns the i-th registered region.
	MR(i int) MR
	// PostRecv posts a receive of n bytes at off in MR 0.
	PostRecv(ctx context.Context, wrID uint64, off, n int) error
	// PostSend posts a send work request (signaled).
	PostSend(ctx context.Context, r SendReq) error
	// Poll waits up to d for one completion (nil when none came).
	Poll(ctx context.Context, d time.Duration) (*Completion, error)
	// ReadMem and WriteMem access MR i's bytes directly (not over RDMA).
	ReadMem(ctx context.Context, i, off, n int) ([]byte, error)
	WriteMem(ctx context.Context, i, off int, b []byte) error
	// State is the QP state as the target reports it ("RTS", "ERR", ...).
	State(ctx context.Context) (string, error)
	// OpenQP creates another QP (and CQ) in the session's protection
	// domain, sharing its memory regions, connected as spec says (its MRs
	// are ignored). Closing it leaves the first session's objects alone;
	// closing the first session frees everything.
	OpenQP(ctx context.Context, spec QPSpec) (Session, error)
	// Close destroys the QP and everything created for it.
	Close() error

	// PostSRQRecv posts a receive of n bytes at off in MR 0 to the
	// session's SRQ (QPSpec.SRQ).
	PostSRQRecv(ctx context.Context, wrID uint64, off, n int) error
	// SetSRQLimit arms the SRQ limit (ibv_modify_srq); SRQLimit queries it.
	SetSRQLimit(ctx context.Context, limit int) error
	SRQLimit(ctx context.Context) (int, error)
	// Event waits up to d for the next async event of the target that
	// names a QP of the case (this session's or one OpenQP made from it) or
	// its SRQ (nil when none came).
	Event(ctx context.Context, d time.Duration) (*Event, error)
	// SetError moves the QP to the error state (ibv_modify_qp).
	SetError(ctx context.Context) error

	// AllocMW allocates a window of type 1 or 2 in the session's PD.
	AllocMW(ctx context.Context, typ int) (*MW, error)
	// BindMW binds mw over [off, off+n) of MR mr with access, on this QP
	// (a type 2 window is then usable through this QP only), and waits for
	// the bind to finish: with ibv_bind_mw for type 1, a BIND_MW work
	// request for type 2. On success mw.RKey is the new key and refused is
	// empty; when the target refuses the bind (the verb fails or the bind
	// completes in error), refused says how and mw is unchanged. err is a
	// harness failure.
	BindMW(ctx context.Context, wrID uint64, mw *MW, mr, off, n int, access Access) (refused string, err error)
	// LocalInv posts a LOCAL_INV of rkey and returns its completion (nil
	// when none came).
	LocalInv(ctx context.Context, wrID uint64, rkey uint32) (*Completion, error)
}

// CMTarget is a target whose rdma_cm the cases can drive, so that its IB
// CM on QP1 has a service to answer for or a connection to make. A target
// without it can still be sent CM MADs (a REQ nobody listens for).
type CMTarget interface {
	// CMListen starts an rdma_cm server on the target at port (RDMA_PS_TCP)
	// that accepts one connection; stop ends it.
	CMListen(ctx context.Context, port uint16) (stop func(), err error)
	// CMConnect makes the target connect over rdma_cm to the peer's address
	// at port: its REQs come to the peer's QP1. stop ends the attempt.
	CMConnect(ctx context.Context, port uint16) (stop func(), err error)
}

// DriverTarget is a Target that knows the driver of the device behind it.
// Documented deviations and known bugs (Case.Known, Case.Bugs) belong to a
// driver, not to a way of reaching it: rxe in the harness's VM and rxe on a
// remote host share them.
type DriverTarget interface {
	// Driver is the key of Case.Known and Case.Bugs: "rxe" for kernel
	// rdma_rxe, a remote RNIC's kernel driver (mlx5_core, irdma, ...).
	Driver() string
}

// DriverOf is t's Driver, or its Name when it reports none.
func DriverOf(t Target) string {
	if d, ok := t.(DriverTarget); ok && d.Driver() != "" {
		return d.Driver()
	}
	return t.Name()
}

// DeviceInfo describes the device behind a target, for reports.
type DeviceInfo struct {
	Name     string `json:"name"`
	FW       string `json:"firmware,omitempty"`
	Driver   string `json:"driver,omitempty"`
	VendorID uint32 `json:"vendor_id"`
	PartID   uint32 `json:"vendor_part_id"`
	Host     string `json:"host,omitempty"` // where the agent runs
}

// String is "mlx5_0, fw 16.35.2000, driver mlx5_core".
func (d DeviceInfo) String() string {
	s := d.Name
	if d.FW != "" {
		s += ", fw " + d.FW
	}
	if d.Driver != "" {
		s += ", driver " + d.Driver
	}
	return s
}

// DeviceTarget is a Target that can say what device it drives.
type DeviceTarget interface {
	Device() DeviceInfo
}
