package verbs

import (
	"fmt"
	"sync"

	"github.com/softroce/softroce/memreg"
	"github.com/softroce/softroce/wr"
)

// MWType is a memory window's type (enum ibv_mw_type).
type MWType = memreg.MWType

// Window types. Type 2 windows are type 2B: usable only through the QP the
// BIND_MW work request was posted on.
const (
	MWType1 = memreg.MWType1 // IBV_MW_TYPE_1: bound with MW.Bind (ibv_bind_mw)
	MWType2 = memreg.MWType2 // IBV_MW_TYPE_2: bound with a WRBindMW work request
)

// MWBind is the window binding of a WRBindMW work request (the bind_mw
// part of struct ibv_send_wr); MW.BindWR fills it.
type MWBind = wr.MWBind

// MW is a memory window (struct ibv_mw).
type MW struct {
	pd *PD
	mw *memreg.MW

	// Type 1: the key the last Bind returned, as ibv_mw.rkey, which the
	// bind-MW verb updates when it posts; mu orders concurrent Binds.
	mu  sync.Mutex
	key uint32
}

// AllocMW allocates an unbound memory window of type typ in the PD
// (ibv_alloc_mw). At most max_mw windows exist at once.
func (pd *PD) AllocMW(typ MWType) (*MW, error) {
	if err := pd.d.unusable("alloc MW"); err != nil {
		return nil, err
	}
	mw, err := pd.d.mrs.AllocMW(pd.pd, typ)
	if err != nil {
		return nil, err
	}
	return &MW{pd: pd, mw: mw, key: mw.RKey()}, nil
}

// RKey is the window's R_Key: the one to give a peer once bound. For a
// type 1 window it is the key the last Bind returned, from the moment
// Bind returns (as ibv_mw.rkey): if that bind then completes in error the
// window keeps its earlier binding and key, and RKey names no binding
// until the next successful Bind.
func (mw *MW) RKey() uint32 {
	if mw.Type() == MWType1 {
		mw.mu.Lock()
		defer mw.mu.Unlock()
		return mw.key
	}
	return mw.mw.RKey()
}

// Type is the window's type.
func (mw *MW) Type() MWType { return mw.mw.Type() }

// MWBindInfo is what a type 1 window is bound to (struct
// ibv_mw_bind_info): [Addr, Addr+Length) of MR with the remote rights in
// Access (REMOTE_READ, REMOTE_WRITE, REMOTE_ATOMIC). A Length of 0 with a
// nil MR unbinds.
type MWBindInfo struct {
	MR     *MR
	Addr   uint64
	Length uint64
	Access Access
}

// Bind binds a type 1 window (ibv_bind_mw): it posts a bind work request
// with ID wrID and flags (SendSignaled, SendFence) on qp's send queue and
// returns the window's new R_Key at once, which RKey reports from then on.
// The bind runs in order with qp's other send work requests, so an
// operation posted before it still sees the previous binding; every bind
// gives a new key, so the previous one stops working once it has run. It
// completes as a BIND_MW work request (a work completion with OpBindMW
// when signaled, or always with sq_sig_all). Bind itself refuses what the
// verb checks when posting: a type 2 window (bound with BindWR), a range
// without a region, a region of another protection domain than the
// window's, and whatever ibv_post_send refuses (a QP not in RTS, a full
// send queue). The binding rules proper (MW_BIND on the region, the range
// inside it, REMOTE_WRITE or REMOTE_ATOMIC only over a region with
// LOCAL_WRITE, rights a window may grant, QP and window in one PD) are
// checked when the bind runs: a failure completes with MW_BIND_ERR and
// moves the QP to ERR, as rxe does.
func (mw *MW) Bind(qp *QP, info MWBindInfo, wrID uint64, flags SendFlags) (uint32, error) {
	mw.mu.Lock()
	defer mw.mu.Unlock()
	key := IncRKey(mw.key)
	if err := mw.bindLocked(qp, info, key, wrID, flags); err != nil {
		return 0, err
	}
	return key, nil
}

// BindKey is Bind with the window's new R_Key chosen by the caller:
// newRKey keeps the window's index (the upper 24 bits of its R_Key) and
// only the key byte is the caller's, as in a BIND_MW work request. A
// program that computes the key itself (ibv_inc_rkey of ibv_mw.rkey, as
// the bind-MW verb of libibverbs does) posts binds on several QPs whose
// send queues may run in any order: each bind gives the window exactly
// the key it names, and RKey reports the key of the last BindKey posted.
// A key with another index is refused.
func (mw *MW) BindKey(qp *QP, info MWBindInfo, newRKey uint32, wrID uint64, flags SendFlags) error {
	mw.mu.Lock()
	defer mw.mu.Unlock()
	if newRKey>>8 != mw.key>>8 {
		return fmt.Errorf("verbs: bind MW: new rkey %#08x does not keep the window's index (rkey %#08x)", newRKey, mw.key)
	}
	return mw.bindLocked(qp, info, newRKey, wrID, flags)
}

// bindLocked posts the bind of Bind and BindKey giving the window key;
// mw.mu is held.
func (mw *MW) bindLocked(qp *QP, info MWBindInfo, key uint32, wrID uint64, flags SendFlags) error {
	if err := qp.usable("bind MW"); err != nil {
		return err
	}
	if mw.Type() != MWType1 {
		return fmt.Errorf("verbs: bind MW: a %v window is bound with a BIND_MW work request", mw.Type())
	}
	if qp.pd.d != mw.pd.d {
		return fmt.Errorf("verbs: bind MW: QP of another device")
	}
	var lkey uint32
	switch {
	case info.MR == nil && (info.Addr != 0 || info.Length != 0):
		return fmt.Errorf("verbs: bind MW: no MR for [%#x, +%d)", info.Addr, info.Length)
	case info.Access&memreg.AccessZeroBased != 0:
		return fmt.Errorf("verbs: bind MW: zero-based windows are not supported")
	case info.MR != nil && info.MR.PD() != mw.pd.pd:
		return fmt.Errorf("verbs: bind MW: MR of another protection domain than the window's")
	case info.MR != nil:
		lkey = info.MR.LKey()
	}
	w := SendWR{ID: wrID, Opcode: WRBindMW, Flags: flags, Bind: MWBind{RKey: key, MRKey: lkey,
		Addr: info.Addr, Length: info.Length, Access: uint32(info.Access)}}
	if err := qp.rc.PostBindMW(&w, mw.mw); err != nil {
		return err
	}
	mw.key = key
	return nil
}

// BindWR returns the WRBindMW work request that binds this type 2 window
// to [addr, addr+length) of mr with the rights in access, giving it the
// R_Key newRKey: the window's key with new low 8 bits (IncRKey(mw.RKey())
// is the usual choice, as ibv_inc_rkey). Post it on the QP the window is
// to serve; once it completes the window's RKey is newRKey.
func (mw *MW) BindWR(id uint64, flags SendFlags, mr *MR, addr, length uint64, access Access, newRKey uint32) SendWR {
	return SendWR{ID: id, Opcode: WRBindMW, Flags: flags, Bind: MWBind{MWKey: mw.RKey(), RKey: newRKey, MRKey: mr.LKey(),
		Addr: addr, Length: length, Access: uint32(access)}}
}

// IncRKey is rkey with its low 8 bits (the key byte) incremented
// (ibv_inc_rkey).
func IncRKey(rkey uint32) uint32 { return rkey&^0xFF | (rkey+1)&0xFF }

// Dealloc frees the window (ibv_dealloc_mw); a bound window is unbound
// first.
func (mw *MW) Dealloc() error {
	if err := mw.pd.d.isClosed("dealloc MW"); err != nil {
		return err
	}
	return mw.pd.d.mrs.DeallocMW(mw.mw)
}
