package verbs

import (
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/softroce/softroce/transport/engine"
)

// Device limits on shared receive queues (max_srq, max_srq_wr,
// max_srq_sge in QueryDevice).
const (
	MaxSRQ    = 1 << 16
	MaxSRQWR  = MaxQPWR
	MaxSRQSGE = MaxSGE
)

// SRQInitAttr are the creation attributes of an SRQ (struct
// ibv_srq_init_attr's attr): zero MaxWR and MaxSGE get 128 and 1; Limit
// arms the limit event at once (0: not armed).
type SRQInitAttr struct {
	MaxWR, MaxSGE, Limit int
}

// SRQAttr are an SRQ's attributes (struct ibv_srq_attr). Limit is the
// armed limit: 0 once the limit event has been raised.
type SRQAttr struct {
	MaxWR, MaxSGE, Limit int
}

// SRQ is a shared receive queue: the QPs created on it (QPInitAttr.SRQ)
// take their receive WQEs from it, in posting order, whichever QP a
// message arrives on.
type SRQ struct {
	pd        *PD
	rc        *engine.SRQ
	attr      SRQInitAttr
	destroyed atomic.Bool // set by Destroy under the device's mu
}

// CreateSRQ creates a shared receive queue in the PD (ibv_create_srq).
// MaxWR and MaxSGE are bounded by max_srq_wr and max_srq_sge, Limit by
// MaxWR; at most max_srq SRQs exist at once. A failed CreateSRQ creates
// nothing.
func (pd *PD) CreateSRQ(attr SRQInitAttr) (*SRQ, error) {
	d := pd.d
	if err := d.unusable("create SRQ"); err != nil {
		return nil, err
	}
	if attr.MaxWR == 0 {
		attr.MaxWR = 128
	}
	if attr.MaxSGE == 0 {
		attr.MaxSGE = 1
	}
	switch {
	case attr.MaxWR < 0 || attr.MaxSGE < 0 || attr.Limit < 0:
		return nil, fmt.Errorf("verbs: negative SRQ attribute %+v", attr)
	case attr.MaxWR > MaxSRQWR:
		return nil, fmt.Errorf("verbs: create SRQ: max_wr %d exceeds the device limit max_srq_wr %d", attr.MaxWR, MaxSRQWR)
	case attr.MaxSGE > MaxSRQSGE:
		return nil, fmt.Errorf("verbs: create SRQ: max_sge %d exceeds the device limit max_srq_sge %d", attr.MaxSGE, MaxSRQSGE)
	case attr.Limit > attr.MaxWR:
		return nil, fmt.Errorf("verbs: create SRQ: srq_limit %d exceeds max_wr %d", attr.Limit, attr.MaxWR)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if pd.dead {
		return nil, fmt.Errorf("verbs: create SRQ: PD %d is deallocated", pd.pd.Handle())
	}
	if d.nSRQ >= MaxSRQ {
		return nil, fmt.Errorf("verbs: create SRQ: device %s already has max_srq %d SRQs", d.name, MaxSRQ)
	}
	s := &SRQ{pd: pd, attr: attr}
	r, err := d.eng.CreateSRQ(engine.SRQConfig{MaxWR: attr.MaxWR, MaxSGE: attr.MaxSGE, Limit: attr.Limit,
		OnLimit: func() { d.raise(AsyncEvent{Type: EventSRQLimitReached, SRQ: s}) }})
	if err != nil {
		return nil, err
	}
	s.rc = r
	d.nSRQ++
	pd.nSRQ++
	return s, nil
}

// Num is the SRQ number (srq_num).
func (s *SRQ) Num() uint32 { return s.rc.Num() }

// PostRecv posts a receive work request to the SRQ (ibv_post_srq_recv).
func (s *SRQ) PostRecv(wr *RecvWR) error {
	if err := s.usable("post SRQ recv"); err != nil {
		return err
	}
	return s.rc.PostRecv(wr)
}

// SRQAttrMask says which SRQAttr fields Modify changes (enum
// ibv_srq_attr_mask).
type SRQAttrMask int

// SRQ attribute mask bits.
const (
	SRQMaxWR SRQAttrMask = 1 << 0 // IBV_SRQ_MAX_WR: resize to MaxWR
	SRQLimit SRQAttrMask = 1 << 1 // IBV_SRQ_LIMIT: arm the limit at Limit
)

// Modify changes the SRQ's attributes named in mask (ibv_modify_srq), all
// or nothing; MaxSGE is never changed. SRQMaxWR resizes the SRQ to
// attr.MaxWR (the device reports DeviceSRQResize): the posted WQEs are
// kept in order, QPs on the SRQ go on taking them, and the SRQ may shrink
// as long as they fit; a size above max_srq_wr, below 1, below the posted
// WQEs or below the armed limit is refused (as rxe_srq_chk_attr and
// rxe_queue_resize; rxe also rounds the size up to a power of 2 minus 1,
// softroce keeps it exact). SRQLimit arms the limit: when a WQE taken from
// the SRQ leaves fewer than attr.Limit posted, EventSRQLimitReached is
// raised once and the limit disarms; 0 disarms it; a limit above max_wr
// (the new one when resizing too) is refused.
func (s *SRQ) Modify(attr SRQAttr, mask SRQAttrMask) error {
	if err := s.usable("modify SRQ"); err != nil {
		return err
	}
	switch {
	case mask&^(SRQMaxWR|SRQLimit) != 0:
		return fmt.Errorf("verbs: modify SRQ: unknown attribute mask bits %#x", int(mask&^(SRQMaxWR|SRQLimit)))
	case mask&SRQMaxWR != 0 && attr.MaxWR > MaxSRQWR:
		return fmt.Errorf("verbs: modify SRQ: max_wr %d exceeds the device limit max_srq_wr %d", attr.MaxWR, MaxSRQWR)
	}
	c := engine.SRQChange{MaxWR: attr.MaxWR, Limit: attr.Limit, Resize: mask&SRQMaxWR != 0, SetLimit: mask&SRQLimit != 0}
	if err := s.rc.Modify(c); err != nil {
		return fmt.Errorf("verbs: modify SRQ: %w", err)
	}
	return nil
}

// Query returns the SRQ's attributes (ibv_query_srq).
func (s *SRQ) Query() SRQAttr {
	st := s.rc.Query()
	return SRQAttr{MaxWR: st.MaxWR, MaxSGE: st.MaxSGE, Limit: st.Limit}
}

// Destroy destroys the SRQ (ibv_destroy_srq). It fails with an error
// matching ErrBusy while QPs created on it exist, and changes nothing
// then. WQEs still posted are discarded.
func (s *SRQ) Destroy() error {
	d := s.pd.d
	if err := d.isClosed("destroy SRQ"); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.eng.DestroySRQ(s.rc); err != nil {
		if errors.Is(err, engine.ErrSRQBusy) {
			return &busyError{"verbs: destroy SRQ: " + err.Error()}
		}
		return fmt.Errorf("verbs: destroy SRQ %d: %w", s.Num(), err)
	}
	s.destroyed.Store(true)
	d.nSRQ--
	s.pd.nSRQ--
	return nil
}

func (s *SRQ) usable(op string) error {
	if err := s.pd.d.unusable(op); err != nil {
		return err
	}
	if s.destroyed.Load() {
		return fmt.Errorf("verbs: %s: SRQ %d is destroyed", op, s.Num())
	}
	return nil
}
