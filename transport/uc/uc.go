package uc

import (
	"fmt"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/wr"
)

// CheckPost says whether a UC QP may post a send work request with
// opcode op: UC carries SEND and RDMA WRITE, with or without immediate,
// and the local BIND_MW and LOCAL_INV; it has no RDMA READ, atomics,
// ATOMIC_WRITE or SEND with invalidate (IBTA §9.8, table 41).
func CheckPost(op wr.Opcode) error {
	switch op {
	case wr.Send, wr.SendWithImm, wr.RDMAWrite, wr.RDMAWriteWithImm, wr.BindMW, wr.LocalInv:
		return nil
	}
	return fmt.Errorf("uc: opcode %v is not supported on a UC QP (UC carries SEND and RDMA WRITE only)", op)
}

// Opcode turns the RC opcode of a SEND or RDMA WRITE segment into its UC
// counterpart: the same low five bits under the UC transport prefix 001.
func Opcode(rc bth.Opcode) bth.Opcode {
	return bth.Opcode(uint8(bth.TransportUC)<<5 | uint8(rc)&0x1f)
}

// Message is the kind of message a receiver has open.
type Message uint8

const (
	None  Message = iota // between messages
	Send                 // a SEND after its FIRST
	Write                // an RDMA WRITE after its FIRST
)

func (m Message) String() string {
	switch m {
	case None:
		return "none"
	case Send:
		return "SEND"
	case Write:
		return "WRITE"
	}
	return fmt.Sprintf("Message(%d)", uint8(m))
}

// Reason says why a packet was dropped.
type Reason uint8

const (
	Accepted   Reason = iota // not dropped
	Dropping                 // inside a message already being dropped
	PSNError                 // a MIDDLE or LAST whose PSN is not the expected one (lost or duplicated packet)
	NoFirst                  // a MIDDLE or LAST with no message open
	WrongOp                  // a MIDDLE or LAST of another operation than the open message's
	NotRequest               // not a SEND or RDMA WRITE packet
)

var reasonNames = [...]string{"accepted", "dropping the rest of a message", "PSN sequence error",
	"MIDDLE or LAST without FIRST", "opcode of another operation inside a message", "not a UC request"}

func (r Reason) String() string {
	if int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return fmt.Sprintf("Reason(%d)", uint8(r))
}

// Verdict is what the receiver decides about one packet.
type Verdict struct {
	// Execute: the packet is in sequence; the responder places it.
	Execute bool
	// Abandon: a partially received message is lost. The responder
	// discards it: the receive WQE a SEND (or WRITE with immediate) had
	// taken is not completed but reused by the next message, as rxe
	// resets it (with an SRQ, whose WQEs cannot go back, rxe completes it
	// REM_INV_REQ_ERR instead).
	Abandon bool
	// Why a packet is not executed.
	Why Reason
}

// Receiver is the responder's sequencing state of one UC QP: the PSN it
// expects, the message it has open, and whether it is dropping the rest
// of a message. The zero value expects PSN 0 with no message open.
//
// The rules (IBTA §9.8; rxe check_psn and check_op_seq for UC):
//   - A FIRST or ONLY packet always starts a new message, whatever its PSN:
//     it resynchronises after a gap, and it abandons a message left open
//     (its LAST was lost).
//   - A MIDDLE or LAST is executed only at the expected PSN and inside an
//     open message of the same operation. Otherwise the packet and the
//     rest of its message are dropped silently, until the next FIRST or
//     ONLY. A duplicate is a PSN error like a gap: UC cannot tell them
//     apart, so a duplicated ONLY is delivered twice.
//   - Nothing is ever acknowledged or NAKed.
//
// rxe differs in one case: a FIRST or ONLY that arrives while a message
// is open (after its sequence broke inside the message) is dropped
// instead of starting the new message, so rxe loses the message after a
// broken one too. The spec's class D1 rule, followed here, discards only
// the broken message.
type Receiver struct {
	ePSN     uint32
	open     Message
	dropping bool
}

// Reset arms the receiver at PSN psn with no message open (RTR).
func (r *Receiver) Reset(psn uint32) {
	*r = Receiver{ePSN: psn & bth.PSNMask}
}

// ExpectedPSN is the PSN the next MIDDLE or LAST must carry.
func (r *Receiver) ExpectedPSN() uint32 { return r.ePSN }

// Open is the message in progress.
func (r *Receiver) Open() Message { return r.open }

// Dropping reports whether the receiver discards packets until the next
// FIRST or ONLY.
func (r *Receiver) Dropping() bool { return r.dropping }

// Check decides about a request packet with PSN psn, operation op and
// position pos, and updates the state as if an executed packet succeeds
// (call Fail when its execution does not).
func (r *Receiver) Check(psn uint32, op bth.Operation, pos bth.Position) Verdict {
	var m Message
	switch op {
	case bth.OpSend:
		m = Send
	case bth.OpWrite:
		m = Write
	default:
		return r.drop(NotRequest)
	}
	switch pos {
	case bth.PosFirst, bth.PosOnly:
		v := Verdict{Execute: true, Abandon: r.open != None}
		r.dropping = false
		r.open = None
		if pos == bth.PosFirst {
			r.open = m
		}
		r.ePSN = bth.PSNAdd(psn&bth.PSNMask, 1)
		return v
	case bth.PosMiddle, bth.PosLast:
	default:
		return r.drop(NotRequest)
	}
	switch {
	case r.dropping:
		return Verdict{Why: Dropping}
	case psn&bth.PSNMask != r.ePSN:
		return r.drop(PSNError)
	case r.open == None:
		return r.drop(NoFirst)
	case r.open != m:
		return r.drop(WrongOp)
	}
	r.ePSN = bth.PSNAdd(r.ePSN, 1)
	if pos == bth.PosLast {
		r.open = None
	}
	return Verdict{Execute: true}
}

// drop starts dropping the rest of the current message.
func (r *Receiver) drop(why Reason) Verdict {
	v := Verdict{Why: why, Abandon: r.open != None}
	r.open = None
	r.dropping = true
	return v
}

// Fail records that the packet Check accepted could not be executed (no
// receive WQE, a length, R_Key or access error): UC answers nothing, the
// rest of the message is dropped (IBTA class D) and the next FIRST or
// ONLY starts again.
func (r *Receiver) Fail() {
	r.open = None
	r.dropping = true
}
