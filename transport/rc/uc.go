package rc

import (
	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/qpstate"
	"github.com/softroce/softroce/transport/uc"
	"github.com/softroce/softroce/wr"
)

// The Unreliable Connection service runs on the same engine as RC: the
// requester segments SEND and WRITE work requests as RC does (with UC
// opcodes and no AckReq) and completes each once its last packet is
// built for the link, without ACKs, retransmission or timers; the
// responder places packets with RC's execution code, sequenced by
// transport/uc's Receiver, and answers nothing. This file holds what
// differs; the hooks in the RC files are marked "UC:".

// ucService is the Unreliable Connection service.
type ucService struct{}

func init() { register(qpstate.UC, ucService{}) }

func (ucService) transport() bth.Transport { return bth.TransportUC }
func (ucService) init(*QP)                 {}

// checkPost refuses what UC does not carry: READ, atomics, invalidate.
func (ucService) checkPost(_ *QP, swr *wr.SendWR) error { return uc.CheckPost(swr.Opcode) }

func (ucService) enterRTR(qp *QP) { qp.ucRecv.Reset(qp.path.RQPSN) }

// purgeOnError is false: every packet a UC QP has built belongs to a work
// request that has completed, or is its own failing one: they still
// leave, as rxe sends UC packets as it builds them.
func (ucService) purgeOnError() bool { return false }

// progress is RC's requester, with the UC rules marked "UC:" in it. A UC
// responder answers nothing, and without ACKs the requester arms no
// timer.
func (ucService) progress(qp *QP, budget int) bool { return qp.transmit(budget) }
func (ucService) batchDone(*QP)                    {}
func (ucService) timers(*QP)                       {}
func (ucService) stop(*QP)                         {}
func (ucService) destroy(*QP)                      {}

func (ucService) receive(qp *QP, pk *nic.Packet, p *bth.Packet) {
	qp.receiveConnected(pk, p, func(qp *QP, _ *nic.Packet, p *bth.Packet) { qp.respondUC(p) })
}

// isUC reports whether the QP is of the Unreliable Connection service.
func (qp *QP) isUC() bool { return qp.cfg.Type == qpstate.UC }

// ucSent completes the send WQE at the head of the queue once its last
// packet is built: UC has nothing to wait for (rxe completes a UC WQE when
// its last packet is sent). The packets stay in the transmit batch even if
// the QP enters ERR before Progress hands them out, since their WQEs have
// completed (see toError).
func (qp *QP) ucSent() {
	qp.completeHead(cq.Success, 0)
}

// respondUC handles one request packet of a UC QP (IBTA §9.8; rxe's UC
// paths of check_psn, check_op_seq, check_op_valid and the class D and E
// errors). Nothing is ever sent back.
func (qp *QP) respondUC(p *bth.Packet) {
	r := &qp.resp
	info := p.Info
	v := qp.ucRecv.Check(p.BTH.PSN(), info.Op, info.Pos)
	if v.Abandon {
		qp.ucAbandon()
	}
	if !v.Execute {
		if v.Why == uc.PSNError {
			qp.stats.OutOfSeqRequests++
		} else {
			qp.stats.Dropped++
		}
		return
	}
	if !pmtuLengthOK(info, len(p.Payload), qp.path.PMTU) {
		qp.ucFail(respFail{kind: failRequest, why: "packet length does not fit the path MTU"})
		return
	}
	var f respFail
	if info.Op == bth.OpSend {
		f = qp.sendData(p)
	} else {
		f = qp.writeData(p)
	}
	if f.kind != 0 {
		qp.ucFail(f)
		return
	}
	if info.Pos != bth.PosLast && info.Pos != bth.PosOnly {
		return
	}
	switch {
	case info.Op == bth.OpSend:
		qp.pushRecvWC(qp.sendWC(p), p.BTH.SE())
	case info.Imm:
		qp.pushRecvWC(qp.writeWC(p), p.BTH.SE())
	}
	r.endMsg()
}

// endMsg closes the current message. A receive WQE it holds and did not
// consume (a broken SEND's, kept through a WRITE) stays for the next
// message.
func (r *responder) endMsg() {
	c := &r.cur
	*c = curMsg{recvSGL: c.recvSGL, recvID: c.recvID, recvLen: c.recvLen, hasRecv: c.hasRecv}
}

// ucAbandon discards a partially received message. Its receive WQE is
// kept for the next message, as rxe resets it (class D1); a WQE of an SRQ
// completes REM_INV_REQ_ERR instead (class E, as rxe).
func (qp *QP) ucAbandon() {
	qp.stats.Dropped++
	if qp.cfg.SRQ != nil {
		qp.ucCompleteHeld(cq.RemInvReqErr)
	}
	qp.resp.endMsg()
}

// ucFail handles a packet the receiver accepted but the responder could
// not execute. UC has no NAK: the rest of the message is dropped (class
// D), the receive WQE is kept, or with an SRQ completed in error (class
// E, REM_ACCESS_ERR for a key or access error). An unusable receive
// buffer is class A, as rxe: the WQE completes in error and the QP goes
// to ERR. rxe likewise never moves a UC QP to ERR for an R_Key, access
// or length error.
func (qp *QP) ucFail(f respFail) {
	qp.ucRecv.Fail()
	qp.stats.Dropped++
	switch {
	case f.kind == failLocal:
		qp.ucCompleteHeld(f.st)
		qp.responderToError("responder: " + f.reason())
		return
	case qp.cfg.SRQ != nil && f.kind == failAccess:
		qp.ucCompleteHeld(cq.RemAccessErr)
	case qp.cfg.SRQ != nil && f.kind == failRequest:
		qp.ucCompleteHeld(cq.RemInvReqErr)
	}
	qp.resp.endMsg()
}

// ucCompleteHeld completes the receive WQE the current message holds, if
// any, with status st.
func (qp *QP) ucCompleteHeld(st cq.Status) {
	r := &qp.resp
	if !r.cur.hasRecv {
		return
	}
	r.cur.hasRecv = false
	if !qp.cfg.RecvCQ.Push(cq.WC{WRID: r.cur.recvID, Status: st, Opcode: cq.OpRecv, QPNum: qp.num, SrcQP: qp.path.DestQPN}) {
		qp.responderToError("receive CQ overrun")
	}
}
