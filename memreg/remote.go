package memreg

import (
	"encoding/binary"
	"sync/atomic"
	"unsafe"
)

// begin looks key up and checks an access of length bytes at va needing the
// rights in need, for a QP (or work request) of protection domain pd. On
// success it returns the region with its read lock held and the offset of
// va in the buffer; the caller must call mr.mu.RUnlock. Failures have class
// class and carry the reason.
//
// The order of checks follows rxe (check_rkey, lookup_mr, mr_check_range):
// key, state, PD, rights, then range; all of them are the same class, so
// the order only decides which reason is reported.
func (t *Table) begin(pd *PD, key uint32, va, length uint64, need Access, class ErrorClass) (*MR, uint64, error) {
	fail := func(reason string) (*MR, uint64, error) {
		return nil, 0, &AccessError{Class: class, Reason: reason, Key: key, VA: va, Len: length}
	}
	idx := t.perm.decode(key >> 8)
	t.mu.RLock()
	if uint64(idx) >= uint64(len(t.slots)) {
		t.mu.RUnlock()
		return fail(ReasonBadKey)
	}
	s := &t.slots[idx]
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
				return mr, off, nil
			}
		}
		reason = ReasonOutOfBounds
	}
	mr.mu.RUnlock()
	return fail(reason)
}

// CheckRemote checks, without touching memory, that a remote access of
// length bytes at va with R_Key rkey, needing the rights in need, may
// proceed on a QP of protection domain pd. Failures are *AccessError of
// class ClassRemoteAccess (NAK 0x62).
//
// A zero-length access always succeeds without looking at rkey or va: IBTA
// C9-88 (a zero-length RDMA READ or WRITE does not validate the R_Key), as
// rxe does.
func (t *Table) CheckRemote(pd *PD, rkey uint32, va uint64, length uint64, need Access) error {
	if length == 0 {
		return nil
	}
	mr, _, err := t.begin(pd, rkey, va, length, need, ClassRemoteAccess)
	if err != nil {
		return err
	}
	mr.mu.RUnlock()
	return nil
}

// RemoteWrite executes the data of an RDMA WRITE (or one packet of it):
// checks REMOTE_WRITE access to [va, va+len(src)) and copies src there.
func (t *Table) RemoteWrite(pd *PD, rkey uint32, va uint64, src []byte) error {
	if len(src) == 0 {
		return nil // C9-88
	}
	mr, off, err := t.begin(pd, rkey, va, uint64(len(src)), AccessRemoteWrite, ClassRemoteAccess)
	if err != nil {
		return err
	}
	copy(mr.buf[off:], src)
	mr.mu.RUnlock()
	return nil
}

// RemoteRead executes (a segment of) an RDMA READ: checks REMOTE_READ access
// to [va, va+len(dst)) and copies it into dst.
func (t *Table) RemoteRead(pd *PD, rkey uint32, va uint64, dst []byte) error {
	if len(dst) == 0 {
		return nil // C9-88
	}
	mr, off, err := t.begin(pd, rkey, va, uint64(len(dst)), AccessRemoteRead, ClassRemoteAccess)
	if err != nil {
		return err
	}
	copy(dst, mr.buf[off:])
	mr.mu.RUnlock()
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
func (t *Table) atomicTarget(pd *PD, rkey uint32, va uint64, need Access) (*MR, *uint64, error) {
	mr, off, err := t.begin(pd, rkey, va, 8, need, ClassRemoteAccess)
	if err != nil {
		return nil, nil, err
	}
	p := unsafe.Pointer(&mr.buf[off])
	if va&7 != 0 || uintptr(p)&7 != 0 {
		mr.mu.RUnlock()
		return nil, nil, &AccessError{Class: ClassInvalidRequest, Reason: ReasonMisaligned, Key: rkey, VA: va, Len: 8}
	}
	return mr, (*uint64)(p), nil
}

// RemoteAtomic executes an atomic request: checks REMOTE_ATOMIC access to
// the 8 bytes at va, which must be 8-byte aligned (else ClassInvalidRequest,
// NAK 0x61), and performs op on the host-order 64-bit word there with
// sync/atomic, so it is atomic with respect to every other atomic of the
// table (rxe's IB_ATOMIC_HCA guarantee). It returns the original value,
// which the responder sends big-endian in the AtomicAckETH.
func (t *Table) RemoteAtomic(pd *PD, rkey uint32, va uint64, op AtomicOp, swapAdd, compare uint64) (orig uint64, err error) {
	if op != AtomicCmpSwap && op != AtomicFetchAdd {
		return 0, &AccessError{Class: ClassInvalidRequest, Reason: ReasonBadAtomicOp, Key: rkey, VA: va, Len: 8}
	}
	mr, p, err := t.atomicTarget(pd, rkey, va, AccessRemoteAtomic)
	if err != nil {
		return 0, err
	}
	defer mr.mu.RUnlock()
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

// RemoteAtomicWrite executes an ATOMIC_WRITE (IBTA 1.5, Annex A19): checks
// REMOTE_WRITE access to the 8 aligned bytes at va and stores val there
// verbatim in one atomic store (which also orders it after earlier writes,
// the release semantics A19 asks for).
func (t *Table) RemoteAtomicWrite(pd *PD, rkey uint32, va uint64, val [8]byte) error {
	mr, p, err := t.atomicTarget(pd, rkey, va, AccessRemoteWrite)
	if err != nil {
		return err
	}
	atomic.StoreUint64(p, binary.NativeEndian.Uint64(val[:]))
	mr.mu.RUnlock()
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
	mr, off, err := t.begin(pd, lkey, addr, uint64(len(dst)), 0, ClassLocalProtection)
	if err != nil {
		return err
	}
	copy(dst, mr.buf[off:])
	mr.mu.RUnlock()
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
	mr, off, err := t.begin(pd, lkey, addr, uint64(len(src)), AccessLocalWrite, ClassLocalProtection)
	if err != nil {
		return err
	}
	copy(mr.buf[off:], src)
	mr.mu.RUnlock()
	return nil
}

// Invalidate invalidates the region whose key is rkey, as a local
// invalidate work request does: every later access with the key, local or
// remote, fails with ReasonInvalidated until ReregMR gives the region a new
// key. It waits for accesses in flight. The region must be valid and in pd;
// failures are *AccessError of class ClassInvalidRequest. A peer's SEND with
// invalidate must use RemoteInvalidate instead.
func (t *Table) Invalidate(pd *PD, rkey uint32) error {
	return t.invalidate(pd, rkey, false)
}

// RemoteInvalidate invalidates the region named by the IETH of a SEND with
// invalidate. It succeeds only for the kinds a peer may invalidate (type 2
// memory windows and fast-registered regions, IBTA vol. 1 §10.6); an
// ordinary region made by RegMR is refused with ReasonNotRemoteInvalidatable
// and stays valid, so a peer cannot destroy the application's buffers.
// Failures are *AccessError of class ClassInvalidRequest: the responder
// completes the receive with REM_INV_REQ_ERR (a class J error, as rxe).
func (t *Table) RemoteInvalidate(pd *PD, rkey uint32) error {
	return t.invalidate(pd, rkey, true)
}

func (t *Table) invalidate(pd *PD, rkey uint32, remote bool) error {
	fail := func(reason string) error {
		return &AccessError{Class: ClassInvalidRequest, Reason: reason, Key: rkey}
	}
	// Find the region under the table lock, then take its write lock with
	// the table lock released (accesses lock table then region, never the
	// reverse) and check everything again under it.
	idx := t.perm.decode(rkey >> 8)
	t.mu.RLock()
	var mr *MR
	dereg := false
	if uint64(idx) < uint64(len(t.slots)) {
		mr = t.slots[idx].mr
		dereg = t.slots[idx].lastKey == rkey
	}
	t.mu.RUnlock()
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
