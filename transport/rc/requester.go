package rc

import (
	"errors"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/memreg"
	"github.com/softroce/softroce/qpstate"
	"github.com/softroce/softroce/transport/uc"
	"github.com/softroce/softroce/wr"
)

// npackets is how many packets (and PSNs) a message of n bytes takes at
// the given path MTU: at least one, even for zero bytes.
func npackets(n, pmtu int) int {
	if n <= pmtu {
		return 1
	}
	return (n + pmtu - 1) / pmtu
}

// transmit is the requester: it sends new and go-back-N packets from the
// send queue until the budget, the PSN window or max_rd_atomic stops it.
// It reports whether it has nothing more to send right now.
func (qp *QP) transmit(budget int) bool {
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
			if w.state == wqeQueued {
				if w.wr.Flags&wr.Fence != 0 && qp.rdOutstanding > 0 {
					return true // IBV_SEND_FENCE: wait for prior READ/atomics
				}
				qp.execLocal(w)
			}
			switch {
			case qp.sqSendOff == 0:
				qp.drainLocal() // nothing before it: complete it now
				if qp.state != qpstate.RTS {
					return true
				}
			case w.localSt != cq.Success:
				return true // completes in error once it is the oldest
			default:
				qp.sqSendOff++
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
				w.npsn = npackets(w.length, pmtu)
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
		if bth.PSNDiff(psn, qp.compPSN) >= maxUnackedPSNs && !qp.isUC() {
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
		if qp.isUC() { // UC: complete on the last packet; no ACK timer
			if lastPkt {
				qp.ucSent()
			}
			continue
		}
		if qp.retryDeadline.IsZero() && qp.path.Timeout != 0 {
			qp.retryDeadline = e.now.Add(qp.ackTimeout())
			qp.updateTimerSet()
		}
	}
	return false
}

// buildRequest writes packet number qp.sqPkt of w at PSN psn.
func (qp *QP) buildRequest(w *sendWQE, psn uint32) bool {
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
		f.BTH.Opcode = segOpcode(op, first, last)
		f.BTH.AckReq = last || k%ackReqEvery == ackReqEvery-1
		f.BTH.SE = last && w.wr.Flags&wr.Solicited != 0 && (op.IsSend() || op == wr.RDMAWriteWithImm)
		if qp.isUC() { // UC: the same segment under the UC prefix, never AckReq
			f.BTH.Opcode, f.BTH.AckReq = uc.Opcode(f.BTH.Opcode), false
		}
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
		st := cq.LocProtErr
		if !errors.Is(err, memreg.ErrLocalProtection) {
			st = cq.LocLenErr
		}
		qp.completeHead(st, 0)
		qp.toError("local protection error on send: " + err.Error())
		return false
	}
	qp.sent(n)
	return true
}

// segOpcode picks the RC opcode for a SEND or WRITE segment.
func segOpcode(op wr.Opcode, first, last bool) bth.Opcode {
	only := first && last
	switch op {
	case wr.Send:
		return pick(only, first, last, bth.RCSendOnly, bth.RCSendFirst, bth.RCSendLast)
	case wr.SendWithImm:
		return pick(only, first, last, bth.RCSendOnlyImm, bth.RCSendFirst, bth.RCSendLastImm)
	case wr.SendWithInv:
		return pick(only, first, last, bth.RCSendOnlyInv, bth.RCSendFirst, bth.RCSendLastInv)
	case wr.RDMAWrite:
		return pick(only, first, last, bth.RCWriteOnly, bth.RCWriteFirst, bth.RCWriteLast)
	case wr.RDMAWriteWithImm:
		return pick(only, first, last, bth.RCWriteOnlyImm, bth.RCWriteFirst, bth.RCWriteLastImm)
	}
	panic("rc: segOpcode on " + op.String())
}

func pick(only, first, last bool, o, f, l bth.Opcode) bth.Opcode {
	switch {
	case only:
		return o
	case first:
		return f
	case last:
		return l
	}
	// MIDDLE is FIRST+1 for both SEND and WRITE.
	return f + 1
}

// gather copies len(dst) bytes starting at byte off of the SGL into dst.
func gather(mrs *memreg.Table, pd *memreg.PD, sgl []wr.SGE, off int, dst []byte) error {
	for _, s := range sgl {
		if len(dst) == 0 {
			return nil
		}
		l := int(s.Length)
		if off >= l {
			off -= l
			continue
		}
		n := min(l-off, len(dst))
		if err := mrs.LocalRead(pd, s.LKey, s.Addr+uint64(off), dst[:n]); err != nil {
			return err
		}
		dst = dst[n:]
		off = 0
	}
	if len(dst) != 0 {
		return errShortSGL
	}
	return nil
}

// scatter copies src into the SGL starting at byte off.
func scatter(mrs *memreg.Table, pd *memreg.PD, sgl []wr.SGE, off int, src []byte) error {
	for _, s := range sgl {
		if len(src) == 0 {
			return nil
		}
		l := int(s.Length)
		if off >= l {
			off -= l
			continue
		}
		n := min(l-off, len(src))
		if err := mrs.LocalWrite(pd, s.LKey, s.Addr+uint64(off), src[:n]); err != nil {
			return err
		}
		src = src[n:]
		off = 0
	}
	if len(src) != 0 {
		return errShortSGL
	}
	return nil
}

var errShortSGL = errors.New("rc: data longer than the scatter/gather list")

// needsRDResource: operations limited by max_rd_atomic (IBTA §9.5: RDMA
// READ and atomics; IBTA 1.5 adds ATOMIC_WRITE).
func needsRDResource(o wr.Opcode) bool {
	return o == wr.RDMARead || o.IsAtomic() || o == wr.AtomicWrite
}
