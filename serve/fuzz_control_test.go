package serve

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/qpstate"
)

// FuzzControl drives a real connection to an in-process daemon with a
// sequence of requests decoded from the input (see decodeControl) and
// checks what holds whatever a client sends: one well-formed reply per
// request, nothing left behind once it disconnects, and the next client
// served.

// controlOps is every op the daemon serves, with the exact body length it
// needs (-1: REG_MR's, which the extents it announces decide).
var controlOps = func() []struct {
	op   uint32
	size int
} {
	ops := []struct {
		op   uint32
		size int
	}{
		{opHello, sizeHello}, {opOpen, sizeHandle}, {opQueryDevice, 0}, {opQueryPort, sizeHandle},
		{opQueryGID, sizeGIDReq}, {opAllocPD, 0}, {opDeallocPD, sizeHandle}, {opRegMR, -1},
		{opDeregMR, sizeHandle}, {opCreateCQ, sizeCreateCQ}, {opDestroyCQ, sizeHandle},
		{opCreateQP, sizeCreateQP}, {opCreateQP, sizeCreateQP1}, {opModifyQP, sizeModifyQP},
		{opQueryQP, sizeHandle}, {opDestroyQP, sizeHandle}, {opCreateChannel, 0},
		{opDestroyChannel, sizeHandle}, {opStatus, 0},
		{opAllocMW, sizeAllocMW}, {opDeallocMW, sizeHandle}, {opRegMRIOVA, -1},
		{opResizeCQ, resizeBodySize(opResizeCQ)}, {opResizeSRQ, resizeBodySize(opResizeSRQ)},
	}
	for op := uint32(opCreateAH); op <= opDestroySRQ; op++ {
		ops = append(ops, struct {
			op   uint32
			size int
		}{op, udBodySize(op)})
	}
	for op := uint32(opCMFirst); op <= opCMKnownLast; op++ {
		ops = append(ops, struct {
			op   uint32
			size int
		}{op, sizeCMReq})
	}
	// Last, so that the seeds' indices of the ops above stay.
	ops = append(ops, struct {
		op   uint32
		size int
	}{opRdmaView, 8})
	return ops
}()

// Descriptor kinds a request may carry.
const (
	fdNone = iota
	fdSealedMemfd
	fdUnsealedMemfd
	fdPipe
	fdSocket
	fdEventfd
	fdDevNull
	fdDir
)

// controlReq is one decoded request: the message and the descriptors to
// pass with it (nfds of kind fdKind, memfds of fdPages pages).
type controlReq struct {
	msg     []byte
	fdKind  int
	nfds    int
	fdPages int
}

// decodeControl turns fuzz input into requests. Each record is
//
//	sel  ctl  [delta | len16] [extents] [pages] body...
//
// sel < len(controlOps) picks a real op, otherwise sel itself is the op
// code. ctl bits 0-1: the body length: 0 and 1 the op's exact size, 2
// that size plus a signed delta byte, 3 a random 16-bit length (modulo a
// little over maxMsg); bits 2-4: the descriptor kind; bit 5: two
// descriptors instead of one. REG_MR of the exact size reads an extent
// count byte and announces that many extents. A memfd reads its size in
// pages. The body is the next bytes of the input, zeros where it ends.
func decodeControl(b []byte) []controlReq {
	next := func() byte {
		if len(b) == 0 {
			return 0
		}
		v := b[0]
		b = b[1:]
		return v
	}
	var out []controlReq
	for len(b) > 0 && len(out) < 64 {
		sel, ctl := next(), next()
		op, size := uint32(sel), 0
		if int(sel) < len(controlOps) {
			op, size = controlOps[sel].op, controlOps[sel].size
		}
		extents := 0
		if size < 0 {
			extents = int(next())%4 + 1
			size = regMRHeader(op) + extents*sizeExtent
		}
		switch ctl & 3 {
		case 2:
			size += int(int8(next()))
		case 3:
			size = (int(next()) | int(next())<<8) % (maxMsg + 64)
		}
		size = max(size, -sizeReq+1) // at least one byte on the wire
		r := controlReq{fdKind: int(ctl>>2) & 7, nfds: 1 + int(ctl>>5)&1}
		if r.fdKind == fdNone {
			r.nfds = 0
		}
		if r.fdKind == fdSealedMemfd || r.fdKind == fdUnsealedMemfd {
			r.fdPages = int(next())%16 + 1
		}
		msg := u32s(op, 0)
		for range size {
			msg = append(msg, next())
		}
		msg = msg[:sizeReq+size]
		if extents > 0 && ctl&3 < 2 {
			le.PutUint32(msg[sizeReq+24:], uint32(extents))
		}
		r.msg = msg
		out = append(out, r)
	}
	return out
}

// controlFDs opens the descriptors r passes; the caller closes them.
func controlFDs(r controlReq) ([]int, error) {
	var fds []int
	for range r.nfds {
		var fd int
		var err error
		switch r.fdKind {
		case fdSealedMemfd, fdUnsealedMemfd:
			if fd, err = unix.MemfdCreate("fuzz", unix.MFD_ALLOW_SEALING|unix.MFD_CLOEXEC); err == nil {
				err = unix.Ftruncate(fd, int64(r.fdPages*pageSize))
				if err == nil && r.fdKind == fdSealedMemfd {
					_, err = unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK)
				}
			}
		case fdPipe:
			var p [2]int
			if err = unix.Pipe2(p[:], unix.O_CLOEXEC); err == nil {
				unix.Close(p[1])
				fd = p[0]
			}
		case fdSocket:
			var p [2]int
			if p, err = unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0); err == nil {
				unix.Close(p[1])
				fd = p[0]
			}
		case fdEventfd:
			fd, err = unix.Eventfd(0, unix.EFD_CLOEXEC)
		case fdDevNull:
			fd, err = unix.Open("/dev/null", unix.O_RDWR|unix.O_CLOEXEC, 0)
		default:
			fd, err = unix.Open("/", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		}
		if err != nil {
			closeAll(fds)
			return nil, err
		}
		fds = append(fds, fd)
	}
	return fds, nil
}

// countFDs is how many descriptors this process holds.
func countFDs(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// controlReply reads the one reply a request gets and checks its header:
// a known errno, the reserved word zero, descriptors only on success.
func controlReply(c *net.UnixConn) (syscall.Errno, []byte, error) {
	buf := make([]byte, maxMsg+64)
	oob := make([]byte, unix.CmsgSpace(8*4))
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	fds := parseFDs(oob[:oobn])
	closeAll(fds)
	switch {
	case err != nil:
		return 0, nil, fmt.Errorf("no reply: %w", err)
	case flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0:
		return 0, nil, fmt.Errorf("reply of %d bytes truncated (flags 0x%x)", n, flags)
	case n < sizeResp:
		return 0, nil, fmt.Errorf("reply of %d bytes", n)
	}
	e, rsv := syscall.Errno(le.Uint32(buf)), le.Uint32(buf[4:])
	switch {
	case e >= 4096:
		return e, nil, fmt.Errorf("reply errno %d", uint32(e))
	case rsv != 0:
		return e, nil, fmt.Errorf("reply's reserved word is %d", rsv)
	case e != 0 && len(fds) > 0:
		return e, nil, fmt.Errorf("errno %v with %d descriptors", e, len(fds))
	}
	return e, buf[sizeResp:n], nil
}

// runControl sends reqs on a new connection to s, each with its
// descriptors, and checks every reply; it returns how many succeeded.
func runControl(t testing.TB, s *Server, reqs []controlReq) int {
	t.Helper()
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: s.Socket(), Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ok := 0
	for i, r := range reqs {
		fds, err := controlFDs(r)
		if err != nil {
			t.Fatalf("request %d: descriptors: %v", i, err)
		}
		var oob []byte
		if len(fds) > 0 {
			oob = unix.UnixRights(fds...)
		}
		_, _, err = c.WriteMsgUnix(r.msg, oob, nil)
		closeAll(fds)
		if err != nil {
			t.Fatalf("request %d (op %d, %d bytes): send: %v", i, le.Uint32(r.msg), len(r.msg), err)
		}
		e, _, err := controlReply(c)
		if err != nil {
			t.Fatalf("request %d (op %d, %d bytes): %v", i, le.Uint32(r.msg), len(r.msg), err)
		}
		if e == 0 {
			ok++
		}
	}
	// Exactly one reply each: a STATUS now gets its own JSON, not a stray
	// answer to something earlier.
	if _, _, err := c.WriteMsgUnix(u32s(opStatus, 0), nil, nil); err != nil {
		t.Fatalf("STATUS: %v", err)
	}
	e, body, err := controlReply(c)
	if err != nil || e != 0 || !json.Valid(body) {
		t.Fatalf("STATUS after the sequence: errno %v, %v, %q", e, err, body)
	}
	return ok
}

// waitIdle waits until s has no client and no QP, and fails the test
// after 20 s.
func waitIdle(t testing.TB, s *Server) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); s.Stats().Clients != 0 || s.QPs() != 0; {
		if time.Now().After(deadline) {
			t.Fatalf("after disconnect: %d clients, %d QPs", s.Stats().Clients, s.QPs())
		}
		time.Sleep(time.Millisecond)
	}
	if st := s.Status(); len(st.Clients) != 0 {
		t.Fatalf("after disconnect the status shows clients: %+v", st.Clients)
	}
}

// checkServed checks a fresh client gets HELLO, OPEN and QUERY_DEVICE.
func checkServed(t testing.TB, s *Server) {
	t.Helper()
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: s.Socket(), Net: "unixpacket"})
	if err != nil {
		t.Fatalf("the next client cannot connect: %v", err)
	}
	defer c.Close()
	for _, m := range [][]byte{u32s(opHello, 0, protoVersion, 0), u32s(opOpen, 0, 0, 0), u32s(opQueryDevice, 0)} {
		if _, _, err := c.WriteMsgUnix(m, nil, nil); err != nil {
			t.Fatalf("the next client's op %d: %v", le.Uint32(m), err)
		}
		if e, _, err := controlReply(c); err != nil || e != 0 {
			t.Fatalf("the next client's op %d: errno %v, %v", le.Uint32(m), e, err)
		}
	}
}

func FuzzControl(f *testing.F) {
	s := startPipe(f)
	checkServed(f, s) // the daemon's own descriptors exist before counting
	waitIdle(f, s)
	f.Fuzz(func(t *testing.T, b []byte) {
		// A daemon that hangs shows where: every goroutine's stack.
		watchdog := time.AfterFunc(90*time.Second, func() {
			debug.SetTraceback("all")
			panic(fmt.Sprintf("FuzzControl: one input ran for 90 s: %q", b))
		})
		defer watchdog.Stop()
		before := countFDs(t)
		runControl(t, s, decodeControl(b))
		waitIdle(t, s)
		// Descriptors the daemon closes after its reply may still be in
		// the kernel's hands for a moment: wait a little for the count.
		var after int
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
			if after = countFDs(t); after <= before || time.Now().After(deadline) {
				break
			}
		}
		if after > before {
			t.Fatalf("%d descriptors after the client left, %d before", after, before)
		}
		checkServed(t, s)
		waitIdle(t, s)
	})
}

// Seeds: hand-made sequences that reach deep into the daemon. Handles are
// numbered per connection from 1, so a sequence can name what it made.

// seedRec encodes one request of a seed: op at its exact size (REG_MR with
// as many extents as ext), descriptors of kind fd (pages each), body.
func seedRec(op uint32, fd, nfds, pages int, body []byte) []byte {
	sel := -1
	for i, o := range controlOps {
		if o.op == op && (o.size < 0 || o.size == len(body)) {
			sel = i
			break
		}
	}
	if sel < 0 {
		panic(fmt.Sprintf("seed: op %d with a %d-byte body", op, len(body)))
	}
	ctl := byte(fd << 2)
	if nfds == 2 {
		ctl |= 1 << 5
	}
	out := []byte{byte(sel), ctl}
	if controlOps[sel].size < 0 {
		out = append(out, byte(le.Uint32(body[24:])-1))
	}
	if fd == fdSealedMemfd || fd == fdUnsealedMemfd {
		out = append(out, byte(pages-1))
	}
	return append(out, body...)
}

func modifyBody(qp, mask uint32, a qpAttrWire) []byte {
	return append(u32s(qp, mask), a.encode(nil)...)
}

// controlSeeds are the committed corpus, by file name.
func controlSeeds() map[string][]byte {
	const addr = 0x7e0000000000
	const (
		mINIT = uint32(attrState | qpstate.AttrPKeyIndex | qpstate.AttrPort | qpstate.AttrAccessFlags)
		mRTR  = uint32(attrState | qpstate.AttrAV | qpstate.AttrPathMTU | qpstate.AttrDestQPN | qpstate.AttrRQPSN | qpstate.AttrMaxDestRDAtomic | qpstate.AttrMinRNRTimer)
		mRTS  = uint32(attrState | qpstate.AttrTimeout | qpstate.AttrRetryCnt | qpstate.AttrRNRRetry | qpstate.AttrSQPSN | qpstate.AttrMaxQPRDAtomic)
	)
	rtr := qpAttrWire{state: 2, pathMTU: 3, destQPN: 2, rqPSN: 7, maxDestRDAtomic: 1, minRNR: 12, isGlobal: 1, hopLimit: 64}
	rtr.dgid[10], rtr.dgid[11], rtr.dgid[12], rtr.dgid[15] = 0xff, 0xff, 127, 1
	rc := func(extra ...[]byte) []byte {
		b := bytes.Join([][]byte{
			seedRec(opHello, 0, 0, 0, u32s(protoVersion, 0)),
			seedRec(opOpen, 0, 0, 0, u32s(0, 0)),
			seedRec(opQueryDevice, 0, 0, 0, nil),
			seedRec(opQueryPort, 0, 0, 0, u32s(1, 0)),
			seedRec(opAllocPD, 0, 0, 0, nil), // 1
			seedRec(opRegMR, fdSealedMemfd, 1, 2, regMRBody(1, addr+100, 5000, extent{addr, 2 * pageSize, 0})),                                       // 2
			seedRec(opCreateCQ, 0, 0, 0, u32s(16, 0)),                                                                                                // 3
			seedRec(opCreateQP, 0, 0, 0, u32s(1, 3, 3, ibvQPTRC, 4, 4, 1, 1, 0, 0, 0, 0)),                                                            // 4
			seedRec(opModifyQP, 0, 0, 0, modifyBody(4, mINIT, qpAttrWire{state: 1, port: 1, access: 7})),                                             //
			seedRec(opModifyQP, 0, 0, 0, modifyBody(4, mRTR, rtr)),                                                                                   //
			seedRec(opModifyQP, 0, 0, 0, modifyBody(4, mRTS, qpAttrWire{state: 3, sqPSN: 9, timeout: 14, retryCnt: 7, rnrRetry: 7, maxRDAtomic: 1})), //
			seedRec(opQueryQP, 0, 0, 0, u32s(4, 0)),
		}, nil)
		return append(b, bytes.Join(extra, nil)...)
	}
	teardown := [][]byte{
		seedRec(opDestroyQP, 0, 0, 0, u32s(4, 0)),
		seedRec(opDeregMR, 0, 0, 0, u32s(2, 0)),
		seedRec(opDestroyCQ, 0, 0, 0, u32s(3, 0)),
		seedRec(opDeallocPD, 0, 0, 0, u32s(1, 0)),
	}
	return map[string][]byte{
		// The whole life of an RC QP, torn down in order.
		"rc-rts-destroy": rc(teardown...),
		// The same, left for the disconnect to free.
		"rc-rts-disconnect": rc(seedRec(opStatus, 0, 0, 0, nil)),
		// The rdma views beside a live QP: the first page, the next, and
		// one with flags (refused).
		"rdma-view": rc(seedRec(opRdmaView, 0, 0, 0, u32s(0, 0)), seedRec(opRdmaView, 0, 0, 0, u32s(1, 0)), seedRec(opRdmaView, 0, 0, 0, u32s(0, 1))),
		// Memory windows, a CQ on a completion channel, a resize, an SRQ
		// and an AH, then the objects freed in the wrong order.
		"mw-channel-srq": bytes.Join([][]byte{
			seedRec(opOpen, 0, 0, 0, u32s(0, 0)),
			seedRec(opAllocPD, 0, 0, 0, nil), // 1
			seedRec(opRegMRIOVA, fdSealedMemfd, 2, 1, regMRIOVABody(1, addr, 2*pageSize, 0x5000, 0x1f, extent{addr, pageSize, 0}, extent{addr + pageSize, pageSize, 0})), // 2
			seedRec(opAllocMW, 0, 0, 0, u32s(1, 1)),  // 3
			seedRec(opCreateChannel, 0, 0, 0, nil),   // 4
			seedRec(opCreateCQ, 0, 0, 0, u32s(8, 4)), // 5
			seedRec(opResizeCQ, 0, 0, 0, u32s(5, 64)),
			seedRec(opCreateSRQ, 0, 0, 0, u32s(1, 16, 1, 0)),                              // 6
			seedRec(opCreateQP, 0, 0, 0, u32s(1, 5, 5, ibvQPTRC, 4, 4, 1, 1, 0, 0, 6, 0)), // 7
			seedRec(opCreateAH, 0, 0, 0, append(u32s(1, 1, 0, 0, 64, 0, 0, 1), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1)),
			seedRec(opDeallocPD, 0, 0, 0, u32s(1, 0)),
			seedRec(opDestroyChannel, 0, 0, 0, u32s(4, 0)),
			seedRec(opDeregMR, 0, 0, 0, u32s(2, 0)),
			seedRec(opDeallocMW, 0, 0, 0, u32s(3, 0)),
		}, nil),
		// REG_MR with each wrong kind of descriptor.
		"regmr-bad-fds": bytes.Join([][]byte{
			seedRec(opOpen, 0, 0, 0, u32s(0, 0)),
			seedRec(opAllocPD, 0, 0, 0, nil),
			seedRec(opRegMR, fdUnsealedMemfd, 1, 1, regMRBody(1, addr, 100, extent{addr, pageSize, 0})),
			seedRec(opRegMR, fdPipe, 1, 0, regMRBody(1, addr, 100, extent{addr, pageSize, 0})),
			seedRec(opRegMR, fdSocket, 1, 0, regMRBody(1, addr, 100, extent{addr, pageSize, 0})),
			seedRec(opRegMR, fdEventfd, 1, 0, regMRBody(1, addr, 100, extent{addr, pageSize, 0})),
			seedRec(opRegMR, fdDevNull, 1, 0, regMRBody(1, addr, 100, extent{addr, pageSize, 0})),
			seedRec(opRegMR, fdDir, 1, 0, regMRBody(1, addr, 100, extent{addr, pageSize, 0})),
			seedRec(opRegMR, fdSealedMemfd, 2, 1, regMRBody(1, addr, 100, extent{addr, pageSize, 0})),
			seedRec(opAllocPD, fdEventfd, 1, 0, nil),
		}, nil),
		// rdma_cm on the same connection after the device: refused, then a
		// CM channel's ids on a fresh one.
		"cm-ids": bytes.Join([][]byte{
			seedRec(opCMOpen, 0, 0, 0, make([]byte, sizeCMReq)),
			seedRec(opCMCreateID, 0, 0, 0, cmReqBody(0, func(b []byte) { le.PutUint32(b[4:], psTCP) })), // 1
			seedRec(opCMCreateID, 0, 0, 0, cmReqBody(0, func(b []byte) { le.PutUint32(b[4:], psTCP) })), // 2
			seedRec(opCMBind, 0, 0, 0, cmReqBody(1, func(b []byte) { putSockaddr(b[40:], netip.MustParseAddrPort("0.0.0.0:7499")) })),
			seedRec(opCMQuery, 0, 0, 0, cmReqBody(1, nil)),
			seedRec(opCMGetEvent, 0, 0, 0, cmReqBody(0, nil)),
			seedRec(opCMListen, 0, 0, 0, cmReqBody(1, nil)),
			seedRec(opCMDestroyID, 0, 0, 0, cmReqBody(2, nil)),
			seedRec(opOpen, 0, 0, 0, u32s(0, 0)),
		}, nil),
	}
}

// The committed seeds are what controlSeeds makes (SOFTROCE_WRITE_SEEDS=1
// rewrites them), and each runs through the checks of FuzzControl; the
// deep ones succeed request after request, so the fuzzer starts from a
// QP in RTS rather than from refusals.
func TestControlSeeds(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzControl")
	seeds := controlSeeds()
	if os.Getenv("SOFTROCE_WRITE_SEEDS") == "1" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, b := range seeds {
			if err := os.WriteFile(filepath.Join(dir, name), fmt.Appendf(nil, "go test fuzz v1\n[]byte(%s)\n", strconv.Quote(string(b))), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	s := startPipe(t)
	wantOK := map[string]int{"rc-rts-destroy": 16, "rc-rts-disconnect": 13, "mw-channel-srq": 12, "regmr-bad-fds": 2, "cm-ids": 7, "rdma-view": 14}
	for name, b := range seeds {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Errorf("seed %s: %v (SOFTROCE_WRITE_SEEDS=1 writes the seeds)", name, err)
			continue
		}
		if want := fmt.Appendf(nil, "go test fuzz v1\n[]byte(%s)\n", strconv.Quote(string(b))); !bytes.Equal(got, want) {
			t.Errorf("seed %s differs from controlSeeds (SOFTROCE_WRITE_SEEDS=1 rewrites it)", name)
		}
		ok := runControl(t, s, decodeControl(b))
		waitIdle(t, s)
		t.Logf("seed %s: %d of %d requests succeeded", name, ok, len(decodeControl(b)))
		if w, deep := wantOK[name]; deep && ok != w {
			t.Errorf("seed %s: %d of its requests succeeded, want %d", name, ok, w)
		}
	}
}
