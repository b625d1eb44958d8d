package engine

import (
	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/memreg"
	"github.com/softroce/softroce/qpstate"
	"github.com/softroce/softroce/wr"
)

// Remote is the QP's view of the key table for a peer's requests: its PD
// and its number, so type 2 windows bound to another QP are refused.
func (qp *QP) Remote() memreg.Remote { return qp.e.mrs.Remote(qp.Config.PD, qp.num) }

// execLocal executes a LOCAL_INV or BIND_MW work request when the
// requester reaches it, in send-queue order; it takes no PSN. The status
// is kept in the WQE until the WQE is the oldest, when it completes
// (rxe_do_local_ops: MW_BIND_ERR for a failed bind, LOC_QP_OP_ERR for a
// failed invalidate, and the QP goes to ERR).
func (qp *QP) execLocal(w *SendWQE) {
	w.FirstPSN, w.NPSN = qp.NextPSN, 0
	w.LastPSN = bth.PSNAdd(w.FirstPSN, -1)
	w.State = WQEStarted
	w.localSt = cq.Success
	switch w.WR.Opcode {
	case wr.LocalInv:
		if err := qp.e.mrs.Invalidate(qp.Config.PD, w.WR.InvRKey); err != nil {
			w.localSt, w.localErr = cq.LocQPOpErr, err.Error()
		}
	case wr.BindMW:
		b := w.WR.Bind
		mb := memreg.Bind{MRKey: b.MRKey, Addr: b.Addr, Length: b.Length, Access: memreg.Access(b.Access), RKey: b.RKey}
		var err error
		if w.bindMW != nil {
			// The bind-MW verb names its type 1 window itself, not by key:
			// binds posted before it may not have run yet.
			mb.Verb = true
			_, err = qp.e.mrs.BindMW(w.bindMW, qp.Config.PD, qp.num, mb)
		} else {
			_, err = qp.e.mrs.BindMWKey(b.MWKey, qp.Config.PD, qp.num, mb)
		}
		if err != nil {
			w.localSt, w.localErr = cq.MWBindErr, err.Error()
		}
	}
}

// drainLocal completes the executed local work requests at the head of the
// send queue, now that everything before them has completed.
func (qp *QP) DrainLocal() {
	for qp.SQCount > 0 {
		w := &qp.SQ[qp.SQHead]
		if !w.WR.Opcode.IsLocal() || w.State != WQEStarted {
			return
		}
		st, why := w.localSt, w.localErr
		ok := qp.PushSendWC(w, st, 0)
		w.State = WQEDone
		qp.RetireHead()
		switch {
		case !ok:
			qp.ToError("send CQ overrun")
			return
		case st != cq.Success:
			qp.ToError(w.WR.Opcode.String() + ": " + why)
			return
		}
	}
}

// stepLocal runs the local work request w (LOCAL_INV, BIND_MW) that a
// requester's walk of the send queue reached: it executes it once (after
// the READs and atomics before it, if fenced), completes it at once when
// nothing precedes it, or else steps over it, to complete once it is the
// oldest. It reports whether the requester stops here.
func (qp *QP) StepLocal(w *SendWQE) (stop bool) {
	if w.State == WQEQueued {
		if w.WR.Flags&wr.Fence != 0 && qp.RDOutstanding > 0 {
			return true // IBV_SEND_FENCE: wait for prior READ/atomics
		}
		qp.execLocal(w)
	}
	switch {
	case qp.SQSendOff == 0:
		qp.DrainLocal() // nothing before it: complete it now
		if qp.state != qpstate.RTS {
			return true
		}
	case w.localSt != cq.Success:
		return true // completes in error once it is the oldest
	default:
		qp.SQSendOff++
	}
	return false
}
