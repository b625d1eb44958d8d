package serve

import (
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/verbs"
)

func regMRIOVABody(pd uint32, addr, length, iova uint64, access uint32, ext ...extent) []byte {
	b := regMRBody(pd, addr, length, ext...)
	le.PutUint32(b[4:], access)
	out := append([]byte(nil), b[:sizeRegMR]...)
	out = le.AppendUint64(out, iova)
	return append(out, b[sizeRegMR:]...)
}

// Memory windows and IOVA registration are untrusted input like the
// rest: windows of PDs or handles the client does not own, freed ones,
// malformed bodies get errors; a BIND_MW WQE naming a window or region
// that is not the client's, or giving a type 1 window a key with another
// index, moves the QP to ERR. A type 1 key with the window's index and any
// key byte is the client's choice and accepted. The other client's window
// keeps working.
func TestHostileMWClient(t *testing.T) {
	s := startPipe(t)
	a := dial(t, s)
	a.open()
	aPD := a.handle(opAllocPD, nil)
	_, aKey := a.regMem(aPD, 8192)
	e, body, _ := a.call(opAllocMW, u32s(aPD, uint32(verbs.MWType1)))
	if e != 0 || len(body) != sizeMWResp {
		t.Fatalf("ALLOC_MW: %v, %d bytes", e, len(body))
	}
	aMW := le.Uint32(body)

	h := dial(t, s)
	h.open()
	pd := h.handle(opAllocPD, nil)
	const foreign = 1000 // no object of h's: handles are per connection
	for _, c := range []struct {
		name string
		msg  []byte
	}{
		{"no such PD", u32s(opAllocMW, 0, foreign, 1)},
		{"type 0", u32s(opAllocMW, 0, pd, 0)},
		{"type 3", u32s(opAllocMW, 0, pd, 3)},
		{"short body", u32s(opAllocMW, 0, pd)},
		{"long body", u32s(opAllocMW, 0, pd, 1, 0)},
		{"DEALLOC_MW of no window", u32s(opDeallocMW, 0, foreign, 0)},
		{"DEALLOC_MW of a PD's handle", u32s(opDeallocMW, 0, pd, 0)},
		{"short DEALLOC_MW", u32s(opDeallocMW, 0, aMW)},
		{"short REG_MR_IOVA", append(u32s(opRegMRIOVA, 0), regMRIOVABody(pd, 0x1000, 10, 0, 1, extent{0x1000, 4096, 0})[:36]...)},
	} {
		if e, _, fds := h.raw(c.msg); e != syscall.EINVAL || len(fds) != 0 {
			t.Errorf("%s: %v, want EINVAL", c.name, e)
		}
	}
	e, body, _ = h.call(opAllocMW, u32s(pd, 1))
	if e != 0 || len(body) != sizeMWResp {
		t.Fatalf("ALLOC_MW: %v", e)
	}
	mw1, k1 := le.Uint32(body), le.Uint32(body[4:])
	mw2 := h.handle(opAllocMW, u32s(pd, 2))
	freed := h.handle(opAllocMW, u32s(pd, 1))
	if e, _, _ := h.call(opDeallocMW, u32s(freed, 0)); e != 0 {
		t.Fatalf("DEALLOC_MW: %v", e)
	}
	if e, _, _ := h.call(opDeallocMW, u32s(freed, 0)); e != syscall.EINVAL {
		t.Errorf("DEALLOC_MW of a freed window: %v", e)
	}
	if e, _, _ := h.call(opDeallocPD, u32s(pd, 0)); e != syscall.EBUSY {
		t.Errorf("DEALLOC_PD under windows: %v, want EBUSY", e)
	}

	// IOVA registration: a range that wraps and ZERO_BASED are refused;
	// one inside the address space registers.
	buf, key := h.regMem(pd, 8192)
	base := uint64(uintptr(unsafePointer(buf)))
	for _, c := range []struct {
		name   string
		iova   uint64
		access uint32
		want   syscall.Errno
	}{
		{"a wrapping IOVA", ^uint64(0) - 4000, 1, syscall.EINVAL},
		{"ZERO_BASED", 0x1000, 1 | 32, syscall.EOPNOTSUPP},
		{"an IOVA", 0x1000, 1, 0},
	} {
		fd := memfd(t, 8192, true)
		e, b, _ := h.call(opRegMRIOVA, regMRIOVABody(pd, base, 8192, c.iova, c.access, extent{base, 8192, 0}), fd)
		if e != c.want || e == 0 && len(b) != sizeMR {
			t.Errorf("REG_MR_IOVA with %s: %v, want %v", c.name, e, c.want)
		}
	}

	cq := h.handle(opCreateCQ, u32s(16, 0))
	for _, c := range []struct {
		name       string
		mw, lkey   uint32
		rkey, mwK  uint32
		access     uint64
		wantFailed bool
	}{
		{"another client's window", foreign, key, 0, 0, 2, true},
		{"a freed window", freed, key, 0, 0, 2, true},
		{"a type 2 window through ibv_bind_mw", mw2, key, 0, 0, 2, true},
		{"another client's region", mw1, aKey, 0, 0, 2, true},
		{"a type 1 key with another index", mw1, key, k1 ^ 0x100, 0, 2, true},
		{"a type 1 key with another index's top bit", mw1, key, k1 ^ 0x80000000, 0, 2, true},
		{"a type 1 key byte not ibv_inc_rkey's", mw1, key, k1&^0xff | (k1+5)&0xff, 0, 2, false},
		{"a type 1 key byte going back", mw1, key, k1&^0xff | (k1+2)&0xff, 0, 2, false},
		{"access flags beyond 32 bits", 0, key, 0, 0, 1 << 40, true},
	} {
		ring, qh, resp := h.typedQP(pd, cq, ibvQPTRC, 0)
		// In ERR a bind is accepted and flushed, so only the daemon's
		// checks of the WQE can refuse it.
		toErr := qpAttrWire{state: 6}
		if e, _, _ := h.call(opModifyQP, append(u32s(qh, 1), toErr.encode(nil)...)); e != 0 {
			t.Fatalf("MODIFY_QP to ERR: %v", e)
		}
		stride, sqOff := le.Uint32(resp[36:]), int(le.Uint64(resp[56:]))
		bad := s.Stats().BadWQEs
		w := ring[sqOff:][:stride]
		le.PutUint64(w, 5)
		le.PutUint32(w[8:], 8) // IBV_WR_BIND_MW
		le.PutUint32(w[12:], 2)
		le.PutUint32(w[28:], c.rkey)
		le.PutUint64(w[32:], base)
		le.PutUint64(w[40:], 4096)
		le.PutUint64(w[48:], c.access)
		le.PutUint32(w[56:], c.mwK)
		le.PutUint32(w[offWQEBindLKey:], c.lkey)
		le.PutUint32(w[offWQEBindMW:], c.mw)
		store32(ring, offSQProd, 1)
		if !c.wantFailed {
			for load32(ring, offSQCons) != 1 {
				unix.Nanosleep(&unix.Timespec{Nsec: 1e6}, nil)
			}
			if s.Stats().BadWQEs != bad || load32(ring, offQPError) != 0 {
				t.Errorf("%s: refused", c.name)
			}
			continue
		}
		waitBad(s, bad)
		if load32(ring, offQPError) == 0 {
			t.Errorf("%s: the QP's error flag is not set", c.name)
		}
		if typ, hh := h.event(); typ != evQPFatal || hh != qh {
			t.Errorf("%s: async event %d for handle %d, want QP_FATAL for QP %d", c.name, typ, hh, qh)
		}
	}
	if e, _, _ := h.call(opDeallocMW, u32s(mw1, 0)); e != 0 {
		t.Errorf("DEALLOC_MW of its own window: %v", e)
	}
	// The other client's window is untouched by all this.
	if e, _, _ := a.call(opDeallocMW, u32s(aMW, 0)); e != 0 {
		t.Errorf("the owner's DEALLOC_MW: %v", e)
	}
	if s.Stats().BadRequests == 0 {
		t.Error("no bad request counted")
	}
}
