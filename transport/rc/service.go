package rc

import (
	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/qpstate"
	"github.com/softroce/softroce/wr"
)

// service is what differs between the transport services the engine
// hosts: the engine keeps the QP table, queues, SRQs, transmit batches and
// timers, and calls a QP's service for its requester, its packet receipt
// and its post-time rules (the split of rxe, whose rxe_req.c, rxe_resp.c
// and rxe_comp.c run over one rxe_qp.c). Each service registers itself
// with register; a QP is bound to its service when it is created. All
// methods run under the engine lock.
type service interface {
	// transport is the opcode prefix of the service's packets: a packet
	// of another one is dropped before receive sees it.
	transport() bth.Transport
	// init sets up the service's own state of a new QP.
	init(qp *QP)
	// checkPost checks the service's rules for a send work request at
	// post time and keeps what the service needs of it in send-queue
	// slot qp.sqTail.
	checkPost(qp *QP, swr *wr.SendWR) error
	// receive handles one received packet for qp (its transport already
	// checked).
	receive(qp *QP, pk *nic.Packet, p *bth.Packet)
	// progress builds what qp has to send (a coalesced ACK, responses,
	// then requests from the send queue) up to budget packets in the
	// transmit batch, and reports whether it has nothing more to send now.
	progress(qp *QP, budget int) bool
	// batchDone ends a batch of received packets for qp: an answer
	// coalesced over the batch leaves now.
	batchDone(qp *QP)
	// timers runs qp's expired timers (qp is in the engine's timer set).
	timers(qp *QP)
	// stop drops the responder's queued answers and the requester's
	// retry state, as qp stops sending (ERR, RESET, destroy); the engine
	// disarms the timers and takes back built packets itself.
	stop(qp *QP)
	// destroy releases what the service holds for a destroyed qp.
	destroy(qp *QP)
	// enterRTR arms the responder's sequencing as the QP enters RTR.
	enterRTR(qp *QP)
	// purgeOnError reports whether a QP that fails takes back the packets
	// it built and Progress has not handed out (see toError).
	purgeOnError() bool
}

// services maps a QP type to its service.
var services [qpstate.UD + 1]service

// register makes s the service of QPs of type t.
func register(t qpstate.Type, s service) { services[t] = s }

// serviceOf is the service of QP type t, nil if none is registered.
func serviceOf(t qpstate.Type) service {
	if int(t) >= len(services) {
		return nil
	}
	return services[t]
}

// receiveConnected is the receipt of a packet common to the connected
// services (RC, UC): only from the peer of the address vector, and only in
// a state that takes it; request handles a request packet, a response goes
// to the completer.
func (qp *QP) receiveConnected(pk *nic.Packet, p *bth.Packet, request func(*QP, *nic.Packet, *bth.Packet)) {
	e := qp.e
	if qp.path.Remote.IsValid() && pk.Remote.Addr() != qp.path.Remote.Addr() {
		e.stats.RxWrongSource++
		return
	}
	qp.stats.RxPackets++
	if p.Info.Request {
		if qp.state != qpstate.RTR && qp.state != qpstate.RTS && qp.state != qpstate.SQD {
			e.stats.RxUnknownQP++
			return
		}
		qp.noteCommEst()
		request(qp, pk, p)
		return
	}
	if qp.state != qpstate.RTS && qp.state != qpstate.SQD {
		e.stats.RxUnknownQP++
		return
	}
	qp.noteCommEst()
	qp.complete(p)
}
