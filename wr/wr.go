// Package wr holds work requests, scatter/gather elements, opcodes and
// flags, shared by every transport and the verbs API.
//
// It is a leaf and imports nothing of the project, so that the transports
// and verbs can all import it: verbs re-exports these names (as SendWR,
// WRSend, SendSignaled, ...), and a transport cannot import verbs, which
// imports the transports.
package wr

import (
	"fmt"
	"net/netip"
)

// Opcode is a send work request's operation (enum ibv_wr_opcode; the
// values are the C enum's).
type Opcode uint8

const (
	RDMAWrite         Opcode = 0
	RDMAWriteWithImm  Opcode = 1
	Send              Opcode = 2
	SendWithImm       Opcode = 3
	RDMARead          Opcode = 4
	AtomicCmpAndSwp   Opcode = 5
	AtomicFetchAndAdd Opcode = 6
	LocalInv          Opcode = 7 // executed locally: invalidates InvRKey
	BindMW            Opcode = 8 // executed locally: binds a type 2 window (Bind)
	SendWithInv       Opcode = 9
	AtomicWrite       Opcode = 15
)

var opNames = map[Opcode]string{RDMAWrite: "RDMA_WRITE", RDMAWriteWithImm: "RDMA_WRITE_WITH_IMM",
	Send: "SEND", SendWithImm: "SEND_WITH_IMM", RDMARead: "RDMA_READ", AtomicCmpAndSwp: "ATOMIC_CMP_AND_SWP",
	AtomicFetchAndAdd: "ATOMIC_FETCH_AND_ADD", LocalInv: "LOCAL_INV", BindMW: "BIND_MW", SendWithInv: "SEND_WITH_INV", AtomicWrite: "ATOMIC_WRITE"}

// String is the opcode's ibv_wr_opcode name without the IBV_WR_ prefix.
func (o Opcode) String() string {
	if s, ok := opNames[o]; ok {
		return s
	}
	return fmt.Sprintf("WROpcode(%d)", uint8(o))
}

// Known reports whether o is one of the opcodes defined here.
func (o Opcode) Known() bool { _, ok := opNames[o]; return ok }

// IsSend: SEND, SEND_WITH_IMM, SEND_WITH_INV (they consume a receive WR).
func (o Opcode) IsSend() bool { return o == Send || o == SendWithImm || o == SendWithInv }

// IsWrite: RDMA WRITE with or without immediate.
func (o Opcode) IsWrite() bool { return o == RDMAWrite || o == RDMAWriteWithImm }

// IsAtomic: the 8-byte read-modify-write atomics (CMP_AND_SWP,
// FETCH_AND_ADD), which return the original value; not ATOMIC_WRITE.
func (o Opcode) IsAtomic() bool { return o == AtomicCmpAndSwp || o == AtomicFetchAndAdd }

// IsLocal: LOCAL_INV and BIND_MW, which the requester executes itself, in
// order with the rest of the send queue, sending nothing.
func (o Opcode) IsLocal() bool { return o == LocalInv || o == BindMW }

// MWBind is the bind_mw part of a BIND_MW work request (struct ibv_send_wr
// bind_mw with its struct ibv_mw_bind_info). The window and the region are
// named by their keys, as the key table finds them.
type MWBind struct {
	MWKey  uint32 // the window's current R_Key (names the window)
	RKey   uint32 // its new R_Key: same upper 24 bits, new low 8 bits
	MRKey  uint32 // L_Key of the region to bind it to
	Addr   uint64
	Length uint64
	Access uint32 // ibv_access_flags: REMOTE_READ, REMOTE_WRITE, REMOTE_ATOMIC
}

// SGE is one scatter/gather element (struct ibv_sge).
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}

// SendFlags are ibv_send_flags.
type SendFlags uint32

const (
	Fence     SendFlags = 1 << 0
	Signaled  SendFlags = 1 << 1
	Solicited SendFlags = 1 << 2
	Inline    SendFlags = 1 << 3
)

// SendWR is a send work request (struct ibv_send_wr).
type SendWR struct {
	ID         uint64
	Opcode     Opcode
	SGL        []SGE
	Flags      SendFlags
	Imm        uint32 // immediate data, as sent on the wire (big-endian value)
	InvRKey    uint32 // SEND_WITH_INV, LOCAL_INV (ibv_send_wr invalidate_rkey)
	RemoteAddr uint64 // RDMA and atomics
	RKey       uint32
	CompareAdd uint64 // CMP_AND_SWP: compare; FETCH_AND_ADD: add
	Swap       uint64 // CMP_AND_SWP: swap
	// InlineData, with Inline, is the payload itself instead of the SGL.
	InlineData []byte
	// AtomicWrite is the 8-byte value of an ATOMIC_WRITE (IBTA 1.5).
	AtomicWrite [8]byte
	// Bind is the window binding of a BIND_MW.
	Bind MWBind

	// UD only (ibv_send_wr wr.ud): the destination's address handle, QP
	// number and Q_Key. A RemoteQKey with the high-order bit set means the
	// QP's own Q_Key (IBTA §10.2.5; how QP1 and rdma_cm's UD QPs send).
	AH         *AH
	RemoteQPN  uint32
	RemoteQKey uint32
}

// AH is an address handle's address vector on RoCEv2 (struct ibv_ah_attr
// with its GRH): where a UD work request goes. verbs.PD.CreateAH makes
// and checks one; the transport reads it when it builds the packets.
type AH struct {
	Remote       netip.Addr // destination IP (the DGID; IPv4-mapped GIDs unmapped)
	Local        netip.Addr // source IP (the SGID of sgid_index); zero: the link's default
	FlowLabel    uint32     // 20 bits; picks the UDP source port like rxe
	HopLimit     uint8
	TrafficClass uint8
	SL           uint8
}

// RecvWR is a receive work request (struct ibv_recv_wr).
type RecvWR struct {
	ID  uint64
	SGL []SGE
}
