package rc

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/memreg"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/qpstate"
	"github.com/softroce/softroce/transport/ud"
	"github.com/softroce/softroce/wr"
)

// The engine hosts UD QPs next to RC ones: same QP table, send-queue
// ring, receive ring or SRQ, CQs and transmit batches. What differs is
// here: a UD send is one packet to the address handle of its work
// request, completed as it is handed out (no ACK, no retransmission); a
// UD receive is checked against the QP's Q_Key, lands behind a 40-byte
// GRH and completes at once. The wire rules themselves are package ud's.

// udQP is a UD QP: the engine's QP and UD's own state of it.
type udQP struct {
	*QP
	// ah[i] is the address vector of send-queue slot i, copied at post
	// time so the caller may reuse or free its address handle.
	ah []wr.AH
	// grh is scratch room for the GRH of a received datagram.
	grh [ud.GRHLen]byte
}

// newUDQP makes room for an address vector per send-queue slot, so that
// posting does not allocate.
func newUDQP(qp *QP) Service { return &udQP{QP: qp, ah: make([]wr.AH, qp.cfg.MaxSendWR)} }

func init() { Register(qpstate.UD, newUDQP) }

func (*udQP) Transport() bth.Transport { return bth.TransportUD }

// CheckPost checks the work request and copies its address vector.
func (qp *udQP) CheckPost(swr *wr.SendWR) error {
	if err := qp.checkSendUD(swr); err != nil {
		return err
	}
	qp.ah[qp.sqTail] = *swr.AH
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

// ErrQPNumInUse is returned by CreateGSI when QP1 already exists.
var ErrQPNumInUse = errors.New("rc: QP number in use")

// CreateGSI makes the engine's QP1 (the GSI QP for management datagrams),
// a UD QP in RESET whose receives accept only Q_Key 0x80010000. There is
// at most one: a second call fails with ErrQPNumInUse until it is
// destroyed.
func (e *Engine) CreateGSI(cfg QPConfig) (*QP, error) {
	cfg.Type = qpstate.UD
	return e.createQP(cfg, ud.GSIQPN)
}

// checkSendUD checks at post time what a UD send work request must be:
// SEND or SEND_WITH_IMM with an address handle. A message longer than the
// MTU is accepted here and completes without a packet (transmitUD).
func (qp *udQP) checkSendUD(swr *wr.SendWR) error {
	if _, err := ud.Opcode(swr.Opcode); err != nil {
		return fmt.Errorf("rc: UD QP %d: %w", qp.num, err)
	}
	if swr.AH == nil {
		return fmt.Errorf("rc: UD QP %d: send work request %d has no address handle", qp.num, swr.ID)
	}
	if !swr.AH.Remote.IsValid() {
		return fmt.Errorf("rc: UD QP %d: address handle has no destination", qp.num)
	}
	if swr.RemoteQPN > bth.PSNMask {
		return fmt.Errorf("rc: UD QP %d: remote QPN %#x is not 24 bits", qp.num, swr.RemoteQPN)
	}
	return nil
}

// transmitUD is the UD requester: each WQE becomes one SEND_ONLY packet
// to its address handle and completes as the packet is built (a
// completion means the message was handed to the link, as with rxe). It
// reports whether the send queue is empty.
func (qp *udQP) transmitUD(budget int) bool {
	e := qp.e
	if qp.state != qpstate.RTS {
		return true
	}
	for len(e.tx) < budget && qp.sqCount > 0 {
		i := qp.sqHead
		w := &qp.sq[i]
		psn := qp.nextPSN
		qp.nextPSN = bth.PSNAdd(psn, 1)
		if w.length > qp.path.PMTU {
			// Longer than the MTU: no packet and no error (IBTA
			// C10-93.1.1), as rxe does (a successful completion).
			qp.stats.Dropped++
			if !qp.completeUD(w, cq.Success) {
				return true
			}
			continue
		}
		ah := &qp.ah[i]
		s := ud.Send{Opcode: w.wr.Opcode, DestQP: w.wr.RemoteQPN, SrcQP: qp.num,
			QKey: ud.QKeyToSend(qp.num, w.wr.RemoteQKey, qp.path.QKey), PSN: psn, Imm: w.wr.Imm,
			Solicited: w.wr.Flags&wr.Solicited != 0}
		port := uint16(nic.RoCEv2Port)
		if p := qp.path.Remote.Port(); p != 0 {
			port = p // SetRemotePort: a peer on another UDP port
		}
		buf := qp.newPacketTo(nic.Packet{Remote: netip.AddrPortFrom(ah.Remote.Unmap(), port),
			Local: ah.Local.Unmap(), SrcPort: ud.SrcPort(ah.FlowLabel, srcPort(qp.num)),
			HopLimit: ah.HopLimit, TClass: ah.TrafficClass}) // the IP TTL and TOS, as rxe sends
		n := ud.WriteHeaders(buf, &s, w.length)
		off := ud.PayloadOffset(w.wr.Opcode)
		var err error
		switch {
		case w.length == 0:
		case w.isInline:
			copy(buf[off:off+w.length], w.inline)
		default:
			err = gather(e.mrs, qp.cfg.PD, w.sgl, 0, buf[off:off+w.length])
		}
		if err != nil {
			e.unbuild()
			st := cq.LocProtErr
			if !errors.Is(err, memreg.ErrLocalProtection) {
				st = cq.LocLenErr
			}
			qp.completeUD(w, st)
			qp.toError("local protection error on UD send: " + err.Error())
			return true
		}
		qp.sent(n)
		if !qp.completeUD(w, cq.Success) {
			return true
		}
	}
	return qp.sqCount == 0
}

// completeUD completes the oldest WQE and retires it; false if the QP
// went to ERR (a send CQ overrun).
func (qp *udQP) completeUD(w *sendWQE, st cq.Status) bool {
	ok := qp.pushSendWC(w, st, 0)
	qp.retireHead()
	if !ok {
		qp.toError("send CQ overrun")
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
	e := qp.e
	switch qp.state {
	case qpstate.RTR, qpstate.RTS, qpstate.SQD, qpstate.SQE:
	default:
		e.stats.RxUnknownQP++
		return
	}
	qp.stats.RxPackets++
	if !ud.AcceptQKey(qp.num, qp.path.QKey, p.DETH.QKey()) {
		e.stats.RxBadQKey++
		qp.stats.Dropped++
		return
	}
	// A payload above the MTU or one that does not fit the WQE behind
	// the GRH is dropped (class D); with an SRQ the WQE is taken first
	// and completes in error (class E), as rxe does.
	need := ud.GRHLen + len(p.Payload)
	tooLong := len(p.Payload) > qp.path.PMTU
	var rw *recvWQE
	if s := qp.cfg.SRQ; s != nil {
		if rw = s.take(); rw == nil {
			e.stats.RxUDNoRecv++
			qp.stats.Dropped++
			return
		}
		if tooLong || rw.len < need {
			e.stats.RxUDTooLong++
			qp.stats.Dropped++
			qp.pushRecvUD(cq.WC{WRID: rw.id, Status: cq.RemInvReqErr, Opcode: cq.OpRecv, QPNum: qp.num}, false)
			return
		}
	} else {
		if qp.rq.count == 0 {
			e.stats.RxUDNoRecv++
			qp.stats.Dropped++
			return
		}
		// The WQE stays for the next datagram.
		if tooLong || qp.rq.wqes[qp.rq.head].len < need {
			e.stats.RxUDTooLong++
			qp.stats.Dropped++
			return
		}
		rw = qp.rq.pop()
	}
	grh := qp.grh[:]
	qp.writeGRH(grh, pk)
	err := scatter(e.mrs, qp.cfg.PD, rw.sgl, 0, grh)
	if err == nil && len(p.Payload) > 0 {
		err = scatter(e.mrs, qp.cfg.PD, rw.sgl, ud.GRHLen, p.Payload)
	}
	if err != nil {
		// A receive WQE the QP cannot write is a local QP operation
		// error that stops the QP (rxe: RESPST_ERR_MALFORMED_WQE, class A).
		qp.stats.Dropped++
		qp.pushRecvUD(cq.WC{WRID: rw.id, Status: cq.LocQPOpErr, Opcode: cq.OpRecv, QPNum: qp.num}, false)
		qp.toError("UD receive buffer: " + err.Error())
		return
	}
	wc := cq.WC{WRID: rw.id, Status: cq.Success, Opcode: cq.OpRecv, ByteLen: uint32(need), QPNum: qp.num,
		SrcQP: p.DETH.SrcQP(), Flags: cq.FlagGRH}
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
	h := ud.IPHeader{Src: pk.Remote.Addr().Unmap(), Dst: pk.Local.Unmap(), UDPLen: 8 + pk.N,
		TOS: pk.TClass, TTL: pk.HopLimit, ID: pk.IPID, DF: true, FlowLabel: pk.FlowLabel}
	if !pk.IPKnown {
		h.TTL = defaultHopLimit
	}
	if ud.WriteGRH(grh, &h) != nil {
		clear(grh)
	}
}

// defaultHopLimit is the TTL written into a GRH when the link does not
// report the received one: the usual initial TTL of Linux.
const defaultHopLimit = 64

// pushRecvUD delivers a UD receive completion; a receive CQ overrun moves
// the QP to ERR (rxe: class G).
func (qp *udQP) pushRecvUD(wc cq.WC, solicited bool) {
	if !qp.cfg.RecvCQ.PushSolicited(wc, solicited) {
		qp.toError("receive CQ overrun")
	}
}
