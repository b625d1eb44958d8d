package serve

import (
	"fmt"
	"syscall"

	"github.com/softroce/softroce/verbs"
)

// UD address handles, and the QP types other than RC.

const (
	sizeCreateAH  = 48
	sizeCreateSRQ = 16
	sizeSRQResp   = 40
	sizeModifySRQ = 16
	sizeSRQAttr   = 16
	offWQEAH      = 64 // struct sr_send_wqe's appended UD fields
	offWQERemQPN  = 68
	offWQERemQKey = 72
	ibvQPTRC      = 2 // enum ibv_qp_type
	ibvQPTUC      = 3
	ibvQPTUD      = 4
	evSRQLimit    = 15 // IBV_EVENT_SRQ_LIMIT_REACHED
	evQPLastWQE   = 16 // IBV_EVENT_QP_LAST_WQE_REACHED
	ibvSRQMaxWR   = 1  // enum ibv_srq_attr_mask
	ibvSRQLimit   = 2
)

// udBodySize is the exact body length of the ops of this file and srq.go.
func udBodySize(op uint32) int {
	switch op {
	case opCreateAH:
		return sizeCreateAH
	case opCreateSRQ:
		return sizeCreateSRQ
	case opModifySRQ:
		return sizeModifySRQ
	}
	return sizeHandle // DESTROY_AH, QUERY_SRQ, DESTROY_SRQ
}

// qpType maps enum ibv_qp_type to the verbs type the daemon serves.
func qpType(t uint32) (verbs.QPType, bool) {
	switch t {
	case ibvQPTRC:
		return verbs.QPTypeRC, true
	case ibvQPTUC:
		return verbs.QPTypeUC, true
	case ibvQPTUD:
		return verbs.QPTypeUD, true
	}
	return 0, false
}

// ahObj is a client's address handle.
type ahObj struct {
	handle uint32
	pd     uint32
	ah     *verbs.AH
}

// handleUD runs the ops of this file and srq.go; d.mu is held. ok is
// false for an op that is none of them.
func (c *client) handleUD(r request) (resp []byte, rfds []int, err error, ok bool) {
	b := r.body
	switch r.op {
	case opCreateAH:
		resp, err = c.createAH(b)
	case opDestroyAH:
		err = c.destroyAH(u32(b, 0))
	case opCreateSRQ:
		resp, rfds, err = c.createSRQ(u32(b, 0), u32(b, 1), u32(b, 2), u32(b, 3))
	case opModifySRQ:
		err = c.modifySRQ(u32(b, 0), u32(b, 1), u32(b, 2), u32(b, 3))
	case opQuerySRQ:
		resp, err = c.querySRQ(u32(b, 0))
	case opDestroySRQ:
		err = c.destroySRQ(u32(b, 0))
	default:
		return nil, nil, nil, false
	}
	return resp, rfds, err, true
}

// rocePktType is the sl of a successful UD receive completion whose
// datagram came over IP version ipv (4 or 6): the RoCE packet type, as
// mlx5 reports it there (bit 3: a UDP header, RoCEv2; bits 2-0: the L3
// header, 2 IPv4, 1 IPv6). It is per datagram: a device with an IPv6
// link-local and an IPv4 GID receives both. rxe leaves sl 0; UCX's
// ud_verbs takes sl&7 == 2 to find the IPv4 destination in the GRH's
// last 4 bytes, and without it compares the last 16 bytes with its GIDs
// and drops every IPv4 datagram. sl means nothing else on RoCE: it is not
// on the wire.
func rocePktType(ipv uint8) uint8 {
	if ipv == 4 {
		return 0x8 | 0x2
	}
	return 0x8 | 0x1
}

func (c *client) createAH(b []byte) ([]byte, error) {
	pdH, global, sgid, fl := u32(b, 0), u32(b, 1), u32(b, 2), u32(b, 3)
	hop, tc, sl, port := u32(b, 4), u32(b, 5), u32(b, 6), u32(b, 7)
	p := c.pds[pdH]
	switch {
	case p == nil:
		return nil, fmt.Errorf("%w: no PD %d", syscall.EINVAL, pdH)
	case global == 0:
		// RoCE addresses are GIDs: an AH without a GRH names no one.
		return nil, fmt.Errorf("%w: RoCE needs a GRH (is_global)", syscall.EINVAL)
	case port > 1: // one port; 0 is taken as port 1
		return nil, fmt.Errorf("%w: port %d", syscall.EINVAL, port)
	case sgid > 255 || hop > 255 || tc > 255 || sl > 15:
		return nil, fmt.Errorf("%w: AH attribute out of range", syscall.EINVAL)
	case len(c.ahs) >= c.lim().AHsPerConn:
		return nil, c.limited(c.s.led.count(syscall.ENOMEM, limAHs, c.lim().AHsPerConn))
	}
	// The kernel takes any 32-bit flow label (uverbs and rxe store it as
	// given, mlx5 uses its low 20 bits, IB_GRH_FLOWLABEL_MASK) and the
	// GRH holds 20 bits: keep those, as MODIFY_QP does. UCX passes ~0.
	fl &= 0xfffff
	var a verbs.AHAttr
	copy(a.DGID[:], b[32:48])
	a.SGIDIndex, a.FlowLabel, a.HopLimit, a.TrafficClass, a.SL = int(sgid), fl, uint8(hop), uint8(tc), uint8(sl)
	ah, err := p.pd.CreateAH(a)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", syscall.EINVAL, err)
	}
	h := c.handleID()
	c.ahs[h] = &ahObj{handle: h, pd: pdH, ah: ah}
	p.uses++
	return handleResp(h), nil
}

func (c *client) destroyAH(h uint32) error {
	o := c.ahs[h]
	if o == nil {
		return fmt.Errorf("%w: no AH %d", syscall.EINVAL, h)
	}
	if err := o.ah.Destroy(); err != nil {
		return err
	}
	delete(c.ahs, h)
	c.pds[o.pd].uses--
	return nil
}

// buildUD fills a UD send's destination from the WQE's appended fields:
// the AH must be one of the client's own, of the QP's PD, else it returns
// why the WQE is refused.
func (q *qpObj) buildUD(w []byte) string {
	s := &q.swr
	if q.typ != verbs.QPTypeUD {
		s.AH, s.RemoteQPN, s.RemoteQKey = nil, 0, 0
		return ""
	}
	o := q.c.ahs[le.Uint32(w[offWQEAH:])]
	if o == nil || o.pd != q.pd {
		return "UD send with an address handle that is not the client's, of the QP's PD"
	}
	s.AH = o.ah.AV()
	s.RemoteQPN = le.Uint32(w[offWQERemQPN:]) & 0xffffff
	s.RemoteQKey = le.Uint32(w[offWQERemQKey:])
	return ""
}

// cleanupUD frees the client's SRQs and AHs once its QPs are gone.
func (c *client) cleanupUD() {
	for h := range c.srqs {
		c.destroySRQ(h)
	}
	for h := range c.ahs {
		c.destroyAH(h)
	}
}
