package engine

import (
	"errors"
	"fmt"

	"github.com/softroce/softroce/wr"
)

// recvRing is a ring of receive WQEs: a QP's own receive queue or an SRQ.
type recvRing struct {
	wqes        []RecvWQE
	head, count int
}

func newRecvRing(n, maxSGE int) recvRing {
	r := recvRing{wqes: make([]RecvWQE, n)}
	// One backing array for every slot's SGL: posting never allocates.
	sges := make([]wr.SGE, n*maxSGE)
	for i := range r.wqes {
		r.wqes[i].SGL = sges[i*maxSGE : i*maxSGE : (i+1)*maxSGE]
	}
	return r
}

// moveTo copies the posted WQEs, oldest first, into the empty ring to
// (which has room for them) and leaves r empty.
func (r *recvRing) moveTo(to *recvRing) {
	for r.count > 0 {
		w := r.pop()
		d := &to.wqes[(to.head+to.count)%len(to.wqes)]
		d.ID, d.Len = w.ID, w.Len
		d.SGL = append(d.SGL[:0], w.SGL...)
		to.count++
	}
}

func (r *recvRing) full() bool { return r.count == len(r.wqes) }

// push copies rwr into the next free slot; the caller checked full().
func (r *recvRing) push(rwr *wr.RecvWR) {
	w := &r.wqes[(r.head+r.count)%len(r.wqes)]
	w.ID = rwr.ID
	w.SGL = append(w.SGL[:0], rwr.SGL...)
	w.Len = 0
	for _, s := range rwr.SGL {
		w.Len += int(s.Length)
	}
	r.count++
}

// pop returns the oldest WQE, valid until the slot is posted to again.
func (r *recvRing) pop() *RecvWQE {
	w := &r.wqes[r.head]
	r.head = (r.head + 1) % len(r.wqes)
	r.count--
	return w
}

func (r *recvRing) reset() { r.head, r.count = 0, 0 }

// SRQConfig is fixed at creation, except Limit and MaxWR (SRQ.Modify).
type SRQConfig struct {
	MaxWR  int
	MaxSGE int // SGEs per receive WR (0 means 1)
	// Limit arms the SRQ limit (0: not armed): see SRQ.SetLimit.
	Limit int
	// OnLimit is called (under the engine lock, must not block or call
	// into the engine) when the armed limit is reached, like
	// IBV_EVENT_SRQ_LIMIT_REACHED.
	OnLimit func()
}

// SRQ is a shared receive queue (IBTA §10.2.9): one ring of receive WQEs
// that the QPs created on it consume in posting order, whichever QP a
// message arrives on. It is guarded by the engine lock.
type SRQ struct {
	e         *Engine
	num       uint32
	cfg       SRQConfig
	ring      recvRing
	limit     int // armed limit; 0: disarmed
	nQP       int // QPs created on it and not destroyed
	destroyed bool
}

// Errors of SRQ operations.
var (
	// ErrSRQBusy: DestroySRQ while QPs still use the SRQ.
	ErrSRQBusy = errors.New("engine: SRQ still has QPs")
	// ErrNoSRQ: the SRQ was destroyed, or is another engine's.
	ErrNoSRQ = errors.New("engine: no such SRQ (already destroyed?)")
)

// CreateSRQ makes a shared receive queue with room for cfg.MaxWR WQEs.
func (e *Engine) CreateSRQ(cfg SRQConfig) (*SRQ, error) {
	if cfg.MaxWR < 1 {
		return nil, fmt.Errorf("engine: SRQ max_wr must be at least 1 (got %d)", cfg.MaxWR)
	}
	cfg.MaxSGE = max(cfg.MaxSGE, 1)
	if cfg.Limit < 0 || cfg.Limit > cfg.MaxWR {
		return nil, fmt.Errorf("engine: SRQ limit %d outside 0..max_wr %d", cfg.Limit, cfg.MaxWR)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.srqNext++
	s := &SRQ{e: e, num: e.srqNext, cfg: cfg, ring: newRecvRing(cfg.MaxWR, cfg.MaxSGE), limit: cfg.Limit}
	return s, nil
}

// DestroySRQ frees s. It fails with ErrSRQBusy, changing nothing, while a
// QP created on it exists (ibv_destroy_srq returns EBUSY), and with
// ErrNoSRQ the second time. WQEs still posted are discarded.
func (e *Engine) DestroySRQ(s *SRQ) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if s == nil || s.e != e || s.destroyed {
		return ErrNoSRQ
	}
	if s.nQP > 0 {
		return fmt.Errorf("%w: SRQ %d is used by %d QPs (destroy them first)", ErrSRQBusy, s.num, s.nQP)
	}
	s.destroyed = true
	s.ring.reset()
	return nil
}

// Num is the SRQ number (srq_num), unique within the engine.
func (s *SRQ) Num() uint32 { return s.num }

// PostRecv queues a receive work request on the SRQ.
func (s *SRQ) PostRecv(rwr *wr.RecvWR) error {
	s.e.mu.Lock()
	defer s.e.mu.Unlock()
	if s.destroyed {
		return fmt.Errorf("%w: post recv on destroyed SRQ %d", ErrState, s.num)
	}
	if s.ring.full() {
		return fmt.Errorf("%w: SRQ %d holds %d WRs (max_wr)", ErrQueueFull, s.num, len(s.ring.wqes))
	}
	if len(rwr.SGL) > s.cfg.MaxSGE {
		return fmt.Errorf("engine: recv WR has %d SGEs, SRQ %d allows %d (max_sge)", len(rwr.SGL), s.num, s.cfg.MaxSGE)
	}
	s.ring.push(rwr)
	return nil
}

// SetLimit arms the SRQ limit (ibv_modify_srq with IBV_SRQ_LIMIT): when a
// WQE taken leaves fewer than limit posted, OnLimit is called once and the
// limit disarms (IBTA §10.2.9; rxe checks it as it takes a WQE, not when
// it is armed). 0 disarms.
func (s *SRQ) SetLimit(limit int) error { return s.Modify(SRQChange{Limit: limit, SetLimit: true}) }

// SRQChange is a modify-SRQ request (ibv_modify_srq): MaxWR applies with
// Resize (IBV_SRQ_MAX_WR), Limit with SetLimit (IBV_SRQ_LIMIT).
type SRQChange struct {
	MaxWR, Limit     int
	Resize, SetLimit bool
}

// Modify resizes the SRQ and/or arms its limit, all or nothing. A resize
// to MaxWR keeps the posted WQEs in order, and may shrink the SRQ as long
// as they fit (rxe_queue_resize refuses fewer slots than posted WQEs); it
// is refused below the armed limit (the new one if SetLimit), as
// rxe_srq_chk_attr does. A limit is refused above max_wr (the new one if
// Resize). QPs taking WQEs from the SRQ see the change at once: it is made
// under the engine lock, between packets.
func (s *SRQ) Modify(c SRQChange) error {
	s.e.mu.Lock()
	defer s.e.mu.Unlock()
	if s.destroyed {
		return fmt.Errorf("%w: modify destroyed SRQ %d", ErrState, s.num)
	}
	size, limit := len(s.ring.wqes), s.limit
	if c.Resize {
		size = c.MaxWR
	}
	if c.SetLimit {
		limit = c.Limit
	}
	switch {
	case c.Resize && size < 1:
		return fmt.Errorf("engine: resize SRQ %d: max_wr must be at least 1 (got %d)", s.num, size)
	case c.Resize && size < s.ring.count:
		return fmt.Errorf("engine: resize SRQ %d to %d: it holds %d posted WQEs", s.num, size, s.ring.count)
	case c.SetLimit && (limit < 0 || limit > size):
		return fmt.Errorf("engine: SRQ %d limit %d outside 0..max_wr %d", s.num, limit, size)
	case c.Resize && limit > size:
		return fmt.Errorf("engine: resize SRQ %d to %d: below its armed limit %d", s.num, size, limit)
	}
	if c.Resize && size != len(s.ring.wqes) {
		r := newRecvRing(size, s.cfg.MaxSGE)
		s.ring.moveTo(&r)
		s.ring = r
		s.cfg.MaxWR = size
	}
	s.limit = limit
	return nil
}

// SRQState is a snapshot of an SRQ.
type SRQState struct {
	MaxWR, MaxSGE int
	Limit         int // the armed limit, 0 once it fired or if never armed
	Posted        int // WQEs waiting
}

// Query returns the SRQ's attributes and how many WQEs wait.
func (s *SRQ) Query() SRQState {
	s.e.mu.Lock()
	defer s.e.mu.Unlock()
	return SRQState{MaxWR: len(s.ring.wqes), MaxSGE: s.cfg.MaxSGE, Limit: s.limit, Posted: s.ring.count}
}

// take pops the oldest WQE, or returns nil when the SRQ is empty, and
// fires the limit.
func (s *SRQ) Take() *RecvWQE {
	if s.ring.count == 0 {
		return nil
	}
	w := s.ring.pop()
	if s.limit > 0 && s.ring.count < s.limit {
		s.limit = 0
		if s.cfg.OnLimit != nil {
			s.cfg.OnLimit()
		}
	}
	return w
}
