package cases

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"math/rand/v2"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/softroce/softroce/conformance/agent"
	"github.com/softroce/softroce/conformance/rxevm"
	"github.com/softroce/softroce/nic/udp"
)

// RxeTarget is the Linux kernel's rdma_rxe in a VM (package rxevm), driven
// through the verbs agent (package agent). The fake peer is a UDP link on
// the host side of the VM's tap, inside the VM's network namespace: it
// sends with IPv4 ID 0, whose ICRC rxe accepts (docs/platform.md, ICRC).
type RxeTarget struct {
	vm   *rxevm.VM
	ag   *agent.Client
	peer *Peer
	open bool
	dev  string // the verbs device ("": rxe0); RemoteTarget sets it
}

func (t *RxeTarget) device() string {
	if t.dev == "" {
		return "rxe0"
	}
	return t.dev
}

// NewRxeTarget launches the verbs agent in vm (booted with
// agent.GuestFile among its files) and opens the fake peer's link.
func NewRxeTarget(ctx context.Context, vm *rxevm.VM) (*RxeTarget, error) {
	ag, err := agent.Launch(ctx, vm, 7100+rand.IntN(800))
	if err != nil {
		return nil, fmt.Errorf("launch the verbs agent in the rxe guest: %w", err)
	}
	var link *udp.Link
	err = vm.Do(func() error {
		var err error
		link, err = udp.Open(udp.Config{Addr: vm.HostAddr()})
		return err
	})
	if err != nil {
		ag.Close()
		return nil, fmt.Errorf("open the peer's UDP link in the VM namespace: %w", err)
	}
	peer, err := NewPeer(link)
	if err != nil {
		link.Close()
		ag.Close()
		return nil, err
	}
	return &RxeTarget{vm: vm, ag: ag, peer: peer}, nil
}

// Name implements Target.
func (t *RxeTarget) Name() string { return "rxe" }

// Driver implements DriverTarget.
func (t *RxeTarget) Driver() string { return "rxe" }

// Peer implements Target.
func (t *RxeTarget) Peer() *Peer { return t.peer }

// Addr implements Target.
func (t *RxeTarget) Addr() netip.Addr { return t.vm.GuestAddr() }

// Close implements Target: it stops the agent and the peer, not the VM.
func (t *RxeTarget) Close() error {
	err := t.ag.Close()
	if perr := t.peer.Close(); err == nil {
		err = perr
	}
	return err
}

// Open implements Target. One session at a time: opening a new one
// destroys the previous session's objects in the agent.
func (t *RxeTarget) Open(ctx context.Context, spec QPSpec) (Session, error) {
	spec.fill()
	ag := t.ag
	if t.open {
		ag.DestroyAll(ctx)
		t.open = false
	}
	if err := ag.Open(ctx, t.device()); err != nil {
		return nil, fmt.Errorf("rxe: open device: %w", err)
	}
	t.open = true
	s := &rxeSession{t: t}
	var err error
	if s.pd, err = ag.AllocPD(ctx); err != nil {
		return nil, fmt.Errorf("rxe: alloc PD: %w", err)
	}
	for _, m := range spec.MRs {
		mr, err := ag.RegMR(ctx, s.pd, m.Len, agent.Access(m.Access))
		if err != nil {
			return nil, fmt.Errorf("rxe: register MR: %w", err)
		}
		s.mrs = append(s.mrs, mr)
	}
	if spec.SRQ != nil {
		if s.srq, _, err = ag.CreateSRQ(ctx, s.pd, spec.SRQ.MaxWR, spec.SRQ.Limit); err != nil {
			return nil, fmt.Errorf("rxe: create SRQ: %w", err)
		}
	}
	if err := s.connect(ctx, spec); err != nil {
		return nil, err
	}
	return s, nil
}

// connect creates the session's CQ and QP and connects the QP to the peer.
func (s *rxeSession) connect(ctx context.Context, spec QPSpec) error {
	t, ag := s.t, s.t.ag
	var err error
	if s.cq, err = ag.CreateCQ(ctx, 64); err != nil {
		return fmt.Errorf("rxe: create CQ: %w", err)
	}
	cp := agent.QPCap{SendWR: 16, RecvWR: 16}
	access := agent.Access(spec.Access)
	switch spec.Type {
	case "uc":
		// UC carries SEND and WRITE only.
		cp.Type, access = agent.QPTypeUC, access&(agent.AccessLocalWrite|agent.AccessRemoteWrite)
	case "ud":
		cp.Type = agent.QPTypeUD
	}
	if spec.SRQ != nil {
		if s.srq == 0 {
			return errors.New("rxe: the QP is to be on an SRQ, but the session has none")
		}
		cp.SRQ = s.srq
	}
	if s.qp, err = ag.CreateQP(ctx, s.pd, s.cq, s.cq, cp); err != nil {
		return fmt.Errorf("rxe: create QP: %w", err)
	}
	if spec.Type == "ud" {
		if err := ag.ReadyUD(ctx, s.qp, spec.QKey, spec.SendPSN); err != nil {
			return fmt.Errorf("rxe: bring the UD QP to RTS: %w", err)
		}
		return nil
	}
	if err := ag.ModifyToInit(ctx, s.qp, access); err != nil {
		return fmt.Errorf("rxe: modify QP to INIT: %w", err)
	}
	if err := ag.ModifyToRTR(ctx, s.qp, agent.RTRAttr{DestQPN: spec.PeerQPN, RecvPSN: spec.RecvPSN, DestGID: t.peer.GID(),
		MTU: spec.MTU, MaxDestRdAtom: spec.MaxDestRdAtomic, MinRNRTimer: int(spec.MinRNRTimer)}); err != nil {
		return fmt.Errorf("rxe: modify QP to RTR: %w", err)
	}
	if err := ag.ModifyToRTS(ctx, s.qp, agent.RTSAttr{SendPSN: spec.SendPSN, Timeout: int(spec.Timeout), Retry: int(spec.Retry),
		RNRRetry: int(spec.RNRRetry), MaxRdAtom: spec.MaxDestRdAtomic}); err != nil {
		return fmt.Errorf("rxe: modify QP to RTS: %w", err)
	}
	return nil
}

type rxeSession struct {
	t   *RxeTarget
	pd  agent.PD
	mrs []agent.MR
	cq  agent.CQ
	qp  agent.QP
	srq agent.SRQ // 0: none
	// shared marks a session from OpenQP: the agent has no verb to
	// destroy one QP, so its objects go with the first session's.
	shared bool
}

func (s *rxeSession) OpenQP(ctx context.Context, spec QPSpec) (Session, error) {
	spec.fill()
	c := &rxeSession{t: s.t, pd: s.pd, mrs: s.mrs, srq: s.srq, shared: true}
	if err := c.connect(ctx, spec); err != nil {
		return nil, err
	}
	return c, nil
}

func (s *rxeSession) QPN() uint32 { return s.qp.QPN }

func (s *rxeSession) MR(i int) MR {
	m := s.mrs[i]
	return MR{Index: i, Addr: m.Addr, RKey: m.RKey, Len: m.Len}
}

func (s *rxeSession) PostRecv(ctx context.Context, wrID uint64, off, n int) error {
	return s.t.ag.PostRecv(ctx, s.qp, wrID, s.mrs[0], off, n)
}

func (s *rxeSession) PostSRQRecv(ctx context.Context, wrID uint64, off, n int) error {
	if s.srq == 0 {
		return errors.New("rxe: the session has no SRQ")
	}
	return s.t.ag.PostSRQRecv(ctx, s.srq, wrID, s.mrs[0], off, n)
}

func (s *rxeSession) SetSRQLimit(ctx context.Context, limit int) error {
	if s.srq == 0 {
		return errors.New("rxe: the session has no SRQ")
	}
	return s.t.ag.SetSRQLimit(ctx, s.srq, limit)
}

func (s *rxeSession) SRQLimit(ctx context.Context) (int, error) {
	if s.srq == 0 {
		return 0, errors.New("rxe: the session has no SRQ")
	}
	_, _, limit, err := s.t.ag.QuerySRQ(ctx, s.srq)
	return limit, err
}

// Event: the agent's device context is the case's alone (Open closes the
// previous one), so every QP or SRQ event it reports concerns the case;
// device events (a port becoming active) are skipped.
func (s *rxeSession) Event(ctx context.Context, d time.Duration) (*Event, error) {
	end := time.Now().Add(d)
	for {
		left := time.Until(end)
		if left <= 0 {
			return nil, nil
		}
		ev, err := s.t.ag.AsyncEvent(ctx, left)
		if err != nil || ev == nil {
			return nil, err
		}
		if ev.QP == 0 && ev.SRQ == 0 {
			continue
		}
		return &Event{Type: ev.Type, QPN: ev.QPN, SRQ: ev.SRQ != 0 && ev.SRQ == s.srq, Name: ev.Str}, nil
	}
}

func (s *rxeSession) SetError(ctx context.Context) error { return s.t.ag.SetState(ctx, s.qp, "ERR") }

func (s *rxeSession) AllocMW(ctx context.Context, typ int) (*MW, error) {
	mw, err := s.t.ag.AllocMW(ctx, s.pd, typ)
	if err != nil {
		return nil, err
	}
	return &MW{Type: typ, RKey: mw.RKey, h: mw}, nil
}

// BindMW: the agent's error replies are the verb's own (ibv_bind_mw or
// ibv_post_send failing), hence a refusal; anything else is the harness's.
func (s *rxeSession) BindMW(ctx context.Context, wrID uint64, mw *MW, mr, off, n int, access Access) (string, error) {
	amw := mw.h.(agent.MW)
	err := s.t.ag.BindMW(ctx, s.qp, wrID, &amw, s.mrs[mr], off, n, agent.Access(access), true)
	var aerr *agent.Error
	if errors.As(err, &aerr) {
		return aerr.Msg, nil
	}
	if err != nil {
		return "", err
	}
	wc, err := s.Poll(ctx, 5*time.Second)
	switch {
	case err != nil:
		return "", err
	case wc == nil:
		return "", errors.New("rxe: the bind did not complete")
	case wc.WRID != wrID:
		return "", fmt.Errorf("rxe: a completion of wr %d came while waiting for the bind (wr %d)", wc.WRID, wrID)
	case wc.Status != 0:
		return "bind completed " + wcStatusName(wc.Status), nil
	}
	mw.RKey, mw.h = amw.RKey, amw
	return "", nil
}

func (s *rxeSession) LocalInv(ctx context.Context, wrID uint64, rkey uint32) (*Completion, error) {
	if err := s.t.ag.LocalInv(ctx, s.qp, wrID, rkey, true); err != nil {
		return nil, err
	}
	return s.Poll(ctx, 5*time.Second)
}

func (s *rxeSession) PostSend(ctx context.Context, r SendReq) error {
	var op agent.Op
	switch r.Op {
	case SendWrite:
		op = agent.OpWrite
	case SendRead:
		op = agent.OpRead
	case SendSend:
		op = agent.OpSend
	default:
		return fmt.Errorf("post send: opcode %q not supported by the harness", r.Op)
	}
	return s.t.ag.PostSend(ctx, s.qp, agent.SendWR{WRID: r.WRID, Op: op, MR: s.mrs[r.MR], Off: r.Off, Len: r.Len,
		RemoteAddr: r.RemoteAddr, RKey: r.RKey})
}

func (s *rxeSession) Poll(ctx context.Context, d time.Duration) (*Completion, error) {
	wc, err := s.t.ag.Poll(ctx, s.cq, d)
	if err != nil || wc == nil {
		return nil, err
	}
	// IBV_WC_WITH_IMM is 2 and IBV_WC_WITH_INV 8 in enum ibv_wc_flags;
	// invalidated_rkey shares imm_data's field, which the agent prints
	// byte-swapped (ntohl), as an immediate.
	c := &Completion{WRID: wc.WRID, Status: int(wc.Status), Opcode: int(wc.Opcode), ByteLen: wc.ByteLen,
		Imm: wc.Imm, WithImm: wc.Flags&2 != 0, WithInv: wc.Flags&8 != 0, Flags: wc.Flags, SrcQP: wc.SrcQP}
	if c.WithInv {
		c.InvRKey = bits.ReverseBytes32(wc.Imm)
	}
	return c, nil
}

func (s *rxeSession) ReadMem(ctx context.Context, i, off, n int) ([]byte, error) {
	if n == 0 {
		return []byte{}, nil
	}
	return s.t.ag.ReadMem(ctx, s.mrs[i], off, n)
}

func (s *rxeSession) WriteMem(ctx context.Context, i, off int, b []byte) error {
	return s.t.ag.WriteMem(ctx, s.mrs[i], off, b)
}

func (s *rxeSession) State(ctx context.Context) (string, error) {
	a, err := s.t.ag.Query(ctx, s.qp)
	return a.State, err
}

func (s *rxeSession) Close() error {
	if s.shared || !s.t.open {
		return nil
	}
	// A short deadline of its own: Close also runs after a case's context
	// expired.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s.t.open = false
	return s.t.ag.DestroyAll(ctx)
}

// BootRxeVM builds (or takes from the cache) the rdma_rxe guest and the
// verbs agent, and boots a VM with the agent installed. The caller closes
// the VM. It needs root, qemu, gcc and libibverbs-dev (see package rxevm).
func BootRxeVM(ctx context.Context, log io.Writer) (*rxevm.VM, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("the rdma_rxe VM needs root (network namespaces, tap devices)")
	}
	img, err := rxevm.Build(ctx, rxevm.Config{Log: log})
	if err != nil {
		return nil, fmt.Errorf("build the rxe guest image: %w", err)
	}
	dir, err := os.MkdirTemp("", "softroce-agent-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	bin, err := agent.Build(ctx, dir)
	if err != nil {
		return nil, fmt.Errorf("build the verbs agent: %w", err)
	}
	vm, err := rxevm.Boot(ctx, img, rxevm.Options{Log: log, Files: []rxevm.File{agent.GuestFile(bin)}})
	if err != nil {
		return nil, fmt.Errorf("boot the rxe guest: %w", err)
	}
	return vm, nil
}

// CMListen implements CMTarget with rping's server (rdmacm-utils), bound to
// the guest's address.
func (t *RxeTarget) CMListen(ctx context.Context, port uint16) (func(), error) {
	p, err := t.vm.Start(ctx, fmt.Sprintf("rping -s -a %s -p %d -C 1", t.vm.GuestAddr(), port))
	if err != nil {
		return nil, err
	}
	return func() { p.Kill() }, nil
}

// CMConnect implements CMTarget with rping's client.
func (t *RxeTarget) CMConnect(ctx context.Context, port uint16) (func(), error) {
	p, err := t.vm.Start(ctx, fmt.Sprintf("rping -c -a %s -p %d -C 1", t.peer.Addr(), port))
	if err != nil {
		return nil, err
	}
	return func() { p.Kill() }, nil
}

// KernelRelease is the guest kernel's release (uname -r), for reports.
func (t *RxeTarget) KernelRelease(ctx context.Context) string {
	out, err := t.vm.Run(ctx, "uname -r")
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(out)
}
