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
	rq      wqeRing
	nQP     int
	errored bool // its SRQ_ERR event was raised

	recv recvWQE // reused: the data path allocates nothing
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
	o := &srqObj{handle: h, c: c, pd: pdH, srq: s, mem: m, recv: recvWQE{sgl: make([]verbs.SGE, maxSGE)}}
	o.rq = wqeRing{kind: o, c: c, name: "SRQ", off: ctlPage, size: size, stride: stride, prodAt: offRQProd, consAt: offRQCons}
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
	case mask&ibvSRQMaxWR != 0 && maxWR != o.rq.size:
		// This op sends no new ring back: RESIZE_SRQ (resize.go) does.
		return fmt.Errorf("%w: resizing an SRQ takes RESIZE_SRQ", syscall.EOPNOTSUPP)
	case mask&ibvSRQLimit != 0 && limit > o.rq.size:
		return fmt.Errorf("%w: srq_limit %d above max_wr %d", syscall.EINVAL, limit, o.rq.size)
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
	for _, v := range []uint32{o.rq.size, uint32(a.MaxSGE), uint32(a.Limit), 0} {
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
	c.takeSlots(-int(o.rq.size))
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

// build, post and fail make the SRQ the kind of its ring (wqeRing),
// drained into the verbs SRQ with d.mu held.
func (o *srqObj) build(w []byte) string { return o.recv.read(o.c, o.pd, w) }
func (o *srqObj) post() error           { return o.srq.PostRecv(&o.recv.wr) }

// fail raises SRQ_ERR once for a WQE or index the daemon refused. The QPs
// on the SRQ keep their state.
func (o *srqObj) fail(_ *wqeRing, why string) {
	if !o.errored {
		o.errored = true
		o.c.raise(evSRQErr, o.handle)
	}
	o.c.logRefusal(fmt.Sprintf("SRQ %d: %s; the WQE is dropped", o.srq.Num(), why))
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
