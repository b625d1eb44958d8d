package serve

import (
	"encoding/binary"
	"math/bits"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/cq"

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
	unix.Write(ch.w, ch.buf[:]) // non-blocking: a full pipe already holds events
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

	sqSize, rqSize     uint32
	sqStride, rqStride uint32
	sqOff, rqOff       int
	sqCons, rqCons     uint32 // the daemon's own copies
	maxSendSGE         int
	maxRecvSGE         int
	maxInline          int
	state              uint32 // as the client last set it
	sendCQ, recvCQ     *cqObj
	typ                verbs.QPType // ud.go
	srq                *srqObj      // srq.go: receives come from it
	errQueued          bool         // under device.rmu: an overrun awaits the poller

	// Reused for every WQE: the data path allocates nothing.
	swr    verbs.SendWR
	sgl    []verbs.SGE
	rwr    verbs.RecvWR
	rsgl   []verbs.SGE
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

// drain moves the WQEs the client posted since the last pass into verbs.
func (q *qpObj) drain() bool {
	b := q.mem.b
	work := false
	prod := load32(b, offRQProd)
	if n := prod - q.rqCons; n > q.rqSize {
		q.bad("receive ring producer index out of range")
		q.rqCons = prod
		store32(b, offRQCons, q.rqCons)
	}
	for q.rqCons != prod {
		slot := b[q.rqOff+int(q.rqCons&(q.rqSize-1))*int(q.rqStride):][:q.rqStride]
		if q.buildRecv(slot) {
			if err := q.qp.PostRecv(&q.rwr); err != nil {
				if isQueueFull(err) {
					q.c.s.queueFull.Add(1)
					break
				}
				q.bad("post recv: " + err.Error())
			}
		}
		q.rqCons++
		work = true
	}
	store32(b, offRQCons, q.rqCons)
	prod = load32(b, offSQProd)
	if n := prod - q.sqCons; n > q.sqSize {
		q.bad("send ring producer index out of range")
		q.sqCons = prod
	}
	for q.sqCons != prod {
		slot := b[q.sqOff+int(q.sqCons&(q.sqSize-1))*int(q.sqStride):][:q.sqStride]
		if q.buildSend(slot) {
			if err := q.post(); err != nil {
				if isQueueFull(err) {
					q.c.s.queueFull.Add(1)
					break
				}
				q.bad("post send: " + err.Error())
			}
		}
		q.sqCons++
		// Published per WQE, not after the loop: an earlier WQE's
		// completion may reach the client's CQ ring (written on the
		// transport's goroutine) while this loop runs, and a client that
		// posts again on it must find the slots already free.
		store32(b, offSQCons, q.sqCons)
		work = true
	}
	store32(b, offSQCons, q.sqCons)
	return work
}

// bad moves the QP to ERR for a WQE or index the daemon refused. The
// WQE is dropped; every other outstanding one completes with
// WR_FLUSH_ERR, as on a RNIC whose QP hit a local error.
func (q *qpObj) bad(why string) {
	q.c.s.badWQE.Add(1)
	store32(q.mem.b, offQPError, 1)
	q.toErr()
	q.c.raise(evQPFatal, q.handle)
	q.c.s.log.Printf("client pid %d QP %d: %s; the QP goes to ERR", q.c.pid, q.qpn, why)
}

func (q *qpObj) toErr() {
	q.qp.Modify(&verbs.QPAttr{State: verbs.StateErr}, attrState)
}

// translate checks an SGE against the client's own MRs and returns it with
// the daemon's address of the same bytes.
func (q *qpObj) translate(s *verbs.SGE) bool { return q.c.translateFor(q.pd, s) }

func (q *qpObj) buildRecv(w []byte) bool {
	n := int(le.Uint32(w[8:]))
	if n > q.maxRecvSGE {
		q.bad("receive WQE with too many SGEs")
		return false
	}
	q.rwr.ID = le.Uint64(w)
	q.rwr.SGL = q.rsgl[:n]
	for i := range n {
		e := w[sizeRecvWQE+i*sizeSGE:]
		s := &q.rwr.SGL[i]
		*s = verbs.SGE{Addr: le.Uint64(e), Length: le.Uint32(e[8:]), LKey: le.Uint32(e[12:])}
		if !q.translate(s) {
			q.bad("receive SGE outside the client's MRs")
			return false
		}
	}
	return true
}

func (q *qpObj) buildSend(w []byte) bool {
	op := le.Uint32(w[8:])
	flags := verbs.SendFlags(le.Uint32(w[12:]))
	n := int(le.Uint32(w[20:]))
	inl := int(le.Uint32(w[24:]))
	if op > 15 || !wr.Opcode(op).Known() {
		q.bad("unknown send opcode")
		return false
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
	if !q.buildUD(w) {
		return false
	}
	if flags&verbs.SendInline != 0 {
		if inl > q.maxInline || sizeSendWQE+inl > len(w) {
			q.bad("inline data over max_inline_data")
			return false
		}
		s.InlineData = q.inline[:copy(q.inline, w[sizeSendWQE:sizeSendWQE+inl])]
		return true
	}
	if n > q.maxSendSGE {
		q.bad("send WQE with too many SGEs")
		return false
	}
	s.SGL = q.sgl[:n]
	for i := range n {
		e := w[sizeSendWQE+i*sizeSGE:]
		g := &s.SGL[i]
		*g = verbs.SGE{Addr: le.Uint64(e), Length: le.Uint32(e[8:]), LKey: le.Uint32(e[12:])}
		if !q.translate(g) {
			q.bad("send SGE outside the client's MRs")
			return false
		}
	}
	return true
}

func binaryBE(b []byte) uint32 { return binary.BigEndian.Uint32(b) }
