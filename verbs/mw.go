package verbs

import (
	"fmt"

	"github.com/softroce/softroce/memreg"
	"github.com/softroce/softroce/wr"
)

// MWType is a memory window's type (enum ibv_mw_type).
type MWType = memreg.MWType

// Window types. Type 2 windows are type 2B: usable only through the QP the
// BIND_MW work request was posted on.
const (
	MWType1 = memreg.MWType1 // IBV_MW_TYPE_1: bound with MW.Bind
	MWType2 = memreg.MWType2 // IBV_MW_TYPE_2: bound with a WRBindMW work request
)

// MWBind is the window binding of a WRBindMW work request (the bind_mw
// part of struct ibv_send_wr); MW.BindWR fills it.
type MWBind = wr.MWBind

// MW is a memory window (struct ibv_mw).
type MW struct {
	pd *PD
	mw *memreg.MW
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
	return &MW{pd: pd, mw: mw}, nil
}

// RKey is the window's current R_Key: the one to give a peer once bound.
func (mw *MW) RKey() uint32 { return mw.mw.RKey() }

// Type is the window's type.
func (mw *MW) Type() MWType { return mw.mw.Type() }

// Bind binds a type 1 window to [addr, addr+length) of mr with the remote
// rights in access (REMOTE_READ, REMOTE_WRITE, REMOTE_ATOMIC), on behalf
// of qp, and returns the new R_Key (ibv_bind_mw); every bind gives a new
// key, so the previous one stops working. A length of 0 (mr may be nil)
// unbinds. mr needs AccessMWBind, and REMOTE_WRITE or REMOTE_ATOMIC need
// AccessLocalWrite on mr. Unlike ibv_bind_mw, the bind takes effect when
// Bind returns, and produces no completion. A failed Bind changes nothing.
// Type 2 windows are bound with a WRBindMW work request (BindWR).
func (mw *MW) Bind(qp *QP, mr *MR, addr, length uint64, access Access) (uint32, error) {
	if err := qp.usable("bind MW"); err != nil {
		return 0, err
	}
	if mw.Type() != MWType1 {
		return 0, fmt.Errorf("verbs: bind MW: a %v window is bound with a BIND_MW work request", mw.Type())
	}
	if qp.pd.d != mw.pd.d {
		return 0, fmt.Errorf("verbs: bind MW: QP of another device")
	}
	var key uint32
	if mr != nil {
		key = mr.LKey()
	} else if length != 0 {
		return 0, fmt.Errorf("verbs: bind MW: no MR for %d bytes", length)
	}
	return mw.pd.d.mrs.BindMW(mw.mw, qp.pd.pd, qp.Num(), memreg.Bind{MRKey: key, Addr: addr, Length: length, Access: access})
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
