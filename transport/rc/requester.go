package rc

import (
	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/qpstate"
	"github.com/softroce/softroce/transport/engine"
	"github.com/softroce/softroce/wr"
)

// Defaults follow rxe where IBTA leaves a choice, but for the window.
const (
	// maxUnackedPSNs and maxUnackedBytes bound the requester's window of
	// unacknowledged packets: 512 PSNs, and no more than 1 MiB of payload
	// (256 PSNs at a path MTU of 4096). rxe keeps 128 PSNs
	// (RXE_MAX_UNACKED_PSNS); that window held the requester idle for
	// ACKs, on a veth pair at MTU 4096 (512 KiB) and across two guests
	// at MTU 1024 (128 KiB): docs/performance.md, "The requester's
	// window". The bytes bound keeps what several QPs have in flight
	// within a receiver's socket buffer.
	maxUnackedPSNs  = 512
	maxUnackedBytes = 1 << 20
	// ackReqEvery sets AckReq inside long messages so the window keeps
	// moving: every 64th packet, as rxe does. Each ACK costs the responder
	// a send and its guest kernel's receive work for what arrived
	// meanwhile; every 32nd doubled the ACKs of a 64 KiB message and was
	// slower across two guests.
	ackReqEvery = 64
)

// unackedWindow is the requester's window in PSNs at path MTU pmtu.
func unackedWindow(pmtu int) int {
	return min(maxUnackedPSNs, maxUnackedBytes/max(pmtu, 1))
}

// transmit is the requester: it sends new and go-back-N packets from the
// send queue until the budget, the PSN window or max_rd_atomic stops it.
// It reports whether it has nothing more to send right now.
func (qp *rcQP) transmit(budget int) bool {
	if qp.StateLocked() != qpstate.RTS || !qp.RNRDeadline.IsZero() {
		return true
	}
	pmtu := qp.Attr.PMTU
	window := unackedWindow(pmtu)
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
			if needsRDResource(w.WR.Opcode) && qp.RDOutstanding >= qp.Attr.MaxRDAtomic {
				return true // resumes when a READ/atomic completes
			}
			if w.WR.Flags&wr.Fence != 0 && qp.RDOutstanding > 0 {
				return true // IBV_SEND_FENCE: wait for prior READ/atomics
			}
			w.FirstPSN = qp.NextPSN
			switch {
			case w.WR.Opcode.IsAtomic() || w.WR.Opcode == wr.AtomicWrite:
				w.NPSN = 1
			default:
				// A READ request takes as many PSNs as its responses
				// (IBTA §9.7.1; rxe update_wqe_psn).
				w.NPSN = engine.NPackets(w.Length, pmtu)
			}
			w.LastPSN = bth.PSNAdd(w.FirstPSN, w.NPSN-1)
			qp.NextPSN = bth.PSNAdd(qp.NextPSN, w.NPSN)
			w.State = engine.WQEStarted
			w.ReadDone = 0
			qp.SQPkt = 0
			if needsRDResource(w.WR.Opcode) {
				qp.RDOutstanding++
			}
		}
		psn := bth.PSNAdd(w.FirstPSN, qp.SQPkt)
		if bth.PSNDiff(psn, qp.compPSN) >= window {
			return true // window full: an ACK reopens it
		}
		if !qp.PaceReady() {
			return true // congestion control holds the QP: its pacer's deadline kicks it
		}
		if bth.PSNDiff(psn, qp.maxSentPSN) <= 0 && qp.sentAny {
			qp.Counters.Retransmits++
		} else {
			qp.maxSentPSN, qp.sentAny = psn, true
			qp.rtt.start(qp, psn)
			if w.WR.Opcode == wr.RDMARead {
				qp.maxSentPSN = w.LastPSN
			}
		}
		if w.WR.Opcode == wr.RDMARead {
			w.ReRead = qp.SQPkt
		}
		if !qp.buildRequest(w, psn) {
			return true // the WQE failed locally; the QP is in ERR
		}
		lastPkt := w.WR.Opcode == wr.RDMARead || w.WR.Opcode.IsAtomic() || w.WR.Opcode == wr.AtomicWrite || qp.SQPkt+1 >= w.NPSN
		if lastPkt {
			qp.SQSendOff++
			qp.SQPkt = 0
		} else {
			qp.SQPkt++
		}
		if qp.RetryDeadline.IsZero() && qp.Attr.Timeout != 0 {
			qp.RetryDeadline = qp.Now().Add(qp.ackTimeout())
			qp.UpdateTimerSet()
		}
	}
	return false
}

// buildRequest writes packet number qp.sqPkt of w at PSN psn.
func (qp *rcQP) buildRequest(w *engine.SendWQE, psn uint32) bool {
	pmtu := qp.Attr.PMTU
	f := bth.Fields{BTH: bth.BTHFields{PKey: 0xffff, DestQP: qp.Attr.DestQPN, PSN: psn}}
	k := qp.SQPkt
	op := w.WR.Opcode
	var off, plen int
	switch {
	case op == wr.RDMARead:
		// A go-back-N re-read asks only for what is missing (rxe req_retry).
		off = k * pmtu
		f.BTH.Opcode = bth.RCReadRequest
		f.BTH.AckReq = true
		f.VA, f.RKey, f.DMALen = w.WR.RemoteAddr+uint64(off), w.WR.RKey, uint32(w.Length-off)
	case op.IsAtomic():
		f.BTH.Opcode = bth.RCCompareSwap
		f.SwapAdd, f.Compare = w.WR.Swap, w.WR.CompareAdd
		if op == wr.AtomicFetchAndAdd {
			f.BTH.Opcode = bth.RCFetchAdd
			f.SwapAdd, f.Compare = w.WR.CompareAdd, 0
		}
		f.BTH.AckReq = true
		f.VA, f.RKey = w.WR.RemoteAddr, w.WR.RKey
	case op == wr.AtomicWrite:
		f.BTH.Opcode = bth.RCAtomicWrite
		f.BTH.AckReq = true
		f.VA, f.RKey, f.DMALen = w.WR.RemoteAddr, w.WR.RKey, 8
		plen = 8
	default:
		off = k * pmtu
		plen = min(pmtu, w.Length-off)
		first, last := k == 0, k == w.NPSN-1
		f.BTH.Opcode = engine.SegOpcode(op, first, last)
		f.BTH.AckReq = last || k%ackReqEvery == ackReqEvery-1
		f.BTH.SE = last && w.WR.Flags&wr.Solicited != 0 && (op.IsSend() || op == wr.RDMAWriteWithImm)
		if op.IsWrite() && first {
			f.VA, f.RKey, f.DMALen = w.WR.RemoteAddr, w.WR.RKey, uint32(w.Length)
		}
		f.Imm = w.WR.Imm
		f.InvRKey = w.WR.InvRKey
	}
	buf := qp.NewPacket()
	n := bth.WriteHeaders(buf, &f, plen)
	hdr := f.BTH.Opcode.Info().HdrLen
	var err error
	switch {
	case op == wr.AtomicWrite:
		copy(buf[hdr:], w.WR.AtomicWrite[:])
	case plen == 0:
	case w.IsInline:
		copy(buf[hdr:hdr+plen], w.Inline[off:])
	default:
		err = engine.Gather(qp.MRs(), qp.Config.PD, w.SGL, off, buf[hdr:hdr+plen])
	}
	if err != nil {
		// A bad lkey is the local protection error of IBV_WC_LOC_PROT_ERR;
		// the packet is not sent and the QP goes to ERR (IBTA §10.8.3.1).
		qp.Unbuild()
		qp.completeHead(engine.LocalErrStatus(err), 0)
		qp.ToError("local protection error on send: " + err.Error())
		return false
	}
	qp.Sent(n)
	qp.PaceSent(n)
	return true
}

// needsRDResource: operations limited by max_rd_atomic (IBTA §9.5: RDMA
// READ and atomics; IBTA 1.5 adds ATOMIC_WRITE).
func needsRDResource(o wr.Opcode) bool {
	return o == wr.RDMARead || o.IsAtomic() || o == wr.AtomicWrite
}
