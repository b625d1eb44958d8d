package memreg

import (
	"errors"
	"testing"
)

// The bind-MW verb's binds of a type 1 window: the window takes the key
// the verb chose (same index, any key byte), BindMWKey (a BIND_MW work
// request) refuses a type 1 window whatever its key, the verb's path
// refuses a type 2 window and a key of another index, and WindowType
// finds a window's type from any key with its index.
func TestMWVerbBind(t *testing.T) {
	w := newMWWorld(t, fullMR)
	mw1, _ := w.tab.AllocMW(w.pd, MWType1)
	mw2, _ := w.tab.AllocMW(w.pd, MWType2)
	k0 := mw1.RKey()
	want := k0&^0xFF | (k0+1)&0xFF
	b := Bind{MRKey: w.mr.LKey(), Addr: w.va, Length: 64, Access: AccessRemoteRead, RKey: want, Verb: true}
	if k, err := w.tab.BindMW(mw1, w.pd, qpA, b); err != nil || k != want || mw1.RKey() != want {
		t.Fatalf("verb bind: %#x %v, key %#x, want %#x", k, err, mw1.RKey(), want)
	}
	if _, err := w.tab.BindMWKey(mw1.RKey(), w.pd, qpA, Bind{MRKey: w.mr.LKey(), Addr: w.va, Length: 8, Access: AccessRemoteRead}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("BIND_MW work request for a type 1 window: %v", err)
	}
	bad := b
	bad.RKey = want + 0x100
	if _, err := w.tab.BindMW(mw1, w.pd, qpA, bad); !errors.Is(err, ErrInvalidArgument) || mw1.RKey() != want {
		t.Fatalf("verb bind to a key of another index: %v", err)
	}
	b2 := b
	b2.RKey = mw2.RKey() ^ 1
	if _, err := w.tab.BindMW(mw2, w.pd, qpA, b2); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("verb bind of a type 2 window: %v", err)
	}
	// A zero-length verb bind unbinds, to the chosen key too.
	unb := Bind{RKey: want&^0xFF | (want+1)&0xFF, Verb: true}
	if k, err := w.tab.BindMW(mw1, w.pd, qpA, unb); err != nil || k != unb.RKey {
		t.Fatalf("verb unbind: %#x %v", k, err)
	}
	if _, _, _, _, ok := mw1.Bound(); ok {
		t.Fatal("still bound")
	}
	for _, c := range []struct {
		key uint32
		typ MWType
	}{{k0 ^ 0x5A, MWType1}, {mw2.RKey() ^ 0xFF, MWType2}} {
		if typ, ok := w.tab.WindowType(c.key); !ok || typ != c.typ {
			t.Fatalf("WindowType(%#x) = %v %v, want %v", c.key, typ, ok, c.typ)
		}
	}
	if _, ok := w.tab.WindowType(w.mr.LKey()); ok {
		t.Fatal("WindowType of a region's key")
	}
}
