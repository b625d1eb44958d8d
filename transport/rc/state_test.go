package rc

import (
	"fmt"

	"github.com/softroce/softroce/transport/engine"
)

// rcOf is the RC service state of qp.
func rcOf(qp *engine.QP) *rcQP { return qp.Service().(*rcQP) }

// debug describes qp's send queue and, for an RC QP, its completer's and
// responder's state, for Sim.Dump.
func debug(qp *engine.QP) string {
	var r responder
	var compPSN uint32
	if rq, ok := qp.Service().(*rcQP); ok {
		r, compPSN = rq.resp, rq.compPSN
	}
	return fmt.Sprintf("QP %d state %v sq=%d sendOff=%d pkt=%d comp=%d next=%d rd=%d/%d retryDL=%v rnrDL=%v | ePSN=%d msn=%d jobs=%d backlog=%d cur=%v",
		qp.Num(), qp.StateLocked(), qp.SQCount, qp.SQSendOff, qp.SQPkt, compPSN, qp.NextPSN, qp.RDOutstanding, qp.Attr.MaxRDAtomic,
		!qp.RetryDeadline.IsZero(), !qp.RNRDeadline.IsZero(), r.ePSN, r.msn, len(r.jobs), r.blN, qp.Msg.Active)
}
