package verbs

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/softroce/softroce/cc/dcqcn"
	"github.com/softroce/softroce/memreg"
	"github.com/softroce/softroce/qpstate"
	"github.com/softroce/softroce/transport/engine"
	"github.com/softroce/softroce/transport/ud"
)

// QPType is the transport service of a QP. softroce implements RC, UC and UD.
type QPType = qpstate.Type

// QP types.
const (
	QPTypeRC = qpstate.RC
	QPTypeUC = qpstate.UC
	QPTypeUD = qpstate.UD
)

// QPInitAttr are the creation attributes (struct ibv_qp_init_attr).
type QPInitAttr struct {
	Type   QPType
	SendCQ *CQ
	RecvCQ *CQ
	Cap    QPCap
	// SQSigAll makes every send WR generate a completion.
	SQSigAll bool
	// SRQ, if set, is the shared receive queue the QP takes its receive
	// WQEs from (it must be of the same PD); Cap.MaxRecvWR and MaxRecvSGE
	// are then ignored and QP.PostRecv is refused.
	SRQ *SRQ
}

// QP is a queue pair.
type QP struct {
	pd   *PD
	rc   *engine.QP
	init QPInitAttr

	// mu guards attr, remotePort and adaptive. It is taken before the
	// engine lock.
	mu         sync.Mutex
	attr       QPAttr
	remotePort uint16
	adaptive   bool        // engine.Path.AdaptiveTimeout
	destroyed  atomic.Bool // set by Destroy under the device's mu

	// estMu guards estCh and estDone; a leaf lock, taken under the
	// engine lock.
	estMu   sync.Mutex
	estCh   chan struct{}
	estDone bool
}

// Established is closed when the QP receives the first packet from its
// peer since it entered RTR, in RTR (where EventCommEst is raised too) or
// already in RTS: a connection manager waiting for an RTU learns from it
// that the connection works. Moving the QP to RTR again (after RESET)
// gives a new channel.
func (qp *QP) Established() <-chan struct{} {
	qp.estMu.Lock()
	defer qp.estMu.Unlock()
	if qp.estCh == nil {
		qp.estCh = make(chan struct{})
		if qp.estDone {
			close(qp.estCh)
		}
	}
	return qp.estCh
}

func (qp *QP) notifyEst() {
	qp.estMu.Lock()
	defer qp.estMu.Unlock()
	if qp.estDone {
		return
	}
	qp.estDone = true
	if qp.estCh != nil {
		close(qp.estCh)
	}
}

// rearmEst is entering RTR: the next packet is a first one again.
func (qp *QP) rearmEst() {
	qp.estMu.Lock()
	defer qp.estMu.Unlock()
	if qp.estDone {
		qp.estDone, qp.estCh = false, nil
	}
}

// CreateQP creates a QP in RESET (ibv_create_qp). RC, UC and UD are
// implemented (a UC QP carries SEND and RDMA WRITE, with PSN checks and
// no acknowledgements: see transport/uc); zero capacities get defaults
// (128 WRs, 1 SGE). Both CQs must be live CQs of the PD's device; at most
// max_qp QPs exist at once. A failed CreateQP creates nothing.
func (pd *PD) CreateQP(init QPInitAttr) (*QP, error) { return pd.createQP(init, false) }

// createQP creates a QP, or with gsi the device's QP1.
func (pd *PD) createQP(init QPInitAttr, gsi bool) (*QP, error) {
	d := pd.d
	if err := d.unusable("create QP"); err != nil {
		return nil, err
	}
	if init.Type != QPTypeRC && init.Type != QPTypeUC && init.Type != QPTypeUD {
		return nil, fmt.Errorf("verbs: QP type %v is not implemented; softroce supports RC, UC and UD", init.Type)
	}
	c := &init.Cap
	if c.MaxSendWR == 0 {
		c.MaxSendWR = 128
	}
	if c.MaxRecvWR == 0 {
		c.MaxRecvWR = 128
	}
	if c.MaxSendSGE == 0 {
		c.MaxSendSGE = 1
	}
	if c.MaxRecvSGE == 0 {
		c.MaxRecvSGE = 1
	}
	switch {
	case c.MaxSendWR < 0 || c.MaxRecvWR < 0 || c.MaxSendSGE < 0 || c.MaxRecvSGE < 0 || c.MaxInlineData < 0:
		return nil, fmt.Errorf("verbs: negative QP capacity %+v", *c)
	case c.MaxSendWR > MaxQPWR || c.MaxRecvWR > MaxQPWR:
		return nil, fmt.Errorf("verbs: max_send_wr %d / max_recv_wr %d exceed the device limit max_qp_wr %d", c.MaxSendWR, c.MaxRecvWR, MaxQPWR)
	case c.MaxSendSGE > MaxSGE || c.MaxRecvSGE > MaxSGE:
		return nil, fmt.Errorf("verbs: max_send_sge %d / max_recv_sge %d exceed the device limit max_sge %d", c.MaxSendSGE, c.MaxRecvSGE, MaxSGE)
	case c.MaxInlineData > MaxInline:
		return nil, fmt.Errorf("verbs: max_inline_data %d exceeds the device limit %d", c.MaxInlineData, MaxInline)
	case init.SendCQ == nil || init.RecvCQ == nil:
		return nil, fmt.Errorf("verbs: CreateQP needs a send CQ and a receive CQ")
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if pd.dead {
		return nil, fmt.Errorf("verbs: create QP: PD %d is deallocated", pd.pd.Handle())
	}
	for _, q := range [2]struct {
		name string
		cq   *CQ
	}{{"send", init.SendCQ}, {"receive", init.RecvCQ}} {
		if _, ok := d.cqs[q.cq]; !ok {
			return nil, fmt.Errorf("verbs: create QP: the %s CQ is not a CQ of device %s (destroyed, or not made by its CreateCQ)", q.name, d.name)
		}
	}
	if s := init.SRQ; s != nil && (s.pd != pd || s.destroyed.Load()) {
		return nil, fmt.Errorf("verbs: create QP: SRQ %d is destroyed or not of this PD", s.Num())
	}
	if len(d.qps) >= d.maxQP {
		return nil, fmt.Errorf("verbs: create QP: device %s already has max_qp %d QPs", d.name, d.maxQP)
	}
	// Everything that can fail has been checked: from here on the QP is
	// created and accounted for.
	cfg := engine.QPConfig{Type: init.Type, PD: pd.pd, SendCQ: init.SendCQ, RecvCQ: init.RecvCQ,
		MaxSendWR: c.MaxSendWR, MaxRecvWR: c.MaxRecvWR, MaxSendSGE: c.MaxSendSGE, MaxRecvSGE: c.MaxRecvSGE, MaxInline: c.MaxInlineData}
	if init.SRQ != nil {
		cfg.SRQ = init.SRQ.rc
	}
	var q *engine.QP
	var err error
	if gsi {
		q, err = ud.CreateGSI(pd.d.eng, cfg)
		if errors.Is(err, engine.ErrQPNumInUse) {
			return nil, &busyError{fmt.Sprintf("verbs: create GSI QP: device %s already has QP1", d.name)}
		}
	} else {
		q, err = pd.d.eng.CreateQP(cfg)
	}
	if err != nil {
		return nil, err
	}
	if d.cc != nil && init.Type == QPTypeRC {
		// Valid parameters on an RC QP: SetCC cannot fail.
		_ = q.SetCC(d.cc)
	}
	qp := &QP{pd: pd, rc: q, init: init}
	qp.attr.Cap = *c
	d.eng.SignalAllFor(q, init.SQSigAll)
	d.qps[q.Num()] = qp
	d.estQPs.Store(q.Num(), qp)
	pd.nQP++
	d.cqs[init.SendCQ]++
	d.cqs[init.RecvCQ]++
	return qp, nil
}

// Num is the QP number (qp_num).
func (qp *QP) Num() uint32 { return qp.rc.Num() }

// State is the current state, as the transport sees it (it may have moved
// to ERR on its own after a fatal error).
func (qp *QP) State() QPState { return qp.rc.State() }

// QPStats are a QP's transport counters, in the spirit of rxe's hw
// counters.
type QPStats = engine.QPStats

// Stats returns a snapshot of the QP's counters.
func (qp *QP) Stats() QPStats { return qp.rc.Stats() }

// PSNs returns the live send and receive PSNs: the PSN of the next new
// request packet and the PSN the responder expects next.
func (qp *QP) PSNs() (sq, rq uint32) { return qp.rc.PSNs() }

// Modify changes attributes and state (ibv_modify_qp). It validates the
// transition and attribute mask as libibverbs does, returning a
// *qpstate.TransitionError naming the state, transition and attribute, then
// the device's limits (sgid_index, path MTU against the port's active MTU,
// max_rd_atomic and max_dest_rd_atomic, port number, pkey_index), returning
// an error naming the attribute and the limit. Only then does it apply
// anything: a failed Modify leaves the QP exactly as it was.
func (qp *QP) Modify(attr *QPAttr, mask AttrMask) error {
	if err := qp.usable("modify QP"); err != nil {
		return err
	}
	qp.mu.Lock()
	defer qp.mu.Unlock()
	// Validated and applied under the engine lock: the transport may move
	// the QP to ERR at any time.
	return qp.rc.Modify(func(cur QPState) (engine.Path, QPState, error) {
		next, err := qp.validate(cur, attr, mask)
		if err != nil {
			return engine.Path{}, cur, err
		}
		qp.apply(attr, mask, next)
		if next == StateRTR && cur != StateRTR {
			qp.rearmEst()
		}
		return qp.path(), next, nil
	})
}

// apply copies the attributes mask selects into qp.attr and sets the
// state; the caller holds qp.mu.
func (qp *QP) apply(attr *QPAttr, mask AttrMask, next QPState) {
	a := qp.attr
	copyIf := func(bit AttrMask, f func()) {
		if mask&bit != 0 {
			f()
		}
	}
	copyIf(qpstate.AttrAccessFlags, func() { a.AccessFlags = attr.AccessFlags })
	copyIf(qpstate.AttrAV, func() { a.AV = attr.AV })
	copyIf(qpstate.AttrPathMTU, func() { a.PathMTU = attr.PathMTU })
	copyIf(qpstate.AttrPKeyIndex, func() { a.PKeyIndex = attr.PKeyIndex })
	copyIf(qpstate.AttrPort, func() { a.Port = attr.Port })
	copyIf(qpstate.AttrTimeout, func() { a.Timeout = attr.Timeout })
	copyIf(qpstate.AttrRetryCnt, func() { a.RetryCnt = attr.RetryCnt })
	copyIf(qpstate.AttrRNRRetry, func() { a.RNRRetry = attr.RNRRetry })
	copyIf(qpstate.AttrRQPSN, func() { a.RQPSN = attr.RQPSN })
	copyIf(qpstate.AttrSQPSN, func() { a.SQPSN = attr.SQPSN })
	copyIf(qpstate.AttrMaxQPRDAtomic, func() { a.MaxRDAtomic = attr.MaxRDAtomic })
	copyIf(qpstate.AttrMaxDestRDAtomic, func() { a.MaxDestRDAtomic = attr.MaxDestRDAtomic })
	copyIf(qpstate.AttrMinRNRTimer, func() { a.MinRNRTimer = attr.MinRNRTimer })
	copyIf(qpstate.AttrDestQPN, func() { a.DestQPN = attr.DestQPN })
	copyIf(qpstate.AttrQKey, func() { a.QKey = attr.QKey })
	a.State = next
	qp.attr = a
}

// validate checks a Modify from state cur without changing anything and
// returns the state it leads to.
func (qp *QP) validate(cur QPState, attr *QPAttr, mask AttrMask) (QPState, error) {
	next, err := qpstate.Modify(qp.init.Type, cur, mask, attr)
	if err != nil {
		return cur, err
	}
	d := qp.pd.d
	n := qp.Num()
	switch {
	case mask&qpstate.AttrAV != 0 && int(attr.AV.SGIDIndex) >= len(d.gids):
		return cur, fmt.Errorf("verbs: modify QP %d: sgid_index %d out of range (GID table has %d entries)", n, attr.AV.SGIDIndex, len(d.gids))
	case mask&qpstate.AttrPathMTU != 0 && attr.PathMTU > d.QueryPort().ActiveMTU:
		return cur, fmt.Errorf("verbs: modify QP %d: path MTU %d exceeds the port's active MTU %d (link MTU %d)", n, attr.PathMTU, d.QueryPort().ActiveMTU, d.link.MTU())
	case mask&qpstate.AttrMaxQPRDAtomic != 0 && int(attr.MaxRDAtomic) > MaxQPRDAtom:
		return cur, fmt.Errorf("verbs: modify QP %d: max_rd_atomic %d above the device limit max_qp_rd_atom %d", n, attr.MaxRDAtomic, MaxQPRDAtom)
	case mask&qpstate.AttrMaxDestRDAtomic != 0 && int(attr.MaxDestRDAtomic) > MaxQPRDAtom:
		return cur, fmt.Errorf("verbs: modify QP %d: max_dest_rd_atomic %d above the device limit max_qp_init_rd_atom %d", n, attr.MaxDestRDAtomic, MaxQPRDAtom)
	case mask&qpstate.AttrPort != 0 && attr.Port != 1:
		return cur, fmt.Errorf("verbs: modify QP %d: port %d does not exist (the device has port 1 only)", n, attr.Port)
	case mask&qpstate.AttrPKeyIndex != 0 && attr.PKeyIndex != 0:
		return cur, fmt.Errorf("verbs: modify QP %d: pkey_index %d out of range (the P_Key table has 1 entry)", n, attr.PKeyIndex)
	}
	return next, nil
}

// path converts the verbs attributes into the transport's path.
func (qp *QP) path() engine.Path {
	a := &qp.attr
	d := qp.pd.d
	var local netip.Addr
	if int(a.AV.SGIDIndex) < len(d.gids) {
		local = d.gids[a.AV.SGIDIndex].Addr
	}
	p := engine.Path{DestQPN: a.DestQPN, PMTU: a.PathMTU, RQPSN: a.RQPSN, SQPSN: a.SQPSN, Timeout: a.Timeout,
		RetryCnt: a.RetryCnt, RNRRetry: a.RNRRetry, MinRNRTimer: a.MinRNRTimer, MaxRDAtomic: int(a.MaxRDAtomic),
		MaxDestRDAtomic: int(a.MaxDestRDAtomic), Access: memreg.Access(a.AccessFlags), Local: local, QKey: a.QKey,
		AdaptiveTimeout: qp.adaptive, TrafficClass: a.AV.TrafficClass}
	// The address vector's traffic class is the packets' TOS; its hop
	// limit is not their TTL: Linux replaces a connected QP's hop limit
	// with the route's (ib_resolve_eth_dmac on modify-QP, for rxe and
	// every RoCE device), so the link's default TTL is what rxe sends.
	if p.PMTU == 0 {
		p.PMTU = 1024
	}
	if qp.init.Type == QPTypeUD {
		// A UD QP has no path MTU attribute: its messages may be as
		// long as the port's active MTU (rxe uses the port's MTU).
		p.PMTU = d.QueryPort().ActiveMTU
		if qp.remotePort != 0 {
			// No peer address, only the UDP port its datagrams go to.
			p.Remote = netip.AddrPortFrom(netip.IPv6Unspecified(), qp.remotePort)
		}
	}
	if a.AV.DGID != ([16]byte{}) {
		p.Remote = engine.Remote(GID(a.AV.DGID).Addr())
		if qp.remotePort != 0 {
			p.Remote = netip.AddrPortFrom(p.Remote.Addr(), qp.remotePort)
		}
	}
	return p
}

// Query returns the QP's attributes and creation attributes (ibv_query_qp).
func (qp *QP) Query() (QPAttr, QPInitAttr) {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	a := qp.attr
	a.State = qp.rc.State()
	a.CurState = a.State
	return a, qp.init
}

// PostSend posts a send work request (ibv_post_send).
func (qp *QP) PostSend(wr *SendWR) error {
	if err := qp.usable("post send"); err != nil {
		return err
	}
	return qp.rc.PostSend(wr)
}

// PostRecv posts a receive work request (ibv_post_recv).
func (qp *QP) PostRecv(wr *RecvWR) error {
	if err := qp.usable("post recv"); err != nil {
		return err
	}
	return qp.rc.PostRecv(wr)
}

// usable is nil when verb op may run on the QP: the device works and the
// QP is not destroyed.
func (qp *QP) usable(op string) error {
	if err := qp.pd.d.unusable(op); err != nil {
		return err
	}
	if qp.destroyed.Load() {
		return fmt.Errorf("verbs: %s: QP %d is destroyed", op, qp.Num())
	}
	return nil
}

// Destroy destroys the QP (ibv_destroy_qp): packets for it are dropped
// and nothing more is sent for it from then on, its outstanding work
// requests are not completed, and its PD and CQs are no longer counted as
// used by it. It fails on a QP already destroyed and after Device.Close.
func (qp *QP) Destroy() error {
	d := qp.pd.d
	if err := d.isClosed("destroy QP"); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	// The engine refuses a QP it no longer has (engine.ErrNoQP), so a second
	// Destroy fails there and the counts below are released once.
	if err := qp.pd.d.eng.DestroyQP(qp.rc); err != nil {
		return fmt.Errorf("verbs: destroy QP %d: %w", qp.Num(), err)
	}
	qp.destroyed.Store(true)
	delete(d.qps, qp.Num())
	d.estQPs.Delete(qp.Num())
	qp.pd.nQP--
	d.cqs[qp.init.SendCQ]--
	d.cqs[qp.init.RecvCQ]--
	return nil
}

// RemoteInfo is what two sides exchange out of band to connect RC QPs,
// the same facts ibv_rc_pingpong and perftest exchange.
type RemoteInfo struct {
	QPN uint32
	PSN uint32
	GID GID
}

// ConnectOptions tune Connect; zero fields take the ibv_rc_pingpong
// defaults (MTU 1024, timeout 14, retry 7, RNR retry 7, min RNR timer 12,
// 16 outstanding READ/atomics).
type ConnectOptions struct {
	PathMTU     int
	SQPSN       uint32 // our initial send PSN (what the peer got as our PSN)
	SGIDIndex   uint8
	Timeout     uint8
	RetryCnt    uint8
	RNRRetry    uint8
	MinRNRTimer uint8
	MaxRDAtomic uint8
	Access      Access // remote access the QP allows (default: write, read, atomic)
	// RemotePort is the peer's UDP port (0: 4791). Only a peer that is
	// not a standard RoCEv2 endpoint (a second softroce on the same
	// address) listens elsewhere.
	RemotePort uint16
	// AdaptiveTimeout lets the local ACK timeout follow the measured round
	// trip, never shorter than Timeout gives (see QP.SetAdaptiveTimeout).
	AdaptiveTimeout bool
	// CC is the QP's congestion control: the device's (Options.CC, the
	// zero value), none, or DCQCN (with the device's parameters, or
	// CCDefaults on a device without). RC QPs only.
	CC CCMode
}

// CCQPStats are a QP's congestion-control state and counters (QPStats.CC).
type CCQPStats = engine.CCQPStats

// CCMode chooses a QP's congestion control (ConnectOptions.CC).
type CCMode uint8

const (
	CCDevice CCMode = iota // as the device's Options.CC says
	CCNone                 // off: today's behaviour, whatever the device says
	CCDCQCN                // DCQCN (docs/congestion.md)
)

// String is the mode's name on the command line: "device", "none", "dcqcn".
func (m CCMode) String() string {
	switch m {
	case CCDevice:
		return "device"
	case CCNone:
		return "none"
	case CCDCQCN:
		return "dcqcn"
	}
	return fmt.Sprintf("CCMode(%d)", uint8(m))
}

// ParseCCMode reads "none" or "dcqcn" ("" and "device": CCDevice).
func ParseCCMode(s string) (CCMode, error) {
	switch s {
	case "", "device":
		return CCDevice, nil
	case "none", "off":
		return CCNone, nil
	case "dcqcn":
		return CCDCQCN, nil
	}
	return 0, fmt.Errorf("verbs: congestion control %q: want none or dcqcn", s)
}

// SetCC sets the QP's congestion control (ConnectOptions.CC does it on
// Connect). DCQCN is for RC QPs only; turning it on restarts the QP's
// rate at line rate.
func (qp *QP) SetCC(m CCMode) error {
	d := qp.pd.d
	var p *dcqcn.Params
	switch m {
	case CCDevice:
		p = d.cc
	case CCNone:
	case CCDCQCN:
		p = d.ccDefault
	default:
		return fmt.Errorf("verbs: QP %d: congestion control mode %d unknown", qp.Num(), m)
	}
	if p != nil && qp.init.Type != QPTypeRC {
		if m == CCDevice {
			return nil // the device's setting is for its RC QPs
		}
		return fmt.Errorf("verbs: QP %d: congestion control needs an RC QP (this is %v)", qp.Num(), qp.init.Type)
	}
	return qp.rc.SetCC(p)
}

// Init moves a RESET QP to INIT with pkey index 0, port 1 and the given
// remote access flags. Receives may be posted from INIT on.
func (qp *QP) Init(access Access) error {
	a := initAttr(access)
	return qp.Modify(&a, initMask)
}

const initMask = qpstate.AttrState | qpstate.AttrPKeyIndex | qpstate.AttrPort | qpstate.AttrAccessFlags

func initAttr(access Access) QPAttr {
	return QPAttr{State: StateInit, Port: 1, AccessFlags: uint32(access)}
}

// Connect moves a RESET or INIT QP through RTR to RTS against remote. It
// validates every step before taking the first, so attributes the device
// refuses (a path MTU above the port's, say) fail it with the QP unchanged.
// A UC QP takes only the attributes UC has (path, PSNs; no timeout,
// retries, RNR timer or READ/atomic depth), as ibv_uc_pingpong sets them,
// and allows remote write by default.
func (qp *QP) Connect(remote RemoteInfo, o *ConnectOptions) error {
	if o == nil {
		o = &ConnectOptions{}
	}
	def := func(v, d uint8) uint8 {
		if v == 0 {
			return d
		}
		return v
	}
	mtu := o.PathMTU
	if mtu == 0 {
		mtu = 1024
	}
	access := o.Access
	if access == 0 {
		access = AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic
		if qp.init.Type == QPTypeUC {
			access = AccessRemoteWrite
		}
	}
	type step struct {
		attr QPAttr
		mask AttrMask
	}
	var steps []step
	if qp.State() == StateReset {
		steps = append(steps, step{initAttr(access), initMask})
	}
	steps = append(steps,
		step{QPAttr{State: StateRTR, PathMTU: mtu, DestQPN: remote.QPN, RQPSN: remote.PSN,
			MaxDestRDAtomic: def(o.MaxRDAtomic, 16), MinRNRTimer: def(o.MinRNRTimer, 12),
			AV: AddressVector{DGID: remote.GID, SGIDIndex: o.SGIDIndex, HopLimit: 64}},
			qpstate.AttrState | qpstate.AttrAV | qpstate.AttrPathMTU | qpstate.AttrDestQPN | qpstate.AttrRQPSN |
				qpstate.AttrMaxDestRDAtomic | qpstate.AttrMinRNRTimer},
		step{QPAttr{State: StateRTS, SQPSN: o.SQPSN, Timeout: def(o.Timeout, 14), RetryCnt: def(o.RetryCnt, 7),
			RNRRetry: def(o.RNRRetry, 7), MaxRDAtomic: def(o.MaxRDAtomic, 16)},
			qpstate.AttrState | qpstate.AttrSQPSN | qpstate.AttrTimeout | qpstate.AttrRetryCnt |
				qpstate.AttrRNRRetry | qpstate.AttrMaxQPRDAtomic})
	if qp.init.Type == QPTypeUC {
		// UC: INIT->RTR takes AV, path MTU, dest QPN and RQ PSN; RTR->RTS
		// the SQ PSN only (IBTA §11.2.4.2; qpstate's UC masks).
		n := len(steps)
		steps[n-2].mask &^= qpstate.AttrMaxDestRDAtomic | qpstate.AttrMinRNRTimer
		steps[n-1].mask = qpstate.AttrState | qpstate.AttrSQPSN
	}
	s := qp.State()
	for i := range steps {
		next, err := qp.validate(s, &steps[i].attr, steps[i].mask)
		if err != nil {
			return err
		}
		s = next
	}
	if o.CC != CCDevice {
		if err := qp.SetCC(o.CC); err != nil {
			return err
		}
	}
	if o.AdaptiveTimeout {
		// Taken into the path by the Modify calls below.
		qp.mu.Lock()
		qp.adaptive = true
		qp.mu.Unlock()
	}
	for i := range steps {
		if err := qp.Modify(&steps[i].attr, steps[i].mask); err != nil {
			return err
		}
	}
	if o.RemotePort != 0 {
		qp.SetRemotePort(o.RemotePort)
	}
	return nil
}

// SetAdaptiveTimeout makes the RC requester's local ACK timeout follow the
// round trip it measures (an RFC 6298 estimate, Karn's rule), bounded below
// by the IBTA timeout of the Timeout attribute and above by one second or
// that timeout. Off by default: the IBTA timeout alone, as on RDMA NICs.
func (qp *QP) SetAdaptiveTimeout(on bool) {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	qp.adaptive = on
	qp.rc.SetPath(qp.path())
}

// SetRemotePort sends to the peer on a UDP port other than 4791.
func (qp *QP) SetRemotePort(port uint16) {
	qp.mu.Lock()
	defer qp.mu.Unlock()
	qp.remotePort = port
	qp.rc.SetPath(qp.path())
}
