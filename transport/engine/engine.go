package engine

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/cc/dcqcn"
	"github.com/softroce/softroce/memreg"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/qpstate"
	"github.com/softroce/softroce/wr"
)

// MaxPacket is the largest RoCE packet the engine builds: a 4096-byte
// PMTU payload plus the longest RC header set, pad and ICRC.
const MaxPacket = 4096 + 64

// Engine is the transport of one device: its QPs, and the packets they
// exchange. One mutex guards it all; there is no goroutine per QP. It is
// safe for concurrent use: Post* from any goroutine, Receive and Progress
// from the driver.
type Engine struct {
	mu      sync.Mutex
	mrs     *memreg.Table
	qps     map[uint32]*QP
	pending []*QP
	timed   map[*QP]struct{}
	now     time.Time
	// sleepUntil is the deadline NextDeadline last reported: the time the
	// driver's timer is set for; paceOnly, that it is a pacer's alone.
	sleepUntil time.Time
	paceOnly   bool
	// paceDue is paceTimers' scratch list.
	paceDue []*QP

	// tx is the batch Progress returns next; txQP[i] is the QP that built
	// tx[i], so a QP that enters ERR or is destroyed can take back what it
	// built and has not yet handed out.
	tx   []nic.Packet
	txQP []*QP
	free [][]byte

	// MaxBatch is how many packets Progress returns at most per call.
	MaxBatch int
	// OnAsyncError is called (under the engine lock) when a QP enters ERR
	// because of a transport error, like IBV_EVENT_QP_FATAL.
	OnAsyncError func(qpn uint32, reason string)
	// OnLastWQE is called (under the engine lock) when a QP created on an
	// SRQ enters ERR, like IBV_EVENT_QP_LAST_WQE_REACHED.
	OnLastWQE func(qpn uint32)
	// OnCommEst is called (under the engine lock) when an RC or UC QP
	// takes the first packet from its peer since it entered RTR: the
	// connection works, whether or not the CM's RTU arrived (IBTA
	// §12.7.2). rtr says the QP is still in RTR, where IBTA §11.6.3 raises
	// IBV_EVENT_COMM_EST; a QP already in RTS learns it too, for a CM that
	// moved it there before its REP.
	OnCommEst func(qpn uint32, rtr bool)
	// Wake is called (under the engine lock, must not block) when posted
	// work is waiting for Progress.
	Wake func()
	// Doorbell, if set, is called without the lock by the goroutine that
	// posted a send WR to an idle send queue, after counting it in
	// doorbells (a Wake during that post is for the Doorbell to handle):
	// the driver sends it from there (Driver.doorbell).
	Doorbell func()
	// DoorbellOK, if set, is asked (under the engine lock) whether a post
	// may ring the Doorbell now.
	DoorbellOK func() bool
	// doorbells counts posts whose Doorbell call has not finished.
	doorbells int
	// onPacket, if set, sees every packet sent (dir 'T', when Progress
	// hands it out) and received (dir 'R'): see SetPacketTrace.
	onPacket func(dir byte, p *nic.Packet)

	stats   EngineStats
	srqNext uint32 // number of the last SRQ created

	// rx is the packet Receive is handling, a field rather than a local
	// because the services it goes to are called through an interface.
	rx bth.Packet
}

// EngineStats count what the engine dropped and why.
type EngineStats struct {
	RxPackets     uint64
	TxPackets     uint64
	RxMalformed   uint64 // failed bth.Parse
	RxUnknownQP   uint64 // no such QP, or QP not ready (IBTA: silently dropped)
	RxBadHeader   uint64 // TVer != 0, P_Key mismatch, not an RC opcode
	RxWrongSource uint64 // source IP does not match the QP's address vector
	// UD receives dropped (IBTA: silently), see ud.go.
	RxBadQKey   uint64 // DETH Q_Key is not the QP's (rxe's qkey violation counter)
	RxUDTooLong uint64 // payload + 40-byte GRH larger than the receive WQE
	RxUDNoRecv  uint64 // no receive WQE posted
	// CC counts congestion control's work (docs/congestion.md): CE-marked
	// packets received, CNPs sent, CNPs handled and ignored (for a QP
	// without congestion control, or within the rate-reduce period).
	CC dcqcn.Counters `json:"cc"`
}

// NewEngine returns an engine whose responders and requesters access
// memory through mrs.
func NewEngine(mrs *memreg.Table) *Engine {
	return &Engine{mrs: mrs, qps: map[uint32]*QP{}, timed: map[*QP]struct{}{}, MaxBatch: 64}
}

// CreateQP makes a QP (RC, UC or UD: cfg.Type) in RESET with a random 24-bit QP number (never
// 0 or 1, which IBTA reserves for SMI and GSI).
func (e *Engine) CreateQP(cfg QPConfig) (*QP, error) { return e.CreateQPNum(cfg, 0) }

// CreateQPNum makes a QP numbered num, or with a random number if num is
// 0; it fails with ErrQPNumInUse if that number is taken.
func (e *Engine) CreateQPNum(cfg QPConfig, num uint32) (*QP, error) {
	newSvc := serviceOf(cfg.Type)
	if newSvc == nil {
		return nil, fmt.Errorf("engine: QP type %v is not implemented", cfg.Type)
	}
	if cfg.SRQ != nil {
		cfg.MaxRecvWR, cfg.MaxRecvSGE = 0, 0 // the SRQ's WQEs are used
	} else if cfg.MaxRecvWR < 1 {
		return nil, fmt.Errorf("engine: max_recv_wr must be at least 1 (got %d)", cfg.MaxRecvWR)
	}
	if cfg.MaxSendWR < 1 {
		return nil, fmt.Errorf("engine: max_send_wr must be at least 1 (got %d)", cfg.MaxSendWR)
	}
	cfg.MaxSendSGE = max(cfg.MaxSendSGE, 1)
	cfg.MaxRecvSGE = max(cfg.MaxRecvSGE, 1)
	if cfg.SendCQ == nil || cfg.RecvCQ == nil || cfg.PD == nil {
		return nil, fmt.Errorf("engine: create QP needs a PD, a send CQ and a receive CQ")
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if s := cfg.SRQ; s != nil && (s.e != e || s.destroyed) {
		return nil, fmt.Errorf("%w: create QP on SRQ %d", ErrNoSRQ, s.num)
	}
	if num != 0 {
		if _, used := e.qps[num]; used {
			return nil, fmt.Errorf("%w: QP %d exists", ErrQPNumInUse, num)
		}
	}
	for num == 0 {
		var b [4]byte
		rand.Read(b[:])
		num = binary.LittleEndian.Uint32(b[:]) & bth.PSNMask
		if _, used := e.qps[num]; num <= 1 || used {
			num = 0
		}
	}
	qp := &QP{e: e, num: num, Config: cfg, state: qpstate.Reset}
	qp.SQ = make([]SendWQE, cfg.MaxSendWR)
	for i := range qp.SQ {
		qp.SQ[i].SGL = make([]wr.SGE, 0, cfg.MaxSendSGE)
	}
	if cfg.SRQ != nil {
		cfg.SRQ.nQP++
	} else {
		qp.rq = newRecvRing(cfg.MaxRecvWR, cfg.MaxRecvSGE)
	}
	qp.svc = newSvc(qp)
	qp.setPathLocked(Path{PMTU: 1024})
	e.qps[num] = qp
	return qp, nil
}

// ErrQPNumInUse is returned by CreateQPNum (and so CreateGSI) when the QP
// number is taken.
var ErrQPNumInUse = errors.New("engine: QP number in use")

// ErrNoQP is returned by DestroyQP for a QP that is not (or no longer)
// in the engine.
var ErrNoQP = errors.New("engine: no such QP (already destroyed?)")

// DestroyQP removes the QP and every trace of it: its number, timers, its
// place in the transmit schedule, queued READ responses, the request
// backlog and the packets it built that Progress has not handed out yet.
// Packets for it are dropped from now on and nothing more is sent for it.
// Outstanding work requests are not completed (ibv_destroy_qp). It fails
// with ErrNoQP for a QP already destroyed or of another engine.
func (e *Engine) DestroyQP(qp *QP) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if qp == nil || qp.e != e || qp.destroyed || e.qps[qp.num] != qp {
		return ErrNoQP
	}
	delete(e.qps, qp.num)
	if qp.Config.SRQ != nil {
		qp.Config.SRQ.nQP--
	}
	qp.destroyed = true
	qp.state = qpstate.Reset
	qp.stopSending(true)
	qp.svc.Destroy()
	for i := 0; i < len(e.pending); i++ {
		if e.pending[i] == qp {
			e.pending = append(e.pending[:i], e.pending[i+1:]...)
			i--
		}
	}
	qp.txPending = false
	return nil
}

// Holds reports where the engine still refers to qp: its timer set, its
// transmit schedule or batch (scheduled), its QP table (known). A
// destroyed QP is in none of them.
func (e *Engine) Holds(qp *QP) (timed, scheduled, known bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	_, timed = e.timed[qp]
	for _, p := range e.pending {
		scheduled = scheduled || p == qp
	}
	for _, p := range e.txQP {
		scheduled = scheduled || p == qp
	}
	_, known = e.qps[qp.num]
	return timed, scheduled, known
}

// QP finds a QP by number.
func (e *Engine) QP(num uint32) *QP {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.qps[num]
}

// Stats returns a snapshot of the engine's counters.
func (e *Engine) Stats() EngineStats {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.stats
}

// SetPacketTrace makes f see every packet the engine hands out (dir 'T')
// and receives (dir 'R'); nil stops tracing. f runs on the driver's
// goroutines under the engine lock: it must not block, call back into the
// engine, or keep the packet or its buffer.
func (e *Engine) SetPacketTrace(f func(dir byte, p *nic.Packet)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.onPacket = f
}

// Sync runs f under the engine lock, after everything the engine did before
// and before anything it does next: for callers that must order their own
// memory accesses (registered buffers the responder writes) with the
// transport's. f must not call back into the engine.
func (e *Engine) Sync(f func()) {
	e.mu.Lock()
	defer e.mu.Unlock()
	f()
}

func (e *Engine) getBuf() []byte {
	if n := len(e.free); n > 0 {
		b := e.free[n-1]
		e.free = e.free[:n-1]
		return b
	}
	return make([]byte, MaxPacket)
}

// newPacket appends a packet for qp to the transmit batch and returns its
// buffer for the caller to fill; the caller then calls qp.sent(n), or
// e.unbuild() to take it back.
func (qp *QP) NewPacket() []byte {
	e := qp.e
	e.tx = append(e.tx, nic.Packet{Buf: e.getBuf(), Remote: qp.Attr.Remote, Local: qp.Attr.Local, SrcPort: SrcPort(qp.num),
		HopLimit: qp.Attr.HopLimit, TClass: qp.txClass()})
	e.txQP = append(e.txQP, qp)
	return e.tx[len(e.tx)-1].Buf
}

// newPacketTo is newPacket for a packet with the addresses and IP fields
// of pk rather than the QP's path: a datagram's, from its address handle.
func (qp *QP) NewPacketTo(pk nic.Packet) []byte {
	e := qp.e
	pk.Buf = e.getBuf()
	e.tx = append(e.tx, pk)
	e.txQP = append(e.txQP, qp)
	return e.tx[len(e.tx)-1].Buf
}

func (qp *QP) Sent(n int) {
	e := qp.e
	e.tx[len(e.tx)-1].N = n
}

// unbuild drops the packet newPacket appended last.
func (e *Engine) unbuild() {
	n := len(e.tx) - 1
	e.free = append(e.free, e.tx[n].Buf)
	e.tx[n] = nic.Packet{}
	e.tx, e.txQP = e.tx[:n], e.txQP[:n]
}

// purge drops every packet qp built that Progress has not handed out: a QP
// in ERR or destroyed sends nothing more.
//
// Acknowledgements already built are kept, and no longer counted as the
// QP's: they acknowledge requests executed before the QP stopped, whose
// completions the application may already have polled. Dropping them
// would make the peer retry a message this side has completed until its
// retry count runs out (a program that destroys its QP right after its
// last receive completes, as ibv_rc_pingpong does). rxe likewise sends a
// request's ACK before a destroy or modify can take effect. READ responses
// (which read memory) and requests are dropped.
func (e *Engine) purge(qp *QP) {
	k := 0
	for i := range e.tx {
		if e.txQP[i] == qp {
			if b := e.tx[i].Buf; len(b) > 0 && (bth.Opcode(b[0]) == bth.RCAck || bth.Opcode(b[0]) == bth.RCAtomicAck) {
				e.tx[k], e.txQP[k] = e.tx[i], nil
				k++
				continue
			}
			e.free = append(e.free, e.tx[i].Buf)
			continue
		}
		e.tx[k], e.txQP[k] = e.tx[i], e.txQP[i]
		k++
	}
	clear(e.tx[k:])
	clear(e.txQP[k:])
	e.tx, e.txQP = e.tx[:k], e.txQP[:k]
}

// srcPort is the UDP source port for a QP: fixed per QP so a flow stays on
// one ECMP path, in the range rxe uses (0xC000 | 14-bit hash of the QPN).
func SrcPort(qpn uint32) uint16 {
	return 0xC000 | uint16((qpn*0x61C88647)>>18)&0x3FFF
}

// Receive processes a batch of received packets at time now. Responses it
// generates (ACKs, NAKs, READ responses) are collected by Progress.
func (e *Engine) Receive(now time.Time, pkts []nic.Packet) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.now = now
	p := &e.rx
	for i := range pkts {
		pk := &pkts[i]
		e.stats.RxPackets++
		if e.onPacket != nil {
			e.onPacket('R', pk)
		}
		if err := bth.Parse(p, pk.Bytes()); err != nil {
			e.stats.RxMalformed++
			continue
		}
		// Silent drops, as rxe and IBTA §9.6 (header validation): TVer
		// must be 0, P_Key the default partition (0xFFFF or 0x7FFF).
		if p.BTH.TVer() != 0 || p.BTH.PKey()&0x7fff != 0x7fff {
			e.stats.RxBadHeader++
			continue
		}
		qp := e.qps[p.BTH.DestQP()]
		if qp == nil {
			e.stats.RxUnknownQP++
			continue
		}
		if p.Info.Op == bth.OpCNP {
			// A CNP is addressed to the QP to slow down, whatever its
			// service (RoCEv2 annex A17.9): never a bad header.
			e.receiveCNP(qp, pk)
			continue
		}
		// A packet of another service than the QP's is silently dropped
		// (IBTA §9.6.1.5.1: the opcode must match the QP's transport).
		if p.Info.Transport != qp.svc.Transport() {
			e.stats.RxBadHeader++
			continue
		}
		qp.svc.Receive(pk, p)
		if isCE(pk) && (!qp.Attr.Remote.IsValid() || pk.Remote.Addr() == qp.Attr.Remote.Addr()) {
			e.noteCE(qp)
		}
	}
	// Answers coalesced over the batch (RC's ACKs) leave now.
	for _, qp := range e.pending {
		qp.svc.BatchDone()
	}
}

// Progress runs expired timers and lets QPs with pending work transmit. It
// returns the packets to send; the caller passes them to Release once the
// link has sent them. more reports that work remains (call again).
func (e *Engine) Progress(now time.Time) (out []nic.Packet, more bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.now = now
	e.paceTimers(now)
	for qp := range e.timed {
		qp.svc.Timers()
	}
	budget := e.MaxBatch
	i := 0
	for ; i < len(e.pending) && len(e.tx) < budget; i++ {
		qp := e.pending[i]
		if qp.svc.Progress(budget) {
			qp.txPending = false
		} else {
			// Budget ran out: keep it pending for the next call.
			e.pending = append(e.pending, qp)
		}
	}
	e.pending = append(e.pending[:0], e.pending[i:]...)
	out = e.tx
	for j := range out {
		if q := e.txQP[j]; q != nil { // nil: an ACK kept after its QP stopped
			q.Counters.TxPackets++
		}
		if e.onPacket != nil {
			e.onPacket('T', &out[j])
		}
	}
	e.stats.TxPackets += uint64(len(out))
	clear(e.txQP)
	e.tx, e.txQP = nil, e.txQP[:0]
	return out, len(e.pending) > 0
}

// Release returns sent packets' buffers to the engine.
func (e *Engine) Release(pkts []nic.Packet) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for i := range pkts {
		e.free = append(e.free, pkts[i].Buf)
		pkts[i].Buf = nil
	}
	if e.tx == nil {
		e.tx = pkts[:0]
	}
}

// NextDeadline is the earliest time a timer wants Progress to run, or the
// zero time when none is armed.
func (e *Engine) NextDeadline() time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	var d time.Time
	defer func() { e.sleepUntil = d }()
	e.paceOnly = false
	for qp := range e.timed {
		for i, t := range qp.deadlines() {
			if !t.IsZero() && (d.IsZero() || t.Before(d)) {
				d = t
				e.paceOnly = i == 2
			} else if !t.IsZero() && t.Equal(d) && i != 2 {
				e.paceOnly = false
			}
		}
	}
	return d
}

// PaceOnly reports whether the deadline NextDeadline returned last is a
// pacer's alone: the driver need not wait for ACKs before acting on it.
func (e *Engine) PaceOnly() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.paceOnly
}

// deadlines are the QP's timers: the local ACK timeout, the RNR wait and
// the pacer's next send time (zero: not armed).
func (qp *QP) deadlines() [3]time.Time {
	return [3]time.Time{qp.RetryDeadline, qp.RNRDeadline, qp.PaceDeadline}
}

func (qp *QP) UpdateTimerSet() {
	e := qp.e
	if qp.RetryDeadline.IsZero() && qp.RNRDeadline.IsZero() && qp.PaceDeadline.IsZero() {
		delete(e.timed, qp)
		return
	}
	e.timed[qp] = struct{}{}
	// A deadline earlier than the one the driver sleeps until (an RNR
	// wait set while handling a NAK, say) must wake it to re-arm.
	for _, t := range qp.deadlines() {
		if !t.IsZero() && (e.sleepUntil.IsZero() || t.Before(e.sleepUntil)) && e.Wake != nil {
			e.Wake()
			return
		}
	}
}

// Remote builds the address a QP sends to from an IP address.
func Remote(ip netip.Addr) netip.AddrPort { return netip.AddrPortFrom(ip, nic.RoCEv2Port) }

// SignalAllFor sets sq_sig_all for one QP (every send WR completes).
func (e *Engine) SignalAllFor(qp *QP, on bool) {
	e.mu.Lock()
	qp.sigAll = on
	e.mu.Unlock()
}

// The services (rc, uc, ud) reach the engine's state of a QP through
// these, under the engine lock.

// StateLocked is the QP state, for a caller holding the engine lock.
func (qp *QP) StateLocked() qpstate.State { return qp.state }

// Now is the time of the Receive or Progress call running.
func (qp *QP) Now() time.Time { return qp.e.now }

// MRs is the key table the QP's memory accesses go through.
func (qp *QP) MRs() *memreg.Table { return qp.e.mrs }

// GetBuf takes a packet buffer (MaxPacket bytes) from the engine's pool;
// PutBuf gives one back.
func (qp *QP) GetBuf() []byte  { return qp.e.getBuf() }
func (qp *QP) PutBuf(b []byte) { qp.e.free = append(qp.e.free, b) }

// Batched is how many packets the transmit batch holds: a service's
// Progress builds while it is below its budget.
func (qp *QP) Batched() int { return len(qp.e.tx) }

// Unbuild takes back the packet NewPacket built last.
func (qp *QP) Unbuild() { qp.e.unbuild() }

// EngineStats are the engine's counters, for a service to count a drop.
func (qp *QP) EngineStats() *EngineStats { return &qp.e.stats }

// RecvHead is the oldest WQE of the QP's own receive queue, nil if it is
// empty; PopRecv takes it.
func (qp *QP) RecvHead() *RecvWQE {
	if qp.rq.count == 0 {
		return nil
	}
	return &qp.rq.wqes[qp.rq.head]
}
func (qp *QP) PopRecv() *RecvWQE { return qp.rq.pop() }
