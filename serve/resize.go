package serve

import (
	"fmt"
	"syscall"

	"github.com/softroce/softroce/verbs"
)

// Resizing a CQ (ibv_resize_cq) and an SRQ (ibv_modify_srq with
// IBV_SRQ_MAX_WR). Both sides map a ring with the size it was created
// with, so a resize is a new ring: the daemon makes a new memfd, copies
// the entries the old one holds into it at the same free-running indices
// (the library's own indices stay valid) and sends it back; the library
// maps it and drops the old one. A CQ is migrated under rmu, so route
// (which writes completions from the transport's goroutine) sees either
// ring whole; an SRQ under mu, which the poller holds to drain rings.

// Operation codes: 90..99.
const (
	opResizeCQ   = 90 // req sr_resize_cq; resp sr_cq_resp + the new ring memfd
	opResizeSRQ  = 91 // req sr_modify_srq (mask has IBV_SRQ_MAX_WR); resp sr_srq_resp + the new ring memfd
	sizeResizeCQ = 8
)

// resizeBodySize is the exact body length of the ops of this file.
func resizeBodySize(op uint32) int {
	if op == opResizeCQ {
		return sizeResizeCQ
	}
	return sizeModifySRQ
}

// resizeCQ gives CQ h a ring of cqe slots or more (a power of two). As
// rxe, it refuses fewer than the completions the CQ holds; they are kept
// in order, as are the armed and overrun flags. d.mu is held.
func (c *client) resizeCQ(h, cqe uint32) ([]byte, []int, error) {
	o := c.cqs[h]
	switch {
	case o == nil:
		return nil, nil, fmt.Errorf("%w: no CQ %d", syscall.EINVAL, h)
	case cqe == 0 || cqe > maxCQSlots:
		return nil, nil, fmt.Errorf("%w: cqe %d", syscall.EINVAL, cqe)
	}
	size := ceilPow2(cqe)
	grow := max(int(size)-int(o.size), 0) // taken now; a shrink gives back at the end
	if err := c.chargeCQSlots(grow); err != nil {
		return nil, nil, err
	}
	m, err := c.newRing("softroce-cq", ctlPage+int(size)*cqeSize)
	if err != nil {
		c.chargeCQSlots(-grow)
		return nil, nil, err
	}
	d := c.dev
	d.rmu.Lock()
	old := o.mem.b
	cons := load32(old, offCQCons)
	held := o.prod - cons
	if held > o.size || held > cqe {
		d.rmu.Unlock()
		c.freeRing(m)
		c.chargeCQSlots(-grow)
		if held > o.size {
			return nil, nil, fmt.Errorf("%w: CQ %d consumer index out of range", syscall.EINVAL, h)
		}
		return nil, nil, fmt.Errorf("%w: CQ %d holds %d completions, more than cqe %d", syscall.EINVAL, h, held, cqe)
	}
	for i := cons; i != o.prod; i++ {
		copy(m.b[ctlPage+int(i&(size-1))*cqeSize:][:cqeSize], old[ctlPage+int(i&(o.size-1))*cqeSize:][:cqeSize])
	}
	store32(m.b, offCQCons, cons)
	store32(m.b, offCQOverrun, load32(old, offCQOverrun))
	// The arm moves to the new ring; the old one is left unarmed so that
	// the library sees there an arm made after this copy only.
	for {
		a := load32(old, offCQArmed)
		if cas32(old, offCQArmed, a, 0) {
			store32(m.b, offCQArmed, a)
			break
		}
	}
	store32(m.b, offCQProd, o.prod)
	prev := o.mem
	oldSize := o.size
	o.mem, o.size = m, size
	d.rmu.Unlock()
	c.freeRing(prev)
	c.chargeCQSlots(int(size) - int(oldSize) - grow)
	fd := m.fd
	m.fd = -1 // sent, then closed by run
	out := le.AppendUint32(nil, h)
	out = le.AppendUint32(out, size)
	out = le.AppendUint64(out, uint64(len(m.b)))
	return out, []int{fd}, nil
}

// resizeSRQ gives SRQ h a ring and a verbs SRQ of max_wr WQEs or more (a
// power of two), and arms its limit too when mask says so, all or
// nothing. The posted WQEs are kept in order; as rxe, a size below the
// WQEs posted or below the armed limit is refused. d.mu is held.
func (c *client) resizeSRQ(h, mask, maxWR, limit uint32) ([]byte, []int, error) {
	o := c.srqs[h]
	switch {
	case o == nil:
		return nil, nil, fmt.Errorf("%w: no SRQ %d", syscall.EINVAL, h)
	case mask&^(ibvSRQMaxWR|ibvSRQLimit) != 0 || mask&ibvSRQMaxWR == 0:
		return nil, nil, fmt.Errorf("%w: SRQ attribute mask 0x%x", syscall.EINVAL, mask)
	case maxWR == 0 || maxWR > verbs.MaxSRQWR || maxWR > maxRingWR:
		return nil, nil, fmt.Errorf("%w: SRQ max_wr %d", syscall.EINVAL, maxWR)
	case mask&ibvSRQLimit != 0 && limit > maxWR:
		return nil, nil, fmt.Errorf("%w: srq_limit %d above max_wr %d", syscall.EINVAL, limit, maxWR)
	}
	size := ceilPow2(maxWR)
	if int(size) > int(o.rq.size) {
		if err := c.reserveSlots(int(size) - int(o.rq.size)); err != nil {
			return nil, nil, err
		}
	}
	// What the ring holds moves into the verbs SRQ first, as far as it
	// fits: the verbs SRQ then counts the posted WQEs the resize checks.
	r, b := &o.rq, o.mem.b
	r.drain(b)
	prod := load32(b, r.prodAt)
	pending := prod - r.cons
	if r.held {
		pending++ // taken, not yet in the verbs SRQ
	}
	if pending > size {
		return nil, nil, fmt.Errorf("%w: SRQ %d holds %d WQEs not taken, more than max_wr %d", syscall.EINVAL, h, pending, maxWR)
	}
	total := ctlPage + int(size*r.stride+pageSize-1)&^(pageSize-1)
	m, err := c.newRing("softroce-srq", total)
	if err != nil {
		return nil, nil, err
	}
	vm := verbs.SRQMaxWR
	if mask&ibvSRQLimit != 0 {
		vm |= verbs.SRQLimit
	}
	if err := o.srq.Modify(verbs.SRQAttr{MaxWR: int(size), Limit: int(limit)}, vm); err != nil {
		c.freeRing(m)
		return nil, nil, fmt.Errorf("%w: %v", syscall.EINVAL, err)
	}
	for i := r.cons; i != prod; i++ {
		copy(m.b[r.off+int(i&(size-1))*int(r.stride):][:r.stride], b[r.off+int(i&(r.size-1))*int(r.stride):][:r.stride])
	}
	store32(m.b, r.consAt, r.cons)
	store32(m.b, r.prodAt, prod)
	store32(m.b, offSleeping, load32(b, offSleeping))
	store32(m.b, offQPError, load32(b, offQPError))
	c.takeSlots(int(size) - int(r.size))
	c.freeRing(o.mem)
	o.mem, r.size = m, size
	fd := m.fd
	m.fd = -1
	out := make([]byte, 0, sizeSRQResp)
	for _, v := range []uint32{h, o.srq.Num(), size, uint32(len(o.recv.sgl)), size, r.stride} {
		out = le.AppendUint32(out, v)
	}
	out = le.AppendUint64(out, uint64(total))
	out = le.AppendUint64(out, ctlPage)
	return out, []int{fd}, nil
}
