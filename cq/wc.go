// Package cq implements completion queues: the work completions the
// transport produces when a work request finishes, their status codes, batch
// polling, blocking waits, completion notification (arm / solicited-only) and
// CQ overrun detection.
//
// The names and numeric values follow libibverbs (struct ibv_wc, enum
// ibv_wc_status, enum ibv_wc_opcode, enum ibv_wc_flags) so that code and
// logs read the same as they would against a kernel verbs provider.
//
// Overrun (IBTA: a CQ error, an affiliated asynchronous event): a
// completion that does not fit is never silently dropped. Push reports false, the CQ enters an error
// state from which it does not recover, and one EventCQErr is delivered on
// Events. What the caller (the QP) does next is its business; the IBTA model
// and rxe move the QP that failed to complete into the error state.
package cq

import "strconv"

// Status is the completion status of a work request. Values equal enum
// ibv_wc_status, in order.
type Status uint8

// Completion statuses (enum ibv_wc_status).
const (
	Success          Status = iota // IBV_WC_SUCCESS
	LocLenErr                      // IBV_WC_LOC_LEN_ERR
	LocQPOpErr                     // IBV_WC_LOC_QP_OP_ERR
	LocEECOpErr                    // IBV_WC_LOC_EEC_OP_ERR
	LocProtErr                     // IBV_WC_LOC_PROT_ERR
	WRFlushErr                     // IBV_WC_WR_FLUSH_ERR
	MWBindErr                      // IBV_WC_MW_BIND_ERR
	BadRespErr                     // IBV_WC_BAD_RESP_ERR
	LocAccessErr                   // IBV_WC_LOC_ACCESS_ERR
	RemInvReqErr                   // IBV_WC_REM_INV_REQ_ERR
	RemAccessErr                   // IBV_WC_REM_ACCESS_ERR
	RemOpErr                       // IBV_WC_REM_OP_ERR
	RetryExcErr                    // IBV_WC_RETRY_EXC_ERR
	RNRRetryExcErr                 // IBV_WC_RNR_RETRY_EXC_ERR
	LocRDDViolErr                  // IBV_WC_LOC_RDD_VIOL_ERR
	RemInvRDReqErr                 // IBV_WC_REM_INV_RD_REQ_ERR
	RemAbortErr                    // IBV_WC_REM_ABORT_ERR
	InvEECNErr                     // IBV_WC_INV_EECN_ERR
	InvEECStateErr                 // IBV_WC_INV_EEC_STATE_ERR
	FatalErr                       // IBV_WC_FATAL_ERR
	RespTimeoutErr                 // IBV_WC_RESP_TIMEOUT_ERR
	GeneralErr                     // IBV_WC_GENERAL_ERR
	TMErr                          // IBV_WC_TM_ERR
	TMRndvIncomplete               // IBV_WC_TM_RNDV_INCOMPLETE
)

// statusNames are the strings ibv_wc_status_str returns, so that a log line
// from softroce matches one from a libibverbs program.
var statusNames = [...]string{
	Success:          "success",
	LocLenErr:        "local length error",
	LocQPOpErr:       "local QP operation error",
	LocEECOpErr:      "local EE context operation error",
	LocProtErr:       "local protection error",
	WRFlushErr:       "Work Request Flushed Error",
	MWBindErr:        "memory management operation error",
	BadRespErr:       "bad response error",
	LocAccessErr:     "local access error",
	RemInvReqErr:     "remote invalid request error",
	RemAccessErr:     "remote access error",
	RemOpErr:         "remote operation error",
	RetryExcErr:      "transport retry counter exceeded",
	RNRRetryExcErr:   "RNR retry counter exceeded",
	LocRDDViolErr:    "local RDD violation error",
	RemInvRDReqErr:   "remote invalid RD request",
	RemAbortErr:      "aborted error",
	InvEECNErr:       "invalid EE context number",
	InvEECStateErr:   "invalid EE context state",
	FatalErr:         "fatal error",
	RespTimeoutErr:   "response timeout error",
	GeneralErr:       "general error",
	TMErr:            "TM error",
	TMRndvIncomplete: "TM software rendezvous",
}

// String returns the text ibv_wc_status_str gives for s ("unknown" for a
// value outside the enumeration, as libibverbs does).
func (s Status) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return "unknown"
}

// Opcode is the operation a work completion reports. Values equal enum
// ibv_wc_opcode.
type Opcode uint8

// Work completion opcodes (enum ibv_wc_opcode).
const (
	OpSend            Opcode = 0   // IBV_WC_SEND
	OpRDMAWrite       Opcode = 1   // IBV_WC_RDMA_WRITE
	OpRDMARead        Opcode = 2   // IBV_WC_RDMA_READ
	OpCompSwap        Opcode = 3   // IBV_WC_COMP_SWAP
	OpFetchAdd        Opcode = 4   // IBV_WC_FETCH_ADD
	OpBindMW          Opcode = 5   // IBV_WC_BIND_MW
	OpLocalInv        Opcode = 6   // IBV_WC_LOCAL_INV
	OpTSO             Opcode = 7   // IBV_WC_TSO
	OpFlush           Opcode = 8   // IBV_WC_FLUSH
	OpAtomicWrite     Opcode = 9   // IBV_WC_ATOMIC_WRITE
	OpRecv            Opcode = 128 // IBV_WC_RECV: receive-side completions have bit 7 set
	OpRecvRDMAWithImm Opcode = 129 // IBV_WC_RECV_RDMA_WITH_IMM
)

// String returns the enum name without the IBV_WC_ prefix, e.g. "RDMA_READ".
func (o Opcode) String() string {
	switch o {
	case OpSend:
		return "SEND"
	case OpRDMAWrite:
		return "RDMA_WRITE"
	case OpRDMARead:
		return "RDMA_READ"
	case OpCompSwap:
		return "COMP_SWAP"
	case OpFetchAdd:
		return "FETCH_ADD"
	case OpBindMW:
		return "BIND_MW"
	case OpLocalInv:
		return "LOCAL_INV"
	case OpTSO:
		return "TSO"
	case OpFlush:
		return "FLUSH"
	case OpAtomicWrite:
		return "ATOMIC_WRITE"
	case OpRecv:
		return "RECV"
	case OpRecvRDMAWithImm:
		return "RECV_RDMA_WITH_IMM"
	}
	return "Opcode(" + strconv.Itoa(int(o)) + ")"
}

// Flags are the wc_flags of a completion. Values equal enum ibv_wc_flags
// (note IP_CSUM_OK is bit 2 and WITH_INV bit 3 there).
type Flags uint8

// Work completion flags (enum ibv_wc_flags).
const (
	FlagGRH      Flags = 1 << 0 // IBV_WC_GRH: a GRH is present (always, on RoCEv2 UD)
	FlagWithImm  Flags = 1 << 1 // IBV_WC_WITH_IMM: ImmData is valid
	FlagIPCSumOK Flags = 1 << 2 // IBV_WC_IP_CSUM_OK
	FlagWithInv  Flags = 1 << 3 // IBV_WC_WITH_INV: InvalidatedRKey is valid
)

// String lists the set flags as "GRH|WITH_IMM"; "0" when none is set.
func (f Flags) String() string {
	if f == 0 {
		return "0"
	}
	names := [...]string{"GRH", "WITH_IMM", "IP_CSUM_OK", "WITH_INV"}
	var b []byte
	for i, n := range names {
		if f&(1<<i) != 0 {
			if len(b) > 0 {
				b = append(b, '|')
			}
			b = append(b, n...)
		}
	}
	if rest := f &^ 0xF; rest != 0 {
		if len(b) > 0 {
			b = append(b, '|')
		}
		b = append(b, "0x"+strconv.FormatUint(uint64(rest), 16)...)
	}
	return string(b)
}

// WC is a work completion: the ibv_wc fields that matter on RoCEv2.
//
// For an error completion only WRID, Status, QPNum and VendorErr are
// meaningful (as with ibv_wc); Opcode is still filled by softroce where it is
// known, but callers must not rely on it.
type WC struct {
	WRID      uint64 // the work request's wr_id
	Status    Status
	Opcode    Opcode
	VendorErr uint32
	ByteLen   uint32 // bytes transferred (receives, READs, atomics: 8)
	// ImmData is the ImmDt field as it appears on the wire, read big-endian
	// (bth.ImmDt.Imm). A softroce peer that posts immediate data X delivers X
	// here. A C peer's imm_data is a __be32 stored in memory as is, so its
	// host-order 0x1234 on x86 arrives as 0x34120000 (what rxe does too).
	// Valid with FlagWithImm.
	ImmData uint32
	// InvalidatedRKey is the rkey a SEND_WITH_INVALIDATE invalidated.
	// Valid with FlagWithInv.
	InvalidatedRKey uint32
	QPNum           uint32 // the local QP number
	SrcQP           uint32 // the remote QP number (UD receives)
	Flags           Flags
	SLID            uint16 // always 0 on RoCE
	SL              uint8
	DLIDPathBits    uint8 // always 0 on RoCE
	// IPVersion is, for a successful UD receive, the IP version (4 or 6)
	// of the datagram's header, which is the format of its GRH; 0
	// otherwise. libibverbs has no field for it (mlx5 puts it in sl, see
	// serve's rocePktType).
	IPVersion uint8
}
