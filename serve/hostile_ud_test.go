package serve

import (
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/verbs"
)

// ahBody is a CREATE_AH body.
func ahBody(pd, global, sgid, fl, hop, tc, sl, port uint32, dgid [16]byte) []byte {
	return append(u32s(pd, global, sgid, fl, hop, tc, sl, port), dgid[:]...)
}

// gid0 is the device's GID 0, through QUERY_GID.
func (r *rawClient) gid0() [16]byte {
	r.t.Helper()
	e, b, _ := r.call(opQueryGID, u32s(1, 0))
	if e != 0 {
		r.t.Fatalf("QUERY_GID: %v", e)
	}
	return [16]byte(b[:16])
}

// typedQP creates a QP of an ibv_qp_type on an SRQ (0: none) and maps its
// rings; it returns the mapping, the handle and the CREATE_QP answer.
func (r *rawClient) typedQP(pd, cq, typ, srq uint32) ([]byte, uint32, []byte) {
	r.t.Helper()
	e, b, fds := r.call(opCreateQP, u32s(pd, cq, cq, typ, 4, 4, 1, 1, 0, 0, srq, 0))
	if e != 0 || len(fds) != 1 {
		r.t.Fatalf("CREATE_QP type %d: %v", typ, e)
	}
	ring, err := unix.Mmap(fds[0], 0, int(le.Uint64(b[48:])), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	closeAll(fds)
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { unix.Munmap(ring) })
	return ring, le.Uint32(b), b
}

// srq creates an SRQ and maps its ring.
func (r *rawClient) srq(pd, maxWR uint32) ([]byte, uint32, []byte) {
	r.t.Helper()
	e, b, fds := r.call(opCreateSRQ, u32s(pd, maxWR, 1, 0))
	if e != 0 || len(fds) != 1 || len(b) != sizeSRQResp {
		r.t.Fatalf("CREATE_SRQ: %v (%d bytes)", e, len(b))
	}
	ring, err := unix.Mmap(fds[0], 0, int(le.Uint64(b[24:])), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	closeAll(fds)
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { unix.Munmap(ring) })
	return ring, le.Uint32(b), b
}

func waitBad(s *Server, before uint64) {
	for s.Stats().BadWQEs == before {
		unix.Nanosleep(&unix.Timespec{Nsec: 1e6}, nil)
	}
}

// Address handles are checked at creation, and a UD send may name only
// the client's own AHs of the QP's PD: another client's AH, or one of
// another PD, moves the QP to ERR and reaches no one.
func TestHostileUDClient(t *testing.T) {
	s := startPipe(t)
	a := dial(t, s)
	a.open()
	gid := a.gid0()
	aPD := a.handle(opAllocPD, nil)
	aAH := a.handle(opCreateAH, ahBody(aPD, 1, 0, 0, 64, 0, 0, 1, gid))

	h := dial(t, s)
	h.open()
	pd := h.handle(opAllocPD, nil)
	pd2 := h.handle(opAllocPD, nil)
	for _, c := range []struct {
		name string
		body []byte
	}{
		{"no such PD", ahBody(99, 1, 0, 0, 64, 0, 0, 1, gid)},
		{"another client's PD", ahBody(aPD+100, 1, 0, 0, 64, 0, 0, 1, gid)},
		{"no GRH", ahBody(pd, 0, 0, 0, 64, 0, 0, 1, gid)},
		{"sgid index out of the table", ahBody(pd, 1, 200, 0, 64, 0, 0, 1, gid)},
		{"SL 16", ahBody(pd, 1, 0, 0, 64, 0, 16, 1, gid)},
		{"hop limit 256", ahBody(pd, 1, 0, 0, 256, 0, 0, 1, gid)},
		{"port 2", ahBody(pd, 1, 0, 0, 64, 0, 0, 2, gid)},
		{"zero GID", ahBody(pd, 1, 0, 0, 64, 0, 0, 1, [16]byte{})},
		{"short body", ahBody(pd, 1, 0, 0, 64, 0, 0, 1, gid)[:40]},
	} {
		if e, _, _ := h.call(opCreateAH, c.body); e != syscall.EINVAL {
			t.Errorf("CREATE_AH %s: %v, want EINVAL", c.name, e)
		}
	}
	if e, _, _ := h.call(opDestroyAH, u32s(aAH, 0)); e != syscall.EINVAL {
		t.Errorf("DESTROY_AH of another client's AH: %v", e)
	}
	if e, _, _ := h.call(opCreateQP, u32s(pd, 0, 0, 1 /* IBV_QPT_RC is 2; 1 is none */, 4, 4, 1, 1, 0, 0, 0, 0)); e != syscall.EINVAL && e != syscall.EOPNOTSUPP {
		t.Errorf("CREATE_QP of an unknown type: %v", e)
	}
	otherPDAH := h.handle(opCreateAH, ahBody(pd2, 1, 0, 0, 64, 0, 0, 1, gid))
	cq := h.handle(opCreateCQ, u32s(16, 0))
	if e, _, _ := h.call(opDeallocPD, u32s(pd2, 0)); e != syscall.EBUSY {
		t.Errorf("DEALLOC_PD under an AH: %v, want EBUSY", e)
	}
	buf, key := h.regMem(pd, 8192)
	base := uint64(uintptr(unsafePointer(buf)))
	for _, c := range []struct {
		name string
		ah   uint32
	}{
		{"another client's AH", aAH},
		{"an AH of another PD", otherPDAH},
		{"no AH", 0},
	} {
		ring, qh, resp := h.typedQP(pd, cq, ibvQPTUD, 0)
		stride, sqOff := le.Uint32(resp[36:]), int(le.Uint64(resp[56:]))
		bad := s.Stats().BadWQEs
		w := ring[sqOff:][:stride]
		le.PutUint64(w, 5)
		le.PutUint32(w[8:], 0)  // IBV_WR_SEND
		le.PutUint32(w[12:], 2) // IBV_SEND_SIGNALED
		le.PutUint32(w[20:], 1)
		le.PutUint32(w[offWQEAH:], c.ah)
		le.PutUint32(w[offWQERemQPN:], 0x123)
		le.PutUint32(w[offWQERemQKey:], 0x11111111)
		le.PutUint64(w[sizeSendWQE:], base)
		le.PutUint32(w[sizeSendWQE+8:], 64)
		le.PutUint32(w[sizeSendWQE+12:], key)
		store32(ring, offSQProd, 1)
		waitBad(s, bad)
		if load32(ring, offQPError) == 0 {
			t.Errorf("%s: the QP's error flag is not set", c.name)
		}
		if typ, hh := h.event(); typ != evQPFatal || hh != qh {
			t.Errorf("%s: async event %d for handle %d, want QP_FATAL for QP %d", c.name, typ, hh, qh)
		}
	}
	if e, _, _ := h.call(opDestroyAH, u32s(otherPDAH, 0)); e != 0 {
		t.Errorf("DESTROY_AH: %v", e)
	}
	if e, _, _ := h.call(opDestroyAH, u32s(otherPDAH, 0)); e != syscall.EINVAL {
		t.Errorf("second DESTROY_AH: %v", e)
	}
	if e, _, _ := a.call(opDestroyAH, u32s(aAH, 0)); e != 0 {
		t.Errorf("the owner's DESTROY_AH: %v", e)
	}
}

// SRQs are checked at creation and use, and their ring is bounds-checked:
// a producer index beyond it, or an SGE outside the client's MRs, sets
// the SRQ's error flag and raises SRQ_ERR; QPs may use only the client's
// own SRQs of their PD, which cannot be destroyed under them.
func TestHostileSRQClient(t *testing.T) {
	s := startPipe(t)
	a := dial(t, s)
	a.open()
	aPD := a.handle(opAllocPD, nil)
	_, aSRQ, _ := a.srq(aPD, 4)

	h := dial(t, s)
	h.open()
	pd := h.handle(opAllocPD, nil)
	pd2 := h.handle(opAllocPD, nil)
	cq := h.handle(opCreateCQ, u32s(16, 0))
	for _, c := range []struct {
		name string
		body []byte
	}{
		{"no PD", u32s(99, 4, 1, 0)},
		{"max_wr 0", u32s(pd, 0, 1, 0)},
		{"max_wr over the device's", u32s(pd, verbs.MaxSRQWR+1, 1, 0)},
		{"max_sge over the device's", u32s(pd, 4, verbs.MaxSRQSGE+1, 0)},
		{"limit over max_wr", u32s(pd, 4, 1, 5)},
		{"short body", u32s(pd, 4, 1)},
	} {
		if e, _, fds := h.call(opCreateSRQ, c.body); e != syscall.EINVAL || len(fds) != 0 {
			t.Errorf("CREATE_SRQ %s: %v, want EINVAL", c.name, e)
		}
	}
	ring, srqH, resp := h.srq(pd, 4)
	if size := le.Uint32(resp[16:]); size != 4 {
		t.Fatalf("SRQ of %d slots", size)
	}
	for _, c := range []struct {
		name string
		body []byte
		want syscall.Errno
	}{
		{"another client's SRQ", u32s(pd, cq, cq, ibvQPTRC, 4, 4, 1, 1, 0, 0, aSRQ+100, 0), syscall.EINVAL},
		{"an SRQ of another PD", u32s(pd2, cq, cq, ibvQPTRC, 4, 4, 1, 1, 0, 0, srqH, 0), syscall.EINVAL},
	} {
		if e, _, fds := h.call(opCreateQP, c.body); e != c.want || len(fds) != 0 {
			t.Errorf("CREATE_QP on %s: %v, want %v", c.name, e, c.want)
		}
	}
	for _, c := range []struct {
		name string
		op   uint32
		body []byte
		want syscall.Errno
	}{
		{"MODIFY_SRQ resize", opModifySRQ, u32s(srqH, ibvSRQMaxWR, 8, 0), syscall.EOPNOTSUPP},
		{"MODIFY_SRQ limit over max_wr", opModifySRQ, u32s(srqH, ibvSRQLimit, 0, 5), syscall.EINVAL},
		{"MODIFY_SRQ unknown mask", opModifySRQ, u32s(srqH, 8, 0, 0), syscall.EINVAL},
		{"MODIFY_SRQ of another client's", opModifySRQ, u32s(aSRQ+100, ibvSRQLimit, 0, 1), syscall.EINVAL},
		{"QUERY_SRQ of none", opQuerySRQ, u32s(999, 0), syscall.EINVAL},
		{"DESTROY_SRQ of none", opDestroySRQ, u32s(999, 0), syscall.EINVAL},
	} {
		if e, _, _ := h.call(c.op, c.body); e != c.want {
			t.Errorf("%s: %v, want %v", c.name, e, c.want)
		}
	}
	_, qh, _ := h.typedQP(pd, cq, ibvQPTRC, srqH)
	if e, _, _ := h.call(opDestroySRQ, u32s(srqH, 0)); e != syscall.EBUSY {
		t.Errorf("DESTROY_SRQ under a QP: %v, want EBUSY", e)
	}
	if e, _, _ := h.call(opDestroyQP, u32s(qh, 0)); e != 0 {
		t.Fatalf("DESTROY_QP: %v", e)
	}

	// A producer index beyond the ring.
	bad := s.Stats().BadWQEs
	store32(ring, offRQProd, 100)
	waitBad(s, bad)
	if load32(ring, offQPError) == 0 {
		t.Error("producer beyond the ring: the SRQ's error flag is not set")
	}
	if typ, hh := h.event(); typ != evSRQErr || hh != srqH {
		t.Errorf("async event %d for handle %d, want SRQ_ERR for SRQ %d", typ, hh, srqH)
	}
	if e, _, _ := h.call(opDestroySRQ, u32s(srqH, 0)); e != 0 {
		t.Errorf("DESTROY_SRQ: %v", e)
	}

	// SGEs outside the client's memory, on fresh SRQs.
	buf, key := h.regMem(pd, 8192)
	_, otherKey := a.regMem(aPD, 8192)
	base := uint64(uintptr(unsafePointer(buf)))
	for _, c := range []struct {
		name      string
		addr      uint64
		len, lkey uint32
		nsge      uint32
	}{
		{"past the end", base + 8000, 1000, key, 1},
		{"another client's MR", base, 100, otherKey, 1},
		{"too many SGEs", base, 100, key, 2},
	} {
		ring, sh, resp := h.srq(pd, 4)
		stride := le.Uint32(resp[20:])
		w := ring[ctlPage:][:stride]
		le.PutUint64(w, 7)
		le.PutUint32(w[8:], c.nsge)
		le.PutUint64(w[16:], c.addr)
		le.PutUint32(w[24:], c.len)
		le.PutUint32(w[28:], c.lkey)
		bad := s.Stats().BadWQEs
		store32(ring, offRQProd, 1)
		waitBad(s, bad)
		if typ, hh := h.event(); typ != evSRQErr || hh != sh {
			t.Errorf("%s: async event %d for handle %d, want SRQ_ERR for SRQ %d", c.name, typ, hh, sh)
		}
	}
	// A good one is accepted and queried.
	ring, sh, _ := h.srq(pd, 4)
	w := ring[ctlPage:]
	le.PutUint64(w, 8)
	le.PutUint32(w[8:], 1)
	le.PutUint64(w[16:], base+100)
	le.PutUint32(w[24:], 1000)
	le.PutUint32(w[28:], key)
	bad = s.Stats().BadWQEs
	store32(ring, offRQProd, 1)
	for load32(ring, offRQCons) != 1 {
		unix.Nanosleep(&unix.Timespec{Nsec: 1e6}, nil)
	}
	if s.Stats().BadWQEs != bad || load32(ring, offQPError) != 0 {
		t.Error("a receive inside the client's MR was refused")
	}
	if e, _, _ := h.call(opModifySRQ, u32s(sh, ibvSRQLimit, 0, 2)); e != 0 {
		t.Errorf("MODIFY_SRQ limit: %v", e)
	}
	if e, b, _ := h.call(opQuerySRQ, u32s(sh, 0)); e != 0 || le.Uint32(b) != 4 || le.Uint32(b[4:]) != 1 || le.Uint32(b[8:]) != 2 {
		t.Errorf("QUERY_SRQ: %v % x", e, b)
	}
}

// The ops of ud.go and srq.go, whatever their bodies, are answered
// without a panic and leave nothing behind.
func FuzzHandleUD(f *testing.F) {
	s := startPipe(f)
	var gid [16]byte
	gid[10], gid[11], gid[12] = 0xff, 0xff, 10
	f.Add(u32s(opCreateAH, 0), ahBody(1, 1, 0, 0, 64, 0, 0, 1, gid))
	f.Add(u32s(opCreateSRQ, 0), u32s(1, 4, 1, 0))
	f.Add(u32s(opModifySRQ, 0), u32s(3, ibvSRQLimit, 0, 1))
	f.Add(u32s(opQuerySRQ, 0), u32s(3, 0))
	f.Add(u32s(opResizeSRQ, 0), u32s(3, ibvSRQMaxWR|ibvSRQLimit, 16, 2))
	f.Add(u32s(opDestroyAH, 0), u32s(3, 0))
	f.Add(u32s(opCreateQP, 0), u32s(1, 2, 2, ibvQPTUD, 4, 4, 1, 1, 0, 0, 3, 0))
	f.Fuzz(func(t *testing.T, hdr, body []byte) {
		c := newClient(s, nil)
		c.dev = s.devs[0]
		c.bell = -1
		c.handle(u32s(opAllocPD, 0), nil)
		c.handle(u32s(opCreateCQ, 0, 8, 0), nil)
		_, fds, _ := c.handle(append(u32s(opCreateSRQ, 0), u32s(1, 4, 1, 0)...), nil)
		closeAll(fds)
		_, fds, _ = c.handle(append(hdr, body...), nil)
		closeAll(fds)
		c.dev.mu.Lock()
		for h := range c.qps {
			c.destroyQP(h)
		}
		c.cleanupUD()
		for h := range c.cqs {
			c.destroyCQ(h)
		}
		for h := range c.pds {
			c.deallocPD(h)
		}
		if len(c.srqs)+len(c.ahs)+len(c.pds) != 0 {
			t.Errorf("left %d SRQs, %d AHs, %d PDs", len(c.srqs), len(c.ahs), len(c.pds))
		}
		c.dev.mu.Unlock()
	})
}

// The status lists each client's SRQs and AHs.
func TestStatusSRQsAHs(t *testing.T) {
	s := startPipe(t)
	h := dial(t, s)
	h.open()
	pd := h.handle(opAllocPD, nil)
	h.srq(pd, 4)
	h.handle(opCreateAH, ahBody(pd, 1, 0, 0, 64, 0, 0, 1, h.gid0()))
	h.handle(opCreateAH, ahBody(pd, 1, 0, 0, 64, 0, 0, 1, h.gid0()))
	st := s.Status()
	if len(st.Clients) != 1 || st.Clients[0].SRQs != 1 || st.Clients[0].AHs != 2 {
		t.Fatalf("status: %+v", st.Clients)
	}
}
