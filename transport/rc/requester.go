package rc

import (
	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/qpstate"
	"github.com/softroce/softroce/wr"
)

// Defaults follow rxe where IBTA leaves a choice.
const (
	// maxUnackedPSNs bounds the requester's window of unacknowledged PSNs
	// (rxe: RXE_MAX_UNACKED_PSNS).
	maxUnackedPSNs = 128
	// ackReqEvery sets AckReq inside long messages so the window keeps
	// moving: every 64th packet, as rxe does, two per window of
	// maxUnackedPSNs. Each ACK costs the responder a send and its guest
	// kernel's receive work for what arrived meanwhile; every 32nd doubled
	// the ACKs of a 64 KiB message and was slower across two guests.
	ackReqEvery = 64
)

// transmit is the requester: it sends new and go-back-N packets from the
// send queue until the budget, the PSN window or max_rd_atomic stops it.
// It reports whether it has nothing more to send right now.
func (qp *rcQP) transmit(budget int) bool {
	e := qp.e
	if qp.state != qpstate.RTS || !qp.rnrDeadline.IsZero() {
		return true
	}
	pmtu := qp.path.PMTU
	for len(e.tx) < budget {
		if qp.sqSendOff >= qp.sqCount {
			return true
		}
		w := &qp.sq[(qp.sqHead+qp.sqSendOff)%len(qp.sq)]
		if w.state == wqeDone {
			qp.sqSendOff++
			continue
		}
		if w.wr.Opcode.IsLocal() {
			if qp.stepLocal(w) {
				return true
			}
			continue
		}
		if w.state == wqeQueued {
			if needsRDResource(w.wr.Opcode) && qp.rdOutstanding >= qp.path.MaxRDAtomic {
				return true // resumes when a READ/atomic completes
			}
			if w.wr.Flags&wr.Fence != 0 && qp.rdOutstanding > 0 {
				return true // IBV_SEND_FENCE: wait for prior READ/atomics
			}
			w.firstPSN = qp.nextPSN
			switch {
			case w.wr.Opcode.IsAtomic() || w.wr.Opcode == wr.AtomicWrite:
				w.npsn = 1
			default:
				// A READ request takes as many PSNs as its responses
				// (IBTA §9.7.1; rxe update_wqe_psn).
				w.npsn = NPackets(w.length, pmtu)
			}
			w.lastPSN = bth.PSNAdd(w.firstPSN, w.npsn-1)
			qp.nextPSN = bth.PSNAdd(qp.nextPSN, w.npsn)
			w.state = wqeStarted
			w.readDone = 0
			qp.sqPkt = 0
			if needsRDResource(w.wr.Opcode) {
				qp.rdOutstanding++
			}
		}
		psn := bth.PSNAdd(w.firstPSN, qp.sqPkt)
		if bth.PSNDiff(psn, qp.compPSN) >= maxUnackedPSNs {
			return true // window full: an ACK reopens it
		}
		if bth.PSNDiff(psn, qp.maxSentPSN) <= 0 && qp.sentAny {
			qp.stats.Retransmits++
		} else {
			qp.maxSentPSN, qp.sentAny = psn, true
			qp.rtt.start(qp, psn)
			if w.wr.Opcode == wr.RDMARead {
				qp.maxSentPSN = w.lastPSN
			}
		}
		if w.wr.Opcode == wr.RDMARead {
			w.reRead = qp.sqPkt
		}
		if !qp.buildRequest(w, psn) {
			return true // the WQE failed locally; the QP is in ERR
		}
		lastPkt := w.wr.Opcode == wr.RDMARead || w.wr.Opcode.IsAtomic() || w.wr.Opcode == wr.AtomicWrite || qp.sqPkt+1 >= w.npsn
		if lastPkt {
			qp.sqSendOff++
			qp.sqPkt = 0
		} else {
			qp.sqPkt++
		}
		if qp.retryDeadline.IsZero() && qp.path.Timeout != 0 {
			qp.retryDeadline = e.now.Add(qp.ackTimeout())
			qp.updateTimerSet()
		}
	}
	return false
}

// buildRequest writes packet number qp.sqPkt of w at PSN psn.
func (qp *rcQP) buildRequest(w *sendWQE, psn uint32) bool {
	pmtu := qp.path.PMTU
	f := bth.Fields{BTH: bth.BTHFields{PKey: 0xffff, DestQP: qp.path.DestQPN, PSN: psn}}
	k := qp.sqPkt
	op := w.wr.Opcode
	var off, plen int
	switch {
	case op == wr.RDMARead:
		// A go-back-N re-read asks only for what is missing (rxe req_retry).
		off = k * pmtu
		f.BTH.Opcode = bth.RCReadRequest
		f.BTH.AckReq = true
		f.VA, f.RKey, f.DMALen = w.wr.RemoteAddr+uint64(off), w.wr.RKey, uint32(w.length-off)
	case op.IsAtomic():
		f.BTH.Opcode = bth.RCCompareSwap
		f.SwapAdd, f.Compare = w.wr.Swap, w.wr.CompareAdd
		if op == wr.AtomicFetchAndAdd {
			f.BTH.Opcode = bth.RCFetchAdd
			f.SwapAdd, f.Compare = w.wr.CompareAdd, 0
		}
		f.BTH.AckReq = true
		f.VA, f.RKey = w.wr.RemoteAddr, w.wr.RKey
	case op == wr.AtomicWrite:
		f.BTH.Opcode = bth.RCAtomicWrite
		f.BTH.AckReq = true
		f.VA, f.RKey, f.DMALen = w.wr.RemoteAddr, w.wr.RKey, 8
		plen = 8
	default:
		off = k * pmtu
		plen = min(pmtu, w.length-off)
		first, last := k == 0, k == w.npsn-1
		f.BTH.Opcode = SegOpcode(op, first, last)
		f.BTH.AckReq = last || k%ackReqEvery == ackReqEvery-1
		f.BTH.SE = last && w.wr.Flags&wr.Solicited != 0 && (op.IsSend() || op == wr.RDMAWriteWithImm)
		if op.IsWrite() && first {
			f.VA, f.RKey, f.DMALen = w.wr.RemoteAddr, w.wr.RKey, uint32(w.length)
		}
		f.Imm = w.wr.Imm
		f.InvRKey = w.wr.InvRKey
	}
	buf := qp.newPacket()
	n := bth.WriteHeaders(buf, &f, plen)
	hdr := f.BTH.Opcode.Info().HdrLen
	var err error
	switch {
	case op == wr.AtomicWrite:
		copy(buf[hdr:], w.wr.AtomicWrite[:])
	case plen == 0:
	case w.isInline:
		copy(buf[hdr:hdr+plen], w.inline[off:])
	default:
		err = gather(qp.e.mrs, qp.cfg.PD, w.sgl, off, buf[hdr:hdr+plen])
	}
	if err != nil {
		// A bad lkey is the local protection error of IBV_WC_LOC_PROT_ERR;
		// the packet is not sent and the QP goes to ERR (IBTA §10.8.3.1).
		qp.e.unbuild()
		qp.completeHead(LocalErrStatus(err), 0)
		qp.toError("local protection error on send: " + err.Error())
		return false
	}
	qp.sent(n)
	return true
}

// needsRDResource: operations limited by max_rd_atomic (IBTA §9.5: RDMA
// READ and atomics; IBTA 1.5 adds ATOMIC_WRITE).
func needsRDResource(o wr.Opcode) bool {
	return o == wr.RDMARead || o.IsAtomic() || o == wr.AtomicWrite
}
