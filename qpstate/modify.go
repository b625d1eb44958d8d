package qpstate

import "fmt"

// TransitionError is the error of a Modify that ibv_modify_qp would reject
// with EINVAL. It names the QP type, the transition and the attributes at
// fault.
type TransitionError struct {
	Type     Type
	From, To State
	Missing  AttrMask // required attributes the mask lacked
	Extra    AttrMask // attributes the transition does not accept
	Invalid  AttrMask // attributes present with an out-of-range value
	Reason   string   // what is wrong, in words, including the attribute names
}

// Error reads like "qpstate: RC INIT->RTR: missing required attribute(s)
// PATH_MTU|RQ_PSN".
func (e *TransitionError) Error() string {
	return fmt.Sprintf("qpstate: %v %v->%v: %s", e.Type, e.From, e.To, e.Reason)
}

// rule is one cell of the transition table: whether the transition exists
// for a QP type, and its required and optional attributes (AttrState, which
// every transition accepts, is in neither).
type rule struct {
	valid    [3]bool // indexed by Type
	req, opt [3]AttrMask
}

// Shorthands for the table below.
const (
	aAcc  = AttrAccessFlags
	aPKey = AttrPKeyIndex
	aQKey = AttrQKey
	aCur  = AttrCurState
	aAlt  = AttrAltPath
	aMig  = AttrPathMigState
	aRNRT = AttrMinRNRTimer
)

var all3 = [3]bool{true, true, true}

// table is IBTA vol. 1 §11.2.5.2 (Modify QP: required and optional
// attributes per state transition), as the Linux RDMA core encodes it in
// verbs.c (qp_state_table) and checks in ib_modify_qp_is_ok for every
// provider. Cells left zero are illegal transitions.
//
// One deliberate difference: the kernel marks SQE->RTS valid for every type
// (RC with no attributes), but an RC QP never enters SQE (a send error moves
// it straight to ERR, IBTA §10.3), so SQE->RTS is legal for UC and UD only.
var table = [Err + 1][Err + 1]rule{
	Reset: {
		Reset: {valid: all3},
		Init: {valid: all3, req: [3]AttrMask{
			RC: aPKey | AttrPort | aAcc,
			UC: aPKey | AttrPort | aAcc,
			UD: aPKey | AttrPort | aQKey,
		}},
		Err: {valid: all3},
	},
	Init: {
		Reset: {valid: all3},
		Init: {valid: all3, opt: [3]AttrMask{
			RC: aPKey | AttrPort | aAcc,
			UC: aPKey | AttrPort | aAcc,
			UD: aPKey | AttrPort | aQKey,
		}},
		RTR: {valid: all3,
			req: [3]AttrMask{
				RC: AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN | AttrMaxDestRDAtomic | aRNRT,
				UC: AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN,
			},
			opt: [3]AttrMask{
				RC: aAlt | aAcc | aPKey,
				UC: aAlt | aAcc | aPKey,
				UD: aPKey | aQKey,
			}},
		Err: {valid: all3},
	},
	RTR: {
		Reset: {valid: all3},
		RTS: {valid: all3,
			req: [3]AttrMask{
				RC: AttrTimeout | AttrRetryCnt | AttrRNRRetry | AttrSQPSN | AttrMaxQPRDAtomic,
				UC: AttrSQPSN,
				UD: AttrSQPSN,
			},
			opt: [3]AttrMask{
				RC: aCur | aAlt | aAcc | aRNRT | aMig,
				UC: aCur | aAlt | aAcc | aMig,
				UD: aCur | aQKey,
			}},
		Err: {valid: all3},
	},
	RTS: {
		Reset: {valid: all3},
		RTS: {valid: all3, opt: [3]AttrMask{
			RC: aCur | aAcc | aAlt | aMig | aRNRT,
			UC: aCur | aAcc | aAlt | aMig,
			UD: aCur | aQKey,
		}},
		SQD: {valid: all3, opt: [3]AttrMask{
			RC: AttrEnSQDAsyncNotify,
			UC: AttrEnSQDAsyncNotify,
			UD: AttrEnSQDAsyncNotify,
		}},
		Err: {valid: all3},
	},
	SQD: {
		Reset: {valid: all3},
		RTS: {valid: all3, opt: [3]AttrMask{
			RC: aCur | aAlt | aAcc | aRNRT | aMig,
			UC: aCur | aAlt | aAcc | aMig,
			UD: aCur | aQKey,
		}},
		SQD: {valid: all3, opt: [3]AttrMask{
			RC: AttrPort | AttrAV | AttrTimeout | AttrRetryCnt | AttrRNRRetry |
				AttrMaxQPRDAtomic | AttrMaxDestRDAtomic | aAlt | aAcc | aPKey | aRNRT | aMig,
			UC: AttrAV | aAlt | aAcc | aPKey | aMig,
			UD: aPKey | aQKey,
		}},
		Err: {valid: all3},
	},
	SQE: {
		Reset: {valid: all3},
		RTS: {valid: [3]bool{RC: false, UC: true, UD: true}, opt: [3]AttrMask{
			UC: aCur | aAcc,
			UD: aCur | aQKey,
		}},
		Err: {valid: all3},
	},
	Err: {
		Reset: {valid: all3},
		Err:   {valid: all3},
	},
}

// RequiredOptional returns the attributes a transition from -> to of a QP of
// type t requires and the ones it additionally accepts. AttrState is implied
// and in neither mask. ok is false for an illegal transition (or an unknown
// type or state).
func RequiredOptional(t Type, from, to State) (required, optional AttrMask, ok bool) {
	if t > UD || from > Err || to > Err {
		return 0, 0, false
	}
	r := &table[from][to]
	if !r.valid[t] {
		return 0, 0, false
	}
	return r.req[t], r.opt[t], true
}

// validMTUs are the path MTUs IBTA defines (enum ibv_mtu: 256..4096 bytes).
func validMTU(mtu int) bool {
	switch mtu {
	case 256, 512, 1024, 2048, 4096:
		return true
	}
	return false
}

// Modify validates a Modify QP of a QP of type t in state cur that sets the
// attributes in mask (values in attr), exactly as ibv_modify_qp does, and
// returns the state the QP is in afterwards.
//
// Without AttrState in the mask the QP stays in cur, and the call is the
// cur -> cur transition: legal where the table has one (INIT->INIT,
// RTS->RTS, SQD->SQD, RESET->RESET, ERR->ERR), illegal elsewhere (e.g. RTR).
// Any state may go to RESET or ERR, with no other attribute.
// AttrCurState, where accepted, must equal cur: it is the consumer's claim
// about the state (which may have changed on its own, e.g. to SQE or ERR),
// and a wrong claim fails rather than overriding the real state as the
// Linux providers let it.
//
// Values are checked for the attributes in the mask: PathMTU in {256, 512,
// 1024, 2048, 4096}; Timeout <= 31; RetryCnt, RNRRetry <= 7; MinRNRTimer
// <= 31; RQPSN, SQPSN, DestQPN <= 0xFFFFFF; Port >= 1; AV.FlowLabel <=
// 0xFFFFF; AV.SL <= 15. Limits of a particular device (max_qp_rd_atom, the
// active MTU, the number of ports) are the caller's to check.
//
// attr may be nil only when mask is 0. Every error is a *TransitionError.
func Modify(t Type, cur State, mask AttrMask, attr *Attr) (next State, err error) {
	fail := func(to State, missing, extra, invalid AttrMask, format string, args ...any) (State, error) {
		return cur, &TransitionError{Type: t, From: cur, To: to, Missing: missing, Extra: extra,
			Invalid: invalid, Reason: fmt.Sprintf(format, args...)}
	}
	if t > UD {
		return fail(cur, 0, 0, 0, "unknown QP type")
	}
	if cur > Err {
		return fail(cur, 0, 0, 0, "unknown current state")
	}
	if unknown := mask &^ attrAll; unknown != 0 {
		return fail(cur, 0, unknown, 0, "unknown attribute mask bits %v", unknown)
	}
	if mask != 0 && attr == nil {
		return fail(cur, 0, 0, 0, "attribute mask %v given without attributes", mask)
	}
	to := cur
	if mask&AttrState != 0 {
		to = attr.State
		if to > Err {
			return fail(to, 0, 0, AttrState, "STATE %d is not a QP state", uint8(to))
		}
	}
	req, opt, ok := RequiredOptional(t, cur, to)
	if !ok {
		return fail(to, 0, 0, 0, "illegal transition")
	}
	missing := req &^ mask
	extra := mask &^ (req | opt | AttrState)
	switch {
	case missing != 0 && extra != 0:
		return fail(to, missing, extra, 0, "missing required attribute(s) %v; attribute(s) not allowed in this transition: %v", missing, extra)
	case missing != 0:
		return fail(to, missing, 0, 0, "missing required attribute(s) %v", missing)
	case extra != 0:
		return fail(to, 0, extra, 0, "attribute(s) not allowed in this transition: %v", extra)
	}
	if mask == 0 {
		return to, nil
	}
	bad := func(a AttrMask, format string, args ...any) (State, error) {
		return fail(to, 0, 0, a, "%v: "+format, append([]any{a}, args...)...)
	}
	switch {
	case mask&AttrCurState != 0 && attr.CurState != cur:
		return bad(AttrCurState, "%v does not match the current state %v", attr.CurState, cur)
	case mask&AttrPathMTU != 0 && !validMTU(attr.PathMTU):
		return bad(AttrPathMTU, "%d bytes is not a path MTU (256, 512, 1024, 2048 or 4096)", attr.PathMTU)
	case mask&AttrTimeout != 0 && attr.Timeout > 31:
		return bad(AttrTimeout, "%d exceeds 31", attr.Timeout)
	case mask&AttrRetryCnt != 0 && attr.RetryCnt > 7:
		return bad(AttrRetryCnt, "%d exceeds 7", attr.RetryCnt)
	case mask&AttrRNRRetry != 0 && attr.RNRRetry > 7:
		return bad(AttrRNRRetry, "%d exceeds 7", attr.RNRRetry)
	case mask&AttrMinRNRTimer != 0 && attr.MinRNRTimer > 31:
		return bad(AttrMinRNRTimer, "%d exceeds 31", attr.MinRNRTimer)
	case mask&AttrRQPSN != 0 && attr.RQPSN > 0xFFFFFF:
		return bad(AttrRQPSN, "%#x exceeds 24 bits", attr.RQPSN)
	case mask&AttrSQPSN != 0 && attr.SQPSN > 0xFFFFFF:
		return bad(AttrSQPSN, "%#x exceeds 24 bits", attr.SQPSN)
	case mask&AttrDestQPN != 0 && attr.DestQPN > 0xFFFFFF:
		return bad(AttrDestQPN, "%#x exceeds 24 bits", attr.DestQPN)
	case mask&AttrPort != 0 && attr.Port == 0:
		return bad(AttrPort, "port numbers start at 1")
	case mask&AttrAV != 0 && attr.AV.FlowLabel > 0xFFFFF:
		return bad(AttrAV, "flow label %#x exceeds 20 bits", attr.AV.FlowLabel)
	case mask&AttrAV != 0 && attr.AV.SL > 15:
		return bad(AttrAV, "service level %d exceeds 15", attr.AV.SL)
	}
	return to, nil
}
