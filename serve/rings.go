package serve

import (
	"encoding/binary"
	"fmt"
	"math/bits"

	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/internal/rawsys"
	"github.com/softroce/softroce/verbs"
	"github.com/softroce/softroce/wr"
)

// cqObj is a client CQ: a ring of struct ibv_wc slots in shared memory.
// The producer state (prod, overran) is written by device.route under
// device.rmu.
type cqObj struct {
	handle  uint32
	mem     *shm
	size    uint32 // slots, a power of two
	prod    uint32 // the daemon's own copy: the shared one is never read back
	ch      *chanObj
	nQP     int  // QP work queues using it
	overran bool // its CQ_ERR event was raised
}

// push writes one completion; false when the ring is full (the client has
// not consumed enough), which is an overrun.
func (c *cqObj) push(wc *verbs.WC) bool {
	b := c.mem.b
	if load32(b, offCQOverrun) != 0 {
		return false
	}
	cons := load32(b, offCQCons)
	if c.prod-cons >= c.size {
		store32(b, offCQOverrun, 1)
		return false
	}
	e := b[ctlPage+int(c.prod&(c.size-1))*cqeSize:][:cqeSize]
	le.PutUint64(e[0:], wc.WRID)
	le.PutUint32(e[8:], uint32(wc.Status))
	le.PutUint32(e[12:], uint32(wc.Opcode))
	le.PutUint32(e[16:], wc.VendorErr)
	le.PutUint32(e[20:], wc.ByteLen)
	switch {
	case wc.Flags&cq.FlagWithInv != 0:
		le.PutUint32(e[24:], wc.InvalidatedRKey)
	default:
		// imm_data is a __be32: the wire's bytes, in order.
		binary.BigEndian.PutUint32(e[24:], wc.ImmData)
	}
	le.PutUint32(e[28:], wc.QPNum)
	le.PutUint32(e[32:], wc.SrcQP)
	le.PutUint32(e[36:], uint32(wc.Flags))
	le.PutUint16(e[40:], 0) // pkey_index
	le.PutUint16(e[42:], wc.SLID)
	e[44] = wc.SL
	e[45] = wc.DLIDPathBits
	c.prod++
	store32(b, offCQProd, c.prod)
	// An armed CQ fires once; the library re-arms it.
	if a := load32(b, offCQArmed); a != 0 && c.ch != nil && cas32(b, offCQArmed, a, 0) {
		c.ch.fire(c.handle)
	}
	return true
}

// chanObj is a completion channel: the write end of a pipe whose read end
// the client holds.
type chanObj struct {
	handle uint32
	w      int
	nCQ    int
	buf    [4]byte
}

func (ch *chanObj) fire(cq uint32) {
	le.PutUint32(ch.buf[:], cq)
	rawsys.Write(ch.w, ch.buf[:]) // non-blocking: a full pipe already holds events
}

// qpObj is a client QP: its verbs QP and its rings.
type qpObj struct {
	handle uint32
	c      *client
	pd     uint32
	qp     *verbs.QP
	qpn    uint32
	token  uint64 // ATTACH_QP's proof of ownership (newQPToken)
	mem    *shm

	sq, rq         wqeRing
	maxInline      int
	state          uint32 // as the client last set it
	sendCQ, recvCQ *cqObj
	typ            verbs.QPType // ud.go
	srq            *srqObj      // srq.go: receives come from it
	errQueued      bool         // under device.rmu: an overrun awaits the poller

	// Reused for every WQE: the data path allocates nothing.
	swr    verbs.SendWR
	sgl    []verbs.SGE
	recv   recvWQE
	inline []byte

	bindMW   *mwObj // the type 1 window of an ibv_bind_mw WQE (mw.go)
	bindInfo verbs.MWBindInfo
}

func ceilPow2(n uint32) uint32 {
	if n <= 1 {
		return 1
	}
	return 1 << (32 - bits.LeadingZeros32(n-1))
}

// qpSend and qpRecv are a QP as the kind of its send and of its receive
// ring.
type (
	qpSend qpObj
	qpRecv qpObj
)

func (k *qpSend) build(w []byte) string       { return (*qpObj)(k).buildSend(w) }
func (k *qpSend) post() error                 { return (*qpObj)(k).post() }
func (k *qpSend) fail(r *wqeRing, why string) { (*qpObj)(k).fail(r, why) }
func (k *qpRecv) build(w []byte) string       { return k.recv.read(k.c, k.pd, w) }
func (k *qpRecv) post() error                 { return k.qp.PostRecv(&k.recv.wr) }
func (k *qpRecv) fail(r *wqeRing, why string) { (*qpObj)(k).fail(r, why) }

// initRings lays out the QP's rings in its memfd.
func (q *qpObj) initRings(sqSize, sqStride uint32, sqOff int, rqSize, rqStride uint32, rqOff int) {
	q.sq = wqeRing{kind: (*qpSend)(q), c: q.c, name: "send ring", off: sqOff, size: sqSize, stride: sqStride, prodAt: offSQProd, consAt: offSQCons}
	q.rq = wqeRing{kind: (*qpRecv)(q), c: q.c, name: "receive ring", off: rqOff, size: rqSize, stride: rqStride, prodAt: offRQProd, consAt: offRQCons}
}

// drain moves the WQEs the client posted since the last pass into verbs:
// receives first, so that a send answered at once finds them.
func (q *qpObj) drain() bool {
	work := q.rq.drain(q.mem.b)
	return q.sq.drain(q.mem.b) || work
}

// fail moves the QP to ERR for a WQE or index the daemon refused. The
// WQE is dropped; every other outstanding one completes with
// WR_FLUSH_ERR, as on a RNIC whose QP hit a local error.
func (q *qpObj) fail(r *wqeRing, why string) {
	q.toErr()
	q.c.raise(evQPFatal, q.handle)
	q.c.logRefusal(fmt.Sprintf("QP %d %s: %s; the QP goes to ERR", q.qpn, r.name, why))
}

func (q *qpObj) toErr() {
	q.qp.Modify(&verbs.QPAttr{State: verbs.StateErr}, attrState)
}

// buildSend reads a send WQE into q.swr (a BIND_MW one into q.bindMW and
// q.bindInfo too); a WQE the daemon refuses returns why.
func (q *qpObj) buildSend(w []byte) string {
	op := le.Uint32(w[8:])
	flags := verbs.SendFlags(le.Uint32(w[12:]))
	n := le.Uint32(w[20:])
	inl := le.Uint32(w[24:])
	if op > 15 || !wr.Opcode(op).Known() {
		return "unknown send opcode"
	}
	s := &q.swr
	s.ID = le.Uint64(w)
	s.Opcode = wr.Opcode(op)
	s.Flags = flags & (verbs.SendFence | verbs.SendSignaled | verbs.SendSolicited | verbs.SendInline)
	s.Imm = binaryBE(w[16:20])
	s.RKey = le.Uint32(w[28:])
	s.RemoteAddr = le.Uint64(w[32:])
	s.CompareAdd = le.Uint64(w[40:])
	s.Swap = le.Uint64(w[48:])
	s.InvRKey = le.Uint32(w[56:])
	s.InlineData = nil
	s.SGL = q.sgl[:0]
	q.bindMW = nil
	if s.Opcode == wr.BindMW {
		return q.buildBind(w) // mw.go
	}
	if why := q.buildUD(w); why != "" {
		return why
	}
	if flags&verbs.SendInline != 0 {
		if inl > uint32(q.maxInline) || sizeSendWQE+int(inl) > len(w) {
			return "inline data over max_inline_data"
		}
		s.InlineData = q.inline[:copy(q.inline, w[sizeSendWQE:sizeSendWQE+int(inl)])]
		return ""
	}
	var why string
	s.SGL, why = q.c.readSGEs(q.pd, w[sizeSendWQE:], n, q.sgl)
	return why
}

func binaryBE(b []byte) uint32 { return binary.BigEndian.Uint32(b) }

// wqeRing is the daemon's side of a ring of WQEs that a client writes in
// shared memory with no system call: a QP's send or receive ring, or an
// SRQ's. The client fills slots, then stores its producer index; the daemon
// takes the slots in order and publishes its consumer index. Everything in
// the ring is the client's to change at any time: a producer index more
// than the ring's size ahead, or a WQE its kind refuses, is counted, sets
// the ring's error flag and goes to its owner (the QP to ERR, the SRQ to
// SRQ_ERR); a slot is read only within its stride, each field once.
type wqeRing struct {
	kind   wqeKind
	c      *client
	name   string // the ring in the log: "send ring", "receive ring", "SRQ"
	off    int    // slot 0's offset in the memfd
	size   uint32 // slots, a power of two
	stride uint32
	cons   uint32 // the daemon's own copy: the shared one is never read back
	// held is a WQE already taken (its slot published free) that verbs
	// refused as full: it goes to verbs before any other.
	held bool
	// The indices' offsets in the control page.
	prodAt, consAt int
}

// wqeKind is what one kind of ring does with its WQEs. It reads each into
// one work request it reuses: draining allocates nothing.
type wqeKind interface {
	// build reads slot w (stride bytes) into the work request; a WQE the
	// daemon refuses returns why.
	build(w []byte) string
	// post hands the work request build read to verbs.
	post() error
	// fail answers a refused WQE or index of ring r, once r counted it and
	// set the error flag.
	fail(r *wqeRing, why string)
}

// pending reports whether the client posted WQEs the daemon has not taken.
func (r *wqeRing) pending(b []byte) bool { return load32(b, r.prodAt) != r.cons }

// drain moves the WQEs the client posted since the last pass into verbs,
// b being the memfd holding the ring. A full verbs queue leaves the rest
// for the next pass.
//
// A WQE's slot is published free (the consumer index) once build has
// copied the WQE out, before it goes to verbs: its completion may reach
// the client's CQ ring (written on the transport's goroutine) before post
// returns, and a client that keeps its ring exactly full (perftest keeps
// -t sends and -r receives posted) posts again on that completion and
// must find the slot free, as on hardware, where a completed WQE's slot
// is free.
func (r *wqeRing) drain(b []byte) bool {
	prod := load32(b, r.prodAt)
	if prod-r.cons > r.size {
		r.refuse(b, "producer index out of range")
		r.cons = prod
		store32(b, r.consAt, r.cons)
		return true
	}
	work := false
	if r.held {
		if !r.post(b) {
			return false
		}
		work = true
	}
	for r.cons != prod {
		w := b[r.off+int(r.cons&(r.size-1))*int(r.stride):][:r.stride]
		why := r.kind.build(w)
		r.cons++
		store32(b, r.consAt, r.cons)
		work = true
		if why != "" {
			r.refuse(b, why)
			continue
		}
		if !r.post(b) {
			break
		}
	}
	return work
}

// post hands the WQE build read to verbs; a full verbs queue holds it for
// the next pass (false).
func (r *wqeRing) post(b []byte) bool {
	err := r.kind.post()
	switch {
	case err == nil:
	case isQueueFull(err):
		r.c.s.queueFull.Add(1)
		r.held = true
		return false
	default:
		r.refuse(b, "post: "+err.Error())
	}
	r.held = false
	return true
}

// refuse drops a WQE or index the daemon refused: counted, the error flag
// the library reads set, and the owner told.
func (r *wqeRing) refuse(b []byte, why string) {
	r.c.s.badWQE.Add(1)
	store32(b, offQPError, 1)
	r.kind.fail(r, why)
}

// readSGEs reads n SGEs at w into sgl, each checked against the client's
// MRs of PD pd and given the daemon's address of the same bytes. More than
// sgl holds, or than the slot holds, is refused.
func (c *client) readSGEs(pd uint32, w []byte, n uint32, sgl []verbs.SGE) ([]verbs.SGE, string) {
	if n > uint32(len(sgl)) || int(n)*sizeSGE > len(w) {
		return nil, "WQE with too many SGEs"
	}
	sgl = sgl[:n]
	for i := range sgl {
		e := w[i*sizeSGE:]
		s := &sgl[i]
		*s = verbs.SGE{Addr: le.Uint64(e), Length: le.Uint32(e[8:]), LKey: le.Uint32(e[12:])}
		if !c.translateFor(pd, s) {
			return nil, "SGE outside the client's MRs"
		}
	}
	return sgl, ""
}

// recvWQE is the reused work request of a receive ring, a QP's or an SRQ's.
type recvWQE struct {
	wr  verbs.RecvWR
	sgl []verbs.SGE // max_sge of them
}

func (r *recvWQE) read(c *client, pd uint32, w []byte) (why string) {
	r.wr.ID = le.Uint64(w)
	r.wr.SGL, why = c.readSGEs(pd, w[sizeRecvWQE:], le.Uint32(w[8:]), r.sgl)
	return why
}
