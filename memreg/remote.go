package memreg

import (
	"encoding/binary"
	"sync/atomic"
	"unsafe"
)

// ref is a region being accessed, with its read lock held; through a
// window also the table's read lock, which keeps the window bound for the
// whole copy. release drops them.
type ref struct {
	mr    *MR
	viaMW bool
}

func (r ref) release() {
	r.mr.mu.RUnlock()
	if r.viaMW {
		r.mr.t.mu.RUnlock()
	}
}

// begin looks key up and checks an access of length bytes at va needing the
// rights in need, for QP qpn (NoQP: none) of protection domain pd. On
// success it returns the region with its read lock held and the offset of
// va in the buffer; the caller must call release. Failures have class
// class and carry the reason. Only remote accesses (ClassRemoteAccess) may
// go through a window's R_Key.
//
// The order of checks follows rxe (check_rkey, lookup_mr, mr_check_range):
// key, state, PD, rights, then range; all of them are the same class, so
// the order only decides which reason is reported.
func (t *Table) begin(pd *PD, qpn, key uint32, va, length uint64, need Access, class ErrorClass) (ref, uint64, error) {
	fail := func(reason string) (ref, uint64, error) {
		return ref{}, 0, &AccessError{Class: class, Reason: reason, Key: key, VA: va, Len: length}
	}
	idx := t.perm.decode(key >> 8)
	t.mu.RLock()
	if uint64(idx) >= uint64(len(t.slots)) {
		t.mu.RUnlock()
		return fail(ReasonBadKey)
	}
	s := &t.slots[idx]
	if s.mw != nil {
		if class != ClassRemoteAccess {
			t.mu.RUnlock()
			return fail(ReasonBadKey) // an L_Key names regions only
		}
		r, off, reason := t.beginMW(s.mw, pd, qpn, key, va, length, need)
		if reason != "" {
			return fail(reason)
		}
		return r, off, nil
	}
	mr, dereg := s.mr, s.lastKey == key
	if mr == nil {
		t.mu.RUnlock()
		if dereg {
			return fail(ReasonDeregistered)
		}
		return fail(ReasonBadKey)
	}
	mr.mu.RLock()
	t.mu.RUnlock()

	reason := ""
	switch {
	case mr.key != key && mr.prevKey == key:
		reason = ReasonStaleKey
	case mr.key != key && dereg:
		reason = ReasonDeregistered
	case mr.key != key:
		reason = ReasonBadKey
	case mr.state != mrValid:
		reason = ReasonInvalidated
	case mr.pd != pd:
		reason = ReasonWrongPD
	case mr.access&need != need:
		reason = reasonMissingPerm + (need &^ mr.access).String()
	case va+length < va:
		reason = ReasonOverflow
	}
	if reason == "" {
		// Overflow-safe: va >= addr, then off <= size and length <= size-off.
		size := uint64(len(mr.buf))
		if va >= mr.addr {
			if off := va - mr.addr; off <= size && length <= size-off {
				return ref{mr: mr}, off, nil
			}
		}
		reason = ReasonOutOfBounds
	}
	mr.mu.RUnlock()
	return fail(reason)
}

// NoQP is the qpn of an access made for no particular QP: it never
// matches a type 2 window, which only its own QP may use.
const NoQP = ^uint32(0)

// Remote is the remote-access side of a table for one QP: the QP's
// protection domain and number, which type 2 windows are checked against
// (IBTA vol. 1 §10.6.7.2, type 2B: usable only through the QP they are
// bound to). It is a small value; making one does not allocate.
type Remote struct {
	t   *Table
	pd  *PD
	qpn uint32
}

// Remote returns the accessor for QP qpn of protection domain pd.
func (t *Table) Remote(pd *PD, qpn uint32) Remote { return Remote{t, pd, qpn} }

// CheckRemote is Remote(pd, NoQP).Check.
func (t *Table) CheckRemote(pd *PD, rkey uint32, va uint64, length uint64, need Access) error {
	return t.Remote(pd, NoQP).Check(rkey, va, length, need)
}

// RemoteWrite is Remote(pd, NoQP).Write.
func (t *Table) RemoteWrite(pd *PD, rkey uint32, va uint64, src []byte) error {
	return t.Remote(pd, NoQP).Write(rkey, va, src)
}

// RemoteRead is Remote(pd, NoQP).Read.
func (t *Table) RemoteRead(pd *PD, rkey uint32, va uint64, dst []byte) error {
	return t.Remote(pd, NoQP).Read(rkey, va, dst)
}

// RemoteAtomic is Remote(pd, NoQP).Atomic.
func (t *Table) RemoteAtomic(pd *PD, rkey uint32, va uint64, op AtomicOp, swapAdd, compare uint64) (uint64, error) {
	return t.Remote(pd, NoQP).Atomic(rkey, va, op, swapAdd, compare)
}

// RemoteAtomicWrite is Remote(pd, NoQP).AtomicWrite.
func (t *Table) RemoteAtomicWrite(pd *PD, rkey uint32, va uint64, val [8]byte) error {
	return t.Remote(pd, NoQP).AtomicWrite(rkey, va, val)
}

// Check checks, without touching memory, that a remote access of length
// bytes at va with R_Key rkey (a region's or a window's), needing the
// rights in need, may proceed. Failures are *AccessError of class
// ClassRemoteAccess (NAK 0x62).
//
// A zero-length access always succeeds without looking at rkey or va: IBTA
// C9-88 (a zero-length RDMA READ or WRITE does not validate the R_Key), as
// rxe does.
func (a Remote) Check(rkey uint32, va uint64, length uint64, need Access) error {
	if length == 0 {
		return nil
	}
	r, _, err := a.t.begin(a.pd, a.qpn, rkey, va, length, need, ClassRemoteAccess)
	if err != nil {
		return err
	}
	r.release()
	return nil
}

// Write executes the data of an RDMA WRITE (or one packet of it): checks
// REMOTE_WRITE access to [va, va+len(src)) and copies src there.
func (a Remote) Write(rkey uint32, va uint64, src []byte) error {
	if len(src) == 0 {
		return nil // C9-88
	}
	r, off, err := a.t.begin(a.pd, a.qpn, rkey, va, uint64(len(src)), AccessRemoteWrite, ClassRemoteAccess)
	if err != nil {
		return err
	}
	copy(r.mr.buf[off:], src)
	r.release()
	return nil
}

// Read executes (a segment of) an RDMA READ: checks REMOTE_READ access to
// [va, va+len(dst)) and copies it into dst.
func (a Remote) Read(rkey uint32, va uint64, dst []byte) error {
	if len(dst) == 0 {
		return nil // C9-88
	}
	r, off, err := a.t.begin(a.pd, a.qpn, rkey, va, uint64(len(dst)), AccessRemoteRead, ClassRemoteAccess)
	if err != nil {
		return err
	}
	copy(dst, r.mr.buf[off:])
	r.release()
	return nil
}

// AtomicOp is the operation of an RDMA atomic request.
type AtomicOp uint8

// Atomic operations (IBTA vol. 1 ch. 9, COMPARE_SWAP and FETCH_ADD).
const (
	AtomicCmpSwap  AtomicOp = iota // COMPARE_SWAP: if *va == compare { *va = swap }
	AtomicFetchAdd                 // FETCH_ADD: *va += add
)

// atomicTarget checks an 8-byte atomic access and returns the word with the
// region's read lock held. Alignment is checked after the access rights (so
// a bad key on a misaligned VA is still a remote access error, as in rxe)
// and on both the VA (IBTA: 8-byte aligned) and the host address
// (sync/atomic needs it; it differs from the VA only for zero-based
// regions).
func (a Remote) atomicTarget(rkey uint32, va uint64, need Access) (ref, *uint64, error) {
	r, off, err := a.t.begin(a.pd, a.qpn, rkey, va, 8, need, ClassRemoteAccess)
	if err != nil {
		return ref{}, nil, err
	}
	p := unsafe.Pointer(&r.mr.buf[off])
	if va&7 != 0 || uintptr(p)&7 != 0 {
		r.release()
		return ref{}, nil, &AccessError{Class: ClassInvalidRequest, Reason: ReasonMisaligned, Key: rkey, VA: va, Len: 8}
	}
	return r, (*uint64)(p), nil
}

// Atomic executes an atomic request: checks REMOTE_ATOMIC access to the 8
// bytes at va, which must be 8-byte aligned (else ClassInvalidRequest, NAK
// 0x61), and performs op on the host-order 64-bit word there with
// sync/atomic, so it is atomic with respect to every other atomic of the
// table (rxe's IB_ATOMIC_HCA guarantee). It returns the original value,
// which the responder sends big-endian in the AtomicAckETH.
func (a Remote) Atomic(rkey uint32, va uint64, op AtomicOp, swapAdd, compare uint64) (orig uint64, err error) {
	if op != AtomicCmpSwap && op != AtomicFetchAdd {
		return 0, &AccessError{Class: ClassInvalidRequest, Reason: ReasonBadAtomicOp, Key: rkey, VA: va, Len: 8}
	}
	r, p, err := a.atomicTarget(rkey, va, AccessRemoteAtomic)
	if err != nil {
		return 0, err
	}
	defer r.release()
	if op == AtomicFetchAdd {
		return atomic.AddUint64(p, swapAdd) - swapAdd, nil
	}
	for {
		old := atomic.LoadUint64(p)
		if old != compare {
			return old, nil
		}
		if atomic.CompareAndSwapUint64(p, old, swapAdd) {
			return old, nil
		}
	}
}

// AtomicWrite executes an ATOMIC_WRITE (IBTA 1.5, Annex A19): checks
// REMOTE_WRITE access to the 8 aligned bytes at va and stores val there
// verbatim in one atomic store (which also orders it after earlier writes,
// the release semantics A19 asks for).
func (a Remote) AtomicWrite(rkey uint32, va uint64, val [8]byte) error {
	r, p, err := a.atomicTarget(rkey, va, AccessRemoteWrite)
	if err != nil {
		return err
	}
	atomic.StoreUint64(p, binary.NativeEndian.Uint64(val[:]))
	r.release()
	return nil
}

// LocalRead gathers len(dst) bytes at addr of the region with L_Key lkey in
// pd into dst (a send SGE, or the source of an RDMA WRITE). Local read
// needs no access flag. Failures are ClassLocalProtection. A zero-length
// SGE is not checked (rxe copy_data).
func (t *Table) LocalRead(pd *PD, lkey uint32, addr uint64, dst []byte) error {
	if len(dst) == 0 {
		return nil
	}
	r, off, err := t.begin(pd, NoQP, lkey, addr, uint64(len(dst)), 0, ClassLocalProtection)
	if err != nil {
		return err
	}
	copy(dst, r.mr.buf[off:])
	r.release()
	return nil
}

// LocalWrite scatters src to addr of the region with L_Key lkey in pd (a
// receive SGE, or the destination of a READ response or atomic result). It
// needs LOCAL_WRITE (without it the WR completes
// LOC_PROT_ERR). Failures are ClassLocalProtection.
func (t *Table) LocalWrite(pd *PD, lkey uint32, addr uint64, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	r, off, err := t.begin(pd, NoQP, lkey, addr, uint64(len(src)), AccessLocalWrite, ClassLocalProtection)
	if err != nil {
		return err
	}
	copy(r.mr.buf[off:], src)
	r.release()
	return nil
}

// Invalidate invalidates the region whose key is rkey, as a local
// invalidate work request does: every later access with the key, local or
// remote, fails with ReasonInvalidated until ReregMR gives the region a new
// key. It waits for accesses in flight. The region must be valid and in pd;
// failures are *AccessError of class ClassInvalidRequest. A peer's SEND with
// invalidate must use RemoteInvalidate instead.
//
// A key of a type 2 window unbinds the window (LOCAL_INV of a window,
// IBTA vol. 1 §10.6.7.2.4); the key of a type 1 window is refused (a type
// 1 window is unbound only by binding it with length 0, as rxe refuses
// too).
func (t *Table) Invalidate(pd *PD, rkey uint32) error {
	return t.invalidate(pd, NoQP, rkey, false)
}

// RemoteInvalidate is Remote(pd, NoQP).Invalidate: with no QP it can
// invalidate nothing, since only type 2 windows are remotely invalidatable
// and only through their own QP.
func (t *Table) RemoteInvalidate(pd *PD, rkey uint32) error {
	return t.invalidate(pd, NoQP, rkey, true)
}

// Invalidate invalidates what the IETH of a SEND with invalidate arriving
// on the accessor's QP names. It succeeds only for what a peer may
// invalidate (IBTA vol. 1 §10.6: type 2 memory windows, here only those
// bound to this QP, type 2B; and fast-registered regions, which do not
// exist yet); an ordinary region made by RegMR and a type 1 window are
// refused with ReasonNotRemoteInvalidatable and stay valid, so a peer
// cannot destroy the application's buffers. Failures are *AccessError of
// class ClassInvalidRequest: the responder completes the receive with
// REM_INV_REQ_ERR (a class J error, as rxe).
func (a Remote) Invalidate(rkey uint32) error {
	return a.t.invalidate(a.pd, a.qpn, rkey, true)
}

func (t *Table) invalidate(pd *PD, qpn, rkey uint32, remote bool) error {
	fail := func(reason string) error {
		return &AccessError{Class: ClassInvalidRequest, Reason: reason, Key: rkey}
	}
	// Find the region under the table lock, then take its write lock with
	// the table lock released (accesses lock table then region, never the
	// reverse) and check everything again under it.
	idx := t.perm.decode(rkey >> 8)
	t.mu.RLock()
	var mr *MR
	var mw *MW
	dereg := false
	if uint64(idx) < uint64(len(t.slots)) {
		mr, mw = t.slots[idx].mr, t.slots[idx].mw
		dereg = t.slots[idx].lastKey == rkey
	}
	t.mu.RUnlock()
	if mw != nil {
		return t.invalidateMW(mw, pd, qpn, rkey, remote)
	}
	if mr == nil {
		if dereg {
			return fail(ReasonDeregistered)
		}
		return fail(ReasonBadKey)
	}
	mr.mu.Lock()
	defer mr.mu.Unlock()
	switch {
	case mr.state == mrDead || (mr.key != rkey && dereg):
		return fail(ReasonDeregistered)
	case mr.key != rkey && mr.prevKey == rkey:
		return fail(ReasonStaleKey)
	case mr.key != rkey:
		return fail(ReasonBadKey)
	case mr.state == mrInvalidated:
		return fail(ReasonInvalidated)
	case mr.pd != pd:
		return fail(ReasonWrongPD)
	case remote && !mr.kind.remoteInvalidatable():
		return fail(ReasonNotRemoteInvalidatable)
	}
	mr.state = mrInvalidated
	return nil
}
