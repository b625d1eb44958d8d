package rc

import (
	"errors"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/memreg"
	"github.com/softroce/softroce/wr"
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
	cur            curMsg

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
func (qp *QP) deferPacket(b []byte) bool {
	r := &qp.resp
	if r.backlog == nil {
		r.backlog = make([][]byte, backlogSlots)
		r.backlogLen = make([]int, backlogSlots)
	}
	if r.blN == backlogSlots || len(b) > MaxPacket {
		return false
	}
	i := (r.blHead + r.blN) % backlogSlots
	if r.backlog[i] == nil {
		r.backlog[i] = qp.e.getBuf()
	}
	r.backlogLen[i] = copy(r.backlog[i], b)
	r.blN++
	return true
}

// releaseBacklog empties the backlog and gives its buffers back to the
// engine's pool.
func (qp *QP) releaseBacklog() {
	r := &qp.resp
	for i, b := range r.backlog {
		if b != nil {
			qp.e.free = append(qp.e.free, b)
			r.backlog[i] = nil
		}
	}
	r.blHead, r.blN = 0, 0
}

// drainBacklog runs deferred requests until a READ queues responses again.
func (qp *QP) drainBacklog() {
	r := &qp.resp
	var p bth.Packet
	for r.blN > 0 && len(r.jobs) == 0 && qp.canSend() {
		i := r.blHead
		r.blHead = (r.blHead + 1) % backlogSlots
		r.blN--
		if bth.Parse(&p, r.backlog[i][:r.backlogLen[i]]) == nil {
			qp.respond(&p)
		}
		// respond copied what it keeps (payloads land in memory at once).
		qp.e.free = append(qp.e.free, r.backlog[i])
		r.backlog[i] = nil
	}
	if qp.ackPending {
		qp.sendAck()
	}
}

// curMsg is the multi-packet SEND or WRITE in progress.
type curMsg struct {
	active  bool
	op      bth.Operation
	recvID  uint64
	recvSGL []wr.SGE
	recvLen int
	hasRecv bool
	off     int
	va      uint64
	rkey    uint32
	remain  int
	total   int
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
func (qp *QP) respond(p *bth.Packet) {
	r := &qp.resp
	psn := p.BTH.PSN()
	d := bth.PSNDiff(psn, r.ePSN)
	if d > 0 {
		// Out of sequence: exactly one NAK per gap, carrying the expected
		// PSN; later packets of the gap are dropped silently (rxe check_psn).
		qp.stats.OutOfSeqRequests++
		if !r.nakSent {
			r.nakSent = true
			qp.stats.SeqNAKsSent++
			qp.sendNAK(bth.SyndromePSNSeqError, r.ePSN)
		}
		return
	}
	if d < 0 {
		qp.stats.DupRequests++
		qp.duplicate(p)
		return
	}
	r.nakSent = false
	info := p.Info
	// Opcode sequence (IBTA §9.7.5.2.2; rxe check_op_seq).
	if r.cur.active {
		if info.Op != r.cur.op || info.Pos != bth.PosMiddle && info.Pos != bth.PosLast {
			qp.responderError(bth.SyndromeInvalidRequest, psn, cq.RemInvReqErr, "opcode sequence: message not finished")
			return
		}
	} else if info.Pos == bth.PosMiddle || info.Pos == bth.PosLast {
		qp.responderError(bth.SyndromeInvalidRequest, psn, cq.RemInvReqErr, "opcode sequence: no message started")
		return
	}
	if !pmtuLengthOK(info, len(p.Payload), qp.path.PMTU) {
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
	if !qp.canSend() {
		return // a receive CQ overrun moved the QP to ERR: no ACK
	}
	r.ePSN = bth.PSNAdd(r.ePSN, 1)
	r.lastAckable, r.hasLastAckable = psn, true
	if p.BTH.AckReq() {
		qp.ackPending, qp.ackPSN = true, psn
		qp.kick()
	}
}

// pmtuLengthOK checks a request packet's payload against the path MTU
// (IBTA C9-92, rxe_resp_check_length): FIRST and MIDDLE carry exactly
// the PMTU, LAST 1..PMTU, ONLY 0..PMTU.
func pmtuLengthOK(info *bth.OpInfo, plen, pmtu int) bool {
	switch {
	case info.Payload == bth.PayloadPMTU && plen != pmtu,
		info.Payload == bth.PayloadUpTo && (plen > pmtu || info.Pos == bth.PosLast && plen == 0):
		return false
	}
	return true
}

// failKind sorts the reasons a responder cannot execute a SEND or WRITE
// packet; each service decides what follows (RC NAKs, UC drops).
type failKind uint8

const (
	failRNR     failKind = iota + 1 // no receive WQE posted (0: no failure)
	failRequest                     // invalid request: lengths, QP access rights
	failAccess                      // R_Key, bounds or permission of the target memory
	failLocal                       // the receive WQE's own buffer is unusable
)

// respFail is why a packet could not be executed, with the NAK syndrome
// and completion status RC answers it with; kind 0 is success. A value,
// not a pointer, so a failure costs no allocation.
type respFail struct {
	kind failKind
	syn  bth.Syndrome
	st   cq.Status
	why  string
	err  error // the memory access error, formatted only when needed
}

// reason says why, for the async error event of a QP that goes to ERR.
func (f *respFail) reason() string {
	if f.err != nil {
		return f.err.Error()
	}
	return f.why
}

// rcFail answers a failed SEND or WRITE packet as RC does: an RNR NAK
// for a missing receive WQE, otherwise a fatal NAK and the QP to ERR.
func (qp *QP) rcFail(psn uint32, f respFail) {
	if f.kind == failRNR {
		qp.stats.RNRNAKsSent++
		qp.sendNAK(bth.RNRNAK(qp.path.MinRNRTimer), psn)
		return
	}
	qp.responderError(f.syn, psn, f.st, f.reason())
}

// accessFail classifies a failed memory access as memreg reports it:
// remote access error (0x62) or invalid request (0x61).
func accessFail(err error) respFail {
	if errors.Is(err, memreg.ErrInvalidRequest) {
		return respFail{kind: failRequest, syn: bth.SyndromeInvalidRequest, st: cq.RemInvReqErr, err: err}
	}
	return respFail{kind: failAccess, syn: bth.SyndromeRemoteAccessError, st: cq.RemAccessErr, err: err}
}

// takeRecvWQE moves the oldest receive WQE (of the QP's receive queue or
// of its SRQ) into the current message; false when none is posted (RC
// answers an RNR NAK, IBTA §9.7.5.2.8, also with an empty SRQ as rxe
// does). A WQE the current message already holds is kept:
// on UC it is the one a broken message leaves for the next (on RC no
// message holds one when a new one starts).
func (qp *QP) takeRecvWQE() bool {
	r := &qp.resp
	if r.cur.hasRecv {
		return true
	}
	var rw *recvWQE
	if s := qp.cfg.SRQ; s != nil {
		rw = s.take()
	} else if qp.rq.count > 0 {
		rw = qp.rq.pop()
	}
	if rw == nil {
		return false
	}
	r.cur.recvID, r.cur.recvLen, r.cur.hasRecv = rw.id, rw.len, true
	r.cur.recvSGL = append(r.cur.recvSGL[:0], rw.sgl...)
	return true
}

// sendData places one SEND packet in the receive WQE of its message,
// taking a WQE on FIRST and ONLY. Shared by RC and UC.
func (qp *QP) sendData(p *bth.Packet) respFail {
	r := &qp.resp
	if pos := p.Info.Pos; pos == bth.PosFirst || pos == bth.PosOnly {
		if !qp.takeRecvWQE() {
			return respFail{kind: failRNR}
		}
		r.cur.active, r.cur.op, r.cur.off = true, bth.OpSend, 0
	}
	if r.cur.off+len(p.Payload) > r.cur.recvLen {
		// The SEND is longer than the posted buffer: the responder
		// reports a local length error and NAKs invalid request (IBTA
		// C9-102); rxe sends 0x63 here, a known deviation.
		return respFail{kind: failRequest, syn: bth.SyndromeInvalidRequest, st: cq.LocLenErr, why: "SEND longer than the receive buffer"}
	}
	if len(p.Payload) > 0 {
		if err := scatter(qp.e.mrs, qp.cfg.PD, r.cur.recvSGL, r.cur.off, p.Payload); err != nil {
			return respFail{kind: failLocal, syn: bth.SyndromeRemoteOpError, st: cq.LocProtErr, why: "receive buffer: " + err.Error()}
		}
	}
	r.cur.off += len(p.Payload)
	return respFail{}
}

// sendWC is the receive completion of the SEND whose last packet is p.
func (qp *QP) sendWC(p *bth.Packet) cq.WC {
	wc := cq.WC{WRID: qp.resp.cur.recvID, Status: cq.Success, Opcode: cq.OpRecv, ByteLen: uint32(qp.resp.cur.off),
		QPNum: qp.num, SrcQP: qp.path.DestQPN}
	if p.Info.Imm {
		wc.ImmData, wc.Flags = p.ImmDt.Imm(), cq.FlagWithImm
	}
	return wc
}

func (qp *QP) recvSend(p *bth.Packet) bool {
	r := &qp.resp
	info := p.Info
	psn := p.BTH.PSN()
	if f := qp.sendData(p); f.kind != 0 {
		qp.rcFail(psn, f)
		return false
	}
	if info.Pos == bth.PosLast || info.Pos == bth.PosOnly {
		wc := qp.sendWC(p)
		if info.Inv {
			rkey := p.IETH.RKey()
			if err := qp.remote().Invalidate(rkey); err != nil {
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
				qp.cfg.RecvCQ.Push(cq.WC{WRID: r.cur.recvID, Status: cq.RemInvReqErr, Opcode: cq.OpRecv, QPNum: qp.num, SrcQP: qp.path.DestQPN})
				r.cur = curMsg{recvSGL: r.cur.recvSGL}
				qp.responderToError("responder: SEND with invalidate: " + err.Error())
				return false
			}
			wc.InvalidatedRKey, wc.Flags = rkey, cq.FlagWithInv
		}
		qp.resp.msn = bth.PSNAdd(qp.resp.msn, 1)
		r.cur = curMsg{recvSGL: r.cur.recvSGL}
		qp.pushRecvWC(wc, p.BTH.SE())
	}
	return true
}

// writeData checks an RDMA WRITE packet (the RETH, the QP's and the
// key's rights on FIRST and ONLY) and writes its payload; the last packet
// of a WRITE with immediate takes a receive WQE first. Shared by RC and
// UC.
func (qp *QP) writeData(p *bth.Packet) respFail {
	r := &qp.resp
	info := p.Info
	if info.Pos == bth.PosFirst || info.Pos == bth.PosOnly {
		if qp.path.Access&memreg.AccessRemoteWrite == 0 {
			return respFail{kind: failRequest, syn: bth.SyndromeInvalidRequest, st: cq.RemInvReqErr, why: "QP does not allow remote write"}
		}
		length := p.RETH.DMALen()
		if length > 1<<31 {
			return respFail{kind: failRequest, syn: bth.SyndromeInvalidRequest, st: cq.RemInvReqErr, why: "RETH length above 2^31"}
		}
		va, rkey := p.RETH.VA(), p.RETH.RKey()
		if err := qp.remote().Check(rkey, va, uint64(length), memreg.AccessRemoteWrite); err != nil {
			return accessFail(err)
		}
		c := &r.cur
		*c = curMsg{active: true, op: bth.OpWrite, va: va, rkey: rkey, remain: int(length), total: int(length),
			recvSGL: c.recvSGL, recvID: c.recvID, recvLen: c.recvLen, hasRecv: c.hasRecv}
	}
	plen := len(p.Payload)
	last := info.Pos == bth.PosLast || info.Pos == bth.PosOnly
	if plen > r.cur.remain || last && plen != r.cur.remain {
		return respFail{kind: failRequest, syn: bth.SyndromeInvalidRequest, st: cq.RemInvReqErr, why: "WRITE payload does not match the RETH length"}
	}
	// WRITE with immediate consumes a receive WQE; check before touching
	// memory so an RNR NAK leaves nothing half done.
	if last && info.Imm && !qp.takeRecvWQE() {
		return respFail{kind: failRNR}
	}
	if plen > 0 {
		if err := qp.remote().Write(r.cur.rkey, r.cur.va, p.Payload); err != nil {
			return accessFail(err)
		}
	}
	r.cur.va += uint64(plen)
	r.cur.remain -= plen
	return respFail{}
}

// writeWC is the receive completion of a WRITE with immediate whose last
// packet is p.
func (qp *QP) writeWC(p *bth.Packet) cq.WC {
	return cq.WC{WRID: qp.resp.cur.recvID, Status: cq.Success, Opcode: cq.OpRecvRDMAWithImm,
		ByteLen: uint32(qp.resp.cur.total), ImmData: p.ImmDt.Imm(), Flags: cq.FlagWithImm,
		QPNum: qp.num, SrcQP: qp.path.DestQPN}
}

func (qp *QP) recvWrite(p *bth.Packet) bool {
	r := &qp.resp
	info := p.Info
	if f := qp.writeData(p); f.kind != 0 {
		qp.rcFail(p.BTH.PSN(), f)
		return false
	}
	if info.Pos == bth.PosLast || info.Pos == bth.PosOnly {
		qp.resp.msn = bth.PSNAdd(qp.resp.msn, 1)
		if info.Imm {
			qp.pushRecvWC(qp.writeWC(p), p.BTH.SE())
		}
		r.cur = curMsg{recvSGL: r.cur.recvSGL}
	}
	return true
}

func (qp *QP) recvRead(p *bth.Packet) {
	r := &qp.resp
	psn := p.BTH.PSN()
	if qp.path.Access&memreg.AccessRemoteRead == 0 {
		qp.responderError(bth.SyndromeInvalidRequest, psn, cq.RemInvReqErr, "QP does not allow remote read")
		return
	}
	length := p.RETH.DMALen()
	if length > 1<<31 {
		qp.responderError(bth.SyndromeInvalidRequest, psn, cq.RemInvReqErr, "RETH length above 2^31")
		return
	}
	va, rkey := p.RETH.VA(), p.RETH.RKey()
	if err := qp.remote().Check(rkey, va, uint64(length), memreg.AccessRemoteRead); err != nil {
		qp.accessError(psn, err)
		return
	}
	n := npackets(int(length), qp.path.PMTU)
	qp.flushAck() // earlier ACKs go before the READ responses
	// The MSN counts the READ when it is accepted (IBTA C9-148).
	r.msn = bth.PSNAdd(r.msn, 1)
	i, res := r.newResource()
	*res = rdResource{gen: res.gen, op: bth.OpReadRequest, firstPSN: psn, lastPSN: bth.PSNAdd(psn, n-1), va: va, rkey: rkey, length: int(length)}
	r.addJob(i, psn)
	r.ePSN = bth.PSNAdd(psn, n)
	qp.kick()
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

func (qp *QP) recvAtomic(p *bth.Packet) {
	r := &qp.resp
	psn := p.BTH.PSN()
	info := p.Info
	mrs := qp.remote()
	var orig uint64
	var err error
	res := rdResource{op: info.Op, firstPSN: psn, lastPSN: psn}
	switch info.Op {
	case bth.OpCompareSwap, bth.OpFetchAdd:
		if qp.path.Access&memreg.AccessRemoteAtomic == 0 {
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
		if qp.path.Access&memreg.AccessRemoteWrite == 0 {
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
func (qp *QP) replyAtomic(res *rdResource) {
	if !qp.canSend() {
		return
	}
	f := bth.Fields{BTH: bth.BTHFields{PKey: 0xffff, DestQP: qp.path.DestQPN, PSN: res.firstPSN},
		Syndrome: bth.SyndromeACKUnlimited, MSN: qp.resp.msn, Orig: res.orig}
	f.BTH.Opcode = bth.RCAtomicAck
	if res.op == bth.OpAtomicWrite || res.op == bth.OpFlush {
		f.BTH.Opcode = bth.RCReadResponseOnly
	}
	qp.flushAck()
	buf := qp.newPacket()
	qp.sent(bth.WriteHeaders(buf, &f, 0))
}

// duplicate answers a request whose PSN is behind the expected one
// (IBTA §9.7.5.2.1; rxe duplicate_request).
func (qp *QP) duplicate(p *bth.Packet) {
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
		qp.kick()
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
			qp.kick()
			return
		}
		qp.stats.Dropped++ // no resource: silently dropped (class D)
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
		qp.stats.Dropped++
	}
}

// transmit sends queued READ responses; it reports whether all are out.
func (r *responder) transmit(qp *QP, budget int) bool {
	e := qp.e
	pmtu := qp.path.PMTU
	if !qp.canSend() {
		r.jobs = r.jobs[:0]
		return true
	}
	for len(r.jobs) > 0 && len(e.tx) < budget {
		j := &r.jobs[0]
		res := &r.resources[j.res]
		if res.gen != j.gen || res.op != bth.OpReadRequest {
			r.jobs = append(r.jobs[:0], r.jobs[1:]...)
			continue
		}
		n := npackets(res.length, pmtu)
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
		f := bth.Fields{BTH: bth.BTHFields{Opcode: op, PKey: 0xffff, DestQP: qp.path.DestQPN, PSN: j.psn},
			Syndrome: bth.SyndromeACKUnlimited, MSN: r.msn}
		buf := qp.newPacket()
		nb := bth.WriteHeaders(buf, &f, plen)
		if plen > 0 {
			hdr := op.Info().HdrLen
			if err := qp.remote().Read(res.rkey, res.va+uint64(off), buf[hdr:hdr+plen]); err != nil {
				e.unbuild()
				r.jobs = r.jobs[:0]
				qp.accessError(j.psn, err)
				return true
			}
		}
		qp.sent(nb)
		j.psn = bth.PSNAdd(j.psn, 1)
		if k >= n-1 {
			r.jobs = append(r.jobs[:0], r.jobs[1:]...)
		}
	}
	if len(r.jobs) == 0 && r.blN > 0 && qp.canSend() {
		qp.drainBacklog()
	}
	return len(r.jobs) == 0
}

// accessError NAKs a failed memory access with the class memreg reports:
// remote access error (0x62) or invalid request (0x61).
func (qp *QP) accessError(psn uint32, err error) {
	qp.rcFail(psn, accessFail(err))
}

// responderError sends a fatal NAK (class C in rxe) with the PSN of the
// offending packet, completes the receive WQE in use with st, and moves
// the QP to ERR.
func (qp *QP) responderError(syn bth.Syndrome, psn uint32, st cq.Status, why string) {
	qp.sendNAK(syn, psn)
	r := &qp.resp
	if r.cur.hasRecv {
		qp.cfg.RecvCQ.Push(cq.WC{WRID: r.cur.recvID, Status: st, Opcode: cq.OpRecv, QPNum: qp.num, SrcQP: qp.path.DestQPN})
		r.cur.hasRecv = false
	}
	qp.responderToError("responder: " + why)
}

func (qp *QP) pushRecvWC(wc cq.WC, solicited bool) {
	qp.resp.cur.hasRecv = false
	if !qp.cfg.RecvCQ.PushSolicited(wc, solicited) {
		// Earlier requests keep their ACK; this one gets none (rxe:
		// RESPST_ERR_CQ_OVERFLOW, no ACK, QP to ERR).
		qp.flushAck()
		qp.responderToError("receive CQ overrun")
	}
}

// flushAck sends a pending coalesced ACK before anything that must follow
// it on the wire (NAKs, atomic ACKs).
func (qp *QP) flushAck() {
	if qp.ackPending {
		qp.sendAck()
	}
}

func (qp *QP) sendAck() {
	qp.ackPending = false
	qp.ack(bth.SyndromeACKUnlimited, qp.ackPSN)
}

func (qp *QP) sendNAK(syn bth.Syndrome, psn uint32) {
	qp.flushAck()
	qp.ack(syn, psn)
}

// ack emits an ACKNOWLEDGE. rxe and ConnectX send credit code 31 (no
// end-to-end flow control), and so do we.
func (qp *QP) ack(syn bth.Syndrome, psn uint32) {
	if !qp.canSend() {
		return
	}
	f := bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCAck, PKey: 0xffff, DestQP: qp.path.DestQPN, PSN: psn},
		Syndrome: syn, MSN: qp.resp.msn}
	buf := qp.newPacket()
	qp.sent(bth.WriteHeaders(buf, &f, 0))
}
