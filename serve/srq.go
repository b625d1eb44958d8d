package serve

import (
	"fmt"
	"syscall"

	"github.com/softroce/softroce/verbs"
)

// srqObj is a client's shared receive queue: a ring of receive WQEs in
// shared memory (ibv_post_srq_recv writes it with no system call) that the
// poller drains into the verbs SRQ, checking each SGE against the
// client's MRs of the SRQ's PD.
type srqObj struct {
	handle  uint32
	c       *client
	pd      uint32
	srq     *verbs.SRQ
	mem     *shm
	size    uint32 // ring slots, a power of two
	stride  uint32
	cons    uint32 // the daemon's own copy
	maxSGE  int
	nQP     int
	errored bool // its SRQ_ERR event was raised

	rwr  verbs.RecvWR // reused: the data path allocates nothing
	rsgl []verbs.SGE
}

const evSRQErr = 14 // IBV_EVENT_SRQ_ERR

func (c *client) createSRQ(pdH, maxWR, maxSGE, limit uint32) ([]byte, []int, error) {
	p := c.pds[pdH]
	d := c.dev
	switch {
	case p == nil:
		return nil, nil, fmt.Errorf("%w: no PD %d", syscall.EINVAL, pdH)
	case maxWR == 0 || maxWR > verbs.MaxSRQWR || maxWR > maxRingWR || maxSGE > verbs.MaxSRQSGE || limit > maxWR:
		return nil, nil, fmt.Errorf("%w: SRQ max_wr %d, max_sge %d, limit %d", syscall.EINVAL, maxWR, maxSGE, limit)
	case len(c.srqs) >= c.lim().SRQsPerConn:
		return nil, nil, c.limited(c.s.led.count(syscall.ENOMEM, limSRQs, c.lim().SRQsPerConn))
	}
	maxSGE = max(maxSGE, 1)
	size := ceilPow2(maxWR)
	if err := c.reserveSlots(int(size)); err != nil {
		return nil, nil, err
	}
	stride := uint32(sizeRecvWQE + int(maxSGE)*sizeSGE)
	total := ctlPage + int(size*stride+pageSize-1)&^(pageSize-1)
	m, err := c.newRing("softroce-srq", total)
	if err != nil {
		return nil, nil, err
	}
	s, err := p.pd.CreateSRQ(verbs.SRQInitAttr{MaxWR: int(size), MaxSGE: int(maxSGE), Limit: int(limit)})
	if err != nil {
		c.freeRing(m)
		return nil, nil, fmt.Errorf("%w: %v", syscall.EINVAL, err)
	}
	h := c.handleID()
	o := &srqObj{handle: h, c: c, pd: pdH, srq: s, mem: m, size: size, stride: stride, maxSGE: int(maxSGE),
		rsgl: make([]verbs.SGE, maxSGE)}
	store32(m.b, offSleeping, 1) // born while the poller may sleep: ring
	c.srqs[h] = o
	d.srqs = append(d.srqs, o)
	d.bySRQ[s] = o
	c.takeSlots(int(size))
	p.uses++
	fd := m.fd
	m.fd = -1
	out := make([]byte, 0, sizeSRQResp)
	for _, v := range []uint32{h, s.Num(), size, maxSGE, size, stride} {
		out = le.AppendUint32(out, v)
	}
	out = le.AppendUint64(out, uint64(total))
	out = le.AppendUint64(out, ctlPage)
	return out, []int{fd}, nil
}

func (c *client) modifySRQ(h, mask, maxWR, limit uint32) error {
	o := c.srqs[h]
	switch {
	case o == nil:
		return fmt.Errorf("%w: no SRQ %d", syscall.EINVAL, h)
	case mask&^(ibvSRQMaxWR|ibvSRQLimit) != 0:
		return fmt.Errorf("%w: SRQ attribute mask 0x%x", syscall.EINVAL, mask)
	case mask&ibvSRQMaxWR != 0 && maxWR != o.size:
		// This op sends no new ring back: RESIZE_SRQ (resize.go) does.
		return fmt.Errorf("%w: resizing an SRQ takes RESIZE_SRQ", syscall.EOPNOTSUPP)
	case mask&ibvSRQLimit != 0 && limit > o.size:
		return fmt.Errorf("%w: srq_limit %d above max_wr %d", syscall.EINVAL, limit, o.size)
	}
	if mask&ibvSRQLimit != 0 {
		if err := o.srq.Modify(verbs.SRQAttr{Limit: int(limit)}, verbs.SRQLimit); err != nil {
			return fmt.Errorf("%w: %v", syscall.EINVAL, err)
		}
	}
	return nil
}

func (c *client) querySRQ(h uint32) ([]byte, error) {
	o := c.srqs[h]
	if o == nil {
		return nil, fmt.Errorf("%w: no SRQ %d", syscall.EINVAL, h)
	}
	a := o.srq.Query()
	out := make([]byte, 0, sizeSRQAttr)
	for _, v := range []uint32{o.size, uint32(a.MaxSGE), uint32(a.Limit), 0} {
		out = le.AppendUint32(out, v)
	}
	return out, nil
}

func (c *client) destroySRQ(h uint32) error {
	o := c.srqs[h]
	if o == nil {
		return fmt.Errorf("%w: no SRQ %d", syscall.EINVAL, h)
	}
	if o.nQP > 0 {
		return fmt.Errorf("%w: SRQ %d in use", syscall.EBUSY, h)
	}
	if err := o.srq.Destroy(); err != nil {
		return fmt.Errorf("%w: %v", syscall.EBUSY, err)
	}
	d := c.dev
	for i, x := range d.srqs {
		if x == o {
			d.srqs = append(d.srqs[:i], d.srqs[i+1:]...)
			break
		}
	}
	delete(d.bySRQ, o.srq)
	c.takeSlots(-int(o.size))
	c.freeRing(o.mem)
	delete(c.srqs, h)
	c.pds[o.pd].uses--
	return nil
}

// srqFor resolves the SRQ a CREATE_QP names (0: none) for a QP of PD pd.
func (c *client) srqFor(h, pd uint32) (*srqObj, error) {
	if h == 0 {
		return nil, nil
	}
	o := c.srqs[h]
	if o == nil || o.pd != pd {
		return nil, fmt.Errorf("%w: no SRQ %d of PD %d", syscall.EINVAL, h, pd)
	}
	return o, nil
}

// drain moves the receive WQEs the client posted since the last pass into
// the verbs SRQ; d.mu is held.
func (o *srqObj) drain() bool {
	b := o.mem.b
	work := false
	prod := load32(b, offRQProd)
	if n := prod - o.cons; n > o.size {
		o.bad("SRQ producer index out of range")
		o.cons = prod
		store32(b, offRQCons, o.cons)
		return true
	}
	for o.cons != prod {
		slot := b[ctlPage+int(o.cons&(o.size-1))*int(o.stride):][:o.stride]
		if o.build(slot) {
			if err := o.srq.PostRecv(&o.rwr); err != nil {
				if isQueueFull(err) {
					o.c.s.queueFull.Add(1)
					break
				}
				o.bad("post SRQ recv: " + err.Error())
			}
		}
		o.cons++
		work = true
	}
	store32(b, offRQCons, o.cons)
	return work
}

func (o *srqObj) build(w []byte) bool {
	n := int(le.Uint32(w[8:]))
	if n > o.maxSGE {
		o.bad("SRQ WQE with too many SGEs")
		return false
	}
	o.rwr.ID = le.Uint64(w)
	o.rwr.SGL = o.rsgl[:n]
	for i := range n {
		e := w[sizeRecvWQE+i*sizeSGE:]
		s := &o.rwr.SGL[i]
		*s = verbs.SGE{Addr: le.Uint64(e), Length: le.Uint32(e[8:]), LKey: le.Uint32(e[12:])}
		if !o.c.translateFor(o.pd, s) {
			o.bad("SRQ SGE outside the client's MRs")
			return false
		}
	}
	return true
}

// bad drops a WQE the daemon refused: the SRQ's error flag is set and
// SRQ_ERR raised once. The QPs on it keep their state.
func (o *srqObj) bad(why string) {
	o.c.s.badWQE.Add(1)
	store32(o.mem.b, offQPError, 1)
	if !o.errored {
		o.errored = true
		o.c.raise(evSRQErr, o.handle)
	}
	_ = why
}

// translateFor checks an SGE against the client's MRs of PD pd and
// returns it with the daemon's address of the same bytes.
func (c *client) translateFor(pd uint32, s *verbs.SGE) bool {
	if s.Length == 0 {
		return true
	}
	m := c.mrByKey[s.LKey]
	if m == nil || m.pd != pd {
		return false
	}
	end := s.Addr + uint64(s.Length)
	if end < s.Addr || s.Addr < m.addr || end > m.addr+m.length {
		return false
	}
	s.Addr = s.Addr - m.addr + m.daddr
	return true
}

// srqEvent forwards a verbs SRQ's limit event to the client owning it.
func (d *device) srqEvent(s *verbs.SRQ) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if o := d.bySRQ[s]; o != nil {
		o.c.raise(evSRQLimit, o.handle)
	}
}
