package rc

import (
	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/memreg"
	"github.com/softroce/softroce/transport/engine"
)

// responder is the receive side of an RC QP (IBTA §9.7.5.2; rxe_resp.c).
type responder struct {
	ePSN    uint32 // expected PSN
	msn     uint32 // message sequence number: completed requests
	nakSent bool   // a PSN sequence error NAK went out for this gap
	// lastAckable is the PSN of the newest SEND or WRITE packet executed:
	// the PSN a duplicate SEND/WRITE is re-ACKed with. Never a READ
	// response or atomic PSN, which an ACKNOWLEDGE must not claim (the
	// fix rxe made in "IB/rxe: fix for duplicate request processing and
	// ack psns").
	lastAckable    uint32
	hasLastAckable bool

	// resources remember READ and atomic requests for duplicate replay,
	// a ring of max_dest_rd_atomic slots (rounded up to a power of two,
	// as rxe does) whose oldest entry is reused.
	resources []rdResource
	resNext   int
	gen       uint32
	jobs      []readJob // READ responses still to send, oldest first

	// Requests that arrive while READ responses are still queued wait
	// here, so that responses leave in PSN order and a later WRITE or
	// atomic cannot change memory a queued READ has yet to read (requests
	// execute in order, IBTA §9.5). Full: the packet is dropped and the
	// requester's go-back-N resends it.
	backlog     [][]byte
	backlogLen  []int
	blHead, blN int
}

const backlogSlots = 64

// deferPacket copies a request packet into the backlog; false when full.
// A slot holds a buffer from the engine's packet pool only while it holds
// a packet, so a QP that once deferred does not keep 64 packet buffers
// (about 270 KiB) for the rest of its life.
func (qp *rcQP) deferPacket(b []byte) bool {
	r := &qp.resp
	if r.backlog == nil {
		r.backlog = make([][]byte, backlogSlots)
		r.backlogLen = make([]int, backlogSlots)
	}
	if r.blN == backlogSlots || len(b) > engine.MaxPacket {
		return false
	}
	i := (r.blHead + r.blN) % backlogSlots
	if r.backlog[i] == nil {
		r.backlog[i] = qp.GetBuf()
	}
	r.backlogLen[i] = copy(r.backlog[i], b)
	r.blN++
	return true
}

// releaseBacklog empties the backlog and gives its buffers back to the
// engine's pool.
func (qp *rcQP) releaseBacklog() {
	r := &qp.resp
	for i, b := range r.backlog {
		if b != nil {
			qp.PutBuf(b)
			r.backlog[i] = nil
		}
	}
	r.blHead, r.blN = 0, 0
}

// drainBacklog runs deferred requests until a READ queues responses again.
func (qp *rcQP) drainBacklog() {
	r := &qp.resp
	var p bth.Packet
	for r.blN > 0 && len(r.jobs) == 0 && qp.CanSend() {
		i := r.blHead
		r.blHead = (r.blHead + 1) % backlogSlots
		r.blN--
		if bth.Parse(&p, r.backlog[i][:r.backlogLen[i]]) == nil {
			qp.respond(&p)
		}
		// respond copied what it keeps (payloads land in memory at once).
		qp.PutBuf(r.backlog[i])
		r.backlog[i] = nil
	}
	if qp.ackPending {
		qp.sendAck()
	}
}

type rdResource struct {
	gen      uint32 // 0: unused
	op       bth.Operation
	firstPSN uint32
	lastPSN  uint32
	va       uint64
	rkey     uint32
	length   int
	orig     uint64
}

type readJob struct {
	res int
	gen uint32
	psn uint32 // next response PSN
}

func (r *responder) newResource() (int, *rdResource) {
	i := r.resNext
	r.resNext = (r.resNext + 1) % len(r.resources)
	r.gen++
	if r.gen == 0 {
		r.gen = 1
	}
	r.resources[i] = rdResource{gen: r.gen}
	return i, &r.resources[i]
}

// respond handles one request packet.
func (qp *rcQP) respond(p *bth.Packet) {
	r := &qp.resp
	psn := p.BTH.PSN()
	d := bth.PSNDiff(psn, r.ePSN)
	if d > 0 {
		// Out of sequence: exactly one NAK per gap, carrying the expected
		// PSN; later packets of the gap are dropped silently (rxe check_psn).
		qp.Counters.OutOfSeqRequests++
		if !r.nakSent {
			r.nakSent = true
			qp.Counters.SeqNAKsSent++
			qp.sendNAK(bth.SyndromePSNSeqError, r.ePSN)
		}
		return
	}
	if d < 0 {
		qp.Counters.DupRequests++
		qp.duplicate(p)
		return
	}
	r.nakSent = false
	info := p.Info
	// Opcode sequence (IBTA §9.7.5.2.2; rxe check_op_seq).
	if qp.Msg.Active {
		if info.Op != qp.Msg.Op || info.Pos != bth.PosMiddle && info.Pos != bth.PosLast {
			qp.responderError(bth.SyndromeInvalidRequest, psn, cq.RemInvReqErr, "opcode sequence: message not finished")
			return
		}
	} else if info.Pos == bth.PosMiddle || info.Pos == bth.PosLast {
		qp.responderError(bth.SyndromeInvalidRequest, psn, cq.RemInvReqErr, "opcode sequence: no message started")
		return
	}
	if !engine.PMTULengthOK(info, len(p.Payload), qp.Attr.PMTU) {
		qp.responderError(bth.SyndromeInvalidRequest, psn, cq.RemInvReqErr, "packet length does not fit the path MTU")
		return
	}
	switch info.Op {
	case bth.OpSend:
		if !qp.recvSend(p) {
			return
		}
	case bth.OpWrite:
		if !qp.recvWrite(p) {
			return
		}
	case bth.OpReadRequest:
		qp.recvRead(p)
		return
	case bth.OpCompareSwap, bth.OpFetchAdd, bth.OpAtomicWrite, bth.OpFlush:
		qp.recvAtomic(p)
		return
	default:
		qp.responderError(bth.SyndromeInvalidRequest, psn, cq.RemInvReqErr, "unsupported opcode "+info.Name)
		return
	}
	if !qp.CanSend() {
		return // a receive CQ overrun moved the QP to ERR: no ACK
	}
	r.ePSN = bth.PSNAdd(r.ePSN, 1)
	r.lastAckable, r.hasLastAckable = psn, true
	if p.BTH.AckReq() {
		qp.ackPending, qp.ackPSN = true, psn
		qp.Kick()
	}
}

// rcFail answers a failed SEND or WRITE packet as RC does: an RNR NAK
// for a missing receive WQE, otherwise a fatal NAK and the QP to ERR.
func (qp *rcQP) rcFail(psn uint32, f engine.RespFail) {
	if f.Kind == engine.FailRNR {
		qp.Counters.RNRNAKsSent++
		qp.sendNAK(bth.RNRNAK(qp.Attr.MinRNRTimer), psn)
		return
	}
	qp.responderError(f.Syn, psn, f.St, f.Reason())
}

func (qp *rcQP) recvSend(p *bth.Packet) bool {
	r := &qp.resp
	info := p.Info
	psn := p.BTH.PSN()
	if f := qp.SendData(p); f.Kind != 0 {
		qp.rcFail(psn, f)
		return false
	}
	if info.Pos == bth.PosLast || info.Pos == bth.PosOnly {
		wc := qp.SendWC(p)
		if info.Inv {
			rkey := p.IETH.RKey()
			if err := qp.Remote().Invalidate(rkey); err != nil {
				// Class J, as rxe (RESPST_ERR_INVALIDATE_RKEY): no NAK,
				// the receive completes REM_INV_REQ_ERR and the QP goes
				// to ERR. The region stays valid (memreg refuses to let a
				// peer invalidate an ordinary MR). The packet itself was
				// received in order, so it is ACKed before the QP stops,
				// as rxe 6.1 does (docs/rxe-behaviour.md §4.5): the error is
				// the responder's, and a requester that got no ACK would
				// only retry into a QP in ERR until its retry count ran out.
				r.ePSN = bth.PSNAdd(r.ePSN, 1)
				qp.resp.msn = bth.PSNAdd(qp.resp.msn, 1)
				qp.ackPending, qp.ackPSN = true, psn
				qp.flushAck()
				qp.Config.RecvCQ.Push(cq.WC{WRID: qp.Msg.RecvID, Status: cq.RemInvReqErr, Opcode: cq.OpRecv, QPNum: qp.Num(), SrcQP: qp.Attr.DestQPN})
				qp.Msg = engine.Message{RecvSGL: qp.Msg.RecvSGL}
				qp.ResponderToError("responder: SEND with invalidate: " + err.Error())
				return false
			}
			wc.InvalidatedRKey, wc.Flags = rkey, cq.FlagWithInv
		}
		qp.resp.msn = bth.PSNAdd(qp.resp.msn, 1)
		qp.Msg = engine.Message{RecvSGL: qp.Msg.RecvSGL}
		qp.pushRecvWC(wc, p.BTH.SE())
	}
	return true
}

func (qp *rcQP) recvWrite(p *bth.Packet) bool {
	info := p.Info
	if f := qp.WriteData(p); f.Kind != 0 {
		qp.rcFail(p.BTH.PSN(), f)
		return false
	}
	if info.Pos == bth.PosLast || info.Pos == bth.PosOnly {
		qp.resp.msn = bth.PSNAdd(qp.resp.msn, 1)
		if info.Imm {
			qp.pushRecvWC(qp.WriteWC(p), p.BTH.SE())
		}
		qp.Msg = engine.Message{RecvSGL: qp.Msg.RecvSGL}
	}
	return true
}

func (qp *rcQP) recvRead(p *bth.Packet) {
	r := &qp.resp
	psn := p.BTH.PSN()
	if qp.Attr.Access&memreg.AccessRemoteRead == 0 {
		qp.responderError(bth.SyndromeInvalidRequest, psn, cq.RemInvReqErr, "QP does not allow remote read")
		return
	}
	length := p.RETH.DMALen()
	if length > 1<<31 {
		qp.responderError(bth.SyndromeInvalidRequest, psn, cq.RemInvReqErr, "RETH length above 2^31")
		return
	}
	va, rkey := p.RETH.VA(), p.RETH.RKey()
	if err := qp.Remote().Check(rkey, va, uint64(length), memreg.AccessRemoteRead); err != nil {
		qp.accessError(psn, err)
		return
	}
	n := engine.NPackets(int(length), qp.Attr.PMTU)
	qp.flushAck() // earlier ACKs go before the READ responses
	// The MSN counts the READ when it is accepted (IBTA C9-148).
	r.msn = bth.PSNAdd(r.msn, 1)
	i, res := r.newResource()
	*res = rdResource{gen: res.gen, op: bth.OpReadRequest, firstPSN: psn, lastPSN: bth.PSNAdd(psn, n-1), va: va, rkey: rkey, length: int(length)}
	r.addJob(i, psn)
	r.ePSN = bth.PSNAdd(psn, n)
	qp.Kick()
}

func (r *responder) addJob(i int, psn uint32) {
	gen := r.resources[i].gen
	for j := range r.jobs {
		if r.jobs[j].res == i && r.jobs[j].gen == gen {
			r.jobs[j].psn = psn // a duplicate restarts the replay
			return
		}
	}
	r.jobs = append(r.jobs, readJob{res: i, gen: gen, psn: psn})
}

func (qp *rcQP) recvAtomic(p *bth.Packet) {
	r := &qp.resp
	psn := p.BTH.PSN()
	info := p.Info
	mrs := qp.Remote()
	var orig uint64
	var err error
	res := rdResource{op: info.Op, firstPSN: psn, lastPSN: psn}
	switch info.Op {
	case bth.OpCompareSwap, bth.OpFetchAdd:
		if qp.Attr.Access&memreg.AccessRemoteAtomic == 0 {
			qp.responderError(bth.SyndromeInvalidRequest, psn, cq.RemInvReqErr, "QP does not allow remote atomics")
			return
		}
		a := p.AtomicETH
		aop := memreg.AtomicCmpSwap
		if info.Op == bth.OpFetchAdd {
			aop = memreg.AtomicFetchAdd
		}
		orig, err = mrs.Atomic(a.RKey(), a.VA(), aop, a.SwapAdd(), a.Compare())
		res.va, res.rkey, res.orig = a.VA(), a.RKey(), orig
	case bth.OpAtomicWrite:
		if qp.Attr.Access&memreg.AccessRemoteWrite == 0 {
			qp.responderError(bth.SyndromeInvalidRequest, psn, cq.RemInvReqErr, "QP does not allow remote write (ATOMIC_WRITE)")
			return
		}
		var v [8]byte
		copy(v[:], p.Payload)
		err = mrs.AtomicWrite(p.RETH.RKey(), p.RETH.VA(), v)
	case bth.OpFlush:
		// Memory here is ordinary Go memory: global visibility is given
		// once the write has been executed, so a FLUSH only checks access.
		if p.FETH.Selectivity() == 0 {
			err = mrs.Check(p.RETH.RKey(), p.RETH.VA(), uint64(p.RETH.DMALen()), memreg.AccessFlushGlobal)
		}
	}
	if err != nil {
		qp.accessError(psn, err)
		return
	}
	r.msn = bth.PSNAdd(r.msn, 1)
	_, slot := r.newResource()
	res.gen = slot.gen
	*slot = res
	r.ePSN = bth.PSNAdd(psn, 1)
	qp.replyAtomic(&res)
}

// replyAtomic answers an atomic with its original value, and ATOMIC_WRITE
// and FLUSH with an empty READ_RESPONSE_ONLY (IBTA 1.5 A19).
func (qp *rcQP) replyAtomic(res *rdResource) {
	if !qp.CanSend() {
		return
	}
	f := bth.Fields{BTH: bth.BTHFields{PKey: 0xffff, DestQP: qp.Attr.DestQPN, PSN: res.firstPSN},
		Syndrome: bth.SyndromeACKUnlimited, MSN: qp.resp.msn, Orig: res.orig}
	f.BTH.Opcode = bth.RCAtomicAck
	if res.op == bth.OpAtomicWrite || res.op == bth.OpFlush {
		f.BTH.Opcode = bth.RCReadResponseOnly
	}
	qp.flushAck()
	buf := qp.NewPacket()
	qp.Sent(bth.WriteHeaders(buf, &f, 0))
}

// duplicate answers a request whose PSN is behind the expected one
// (IBTA §9.7.5.2.1; rxe duplicate_request).
func (qp *rcQP) duplicate(p *bth.Packet) {
	r := &qp.resp
	psn := p.BTH.PSN()
	switch p.Info.Op {
	case bth.OpSend, bth.OpWrite:
		// Re-ACK with the newest executed SEND/WRITE PSN (IBTA C9-105).
		// Duplicates in one batch share one ACK instead of rxe's one per
		// packet.
		ack := bth.PSNAdd(r.ePSN, -1)
		if r.hasLastAckable {
			ack = r.lastAckable
		}
		qp.ackPending, qp.ackPSN = true, ack
		qp.Kick()
	case bth.OpReadRequest:
		for i := range r.resources {
			res := &r.resources[i]
			if res.gen == 0 || res.op != bth.OpReadRequest || bth.PSNDiff(psn, res.firstPSN) < 0 || bth.PSNDiff(psn, res.lastPSN) > 0 {
				continue
			}
			// Replay only a subset of the original request, same rkey.
			// Overflow-safe: va+l may wrap (and so may res.va+length of
			// a zero-length READ, whose VA nothing checked).
			va, l := p.RETH.VA(), uint64(p.RETH.DMALen())
			if p.RETH.RKey() != res.rkey || va < res.va || va-res.va > uint64(res.length) || l > uint64(res.length)-(va-res.va) {
				break
			}
			r.addJob(i, psn)
			qp.Kick()
			return
		}
		qp.Counters.Dropped++ // no resource: silently dropped (class D)
	default:
		for i := range r.resources {
			res := &r.resources[i]
			if res.gen != 0 && res.op == p.Info.Op && res.firstPSN == psn {
				// Replayed from the saved result: an atomic is never
				// executed twice.
				qp.replyAtomic(res)
				return
			}
		}
		qp.Counters.Dropped++
	}
}

// transmit sends queued READ responses; it reports whether all are out.
func (r *responder) transmit(qp *rcQP, budget int) bool {
	pmtu := qp.Attr.PMTU
	if !qp.CanSend() {
		r.jobs = r.jobs[:0]
		return true
	}
	for len(r.jobs) > 0 && qp.Batched() < budget {
		j := &r.jobs[0]
		res := &r.resources[j.res]
		if res.gen != j.gen || res.op != bth.OpReadRequest {
			r.jobs = append(r.jobs[:0], r.jobs[1:]...)
			continue
		}
		n := engine.NPackets(res.length, pmtu)
		k := bth.PSNDiff(j.psn, res.firstPSN)
		off := k * pmtu
		plen := min(pmtu, res.length-off)
		var op bth.Opcode
		switch {
		case n == 1:
			op = bth.RCReadResponseOnly
		case k == 0:
			op = bth.RCReadResponseFirst
		case k == n-1:
			op = bth.RCReadResponseLast
		default:
			op = bth.RCReadResponseMiddle
		}
		f := bth.Fields{BTH: bth.BTHFields{Opcode: op, PKey: 0xffff, DestQP: qp.Attr.DestQPN, PSN: j.psn},
			Syndrome: bth.SyndromeACKUnlimited, MSN: r.msn}
		buf := qp.NewPacket()
		nb := bth.WriteHeaders(buf, &f, plen)
		if plen > 0 {
			hdr := op.Info().HdrLen
			if err := qp.Remote().Read(res.rkey, res.va+uint64(off), buf[hdr:hdr+plen]); err != nil {
				qp.Unbuild()
				r.jobs = r.jobs[:0]
				qp.accessError(j.psn, err)
				return true
			}
		}
		qp.Sent(nb)
		j.psn = bth.PSNAdd(j.psn, 1)
		if k >= n-1 {
			r.jobs = append(r.jobs[:0], r.jobs[1:]...)
		}
	}
	if len(r.jobs) == 0 && r.blN > 0 && qp.CanSend() {
		qp.drainBacklog()
	}
	return len(r.jobs) == 0
}

// accessError NAKs a failed memory access with the class memreg reports:
// remote access error (0x62) or invalid request (0x61).
func (qp *rcQP) accessError(psn uint32, err error) {
	qp.rcFail(psn, engine.AccessFail(err))
}

// responderError sends a fatal NAK (class C in rxe) with the PSN of the
// offending packet, completes the receive WQE in use with st, and moves
// the QP to ERR.
func (qp *rcQP) responderError(syn bth.Syndrome, psn uint32, st cq.Status, why string) {
	qp.sendNAK(syn, psn)
	if qp.Msg.HasRecv {
		qp.Config.RecvCQ.Push(cq.WC{WRID: qp.Msg.RecvID, Status: st, Opcode: cq.OpRecv, QPNum: qp.Num(), SrcQP: qp.Attr.DestQPN})
		qp.Msg.HasRecv = false
	}
	qp.ResponderToError("responder: " + why)
}

func (qp *rcQP) pushRecvWC(wc cq.WC, solicited bool) {
	if !qp.PushRecv(wc, solicited) {
		// Earlier requests keep their ACK; this one gets none (rxe:
		// RESPST_ERR_CQ_OVERFLOW, no ACK, QP to ERR).
		qp.flushAck()
		qp.ResponderToError("receive CQ overrun")
	}
}

// flushAck sends a pending coalesced ACK before anything that must follow
// it on the wire (NAKs, atomic ACKs).
func (qp *rcQP) flushAck() {
	if qp.ackPending {
		qp.sendAck()
	}
}

func (qp *rcQP) sendAck() {
	qp.ackPending = false
	qp.ack(bth.SyndromeACKUnlimited, qp.ackPSN)
}

func (qp *rcQP) sendNAK(syn bth.Syndrome, psn uint32) {
	qp.flushAck()
	qp.ack(syn, psn)
}

// ack emits an ACKNOWLEDGE. rxe and ConnectX send credit code 31 (no
// end-to-end flow control), and so do we.
func (qp *rcQP) ack(syn bth.Syndrome, psn uint32) {
	if !qp.CanSend() {
		return
	}
	f := bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCAck, PKey: 0xffff, DestQP: qp.Attr.DestQPN, PSN: psn},
		Syndrome: syn, MSN: qp.resp.msn}
	buf := qp.NewPacket()
	qp.Sent(bth.WriteHeaders(buf, &f, 0))
}
