package rc

import (
	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/qpstate"
	"github.com/softroce/softroce/transport/engine"
	"github.com/softroce/softroce/wr"
)

// rcQP is an RC QP: the engine's QP and the state of RC's requester
// (requester.go), completer (completer.go) and responder (responder.go).
type rcQP struct {
	*engine.QP
	compPSN            uint32 // oldest unacknowledged PSN
	retryLeft, rnrLeft int
	retryFrom          uint32 // compPSN of the go-back-N in progress
	retrying           bool
	rtt                rttEstimator // Path.AdaptiveTimeout
	maxSentPSN         uint32       // highest PSN sent (a READ: its last response PSN); beyond it, responses are ghosts
	sentAny            bool

	resp       responder
	ackPending bool
	ackPSN     uint32
}

func init() { engine.Register(qpstate.RC, func(qp *engine.QP) engine.Service { return &rcQP{QP: qp} }) }

func (*rcQP) Transport() bth.Transport   { return bth.TransportRC }
func (*rcQP) CheckPost(*wr.SendWR) error { return nil }
func (*rcQP) PurgeOnError() bool         { return true }
func (qp *rcQP) Timers()                 { qp.checkTimers() }

// ExpectedPSN is the responder's next expected PSN (engine.QP.PSNs).
func (qp *rcQP) ExpectedPSN() uint32 { return qp.resp.ePSN }

// PathChanged sizes the responder's READ and atomic resources for
// max_dest_rd_atomic.
func (qp *rcQP) PathChanged() {
	if n := pow2(qp.Attr.MaxDestRDAtomic); len(qp.resp.resources) != n {
		qp.resp.resources = make([]rdResource, n)
		qp.resp.resNext = 0
		qp.resp.jobs = qp.resp.jobs[:0]
	}
}

func pow2(n int) int {
	p := 1
	for p < n {
		p <<= 1
	}
	return p
}

// EnterRTR arms the responder at RQPSN.
func (qp *rcQP) EnterRTR() {
	qp.resp.ePSN = qp.Attr.RQPSN & bth.PSNMask
	qp.resp.msn = 0
}

// EnterRTS starts the completer at the requester's first PSN, with the
// full retry counts.
func (qp *rcQP) EnterRTS() {
	qp.compPSN = qp.NextPSN
	qp.retryLeft = int(qp.Attr.RetryCnt)
	qp.rnrLeft = int(qp.Attr.RNRRetry)
}

// Reset forgets the round-trip estimate, the retry state and the
// responder's sequencing; the READ and atomic resources keep their size
// but are emptied.
func (qp *rcQP) Reset() {
	qp.retrying, qp.sentAny, qp.maxSentPSN = false, false, 0
	qp.rtt = rttEstimator{}
	qp.resp = responder{resources: qp.resp.resources, backlog: qp.resp.backlog, backlogLen: qp.resp.backlogLen}
	clear(qp.resp.resources)
}

// Progress sends a pending ACK first, then queued READ responses, then
// requests; the requester runs even when the responder's budget ran out.
func (qp *rcQP) Progress(budget int) bool {
	if qp.ackPending {
		qp.sendAck()
	}
	respDone := qp.resp.transmit(qp, budget)
	return qp.transmit(budget) && respDone
}

// BatchDone sends the ACK coalesced over the batch: one per QP, for the
// newest PSN that asked for one (the MSN covers everything before it).
func (qp *rcQP) BatchDone() {
	if qp.ackPending {
		qp.sendAck()
	}
}

// Stop drops queued READ responses, the request backlog, a pending ACK
// and a go-back-N in progress.
func (qp *rcQP) Stop() {
	qp.resp.jobs = qp.resp.jobs[:0]
	qp.releaseBacklog()
	qp.ackPending = false
	qp.retrying = false
}

// Destroy lets go of the backlog's slots (releaseBacklog, run by Stop,
// already gave back their buffers).
func (qp *rcQP) Destroy() { qp.resp.backlog, qp.resp.backlogLen = nil, nil }

// Receive takes a request to the responder, or, while READ responses are
// still queued, to the backlog behind them; a response goes to the
// completer.
func (qp *rcQP) Receive(pk *nic.Packet, p *bth.Packet) {
	if !qp.AcceptConnected(pk, p) {
		return
	}
	if !p.Info.Request {
		qp.complete(p)
		return
	}
	if len(qp.resp.jobs) > 0 {
		if !qp.deferPacket(pk.Bytes()) {
			qp.Counters.Dropped++
		}
		return
	}
	qp.respond(p)
}
