package memreg

import (
	"errors"
	"fmt"
)

// ErrorClass says how the transport must report an access failure.
type ErrorClass uint8

// Error classes.
const (
	// ClassRemoteAccess: bad, stale or invalidated R_Key, wrong PD, missing
	// remote permission, range outside the region. The responder NAKs with
	// "remote access error" (AETH NAK code 0x62; rxe check_rkey,
	// mr_check_range); the requester completes REM_ACCESS_ERR.
	ClassRemoteAccess ErrorClass = iota + 1
	// ClassInvalidRequest: a request that cannot be valid whatever the
	// region, e.g. a misaligned atomic (IBTA atomics need 8-byte
	// alignment; rxe rxe_mr_do_atomic_op) or an unknown atomic operation.
	// NAK 0x61; the requester completes REM_INV_REQ_ERR.
	ClassInvalidRequest
	// ClassLocalProtection: a local L_Key check (SGE gather/scatter) failed.
	// The work request completes with LOC_PROT_ERR.
	ClassLocalProtection
)

// String names the class the way a completion status would.
func (c ErrorClass) String() string {
	switch c {
	case ClassRemoteAccess:
		return "remote access error"
	case ClassInvalidRequest:
		return "invalid request"
	case ClassLocalProtection:
		return "local protection error"
	}
	return fmt.Sprintf("ErrorClass(%d)", uint8(c))
}

// Sentinels matched (with errors.Is) by every *AccessError of the class.
var (
	ErrRemoteAccess    = errors.New("memreg: remote access error")
	ErrInvalidRequest  = errors.New("memreg: invalid request")
	ErrLocalProtection = errors.New("memreg: local protection error")
)

// Sentinels of the management calls (wrapped; match with errors.Is).
var (
	ErrInvalidArgument = errors.New("memreg: invalid argument")       // bad flags, empty buffer, foreign object
	ErrBusy            = errors.New("memreg: resource busy")          // PD still has memory regions
	ErrNotRegistered   = errors.New("memreg: not registered")         // MR deregistered / PD deallocated
	ErrLimit           = errors.New("memreg: resource limit reached") // matched by every *LimitError
)

// Reasons an access fails, as they appear in AccessError.Reason.
const (
	ReasonBadKey       = "bad key (no such region)"
	ReasonStaleKey     = "stale key (region was re-registered)"
	ReasonDeregistered = "key of a deregistered region"
	ReasonInvalidated  = "key was invalidated"
	ReasonWrongPD      = "region belongs to another protection domain"
	ReasonOverflow     = "va+length overflows 64 bits"
	ReasonOutOfBounds  = "range outside the region"
	ReasonMisaligned   = "atomic target not 8-byte aligned"
	ReasonBadAtomicOp  = "unknown atomic operation"
	// ReasonNotRemoteInvalidatable: a SEND with invalidate named a region
	// a peer may not invalidate (one made by RegMR).
	ReasonNotRemoteInvalidatable = "region kind may not be invalidated remotely"
	reasonMissingPerm            = "missing permission "
	// ReasonMWNotBound: the key is a window's, but the window is not bound
	// (never bound, unbound by a zero-length bind, or invalidated).
	ReasonMWNotBound = "memory window is not bound"
	// ReasonMWWrongQP: a type 2 window used through another QP than the
	// one it is bound to (type 2B, IBTA vol. 1 §10.6.7.2).
	ReasonMWWrongQP = "type 2 memory window bound to another QP"
	// ReasonMWType1Invalidate: LOCAL_INV named a type 1 window, which only
	// a zero-length bind unbinds.
	ReasonMWType1Invalidate = "type 1 memory window cannot be invalidated"
)

// AccessError is a failed access check: which key, which range, why, and
// the class that decides the NAK or completion status.
type AccessError struct {
	Class  ErrorClass
	Reason string // one of the Reason constants, or "missing permission X"
	Key    uint32 // the R_Key or L_Key presented
	VA     uint64 // start of the range asked for
	Len    uint64 // its length
}

// Error reads like "memreg: remote access error: key 0x1a2b3c04 range
// [0x7f00001000, +64): missing permission REMOTE_WRITE".
func (e *AccessError) Error() string {
	return fmt.Sprintf("memreg: %v: key %#08x range [%#x, +%d): %s", e.Class, e.Key, e.VA, e.Len, e.Reason)
}

// Is matches the sentinel of e's class.
func (e *AccessError) Is(target error) bool {
	switch target {
	case ErrRemoteAccess:
		return e.Class == ClassRemoteAccess
	case ErrInvalidRequest:
		return e.Class == ClassInvalidRequest
	case ErrLocalProtection:
		return e.Class == ClassLocalProtection
	}
	return false
}

// LimitError says which table limit a registration would exceed.
type LimitError struct {
	Limit string // "number of MRs", "MR size" or "number of PDs"
	Max   uint64
}

// Error reads like "memreg: limit exceeded: number of MRs (max 65536)".
func (e *LimitError) Error() string {
	return fmt.Sprintf("memreg: limit exceeded: %s (max %d)", e.Limit, e.Max)
}

// Is matches ErrLimit.
func (e *LimitError) Is(target error) bool { return target == ErrLimit }
