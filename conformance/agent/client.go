package agent

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/softroce/softroce/conformance/rxevm"
)

// GuestFile is the rxevm extra file that installs the agent binary built by
// Build at GuestPath (with any library the base image lacks).
func GuestFile(bin string) rxevm.File {
	return rxevm.File{Path: GuestPath, Src: bin, Mode: 0o755, WithLibs: true}
}

// Launch starts the agent in vm on port, listening on the guest's address
// with a fresh random token, and connects to it. The agent process is
// killed when the returned client is closed.
func Launch(ctx context.Context, vm *rxevm.VM, port int) (*Client, error) {
	token, err := NewToken()
	if err != nil {
		return nil, err
	}
	addr := net.JoinHostPort(vm.GuestAddr().String(), strconv.Itoa(port))
	// The token reaches the guest in a file only root can read: on the
	// command line it would show in the process list.
	file := fmt.Sprintf("/tmp/.softroce-agent-%d.token", port)
	p, err := vm.Start(ctx, fmt.Sprintf("umask 077 && printf '%%s\\n' %s >%s && exec %s --listen %s --token-file %s",
		token, file, GuestPath, addr, file))
	if err != nil {
		return nil, fmt.Errorf("start agent: %w", err)
	}
	for {
		c, err := Dial(ctx, vm.DialContext, addr, token)
		if err == nil {
			c.proc = p
			return c, nil
		}
		select {
		case <-p.Done():
			_, werr := p.Wait(ctx)
			return nil, fmt.Errorf("agent exited at start: %v", werr)
		case <-ctx.Done():
			p.Kill()
			return nil, fmt.Errorf("connect to agent: %w (last: %v)", ctx.Err(), err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// NewToken returns a random shared secret for an agent (32 hex digits).
func NewToken() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("agent: random token: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// DialFunc opens a connection, like net.Dialer.DialContext (e.g.
// rxevm.VM.DialContext, which dials from the VM's network namespace).
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// Client speaks the agent's line protocol. Its methods are safe for
// concurrent use but execute one at a time (the agent is sequential).
type Client struct {
	mu   sync.Mutex
	conn net.Conn
	r    *bufio.Reader
	proc *rxevm.GuestProc
	// broken is set when a request failed mid-way (I/O error or
	// cancellation): a late reply would be taken for the next
	// request's, so the connection is not used again.
	broken error
}

// Dial connects to an agent listening at addr and authenticates with
// token (the agent's first line must be "auth TOKEN"). A refused token is
// an *Error whose Request is "auth".
func Dial(ctx context.Context, dial DialFunc, addr, token string) (*Client, error) {
	if token == "" || strings.ContainsAny(token, " \t\r\n") {
		return nil, errors.New("agent: the token must be one non-empty word")
	}
	conn, err := dial(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	c := New(conn)
	if _, err := c.Do(ctx, "auth", token); err != nil {
		conn.Close()
		return nil, err
	}
	if _, err := c.Do(ctx, "ping"); err != nil {
		conn.Close()
		return nil, err
	}
	return c, nil
}

// New wraps an established connection to an agent.
func New(conn net.Conn) *Client {
	return &Client{conn: conn, r: bufio.NewReaderSize(conn, 64<<10)}
}

// Close ends the session (the agent frees everything it created for it)
// and, for a client from Launch, kills the agent.
func (c *Client) Close() error {
	err := c.conn.Close()
	if c.proc != nil {
		c.proc.Kill()
	}
	return err
}

// Error is a request the agent refused or a verbs call that failed there.
type Error struct {
	Request string
	Msg     string
}

func (e *Error) Error() string { return fmt.Sprintf("agent: %s: %s", e.Request, e.Msg) }

// Reply is the key=value result of a request.
type Reply map[string]string

// Uint parses a numeric reply field (decimal or 0x hex).
func (r Reply) Uint(key string) (uint64, error) {
	v, ok := r[key]
	if !ok {
		return 0, fmt.Errorf("agent: reply lacks %s", key)
	}
	n, err := strconv.ParseUint(v, 0, 64)
	if err != nil {
		return 0, fmt.Errorf("agent: reply field %s=%q: %w", key, v, err)
	}
	return n, nil
}

// Do sends one raw request line (command word and key=value arguments) and
// returns the reply's fields. A reply "err ..." is an *Error.
func (c *Client) Do(ctx context.Context, cmd string, args ...string) (Reply, error) {
	line := cmd
	if len(args) > 0 {
		line += " " + strings.Join(args, " ")
	}
	if strings.ContainsAny(line, "\n\r") {
		return nil, fmt.Errorf("agent: request %q contains a line break", cmd)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.broken != nil {
		return nil, fmt.Errorf("agent: connection unusable after an earlier failure: %w", c.broken)
	}
	stop := context.AfterFunc(ctx, func() { c.conn.SetDeadline(time.Now()) })
	defer stop()
	if _, err := c.conn.Write([]byte(line + "\n")); err != nil {
		c.broken = fmt.Errorf("agent: send %s: %w", cmd, ctxErr(ctx, err))
		return nil, c.broken
	}
	resp, err := c.r.ReadString('\n')
	if err != nil {
		c.broken = fmt.Errorf("agent: reply to %s: %w", cmd, ctxErr(ctx, err))
		return nil, c.broken
	}
	resp = strings.TrimRight(resp, "\r\n")
	if msg, ok := strings.CutPrefix(resp, "err "); ok {
		return nil, &Error{Request: cmd, Msg: msg}
	}
	rest, ok := strings.CutPrefix(resp, "ok")
	if !ok {
		return nil, fmt.Errorf("agent: malformed reply to %s: %q", cmd, resp)
	}
	r := Reply{}
	// "str=" (a status text with blanks) is always last and takes the
	// rest of the line.
	if i := strings.Index(rest, " str="); i >= 0 {
		r["str"] = rest[i+len(" str="):]
		rest = rest[:i]
	}
	for _, f := range strings.Fields(rest) {
		k, v, _ := strings.Cut(f, "=")
		r[k] = v
	}
	return r, nil
}

func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return errors.Join(ctx.Err(), err)
	}
	return err
}

func kv(k string, v any) string { return fmt.Sprintf("%s=%v", k, v) }

func hexv(k string, v uint64) string { return fmt.Sprintf("%s=0x%x", k, v) }

// Open opens the verbs device (e.g. "rxe0").
func (c *Client) Open(ctx context.Context, dev string) error {
	_, err := c.Do(ctx, "open", kv("dev", dev))
	return err
}

// PD is a protection domain in the agent.
type PD int

// CQ is a completion queue in the agent.
type CQ int

// MR is a registered memory region in the agent. Addr is the virtual
// address a peer puts into a RETH or AtomicETH.
type MR struct {
	ID         int
	Addr       uint64
	LKey, RKey uint32
	Len        int
}

// QP is an RC queue pair in the agent.
type QP struct {
	ID  int
	QPN uint32
}

// Access is a set of ibv_access_flags.
type Access uint32

// Access flags (enum ibv_access_flags).
const (
	AccessLocalWrite   Access = 1
	AccessRemoteWrite  Access = 2
	AccessRemoteRead   Access = 4
	AccessRemoteAtomic Access = 8
	AccessMWBind       Access = 16
	AccessAll                 = AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic
)

// MW is a memory window in the agent.
type MW struct {
	ID   int
	RKey uint32 // the current rkey (as of the last bind through the client)
}

// AllocMW allocates a window of type 1 or 2 (ibv_alloc_mw).
func (c *Client) AllocMW(ctx context.Context, pd PD, typ int) (MW, error) {
	r, err := c.Do(ctx, "mw", kv("pd", int(pd)), kv("type", typ))
	if err != nil {
		return MW{}, err
	}
	id, err := r.Uint("mw")
	if err != nil {
		return MW{}, err
	}
	k, err := r.Uint("rkey")
	return MW{ID: int(id), RKey: uint32(k)}, err
}

// BindMW binds mw over [off, off+length) of mr with access on qp: with
// ibv_bind_mw for a type 1 window, with a BIND_MW work request for a type
// 2 one. It returns the window's new rkey; the bind completes (wrID) on
// qp's send CQ when signaled.
func (c *Client) BindMW(ctx context.Context, qp QP, wrID uint64, mw *MW, mr MR, off, length int, access Access, signaled bool) error {
	r, err := c.Do(ctx, "bindmw", kv("qp", qp.ID), kv("wr", wrID), kv("mw", mw.ID), kv("mr", mr.ID), kv("off", off),
		kv("len", length), kv("access", uint32(access)), kv("signaled", b2i(signaled)))
	if err != nil {
		return err
	}
	k, err := r.Uint("rkey")
	mw.RKey = uint32(k)
	return err
}

// LocalInv posts a LOCAL_INV of rkey on qp.
func (c *Client) LocalInv(ctx context.Context, qp QP, wrID uint64, rkey uint32, signaled bool) error {
	_, err := c.Do(ctx, "localinv", kv("qp", qp.ID), kv("wr", wrID), hexv("rkey", uint64(rkey)), kv("signaled", b2i(signaled)))
	return err
}

// AllocPD allocates a protection domain.
func (c *Client) AllocPD(ctx context.Context) (PD, error) {
	r, err := c.Do(ctx, "pd")
	if err != nil {
		return 0, err
	}
	id, err := r.Uint("pd")
	return PD(id), err
}

// RegMR allocates length zeroed, page-aligned bytes and registers them.
func (c *Client) RegMR(ctx context.Context, pd PD, length int, access Access) (MR, error) {
	r, err := c.Do(ctx, "mr", kv("pd", int(pd)), kv("len", length), kv("access", uint32(access)))
	if err != nil {
		return MR{}, err
	}
	var f [4]uint64
	for i, k := range []string{"mr", "addr", "lkey", "rkey"} {
		if f[i], err = r.Uint(k); err != nil {
			return MR{}, err
		}
	}
	return MR{ID: int(f[0]), Addr: f[1], LKey: uint32(f[2]), RKey: uint32(f[3]), Len: length}, nil
}

// CreateCQ creates a completion queue with at least cqe entries.
func (c *Client) CreateCQ(ctx context.Context, cqe int) (CQ, error) {
	r, err := c.Do(ctx, "cq", kv("cqe", cqe))
	if err != nil {
		return 0, err
	}
	id, err := r.Uint("cq")
	return CQ(id), err
}

// QPCap sizes a queue pair; zero fields take the agent's defaults (64
// work requests per queue, no inline data).
type QPCap struct {
	SendWR, RecvWR int
	MaxInline      int
	// SRQ, if not 0, is the SRQ the QP takes its receives from.
	SRQ SRQ
	// Type is the QP's service ("" is RC).
	Type QPType
}

// QPType is a QP's transport service, as the agent names it.
type QPType string

// QP types the agent creates.
const (
	QPTypeRC QPType = "rc"
	QPTypeUC QPType = "uc"
	QPTypeUD QPType = "ud"
)

// CreateQP creates a queue pair (RC unless cp.Type says otherwise; one SGE
// per work request).
func (c *Client) CreateQP(ctx context.Context, pd PD, send, recv CQ, cp QPCap) (QP, error) {
	args := []string{kv("pd", int(pd)), kv("scq", int(send)), kv("rcq", int(recv))}
	if cp.SendWR > 0 {
		args = append(args, kv("sq", cp.SendWR))
	}
	if cp.RecvWR > 0 {
		args = append(args, kv("rq", cp.RecvWR))
	}
	if cp.MaxInline > 0 {
		args = append(args, kv("inline", cp.MaxInline))
	}
	if cp.SRQ != 0 {
		args = append(args, kv("srq", int(cp.SRQ)))
	}
	if cp.Type != "" {
		args = append(args, "type="+string(cp.Type))
	}
	r, err := c.Do(ctx, "qp", args...)
	if err != nil {
		return QP{}, err
	}
	id, err := r.Uint("qp")
	if err != nil {
		return QP{}, err
	}
	qpn, err := r.Uint("qpn")
	return QP{ID: int(id), QPN: uint32(qpn)}, err
}

// GID returns the port-1 GID at index (1 is rxe's IPv4-mapped RoCEv2 GID).
func (c *Client) GID(ctx context.Context, index int) ([16]byte, error) {
	var g [16]byte
	r, err := c.Do(ctx, "gid", kv("idx", index))
	if err != nil {
		return g, err
	}
	b, err := hex.DecodeString(r["gid"])
	if err != nil || len(b) != 16 {
		return g, fmt.Errorf("agent: bad gid %q", r["gid"])
	}
	copy(g[:], b)
	return g, nil
}

// ModifyToInit moves qp from RESET to INIT on port 1, pkey index 0, with
// the given remote access flags.
func (c *Client) ModifyToInit(ctx context.Context, qp QP, access Access) error {
	_, err := c.Do(ctx, "init", kv("qp", qp.ID), kv("access", uint32(access)))
	return err
}

// RTRAttr are the attributes of the INIT->RTR transition (IBTA 11.2.4.2,
// ibv_modify_qp). Zero fields take the defaults noted.
type RTRAttr struct {
	DestQPN       uint32
	RecvPSN       uint32   // the first PSN expected from the peer
	DestGID       [16]byte // the peer's GID (IPv4-mapped for RoCEv2 over IPv4)
	MTU           int      // path MTU in bytes, 256..4096; 0 means 1024
	MaxDestRdAtom int      // responder resources for READ/atomic; 0 means 1
	MinRNRTimer   int      // RNR NAK timer code; 0 means 12 (0.64 ms)
	SGIDIndex     int      // 0: the agent's --gid-index (1, rxe's IPv4 GID, unless given)
	HopLimit      int      // IP TTL; 0 means 64
	TrafficClass  int
}

// ModifyToRTR moves qp to RTR.
func (c *Client) ModifyToRTR(ctx context.Context, qp QP, a RTRAttr) error {
	if a.MTU == 0 {
		a.MTU = 1024
	}
	if a.MaxDestRdAtom == 0 {
		a.MaxDestRdAtom = 1
	}
	if a.MinRNRTimer == 0 {
		a.MinRNRTimer = 12
	}
	if a.HopLimit == 0 {
		a.HopLimit = 64
	}
	args := []string{kv("qp", qp.ID), hexv("dqpn", uint64(a.DestQPN)), hexv("rpsn", uint64(a.RecvPSN)),
		"dgid=" + hex.EncodeToString(a.DestGID[:]), kv("mtu", a.MTU), kv("rd_atomic", a.MaxDestRdAtom),
		kv("min_rnr", a.MinRNRTimer), kv("hop", a.HopLimit), kv("tc", a.TrafficClass)}
	if a.SGIDIndex != 0 {
		args = append(args, kv("sgid", a.SGIDIndex))
	}
	_, err := c.Do(ctx, "rtr", args...)
	return err
}

// RTSAttr are the attributes of the RTR->RTS transition. Timeout, Retry
// and RNRRetry are taken as given (0 is meaningful for each); use
// DefaultRTS for perftest's values.
type RTSAttr struct {
	SendPSN   uint32
	Timeout   int // local ACK timeout exponent: 4.096 us * 2^Timeout
	Retry     int // retry_cnt (rxe treats 7 as infinite)
	RNRRetry  int // 7 = infinite
	MaxRdAtom int // outstanding READ/atomic as requester; 0 means 1
}

// DefaultRTS returns the values ibv_rc_pingpong and perftest use: timeout
// 14 (~67 ms), retry 7, RNR retry 7.
func DefaultRTS(psn uint32) RTSAttr {
	return RTSAttr{SendPSN: psn, Timeout: 14, Retry: 7, RNRRetry: 7, MaxRdAtom: 1}
}

// ModifyToRTS moves qp to RTS.
func (c *Client) ModifyToRTS(ctx context.Context, qp QP, a RTSAttr) error {
	if a.MaxRdAtom == 0 {
		a.MaxRdAtom = 1
	}
	_, err := c.Do(ctx, "rts", kv("qp", qp.ID), hexv("spsn", uint64(a.SendPSN)), kv("timeout", a.Timeout),
		kv("retry", a.Retry), kv("rnr_retry", a.RNRRetry), kv("rd_atomic", a.MaxRdAtom))
	return err
}

// ReadyUD moves a UD QP from RESET through INIT (Q_Key qkey, port 1,
// pkey index 0) and RTR to RTS with send PSN psn.
func (c *Client) ReadyUD(ctx context.Context, qp QP, qkey, psn uint32) error {
	if _, err := c.Do(ctx, "init", kv("qp", qp.ID), hexv("qkey", uint64(qkey))); err != nil {
		return err
	}
	if _, err := c.Do(ctx, "udrtr", kv("qp", qp.ID)); err != nil {
		return err
	}
	_, err := c.Do(ctx, "udrts", kv("qp", qp.ID), hexv("spsn", uint64(psn)))
	return err
}

// AH is an address handle the agent made.
type AH int

// AHAttr are an address handle's attributes; zero fields take the defaults
// noted.
type AHAttr struct {
	DestGID      [16]byte
	SGIDIndex    int // 0: the agent's --gid-index (1, rxe's IPv4 GID, unless given)
	HopLimit     int // 0 means 64
	TrafficClass int
	SL           int
	FlowLabel    uint32
}

// CreateAH creates an address handle (ibv_create_ah) for UD sends.
func (c *Client) CreateAH(ctx context.Context, pd PD, a AHAttr) (AH, error) {
	if a.HopLimit == 0 {
		a.HopLimit = 64
	}
	args := []string{kv("pd", int(pd)), "dgid=" + hex.EncodeToString(a.DestGID[:]),
		kv("hop", a.HopLimit), kv("tc", a.TrafficClass), kv("sl", a.SL), hexv("fl", uint64(a.FlowLabel))}
	if a.SGIDIndex != 0 {
		args = append(args, kv("sgid", a.SGIDIndex))
	}
	r, err := c.Do(ctx, "ah", args...)
	if err != nil {
		return 0, err
	}
	id, err := r.Uint("ah")
	return AH(id), err
}

// SetState moves qp to "ERR", "RESET" or "SQD".
func (c *Client) SetState(ctx context.Context, qp QP, state string) error {
	_, err := c.Do(ctx, "state", kv("qp", qp.ID), kv("to", state))
	return err
}

// QPAttr is what Query reports about a QP.
type QPAttr struct {
	State            string // RESET, INIT, RTR, RTS, SQD, SQE, ERR
	SendPSN, RecvPSN uint32
	MTU              int
	DestQPN          uint32
	Timeout, Retry   int
	RNRRetry         int
	MinRNRTimer      int
	MaxRdAtom        int
	MaxDestRdAtom    int
	QKey             uint32
}

// Query returns qp's current attributes (ibv_query_qp).
func (c *Client) Query(ctx context.Context, qp QP) (QPAttr, error) {
	r, err := c.Do(ctx, "query", kv("qp", qp.ID))
	if err != nil {
		return QPAttr{}, err
	}
	a := QPAttr{State: r["state"]}
	fields := []struct {
		k string
		p any
	}{{"sq_psn", &a.SendPSN}, {"rq_psn", &a.RecvPSN}, {"mtu", &a.MTU}, {"dqpn", &a.DestQPN},
		{"timeout", &a.Timeout}, {"retry", &a.Retry}, {"rnr_retry", &a.RNRRetry}, {"min_rnr", &a.MinRNRTimer},
		{"rd_atomic", &a.MaxRdAtom}, {"dest_rd_atomic", &a.MaxDestRdAtom}, {"qkey", &a.QKey}}
	for _, f := range fields {
		v, err := r.Uint(f.k)
		if err != nil {
			return QPAttr{}, err
		}
		switch p := f.p.(type) {
		case *uint32:
			*p = uint32(v)
		case *int:
			*p = int(v)
		}
	}
	return a, nil
}

// Op is a send work request opcode.
type Op string

// Send work request opcodes.
const (
	OpSend     Op = "send"
	OpSendImm  Op = "send_imm"
	OpWrite    Op = "write"
	OpWriteImm Op = "write_imm"
	OpRead     Op = "read"
	OpCmpSwap  Op = "cas"
	OpFetchAdd Op = "faa"
	// OpSendInv is SEND_WITH_INV; RKey is the key the peer invalidates.
	OpSendInv Op = "send_inv"
)

// SendWR is one send work request with a single local SGE (MR, Off, Len;
// Len 0 means no SGE, and MR may then be the zero MR). Atomics need Len 8
// and an 8-byte aligned RemoteAddr.
type SendWR struct {
	WRID       uint64
	Op         Op
	MR         MR
	Off, Len   int
	RemoteAddr uint64
	RKey       uint32
	// Imm is the ImmDt value as read big-endian off the wire.
	Imm uint32
	// Compare and Swap for OpCmpSwap; Add for OpFetchAdd.
	Compare, Swap, Add uint64
	// Unsignaled suppresses the success completion (errors still
	// complete, IBTA 10.7.3.1).
	Unsignaled bool
	Fence      bool
	Solicited  bool
	Inline     bool
	// UD sends: the address handle, remote QP number and Q_Key.
	AH         AH
	RemoteQPN  uint32
	RemoteQKey uint32
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// PostSend posts one work request on qp's send queue.
func (c *Client) PostSend(ctx context.Context, qp QP, wr SendWR) error {
	_, err := c.Do(ctx, "send", kv("qp", qp.ID), kv("wr", wr.WRID), kv("op", string(wr.Op)), kv("mr", wr.MR.ID),
		kv("off", wr.Off), kv("len", wr.Len), hexv("raddr", wr.RemoteAddr), hexv("rkey", uint64(wr.RKey)),
		hexv("imm", uint64(wr.Imm)), hexv("compare", wr.Compare), hexv("swap", wr.Swap), hexv("add", wr.Add),
		kv("signaled", b2i(!wr.Unsignaled)), kv("fence", b2i(wr.Fence)), kv("solicited", b2i(wr.Solicited)),
		kv("inline", b2i(wr.Inline)), kv("ah", int(wr.AH)), hexv("dqpn", uint64(wr.RemoteQPN)), hexv("qkey", uint64(wr.RemoteQKey)))
	return err
}

// PostRecv posts one receive work request (a single SGE; length 0 and the
// zero MR post one without any) on qp.
func (c *Client) PostRecv(ctx context.Context, qp QP, wrID uint64, mr MR, off, length int) error {
	_, err := c.Do(ctx, "recv", kv("qp", qp.ID), kv("wr", wrID), kv("mr", mr.ID), kv("off", off), kv("len", length))
	return err
}

// WCStatus is enum ibv_wc_status.
type WCStatus int

// Work completion status codes (enum ibv_wc_status).
const (
	WCSuccess        WCStatus = 0
	WCLocLenErr      WCStatus = 1
	WCLocQPOpErr     WCStatus = 2
	WCLocProtErr     WCStatus = 4
	WCWRFlushErr     WCStatus = 5
	WCBadRespErr     WCStatus = 7
	WCLocAccessErr   WCStatus = 8
	WCRemInvReqErr   WCStatus = 9
	WCRemAccessErr   WCStatus = 10
	WCRemOpErr       WCStatus = 11
	WCRetryExcErr    WCStatus = 12
	WCRNRRetryExcErr WCStatus = 13
	WCGeneralErr     WCStatus = 21
)

// WCOpcode is enum ibv_wc_opcode.
type WCOpcode int

// Work completion opcodes (enum ibv_wc_opcode).
const (
	WCSend            WCOpcode = 0
	WCRDMAWrite       WCOpcode = 1
	WCRDMARead        WCOpcode = 2
	WCCompSwap        WCOpcode = 3
	WCFetchAdd        WCOpcode = 4
	WCRecv            WCOpcode = 128
	WCRecvRDMAWithImm WCOpcode = 129
)

// WC is a work completion.
type WC struct {
	WRID      uint64
	Status    WCStatus
	StatusStr string // ibv_wc_status_str
	Opcode    WCOpcode
	ByteLen   uint32
	Imm       uint32 // ImmDt as read big-endian off the wire
	QPN       uint32
	SrcQP     uint32
	Flags     uint32 // ibv_wc_flags (IBV_WC_WITH_IMM = 2)
	VendorErr uint32
}

// Poll waits up to timeout for one completion on cq. It returns nil, nil
// when none arrived in time. The agent sleeps on the CQ's completion
// channel while it waits.
func (c *Client) Poll(ctx context.Context, cq CQ, timeout time.Duration) (*WC, error) {
	r, err := c.Do(ctx, "poll", kv("cq", int(cq)), kv("timeout", timeout.Milliseconds()))
	if err != nil {
		return nil, err
	}
	if _, none := r["none"]; none {
		return nil, nil
	}
	var v [9]uint64
	for i, k := range []string{"wr", "status", "opcode", "len", "imm", "qpn", "src_qp", "wc_flags", "vendor_err"} {
		if v[i], err = r.Uint(k); err != nil {
			return nil, err
		}
	}
	return &WC{WRID: v[0], Status: WCStatus(v[1]), StatusStr: r["str"], Opcode: WCOpcode(v[2]), ByteLen: uint32(v[3]),
		Imm: uint32(v[4]), QPN: uint32(v[5]), SrcQP: uint32(v[6]), Flags: uint32(v[7]), VendorErr: uint32(v[8])}, nil
}

// ReadMem returns n bytes of mr from offset off.
func (c *Client) ReadMem(ctx context.Context, mr MR, off, n int) ([]byte, error) {
	r, err := c.Do(ctx, "mem", kv("mr", mr.ID), kv("off", off), kv("len", n))
	if err != nil {
		return nil, err
	}
	b, err := hex.DecodeString(r["hex"])
	if err != nil || len(b) != n {
		return nil, fmt.Errorf("agent: bad memory reply (%d bytes, %v)", len(b), err)
	}
	return b, nil
}

// WriteMem stores b into mr at offset off.
func (c *Client) WriteMem(ctx context.Context, mr MR, off int, b []byte) error {
	if len(b) == 0 {
		return nil
	}
	_, err := c.Do(ctx, "memw", kv("mr", mr.ID), kv("off", off), "hex="+hex.EncodeToString(b))
	return err
}

// Fill sets n bytes of mr from offset off to v.
func (c *Client) Fill(ctx context.Context, mr MR, off, n int, v byte) error {
	_, err := c.Do(ctx, "fill", kv("mr", mr.ID), kv("off", off), kv("len", n), kv("byte", v))
	return err
}

// DestroyAll destroys every object of the session and closes the device.
func (c *Client) DestroyAll(ctx context.Context) error {
	_, err := c.Do(ctx, "destroy")
	return err
}

// SRQ is the agent's id of a shared receive queue (0: none).
type SRQ int

// CreateSRQ creates a shared receive queue of maxWR WQEs with one SGE each,
// with the limit armed at limit (0: not armed). It returns the agent's id
// and the SRQ number.
func (c *Client) CreateSRQ(ctx context.Context, pd PD, maxWR, limit int) (SRQ, uint32, error) {
	r, err := c.Do(ctx, "srq", kv("pd", int(pd)), kv("wr", maxWR), kv("limit", limit))
	if err != nil {
		return 0, 0, err
	}
	id, err := r.Uint("srq")
	if err != nil {
		return 0, 0, err
	}
	n, err := r.Uint("srqn")
	return SRQ(id), uint32(n), err
}

// PostSRQRecv posts one receive work request (a single SGE; length 0 and
// the zero MR post one without any) on srq (ibv_post_srq_recv).
func (c *Client) PostSRQRecv(ctx context.Context, srq SRQ, wrID uint64, mr MR, off, length int) error {
	_, err := c.Do(ctx, "srecv", kv("srq", int(srq)), kv("wr", wrID), kv("mr", mr.ID), kv("off", off), kv("len", length))
	return err
}

// SetSRQLimit arms srq's limit (ibv_modify_srq with IBV_SRQ_LIMIT).
func (c *Client) SetSRQLimit(ctx context.Context, srq SRQ, limit int) error {
	_, err := c.Do(ctx, "srqlimit", kv("srq", int(srq)), kv("limit", limit))
	return err
}

// ResizeSRQ resizes srq to maxWR WQEs (ibv_modify_srq with
// IBV_SRQ_MAX_WR) and returns the max_wr the device chose.
func (c *Client) ResizeSRQ(ctx context.Context, srq SRQ, maxWR int) (int, error) {
	r, err := c.Do(ctx, "srqmod", kv("srq", int(srq)), kv("wr", maxWR))
	if err != nil {
		return 0, err
	}
	n, err := r.Uint("max_wr")
	return int(n), err
}

// QuerySRQ returns srq's max_wr, max_sge and armed limit (ibv_query_srq).
func (c *Client) QuerySRQ(ctx context.Context, srq SRQ) (maxWR, maxSGE, limit int, err error) {
	r, err := c.Do(ctx, "srqquery", kv("srq", int(srq)))
	if err != nil {
		return 0, 0, 0, err
	}
	var v [3]uint64
	for i, k := range []string{"max_wr", "max_sge", "limit"} {
		if v[i], err = r.Uint(k); err != nil {
			return 0, 0, 0, err
		}
	}
	return int(v[0]), int(v[1]), int(v[2]), nil
}

// Async event types (enum ibv_event_type) the harness looks for.
const (
	EventQPFatal          = 1
	EventSRQLimitReached  = 15
	EventQPLastWQEReached = 16
)

// AsyncEvent is one event from ibv_get_async_event. QP and SRQ are the
// agent's ids of the element it names (0: none or not one of the agent's).
type AsyncEvent struct {
	Type int
	QP   int
	QPN  uint32
	SRQ  SRQ
	Str  string // ibv_event_type_str
}

// AsyncEvent waits up to timeout for one async event of the device; nil,
// nil when none came.
func (c *Client) AsyncEvent(ctx context.Context, timeout time.Duration) (*AsyncEvent, error) {
	r, err := c.Do(ctx, "event", kv("timeout", timeout.Milliseconds()))
	if err != nil {
		return nil, err
	}
	if _, none := r["none"]; none {
		return nil, nil
	}
	var v [4]uint64
	for i, k := range []string{"type", "qp", "qpn", "srq"} {
		if v[i], err = r.Uint(k); err != nil {
			return nil, err
		}
	}
	return &AsyncEvent{Type: int(v[0]), QP: int(v[1]), QPN: uint32(v[2]), SRQ: SRQ(v[3]), Str: r["str"]}, nil
}

// DevInfo describes the agent's device (the devinfo command).
type DevInfo struct {
	Name     string // the verbs device name (mlx5_0, rxe0)
	FW       string // ibv_query_device fw_ver ("" when the driver reports none)
	Driver   string // the kernel driver of the device's parent (sysfs device/driver), "" for software devices
	NodeDesc string // the node description (sysfs node_desc)
	Parent   string // the network device a software RDMA device sits on (sysfs parent), if any
	VendorID uint32
	PartID   uint32
	HWVer    uint32
	NodeGUID uint64
	GIDIndex int      // the agent's default source GID index
	GID      [16]byte // the GID at that index
	GIDType  string   // "RoCE_v2", "RoCE_v1" or "IB" (sysfs gid_attrs/types, blanks as _)
}

// DevInfo asks the agent what its device is. It works before Open (the
// agent opens the device for the query).
func (c *Client) DevInfo(ctx context.Context) (DevInfo, error) {
	r, err := c.Do(ctx, "devinfo")
	if err != nil {
		return DevInfo{}, err
	}
	d := DevInfo{Name: r["dev"], FW: r["fw"], Driver: r["driver"], NodeDesc: r["node_desc"], Parent: r["parent"], GIDType: r["gid_type"]}
	var v [5]uint64
	for i, k := range []string{"vendor", "part", "hw", "node_guid", "gid_index"} {
		if v[i], err = r.Uint(k); err != nil {
			return DevInfo{}, err
		}
	}
	d.VendorID, d.PartID, d.HWVer, d.NodeGUID, d.GIDIndex = uint32(v[0]), uint32(v[1]), uint32(v[2]), v[3], int(v[4])
	if g, err := hex.DecodeString(r["gid"]); err == nil && len(g) == 16 {
		copy(d.GID[:], g)
	}
	return d, nil
}

// Objects are the verbs objects the agent holds (the objects command).
type Objects struct {
	Ctx                         bool // the device is open
	PD, MR, CQ, QP, SRQ, MW, AH int
	CM                          int // running rdma_cm endpoints (CMListen, CMConnect)
}

// Total is the number of objects other than the device context.
func (o Objects) Total() int { return o.PD + o.MR + o.CQ + o.QP + o.SRQ + o.MW + o.AH + o.CM }

// Objects counts the objects the agent holds: after a fresh connection
// everything is zero unless a previous session leaked.
func (c *Client) Objects(ctx context.Context) (Objects, error) {
	r, err := c.Do(ctx, "objects")
	if err != nil {
		return Objects{}, err
	}
	var o Objects
	ps := []*int{nil, &o.PD, &o.MR, &o.CQ, &o.QP, &o.SRQ, &o.MW, &o.AH, &o.CM}
	for i, k := range []string{"ctx", "pd", "mr", "cq", "qp", "srq", "mw", "ah", "cm"} {
		v, err := r.Uint(k)
		if err != nil {
			return Objects{}, err
		}
		if i == 0 {
			o.Ctx = v != 0
		} else {
			*ps[i] = int(v)
		}
	}
	return o, nil
}

// CMListen starts an rdma_cm server on the agent's device address at port
// (rping -s, rdmacm-utils, accepting one connection) and returns its id for
// CMStop. The agent kills it when the session ends.
func (c *Client) CMListen(ctx context.Context, port uint16) (int, error) {
	r, err := c.Do(ctx, "cmlisten", kv("port", port))
	if err != nil {
		return 0, err
	}
	id, err := r.Uint("cm")
	return int(id), err
}

// CMConnect starts an rdma_cm client (rping -c) toward addr:port.
func (c *Client) CMConnect(ctx context.Context, addr netip.Addr, port uint16) (int, error) {
	if !addr.Is4() {
		return 0, fmt.Errorf("agent: rdma_cm connect to %s: IPv4 only", addr)
	}
	r, err := c.Do(ctx, "cmconnect", "addr="+addr.String(), kv("port", port))
	if err != nil {
		return 0, err
	}
	id, err := r.Uint("cm")
	return int(id), err
}

// CMStop ends an rdma_cm endpoint CMListen or CMConnect started.
func (c *Client) CMStop(ctx context.Context, id int) error {
	_, err := c.Do(ctx, "cmstop", kv("cm", id))
	return err
}
