package engine

import (
	"errors"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/memreg"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/qpstate"
	"github.com/softroce/softroce/wr"
)

// This file holds what the connected services, RC and UC, share: the
// receipt of a packet from the QP's peer, the segmentation of a message
// into packets, and the placement of SEND and WRITE packets in memory.

// AcceptConnected is the receipt of a packet common to the connected
// services: only from the peer of the address vector, and only in a
// state that takes it. It reports whether the service handles the packet
// (a request in RTR, RTS or SQD, a response in RTS or SQD).
func (qp *QP) AcceptConnected(pk *nic.Packet, p *bth.Packet) bool {
	e := qp.e
	if qp.Attr.Remote.IsValid() && pk.Remote.Addr() != qp.Attr.Remote.Addr() {
		e.stats.RxWrongSource++
		return false
	}
	qp.Counters.RxPackets++
	if p.Info.Request {
		if qp.state != qpstate.RTR && qp.state != qpstate.RTS && qp.state != qpstate.SQD {
			e.stats.RxUnknownQP++
			return false
		}
		qp.noteCommEst()
		return true
	}
	if qp.state != qpstate.RTS && qp.state != qpstate.SQD {
		e.stats.RxUnknownQP++
		return false
	}
	qp.noteCommEst()
	return true
}

// NPackets is how many packets (and PSNs) a message of n bytes takes at
// the given path MTU: at least one, even for zero bytes.
func NPackets(n, pmtu int) int {
	if n <= pmtu {
		return 1
	}
	return (n + pmtu - 1) / pmtu
}

// SegOpcode picks the RC opcode for a SEND or WRITE segment (UC sends
// the same one under its own prefix).
func SegOpcode(op wr.Opcode, first, last bool) bth.Opcode {
	only := first && last
	switch op {
	case wr.Send:
		return pick(only, first, last, bth.RCSendOnly, bth.RCSendFirst, bth.RCSendLast)
	case wr.SendWithImm:
		return pick(only, first, last, bth.RCSendOnlyImm, bth.RCSendFirst, bth.RCSendLastImm)
	case wr.SendWithInv:
		return pick(only, first, last, bth.RCSendOnlyInv, bth.RCSendFirst, bth.RCSendLastInv)
	case wr.RDMAWrite:
		return pick(only, first, last, bth.RCWriteOnly, bth.RCWriteFirst, bth.RCWriteLast)
	case wr.RDMAWriteWithImm:
		return pick(only, first, last, bth.RCWriteOnlyImm, bth.RCWriteFirst, bth.RCWriteLastImm)
	}
	panic("engine: SegOpcode on " + op.String())
}

func pick(only, first, last bool, o, f, l bth.Opcode) bth.Opcode {
	switch {
	case only:
		return o
	case first:
		return f
	case last:
		return l
	}
	// MIDDLE is FIRST+1 for both SEND and WRITE.
	return f + 1
}

// Message is the multi-packet SEND or WRITE a connected responder has in
// progress, and the receive WQE it holds.
type Message struct {
	Active  bool
	Op      bth.Operation
	RecvID  uint64
	RecvSGL []wr.SGE
	RecvLen int
	HasRecv bool
	Off     int
	VA      uint64
	RKey    uint32
	Remain  int
	Total   int
}

// EndMsg closes the current message. A receive WQE it holds and did not
// consume (a broken UC SEND's, kept through a WRITE) stays for the next
// message.
func (qp *QP) EndMsg() {
	c := &qp.Msg
	*c = Message{RecvSGL: c.RecvSGL, RecvID: c.RecvID, RecvLen: c.RecvLen, HasRecv: c.HasRecv}
}

// PMTULengthOK checks a request packet's payload against the path MTU
// (IBTA C9-92, rxe_resp_check_length): FIRST and MIDDLE carry exactly
// the PMTU, LAST 1..PMTU, ONLY 0..PMTU.
func PMTULengthOK(info *bth.OpInfo, plen, pmtu int) bool {
	switch {
	case info.Payload == bth.PayloadPMTU && plen != pmtu,
		info.Payload == bth.PayloadUpTo && (plen > pmtu || info.Pos == bth.PosLast && plen == 0):
		return false
	}
	return true
}

// FailKind sorts the reasons a responder cannot execute a SEND or WRITE
// packet; each service decides what follows (RC NAKs, UC drops).
type FailKind uint8

const (
	FailRNR     FailKind = iota + 1 // no receive WQE posted (0: no failure)
	FailRequest                     // invalid request: lengths, QP access rights
	FailAccess                      // R_Key, bounds or permission of the target memory
	FailLocal                       // the receive WQE's own buffer is unusable
)

// RespFail is why a packet could not be executed, with the NAK syndrome
// and completion status RC answers it with; Kind 0 is success. A value,
// not a pointer, so a failure costs no allocation.
type RespFail struct {
	Kind FailKind
	Syn  bth.Syndrome
	St   cq.Status
	Why  string
	Err  error // the memory access error, formatted only when needed
}

// Reason says why, for the async error event of a QP that goes to ERR.
func (f *RespFail) Reason() string {
	if f.Err != nil {
		return f.Err.Error()
	}
	return f.Why
}

// AccessFail classifies a failed memory access as memreg reports it:
// remote access error (0x62) or invalid request (0x61).
func AccessFail(err error) RespFail {
	if errors.Is(err, memreg.ErrInvalidRequest) {
		return RespFail{Kind: FailRequest, Syn: bth.SyndromeInvalidRequest, St: cq.RemInvReqErr, Err: err}
	}
	return RespFail{Kind: FailAccess, Syn: bth.SyndromeRemoteAccessError, St: cq.RemAccessErr, Err: err}
}

// takeRecvWQE moves the oldest receive WQE (of the QP's receive queue or
// of its SRQ) into the current message; false when none is posted (RC
// answers an RNR NAK, IBTA §9.7.5.2.8, also with an empty SRQ as rxe
// does). A WQE the current message already holds is kept:
// on UC it is the one a broken message leaves for the next (on RC no
// message holds one when a new one starts).
func (qp *QP) takeRecvWQE() bool {
	c := &qp.Msg
	if c.HasRecv {
		return true
	}
	var rw *RecvWQE
	if s := qp.Config.SRQ; s != nil {
		rw = s.Take()
	} else if qp.rq.count > 0 {
		rw = qp.rq.pop()
	}
	if rw == nil {
		return false
	}
	c.RecvID, c.RecvLen, c.HasRecv = rw.ID, rw.Len, true
	c.RecvSGL = append(c.RecvSGL[:0], rw.SGL...)
	return true
}

// SendData places one SEND packet in the receive WQE of its message,
// taking a WQE on FIRST and ONLY.
func (qp *QP) SendData(p *bth.Packet) RespFail {
	c := &qp.Msg
	if pos := p.Info.Pos; pos == bth.PosFirst || pos == bth.PosOnly {
		if !qp.takeRecvWQE() {
			return RespFail{Kind: FailRNR}
		}
		c.Active, c.Op, c.Off = true, bth.OpSend, 0
	}
	if c.Off+len(p.Payload) > c.RecvLen {
		// The SEND is longer than the posted buffer: the responder
		// reports a local length error and NAKs invalid request (IBTA
		// C9-102); rxe sends 0x63 here, a known deviation.
		return RespFail{Kind: FailRequest, Syn: bth.SyndromeInvalidRequest, St: cq.LocLenErr, Why: "SEND longer than the receive buffer"}
	}
	if len(p.Payload) > 0 {
		if err := Scatter(qp.e.mrs, qp.Config.PD, c.RecvSGL, c.Off, p.Payload); err != nil {
			return RespFail{Kind: FailLocal, Syn: bth.SyndromeRemoteOpError, St: cq.LocProtErr, Why: "receive buffer: " + err.Error()}
		}
	}
	c.Off += len(p.Payload)
	return RespFail{}
}

// SendWC is the receive completion of the SEND whose last packet is p.
func (qp *QP) SendWC(p *bth.Packet) cq.WC {
	wc := cq.WC{WRID: qp.Msg.RecvID, Status: cq.Success, Opcode: cq.OpRecv, ByteLen: uint32(qp.Msg.Off),
		QPNum: qp.num, SrcQP: qp.Attr.DestQPN}
	if p.Info.Imm {
		wc.ImmData, wc.Flags = p.ImmDt.Imm(), cq.FlagWithImm
	}
	return wc
}

// WriteData checks an RDMA WRITE packet (the RETH, the QP's and the
// key's rights on FIRST and ONLY) and writes its payload; the last packet
// of a WRITE with immediate takes a receive WQE first.
func (qp *QP) WriteData(p *bth.Packet) RespFail {
	info := p.Info
	if info.Pos == bth.PosFirst || info.Pos == bth.PosOnly {
		if qp.Attr.Access&memreg.AccessRemoteWrite == 0 {
			return RespFail{Kind: FailRequest, Syn: bth.SyndromeInvalidRequest, St: cq.RemInvReqErr, Why: "QP does not allow remote write"}
		}
		length := p.RETH.DMALen()
		if length > 1<<31 {
			return RespFail{Kind: FailRequest, Syn: bth.SyndromeInvalidRequest, St: cq.RemInvReqErr, Why: "RETH length above 2^31"}
		}
		va, rkey := p.RETH.VA(), p.RETH.RKey()
		if err := qp.Remote().Check(rkey, va, uint64(length), memreg.AccessRemoteWrite); err != nil {
			return AccessFail(err)
		}
		c := &qp.Msg
		*c = Message{Active: true, Op: bth.OpWrite, VA: va, RKey: rkey, Remain: int(length), Total: int(length),
			RecvSGL: c.RecvSGL, RecvID: c.RecvID, RecvLen: c.RecvLen, HasRecv: c.HasRecv}
	}
	c := &qp.Msg
	plen := len(p.Payload)
	last := info.Pos == bth.PosLast || info.Pos == bth.PosOnly
	if plen > c.Remain || last && plen != c.Remain {
		return RespFail{Kind: FailRequest, Syn: bth.SyndromeInvalidRequest, St: cq.RemInvReqErr, Why: "WRITE payload does not match the RETH length"}
	}
	// WRITE with immediate consumes a receive WQE; check before touching
	// memory so an RNR NAK leaves nothing half done.
	if last && info.Imm && !qp.takeRecvWQE() {
		if info.Pos == bth.PosOnly {
			// The packet opened the message above; its retry opens it
			// again, so it must not find it open (rxe checks the
			// sequence against the last executed opcode, which an RNR
			// NAK leaves as it was). A LAST's retry continues the
			// message, which stays open.
			c.Active = false
		}
		return RespFail{Kind: FailRNR}
	}
	if plen > 0 {
		if err := qp.Remote().Write(c.RKey, c.VA, p.Payload); err != nil {
			return AccessFail(err)
		}
	}
	c.VA += uint64(plen)
	c.Remain -= plen
	return RespFail{}
}

// WriteWC is the receive completion of a WRITE with immediate whose last
// packet is p.
func (qp *QP) WriteWC(p *bth.Packet) cq.WC {
	return cq.WC{WRID: qp.Msg.RecvID, Status: cq.Success, Opcode: cq.OpRecvRDMAWithImm,
		ByteLen: uint32(qp.Msg.Total), ImmData: p.ImmDt.Imm(), Flags: cq.FlagWithImm,
		QPNum: qp.num, SrcQP: qp.Attr.DestQPN}
}

// PushRecv delivers the receive completion of the current message; false
// when the receive CQ overran, which the service must treat as fatal for
// the QP.
func (qp *QP) PushRecv(wc cq.WC, solicited bool) bool {
	qp.Msg.HasRecv = false
	return qp.Config.RecvCQ.PushSolicited(wc, solicited)
}
