package memreg

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"
)

const all = AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic

func setup(t testing.TB, size int, access Access) (*Table, *PD, *MR, []byte) {
	t.Helper()
	tab := NewTable(Limits{})
	pd, err := tab.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, size)
	mr, err := tab.RegMR(pd, buf, access)
	if err != nil {
		t.Fatal(err)
	}
	return tab, pd, mr, buf
}

func TestAccessString(t *testing.T) {
	cases := map[Access]string{
		0:                                    "0",
		AccessLocalWrite | AccessRemoteRead:  "LOCAL_WRITE|REMOTE_READ",
		AccessFlushGlobal | AccessZeroBased:  "ZERO_BASED|FLUSH_GLOBAL",
		AccessRemoteAtomic | Access(1<<20):   "REMOTE_ATOMIC|0x100000",
		AccessMWBind | AccessFlushPersistent: "MW_BIND|FLUSH_PERSISTENT",
	}
	for a, want := range cases {
		if got := a.String(); got != want {
			t.Errorf("%#x: %q, want %q", uint32(a), got, want)
		}
	}
	if AccessRemoteAtomic != 8 || AccessFlushPersistent != 512 || AccessZeroBased != 32 {
		t.Error("access values drifted from ibv_access_flags")
	}
}

func TestRegMR(t *testing.T) {
	tab, pd, mr, buf := setup(t, 100, all)
	if mr.LKey() != mr.RKey() {
		t.Error("lkey != rkey")
	}
	if want := uint64(uintptr(unsafe.Pointer(&buf[0]))); mr.Addr() != want {
		t.Errorf("addr %#x, want %#x", mr.Addr(), want)
	}
	if mr.Len() != 100 || &mr.Buf()[0] != &buf[0] || mr.Access() != all || mr.PD() != pd {
		t.Error("MR accessors")
	}
	zb, err := tab.RegMR(pd, make([]byte, 16), AccessZeroBased|AccessRemoteRead)
	if err != nil || zb.Addr() != 0 {
		t.Fatalf("zero based: %v %v", zb, err)
	}
	if err := tab.RemoteRead(pd, zb.RKey(), 8, make([]byte, 8)); err != nil {
		t.Errorf("zero-based read at offset 8: %v", err)
	}

	bad := []struct {
		name   string
		pd     *PD
		buf    []byte
		access Access
	}{
		{"empty", pd, nil, AccessLocalWrite},
		{"remote write without local write", pd, buf, AccessRemoteWrite},
		{"atomic without local write", pd, buf, AccessRemoteAtomic | AccessRemoteRead},
		{"on-demand", pd, buf, Access(1 << 6)},
		{"nil pd", nil, buf, 0},
		{"foreign pd", func() *PD { p, _ := NewTable(Limits{}).AllocPD(); return p }(), buf, 0},
	}
	for _, c := range bad {
		if _, err := tab.RegMR(c.pd, c.buf, c.access); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: %v", c.name, err)
		}
	}
	// Remote read alone needs no local write.
	if _, err := tab.RegMR(pd, buf, AccessRemoteRead); err != nil {
		t.Error(err)
	}
}

func TestKeysNotSequential(t *testing.T) {
	tab := NewTable(Limits{})
	pd, _ := tab.AllocPD()
	seen := map[uint32]bool{}
	idxSeen := map[uint32]bool{}
	adjacent := 0
	var prev uint32
	const n = 2000
	for i := range n {
		mr, err := tab.RegMR(pd, make([]byte, 1), 0)
		if err != nil {
			t.Fatal(err)
		}
		k := mr.LKey()
		if seen[k] || idxSeen[k>>8] {
			t.Fatalf("key %#x repeated", k)
		}
		seen[k], idxSeen[k>>8] = true, true
		if i > 0 {
			if d := int64(k>>8) - int64(prev>>8); d >= -2 && d <= 2 {
				adjacent++
			}
		}
		prev = k
	}
	// Random 24-bit indices are within ±2 of each other with p ~ 3e-7.
	if adjacent > 2 {
		t.Errorf("%d of %d consecutive keys have neighbouring indices", adjacent, n)
	}
	// Two tables do not hand out the same first keys.
	a, b := NewTable(Limits{}), NewTable(Limits{})
	pa, _ := a.AllocPD()
	pb, _ := b.AllocPD()
	same := 0
	for range 4 {
		ma, _ := a.RegMR(pa, make([]byte, 1), 0)
		mb, _ := b.RegMR(pb, make([]byte, 1), 0)
		if ma.LKey()>>8 == mb.LKey()>>8 {
			same++
		}
	}
	if same == 4 {
		t.Error("two tables use the same index permutation")
	}
}

func TestFeistelBijection(t *testing.T) {
	// decode(encode(x)) == x on a spread of inputs: a left inverse proves
	// encode injective there (a Feistel network is a bijection by design).
	f := newFeistel24()
	seen := make(map[uint32]bool, 1<<16)
	for i := uint32(0); i < 1<<16; i++ {
		x := i*257 + i>>8 // covers low and high bits
		x &= 1<<24 - 1
		y := f.encode(x)
		if y >= 1<<24 || f.decode(y) != x {
			t.Fatalf("encode(%#x) = %#x, decode = %#x", x, y, f.decode(y))
		}
		if seen[y] {
			t.Fatalf("encode not injective at %#x", x)
		}
		seen[y] = true
	}
}

// checkErr asserts err is an *AccessError of class c and reason.
func checkErr(t *testing.T, name string, err error, c ErrorClass, reason string) {
	t.Helper()
	var ae *AccessError
	if !errors.As(err, &ae) {
		t.Errorf("%s: got %v, want %v/%s", name, err, c, reason)
		return
	}
	sentinel := map[ErrorClass]error{ClassRemoteAccess: ErrRemoteAccess, ClassInvalidRequest: ErrInvalidRequest,
		ClassLocalProtection: ErrLocalProtection}[c]
	if ae.Class != c || !errors.Is(err, sentinel) || !strings.HasPrefix(ae.Reason, reason) {
		t.Errorf("%s: got class %v reason %q, want %v %q", name, ae.Class, ae.Reason, c, reason)
	}
	for cl, s := range map[ErrorClass]error{ClassRemoteAccess: ErrRemoteAccess, ClassInvalidRequest: ErrInvalidRequest,
		ClassLocalProtection: ErrLocalProtection} {
		if cl != c && errors.Is(err, s) {
			t.Errorf("%s: matches %v too", name, s)
		}
	}
	if !strings.Contains(err.Error(), fmt.Sprintf("%#08x", ae.Key)) || !strings.Contains(err.Error(), ae.Reason) {
		t.Errorf("%s: message %q lacks key or reason", name, err)
	}
}

func TestRemoteAccessOutcomes(t *testing.T) {
	tab, pd, mr, buf := setup(t, 64, all)
	otherPD, _ := tab.AllocPD()
	ro, _ := tab.RegMR(pd, make([]byte, 64), AccessRemoteRead)
	wo, _ := tab.RegMR(pd, make([]byte, 64), AccessLocalWrite|AccessRemoteWrite)
	key, va := mr.RKey(), mr.Addr()

	// Stale key after rereg, deregistered, invalidated.
	stale, _ := tab.RegMR(pd, make([]byte, 64), all)
	staleKey := stale.RKey()
	if err := tab.ReregMR(stale, nil, all); err != nil {
		t.Fatal(err)
	}
	if stale.RKey() == staleKey || stale.RKey()>>8 != staleKey>>8 {
		t.Fatalf("rereg key %#x -> %#x: want a new key byte on the same index", staleKey, stale.RKey())
	}
	dead, _ := tab.RegMR(pd, make([]byte, 64), all)
	deadKey := dead.RKey()
	if err := tab.DeregMR(dead); err != nil {
		t.Fatal(err)
	}
	inv, _ := tab.RegMR(pd, make([]byte, 64), all)
	if err := tab.Invalidate(pd, inv.RKey()); err != nil {
		t.Fatal(err)
	}

	R := ClassRemoteAccess
	cases := []struct {
		name   string
		pd     *PD
		key    uint32
		va     uint64
		n      uint64
		need   Access
		class  ErrorClass // 0: success
		reason string
	}{
		{"ok", pd, key, va, 64, AccessRemoteWrite, 0, ""},
		{"ok middle", pd, key, va + 10, 20, AccessRemoteRead, 0, ""},
		{"ok last byte", pd, key, va + 63, 1, AccessRemoteRead, 0, ""},
		{"zero length garbage key", nil, 0xDEADBEEF, ^uint64(0), 0, AccessRemoteWrite, 0, ""},
		{"bad key", pd, key ^ 0x1000, va, 1, 0, R, ReasonBadKey},
		{"bad key byte", pd, key ^ 0x5, va, 1, 0, R, ReasonBadKey},
		{"huge index", pd, 0xFFFFFF00, va, 1, 0, R, ReasonBadKey},
		{"stale key", pd, staleKey, stale.Addr(), 1, 0, R, ReasonStaleKey},
		{"deregistered", pd, deadKey, 0, 1, 0, R, ReasonDeregistered},
		{"invalidated", pd, inv.RKey(), inv.Addr(), 1, 0, R, ReasonInvalidated},
		{"wrong pd", otherPD, key, va, 1, 0, R, ReasonWrongPD},
		{"nil pd", nil, key, va, 1, 0, R, ReasonWrongPD},
		{"no remote write", pd, ro.RKey(), ro.Addr(), 1, AccessRemoteWrite, R, "missing permission REMOTE_WRITE"},
		{"no remote read", pd, wo.RKey(), wo.Addr(), 1, AccessRemoteRead, R, "missing permission REMOTE_READ"},
		{"no atomic", pd, ro.RKey(), ro.Addr(), 8, AccessRemoteAtomic | AccessRemoteRead, R, "missing permission REMOTE_ATOMIC"},
		{"overflow", pd, key, va, -va + 1, 0, R, ReasonOverflow},
		{"overflow max", pd, key, ^uint64(0), 2, 0, R, ReasonOverflow},
		{"below", pd, key, va - 1, 2, 0, R, ReasonOutOfBounds},
		{"past end", pd, key, va + 64, 1, 0, R, ReasonOutOfBounds},
		{"straddles end", pd, key, va + 60, 5, 0, R, ReasonOutOfBounds},
		{"too long", pd, key, va, 65, 0, R, ReasonOutOfBounds},
		{"huge length", pd, key, va, 1 << 63, 0, R, ReasonOutOfBounds},
		{"va zero", pd, key, 0, 1, 0, R, ReasonOutOfBounds},
	}
	for _, c := range cases {
		err := tab.CheckRemote(c.pd, c.key, c.va, c.n, c.need)
		if c.class == 0 {
			if err != nil {
				t.Errorf("%s: %v", c.name, err)
			}
			continue
		}
		checkErr(t, c.name, err, c.class, c.reason)
		if ae := (*AccessError)(nil); errors.As(err, &ae) && (ae.Key != c.key || ae.VA != c.va || ae.Len != c.n) {
			t.Errorf("%s: error fields %+v", c.name, ae)
		}
	}

	// The copying paths apply the same checks and copy only on success.
	src := []byte{1, 2, 3, 4}
	if err := tab.RemoteWrite(pd, key, va+4, src); err != nil || string(buf[4:8]) != string(src) {
		t.Fatalf("write: %v %v", err, buf[:8])
	}
	dst := make([]byte, 4)
	if err := tab.RemoteRead(pd, key, va+4, dst); err != nil || string(dst) != string(src) {
		t.Fatalf("read: %v %v", err, dst)
	}
	checkErr(t, "write to read-only", tab.RemoteWrite(pd, ro.RKey(), ro.Addr(), src), R, "missing permission REMOTE_WRITE")
	checkErr(t, "read from write-only", tab.RemoteRead(pd, wo.RKey(), wo.Addr(), dst), R, "missing permission REMOTE_READ")
	checkErr(t, "write past end", tab.RemoteWrite(pd, key, va+62, src), R, ReasonOutOfBounds)
	if buf[62] != 0 || buf[63] != 0 {
		t.Error("failed write copied data")
	}
	if err := tab.RemoteWrite(nil, 0, 0, nil); err != nil {
		t.Error("zero-length write checked its key")
	}
	if err := tab.RemoteRead(nil, 0, 0, nil); err != nil {
		t.Error("zero-length read checked its key")
	}
}

func TestAtomics(t *testing.T) {
	tab, pd, mr, buf := setup(t, 64, all)
	va := mr.Addr()
	if va&7 != 0 {
		t.Skip("buffer not 8-byte aligned")
	}
	binary.NativeEndian.PutUint64(buf[8:], 100)
	orig, err := tab.RemoteAtomic(pd, mr.RKey(), va+8, AtomicFetchAdd, 5, 0)
	if err != nil || orig != 100 || binary.NativeEndian.Uint64(buf[8:]) != 105 {
		t.Fatalf("fetch-add: %d %v", orig, err)
	}
	orig, err = tab.RemoteAtomic(pd, mr.RKey(), va+8, AtomicCmpSwap, 7, 104)
	if err != nil || orig != 105 || binary.NativeEndian.Uint64(buf[8:]) != 105 {
		t.Fatalf("failing cmp-swap: %d %v", orig, err)
	}
	orig, err = tab.RemoteAtomic(pd, mr.RKey(), va+8, AtomicCmpSwap, 7, 105)
	if err != nil || orig != 105 || binary.NativeEndian.Uint64(buf[8:]) != 7 {
		t.Fatalf("cmp-swap: %d %v", orig, err)
	}
	val := [8]byte{1, 2, 3, 4, 5, 6, 7, 8}
	if err := tab.RemoteAtomicWrite(pd, mr.RKey(), va+16, val); err != nil || string(buf[16:24]) != string(val[:]) {
		t.Fatalf("atomic write: %v %v", err, buf[16:24])
	}

	checkErr(t, "misaligned", func() error {
		_, err := tab.RemoteAtomic(pd, mr.RKey(), va+4, AtomicFetchAdd, 1, 0)
		return err
	}(), ClassInvalidRequest, ReasonMisaligned)
	checkErr(t, "misaligned atomic write", tab.RemoteAtomicWrite(pd, mr.RKey(), va+1, val), ClassInvalidRequest, ReasonMisaligned)
	checkErr(t, "misaligned with bad key", func() error {
		_, err := tab.RemoteAtomic(pd, mr.RKey()^0x100, va+4, AtomicFetchAdd, 1, 0)
		return err
	}(), ClassRemoteAccess, ReasonBadKey)
	checkErr(t, "atomic past end", func() error {
		_, err := tab.RemoteAtomic(pd, mr.RKey(), va+64, AtomicFetchAdd, 1, 0)
		return err
	}(), ClassRemoteAccess, ReasonOutOfBounds)
	checkErr(t, "bad op", func() error {
		_, err := tab.RemoteAtomic(pd, mr.RKey(), va, AtomicOp(9), 1, 0)
		return err
	}(), ClassInvalidRequest, ReasonBadAtomicOp)

	ro, _ := tab.RegMR(pd, make([]byte, 64), AccessRemoteRead)
	checkErr(t, "atomic without REMOTE_ATOMIC", func() error {
		_, err := tab.RemoteAtomic(pd, ro.RKey(), ro.Addr(), AtomicFetchAdd, 1, 0)
		return err
	}(), ClassRemoteAccess, "missing permission REMOTE_ATOMIC")
	checkErr(t, "atomic write without REMOTE_WRITE", tab.RemoteAtomicWrite(pd, ro.RKey(), ro.Addr(), val),
		ClassRemoteAccess, "missing permission REMOTE_WRITE")

	// Zero-based region: VA 8 is the 9th byte; alignment is of the VA.
	zb, _ := tab.RegMR(pd, buf, all|AccessZeroBased)
	if _, err := tab.RemoteAtomic(pd, zb.RKey(), 8, AtomicFetchAdd, 0, 0); err != nil {
		t.Errorf("zero-based atomic: %v", err)
	}
	checkErr(t, "zero-based misaligned", tab.RemoteAtomicWrite(pd, zb.RKey(), 3, val), ClassInvalidRequest, ReasonMisaligned)

	// Atomic with respect to each other.
	binary.NativeEndian.PutUint64(buf[32:], 0)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 1000 {
				if _, err := tab.RemoteAtomic(pd, mr.RKey(), va+32, AtomicFetchAdd, 1, 0); err != nil {
					t.Error(err)
					return
				}
				for {
					old, _ := tab.RemoteAtomic(pd, mr.RKey(), va+40, AtomicFetchAdd, 0, 0)
					if o, _ := tab.RemoteAtomic(pd, mr.RKey(), va+40, AtomicCmpSwap, old+1, old); o == old {
						break
					}
				}
			}
		})
	}
	wg.Wait()
	if a, b := binary.NativeEndian.Uint64(buf[32:]), binary.NativeEndian.Uint64(buf[40:]); a != 4000 || b != 4000 {
		t.Errorf("concurrent atomics: fetch-add %d, cmp-swap %d, want 4000", a, b)
	}
}

func TestLocalAccess(t *testing.T) {
	tab, pd, mr, buf := setup(t, 32, AccessLocalWrite)
	other, _ := tab.AllocPD()
	ro, _ := tab.RegMR(pd, make([]byte, 32), 0)
	src := []byte("abcd")
	if err := tab.LocalWrite(pd, mr.LKey(), mr.Addr()+28, src); err != nil || string(buf[28:]) != "abcd" {
		t.Fatalf("local write: %v", err)
	}
	dst := make([]byte, 4)
	if err := tab.LocalRead(pd, mr.LKey(), mr.Addr()+28, dst); err != nil || string(dst) != "abcd" {
		t.Fatalf("local read: %v", err)
	}
	if err := tab.LocalRead(pd, ro.LKey(), ro.Addr(), dst); err != nil {
		t.Errorf("local read needs no flag: %v", err)
	}
	L := ClassLocalProtection
	checkErr(t, "write without LOCAL_WRITE", tab.LocalWrite(pd, ro.LKey(), ro.Addr(), src), L, "missing permission LOCAL_WRITE")
	checkErr(t, "bad lkey", tab.LocalRead(pd, mr.LKey()+1, mr.Addr(), dst), L, ReasonBadKey)
	checkErr(t, "local wrong pd", tab.LocalRead(other, mr.LKey(), mr.Addr(), dst), L, ReasonWrongPD)
	checkErr(t, "local off by one", tab.LocalWrite(pd, mr.LKey(), mr.Addr()+29, src), L, ReasonOutOfBounds)
	if err := tab.LocalWrite(pd, 0, 0, nil); err != nil {
		t.Errorf("zero-length SGE checked: %v", err)
	}
	if err := tab.LocalRead(pd, 0, 0, nil); err != nil {
		t.Errorf("zero-length SGE checked: %v", err)
	}
	if err := tab.DeregMR(mr); err != nil {
		t.Fatal(err)
	}
	checkErr(t, "local deregistered", tab.LocalRead(pd, mr.LKey(), mr.Addr(), dst), L, ReasonDeregistered)
}

func TestReregDeregInvalidate(t *testing.T) {
	tab, pd, mr, _ := setup(t, 32, AccessRemoteRead)
	old := mr.RKey()
	nbuf := make([]byte, 8)
	if err := tab.ReregMR(mr, nbuf, all); err != nil {
		t.Fatal(err)
	}
	if mr.Len() != 8 || mr.Access() != all || mr.RKey() == old {
		t.Fatalf("rereg: len %d access %v key %#x", mr.Len(), mr.Access(), mr.RKey())
	}
	if err := tab.RemoteWrite(pd, mr.RKey(), mr.Addr(), []byte{9}); err != nil || nbuf[0] != 9 {
		t.Fatalf("write to rereg'd region: %v", err)
	}
	// A failed rereg leaves the region as it was.
	k := mr.RKey()
	if err := tab.ReregMR(mr, nbuf, AccessRemoteWrite); !errors.Is(err, ErrInvalidArgument) || mr.RKey() != k || mr.Access() != all {
		t.Fatalf("bad rereg: %v", err)
	}

	// Invalidate: checks key and PD, then blocks every access until rereg.
	other, _ := tab.AllocPD()
	checkErr(t, "invalidate wrong pd", tab.Invalidate(other, k), ClassInvalidRequest, ReasonWrongPD)
	bad := k ^ 0x80
	if bad == old { // the new key byte is random: keep clear of the previous key
		bad = k ^ 0x40
	}
	checkErr(t, "invalidate bad key", tab.Invalidate(pd, bad), ClassInvalidRequest, ReasonBadKey)
	checkErr(t, "invalidate stale key", tab.Invalidate(pd, old), ClassInvalidRequest, ReasonStaleKey)
	checkErr(t, "invalidate unknown index", tab.Invalidate(pd, 0xFFFFFF00), ClassInvalidRequest, ReasonBadKey)
	if err := tab.Invalidate(pd, k); err != nil {
		t.Fatal(err)
	}
	checkErr(t, "invalidate twice", tab.Invalidate(pd, k), ClassInvalidRequest, ReasonInvalidated)
	checkErr(t, "local after invalidate", tab.LocalRead(pd, k, mr.Addr(), make([]byte, 1)), ClassLocalProtection, ReasonInvalidated)
	if err := tab.ReregMR(mr, nil, all); err != nil {
		t.Fatal(err)
	}
	if err := tab.CheckRemote(pd, mr.RKey(), mr.Addr(), 8, AccessRemoteWrite); err != nil {
		t.Fatalf("rereg did not revalidate: %v", err)
	}

	// Dereg: twice fails, rereg after fails, invalidate after says deregistered.
	dk := mr.RKey()
	if err := tab.DeallocPD(pd); !errors.Is(err, ErrBusy) {
		t.Fatalf("dealloc PD with MR: %v", err)
	}
	if err := tab.DeregMR(mr); err != nil {
		t.Fatal(err)
	}
	if err := tab.DeregMR(mr); !errors.Is(err, ErrNotRegistered) {
		t.Errorf("double dereg: %v", err)
	}
	if err := tab.ReregMR(mr, nil, all); !errors.Is(err, ErrNotRegistered) {
		t.Errorf("rereg after dereg: %v", err)
	}
	checkErr(t, "invalidate deregistered", tab.Invalidate(pd, dk), ClassInvalidRequest, ReasonDeregistered)
	if err := tab.DeallocPD(pd); err != nil {
		t.Fatalf("dealloc empty PD: %v", err)
	}
	if err := tab.DeallocPD(pd); !errors.Is(err, ErrNotRegistered) {
		t.Errorf("double dealloc: %v", err)
	}
	if _, err := tab.RegMR(pd, nbuf, 0); !errors.Is(err, ErrNotRegistered) {
		t.Errorf("reg in deallocated PD: %v", err)
	}
	if err := tab.DeallocPD(nil); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("dealloc nil: %v", err)
	}
	if err := tab.DeregMR(nil); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("dereg nil: %v", err)
	}
	if err := tab.ReregMR(nil, nil, 0); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("rereg nil: %v", err)
	}
}

func TestSlotReuseNeverRevivesOldKey(t *testing.T) {
	tab := NewTable(Limits{MaxMR: 1})
	pd, _ := tab.AllocPD()
	buf := make([]byte, 8)
	var keys []uint32
	for range 600 {
		mr, err := tab.RegMR(pd, buf, AccessRemoteRead)
		if err != nil {
			t.Fatal(err)
		}
		if n := len(keys); n > 0 && mr.RKey() == keys[n-1] {
			t.Fatalf("slot reuse gave the previous key %#x again", mr.RKey())
		}
		keys = append(keys, mr.RKey())
		if err := tab.DeregMR(mr); err != nil {
			t.Fatal(err)
		}
		// The key just deregistered must fail, not reach a later region.
		if err := tab.CheckRemote(pd, keys[len(keys)-1], mr.Addr(), 1, 0); !errors.Is(err, ErrRemoteAccess) {
			t.Fatalf("deregistered key still works: %v", err)
		}
	}
	bytesSeen := map[uint32]bool{}
	for _, k := range keys {
		bytesSeen[k&0xFF] = true
	}
	if len(bytesSeen) < 100 {
		t.Errorf("only %d distinct key bytes in 600 registrations", len(bytesSeen))
	}
}

func TestLimits(t *testing.T) {
	tab := NewTable(Limits{MaxMR: 2, MaxMRSize: 16, MaxPD: 1})
	pd, err := tab.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	var le *LimitError
	if _, err := tab.AllocPD(); !errors.As(err, &le) || le.Limit != "number of PDs" || le.Max != 1 || !errors.Is(err, ErrLimit) {
		t.Errorf("PD limit: %v", err)
	}
	if _, err := tab.RegMR(pd, make([]byte, 17), 0); !errors.As(err, &le) || le.Limit != "MR size" || le.Max != 16 {
		t.Errorf("size limit: %v", err)
	}
	a, _ := tab.RegMR(pd, make([]byte, 16), 0)
	if _, err := tab.RegMR(pd, make([]byte, 1), 0); err != nil {
		t.Fatal(err)
	}
	_, err = tab.RegMR(pd, make([]byte, 1), 0)
	if !errors.As(err, &le) || le.Limit != "number of MRs" || le.Max != 2 || !strings.Contains(err.Error(), "number of MRs (max 2)") {
		t.Errorf("MR limit: %v", err)
	}
	if err := tab.ReregMR(a, make([]byte, 17), 0); !errors.As(err, &le) || le.Limit != "MR size" {
		t.Errorf("rereg size limit: %v", err)
	}
	tab.DeregMR(a)
	if _, err := tab.RegMR(pd, make([]byte, 1), 0); err != nil {
		t.Errorf("reg after dereg under limit: %v", err)
	}
	d := NewTable(Limits{MaxMR: 1 << 30}).Limits()
	if d.MaxMR != MaxMRLimit || d.MaxPD != DefaultMaxPD || d.MaxMRSize != DefaultMaxMRSize {
		t.Errorf("defaults: %+v", d)
	}
}

func TestNoAllocs(t *testing.T) {
	tab, pd, mr, _ := setup(t, 4096, all)
	src := make([]byte, 1024)
	key, va := mr.RKey(), mr.Addr()
	allocs := testing.AllocsPerRun(100, func() {
		tab.RemoteWrite(pd, key, va, src)
		tab.RemoteRead(pd, key, va+1024, src)
		tab.LocalRead(pd, key, va, src)
		tab.LocalWrite(pd, key, va, src)
		tab.RemoteAtomic(pd, key, va+8, AtomicFetchAdd, 1, 0)
		tab.RemoteAtomicWrite(pd, key, va+16, [8]byte{})
		tab.CheckRemote(pd, key, va, 4096, AccessRemoteRead)
	})
	if allocs != 0 {
		t.Errorf("successful accesses allocate %v times", allocs)
	}
}

// TestConcurrentDeregVsAccess runs remote writes, reads and atomics against
// a region while it is deregistered. Once DeregMR returns, the buffer is the
// test's: it overwrites it, and any later write by the table would both
// change it and be reported by the race detector.
func TestConcurrentDeregVsAccess(t *testing.T) {
	for round := range 20 {
		tab, pd, mr, buf := setup(t, 256, all)
		key, va := mr.RKey(), mr.Addr()
		var stop atomic.Bool
		var afterErr atomic.Int64
		var wg sync.WaitGroup
		for g := range 3 {
			wg.Go(func() {
				src := make([]byte, 64)
				for i := range src {
					src[i] = 0xAA
				}
				dst := make([]byte, 64)
				for !stop.Load() {
					var err error
					switch g {
					case 0:
						err = tab.RemoteWrite(pd, key, va+64, src)
					case 1:
						err = tab.RemoteRead(pd, key, va, dst)
					case 2:
						_, err = tab.RemoteAtomic(pd, key, va+128, AtomicFetchAdd, 1, 0)
					}
					if err != nil {
						if !errors.Is(err, ErrRemoteAccess) {
							t.Errorf("round %d: unexpected error %v", round, err)
						}
						afterErr.Add(1)
					}
				}
			})
		}
		for range 50 * (round + 1) {
			if err := tab.CheckRemote(pd, key, va, 1, 0); err != nil {
				t.Fatal(err)
			}
		}
		if err := tab.DeregMR(mr); err != nil {
			t.Fatal(err)
		}
		clear(buf) // the buffer is ours again
		for afterErr.Load() < 30 {
			// Wait until every goroutine has seen failures after the dereg.
		}
		stop.Store(true)
		wg.Wait()
		for i, b := range buf {
			if b != 0 {
				t.Fatalf("round %d: byte %d changed to %#x after DeregMR returned", round, i, b)
			}
		}
	}
}

func BenchmarkRemoteWrite4K(b *testing.B) {
	tab, pd, mr, _ := setup(b, 1<<20, all)
	src := make([]byte, 4096)
	key, va := mr.RKey(), mr.Addr()
	b.SetBytes(4096)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if err := tab.RemoteWrite(pd, key, va+uint64(i%256)*4096, src); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkRemoteReadParallel4K(b *testing.B) {
	tab, pd, mr, _ := setup(b, 1<<20, all)
	key, va := mr.RKey(), mr.Addr()
	b.SetBytes(4096)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		dst := make([]byte, 4096)
		for pb.Next() {
			if err := tab.RemoteRead(pd, key, va, dst); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func BenchmarkRemoteAtomic(b *testing.B) {
	tab, pd, mr, _ := setup(b, 64, all)
	key, va := mr.RKey(), mr.Addr()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := tab.RemoteAtomic(pd, key, va, AtomicFetchAdd, 1, 0); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCheckRemoteBadKey(b *testing.B) {
	tab, pd, mr, _ := setup(b, 64, all)
	key := mr.RKey() ^ 0x100
	b.ReportAllocs()
	for b.Loop() {
		_ = tab.CheckRemote(pd, key, 0, 8, 0)
	}
}

// TestConcurrentReregInvalidate re-registers and invalidates a region while
// accesses run with whatever key they last read: every access either
// succeeds on the current buffer or fails as a remote access error, and the
// race detector sees every field of the region guarded.
func TestConcurrentReregInvalidate(t *testing.T) {
	tab, pd, mr, _ := setup(t, 128, all)
	bufs := [][]byte{make([]byte, 128), make([]byte, 128)}
	var stop atomic.Bool
	var ok, failed atomic.Int64
	var wg sync.WaitGroup
	for g := range 2 {
		wg.Go(func() {
			src := make([]byte, 16)
			for !stop.Load() {
				key, va := mr.RKey(), mr.Addr()
				var err error
				if g == 0 {
					err = tab.RemoteWrite(pd, key, va+16, src)
				} else {
					_, err = tab.RemoteAtomic(pd, key, va+8, AtomicFetchAdd, 1, 0)
				}
				switch {
				case err == nil:
					ok.Add(1)
				case errors.Is(err, ErrRemoteAccess):
					failed.Add(1)
				default:
					t.Errorf("unexpected %v", err)
				}
			}
		})
	}
	deadline := time.Now().Add(5 * time.Second)
	for i := 0; i < 60 || ((ok.Load() < 100 || failed.Load() < 10) && time.Now().Before(deadline)); i++ {
		runtime.Gosched()
		if i%3 == 0 {
			if err := tab.Invalidate(pd, mr.RKey()); err != nil {
				t.Fatal(err)
			}
		}
		if err := tab.ReregMR(mr, bufs[i%2], all); err != nil {
			t.Fatal(err)
		}
	}
	stop.Store(true)
	wg.Wait()
	if ok.Load() == 0 {
		t.Error("no access succeeded")
	}
	t.Logf("%d accesses succeeded, %d failed with stale or invalidated keys", ok.Load(), failed.Load())
}

// TestRemoteInvalidateRefusesUserMR: a peer's SEND with invalidate may not
// invalidate a region made by RegMR (IBTA allows it only for type 2 windows
// and fast-registered regions); the region stays fully usable. The local
// Invalidate still works on it.
func TestRemoteInvalidateRefusesUserMR(t *testing.T) {
	tab := NewTable(Limits{})
	pd, _ := tab.AllocPD()
	buf := make([]byte, 64)
	mr, err := tab.RegMR(pd, buf, AccessLocalWrite|AccessRemoteWrite|AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	if mr.Kind() != MRKindUser {
		t.Fatalf("kind %v", mr.Kind())
	}
	k := mr.RKey()
	checkErr(t, "remote invalidate of a user MR", tab.RemoteInvalidate(pd, k), ClassInvalidRequest, ReasonNotRemoteInvalidatable)
	// The key checks still come first, so the reason names the real fault.
	other, _ := tab.AllocPD()
	checkErr(t, "remote invalidate, wrong pd", tab.RemoteInvalidate(other, k), ClassInvalidRequest, ReasonWrongPD)
	checkErr(t, "remote invalidate, bad key", tab.RemoteInvalidate(pd, k^0x80), ClassInvalidRequest, ReasonBadKey)
	if err := tab.RemoteWrite(pd, k, mr.Addr(), []byte{7}); err != nil || buf[0] != 7 {
		t.Fatalf("write after a refused remote invalidate: %v", err)
	}
	if err := tab.LocalRead(pd, k, mr.Addr(), make([]byte, 8)); err != nil {
		t.Fatalf("local read after a refused remote invalidate: %v", err)
	}
	if err := tab.Invalidate(pd, k); err != nil {
		t.Fatalf("local invalidate: %v", err)
	}
	checkErr(t, "write after local invalidate", tab.RemoteWrite(pd, k, mr.Addr(), []byte{1}), ClassRemoteAccess, ReasonInvalidated)
}
