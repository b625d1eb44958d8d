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
func (rcService) request(qp *QP, budget int) bool { return qp.transmit(budget) }

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
