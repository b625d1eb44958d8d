// Package rc is the Reliable Connection transport: for each QP a
// requester (segments work requests into packets, assigns PSNs,
// retransmits go-back-N), a responder (checks PSNs, executes requests
// against registered memory, ACKs and NAKs, replays duplicates) and a
// completer (matches ACKs and responses to work requests and completes
// them in order), after IBTA vol. 1 ch. 9.7 and the behaviour of the
// kernel's rdma_rxe.
//
// The package does no I/O and reads no clock: an Engine is fed received
// packet batches and the current time, and hands back packet batches to
// send and the next time it wants to be woken. Driver runs an Engine on a
// nic.Link with real time; tests run it on simulated time.
package rc

import "fmt"

// WROpcode is a send work request's operation (enum ibv_wr_opcode).
type WROpcode uint8

const (
	WRRDMAWrite         WROpcode = 0
	WRRDMAWriteWithImm  WROpcode = 1
	WRSend              WROpcode = 2
	WRSendWithImm       WROpcode = 3
	WRRDMARead          WROpcode = 4
	WRAtomicCmpAndSwp   WROpcode = 5
	WRAtomicFetchAndAdd WROpcode = 6
	WRSendWithInv       WROpcode = 9
	WRAtomicWrite       WROpcode = 15
)

var wrNames = map[WROpcode]string{WRRDMAWrite: "RDMA_WRITE", WRRDMAWriteWithImm: "RDMA_WRITE_WITH_IMM",
	WRSend: "SEND", WRSendWithImm: "SEND_WITH_IMM", WRRDMARead: "RDMA_READ", WRAtomicCmpAndSwp: "ATOMIC_CMP_AND_SWP",
	WRAtomicFetchAndAdd: "ATOMIC_FETCH_AND_ADD", WRSendWithInv: "SEND_WITH_INV", WRAtomicWrite: "ATOMIC_WRITE"}

func (o WROpcode) String() string {
	if s, ok := wrNames[o]; ok {
		return s
	}
	return fmt.Sprintf("WROpcode(%d)", uint8(o))
}

func (o WROpcode) isSend() bool  { return o == WRSend || o == WRSendWithImm || o == WRSendWithInv }
func (o WROpcode) isWrite() bool { return o == WRRDMAWrite || o == WRRDMAWriteWithImm }
func (o WROpcode) isAtomic() bool {
	return o == WRAtomicCmpAndSwp || o == WRAtomicFetchAndAdd
}

// needsRDResource: operations limited by max_rd_atomic (IBTA §9.5: RDMA
// READ and atomics; IBTA 1.5 adds ATOMIC_WRITE).
func (o WROpcode) needsRDResource() bool {
	return o == WRRDMARead || o.isAtomic() || o == WRAtomicWrite
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
	SendFence     SendFlags = 1 << 0
	SendSignaled  SendFlags = 1 << 1
	SendSolicited SendFlags = 1 << 2
	SendInline    SendFlags = 1 << 3
)

// SendWR is a send work request (struct ibv_send_wr).
type SendWR struct {
	ID         uint64
	Opcode     WROpcode
	SGL        []SGE
	Flags      SendFlags
	Imm        uint32 // immediate data, as sent on the wire (big-endian value)
	InvRKey    uint32 // SEND_WITH_INV
	RemoteAddr uint64 // RDMA and atomics
	RKey       uint32
	CompareAdd uint64 // CMP_AND_SWP: compare; FETCH_AND_ADD: add
	Swap       uint64 // CMP_AND_SWP: swap
	// InlineData, with SendInline, is the payload itself instead of the SGL.
	InlineData []byte
	// AtomicWrite is the 8-byte value of an ATOMIC_WRITE (IBTA 1.5).
	AtomicWrite [8]byte
}

// RecvWR is a receive work request (struct ibv_recv_wr).
type RecvWR struct {
	ID  uint64
	SGL []SGE
}
