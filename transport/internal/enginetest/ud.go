package enginetest

import (
	"github.com/softroce/softroce/qpstate"
	"github.com/softroce/softroce/transport/engine"
	"github.com/softroce/softroce/wr"
)

// QKey is the Q_Key of the UD QPs UDQPs makes, unless told another.
const QKey = 0x11223344

// UDOpts tune UDQPs.
type UDOpts struct {
	QKey [2]uint32 // zero: QKey
	SRQ  [2]*engine.SRQ
	PMTU int // zero: 1024
}

// UDQPs makes a UD QP on each endpoint and brings both to RTS.
func (s *Sim) UDQPs(o UDOpts) [2]*engine.QP {
	if o.PMTU == 0 {
		o.PMTU = 1024
	}
	var qps [2]*engine.QP
	for i, ep := range s.EP {
		qp, err := ep.E.CreateQP(engine.QPConfig{Type: qpstate.UD, PD: ep.PD, SendCQ: ep.SCQ, RecvCQ: ep.RCQ, MaxSendWR: 64, MaxRecvWR: 64,
			MaxSendSGE: 2, MaxRecvSGE: 2, MaxInline: 64, SRQ: o.SRQ[i]})
		if err != nil {
			s.T.Fatal(err)
		}
		qk := o.QKey[i]
		if qk == 0 {
			qk = QKey
		}
		qp.SetState(qpstate.Init)
		qp.SetPath(engine.Path{PMTU: o.PMTU, QKey: qk, SQPSN: uint32(100 * (i + 1))})
		qp.SetState(qpstate.RTR)
		qp.SetState(qpstate.RTS)
		qps[i] = qp
	}
	return qps
}

// UDSend is a signaled UD SEND work request from endpoint from to qp dst
// with Q_Key QKey.
func (s *Sim) UDSend(from int, dst *engine.QP, id uint64, sge wr.SGE) *wr.SendWR {
	return &wr.SendWR{ID: id, Opcode: wr.Send, Flags: wr.Signaled, SGL: []wr.SGE{sge},
		AH: &wr.AH{Remote: s.EP[1-from].Addr}, RemoteQPN: dst.Num(), RemoteQKey: QKey}
}
