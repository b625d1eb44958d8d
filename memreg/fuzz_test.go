package memreg

import (
	"errors"
	"math/bits"
	"testing"
)

// fuzzWorld is a table with regions carved out of one arena, separated and
// surrounded by canary bytes, plus an independent model of which keys are
// live, in which PD, with which rights and range.
type fuzzWorld struct {
	tab    *Table
	pds    [2]*PD
	arena  []byte
	models []regionModel
}

type regionModel struct {
	key    uint32
	off    int // offset of the region in the arena
	size   int
	va     uint64
	access Access
	pd     *PD
	live   bool
}

const (
	canary  = 0xC5
	guard   = 64
	regSize = 256
)

func newFuzzWorld(t *testing.T) *fuzzWorld {
	w := &fuzzWorld{tab: NewTable(Limits{})}
	w.pds[0], _ = w.tab.AllocPD()
	w.pds[1], _ = w.tab.AllocPD()
	specs := []struct {
		access Access
		pd     int
		fate   int // 0 live, 1 rereg (old key stale), 2 dereg, 3 invalidated
	}{
		{all, 0, 0},
		{AccessRemoteRead, 0, 0},
		{all | AccessZeroBased, 1, 0},
		{AccessLocalWrite | AccessRemoteWrite, 1, 0},
		{all, 0, 1},
		{all, 0, 2},
		{all, 1, 3},
	}
	w.arena = make([]byte, guard+len(specs)*(regSize+guard))
	for i := range w.arena {
		w.arena[i] = canary
	}
	for i, sp := range specs {
		off := guard + i*(regSize+guard)
		buf := w.arena[off : off+regSize : off+regSize]
		for j := range buf {
			buf[j] = 0
		}
		pd := w.pds[sp.pd]
		mr, err := w.tab.RegMR(pd, buf, sp.access)
		if err != nil {
			t.Fatal(err)
		}
		m := regionModel{key: mr.RKey(), off: off, size: regSize, va: mr.Addr(), access: sp.access, pd: pd, live: true}
		switch sp.fate {
		case 1:
			stale := m
			stale.live = false
			w.models = append(w.models, stale)
			if err := w.tab.ReregMR(mr, nil, sp.access); err != nil {
				t.Fatal(err)
			}
			m.key = mr.RKey()
		case 2:
			if err := w.tab.DeregMR(mr); err != nil {
				t.Fatal(err)
			}
			m.live = false
		case 3:
			if err := w.tab.Invalidate(pd, m.key); err != nil {
				t.Fatal(err)
			}
			m.live = false
		}
		w.models = append(w.models, m)
	}
	return w
}

// expect returns the class the model predicts for an access (0: success)
// and, on success, the arena offset it touches.
func (w *fuzzWorld) expect(pd *PD, key uint32, va, n uint64, need Access, atomic bool, class ErrorClass) (ErrorClass, int) {
	if n == 0 && !atomic {
		return 0, 0
	}
	for _, m := range w.models {
		if m.key != key || !m.live {
			continue
		}
		if m.pd != pd || m.access&need != need {
			return class, 0
		}
		end, carry := bits.Add64(va, n, 0)
		if carry != 0 || va < m.va || end > m.va+uint64(m.size) {
			return class, 0
		}
		if atomic && va%8 != 0 {
			return ClassInvalidRequest, 0
		}
		return 0, m.off + int(va-m.va)
	}
	return class, 0
}

func FuzzRemoteAccess(f *testing.F) {
	f.Add(uint8(0), uint32(0), uint64(0), uint32(16), uint8(2), uint8(1))
	f.Add(uint8(16), uint32(0), uint64(250), uint32(16), uint8(0), uint8(1))
	f.Add(uint8(17), uint32(0), uint64(8), uint32(8), uint8(8), uint8(3))
	f.Add(uint8(4), uint32(0), uint64(0), uint32(1), uint8(4), uint8(2))
	f.Add(uint8(3+16), uint32(0), uint64(255), uint32(2), uint8(1), uint8(5))
	f.Add(uint8(8), uint32(0x100), ^uint64(0), uint32(4), uint8(2), uint8(0))
	f.Fuzz(func(t *testing.T, sel uint8, keyBits uint32, vaBits uint64, length uint32, accessBits uint8, op uint8) {
		w := newFuzzWorld(t)
		// Key: a real key (live, stale, deregistered or invalidated),
		// optionally perturbed, or an arbitrary one.
		var key uint32
		if k := int(sel & 7); k < len(w.models) {
			key = w.models[k].key
			if sel&8 != 0 {
				key ^= keyBits
			}
		} else {
			key = keyBits
		}
		// VA: relative to a region's start (near its bounds) or arbitrary.
		va := vaBits
		if sel&16 != 0 {
			va = w.models[int(sel&7)%len(w.models)].va + vaBits%(2*regSize) - regSize/2
		}
		pd := []*PD{w.pds[0], w.pds[1], nil, w.pds[0]}[sel>>5&3]
		n := uint64(length % 600)
		need := Access(accessBits) & (AccessRemoteRead | AccessRemoteWrite | AccessRemoteAtomic | AccessLocalWrite)

		before := append([]byte(nil), w.arena...)
		src := make([]byte, n)
		for i := range src {
			src[i] = byte(i*7 + 1)
		}
		var err error
		var want ErrorClass
		var at int
		written := 0
		switch op % 7 {
		case 0:
			err = w.tab.CheckRemote(pd, key, va, n, need)
			want, _ = w.expect(pd, key, va, n, need, false, ClassRemoteAccess)
		case 1:
			err = w.tab.RemoteWrite(pd, key, va, src)
			want, at = w.expect(pd, key, va, n, AccessRemoteWrite, false, ClassRemoteAccess)
			written = int(n)
		case 2:
			dst := make([]byte, n)
			err = w.tab.RemoteRead(pd, key, va, dst)
			want, at = w.expect(pd, key, va, n, AccessRemoteRead, false, ClassRemoteAccess)
			if err == nil && n > 0 && string(dst) != string(w.arena[at:at+int(n)]) {
				t.Fatalf("read returned other bytes than the region's")
			}
		case 3:
			_, err = w.tab.RemoteAtomic(pd, key, va, AtomicFetchAdd, 0x0101010101010101, 0)
			want, at = w.expect(pd, key, va, 8, AccessRemoteAtomic, true, ClassRemoteAccess)
			written = -8
		case 4:
			err = w.tab.RemoteAtomicWrite(pd, key, va, [8]byte{1, 8, 15, 22, 29, 36, 43, 50})
			want, at = w.expect(pd, key, va, 8, AccessRemoteWrite, true, ClassRemoteAccess)
			src, written = []byte{1, 8, 15, 22, 29, 36, 43, 50}, 8
		case 5:
			err = w.tab.LocalWrite(pd, key, va, src)
			want, at = w.expect(pd, key, va, n, AccessLocalWrite, false, ClassLocalProtection)
			written = int(n)
		case 6:
			dst := make([]byte, n)
			err = w.tab.LocalRead(pd, key, va, dst)
			want, at = w.expect(pd, key, va, n, 0, false, ClassLocalProtection)
		}

		if want == 0 {
			if err != nil {
				t.Fatalf("key %#x va %#x len %d: model allows, table says %v", key, va, n, err)
			}
		} else {
			var ae *AccessError
			if !errors.As(err, &ae) || ae.Class != want {
				t.Fatalf("key %#x va %#x len %d: model says %v, table says %v", key, va, n, want, err)
			}
			written = 0
		}
		// Only the accessed range of the accessed region may have changed;
		// canaries and every other byte stay as they were.
		for i := range w.arena {
			inRange := written != 0 && i >= at && i < at+max(written, -written)
			if inRange {
				if written > 0 && w.arena[i] != src[i-at] {
					t.Fatalf("byte %d: wrote %#x, want %#x", i, w.arena[i], src[i-at])
				}
				continue
			}
			if w.arena[i] != before[i] {
				t.Fatalf("byte %d outside the accessed range changed (%#x -> %#x); key %#x va %#x len %d op %d",
					i, before[i], w.arena[i], key, va, n, op%7)
			}
		}
	})
}
