package rc

import (
	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/qpstate"
	"github.com/softroce/softroce/wr"
)

// rcService is the Reliable Connection service: requester.go,
// responder.go and completer.go.
type rcService struct{}

func init() { register(qpstate.RC, rcService{}) }

func (rcService) transport() bth.Transport        { return bth.TransportRC }
func (rcService) init(*QP)                        {}
func (rcService) checkPost(*QP, *wr.SendWR) error { return nil }
func (rcService) enterRTR(*QP)                    {}
func (rcService) purgeOnError() bool              { return true }

// progress sends a pending ACK first, then queued READ responses, then
// requests; the requester runs even when the responder's budget ran out.
func (rcService) progress(qp *QP, budget int) bool {
	if qp.ackPending {
		qp.sendAck()
	}
	respDone := qp.resp.transmit(qp, budget)
	return qp.transmit(budget) && respDone
}

// batchDone sends the ACK coalesced over the batch: one per QP, for the
// newest PSN that asked for one (the MSN covers everything before it).
func (rcService) batchDone(qp *QP) {
	if qp.ackPending {
		qp.sendAck()
	}
}

func (rcService) timers(qp *QP) { qp.checkTimers() }

// stop drops queued READ responses, the request backlog, a pending ACK
// and a go-back-N in progress.
func (rcService) stop(qp *QP) {
	qp.resp.jobs = qp.resp.jobs[:0]
	qp.releaseBacklog()
	qp.ackPending = false
	qp.retrying = false
}

// destroy lets go of the backlog's slots (releaseBacklog, run by stop,
// already gave back their buffers).
func (rcService) destroy(qp *QP) { qp.resp.backlog, qp.resp.backlogLen = nil, nil }

func (rcService) receive(qp *QP, pk *nic.Packet, p *bth.Packet) {
	qp.receiveConnected(pk, p, receiveRC)
}

// receiveRC takes a request packet to the responder, or, while READ
// responses are still queued, to the backlog behind them.
func receiveRC(qp *QP, pk *nic.Packet, p *bth.Packet) {
	if len(qp.resp.jobs) > 0 {
		if !qp.deferPacket(pk.Bytes()) {
			qp.stats.Dropped++
		}
		return
	}
	qp.respond(p)
}
