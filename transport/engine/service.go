package engine

import (
	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/qpstate"
	"github.com/softroce/softroce/wr"
)

// Service is one QP's transport service, what differs between the
// services the engine hosts: the engine keeps the QP table, queues, SRQs,
// transmit batches and timers, and calls a QP's service for its
// requester, its packet receipt and its post-time rules (the split of
// rxe, whose rxe_req.c, rxe_resp.c and rxe_comp.c run over one
// rxe_qp.c). A service registers a constructor with Register; each QP
// gets its own Service value when it is created, holding the service's
// state of that QP. All methods run under the engine lock.
type Service interface {
	// Transport is the opcode prefix of the service's packets: a packet
	// of another one is dropped before Receive sees it.
	Transport() bth.Transport
	// CheckPost checks the service's rules for a send work request at
	// post time and keeps what the service needs of it in send-queue
	// slot SQTail.
	CheckPost(swr *wr.SendWR) error
	// Receive handles one received packet (its transport already
	// checked).
	Receive(pk *nic.Packet, p *bth.Packet)
	// Progress builds what the QP has to send (a coalesced ACK,
	// responses, then requests from the send queue) up to budget packets
	// in the transmit batch, and reports whether it has nothing more to
	// send now.
	Progress(budget int) bool
	// BatchDone ends a batch of received packets: an answer coalesced
	// over the batch leaves now.
	BatchDone()
	// Timers runs the QP's expired timers (it is in the engine's timer
	// set).
	Timers()
	// PathChanged follows new path attributes (RC sizes its READ and atomic
	// resources from them).
	PathChanged()
	// EnterRTR arms the responder's sequencing as the QP enters RTR.
	EnterRTR()
	// EnterRTS starts the requester as the QP moves from RTR to RTS, at
	// the PSN in NextPSN.
	EnterRTS()
	// Reset clears the service's state as the QP enters RESET.
	Reset()
	// Stop drops the responder's queued answers and the requester's
	// retry state, as the QP stops sending (ERR, RESET, destroy); the
	// engine disarms the timers and takes back built packets itself.
	Stop()
	// Destroy releases what the service holds for a destroyed QP.
	Destroy()
	// PurgeOnError reports whether a QP that fails takes back the
	// packets it built and Progress has not handed out (see toError).
	PurgeOnError() bool
}

// NewService makes the service of a new QP.
type NewService func(qp *QP) Service

// services maps a QP type to its service's constructor.
var services [qpstate.UD + 1]NewService

// Register makes f the constructor of the service of QPs of type t.
func Register(t qpstate.Type, f NewService) { services[t] = f }

// serviceOf is the service constructor of QP type t, nil if none is
// registered.
func serviceOf(t qpstate.Type) NewService {
	if int(t) >= len(services) {
		return nil
	}
	return services[t]
}

// Service is the QP's service value (for tests and diagnostics that look
// at a service's own state).
func (qp *QP) Service() Service { return qp.svc }
