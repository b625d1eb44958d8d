package memreg

import "fmt"

// MWType is a memory window's type (enum ibv_mw_type).
type MWType uint8

// Window types (IBTA vol. 1 §10.6.7.2). Type 2 windows behave as type 2B:
// bound to one QP, usable only by requests arriving on it.
const (
	MWType1 MWType = 1 // bound by a verb (ibv_bind_mw), keeps its PD's QPs
	MWType2 MWType = 2 // bound by a BIND_MW work request, tied to that QP
)

// String is "type 1" or "type 2".
func (t MWType) String() string { return fmt.Sprintf("type %d", uint8(t)) }

// windowAccess is what a window may grant: remote rights only (a window is
// reached only through its R_Key).
const windowAccess = AccessRemoteRead | AccessRemoteWrite | AccessRemoteAtomic

// MW is a memory window: a slot of the key table whose R_Key, once bound,
// gives remote access to a range of a region with rights of its own.
// Every field below pd is guarded by the table's mutex: binds, invalidations
// and deallocation take it for writing; an access through a window holds it
// for reading during its copy, so once a bind or an invalidation returns no
// copy through the old binding is in flight.
type MW struct {
	t   *Table
	idx uint32
	typ MWType
	pd  *PD

	alive   bool
	key     uint32
	prevKey uint32 // key before the last bind (for error reasons)
	mr      *MR    // nil: not bound
	addr    uint64
	length  uint64
	access  Access
	qpn     uint32 // type 2: the QP it is bound to
}

// AllocMW allocates an unbound window of type typ in pd (ibv_alloc_mw).
func (t *Table) AllocMW(pd *PD, typ MWType) (*MW, error) {
	if pd == nil || pd.t != t {
		return nil, fmt.Errorf("memreg: alloc MW: %w: PD of another table", ErrInvalidArgument)
	}
	if typ != MWType1 && typ != MWType2 {
		return nil, fmt.Errorf("memreg: alloc MW: %w: window type %d", ErrInvalidArgument, typ)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if !pd.alive {
		return nil, fmt.Errorf("memreg: alloc MW in PD %d: %w", pd.handle, ErrNotRegistered)
	}
	if t.nMW >= t.lim.MaxMW {
		return nil, fmt.Errorf("memreg: alloc MW: %w", &LimitError{Limit: "number of MWs", Max: uint64(t.lim.MaxMW)})
	}
	idx := t.allocSlot()
	s := &t.slots[idx]
	mw := &MW{t: t, idx: idx, typ: typ, pd: pd, alive: true,
		key: t.perm.encode(idx)<<8 | newKeyByte(s.lastKey)}
	s.mw = mw
	t.nMW++
	pd.nMW++
	return mw, nil
}

// DeallocMW frees a window (ibv_dealloc_mw). A bound window is unbound
// first, as rxe does; afterwards its keys fail.
func (t *Table) DeallocMW(mw *MW) error {
	if mw == nil || mw.t != t {
		return fmt.Errorf("memreg: dealloc MW: %w: MW of another table", ErrInvalidArgument)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if !mw.alive {
		return fmt.Errorf("memreg: dealloc MW: %w", ErrNotRegistered)
	}
	mw.unbind()
	mw.alive = false
	s := &t.slots[mw.idx]
	s.mw, s.lastKey = nil, mw.key
	t.free = append(t.free, mw.idx)
	t.nMW--
	mw.pd.nMW--
	return nil
}

// unbind detaches the window from its region; t.mu is held for writing.
func (mw *MW) unbind() {
	if mw.mr != nil {
		mw.mr.nMW--
		mw.mr = nil
	}
	mw.addr, mw.length, mw.access, mw.qpn = 0, 0, 0, 0
}

// Bind is a bind request: the region (by its L_Key), the range and the
// window's rights. For a type 2 window RKey is the new R_Key (its upper 24
// bits must be the window's, the low 8 are the consumer's, as in the
// BIND_MW work request); a type 1 window's new key is chosen by the table.
type Bind struct {
	MRKey  uint32 // L_Key of the region to bind to
	Addr   uint64
	Length uint64
	Access Access // REMOTE_READ, REMOTE_WRITE, REMOTE_ATOMIC
	RKey   uint32 // type 2, and type 1 with Verb: the new R_Key
	// Verb marks the work request the bind-MW verb (ibv_bind_mw) posts
	// for a type 1 window: the window takes the key RKey, chosen when the
	// verb was called. It is refused for a type 2 window.
	Verb bool
}

// BindMW binds mw on behalf of QP qpn of protection domain pd and returns
// the window's new R_Key. Type 1 windows are bound by the verb
// (ibv_bind_mw): each bind gives a new key byte, so keys of earlier
// bindings are stale, and a bind with Length 0 unbinds. Type 2 windows are
// bound by a BIND_MW work request on QP qpn and only while unbound (after
// allocation or an invalidation), to the key b.RKey. The rules (IBTA vol. 1
// §10.6.7.2; rxe_check_bind_mw): the window and the region belong to pd;
// the region allows MW_BIND; the range lies inside the region; the
// window's rights are remote ones, and REMOTE_WRITE or REMOTE_ATOMIC need
// LOCAL_WRITE on the region. On error nothing changes; errors wrap
// ErrInvalidArgument (ErrNotRegistered for a freed window or region).
func (t *Table) BindMW(mw *MW, pd *PD, qpn uint32, b Bind) (uint32, error) {
	if mw == nil || mw.t != t || pd == nil || pd.t != t {
		return 0, fmt.Errorf("memreg: bind MW: %w: object of another table", ErrInvalidArgument)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.bindLocked(mw, pd, qpn, b)
}

// BindMWKey is BindMW for the window whose current R_Key is mwKey, as a
// BIND_MW work request names it. An unknown key fails with
// ErrInvalidArgument.
func (t *Table) BindMWKey(mwKey uint32, pd *PD, qpn uint32, b Bind) (uint32, error) {
	if pd == nil || pd.t != t {
		return 0, fmt.Errorf("memreg: bind MW: %w: PD of another table", ErrInvalidArgument)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	idx := t.perm.decode(mwKey >> 8)
	if uint64(idx) >= uint64(len(t.slots)) || t.slots[idx].mw == nil || t.slots[idx].mw.key != mwKey {
		return 0, fmt.Errorf("memreg: bind MW %#08x: %w: no such window", mwKey, ErrInvalidArgument)
	}
	if mw := t.slots[idx].mw; mw.typ == MWType1 {
		// IBTA vol. 1 §10.6.7.2.1: a type 1 window is bound only by the
		// bind-MW verb, never by a BIND_MW work request.
		return 0, fmt.Errorf("memreg: bind MW %#08x: %w: a type 1 window is bound by the bind-MW verb, not a BIND_MW work request", mwKey, ErrInvalidArgument)
	}
	return t.bindLocked(t.slots[idx].mw, pd, qpn, b)
}

// WindowType reports the type of the window whose R_Key has the index of
// key (its key byte may differ: a bind may be pending), and whether there
// is one.
func (t *Table) WindowType(key uint32) (MWType, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	idx := t.perm.decode(key >> 8)
	if uint64(idx) >= uint64(len(t.slots)) || t.slots[idx].mw == nil {
		return 0, false
	}
	return t.slots[idx].mw.typ, true
}

// bindLocked is BindMW with t.mu held for writing.
func (t *Table) bindLocked(mw *MW, pd *PD, qpn uint32, b Bind) (uint32, error) {
	bad := func(format string, a ...any) (uint32, error) {
		return 0, fmt.Errorf("memreg: bind %v MW %#08x: %w: "+format, append([]any{mw.typ, mw.key, ErrInvalidArgument}, a...)...)
	}
	switch {
	case !mw.alive:
		return 0, fmt.Errorf("memreg: bind MW: %w", ErrNotRegistered)
	case mw.pd != pd:
		return bad("QP of another protection domain")
	case mw.typ == MWType2 && mw.mr != nil:
		return bad("a type 2 window must be invalidated before it is bound again")
	case mw.typ == MWType2 && b.RKey>>8 != mw.key>>8:
		return bad("new rkey %#08x does not keep the window's index", b.RKey)
	case mw.typ == MWType2 && qpn == NoQP:
		return bad("a type 2 window is bound by a work request on a QP")
	case mw.typ == MWType2 && b.Verb:
		return bad("a type 2 window is bound by a BIND_MW work request, not the bind-MW verb")
	case mw.typ == MWType1 && b.Verb && b.RKey>>8 != mw.key>>8:
		return bad("new rkey %#08x does not keep the window's index", b.RKey)
	case b.Access&^windowAccess != 0:
		return bad("access %v not allowed in a window", b.Access&^windowAccess)
	}
	if b.Length == 0 {
		if mw.typ == MWType2 {
			return bad("zero-length bind of a type 2 window")
		}
		mw.unbind()
		mw.prevKey, mw.key = mw.key, mw.type1Key(b)
		return mw.key, nil
	}
	mr := t.lookupMR(b.MRKey)
	if mr == nil {
		return bad("no region with lkey %#08x", b.MRKey)
	}
	// The region's fields change only under its write lock (rereg,
	// invalidate), which waits here; rereg is kept out entirely by t.mu.
	mr.mu.RLock()
	macc, maddr, msize, mstate := mr.access, mr.addr, uint64(len(mr.buf)), mr.state
	mr.mu.RUnlock()
	switch {
	case mstate != mrValid:
		return bad("region %#08x is invalidated", b.MRKey)
	case mr.pd != pd:
		return bad("region of another protection domain")
	case macc&AccessMWBind == 0:
		return bad("region %#08x lacks MW_BIND", b.MRKey)
	case b.Access&(AccessRemoteWrite|AccessRemoteAtomic) != 0 && macc&AccessLocalWrite == 0:
		return bad("%v over a region without LOCAL_WRITE", b.Access&(AccessRemoteWrite|AccessRemoteAtomic))
	case b.Addr < maddr || b.Addr-maddr > msize || b.Length > msize-(b.Addr-maddr):
		return bad("range [%#x, +%d) outside the region", b.Addr, b.Length)
	}
	mw.unbind()
	mr.nMW++
	mw.mr, mw.addr, mw.length, mw.access = mr, b.Addr, b.Length, b.Access
	mw.prevKey = mw.key
	if mw.typ == MWType2 {
		mw.key, mw.qpn = b.RKey, qpn
	} else {
		mw.key = mw.type1Key(b)
	}
	return mw.key, nil
}

// type1Key is a type 1 window's key after bind b: the verb's choice, or
// else a new key byte.
func (mw *MW) type1Key(b Bind) uint32 {
	if b.Verb {
		return b.RKey
	}
	return mw.key&^0xFF | newKeyByte(mw.key)
}

// lookupMR finds the registered region whose current key is key; t.mu is
// held.
func (t *Table) lookupMR(key uint32) *MR {
	idx := t.perm.decode(key >> 8)
	if uint64(idx) >= uint64(len(t.slots)) {
		return nil
	}
	mr := t.slots[idx].mr
	if mr == nil {
		return nil
	}
	mr.mu.RLock()
	defer mr.mu.RUnlock()
	if mr.key != key {
		return nil
	}
	return mr
}

// RKey returns the window's current R_Key.
func (mw *MW) RKey() uint32 { mw.t.mu.RLock(); defer mw.t.mu.RUnlock(); return mw.key }

// Type returns the window's type.
func (mw *MW) Type() MWType { return mw.typ }

// PD returns the window's protection domain.
func (mw *MW) PD() *PD { return mw.pd }

// Bound reports whether the window is bound, and to what.
func (mw *MW) Bound() (mr *MR, addr, length uint64, access Access, ok bool) {
	mw.t.mu.RLock()
	defer mw.t.mu.RUnlock()
	return mw.mr, mw.addr, mw.length, mw.access, mw.mr != nil
}

// beginMW is begin for a window's key, entered with t.mu read-locked. On
// success it keeps t.mu and takes the region's read lock; on failure it
// releases t.mu and returns the reason.
func (t *Table) beginMW(mw *MW, pd *PD, qpn, key uint32, va, length uint64, need Access) (ref, uint64, string) {
	// Order as rxe check_rkey for windows: key, state, PD or QP, rights,
	// range.
	reason := ""
	switch {
	case mw.key != key && mw.prevKey == key:
		reason = ReasonStaleKey
	case mw.key != key:
		reason = ReasonBadKey
	case mw.mr == nil:
		reason = ReasonMWNotBound
	case mw.typ == MWType1 && mw.pd != pd:
		reason = ReasonWrongPD
	case mw.typ == MWType2 && mw.qpn != qpn:
		reason = ReasonMWWrongQP
	case mw.access&need != need:
		reason = reasonMissingPerm + (need &^ mw.access).String()
	case va+length < va:
		reason = ReasonOverflow
	case va < mw.addr || va-mw.addr > mw.length || length > mw.length-(va-mw.addr):
		reason = ReasonOutOfBounds
	}
	if reason != "" {
		t.mu.RUnlock()
		return ref{}, 0, reason
	}
	mr := mw.mr
	mr.mu.RLock()
	if mr.state != mrValid {
		mr.mu.RUnlock()
		t.mu.RUnlock()
		return ref{}, 0, ReasonInvalidated
	}
	// The bind checked the range against the region, and the region
	// cannot be re-registered while bound.
	return ref{mr: mr, viaMW: true}, va - mr.addr, ""
}

// invalidateMW is invalidate for a window's key.
func (t *Table) invalidateMW(mw *MW, pd *PD, qpn, rkey uint32, remote bool) error {
	fail := func(reason string) error {
		return &AccessError{Class: ClassInvalidRequest, Reason: reason, Key: rkey}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case !mw.alive:
		return fail(ReasonDeregistered)
	case mw.key != rkey && mw.prevKey == rkey:
		return fail(ReasonStaleKey)
	case mw.key != rkey:
		return fail(ReasonBadKey)
	case mw.typ == MWType1 && remote:
		return fail(ReasonNotRemoteInvalidatable)
	case mw.typ == MWType1:
		// Only a zero-length bind unbinds a type 1 window, not LOCAL_INV
		// (rxe_invalidate_mw refuses type 1 too).
		return fail(ReasonMWType1Invalidate)
	case mw.mr == nil:
		return fail(ReasonMWNotBound)
	case mw.pd != pd:
		return fail(ReasonWrongPD)
	case remote && mw.qpn != qpn:
		return fail(ReasonMWWrongQP)
	}
	mw.unbind()
	return nil
}
