package memreg

import (
	"bytes"
	"errors"
	"sync"
	"testing"
)

const qpA, qpB = 0x11, 0x12

type mwWorld struct {
	tab *Table
	pd  *PD
	buf []byte
	mr  *MR
	va  uint64
}

func newMWWorld(t *testing.T, access Access) *mwWorld {
	t.Helper()
	w := &mwWorld{tab: NewTable(Limits{})}
	w.pd, _ = w.tab.AllocPD()
	w.buf = make([]byte, 256)
	var err error
	if w.mr, err = w.tab.RegMR(w.pd, w.buf, access); err != nil {
		t.Fatal(err)
	}
	w.va = w.mr.Addr()
	return w
}

const fullMR = AccessLocalWrite | AccessRemoteRead | AccessRemoteWrite | AccessRemoteAtomic | AccessMWBind

// GU-20: a type 1 window gives access to its range with its rights, from
// any QP of the PD; each bind changes the key; a zero-length bind unbinds.
func TestMWType1(t *testing.T) {
	w := newMWWorld(t, fullMR)
	mw, err := w.tab.AllocMW(w.pd, MWType1)
	if err != nil {
		t.Fatal(err)
	}
	k0 := mw.RKey()
	R := ClassRemoteAccess
	checkErr(t, "unbound", w.tab.Remote(w.pd, qpA).Check(k0, w.va, 1, 0), R, ReasonMWNotBound)
	k1, err := w.tab.BindMW(mw, w.pd, qpA, Bind{MRKey: w.mr.LKey(), Addr: w.va + 64, Length: 64, Access: AccessRemoteRead | AccessRemoteWrite})
	if err != nil {
		t.Fatal(err)
	}
	if k1 == k0 || k1>>8 != k0>>8 || mw.RKey() != k1 || k1>>8 == w.mr.RKey()>>8 {
		t.Fatalf("bind keys %#x -> %#x (mr %#x)", k0, k1, w.mr.RKey())
	}
	src := []byte("through-a-window")
	for _, qpn := range []uint32{qpA, qpB, NoQP} { // any QP of the PD
		if err := w.tab.Remote(w.pd, qpn).Write(k1, w.va+64, src); err != nil {
			t.Fatalf("write via qp %#x: %v", qpn, err)
		}
	}
	if !bytes.Equal(w.buf[64:64+len(src)], src) {
		t.Fatalf("buffer %q", w.buf[64:80])
	}
	dst := make([]byte, 64)
	if err := w.tab.Remote(w.pd, qpB).Read(k1, w.va+64, dst); err != nil || !bytes.Equal(dst[:len(src)], src) {
		t.Fatalf("read: %v %q", err, dst)
	}
	other, _ := w.tab.AllocPD()
	checkErr(t, "other pd", w.tab.Remote(other, qpA).Read(k1, w.va+64, dst), R, ReasonWrongPD)
	checkErr(t, "before window", w.tab.Remote(w.pd, qpA).Read(k1, w.va+63, dst[:1]), R, ReasonOutOfBounds)
	checkErr(t, "past window", w.tab.Remote(w.pd, qpA).Read(k1, w.va+65, dst), R, ReasonOutOfBounds)
	_, err = w.tab.Remote(w.pd, qpA).Atomic(k1, w.va+64, AtomicFetchAdd, 1, 0)
	checkErr(t, "atomic without window right", err, R, "missing permission REMOTE_ATOMIC")
	checkErr(t, "window key as lkey", w.tab.LocalRead(w.pd, k1, w.va+64, dst[:1]), ClassLocalProtection, ReasonBadKey)
	checkErr(t, "local inv of type 1", w.tab.Invalidate(w.pd, k1), ClassInvalidRequest, ReasonMWType1Invalidate)
	checkErr(t, "remote inv of type 1", w.tab.Remote(w.pd, qpA).Invalidate(k1), ClassInvalidRequest, ReasonNotRemoteInvalidatable)

	// Rebinding gives a new key; the old one is stale.
	k2, err := w.tab.BindMW(mw, w.pd, qpA, Bind{MRKey: w.mr.LKey(), Addr: w.va, Length: 8, Access: AccessRemoteRead})
	if err != nil || k2 == k1 {
		t.Fatalf("rebind: %#x %v", k2, err)
	}
	checkErr(t, "old key after rebind", w.tab.Remote(w.pd, qpA).Read(k1, w.va, dst[:1]), R, ReasonStaleKey)
	if err := w.tab.Remote(w.pd, qpA).Read(k2, w.va, dst[:8]); err != nil {
		t.Fatal(err)
	}
	// Zero-length bind: unbound, key changes again.
	k3, err := w.tab.BindMW(mw, w.pd, qpA, Bind{})
	if err != nil || k3 == k2 {
		t.Fatalf("unbind: %#x %v", k3, err)
	}
	checkErr(t, "after unbind (old key)", w.tab.Remote(w.pd, qpA).Read(k2, w.va, dst[:1]), R, ReasonStaleKey)
	checkErr(t, "after unbind (new key)", w.tab.Remote(w.pd, qpA).Read(k3, w.va, dst[:1]), R, ReasonMWNotBound)
	if err := w.tab.DeregMR(w.mr); err != nil {
		t.Fatalf("dereg after unbind: %v", err)
	}
}

// GU-21: a type 2 window is bound by a work request on one QP, works only
// through that QP, cannot be rebound while bound, and LOCAL_INV unbinds it.
func TestMWType2(t *testing.T) {
	w := newMWWorld(t, fullMR)
	mw, _ := w.tab.AllocMW(w.pd, MWType2)
	k0 := mw.RKey()
	b := Bind{MRKey: w.mr.LKey(), Addr: w.va, Length: 128, Access: AccessRemoteRead | AccessRemoteWrite | AccessRemoteAtomic, RKey: k0&^0xFF | (k0+1)&0xFF}
	if _, err := w.tab.BindMW(mw, w.pd, NoQP, b); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("type 2 bind without a QP: %v", err)
	}
	bad := b
	bad.RKey = k0 ^ 0x100
	if _, err := w.tab.BindMW(mw, w.pd, qpA, bad); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("type 2 bind changing the index: %v", err)
	}
	zero := b
	zero.Length = 0
	if _, err := w.tab.BindMW(mw, w.pd, qpA, zero); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("zero-length type 2 bind: %v", err)
	}
	if mw.RKey() != k0 {
		t.Fatal("failed binds changed the key")
	}
	k1, err := w.tab.BindMW(mw, w.pd, qpA, b)
	if err != nil || k1 != b.RKey {
		t.Fatalf("bind: %#x %v", k1, err)
	}
	R := ClassRemoteAccess
	if err := w.tab.Remote(w.pd, qpA).Write(k1, w.va+8, []byte{1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	if orig, err := w.tab.Remote(w.pd, qpA).Atomic(k1, w.va+16, AtomicFetchAdd, 5, 0); err != nil || orig != 0 {
		t.Fatalf("atomic: %d %v", orig, err)
	}
	checkErr(t, "other QP", w.tab.Remote(w.pd, qpB).Write(k1, w.va+8, []byte{9}), R, ReasonMWWrongQP)
	checkErr(t, "no QP", w.tab.RemoteWrite(w.pd, k1, w.va+8, []byte{9}), R, ReasonMWWrongQP)
	if w.buf[8] != 1 {
		t.Fatal("refused write landed")
	}
	// Rebinding while bound (to another QP or key) fails and changes nothing.
	b2 := b
	b2.RKey = k1&^0xFF | (k1+1)&0xFF
	for _, qpn := range []uint32{qpA, qpB} {
		if _, err := w.tab.BindMW(mw, w.pd, qpn, b2); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("rebind while bound on %#x: %v", qpn, err)
		}
	}
	if err := w.tab.Remote(w.pd, qpA).Check(k1, w.va, 1, AccessRemoteRead); err != nil {
		t.Fatalf("failed rebind broke the window: %v", err)
	}
	// MR deregistration fails while the window is bound, and changes nothing.
	if err := w.tab.DeregMR(w.mr); !errors.Is(err, ErrBusy) {
		t.Fatalf("dereg with window bound: %v", err)
	}
	if err := w.tab.ReregMR(w.mr, nil, fullMR); !errors.Is(err, ErrBusy) {
		t.Fatalf("rereg with window bound: %v", err)
	}
	if err := w.tab.RemoteWrite(w.pd, w.mr.RKey(), w.va, []byte{7}); err != nil {
		t.Fatalf("MR after refused dereg: %v", err)
	}
	other, _ := w.tab.AllocPD()
	checkErr(t, "local inv other pd", w.tab.Invalidate(other, k1), ClassInvalidRequest, ReasonWrongPD)
	checkErr(t, "local inv bad key", w.tab.Invalidate(w.pd, k1^0x80), ClassInvalidRequest, ReasonBadKey)
	if err := w.tab.Invalidate(w.pd, k1); err != nil {
		t.Fatal(err)
	}
	checkErr(t, "after local inv", w.tab.Remote(w.pd, qpA).Read(k1, w.va, make([]byte, 1)), R, ReasonMWNotBound)
	checkErr(t, "local inv twice", w.tab.Invalidate(w.pd, k1), ClassInvalidRequest, ReasonMWNotBound)
	// Invalidated: it may be bound again, on another QP too, with a new key.
	if _, err := w.tab.BindMW(mw, w.pd, qpB, b2); err != nil {
		t.Fatal(err)
	}
	checkErr(t, "old key after rebind", w.tab.Remote(w.pd, qpB).Read(k1, w.va, make([]byte, 1)), R, ReasonStaleKey)
	if err := w.tab.Remote(w.pd, qpB).Read(b2.RKey, w.va, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	// Deallocating a bound window unbinds it: the MR may go.
	if err := w.tab.DeallocPD(w.pd); !errors.Is(err, ErrBusy) {
		t.Fatalf("dealloc PD with a window: %v", err)
	}
	if err := w.tab.DeallocMW(mw); err != nil {
		t.Fatal(err)
	}
	checkErr(t, "after dealloc", w.tab.Remote(w.pd, qpB).Read(b2.RKey, w.va, make([]byte, 1)), R, ReasonDeregistered)
	if err := w.tab.DeallocMW(mw); !errors.Is(err, ErrNotRegistered) {
		t.Fatalf("dealloc twice: %v", err)
	}
	if err := w.tab.DeregMR(w.mr); err != nil {
		t.Fatal(err)
	}
	if err := w.tab.DeallocPD(w.pd); err != nil {
		t.Fatal(err)
	}
}

// GU-22: a SEND with invalidate may invalidate a type 2 window bound to the
// QP it arrives on, nothing else.
func TestMWRemoteInvalidate(t *testing.T) {
	w := newMWWorld(t, fullMR)
	mw1, _ := w.tab.AllocMW(w.pd, MWType1)
	mw2, _ := w.tab.AllocMW(w.pd, MWType2)
	k1, _ := w.tab.BindMW(mw1, w.pd, qpA, Bind{MRKey: w.mr.LKey(), Addr: w.va, Length: 16, Access: AccessRemoteRead})
	k2 := mw2.RKey()&^0xFF | 0x5A
	if _, err := w.tab.BindMW(mw2, w.pd, qpA, Bind{MRKey: w.mr.LKey(), Addr: w.va, Length: 16, Access: AccessRemoteRead, RKey: k2}); err != nil {
		t.Fatal(err)
	}
	I := ClassInvalidRequest
	checkErr(t, "ordinary MR", w.tab.Remote(w.pd, qpA).Invalidate(w.mr.RKey()), I, ReasonNotRemoteInvalidatable)
	checkErr(t, "type 1", w.tab.Remote(w.pd, qpA).Invalidate(k1), I, ReasonNotRemoteInvalidatable)
	checkErr(t, "other QP", w.tab.Remote(w.pd, qpB).Invalidate(k2), I, ReasonMWWrongQP)
	checkErr(t, "bad key", w.tab.Remote(w.pd, qpA).Invalidate(k2^0x01), I, ReasonBadKey)
	checkErr(t, "no QP", w.tab.RemoteInvalidate(w.pd, k2), I, ReasonMWWrongQP)
	for _, k := range []uint32{w.mr.RKey(), k1, k2} {
		if err := w.tab.Remote(w.pd, qpA).Check(k, w.va, 1, AccessRemoteRead); err != nil {
			t.Fatalf("key %#x broken by a refused invalidate: %v", k, err)
		}
	}
	if err := w.tab.Remote(w.pd, qpA).Invalidate(k2); err != nil {
		t.Fatal(err)
	}
	checkErr(t, "after remote inv", w.tab.Remote(w.pd, qpA).Check(k2, w.va, 1, AccessRemoteRead), ClassRemoteAccess, ReasonMWNotBound)
	if err := w.tab.Remote(w.pd, qpA).Check(k1, w.va, 1, AccessRemoteRead); err != nil {
		t.Fatal(err)
	}
}

// GU-23: the bind access rules, each with a failed bind changing nothing.
func TestMWBindRules(t *testing.T) {
	cases := []struct {
		name     string
		mrAccess Access
		mwAccess Access
		addr     uint64 // offset in the MR
		length   uint64
		ok       bool
	}{
		{"read over MW_BIND", AccessMWBind, AccessRemoteRead, 0, 256, true},
		{"no MW_BIND", AccessLocalWrite | AccessRemoteRead | AccessRemoteWrite, AccessRemoteRead, 0, 8, false},
		{"write without local write", AccessMWBind | AccessRemoteRead, AccessRemoteWrite, 0, 8, false},
		{"atomic without local write", AccessMWBind | AccessRemoteRead, AccessRemoteAtomic, 0, 8, false},
		{"write with local write", AccessMWBind | AccessLocalWrite, AccessRemoteWrite | AccessRemoteAtomic, 0, 8, true},
		{"window wider than MR rights", AccessMWBind | AccessLocalWrite, AccessRemoteRead, 0, 8, true},
		{"local write in a window", fullMR, AccessLocalWrite, 0, 8, false},
		{"MW_BIND in a window", fullMR, AccessMWBind, 0, 8, false},
		{"past the end", fullMR, AccessRemoteRead, 200, 57, false},
		{"to the end", fullMR, AccessRemoteRead, 200, 56, true},
		{"huge length", fullMR, AccessRemoteRead, 1, ^uint64(0), false},
	}
	for _, c := range cases {
		for _, typ := range []MWType{MWType1, MWType2} {
			w := newMWWorld(t, c.mrAccess)
			mw, _ := w.tab.AllocMW(w.pd, typ)
			k0 := mw.RKey()
			nk, err := w.tab.BindMW(mw, w.pd, qpA, Bind{MRKey: w.mr.LKey(), Addr: w.va + c.addr, Length: c.length, Access: c.mwAccess, RKey: k0&^0xFF | (k0+7)&0xFF})
			if (err == nil) != c.ok {
				t.Errorf("%s %v: err %v, want ok=%v", c.name, typ, err, c.ok)
				continue
			}
			if !c.ok {
				if !errors.Is(err, ErrInvalidArgument) || mw.RKey() != k0 {
					t.Errorf("%s %v: %v, key %#x -> %#x", c.name, typ, err, k0, mw.RKey())
				}
				if _, _, _, _, bound := mw.Bound(); bound {
					t.Errorf("%s %v: bound after a failed bind", c.name, typ)
				}
				if err := w.tab.DeregMR(w.mr); err != nil {
					t.Errorf("%s %v: failed bind left the MR busy: %v", c.name, typ, err)
				}
				continue
			}
			// A window grants its own rights even where the MR has none
			// (only MW_BIND and LOCAL_WRITE of the MR matter).
			if c.mwAccess&AccessRemoteRead != 0 {
				if err := w.tab.Remote(w.pd, qpA).Read(nk, w.va+c.addr, make([]byte, 1)); err != nil {
					t.Errorf("%s %v: read: %v", c.name, typ, err)
				}
			}
		}
	}
	// A bind in another PD's MR, or by a QP of another PD.
	w := newMWWorld(t, fullMR)
	other, _ := w.tab.AllocPD()
	mw, _ := w.tab.AllocMW(other, MWType1)
	if _, err := w.tab.BindMW(mw, other, qpA, Bind{MRKey: w.mr.LKey(), Addr: w.va, Length: 8, Access: AccessRemoteRead}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("MR of another PD: %v", err)
	}
	if _, err := w.tab.BindMW(mw, w.pd, qpA, Bind{MRKey: w.mr.LKey(), Addr: w.va, Length: 8, Access: AccessRemoteRead}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("QP of another PD: %v", err)
	}
	if _, err := w.tab.BindMW(mw, other, qpA, Bind{MRKey: 0x12345678, Addr: w.va, Length: 8, Access: AccessRemoteRead}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("bad lkey: %v", err)
	}
	// An invalidated MR cannot be bound.
	mw2, _ := w.tab.AllocMW(w.pd, MWType1)
	w.tab.Invalidate(w.pd, w.mr.LKey())
	if _, err := w.tab.BindMW(mw2, w.pd, qpA, Bind{MRKey: w.mr.LKey(), Addr: w.va, Length: 8, Access: AccessRemoteRead}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("invalidated MR: %v", err)
	}
	if _, err := w.tab.AllocMW(w.pd, 3); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("type 3: %v", err)
	}
	lim := NewTable(Limits{MaxMW: 1})
	pd, _ := lim.AllocPD()
	lim.AllocMW(pd, MWType1)
	if _, err := lim.AllocMW(pd, MWType1); !errors.Is(err, ErrLimit) {
		t.Errorf("past MaxMW: %v", err)
	}
}

// An invalidation through the window waits for copies in flight through it.
// Run with -race.
func TestMWConcurrentInvalidate(t *testing.T) {
	w := newMWWorld(t, fullMR)
	mw, _ := w.tab.AllocMW(w.pd, MWType2)
	src := make([]byte, 32)
	acc := w.tab.Remote(w.pd, qpA)
	for round := range 50 {
		k := mw.RKey()&^0xFF | uint32(round)&0xFF
		if _, err := w.tab.BindMW(mw, w.pd, qpA, Bind{MRKey: w.mr.LKey(), Addr: w.va, Length: 256, Access: AccessRemoteRead | AccessRemoteWrite, RKey: k}); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for g := range 4 {
			wg.Go(func() {
				// Each its own bytes: the copies of different goroutines
				// must not race with one another, only with the invalidate.
				own := make([]byte, 32)
				for range 20 {
					acc.Write(k, w.va+uint64(g)*32, src)
					acc.Read(k, w.va+128+uint64(g)*32, own)
				}
			})
		}
		if err := w.tab.Invalidate(w.pd, k); err != nil {
			t.Fatal(err)
		}
		if err := acc.Write(k, w.va, src); !errors.Is(err, ErrRemoteAccess) {
			t.Fatalf("write after invalidate: %v", err)
		}
		wg.Wait()
	}
}

// TestMWAccessNoAlloc: an access through a window never allocates.
func TestMWAccessNoAlloc(t *testing.T) {
	w := newMWWorld(t, fullMR)
	mw, _ := w.tab.AllocMW(w.pd, MWType2)
	src := make([]byte, 32)
	dst := make([]byte, 64)
	acc := w.tab.Remote(w.pd, qpA)
	k := mw.RKey()&^0xFF | 0xEE
	if _, err := w.tab.BindMW(mw, w.pd, qpA, Bind{MRKey: w.mr.LKey(), Addr: w.va, Length: 256, Access: AccessRemoteRead | AccessRemoteWrite, RKey: k}); err != nil {
		t.Fatal(err)
	}
	if err := acc.Write(k, w.va, src); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() {
		acc.Write(k, w.va, src)
		acc.Read(k, w.va, dst)
	}); n != 0 {
		t.Errorf("window access allocates %v times", n)
	}
}

// A BIND_MW work request names the window by its current key.
func TestMWBindByKey(t *testing.T) {
	w := newMWWorld(t, fullMR)
	mw, _ := w.tab.AllocMW(w.pd, MWType2)
	k0 := mw.RKey()
	b := Bind{MRKey: w.mr.LKey(), Addr: w.va, Length: 8, Access: AccessRemoteRead, RKey: k0&^0xFF | (k0+3)&0xFF}
	for _, k := range []uint32{k0 ^ 1, w.mr.RKey(), 0xFFFFFF00} {
		if _, err := w.tab.BindMWKey(k, w.pd, qpA, b); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("key %#x: %v", k, err)
		}
	}
	if k, err := w.tab.BindMWKey(k0, w.pd, qpA, b); err != nil || k != b.RKey || mw.RKey() != b.RKey {
		t.Fatalf("bind by key: %#x %v", k, err)
	}
}
