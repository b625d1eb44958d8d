package cases

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/softroce/softroce/cm"
	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/internal/devsync"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/nic/pipe"
	"github.com/softroce/softroce/qpstate"
	"github.com/softroce/softroce/verbs"
)

// SoftroceTarget is softroce's own transport (transport/rc behind the
// verbs API) on one end of an in-process pipe; the fake peer holds the
// other end. It needs no privileges.
type SoftroceTarget struct {
	dev  *verbs.Device
	cm   *cm.CM // the device's connection manager, on its QP1
	peer *Peer
	addr netip.Addr
}

// NewSoftroceTarget opens a softroce device and a fake peer on a pipe.
func NewSoftroceTarget() (*SoftroceTarget, error) {
	a, b := pipe.New(pipe.Config{})
	dev, err := verbs.Open(a, &verbs.Options{Name: "softroce-target"})
	if err != nil {
		a.Close()
		b.Close()
		return nil, fmt.Errorf("open softroce device on a pipe: %w", err)
	}
	raw, ok := b.(nic.RawSender)
	if !ok {
		dev.Close()
		b.Close()
		return nil, errors.New("pipe link cannot send raw packets")
	}
	peer, err := NewPeer(raw)
	if err != nil {
		dev.Close()
		b.Close()
		return nil, err
	}
	c, err := cm.Open(dev, nil)
	if err != nil {
		dev.Close()
		peer.Close()
		return nil, fmt.Errorf("open the device's CM: %w", err)
	}
	return &SoftroceTarget{dev: dev, cm: c, peer: peer, addr: a.Addrs()[0]}, nil
}

// cmQP makes an RC QP (with its PD and CQ) for a CM connection and
// returns it with its cleanup.
func (t *SoftroceTarget) cmQP() (*verbs.QP, func(), error) {
	pd, err := t.dev.AllocPD()
	if err != nil {
		return nil, nil, err
	}
	c, err := t.dev.CreateCQ(16)
	if err != nil {
		pd.Dealloc()
		return nil, nil, err
	}
	qp, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: c, RecvCQ: c, Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4}})
	if err != nil {
		t.dev.DestroyCQ(c)
		pd.Dealloc()
		return nil, nil, err
	}
	return qp, func() { qp.Destroy(); t.dev.DestroyCQ(c); pd.Dealloc() }, nil
}

// CMListen implements CMTarget with a package cm listener that accepts
// one connection on an RC QP of its own.
func (t *SoftroceTarget) CMListen(ctx context.Context, port uint16) (func(), error) {
	l, err := t.cm.Listen(cm.PortSpaceTCP, port)
	if err != nil {
		return nil, err
	}
	lctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, err := l.Next(lctx)
		if err != nil {
			return
		}
		qp, free, err := t.cmQP()
		if err != nil {
			req.Reject(nil)
			return
		}
		defer free()
		if conn, err := req.Accept(lctx, qp, nil); err == nil {
			select {
			case <-conn.Done():
			case <-lctx.Done():
			}
		}
	}()
	return func() { cancel(); l.Close(); <-done }, nil
}

// CMConnect implements CMTarget with package cm's Dial.
func (t *SoftroceTarget) CMConnect(ctx context.Context, port uint16) (func(), error) {
	qp, free, err := t.cmQP()
	if err != nil {
		return nil, err
	}
	dctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer free()
		if conn, err := t.cm.Dial(dctx, t.peer.Addr(), cm.PortSpaceTCP, port, qp, nil); err == nil {
			select {
			case <-conn.Done():
			case <-dctx.Done():
			}
		}
	}()
	return func() { cancel(); <-done }, nil
}

// Name implements Target.
func (t *SoftroceTarget) Name() string { return "softroce" }

// Peer implements Target.
func (t *SoftroceTarget) Peer() *Peer { return t.peer }

// Addr implements Target.
func (t *SoftroceTarget) Addr() netip.Addr { return t.addr }

// Device is the softroce device under test.
func (t *SoftroceTarget) Device() *verbs.Device { return t.dev }

// Close implements Target.
func (t *SoftroceTarget) Close() error {
	t.cm.Close()
	err := t.dev.Close()
	if perr := t.peer.Close(); err == nil {
		err = perr
	}
	return err
}

// Open implements Target.
func (t *SoftroceTarget) Open(ctx context.Context, spec QPSpec) (Session, error) {
	spec.fill()
	// The device outlives sessions: events of earlier cases are not this
	// one's.
	for drained := false; !drained; {
		select {
		case <-t.dev.AsyncEvents():
		default:
			drained = true
		}
	}
	pd, err := t.dev.AllocPD()
	if err != nil {
		return nil, fmt.Errorf("alloc PD: %w", err)
	}
	s := &softSession{t: t, pd: pd, g: &softGroup{qpns: map[uint32]bool{}}}
	for i, m := range spec.MRs {
		buf := make([]byte, m.Len)
		mr, err := pd.RegMR(buf, verbs.Access(m.Access))
		if err != nil {
			s.Close()
			return nil, fmt.Errorf("register MR %d: %w", i, err)
		}
		s.bufs = append(s.bufs, buf)
		s.mrs = append(s.mrs, mr)
	}
	if spec.SRQ != nil {
		if s.srq, err = pd.CreateSRQ(verbs.SRQInitAttr{MaxWR: spec.SRQ.MaxWR, Limit: spec.SRQ.Limit}); err != nil {
			s.Close()
			return nil, fmt.Errorf("create SRQ: %w", err)
		}
	}
	if err := s.connect(spec); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// connect creates the session's CQ and QP and connects the QP to the peer.
func (s *softSession) connect(spec QPSpec) error {
	t, pd := s.t, s.pd
	var err error
	if s.cq, err = t.dev.CreateCQ(64); err != nil {
		return fmt.Errorf("create CQ: %w", err)
	}
	init := verbs.QPInitAttr{SendCQ: s.cq, RecvCQ: s.cq, Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16}}
	switch spec.Type {
	case "uc":
		init.Type = verbs.QPTypeUC
	case "ud":
		init.Type = verbs.QPTypeUD
	}
	if spec.SRQ != nil {
		if s.srq == nil {
			return errors.New("the QP is to be on an SRQ, but the session has none")
		}
		init.SRQ = s.srq
	}
	if s.qp, err = pd.CreateQP(init); err != nil {
		return fmt.Errorf("create QP: %w", err)
	}
	s.g.qpns[s.qp.Num()] = true
	if spec.Type == "ud" {
		// INIT with the Q_Key, then RTR and RTS, which UD enters without a
		// path (IBTA §11.2.4.2).
		steps := []struct {
			a verbs.QPAttr
			m verbs.AttrMask
		}{{verbs.QPAttr{State: verbs.StateInit, Port: 1, QKey: spec.QKey}, qpstate.AttrState | qpstate.AttrPKeyIndex | qpstate.AttrPort | qpstate.AttrQKey},
			{verbs.QPAttr{State: verbs.StateRTR}, qpstate.AttrState},
			{verbs.QPAttr{State: verbs.StateRTS, SQPSN: spec.SendPSN}, qpstate.AttrState | qpstate.AttrSQPSN}}
		for _, st := range steps {
			if err := s.qp.Modify(&st.a, st.m); err != nil {
				return fmt.Errorf("modify UD QP to %v: %w", st.a.State, err)
			}
		}
		return nil
	}
	access := verbs.Access(spec.Access &^ AccessLocalWrite)
	if spec.Type == "uc" {
		access &= verbs.AccessRemoteWrite
	}
	if access == 0 {
		// ConnectOptions treats 0 as "all"; no case needs a QP without
		// any remote access.
		access = verbs.AccessRemoteWrite | verbs.AccessRemoteRead | verbs.AccessRemoteAtomic
	}
	err = s.qp.Connect(verbs.RemoteInfo{QPN: spec.PeerQPN, PSN: spec.RecvPSN, GID: verbs.GID(t.peer.GID())},
		&verbs.ConnectOptions{PathMTU: spec.MTU, SQPSN: spec.SendPSN, Timeout: spec.Timeout, RetryCnt: spec.Retry,
			RNRRetry: spec.RNRRetry, MinRNRTimer: spec.MinRNRTimer, MaxRDAtomic: uint8(spec.MaxDestRdAtomic), Access: access,
			CC: ccMode(spec.CC)})
	if err != nil {
		return fmt.Errorf("connect QP: %w", err)
	}
	return nil
}

// ccMode is the congestion control a QP spec asks of softroce: DCQCN
// (verbs.CCDefaults, a CNP at most every 50 us per QP) or none.
func ccMode(on bool) verbs.CCMode {
	if on {
		return verbs.CCDCQCN
	}
	return verbs.CCNone
}

// CCCounters implements CCSession.
func (s *softSession) CCCounters(context.Context) (marked, cnpSent uint64, err error) {
	c := s.qp.Stats().CC
	return c.ECNMarked, c.CNPSent, nil
}

// softGroup is what a session and the sessions OpenQP makes from it share.
type softGroup struct {
	qpns map[uint32]bool
	mws  []*verbs.MW
}

type softSession struct {
	t    *SoftroceTarget
	pd   *verbs.PD
	bufs [][]byte
	mrs  []*verbs.MR
	cq   *verbs.CQ
	qp   *verbs.QP
	srq  *verbs.SRQ
	// g is what the case's sessions share: QP numbers and windows.
	g *softGroup
	// shared marks a session from OpenQP: its PD, MRs and SRQ are another's.
	shared bool
}

func (s *softSession) OpenQP(ctx context.Context, spec QPSpec) (Session, error) {
	spec.fill()
	c := &softSession{t: s.t, pd: s.pd, bufs: s.bufs, mrs: s.mrs, srq: s.srq, g: s.g, shared: true}
	if err := c.connect(spec); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func (s *softSession) QPN() uint32 { return s.qp.Num() }

func (s *softSession) MR(i int) MR {
	m := s.mrs[i]
	return MR{Index: i, Addr: m.Addr(), RKey: m.RKey(), Len: len(s.bufs[i])}
}

func (s *softSession) PostRecv(ctx context.Context, wrID uint64, off, n int) error {
	if s.srq != nil {
		return errors.New("the QP is on an SRQ: post to it (PostSRQRecv)")
	}
	m := s.mrs[0]
	return s.qp.PostRecv(&verbs.RecvWR{ID: wrID, SGL: []verbs.SGE{{Addr: m.Addr() + uint64(off), Length: uint32(n), LKey: m.LKey()}}})
}

func (s *softSession) PostSend(ctx context.Context, r SendReq) error {
	wr := verbs.SendWR{ID: r.WRID, Flags: verbs.SendSignaled, RemoteAddr: r.RemoteAddr, RKey: r.RKey}
	switch r.Op {
	case SendWrite:
		wr.Opcode = verbs.WRRDMAWrite
	case SendRead:
		wr.Opcode = verbs.WRRDMARead
	case SendSend:
		wr.Opcode = verbs.WRSend
	default:
		return fmt.Errorf("post send: opcode %q not supported by the harness", r.Op)
	}
	if r.Len > 0 {
		m := s.mrs[r.MR]
		wr.SGL = []verbs.SGE{{Addr: m.Addr() + uint64(r.Off), Length: uint32(r.Len), LKey: m.LKey()}}
	}
	return s.qp.PostSend(&wr)
}

func (s *softSession) Poll(ctx context.Context, d time.Duration) (*Completion, error) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	wcs := make([]verbs.WC, 1)
	n, err := s.cq.Wait(ctx, wcs)
	if n == 0 {
		if errors.Is(err, context.DeadlineExceeded) {
			return nil, nil
		}
		return nil, err
	}
	w := wcs[0]
	return &Completion{WRID: w.WRID, Status: int(w.Status), Opcode: int(w.Opcode), ByteLen: w.ByteLen,
		Imm: w.ImmData, WithImm: w.Flags&cq.FlagWithImm != 0, WithInv: w.Flags&cq.FlagWithInv != 0,
		InvRKey: w.InvalidatedRKey, Flags: uint32(w.Flags), SrcQP: w.SrcQP}, nil
}

func (s *softSession) PostSRQRecv(ctx context.Context, wrID uint64, off, n int) error {
	if s.srq == nil {
		return errors.New("the session has no SRQ")
	}
	m := s.mrs[0]
	return s.srq.PostRecv(&verbs.RecvWR{ID: wrID, SGL: []verbs.SGE{{Addr: m.Addr() + uint64(off), Length: uint32(n), LKey: m.LKey()}}})
}

func (s *softSession) SetSRQLimit(ctx context.Context, limit int) error {
	if s.srq == nil {
		return errors.New("the session has no SRQ")
	}
	return s.srq.Modify(verbs.SRQAttr{Limit: limit}, verbs.SRQLimit)
}

func (s *softSession) SRQLimit(ctx context.Context) (int, error) {
	if s.srq == nil {
		return 0, errors.New("the session has no SRQ")
	}
	return s.srq.Query().Limit, nil
}

// Event skips events of other cases' QPs: the device is shared.
func (s *softSession) Event(ctx context.Context, d time.Duration) (*Event, error) {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case ev := <-s.t.dev.AsyncEvents():
			if ev.SRQ != nil && ev.SRQ == s.srq {
				return &Event{Type: int(ev.Type), SRQ: true, Name: ev.Type.String()}, nil
			}
			if ev.SRQ == nil && ev.CQ == nil && s.g.qpns[ev.QPNum] {
				return &Event{Type: int(ev.Type), QPN: ev.QPNum, Name: ev.Type.String()}, nil
			}
		case <-t.C:
			return nil, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

func (s *softSession) SetError(ctx context.Context) error {
	return s.qp.Modify(&verbs.QPAttr{State: verbs.StateErr}, qpstate.AttrState)
}

func (s *softSession) AllocMW(ctx context.Context, typ int) (*MW, error) {
	mw, err := s.pd.AllocMW(verbs.MWType(typ))
	if err != nil {
		return nil, err
	}
	s.g.mws = append(s.g.mws, mw)
	return &MW{Type: typ, RKey: mw.RKey(), h: mw}, nil
}

// BindMW: MW.Bind (type 1, ibv_bind_mw) and a BIND_MW work request
// (type 2) both complete on the send CQ; an error from the verb itself is
// a refusal.
func (s *softSession) BindMW(ctx context.Context, wrID uint64, mw *MW, mr, off, n int, access Access) (string, error) {
	vmw := mw.h.(*verbs.MW)
	m := s.mrs[mr]
	addr := m.Addr() + uint64(off)
	if mw.Type == 1 {
		info := verbs.MWBindInfo{MR: m, Addr: addr, Length: uint64(n), Access: verbs.Access(access)}
		if _, err := vmw.Bind(s.qp, info, wrID, verbs.SendSignaled); err != nil {
			return err.Error(), nil
		}
	} else {
		k := verbs.IncRKey(vmw.RKey())
		w := vmw.BindWR(wrID, verbs.SendSignaled, m, addr, uint64(n), verbs.Access(access), k)
		if err := s.qp.PostSend(&w); err != nil {
			return err.Error(), nil
		}
	}
	wc, err := s.Poll(ctx, 5*time.Second)
	switch {
	case err != nil:
		return "", err
	case wc == nil:
		return "", errors.New("the bind did not complete")
	case wc.WRID != wrID:
		return "", fmt.Errorf("a completion of wr %d came while waiting for the bind (wr %d)", wc.WRID, wrID)
	case wc.Status != 0:
		return "bind completed " + wcStatusName(wc.Status), nil
	}
	mw.RKey = vmw.RKey()
	return "", nil
}

func (s *softSession) LocalInv(ctx context.Context, wrID uint64, rkey uint32) (*Completion, error) {
	if err := s.qp.PostSend(&verbs.SendWR{ID: wrID, Opcode: verbs.WRLocalInv, Flags: verbs.SendSignaled, InvRKey: rkey}); err != nil {
		return nil, err
	}
	return s.Poll(ctx, 5*time.Second)
}

func (s *softSession) ReadMem(ctx context.Context, i, off, n int) ([]byte, error) {
	b := s.bufs[i]
	if off < 0 || n < 0 || off+n > len(b) {
		return nil, fmt.Errorf("read MR %d [%d,%d): out of range (%d bytes)", i, off, off+n, len(b))
	}
	// Under the engine's lock: UC and UD give no ACK to wait for, so the
	// transport may still be placing a packet the case gave up waiting on.
	var out []byte
	devsync.Run(s.t.dev, func() { out = append([]byte(nil), b[off:off+n]...) })
	return out, nil
}

func (s *softSession) WriteMem(ctx context.Context, i, off int, v []byte) error {
	b := s.bufs[i]
	if off < 0 || off+len(v) > len(b) {
		return fmt.Errorf("write MR %d [%d,%d): out of range (%d bytes)", i, off, off+len(v), len(b))
	}
	devsync.Run(s.t.dev, func() { copy(b[off:], v) })
	return nil
}

// State uses Query, which takes the engine lock: verbs.QP.State reads the
// transport's state without it and races with the receive goroutine.
func (s *softSession) State(ctx context.Context) (string, error) {
	a, _ := s.qp.Query()
	return a.State.String(), nil
}

func (s *softSession) Close() error {
	if s.qp != nil {
		s.qp.Destroy()
	}
	if s.shared {
		return nil
	}
	for _, mw := range s.g.mws {
		mw.Dealloc()
	}
	if s.srq != nil {
		s.srq.Destroy()
	}
	for _, m := range s.mrs {
		s.t.dev.DeregMR(m)
	}
	return s.pd.Dealloc()
}
