package uc

import (
	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/qpstate"
	"github.com/softroce/softroce/transport/engine"
	"github.com/softroce/softroce/wr"
)

// The Unreliable Connection service: the requester segments SEND and
// WRITE work requests as RC does (with UC opcodes and no AckReq) and
// completes each once its last packet is built for the link, without
// ACKs, retransmission or timers; the responder places packets with the
// connected services' placement code, sequenced by its Receiver, and
// answers nothing.

// ucQP is a UC QP: the engine's QP and the responder's receive
// sequencing.
type ucQP struct {
	*engine.QP
	recv Receiver
}

func init() { engine.Register(qpstate.UC, func(qp *engine.QP) engine.Service { return &ucQP{QP: qp} }) }

func (*ucQP) Transport() bth.Transport { return bth.TransportUC }

// ExpectedPSN is the receiver's next expected PSN (engine.QP.PSNs).
func (qp *ucQP) ExpectedPSN() uint32 { return qp.recv.ExpectedPSN() }

// CheckPost refuses what UC does not carry: READ, atomics, invalidate.
func (*ucQP) CheckPost(swr *wr.SendWR) error { return CheckPost(swr.Opcode) }

func (qp *ucQP) EnterRTR() { qp.recv.Reset(qp.Attr.RQPSN) }

// PurgeOnError is false: every packet a UC QP has built belongs to a work
// request that has completed, or is its own failing one: they still
// leave, as rxe sends UC packets as it builds them.
func (*ucQP) PurgeOnError() bool { return false }

// Progress is the requester: a UC responder answers nothing, and without
// ACKs the requester arms no timer.
func (qp *ucQP) Progress(budget int) bool { return qp.transmit(budget) }
func (*ucQP) BatchDone()                  {}
func (*ucQP) Timers()                     {}
func (*ucQP) PathChanged()                {}
func (*ucQP) EnterRTS()                   {}
func (*ucQP) Reset()                      {}
func (*ucQP) Stop()                       {}
func (*ucQP) Destroy()                    {}

// Receive takes a request packet from the peer to the responder (UC has
// no responses).
func (qp *ucQP) Receive(pk *nic.Packet, p *bth.Packet) {
	if qp.AcceptConnected(pk, p) && p.Info.Request {
		qp.respond(p)
	}
}

// transmit is the requester: it sends packets from the send queue until
// the budget stops it, and reports whether it has nothing more to send
// right now. A WQE completes once its last packet is built (rxe
// completes a UC WQE when its last packet is sent). The packets stay in
// the transmit batch even if the QP enters ERR before Progress hands them
// out, since their WQEs have completed (see toError).
func (qp *ucQP) transmit(budget int) bool {
	if qp.StateLocked() != qpstate.RTS {
		return true
	}
	pmtu := qp.Attr.PMTU
	for qp.Batched() < budget {
		if qp.SQSendOff >= qp.SQCount {
			return true
		}
		w := &qp.SQ[(qp.SQHead+qp.SQSendOff)%len(qp.SQ)]
		if w.State == engine.WQEDone {
			qp.SQSendOff++
			continue
		}
		if w.WR.Opcode.IsLocal() {
			if qp.StepLocal(w) {
				return true
			}
			continue
		}
		if w.State == engine.WQEQueued {
			// UC has no READ or atomics: nothing to fence or wait for.
			w.FirstPSN = qp.NextPSN
			w.NPSN = engine.NPackets(w.Length, pmtu)
			w.LastPSN = bth.PSNAdd(w.FirstPSN, w.NPSN-1)
			qp.NextPSN = bth.PSNAdd(qp.NextPSN, w.NPSN)
			w.State = engine.WQEStarted
			w.ReadDone = 0
			qp.SQPkt = 0
		}
		psn := bth.PSNAdd(w.FirstPSN, qp.SQPkt)
		if !qp.buildRequest(w, psn) {
			return true // the WQE failed locally; the QP is in ERR
		}
		if qp.SQPkt+1 >= w.NPSN {
			qp.SQSendOff++
			qp.SQPkt = 0
			qp.completeHead(cq.Success)
			continue
		}
		qp.SQPkt++
	}
	return false
}

// buildRequest writes packet number qp.sqPkt of w at PSN psn: the RC
// segment under the UC prefix, never with AckReq.
func (qp *ucQP) buildRequest(w *engine.SendWQE, psn uint32) bool {
	pmtu := qp.Attr.PMTU
	f := bth.Fields{BTH: bth.BTHFields{PKey: 0xffff, DestQP: qp.Attr.DestQPN, PSN: psn}}
	k := qp.SQPkt
	op := w.WR.Opcode
	off := k * pmtu
	plen := min(pmtu, w.Length-off)
	first, last := k == 0, k == w.NPSN-1
	f.BTH.Opcode = Opcode(engine.SegOpcode(op, first, last))
	f.BTH.SE = last && w.WR.Flags&wr.Solicited != 0 && (op.IsSend() || op == wr.RDMAWriteWithImm)
	if op.IsWrite() && first {
		f.VA, f.RKey, f.DMALen = w.WR.RemoteAddr, w.WR.RKey, uint32(w.Length)
	}
	f.Imm = w.WR.Imm
	f.InvRKey = w.WR.InvRKey
	buf := qp.NewPacket()
	n := bth.WriteHeaders(buf, &f, plen)
	hdr := f.BTH.Opcode.Info().HdrLen
	var err error
	switch {
	case plen == 0:
	case w.IsInline:
		copy(buf[hdr:hdr+plen], w.Inline[off:])
	default:
		err = engine.Gather(qp.MRs(), qp.Config.PD, w.SGL, off, buf[hdr:hdr+plen])
	}
	if err != nil {
		// As RC: the packet is not sent, the WQE completes in error and
		// the QP goes to ERR (IBTA §10.8.3.1).
		qp.Unbuild()
		qp.completeHead(engine.LocalErrStatus(err))
		qp.ToError("local protection error on send: " + err.Error())
		return false
	}
	qp.Sent(n)
	return true
}

// completeHead completes the oldest WQE with status st; a success lets
// the local work requests it held back complete.
func (qp *ucQP) completeHead(st cq.Status) {
	if !qp.CompleteHead(st, 0) {
		return
	}
	if st == cq.Success {
		qp.DrainLocal()
	}
	qp.Kick()
}

// respond handles one request packet (IBTA §9.8; rxe's UC paths of
// check_psn, check_op_seq, check_op_valid and the class D and E errors).
// Nothing is ever sent back.
func (qp *ucQP) respond(p *bth.Packet) {
	info := p.Info
	v := qp.recv.Check(p.BTH.PSN(), info.Op, info.Pos)
	if v.Abandon {
		qp.abandon()
	}
	if !v.Execute {
		if v.Why == PSNError {
			qp.Counters.OutOfSeqRequests++
		} else {
			qp.Counters.Dropped++
		}
		return
	}
	if !engine.PMTULengthOK(info, len(p.Payload), qp.Attr.PMTU) {
		qp.fail(engine.RespFail{Kind: engine.FailRequest, Why: "packet length does not fit the path MTU"})
		return
	}
	var f engine.RespFail
	if info.Op == bth.OpSend {
		f = qp.SendData(p)
	} else {
		f = qp.WriteData(p)
	}
	if f.Kind != 0 {
		qp.fail(f)
		return
	}
	if info.Pos != bth.PosLast && info.Pos != bth.PosOnly {
		return
	}
	switch {
	case info.Op == bth.OpSend:
		qp.pushRecvWC(qp.SendWC(p), p.BTH.SE())
	case info.Imm:
		qp.pushRecvWC(qp.WriteWC(p), p.BTH.SE())
	}
	qp.EndMsg()
}

// pushRecvWC delivers a receive completion; a receive CQ overrun moves
// the QP to ERR.
func (qp *ucQP) pushRecvWC(wc cq.WC, solicited bool) {
	if !qp.PushRecv(wc, solicited) {
		qp.ResponderToError("receive CQ overrun")
	}
}

// abandon discards a partially received message. Its receive WQE is
// kept for the next message, as rxe resets it (class D1); a WQE of an SRQ
// completes REM_INV_REQ_ERR instead (class E, as rxe).
func (qp *ucQP) abandon() {
	qp.Counters.Dropped++
	if qp.Config.SRQ != nil {
		qp.completeHeld(cq.RemInvReqErr)
	}
	qp.EndMsg()
}

// fail handles a packet the receiver accepted but the responder could
// not execute. UC has no NAK: the rest of the message is dropped (class
// D), the receive WQE is kept, or with an SRQ completed in error (class
// E, REM_ACCESS_ERR for a key or access error). An unusable receive
// buffer is class A, as rxe: the WQE completes in error and the QP goes
// to ERR. rxe likewise never moves a UC QP to ERR for an R_Key, access
// or length error.
func (qp *ucQP) fail(f engine.RespFail) {
	qp.recv.Fail()
	qp.Counters.Dropped++
	switch {
	case f.Kind == engine.FailLocal:
		qp.completeHeld(f.St)
		qp.ResponderToError("responder: " + f.Reason())
		return
	case qp.Config.SRQ != nil && f.Kind == engine.FailAccess:
		qp.completeHeld(cq.RemAccessErr)
	case qp.Config.SRQ != nil && f.Kind == engine.FailRequest:
		qp.completeHeld(cq.RemInvReqErr)
	}
	qp.EndMsg()
}

// completeHeld completes the receive WQE the current message holds, if
// any, with status st.
func (qp *ucQP) completeHeld(st cq.Status) {
	c := &qp.Msg
	if !c.HasRecv {
		return
	}
	c.HasRecv = false
	if !qp.Config.RecvCQ.Push(cq.WC{WRID: c.RecvID, Status: st, Opcode: cq.OpRecv, QPNum: qp.Num(), SrcQP: qp.Attr.DestQPN}) {
		qp.ResponderToError("receive CQ overrun")
	}
}
