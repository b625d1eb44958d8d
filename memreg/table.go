// Package memreg owns protection domains, memory regions over Go byte
// slices, the L_Key/R_Key table, and every access check the transport makes
// before it touches registered memory (IBTA vol. 1 §10.6 "Memory
// management", §9.7.5.2 responder access checks).
//
// # Keys
//
// An MR's L_Key and R_Key are the same 32-bit value (as with rxe): the low 8
// bits are a key byte that changes on every registration and re-registration
// of the table slot, so a key kept from before a re-registration or a
// deregistration is stale and fails (the 8-bit "key" portion of an
// L_Key/R_Key in IBTA vol. 1 §10.6). The upper 24 bits encode the slot
// index through a keyed permutation of the 24-bit space chosen at random per Table, so keys are
// neither sequential nor guessable from one another.
//
// # Concurrency
//
// A Table is safe for concurrent use. Every access (remote or local) holds
// the region's read lock for the whole check-and-copy; DeregMR, ReregMR and
// Invalidate take its write lock, so they wait for copies in flight, and
// every access that starts afterwards fails cleanly with a deregistered,
// stale or invalidated key. Once DeregMR returns, softroce never touches the
// buffer again. Successful accesses do not allocate.
//
// # Memory windows
//
// The table is keyed by slot, not by MR: memory windows (type 1 and 2,
// IBTA vol. 1 §10.6.7.2) are a second kind of slot entry sharing the key
// space, so an R_Key names either a region or a window (see mw.go).
// Invalidate (a local invalidate) works on keys; RemoteInvalidate (SEND
// with invalidate) works only on what IBTA lets a peer invalidate: type 2
// windows (fast-registered regions do not exist yet), never an ordinary
// region or a type 1 window.
package memreg

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"unsafe"
)

// Default limits, used for zero fields of Limits.
const (
	DefaultMaxMR     = 1 << 16
	DefaultMaxMRSize = 1 << 40
	DefaultMaxPD     = 1 << 16
	DefaultMaxMW     = 1 << 16
	// MaxMRLimit is the largest MaxMR (and MaxMR+MaxMW) a Table
	// supports: the key has 24 index bits.
	MaxMRLimit = 1 << 24
)

// Limits bounds what a Table registers. A zero field takes its default.
type Limits struct {
	MaxMR     int    // memory regions registered at once (at most MaxMRLimit)
	MaxMRSize uint64 // bytes in one region
	MaxPD     int    // protection domains allocated at once
	MaxMW     int    // memory windows allocated at once
}

// Table is the registry of PDs and MRs of one device.
type Table struct {
	lim  Limits
	perm feistel24

	mu     sync.RWMutex // guards slots, free, PD and MR bookkeeping below
	slots  []slot
	free   []uint32 // free slot indices
	nMR    int
	nMW    int
	nPD    int
	nextPD uint32
}

// reuseAfter is how many slots must be free before RegMR reuses one.
const reuseAfter = 256

// slot is one key index. lastKey remembers the key of the region that was
// deregistered from it, to tell "deregistered" from "bad key" in errors and
// to make sure the next registration uses another key byte.
type slot struct {
	mr      *MR
	mw      *MW // a window instead of a region (at most one of mr, mw)
	lastKey uint32
}

// NewTable returns an empty table with the given limits. A MaxMR above
// MaxMRLimit is lowered to it.
func NewTable(lim Limits) *Table {
	switch {
	case lim.MaxMR <= 0:
		lim.MaxMR = DefaultMaxMR
	case lim.MaxMR > MaxMRLimit:
		lim.MaxMR = MaxMRLimit
	}
	if lim.MaxMRSize == 0 {
		lim.MaxMRSize = DefaultMaxMRSize
	}
	if lim.MaxPD <= 0 {
		lim.MaxPD = DefaultMaxPD
	}
	if lim.MaxMW <= 0 {
		lim.MaxMW = DefaultMaxMW
	}
	lim.MaxMW = min(lim.MaxMW, MaxMRLimit-lim.MaxMR)
	return &Table{lim: lim, perm: newFeistel24()}
}

// Limits returns the limits in force (defaults filled in).
func (t *Table) Limits() Limits { return t.lim }

// PD is a protection domain: a region is reachable only through QPs of the
// same PD.
type PD struct {
	t      *Table
	handle uint32
	nMR    int  // guarded by t.mu
	nMW    int  // guarded by t.mu
	alive  bool // guarded by t.mu
}

// Handle returns the PD's number, unique within its table while allocated.
func (pd *PD) Handle() uint32 { return pd.handle }

// AllocPD allocates a protection domain (ibv_alloc_pd).
func (t *Table) AllocPD() (*PD, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.nPD >= t.lim.MaxPD {
		return nil, fmt.Errorf("memreg: alloc PD: %w", &LimitError{Limit: "number of PDs", Max: uint64(t.lim.MaxPD)})
	}
	t.nPD++
	t.nextPD++
	return &PD{t: t, handle: t.nextPD, alive: true}, nil
}

// DeallocPD frees a protection domain. Like ibv_dealloc_pd it fails with
// ErrBusy while regions are still registered in it.
func (t *Table) DeallocPD(pd *PD) error {
	if pd == nil || pd.t != t {
		return fmt.Errorf("memreg: dealloc PD: %w: PD of another table", ErrInvalidArgument)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if !pd.alive {
		return fmt.Errorf("memreg: dealloc PD %d: %w", pd.handle, ErrNotRegistered)
	}
	if pd.nMR > 0 {
		return fmt.Errorf("memreg: dealloc PD %d: %w: %d memory regions still registered", pd.handle, ErrBusy, pd.nMR)
	}
	if pd.nMW > 0 {
		return fmt.Errorf("memreg: dealloc PD %d: %w: %d memory windows still allocated", pd.handle, ErrBusy, pd.nMW)
	}
	pd.alive = false
	t.nPD--
	return nil
}

// mrState is the life cycle of a region, guarded by MR.mu.
type mrState uint8

const (
	mrValid mrState = iota
	mrInvalidated
	mrDead
)

// MRKind is how a region came to be. It decides whether a peer may
// invalidate it with a SEND with invalidate (IBTA vol. 1 §10.6, remote
// invalidation: only type 2 memory windows, see mw.go, and fast-registered
// regions; an ordinary region is never remotely invalidated, as
// rxe_invalidate_mr refuses user MRs).
type MRKind uint8

// Region kinds. Only MRKindUser exists today; a fast-registration (FRMR)
// kind will be added beside it and allowed by remoteInvalidatable.
const (
	MRKindUser MRKind = iota // RegMR (ibv_reg_mr)
)

// String names the kind.
func (k MRKind) String() string {
	if k == MRKindUser {
		return "user MR"
	}
	return fmt.Sprintf("MRKind(%d)", uint8(k))
}

// remoteInvalidatable reports whether a peer may invalidate a region of
// this kind with the IETH of a SEND with invalidate.
func (k MRKind) remoteInvalidatable() bool { return false }

// MR is a registered memory region.
type MR struct {
	t    *Table
	idx  uint32 // slot index, fixed for the MR's life
	kind MRKind // fixed for the MR's life

	registered bool // guarded by t.mu: false once DeregMR detached it
	nMW        int  // guarded by t.mu: windows bound to the region

	mu      sync.RWMutex // read: accesses in flight; write: rereg, dereg, invalidate
	key     uint32
	prevKey uint32 // key before the last re-registration (for error reasons)
	buf     []byte
	addr    uint64
	access  Access
	pd      *PD
	state   mrState
}

// checkReg validates a registration request (ibv_reg_mr's EINVAL rules).
func (t *Table) checkReg(op string, buf []byte, access Access) error {
	if len(buf) == 0 {
		return fmt.Errorf("memreg: %s: %w: empty buffer", op, ErrInvalidArgument)
	}
	if uint64(len(buf)) > t.lim.MaxMRSize {
		return fmt.Errorf("memreg: %s of %d bytes: %w", op, len(buf), &LimitError{Limit: "MR size", Max: t.lim.MaxMRSize})
	}
	if bad := access &^ accessSupported; bad != 0 {
		return fmt.Errorf("memreg: %s: %w: unsupported access flags %v", op, ErrInvalidArgument, bad)
	}
	// As ib_check_mr_access in the Linux core (ibv_reg_mr fails with
	// EINVAL): remote write or atomic access needs local write.
	if access&(AccessRemoteWrite|AccessRemoteAtomic) != 0 && access&AccessLocalWrite == 0 {
		return fmt.Errorf("memreg: %s: %w: %v requires LOCAL_WRITE", op, ErrInvalidArgument,
			access&(AccessRemoteWrite|AccessRemoteAtomic))
	}
	return nil
}

// vaOf is the address a region's first byte has on the wire: the buffer's
// virtual address (what ibv_reg_mr uses), or 0 for zero-based regions.
func vaOf(buf []byte, access Access) uint64 {
	if access&AccessZeroBased != 0 {
		return 0
	}
	return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(buf))))
}

// newKeyByte picks a random key byte different from the previous one at the
// slot, so the previous key becomes stale.
func newKeyByte(prev uint32) uint32 {
	b := mrand.Uint32() & 0xFF
	if b == prev&0xFF {
		b = (b + 1 + mrand.Uint32()%255) & 0xFF
	}
	return b
}

// RegMR registers buf in pd with the given access rights (ibv_reg_mr). The
// region's VA is the address of buf[0], or 0 with AccessZeroBased. buf must
// stay referenced by the caller's MR for as long as it is registered; Go's
// collector does not move heap memory.
func (t *Table) RegMR(pd *PD, buf []byte, access Access) (*MR, error) {
	return t.regMR("reg MR", pd, buf, vaOf(buf, access), access)
}

// RegMRIOVA registers buf as RegMR does, with iova as the VA of buf[0]
// (ibv_reg_mr_iova2): local SGEs, remote accesses and window binds all
// address the region in [iova, iova+len(buf)), whatever buf's own address.
// AccessZeroBased is refused (its VA is 0: use RegMR); so is a range that
// wraps around the 64-bit address space.
func (t *Table) RegMRIOVA(pd *PD, buf []byte, iova uint64, access Access) (*MR, error) {
	if access&AccessZeroBased != 0 {
		return nil, fmt.Errorf("memreg: reg MR at IOVA %#x: %w: ZERO_BASED with an IOVA", iova, ErrInvalidArgument)
	}
	if iova+uint64(len(buf)) < iova {
		return nil, fmt.Errorf("memreg: reg MR at IOVA %#x: %w: %d bytes wrap around", iova, ErrInvalidArgument, len(buf))
	}
	return t.regMR("reg MR", pd, buf, iova, access)
}

func (t *Table) regMR(op string, pd *PD, buf []byte, va uint64, access Access) (*MR, error) {
	if pd == nil || pd.t != t {
		return nil, fmt.Errorf("memreg: %s: %w: PD of another table", op, ErrInvalidArgument)
	}
	if err := t.checkReg(op, buf, access); err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if !pd.alive {
		return nil, fmt.Errorf("memreg: reg MR in PD %d: %w", pd.handle, ErrNotRegistered)
	}
	if t.nMR >= t.lim.MaxMR {
		return nil, fmt.Errorf("memreg: reg MR: %w", &LimitError{Limit: "number of MRs", Max: uint64(t.lim.MaxMR)})
	}
	idx := t.allocSlot()
	s := &t.slots[idx]
	key := t.perm.encode(idx)<<8 | newKeyByte(s.lastKey)
	mr := &MR{t: t, idx: idx, registered: true, key: key, buf: buf, addr: va, access: access, pd: pd}
	s.mr = mr
	t.nMR++
	pd.nMR++
	return mr, nil
}

// allocSlot takes a free slot index; t.mu is held for writing and the
// caller has checked its MR or MW limit, so the slots never outgrow
// MaxMR+MaxMW.
func (t *Table) allocSlot() uint32 {
	// Like rxe's cyclic index allocation, delay the reuse of freed slots:
	// grow until reuseAfter slots are free (or the limit is reached), then
	// take a random free one. A stale key then almost always meets an empty
	// slot, and never the key byte it had.
	if n := len(t.free); n > 0 && (n >= reuseAfter || len(t.slots) >= t.lim.MaxMR+t.lim.MaxMW) {
		i := mrand.IntN(n)
		idx := t.free[i]
		t.free[i] = t.free[n-1]
		t.free = t.free[:n-1]
		return idx
	}
	t.slots = append(t.slots, slot{})
	return uint32(len(t.slots) - 1)
}

// ReregMR re-registers mr (ibv_rereg_mr with translation and access
// changed): it waits for accesses in flight, gives the region a new key byte
// (so the old L_Key/R_Key become stale), and points it at buf with the new
// access rights. A nil buf keeps the current buffer. It also revalidates a
// region that Invalidate invalidated. It fails with ErrBusy while windows
// are bound to the region (their ranges and rights were checked against
// it). On error the region is unchanged.
func (t *Table) ReregMR(mr *MR, buf []byte, access Access) error {
	if mr == nil || mr.t != t {
		return fmt.Errorf("memreg: rereg MR: %w: MR of another table", ErrInvalidArgument)
	}
	// The table's read lock keeps binds out (they take it for writing).
	t.mu.RLock()
	defer t.mu.RUnlock()
	if mr.nMW > 0 {
		return fmt.Errorf("memreg: rereg MR: %w: %d memory windows bound", ErrBusy, mr.nMW)
	}
	mr.mu.Lock()
	defer mr.mu.Unlock()
	if mr.state == mrDead {
		return fmt.Errorf("memreg: rereg MR %#08x: %w", mr.key, ErrNotRegistered)
	}
	keep := buf == nil
	if keep {
		buf = mr.buf
	}
	if err := t.checkReg("rereg MR", buf, access); err != nil {
		return err
	}
	va := vaOf(buf, access)
	if keep && access&AccessZeroBased == 0 && mr.access&AccessZeroBased == 0 {
		va = mr.addr // the translation stays, and with it a RegMRIOVA's IOVA
	}
	mr.prevKey = mr.key
	mr.key = mr.key&^0xFF | newKeyByte(mr.key)
	mr.buf, mr.addr, mr.access, mr.state = buf, va, access, mrValid
	return nil
}

// DeregMR deregisters mr (ibv_dereg_mr). It waits for accesses in flight;
// afterwards every access with its key fails and the buffer is the caller's
// again. While windows are bound to the region it fails with ErrBusy and
// changes nothing (IBTA vol. 1 §10.6.7.2.6; rxe_dereg_mr refuses too, with
// EINVAL: ErrBusy says better why).
func (t *Table) DeregMR(mr *MR) error {
	if mr == nil || mr.t != t {
		return fmt.Errorf("memreg: dereg MR: %w: MR of another table", ErrInvalidArgument)
	}
	// Detach under the table lock, so no new access can find the region,
	// then take the region's write lock, which waits for the accesses that
	// found it before. Accesses lock the table, then the region, so the
	// locks are never held in the opposite order.
	t.mu.Lock()
	if !mr.registered {
		t.mu.Unlock()
		return fmt.Errorf("memreg: dereg MR: %w", ErrNotRegistered)
	}
	if mr.nMW > 0 {
		n := mr.nMW
		t.mu.Unlock()
		return fmt.Errorf("memreg: dereg MR: %w: %d memory windows bound", ErrBusy, n)
	}
	mr.registered = false
	t.slots[mr.idx].mr = nil
	t.nMR--
	mr.pd.nMR--
	t.mu.Unlock()

	mr.mu.Lock()
	mr.state = mrDead
	key := mr.key
	mr.mu.Unlock()

	// Only now is the slot free again: the next registration there must
	// know the final key so that it picks another key byte.
	t.mu.Lock()
	t.slots[mr.idx].lastKey = key
	t.free = append(t.free, mr.idx)
	t.mu.Unlock()
	return nil
}

// LKey returns the local key.
func (mr *MR) LKey() uint32 { mr.mu.RLock(); defer mr.mu.RUnlock(); return mr.key }

// RKey returns the remote key (equal to LKey).
func (mr *MR) RKey() uint32 { return mr.LKey() }

// Addr returns the region's starting VA on the wire.
func (mr *MR) Addr() uint64 { mr.mu.RLock(); defer mr.mu.RUnlock(); return mr.addr }

// Len returns the region's length in bytes.
func (mr *MR) Len() int { mr.mu.RLock(); defer mr.mu.RUnlock(); return len(mr.buf) }

// Buf returns the registered buffer.
func (mr *MR) Buf() []byte { mr.mu.RLock(); defer mr.mu.RUnlock(); return mr.buf }

// Access returns the region's access rights.
func (mr *MR) Access() Access { mr.mu.RLock(); defer mr.mu.RUnlock(); return mr.access }

// PD returns the protection domain the region is registered in.
func (mr *MR) PD() *PD { return mr.pd }

// Kind returns how the region was registered.
func (mr *MR) Kind() MRKind { return mr.kind }

// feistel24 is a keyed permutation of the 24-bit index space: a 4-round
// balanced Feistel network on two 12-bit halves. Any round function gives a
// bijection; random round keys make the image of 0, 1, 2, ... look random.
type feistel24 struct{ k [4]uint32 }

func newFeistel24() feistel24 {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		// crypto/rand does not fail on Linux; fall back to the runtime
		// generator rather than to fixed keys.
		for i := range b {
			b[i] = byte(mrand.Uint32())
		}
	}
	var f feistel24
	for i := range f.k {
		f.k[i] = binary.LittleEndian.Uint32(b[4*i:])
	}
	return f
}

func (f *feistel24) round(x, k uint32) uint32 {
	h := (x ^ k) * 0x9E3779B1
	h ^= h >> 15
	h *= 0x85EBCA77
	h ^= h >> 13
	return h & 0xFFF
}

func (f *feistel24) encode(x uint32) uint32 {
	l, r := x>>12&0xFFF, x&0xFFF
	for _, k := range f.k {
		l, r = r, l^f.round(r, k)
	}
	return l<<12 | r
}

func (f *feistel24) decode(y uint32) uint32 {
	l, r := y>>12&0xFFF, y&0xFFF
	for i := len(f.k) - 1; i >= 0; i-- {
		l, r = r^f.round(l, f.k[i]), l
	}
	return l<<12 | r
}
