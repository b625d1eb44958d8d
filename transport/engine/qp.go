package engine

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/memreg"
	"github.com/softroce/softroce/qpstate"
	"github.com/softroce/softroce/wr"
)

// QPConfig is fixed at creation.
type QPConfig struct {
	// Type is the transport service: qpstate.RC (the zero value), UC or UD.
	// The engine hosts all three; what differs per service is the
	// requester's, responder's and completer's rules.
	Type       qpstate.Type
	PD         *memreg.PD
	SendCQ     *cq.CQ
	RecvCQ     *cq.CQ
	MaxSendWR  int
	MaxRecvWR  int
	MaxSendSGE int // SGEs per send WR (max_send_sge; 0 means 1)
	MaxRecvSGE int // SGEs per receive WR (max_recv_sge; 0 means 1)
	MaxInline  int
	// SRQ, if set, is where the QP takes its receive WQEs from; MaxRecvWR
	// and MaxRecvSGE are then ignored and PostRecv is refused.
	SRQ *SRQ
}

// Path holds the attributes set by modify-QP to RTR and RTS.
type Path struct {
	Remote          netip.AddrPort // peer IP and UDP port (4791)
	Local           netip.Addr     // our source IP (zero: the link's default)
	DestQPN         uint32
	PMTU            int // bytes: 256..4096
	RQPSN           uint32
	SQPSN           uint32
	Timeout         uint8 // local ACK timeout: 4.096 us * 2^Timeout, 0 = infinite
	RetryCnt        uint8
	RNRRetry        uint8 // 7 = infinite (IBTA)
	MinRNRTimer     uint8
	MaxRDAtomic     int
	MaxDestRDAtomic int
	Access          memreg.Access // remote access enabled on the QP (ibv_qp_attr.qp_access_flags)
	QKey            uint32        // UD: the QP's Q_Key (ibv_qp_attr.qkey)
	// HopLimit and TrafficClass are the IP TTL and TOS (IPv6 hop limit
	// and traffic class) of every packet of an RC or UC QP, requests and
	// responses (nic.Packet; HopLimit 0: the link's default). verbs sets
	// the address vector's traffic class and leaves HopLimit 0.
	HopLimit, TrafficClass uint8
	// AdaptiveTimeout makes the local ACK timeout follow the measured
	// round trip (RC requester), never shorter than Timeout gives.
	AdaptiveTimeout bool
}

// Errors returned by Post*.
var (
	ErrQueueFull = errors.New("engine: work queue full")
	ErrState     = errors.New("engine: QP state does not allow this")
)

type WQEState uint8

const (
	WQEQueued  WQEState = iota // posted, no PSN assigned yet
	WQEStarted                 // PSNs assigned, (re)transmitting
	WQEDone                    // completed; waiting to be retired in order
)

// sendWQE is a send-queue slot. Slots are preallocated so posting does not
// allocate: SGL and inline data are copied into fixed storage.
type SendWQE struct {
	WR       wr.SendWR
	SGL      []wr.SGE
	Inline   []byte
	IsInline bool
	Length   int
	State    WQEState
	FirstPSN uint32
	LastPSN  uint32
	NPSN     int
	ReadDone int       // READ: bytes of response received in order
	ReRead   int       // READ: response index the latest (re-)issued request starts at
	localSt  cq.Status // LOCAL_INV, BIND_MW: the status of its execution
	localErr string    // and why it failed
	// bindMW: the type 1 window a bind-MW verb's work request binds
	// (PostBindMW); nil for every other WQE.
	bindMW *memreg.MW
}

type RecvWQE struct {
	ID  uint64
	SGL []wr.SGE
	Len int
}

// QP is one RC queue pair's transport state.
type QP struct {
	e      *Engine
	svc    Service // the QP's transport service (service.go)
	num    uint32
	Config QPConfig
	Attr   Path
	state  qpstate.State
	// commEst: a packet from the peer arrived since the QP entered RTR
	// (OnCommEst was called for it).
	commEst bool

	// send queue ring: [sqHead, sqTail) occupied; sqSend is the next WQE
	// to transmit from (as an offset from sqHead), sqPkt the packet index
	// within it.
	SQ                        []SendWQE
	SQHead, SQTail, SQSendOff int
	SQCount                   int
	SQPkt                     int
	NextPSN                   uint32 // PSN for the next new WQE
	RDOutstanding             int    // READ and atomic WQEs started and not completed (a fence waits for them)
	// The service's timers, in the engine's timer set while armed: RC's
	// local ACK timeout and RNR wait; UC and UD arm none.
	RetryDeadline time.Time // zero: not armed
	RNRDeadline   time.Time // zero: not waiting
	// PaceDeadline is when the pacer lets the requester send again, with
	// congestion control on (cc.go); zero: not held.
	PaceDeadline time.Time
	// cc is the QP's congestion-control state, nil when it is off.
	cc *qpCC

	// receive queue ring (unused with an SRQ)
	rq recvRing

	// Msg is the message a connected responder has in progress
	// (connected.go).
	Msg Message

	// scheduling flags
	txPending bool // requester or responder may have packets to send
	sigAll    bool
	destroyed bool

	Counters QPStats
}

// QPStats are per-QP counters, in the spirit of rxe's hw counters.
type QPStats struct {
	TxPackets, RxPackets     uint64
	Retransmits              uint64 // packets sent again by go-back-N
	Timeouts                 uint64
	RNRNAKsRecv, RNRNAKsSent uint64
	SeqNAKsRecv, SeqNAKsSent uint64
	DupRequests              uint64
	OutOfSeqRequests         uint64
	Dropped                  uint64
	// CC is the QP's congestion-control state and counters (zero when it
	// is off).
	CC CCQPStats `json:"cc"`
}

// Num is the QP number.
func (qp *QP) Num() uint32 { return qp.num }

// State is the transport's view of the QP state (it moves to ERR on its
// own after a fatal error).
func (qp *QP) State() qpstate.State {
	qp.e.mu.Lock()
	defer qp.e.mu.Unlock()
	return qp.state
}

// Stats returns a snapshot of the QP's counters.
func (qp *QP) Stats() QPStats {
	qp.e.mu.Lock()
	defer qp.e.mu.Unlock()
	s := qp.Counters
	s.CC = qp.ccStats()
	return s
}

// PSNs returns the PSN the requester gives its next new packet (sq) and
// the one the responder expects next (rq), live values as rxe's query-QP
// reports them (rdma resource show qp: sq-psn, rq-psn). A service that
// does not sequence receives reports the RQ PSN it was given.
func (qp *QP) PSNs() (sq, rq uint32) {
	qp.e.mu.Lock()
	defer qp.e.mu.Unlock()
	rq = qp.Attr.RQPSN
	if r, ok := qp.svc.(interface{ ExpectedPSN() uint32 }); ok {
		rq = r.ExpectedPSN()
	}
	return qp.NextPSN, rq
}

// Modify is a modify-QP validated and applied in one step: it calls check
// with the QP's current state under the engine lock and, unless check
// returns an error, sets the path and moves to the state check returns
// (as SetPath then SetState). Without it, a QP the transport moved to ERR
// between a caller's validation and its apply would be modified from a
// state it was not validated against. check must not call into the
// engine.
func (qp *QP) Modify(check func(cur qpstate.State) (Path, qpstate.State, error)) error {
	qp.e.mu.Lock()
	defer qp.e.mu.Unlock()
	p, next, err := check(qp.state)
	if err != nil {
		return err
	}
	qp.setPathLocked(p)
	qp.setStateLocked(next)
	return nil
}

// Path returns the current path attributes.
func (qp *QP) Path() Path { return qp.Attr }

// SetPath installs attributes validated by qpstate.Modify. It is called
// for INIT->RTR (responder side) and RTR->RTS (requester side).
func (qp *QP) SetPath(p Path) {
	qp.e.mu.Lock()
	defer qp.e.mu.Unlock()
	qp.setPathLocked(p)
}

func (qp *QP) setPathLocked(p Path) {
	if qp.destroyed {
		return
	}
	qp.Attr = p
	if p.MaxDestRDAtomic < 1 {
		qp.Attr.MaxDestRDAtomic = 1
	}
	if p.MaxRDAtomic < 1 {
		qp.Attr.MaxRDAtomic = 1
	}
	qp.svc.PathChanged()
}

// SetState moves the transport to s (already validated by qpstate).
// Entering RTR arms the responder at RQPSN; entering RTS starts the
// requester at SQPSN; entering ERR flushes both queues (IBTA §10.3.1).
func (qp *QP) SetState(s qpstate.State) {
	qp.e.mu.Lock()
	defer qp.e.mu.Unlock()
	qp.setStateLocked(s)
}

func (qp *QP) setStateLocked(s qpstate.State) {
	if qp.destroyed {
		return
	}
	prev := qp.state
	qp.state = s
	switch s {
	case qpstate.Reset:
		qp.stopSending(true)
		qp.reset()
	case qpstate.RTR:
		if prev != qpstate.RTR {
			qp.commEst = false
			qp.svc.EnterRTR()
		}
	case qpstate.RTS:
		if prev == qpstate.RTR {
			qp.NextPSN = qp.Attr.SQPSN & bth.PSNMask
			qp.svc.EnterRTS()
		}
		qp.Kick()
	case qpstate.Err:
		if prev != qpstate.Err {
			qp.stopSending(true)
		}
		qp.flush()
		if prev != qpstate.Err {
			qp.lastWQE()
		}
	}
}

// lastWQE reports, once per entry into ERR, that a QP on an SRQ will take
// no more WQEs from it (IBTA §10.2.9, the Last WQE Reached affiliated
// event, IBV_EVENT_QP_LAST_WQE_REACHED): the WQE it held, if any, has
// just been flushed.
func (qp *QP) lastWQE() {
	if qp.Config.SRQ != nil && qp.e.OnLastWQE != nil {
		qp.e.OnLastWQE(qp.num)
	}
}

// stopSending silences the QP at once, on entering ERR or RESET and on
// destroy: the service drops what it has queued (RC: READ responses, the
// request backlog and a pending ACK), the timers are disarmed, and the packets
// it built that Progress has not handed out yet are taken back (if purge;
// responderToError keeps them).
func (qp *QP) stopSending(purge bool) {
	qp.svc.Stop()
	qp.RetryDeadline, qp.RNRDeadline, qp.PaceDeadline = time.Time{}, time.Time{}, time.Time{}
	qp.UpdateTimerSet()
	if purge {
		qp.e.purge(qp)
	}
}

// canSend reports whether the QP may put packets on the wire: only in
// RTR (responder), RTS and SQD, never in ERR, RESET or once destroyed.
func (qp *QP) CanSend() bool {
	return !qp.destroyed && (qp.state == qpstate.RTR || qp.state == qpstate.RTS || qp.state == qpstate.SQD)
}

func (qp *QP) reset() {
	qp.SQHead, qp.SQTail, qp.SQSendOff, qp.SQCount, qp.SQPkt = 0, 0, 0, 0, 0
	qp.rq.reset()
	qp.RDOutstanding = 0
	qp.RetryDeadline, qp.RNRDeadline = time.Time{}, time.Time{}
	qp.Msg = Message{}
	qp.svc.Reset()
}

// flush completes every outstanding work request with WR_FLUSH_ERR. Error
// completions are generated even for unsignaled WRs (IBA 10.7.3.1).
func (qp *QP) flush() {
	for qp.SQCount > 0 {
		w := &qp.SQ[qp.SQHead]
		if w.State != WQEDone {
			qp.PushSendWC(w, cq.WRFlushErr, 0)
		}
		qp.RetireHead()
	}
	qp.SQSendOff, qp.SQPkt = 0, 0
	qp.RDOutstanding = 0
	// A receive WQE that a multi-packet SEND (or WRITE with immediate) has
	// already taken is the oldest outstanding one: it is flushed first.
	if qp.Msg.HasRecv {
		qp.Config.RecvCQ.Push(cq.WC{WRID: qp.Msg.RecvID, Status: cq.WRFlushErr, Opcode: cq.OpRecv, QPNum: qp.num})
		qp.Msg.HasRecv = false
	}
	// The WQEs of an SRQ belong to the SRQ, not to the QP: they stay for
	// its other QPs (IBTA §10.2.9).
	for qp.rq.count > 0 {
		r := qp.rq.pop()
		qp.Config.RecvCQ.Push(cq.WC{WRID: r.ID, Status: cq.WRFlushErr, Opcode: cq.OpRecv, QPNum: qp.num})
	}
	qp.Msg = Message{RecvSGL: qp.Msg.RecvSGL}
	qp.RetryDeadline, qp.RNRDeadline = time.Time{}, time.Time{}
	qp.UpdateTimerSet()
}

// CompleteHead completes the oldest WQE with status st (orig: an
// atomic's original value) and retires it. It reports false when the
// send CQ overran: that is fatal to the QP, as on the receive side (rxe:
// the completer moves the QP to ERR), which is in ERR now.
func (qp *QP) CompleteHead(st cq.Status, orig uint64) bool {
	w := &qp.SQ[qp.SQHead]
	ok := qp.PushSendWC(w, st, orig)
	w.State = WQEDone
	qp.RetireHead()
	if !ok {
		qp.ToError("send CQ overrun")
		return false
	}
	return true
}

func (qp *QP) RetireHead() {
	qp.SQ[qp.SQHead].State = WQEQueued
	qp.SQHead = (qp.SQHead + 1) % len(qp.SQ)
	qp.SQCount--
	if qp.SQSendOff > 0 {
		qp.SQSendOff--
	} else {
		qp.SQPkt = 0
	}
}

// toError moves the QP to ERR after a fatal completion, a local error or a
// CQ overrun, and tells the owner through the engine's async hook. The QP
// stops sending at once: what it built and Progress has not handed out is
// dropped too.
func (qp *QP) ToError(reason string) {
	if qp.state == qpstate.Err || qp.destroyed {
		return
	}
	qp.state = qpstate.Err
	// UC keeps what it built (its PurgeOnError).
	qp.stopSending(qp.svc.PurgeOnError())
	qp.flush()
	if qp.e.OnAsyncError != nil {
		qp.e.OnAsyncError(qp.num, reason)
	}
	qp.lastWQE()
}

// responderToError is toError for an error the responder detects while
// executing requests in order: the answers it already built for earlier
// requests (ACKs, READ responses, atomic ACKs) and its fatal NAK, if any,
// precede the error on the wire as with rxe, so they are kept; nothing
// else is built from now on.
func (qp *QP) ResponderToError(reason string) {
	if qp.state == qpstate.Err || qp.destroyed {
		return
	}
	qp.state = qpstate.Err
	qp.stopSending(false)
	qp.flush()
	if qp.e.OnAsyncError != nil {
		qp.e.OnAsyncError(qp.num, reason)
	}
	qp.lastWQE()
}

// PostSend queues a send work request. It checks what can be checked at
// post time (queue depth, SGE count, inline size, opcode); protection
// problems with lkeys surface as completions, as with hardware.
func (qp *QP) PostSend(swr *wr.SendWR) error {
	if swr.Opcode == wr.BindMW {
		if t, ok := qp.e.mrs.WindowType(swr.Bind.MWKey); ok && t == memreg.MWType1 {
			// IBTA vol. 1 §10.6.7.2.1: only the bind-MW verb binds a
			// type 1 window (PostBindMW).
			return fmt.Errorf("engine: BIND_MW work request for type 1 window %#08x: type 1 windows are bound by the bind-MW verb", swr.Bind.MWKey)
		}
	}
	return qp.postSend(swr, nil)
}

// PostBindMW posts the work request of the bind-MW verb (ibv_bind_mw) that
// binds type 1 window mw: swr is a BIND_MW work request whose Bind.RKey is
// the window's new key (chosen by the caller, as the verb returns it at
// once); Bind.MWKey is not used. It runs in order with the send queue's
// other work requests and completes as a BIND_MW one: a failed bind
// completes with MW_BIND_ERR and moves the QP to ERR.
func (qp *QP) PostBindMW(swr *wr.SendWR, mw *memreg.MW) error {
	if swr.Opcode != wr.BindMW || mw == nil || mw.Type() != memreg.MWType1 {
		return fmt.Errorf("engine: bind MW verb: needs a BIND_MW work request and a type 1 window")
	}
	return qp.postSend(swr, mw)
}

func (qp *QP) postSend(swr *wr.SendWR, bindMW *memreg.MW) error {
	e := qp.e
	e.mu.Lock()
	ring, err := qp.postSendLocked(swr, bindMW)
	doorbell := e.Doorbell
	e.mu.Unlock()
	if ring {
		doorbell()
	}
	return err
}

// postSendLocked queues swr; ring reports that the caller must call the
// engine's Doorbell (after unlocking), because the WR went to an idle send
// queue and the wake-up it would have caused was held back for it.
func (qp *QP) postSendLocked(swr *wr.SendWR, bindMW *memreg.MW) (ring bool, _ error) {
	e := qp.e
	if qp.destroyed {
		return false, fmt.Errorf("%w: post send on destroyed QP %d", ErrState, qp.num)
	}
	if qp.state != qpstate.RTS && qp.state != qpstate.SQD {
		if qp.state != qpstate.Err {
			return false, fmt.Errorf("%w: post send on QP %d in state %v (needs RTS)", ErrState, qp.num, qp.state)
		}
	}
	if qp.SQCount == len(qp.SQ) {
		return false, fmt.Errorf("%w: send queue of QP %d holds %d WRs (max_send_wr)", ErrQueueFull, qp.num, len(qp.SQ))
	}
	if len(swr.SGL) > qp.Config.MaxSendSGE {
		return false, fmt.Errorf("engine: send WR has %d SGEs, QP %d allows %d (max_send_sge)", len(swr.SGL), qp.num, qp.Config.MaxSendSGE)
	}
	if !swr.Opcode.Known() {
		return false, fmt.Errorf("engine: opcode %v is not supported on an RC QP", swr.Opcode)
	}
	// The service checks the slot's copy: the caller's WR, passed on
	// through an interface, would escape to the heap.
	w := &qp.SQ[qp.SQTail]
	w.WR = *swr
	if err := qp.svc.CheckPost(&w.WR); err != nil {
		w.WR = wr.SendWR{}
		return false, err
	}
	length := 0
	for _, s := range swr.SGL {
		length += int(s.Length)
	}
	switch {
	case swr.Opcode.IsAtomic():
		if len(swr.SGL) != 1 || swr.SGL[0].Length != 8 {
			return false, fmt.Errorf("engine: %v needs exactly one 8-byte SGE for the original value", swr.Opcode)
		}
		if swr.RemoteAddr&7 != 0 {
			return false, fmt.Errorf("engine: %v remote address 0x%x is not 8-byte aligned", swr.Opcode, swr.RemoteAddr)
		}
	case swr.Opcode == wr.AtomicWrite:
		length = 8
	case length > 1<<31:
		return false, fmt.Errorf("engine: message of %d bytes exceeds the 2 GiB RC limit", length)
	}
	w.SGL = append(w.SGL[:0], swr.SGL...)
	w.WR.SGL = nil
	w.IsInline = false
	if swr.Opcode.IsLocal() {
		length = 0
	}
	if swr.Flags&wr.Inline != 0 && !swr.Opcode.IsAtomic() && swr.Opcode != wr.RDMARead && swr.Opcode != wr.AtomicWrite && !swr.Opcode.IsLocal() {
		// Inline data is copied now, so the caller may reuse its buffer as
		// soon as PostSend returns (ibv_post_send semantics). It comes from
		// InlineData, or else from the SGL, read through the lkeys.
		if swr.InlineData != nil {
			length = len(swr.InlineData)
		}
		if length > qp.Config.MaxInline {
			return false, fmt.Errorf("engine: inline WR of %d bytes exceeds max_inline_data %d", length, qp.Config.MaxInline)
		}
		if cap(w.Inline) < length {
			w.Inline = make([]byte, qp.Config.MaxInline)
		}
		w.Inline = w.Inline[:length]
		if swr.InlineData != nil {
			copy(w.Inline, swr.InlineData)
		} else if err := Gather(e.mrs, qp.Config.PD, w.SGL, 0, w.Inline); err != nil {
			return false, fmt.Errorf("engine: inline data: %w", err)
		}
		w.IsInline = true
	}
	w.WR.InlineData = nil
	w.bindMW = bindMW
	w.Length = length
	w.State = WQEQueued
	w.ReadDone = 0
	// A WR on an idle send queue is sent by the poster itself once the
	// lock is released (the driver's Doorbell), as a doorbell write starts
	// an RDMA NIC: handing it to another goroutine would cost a wake-up
	// and a switch on every round trip of a ping-pong. WRs posted behind
	// outstanding work are left to the driver, which batches them.
	ring = e.Doorbell != nil && qp.SQCount == 0 && qp.state != qpstate.Err && (e.DoorbellOK == nil || e.DoorbellOK())
	if ring {
		e.doorbells++
	}
	qp.SQTail = (qp.SQTail + 1) % len(qp.SQ)
	qp.SQCount++
	qp.Kick()
	if qp.state == qpstate.Err {
		// Posting to a QP in ERR completes with a flush error at once.
		qp.flush()
	}
	return ring, nil
}

// PostRecv queues a receive work request.
func (qp *QP) PostRecv(rwr *wr.RecvWR) error {
	e := qp.e
	e.mu.Lock()
	defer e.mu.Unlock()
	if qp.destroyed {
		return fmt.Errorf("%w: post recv on destroyed QP %d", ErrState, qp.num)
	}
	if qp.Config.SRQ != nil {
		return fmt.Errorf("%w: QP %d takes its receives from SRQ %d: post them to the SRQ", ErrState, qp.num, qp.Config.SRQ.num)
	}
	if qp.state == qpstate.Reset {
		return fmt.Errorf("%w: post recv on QP %d in RESET", ErrState, qp.num)
	}
	if qp.rq.full() {
		return fmt.Errorf("%w: receive queue of QP %d holds %d WRs (max_recv_wr)", ErrQueueFull, qp.num, len(qp.rq.wqes))
	}
	if len(rwr.SGL) > qp.Config.MaxRecvSGE {
		return fmt.Errorf("engine: recv WR has %d SGEs, QP %d allows %d (max_recv_sge)", len(rwr.SGL), qp.num, qp.Config.MaxRecvSGE)
	}
	qp.rq.push(rwr)
	if qp.state == qpstate.Err {
		qp.flush()
	}
	return nil
}

// kick marks the QP as having work for the next Progress.
func (qp *QP) Kick() {
	if !qp.txPending && !qp.destroyed {
		qp.txPending = true
		qp.e.pending = append(qp.e.pending, qp)
		if qp.e.Wake != nil {
			qp.e.Wake()
		}
	}
}

// pushSendWC delivers a send completion; false when the send CQ overran
// (the CQ raises IBV_EVENT_CQ_ERR itself), which the caller must treat as
// fatal for the QP, as the receive side does.
func (qp *QP) PushSendWC(w *SendWQE, st cq.Status, orig uint64) bool {
	if st == cq.Success && w.WR.Flags&wr.Signaled == 0 && !qp.sigAll {
		return true
	}
	wc := cq.WC{WRID: w.WR.ID, Status: st, Opcode: wcOpcode(w.WR.Opcode), QPNum: qp.num}
	if st == cq.Success {
		switch {
		case w.WR.Opcode == wr.RDMARead:
			wc.ByteLen = uint32(w.Length)
		case w.WR.Opcode.IsAtomic():
			wc.ByteLen = 8 // the original value written to the local buffer
		}
	}
	return qp.Config.SendCQ.Push(wc)
}

func wcOpcode(o wr.Opcode) cq.Opcode {
	switch {
	case o.IsSend():
		return cq.OpSend
	case o.IsWrite():
		return cq.OpRDMAWrite
	case o == wr.RDMARead:
		return cq.OpRDMARead
	case o == wr.AtomicCmpAndSwp:
		return cq.OpCompSwap
	case o == wr.AtomicFetchAndAdd:
		return cq.OpFetchAdd
	case o == wr.AtomicWrite:
		return cq.OpAtomicWrite
	case o == wr.BindMW:
		return cq.OpBindMW
	case o == wr.LocalInv:
		return cq.OpLocalInv
	}
	return cq.OpSend
}

// noteCommEst raises OnCommEst for the first packet from the peer since
// the QP entered RTR; the caller holds the engine lock.
func (qp *QP) noteCommEst() {
	if qp.commEst {
		return
	}
	qp.commEst = true
	if qp.e.OnCommEst != nil {
		qp.e.OnCommEst(qp.num, qp.state == qpstate.RTR)
	}
}
