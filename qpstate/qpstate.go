// Package qpstate is the queue pair state machine of IBTA vol. 1 §10.3
// (figure "QP/EE State Diagram") and the attribute rules of Modify QP
// (§11.2.5.2, the table of required and optional attributes per transition),
// as ibv_modify_qp enforces them. It is pure logic: no I/O, no QP object.
//
// The transition table equals the one the Linux RDMA core checks before any
// provider (rxe included) sees a modify_qp, so a sequence of modifications
// that works with libibverbs works here and one it rejects is rejected here
// (for RC, UC and UD; the XRC, raw and management QP types are not modelled).
//
// Flushing: entering ERR (whether by Modify or because the transport hit a
// fatal error) makes every outstanding and every later posted work request
// complete with status WR_FLUSH_ERR (IBTA §10.3, the Error state). The QP
// implements that; FlushOnError tells it when.
package qpstate

import (
	"fmt"
	"math/bits"
	"strings"
)

// State is a QP state. Values equal enum ibv_qp_state.
type State uint8

// QP states (IBTA vol. 1 §10.3).
const (
	Reset State = iota // IBV_QPS_RESET
	Init               // IBV_QPS_INIT
	RTR                // IBV_QPS_RTR: ready to receive
	RTS                // IBV_QPS_RTS: ready to send
	SQD                // IBV_QPS_SQD: send queue drain(ed)
	SQE                // IBV_QPS_SQE: send queue error (UC, UD)
	Err                // IBV_QPS_ERR
)

var stateNames = [...]string{"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"}

// String returns the state's name ("RESET", "INIT", "RTR", "RTS", "SQD",
// "SQE", "ERR").
func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// Type is a QP transport service type.
type Type uint8

// QP types.
const (
	RC Type = iota // reliable connection
	UC             // unreliable connection
	UD             // unreliable datagram
)

// String returns "RC", "UC" or "UD".
func (t Type) String() string {
	switch t {
	case RC:
		return "RC"
	case UC:
		return "UC"
	case UD:
		return "UD"
	}
	return fmt.Sprintf("Type(%d)", uint8(t))
}

// AttrMask selects the attributes a Modify sets. Bit values equal enum
// ibv_qp_attr_mask.
type AttrMask uint32

// Attribute mask bits (enum ibv_qp_attr_mask).
const (
	AttrState            AttrMask = 1 << 0  // IBV_QP_STATE
	AttrCurState         AttrMask = 1 << 1  // IBV_QP_CUR_STATE
	AttrEnSQDAsyncNotify AttrMask = 1 << 2  // IBV_QP_EN_SQD_ASYNC_NOTIFY
	AttrAccessFlags      AttrMask = 1 << 3  // IBV_QP_ACCESS_FLAGS
	AttrPKeyIndex        AttrMask = 1 << 4  // IBV_QP_PKEY_INDEX
	AttrPort             AttrMask = 1 << 5  // IBV_QP_PORT
	AttrQKey             AttrMask = 1 << 6  // IBV_QP_QKEY
	AttrAV               AttrMask = 1 << 7  // IBV_QP_AV
	AttrPathMTU          AttrMask = 1 << 8  // IBV_QP_PATH_MTU
	AttrTimeout          AttrMask = 1 << 9  // IBV_QP_TIMEOUT
	AttrRetryCnt         AttrMask = 1 << 10 // IBV_QP_RETRY_CNT
	AttrRNRRetry         AttrMask = 1 << 11 // IBV_QP_RNR_RETRY
	AttrRQPSN            AttrMask = 1 << 12 // IBV_QP_RQ_PSN
	AttrMaxQPRDAtomic    AttrMask = 1 << 13 // IBV_QP_MAX_QP_RD_ATOMIC
	AttrAltPath          AttrMask = 1 << 14 // IBV_QP_ALT_PATH
	AttrMinRNRTimer      AttrMask = 1 << 15 // IBV_QP_MIN_RNR_TIMER
	AttrSQPSN            AttrMask = 1 << 16 // IBV_QP_SQ_PSN
	AttrMaxDestRDAtomic  AttrMask = 1 << 17 // IBV_QP_MAX_DEST_RD_ATOMIC
	AttrPathMigState     AttrMask = 1 << 18 // IBV_QP_PATH_MIG_STATE
	AttrCap              AttrMask = 1 << 19 // IBV_QP_CAP
	AttrDestQPN          AttrMask = 1 << 20 // IBV_QP_DEST_QPN
)

// attrAll is every bit this package knows.
const attrAll AttrMask = 1<<21 - 1

var attrNames = [...]string{
	"STATE", "CUR_STATE", "EN_SQD_ASYNC_NOTIFY", "ACCESS_FLAGS", "PKEY_INDEX",
	"PORT", "QKEY", "AV", "PATH_MTU", "TIMEOUT", "RETRY_CNT", "RNR_RETRY",
	"RQ_PSN", "MAX_QP_RD_ATOMIC", "ALT_PATH", "MIN_RNR_TIMER", "SQ_PSN",
	"MAX_DEST_RD_ATOMIC", "PATH_MIG_STATE", "CAP", "DEST_QPN",
}

// String lists the set bits with the libibverbs names minus the IBV_QP_
// prefix, lowest bit first, e.g. "PATH_MTU|DEST_QPN"; "0" for none.
func (m AttrMask) String() string {
	if m == 0 {
		return "0"
	}
	var b strings.Builder
	for r := m; r != 0; r &= r - 1 {
		i := bits.TrailingZeros32(uint32(r))
		if b.Len() > 0 {
			b.WriteByte('|')
		}
		if i < len(attrNames) {
			b.WriteString(attrNames[i])
		} else {
			fmt.Fprintf(&b, "0x%x", uint32(1)<<i)
		}
	}
	return b.String()
}

// AddressVector is the primary path of a connected QP on RoCEv2 (the GRH
// fields of ibv_ah_attr plus the resolved destination MAC).
type AddressVector struct {
	DGID         [16]byte // destination GID (IPv6, or IPv4-mapped ::ffff:a.b.c.d)
	SGIDIndex    uint8    // index of the source GID in the port's GID table
	HopLimit     uint8    // IPv6 hop limit / IPv4 TTL
	TrafficClass uint8    // IPv6 traffic class / IPv4 TOS (DSCP+ECN)
	FlowLabel    uint32   // 20 bits
	SL           uint8    // service level
	DMAC         [6]byte  // destination MAC
}

// Cap is the queue capacities of a QP (struct ibv_qp_cap).
type Cap struct {
	MaxSendWR, MaxRecvWR, MaxSendSGE, MaxRecvSGE, MaxInlineData int
}

// Attr holds the attribute values of a Modify (struct ibv_qp_attr). Only the
// fields selected by the mask are read.
type Attr struct {
	State, CurState State
	AccessFlags     uint32 // ibv_access_flags: REMOTE_WRITE, REMOTE_READ, REMOTE_ATOMIC, ...
	PKeyIndex       uint16
	Port            uint8 // 1-based port number
	QKey            uint32
	AV              AddressVector
	PathMTU         int // bytes: 256, 512, 1024, 2048 or 4096
	Timeout         uint8
	RetryCnt        uint8
	RNRRetry        uint8
	RQPSN, SQPSN    uint32
	MaxRDAtomic     uint8 // max_rd_atomic: READ/atomic requests this QP may have outstanding
	MaxDestRDAtomic uint8 // max_dest_rd_atomic: responder resources for the peer's READ/atomic
	MinRNRTimer     uint8 // RNR NAK timer code (the 5-bit encoding of the AETH), 0..31
	DestQPN         uint32
	Cap             Cap
}

// FlushOnError reports whether entering state next requires the QP to flush
// its work requests: true exactly for ERR (IBTA §10.3). Outstanding send
// and receive WRs then complete with WR_FLUSH_ERR in posting order, and WRs
// posted while in ERR complete the same way.
func FlushOnError(next State) bool { return next == Err }
