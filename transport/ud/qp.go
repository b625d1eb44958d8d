package ud

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/memreg"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/qpstate"
	"github.com/softroce/softroce/transport/engine"
	"github.com/softroce/softroce/wr"
)

// The engine hosts UD QPs next to RC and UC ones: same QP table,
// send-queue ring, receive ring or SRQ, CQs and transmit batches. What
// differs is here: a UD send is one packet to the address handle of its work
// request, completed as it is handed out (no ACK, no retransmission); a
// UD receive is checked against the QP's Q_Key, lands behind a 40-byte
// GRH and completes at once. The wire rules themselves are in ud.go.

// udQP is a UD QP: the engine's QP and UD's own state of it.
type udQP struct {
	*engine.QP
	// ah[i] is the address vector of send-queue slot i, copied at post
	// time so the caller may reuse or free its address handle.
	ah []wr.AH
	// grh is scratch room for the GRH of a received datagram.
	grh [GRHLen]byte
}

// newUDQP makes room for an address vector per send-queue slot, so that
// posting does not allocate.
func newUDQP(qp *engine.QP) engine.Service {
	return &udQP{QP: qp, ah: make([]wr.AH, qp.Config.MaxSendWR)}
}

func init() { engine.Register(qpstate.UD, newUDQP) }

func (*udQP) Transport() bth.Transport { return bth.TransportUD }

// CheckPost checks the work request and copies its address vector.
func (qp *udQP) CheckPost(swr *wr.SendWR) error {
	if err := qp.checkSendUD(swr); err != nil {
		return err
	}
	qp.ah[qp.SQTail] = *swr.AH
	return nil
}

func (*udQP) PurgeOnError() bool          { return true }
func (qp *udQP) Progress(budget int) bool { return qp.transmitUD(budget) }
func (*udQP) PathChanged()                {}
func (*udQP) EnterRTR()                   {}
func (*udQP) EnterRTS()                   {}
func (*udQP) Reset()                      {}

// UD answers nothing and arms no timer.
func (*udQP) BatchDone() {}
func (*udQP) Timers()    {}
func (*udQP) Stop()      {}
func (*udQP) Destroy()   {}

// Receive takes a datagram from any sender: no source filter.
func (qp *udQP) Receive(pk *nic.Packet, p *bth.Packet) { qp.receiveUD(pk, p) }

// CreateGSI makes engine e's QP1 (the GSI QP for management datagrams),
// a UD QP in RESET whose receives accept only Q_Key 0x80010000. There is
// at most one: a second call fails with ErrQPNumInUse until it is
// destroyed.
func CreateGSI(e *engine.Engine, cfg engine.QPConfig) (*engine.QP, error) {
	cfg.Type = qpstate.UD
	return e.CreateQPNum(cfg, GSIQPN)
}

// checkSendUD checks at post time what a UD send work request must be:
// SEND or SEND_WITH_IMM with an address handle. A message longer than the
// MTU is accepted here and completes without a packet (transmitUD).
func (qp *udQP) checkSendUD(swr *wr.SendWR) error {
	if _, err := Opcode(swr.Opcode); err != nil {
		return fmt.Errorf("ud: UD QP %d: %w", qp.Num(), err)
	}
	if swr.AH == nil {
		return fmt.Errorf("ud: UD QP %d: send work request %d has no address handle", qp.Num(), swr.ID)
	}
	if !swr.AH.Remote.IsValid() {
		return fmt.Errorf("ud: UD QP %d: address handle has no destination", qp.Num())
	}
	if swr.RemoteQPN > bth.PSNMask {
		return fmt.Errorf("ud: UD QP %d: remote QPN %#x is not 24 bits", qp.Num(), swr.RemoteQPN)
	}
	return nil
}

// transmitUD is the UD requester: each WQE becomes one SEND_ONLY packet
// to its address handle and completes as the packet is built (a
// completion means the message was handed to the link, as with rxe). It
// reports whether the send queue is empty.
func (qp *udQP) transmitUD(budget int) bool {
	if qp.StateLocked() != qpstate.RTS {
		return true
	}
	for qp.Batched() < budget && qp.SQCount > 0 {
		i := qp.SQHead
		w := &qp.SQ[i]
		psn := qp.NextPSN
		qp.NextPSN = bth.PSNAdd(psn, 1)
		if w.Length > qp.Attr.PMTU {
			// Longer than the MTU: no packet and no error (IBTA
			// C10-93.1.1), as rxe does (a successful completion).
			qp.Counters.Dropped++
			if !qp.completeUD(w, cq.Success) {
				return true
			}
			continue
		}
		ah := &qp.ah[i]
		s := Send{Opcode: w.WR.Opcode, DestQP: w.WR.RemoteQPN, SrcQP: qp.Num(),
			QKey: QKeyToSend(qp.Num(), w.WR.RemoteQKey, qp.Attr.QKey), PSN: psn, Imm: w.WR.Imm,
			Solicited: w.WR.Flags&wr.Solicited != 0}
		port := uint16(nic.RoCEv2Port)
		if p := qp.Attr.Remote.Port(); p != 0 {
			port = p // SetRemotePort: a peer on another UDP port
		}
		buf := qp.NewPacketTo(nic.Packet{Remote: netip.AddrPortFrom(ah.Remote.Unmap(), port),
			Local: ah.Local.Unmap(), SrcPort: SrcPort(ah.FlowLabel, engine.SrcPort(qp.Num())),
			HopLimit: ah.HopLimit, TClass: ah.TrafficClass}) // the IP TTL and TOS, as rxe sends
		n := WriteHeaders(buf, &s, w.Length)
		off := PayloadOffset(w.WR.Opcode)
		var err error
		switch {
		case w.Length == 0:
		case w.IsInline:
			copy(buf[off:off+w.Length], w.Inline)
		default:
			err = engine.Gather(qp.MRs(), qp.Config.PD, w.SGL, 0, buf[off:off+w.Length])
		}
		if err != nil {
			qp.Unbuild()
			st := cq.LocProtErr
			if !errors.Is(err, memreg.ErrLocalProtection) {
				st = cq.LocLenErr
			}
			qp.completeUD(w, st)
			qp.ToError("local protection error on UD send: " + err.Error())
			return true
		}
		qp.Sent(n)
		if !qp.completeUD(w, cq.Success) {
			return true
		}
	}
	return qp.SQCount == 0
}

// completeUD completes the oldest WQE and retires it; false if the QP
// went to ERR (a send CQ overrun).
func (qp *udQP) completeUD(w *engine.SendWQE, st cq.Status) bool {
	ok := qp.PushSendWC(w, st, 0)
	qp.RetireHead()
	if !ok {
		qp.ToError("send CQ overrun")
		return false
	}
	return true
}

// receiveUD handles one UD packet for qp (IBTA §9.6.1, §10.2.5; rxe
// rxe_recv.c and rxe_resp.c). Whatever is wrong drops it silently and
// counts it: a state that does not receive, a Q_Key mismatch, no receive
// WQE, a WQE too small for the GRH and payload (with an SRQ that WQE is
// completed in error instead, class E as rxe does).
func (qp *udQP) receiveUD(pk *nic.Packet, p *bth.Packet) {
	switch qp.StateLocked() {
	case qpstate.RTR, qpstate.RTS, qpstate.SQD, qpstate.SQE:
	default:
		qp.EngineStats().RxUnknownQP++
		return
	}
	qp.Counters.RxPackets++
	if !AcceptQKey(qp.Num(), qp.Attr.QKey, p.DETH.QKey()) {
		qp.EngineStats().RxBadQKey++
		qp.Counters.Dropped++
		return
	}
	// A payload above the MTU or one that does not fit the WQE behind
	// the GRH is dropped (class D); with an SRQ the WQE is taken first
	// and completes in error (class E), as rxe does.
	need := GRHLen + len(p.Payload)
	tooLong := len(p.Payload) > qp.Attr.PMTU
	var rw *engine.RecvWQE
	if s := qp.Config.SRQ; s != nil {
		if rw = s.Take(); rw == nil {
			qp.EngineStats().RxUDNoRecv++
			qp.Counters.Dropped++
			return
		}
		if tooLong || rw.Len < need {
			qp.EngineStats().RxUDTooLong++
			qp.Counters.Dropped++
			qp.pushRecvUD(cq.WC{WRID: rw.ID, Status: cq.RemInvReqErr, Opcode: cq.OpRecv, QPNum: qp.Num()}, false)
			return
		}
	} else {
		head := qp.RecvHead()
		if head == nil {
			qp.EngineStats().RxUDNoRecv++
			qp.Counters.Dropped++
			return
		}
		// The WQE stays for the next datagram.
		if tooLong || head.Len < need {
			qp.EngineStats().RxUDTooLong++
			qp.Counters.Dropped++
			return
		}
		rw = qp.PopRecv()
	}
	grh := qp.grh[:]
	qp.writeGRH(grh, pk)
	err := engine.Scatter(qp.MRs(), qp.Config.PD, rw.SGL, 0, grh)
	if err == nil && len(p.Payload) > 0 {
		err = engine.Scatter(qp.MRs(), qp.Config.PD, rw.SGL, GRHLen, p.Payload)
	}
	if err != nil {
		// A receive WQE the QP cannot write is a local QP operation
		// error that stops the QP (rxe: RESPST_ERR_MALFORMED_WQE, class A).
		qp.Counters.Dropped++
		qp.pushRecvUD(cq.WC{WRID: rw.ID, Status: cq.LocQPOpErr, Opcode: cq.OpRecv, QPNum: qp.Num()}, false)
		qp.ToError("UD receive buffer: " + err.Error())
		return
	}
	wc := cq.WC{WRID: rw.ID, Status: cq.Success, Opcode: cq.OpRecv, ByteLen: uint32(need), QPNum: qp.Num(),
		SrcQP: p.DETH.SrcQP(), Flags: cq.FlagGRH, IPVersion: 6}
	if pk.Remote.Addr().Unmap().Is4() {
		wc.IPVersion = 4
	}
	if p.Info.Imm {
		wc.ImmData, wc.Flags = p.ImmDt.Imm(), wc.Flags|cq.FlagWithImm
	}
	qp.pushRecvUD(wc, p.BTH.SE())
}

// writeGRH writes the GRH of a received packet from what the link saw of
// its IP header. A link that does not report the header's TTL, TOS and
// IPv4 ID (IPKnown false) gets TTL 64 and zeros there; addresses the GRH
// cannot hold (no local address, mixed families) give a zero GRH.
func (qp *udQP) writeGRH(grh []byte, pk *nic.Packet) {
	h := IPHeader{Src: pk.Remote.Addr().Unmap(), Dst: pk.Local.Unmap(), UDPLen: 8 + pk.N,
		TOS: pk.TClass, TTL: pk.HopLimit, ID: pk.IPID, DF: true, FlowLabel: pk.FlowLabel}
	if !pk.IPKnown {
		h.TTL = defaultHopLimit
	}
	if WriteGRH(grh, &h) != nil {
		clear(grh)
	}
}

// defaultHopLimit is the TTL written into a GRH when the link does not
// report the received one: the usual initial TTL of Linux.
const defaultHopLimit = 64

// pushRecvUD delivers a UD receive completion; a receive CQ overrun moves
// the QP to ERR (rxe: class G).
func (qp *udQP) pushRecvUD(wc cq.WC, solicited bool) {
	if !qp.Config.RecvCQ.PushSolicited(wc, solicited) {
		qp.ToError("receive CQ overrun")
	}
}
