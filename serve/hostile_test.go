package serve

import (
	"net"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// rawClient speaks the control protocol directly, as a hostile client may.
type rawClient struct {
	t      *testing.T
	c      *net.UnixConn
	events int // the async event pipe, after open
	bell   int // the doorbell eventfd, after open
}

func dial(t *testing.T, s *Server) *rawClient {
	t.Helper()
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: s.Socket(), Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawClient{t: t, c: c}
}

// raw sends msg as it is and returns the errno and body of the answer.
func (r *rawClient) raw(msg []byte, fds ...int) (syscall.Errno, []byte, []int) {
	r.t.Helper()
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := r.c.WriteMsgUnix(msg, oob, nil); err != nil {
		r.t.Fatalf("write: %v", err)
	}
	buf := make([]byte, maxMsg)
	ob := make([]byte, unix.CmsgSpace(4*4))
	n, on, _, _, err := r.c.ReadMsgUnix(buf, ob)
	if err != nil || n < sizeResp {
		r.t.Fatalf("read answer: %d bytes, %v", n, err)
	}
	return syscall.Errno(le.Uint32(buf)), buf[sizeResp:n], parseFDs(ob[:on])
}

func (r *rawClient) call(op uint32, body []byte, fds ...int) (syscall.Errno, []byte, []int) {
	r.t.Helper()
	msg := le.AppendUint32(nil, op)
	msg = le.AppendUint32(msg, 0)
	return r.raw(append(msg, body...), fds...)
}

func u32s(v ...uint32) []byte {
	var b []byte
	for _, x := range v {
		b = le.AppendUint32(b, x)
	}
	return b
}

func (r *rawClient) open() {
	r.t.Helper()
	e, _, fds := r.call(opOpen, u32s(0, 0))
	if e != 0 || len(fds) != 2 {
		r.t.Fatalf("OPEN: %v, %d fds", e, len(fds))
	}
	r.bell, r.events = fds[0], fds[1]
	r.t.Cleanup(func() { unix.Close(fds[0]); unix.Close(fds[1]) })
}

// event reads one async event.
func (r *rawClient) event() (typ, handle uint32) {
	r.t.Helper()
	var b [8]byte
	if n, err := unix.Read(r.events, b[:]); n != 8 || err != nil {
		r.t.Fatalf("read async event: %d bytes, %v", n, err)
	}
	return le.Uint32(b[:]), le.Uint32(b[4:])
}

func (r *rawClient) handle(op uint32, body []byte) uint32 {
	r.t.Helper()
	e, b, fds := r.call(op, body)
	closeAll(fds)
	if e != 0 || len(b) < 4 {
		r.t.Fatalf("op %d: %v", op, e)
	}
	return le.Uint32(b)
}

func memfd(t *testing.T, size int, seal bool) int {
	t.Helper()
	fd, err := unix.MemfdCreate("t", unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	unix.Ftruncate(fd, int64(size))
	if seal {
		unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

func regMRBody(pd uint32, addr, length uint64, ext ...extent) []byte {
	b := u32s(pd, 1)
	b = le.AppendUint64(b, addr)
	b = le.AppendUint64(b, length)
	b = append(b, u32s(uint32(len(ext)), 0)...)
	for _, e := range ext {
		b = le.AppendUint64(b, e.va)
		b = le.AppendUint64(b, e.len)
		b = le.AppendUint64(b, e.off)
	}
	return b
}

// A client that sends garbage, other clients' or freed handles and memory
// it does not own gets errors; the daemon keeps serving everyone.
func TestHostileClient(t *testing.T) {
	s := startPipe(t)
	good := dial(t, s)
	good.open()
	goodPD := good.handle(opAllocPD, nil)

	h := dial(t, s)
	for _, c := range []struct {
		name string
		msg  []byte
		want syscall.Errno
	}{
		{"empty", []byte{}, 0}, // a zero-length datagram: see below
		{"truncated header", []byte{1, 0, 0}, syscall.EINVAL},
		{"unknown op", u32s(99, 0), syscall.EINVAL},
		{"op zero", u32s(0, 0), syscall.EINVAL},
		{"truncated HELLO", u32s(opHello, 0, 1), syscall.EINVAL},
		{"HELLO of another version", u32s(opHello, 0, 99, 0), syscall.EPROTONOSUPPORT},
		{"long HELLO", u32s(opHello, 0, 1, 0, 7), syscall.EINVAL},
		{"PD before OPEN", u32s(opAllocPD, 0), syscall.EBADF},
		{"REG_MR with 1000 extents", append(u32s(opRegMR, 0), regMRBody(1, 0x1000, 10)[:24]...), syscall.EINVAL},
	} {
		if len(c.msg) == 0 {
			continue
		}
		if e, _, _ := h.raw(c.msg); e != c.want {
			t.Errorf("%s: errno %v, want %v", c.name, e, c.want)
		}
	}
	// Oversized: more than the daemon reads is refused, the connection lives on.
	big := make([]byte, maxMsg+100)
	le.PutUint32(big, opHello)
	if e, _, _ := h.raw(big); e != syscall.EMSGSIZE && e != syscall.EINVAL {
		t.Errorf("oversized message: errno %v", e)
	}
	h.open()
	if e, _, _ := h.call(opOpen, u32s(0, 0)); e != syscall.EBUSY {
		t.Errorf("second OPEN: %v, want EBUSY", e)
	}
	// The good client's PD handle does not exist for this client (handles
	// are per connection): every verb on it fails.
	foreign := goodPD + 1000
	for _, op := range []uint32{opDeallocPD, opDeregMR, opDestroyCQ, opDestroyQP, opQueryQP, opDestroyChannel} {
		if e, _, _ := h.call(op, u32s(foreign, 0)); e != syscall.EINVAL {
			t.Errorf("op %d on a foreign handle: %v, want EINVAL", op, e)
		}
	}
	pd := h.handle(opAllocPD, nil)
	if e, _, _ := h.call(opDeallocPD, u32s(pd, 0)); e != 0 {
		t.Fatalf("dealloc PD: %v", e)
	}
	if e, _, _ := h.call(opDeallocPD, u32s(pd, 0)); e != syscall.EINVAL {
		t.Errorf("dealloc of a freed PD: %v, want EINVAL", e)
	}
	pd = h.handle(opAllocPD, nil)

	// Memory: descriptors that are not sealed memfds, extents that do not
	// tile the range, memfds smaller than they claim.
	pr := make([]int, 2)
	unix.Pipe(pr)
	defer unix.Close(pr[0])
	sp, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(sp[0])
	defer unix.Close(sp[1])
	defer unix.Close(pr[1])
	addr := uint64(0x7e0000000000)
	for _, c := range []struct {
		name string
		body []byte
		fds  []int
	}{
		{"a pipe", regMRBody(pd, addr, 100, extent{addr, 4096, 0}), []int{pr[0]}},
		{"a socket", regMRBody(pd, addr, 100, extent{addr, 4096, 0}), []int{sp[0]}},
		{"unsealed memfd", regMRBody(pd, addr, 100, extent{addr, 4096, 0}), []int{memfd(t, 4096, false)}},
		{"memfd too small", regMRBody(pd, addr, 8192, extent{addr, 8192, 0}), []int{memfd(t, 4096, true)}},
		{"gap in extents", regMRBody(pd, addr, 8192, extent{addr, 4096, 0}, extent{addr + 8192, 4096, 0}), []int{memfd(t, 8192, true), memfd(t, 8192, true)}},
		{"fewer fds than extents", regMRBody(pd, addr, 100, extent{addr, 4096, 0}), nil},
		{"wrapping range", regMRBody(pd, ^uint64(0)-10, 100, extent{^uint64(0) &^ 4095, 4096, 0}), []int{memfd(t, 4096, true)}},
		{"foreign PD", regMRBody(goodPD+1000, addr, 100, extent{addr, 4096, 0}), []int{memfd(t, 4096, true)}},
	} {
		if e, _, _ := h.call(opRegMR, c.body, c.fds...); e == 0 {
			t.Errorf("REG_MR with %s succeeded", c.name)
		}
	}
	// A client cannot make the daemon allocate CQ rings without bound.
	var made []uint32
	for range 100 {
		e, b, fds := h.call(opCreateCQ, u32s(maxCQSlots, 0))
		closeAll(fds)
		if e != 0 {
			if e != syscall.ENOMEM {
				t.Errorf("CREATE_CQ over the budget: %v, want ENOMEM", e)
			}
			break
		}
		made = append(made, le.Uint32(b))
	}
	if want := DefaultLimits().CQSlotsPerConn / maxCQSlots; len(made) != want {
		t.Errorf("%d CQs of %d slots created, want %d", len(made), maxCQSlots, want)
	}
	for _, cq := range made {
		if e, _, _ := h.call(opDestroyCQ, u32s(cq, 0)); e != 0 {
			t.Fatalf("DESTROY_CQ: %v", e)
		}
	}
	// Descriptors with a request that takes none are refused.
	if e, _, _ := h.call(opAllocPD, nil, memfd(t, 4096, true)); e != syscall.EINVAL {
		t.Errorf("ALLOC_PD with a descriptor: %v", e)
	}

	// A QP whose rings hold garbage: its producer indices run past the
	// ring, its WQEs name keys it does not own. The QP goes to ERR; the
	// daemon goes on.
	cq := h.handle(opCreateCQ, u32s(16, 0))
	e, b, fds := h.call(opCreateQP, u32s(pd, cq, cq, 2, 4, 4, 1, 1, 0, 0))
	if e != 0 || len(fds) != 1 {
		t.Fatalf("CREATE_QP: %v", e)
	}
	qpLen := int(le.Uint64(b[48:]))
	ring, err := unix.Mmap(fds[0], 0, qpLen, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	closeAll(fds)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(ring)
	for i := range ring[ctlPage:] {
		ring[ctlPage+i] = 0xA5
	}
	le.PutUint32(ring[offRQProd:], 1<<30)
	le.PutUint32(ring[offSQProd:], 3)
	for s.Stats().BadWQEs == 0 {
		unix.Nanosleep(&unix.Timespec{Nsec: 1e6}, nil)
	}

	// The good client still works.
	if e, _, _ := good.call(opQueryDevice, nil); e != 0 {
		t.Errorf("the other client's QUERY_DEVICE after the attack: %v", e)
	}
	good.handle(opAllocPD, nil)
	if s.Stats().BadRequests == 0 {
		t.Error("no bad request counted")
	}
}

// A client that disconnects loses its QPs; another client's are untouched.
func TestDisconnectFreesOnlyThatClient(t *testing.T) {
	s := startPipe(t)
	a, b := dial(t, s), dial(t, s)
	for _, c := range []*rawClient{a, b} {
		c.open()
		pd := c.handle(opAllocPD, nil)
		cq := c.handle(opCreateCQ, u32s(8, 0))
		e, _, fds := c.call(opCreateQP, u32s(pd, cq, cq, 2, 4, 4, 1, 1, 0, 0))
		closeAll(fds)
		if e != 0 {
			t.Fatalf("CREATE_QP: %v", e)
		}
	}
	if n := s.QPs(); n != 2 {
		t.Fatalf("%d QPs, want 2", n)
	}
	a.c.Close()
	for s.Stats().Clients != 1 {
		unix.Nanosleep(&unix.Timespec{Nsec: 1e6}, nil)
	}
	if n := s.QPs(); n != 1 {
		t.Errorf("after one client left: %d QPs, want 1", n)
	}
	if e, _, _ := b.call(opQueryQP, u32s(3, 0)); e != 0 {
		t.Errorf("the remaining client's QP: %v", e)
	}
}

// The request decoder never panics, and every request it accepts has the
// length its op needs.
func FuzzParseRequest(f *testing.F) {
	f.Add(u32s(opHello, 0, 1, 0))
	f.Add(append(u32s(opRegMR, 0), regMRBody(1, 0x1000, 10, extent{0x1000, 4096, 0})...))
	f.Add(u32s(opModifyQP, 0))
	f.Add(u32s(opAllocMW, 0, 1, 1))
	f.Add(append(u32s(opRegMRIOVA, 0), regMRIOVABody(1, 0x1000, 10, 0x5000, 1, extent{0x1000, 4096, 0})...))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := parseRequest(b)
		if err != nil {
			return
		}
		if r.op == 0 || r.op > opLast && (r.op < opCMFirst || r.op > opCMKnownLast) && (r.op < opAllocMW || r.op > opRegMRIOVA) &&
			(r.op < opResizeCQ || r.op > opResizeSRQ) {
			t.Fatalf("accepted op %d", r.op)
		}
		if r.op == opRegMR || r.op == opRegMRIOVA {
			decodeRegMR(r.op, r.body, nil)
		}
		if r.op == opModifyQP {
			decodeQPAttr(r.body[8:])
		}
	})
}

// Whatever a connected client sends, the handler answers without
// panicking and leaves no descriptor behind.
func FuzzHandle(f *testing.F) {
	s := startPipe(f)
	f.Add(u32s(opAllocPD, 0))
	f.Add(append(u32s(opCreateQP, 0), u32s(1, 2, 2, 2, 4, 4, 1, 1, 0, 0)...))
	f.Add(append(u32s(opModifyQP, 0), make([]byte, sizeModifyQP)...))
	f.Add(append(u32s(opRegMR, 0), regMRBody(1, 0x1000, 10, extent{0x1000, 4096, 0})...))
	f.Add(u32s(opAllocMW, 0, 1, 2))
	f.Add(u32s(opDeallocMW, 0, 3, 0))
	f.Add(u32s(opResizeCQ, 0, 2, 100))
	f.Fuzz(func(t *testing.T, b []byte) {
		c := newClient(s, nil)
		c.dev = s.devs[0]
		c.bell = -1
		c.handle(u32s(opAllocPD, 0), nil)
		c.handle(u32s(opCreateCQ, 0, 8, 0), nil)
		for _, fd := range func() []int { _, fds, _ := c.handle(b, nil); return fds }() {
			unix.Close(fd)
		}
		c.dev.mu.Lock()
		for h := range c.qps {
			c.destroyQP(h)
		}
		for h := range c.mrs {
			c.deregMR(h)
		}
		for h := range c.cqs {
			c.destroyCQ(h)
		}
		for h := range c.chans {
			c.destroyChannel(h)
		}
		for h := range c.pds {
			c.deallocPD(h)
		}
		c.dev.mu.Unlock()
	})
}

// regMem registers n bytes of a fresh memfd mapping of the test process
// through the protocol and returns the mapping and the MR's lkey.
func (r *rawClient) regMem(pd uint32, n int) ([]byte, uint32) {
	r.t.Helper()
	fd := memfd(r.t, n, true)
	b, err := unix.Mmap(fd, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { unix.Munmap(b) })
	addr := uint64(uintptr(unsafePointer(b)))
	e, body, _ := r.call(opRegMR, regMRBody(pd, addr, uint64(n), extent{addr, uint64(n), 0}), fd)
	if e != 0 {
		r.t.Fatalf("REG_MR: %v", e)
	}
	return b, le.Uint32(body[4:])
}

// qp creates an RC QP and maps its rings.
func (r *rawClient) qp(pd, cq uint32) []byte {
	b, _ := r.qpH(pd, cq)
	return b
}

func (r *rawClient) qpH(pd, cq uint32) ([]byte, uint32) {
	r.t.Helper()
	e, b, fds := r.call(opCreateQP, u32s(pd, cq, cq, 2, 4, 4, 1, 1, 0, 0))
	if e != 0 || len(fds) != 1 {
		r.t.Fatalf("CREATE_QP: %v", e)
	}
	ring, err := unix.Mmap(fds[0], 0, int(le.Uint64(b[48:])), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	closeAll(fds)
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { unix.Munmap(ring) })
	// To INIT, where receives may be posted.
	a := qpAttrWire{state: 1, port: 1, access: 1}
	m := append(u32s(le.Uint32(b), uint32(1|8|16|32)), a.encode(nil)...)
	if e, _, _ := r.call(opModifyQP, m); e != 0 {
		r.t.Fatalf("MODIFY_QP to INIT: %v", e)
	}
	return ring, le.Uint32(b)
}

// Receive WQEs whose SGE lies outside the client's MR, or names another
// client's MR, move the QP to ERR and are never handed to the transport.
func TestSGEOutsideOwnMemory(t *testing.T) {
	s := startPipe(t)
	other := dial(t, s)
	other.open()
	_, otherKey := other.regMem(other.handle(opAllocPD, nil), 8192)

	h := dial(t, s)
	h.open()
	pd := h.handle(opAllocPD, nil)
	buf, key := h.regMem(pd, 8192)
	cq := h.handle(opCreateCQ, u32s(16, 0))
	base := uint64(uintptr(unsafePointer(buf)))
	for _, c := range []struct {
		name      string
		addr      uint64
		len, lkey uint32
	}{
		{"past the end", base + 8000, 1000, key},
		{"before the start", base - 4096, 100, key},
		{"wrapping", ^uint64(0) - 10, 100, key},
		{"another client's MR", base, 100, otherKey},
		{"no MR", base, 100, key ^ 0xffffff00},
	} {
		ring, qh := h.qpH(pd, cq)
		bad := s.Stats().BadWQEs
		// One receive WQE in slot 0 of the receive ring.
		rqOff := ctlPage + 4096 // sq: 4 slots of 80 bytes, page-rounded
		w := ring[rqOff:]
		le.PutUint64(w, 7)
		le.PutUint32(w[8:], 1)
		le.PutUint64(w[16:], c.addr)
		le.PutUint32(w[24:], c.len)
		le.PutUint32(w[28:], c.lkey)
		store32(ring, offRQProd, 1)
		for s.Stats().BadWQEs == bad {
			unix.Nanosleep(&unix.Timespec{Nsec: 1e6}, nil)
		}
		if load32(ring, offQPError) == 0 {
			t.Errorf("%s: the QP's error flag is not set", c.name)
		}
		if typ, hh := h.event(); typ != evQPFatal || hh != qh {
			t.Errorf("%s: async event %d for handle %d, want QP_FATAL for QP %d", c.name, typ, hh, qh)
		}
	}
	// A good receive on a fresh QP is accepted.
	ring := h.qp(pd, cq)
	bad := s.Stats().BadWQEs
	w := ring[ctlPage+4096:]
	le.PutUint64(w, 8)
	le.PutUint32(w[8:], 1)
	le.PutUint64(w[16:], base+100)
	le.PutUint32(w[24:], 1000)
	le.PutUint32(w[28:], key)
	store32(ring, offRQProd, 1)
	for load32(ring, offRQCons) != 1 {
		unix.Nanosleep(&unix.Timespec{Nsec: 1e6}, nil)
	}
	if s.Stats().BadWQEs != bad || load32(ring, offQPError) != 0 {
		t.Error("a receive inside the client's MR was refused")
	}
}

// resizeCQRing sends RESIZE_CQ and maps the new ring it answers with.
func (r *rawClient) resizeCQRing(cq, cqe uint32) ([]byte, uint32) {
	r.t.Helper()
	e, b, fds := r.call(opResizeCQ, u32s(cq, cqe))
	if e != 0 || len(fds) != 1 || len(b) != sizeCQ {
		closeAll(fds)
		r.t.Fatalf("RESIZE_CQ %d: %v, %d fds", cqe, e, len(fds))
	}
	size := le.Uint32(b[4:])
	n := int(le.Uint64(b[8:]))
	if le.Uint32(b) != cq || size < cqe || size&(size-1) != 0 || n < ctlPage+int(size)*cqeSize {
		r.t.Fatalf("RESIZE_CQ %d: handle %d, %d slots, %d bytes", cqe, le.Uint32(b), size, n)
	}
	ring, err := unix.Mmap(fds[0], 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	closeAll(fds)
	if err != nil {
		r.t.Fatal(err)
	}
	return ring, size
}

// RESIZE_CQ and RESIZE_SRQ take only the client's own objects and sane
// sizes; a resized CQ ring holds what the old one held, at the same
// indices, while the daemon keeps writing completions into it.
func TestHostileResize(t *testing.T) {
	s := startPipe(t)
	a := dial(t, s)
	a.open()
	for range 20 { // a's handles are then none of h's
		a.handle(opAllocPD, nil)
	}
	aPD := a.handle(opAllocPD, nil)
	aCQ := a.handle(opCreateCQ, u32s(8, 0))
	_, aSRQ, _ := a.srq(aPD, 4)
	h := dial(t, s)
	h.open()
	pd := h.handle(opAllocPD, nil)
	e, b, fds := h.call(opCreateCQ, u32s(16, 0))
	if e != 0 || len(fds) != 1 {
		t.Fatalf("CREATE_CQ: %v", e)
	}
	cq := le.Uint32(b)
	cqRing, err := unix.Mmap(fds[0], 0, int(le.Uint64(b[8:])), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	closeAll(fds)
	if err != nil {
		t.Fatal(err)
	}
	srqRing, srq, _ := h.srq(pd, 4)
	for _, c := range []struct {
		name string
		op   uint32
		body []byte
		want syscall.Errno
	}{
		{"RESIZE_CQ of another client's CQ", opResizeCQ, u32s(aCQ, 16), syscall.EINVAL},
		{"RESIZE_CQ of no CQ", opResizeCQ, u32s(cq+1000, 16), syscall.EINVAL},
		{"RESIZE_CQ to 0", opResizeCQ, u32s(cq, 0), syscall.EINVAL},
		{"RESIZE_CQ over max_cqe", opResizeCQ, u32s(cq, maxCQSlots+1), syscall.EINVAL},
		{"RESIZE_CQ to 2^32-1", opResizeCQ, u32s(cq, ^uint32(0)), syscall.EINVAL},
		{"short RESIZE_CQ", opResizeCQ, u32s(cq), syscall.EINVAL},
		{"long RESIZE_CQ", opResizeCQ, u32s(cq, 16, 0), syscall.EINVAL},
		{"RESIZE_SRQ of another client's SRQ", opResizeSRQ, u32s(aSRQ, ibvSRQMaxWR, 8, 0), syscall.EINVAL},
		{"RESIZE_SRQ without IBV_SRQ_MAX_WR", opResizeSRQ, u32s(srq, ibvSRQLimit, 8, 1), syscall.EINVAL},
		{"RESIZE_SRQ unknown mask", opResizeSRQ, u32s(srq, ibvSRQMaxWR|4, 8, 0), syscall.EINVAL},
		{"RESIZE_SRQ to 0", opResizeSRQ, u32s(srq, ibvSRQMaxWR, 0, 0), syscall.EINVAL},
		{"RESIZE_SRQ to 2^32-1", opResizeSRQ, u32s(srq, ibvSRQMaxWR, ^uint32(0), 0), syscall.EINVAL},
		{"RESIZE_SRQ limit over max_wr", opResizeSRQ, u32s(srq, ibvSRQMaxWR|ibvSRQLimit, 8, 9), syscall.EINVAL},
		{"short RESIZE_SRQ", opResizeSRQ, u32s(srq, ibvSRQMaxWR, 8), syscall.EINVAL},
		{"MODIFY_SRQ resize", opModifySRQ, u32s(srq, ibvSRQMaxWR, 8, 0), syscall.EOPNOTSUPP},
	} {
		if e, _, fds := h.call(c.op, c.body); e != c.want || len(fds) != 0 {
			closeAll(fds)
			t.Errorf("%s: %v, want %v", c.name, e, c.want)
		}
	}
	// A consumer index the client ran past the producer's.
	store32(cqRing, offCQCons, 1000)
	if e, _, _ := h.call(opResizeCQ, u32s(cq, 32)); e != syscall.EINVAL {
		t.Errorf("RESIZE_CQ with the consumer index past the producer's: %v, want EINVAL", e)
	}
	store32(cqRing, offCQCons, 0)
	// The SRQ's producer index past its ring: SRQ_ERR, as for a post.
	bad := s.Stats().BadWQEs
	store32(srqRing, offRQProd, 100)
	if e, _, fds := h.call(opResizeSRQ, u32s(srq, ibvSRQMaxWR, 16, 0)); e != 0 || len(fds) != 1 {
		t.Errorf("RESIZE_SRQ after a bad producer index: %v", e)
	} else {
		closeAll(fds)
	}
	if s.Stats().BadWQEs == bad {
		t.Error("the producer index past the SRQ ring was not counted")
	}
	if typ, hh := h.event(); typ != evSRQErr || hh != srq {
		t.Errorf("async event %d for handle %d, want SRQ_ERR for SRQ %d", typ, hh, srq)
	}
	if e, b, _ := h.call(opQuerySRQ, u32s(srq, 0)); e != 0 || le.Uint32(b) != 16 {
		t.Errorf("QUERY_SRQ after RESIZE_SRQ to 16: %v, max_wr %d", e, le.Uint32(b))
	}

	// Receives posted to a QP in ERR flush at once, from the poller,
	// while this goroutine resizes their CQ: each resized ring holds the
	// flushed completions in order, none lost, none twice.
	e, b, fds = h.call(opCreateQP, u32s(pd, cq, cq, ibvQPTRC, 4, 4, 1, 1, 0, 0))
	if e != 0 || len(fds) != 1 {
		t.Fatalf("CREATE_QP: %v", e)
	}
	qp, rqOff := le.Uint32(b), int(le.Uint64(b[64:]))
	rqStride := int(le.Uint32(b[40:]))
	qpRing, err := unix.Mmap(fds[0], 0, int(le.Uint64(b[48:])), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	closeAll(fds)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(qpRing)
	toErr := append(u32s(qp, uint32(attrState)), (&qpAttrWire{state: 6}).encode(nil)...)
	if e, _, _ := h.call(opModifyQP, toErr); e != 0 {
		t.Fatalf("MODIFY_QP to ERR: %v", e)
	}
	size := uint32(16)
	store32(cqRing, offCQArmed, 0)
	var prod, cons uint32
	for i := range 200 {
		for load32(qpRing, offRQCons) != prod {
			unix.Nanosleep(&unix.Timespec{Nsec: 1e5}, nil)
		}
		for range 4 {
			w := qpRing[rqOff+int(prod%4)*rqStride:]
			le.PutUint64(w, uint64(prod))
			le.PutUint32(w[8:], 0)
			prod++
		}
		store32(qpRing, offRQProd, prod)
		ring(h.bell)
		old := cqRing
		store32(old, offCQArmed, armAny)
		var want uint32 = 8 << (i % 3)
		cqRing, size = h.resizeCQRing(cq, want)
		if load32(old, offCQArmed) != 0 || load32(cqRing, offCQArmed) != armAny {
			t.Fatalf("the arm did not move to the new ring")
		}
		store32(cqRing, offCQArmed, 0)
		unix.Munmap(old)
		for cons != prod {
			if load32(cqRing, offCQProd) == cons {
				unix.Nanosleep(&unix.Timespec{Nsec: 1e5}, nil)
				continue
			}
			e := cqRing[ctlPage+int(cons&(size-1))*cqeSize:]
			if id, st := le.Uint64(e), le.Uint32(e[8:]); id != uint64(cons) || st != 5 /* IBV_WC_WR_FLUSH_ERR */ {
				t.Fatalf("completion %d: wr_id %d status %d", cons, id, st)
			}
			cons++
			store32(cqRing, offCQCons, cons)
		}
	}
	if load32(cqRing, offCQOverrun) != 0 {
		t.Error("the resized rings overran")
	}
	unix.Munmap(cqRing)
}
