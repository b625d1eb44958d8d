package serve

import (
	"fmt"
	"syscall"

	"github.com/softroce/softroce/memreg"
	"github.com/softroce/softroce/verbs"
	"github.com/softroce/softroce/wr"
)

// Memory windows. ALLOC_MW and DEALLOC_MW are control requests; binds
// ride in the send ring as BIND_MW WQEs, so they run in order with the
// QP's other sends: a type 1 window's (ibv_bind_mw names the window's
// handle) through verbs' MW.Bind, a type 2 window's as the work request,
// which names the window by its R_Key. Invalidation (LOCAL_INV,
// SEND_WITH_INV) needs nothing here: the WQE carries the key.

type mwObj struct {
	handle uint32
	pd     uint32
	mw     *verbs.MW
}

func (c *client) allocMW(pdH, typ uint32) ([]byte, []int, error) {
	p := c.pds[pdH]
	switch {
	case p == nil:
		return nil, nil, fmt.Errorf("%w: no PD %d", syscall.EINVAL, pdH)
	case typ != uint32(verbs.MWType1) && typ != uint32(verbs.MWType2):
		return nil, nil, fmt.Errorf("%w: window type %d", syscall.EINVAL, typ)
	case len(c.mws) >= c.lim().MWsPerConn: // verbs' max_mw bounds the device
		return nil, nil, c.limited(c.s.led.count(syscall.ENOMEM, limMWs, c.lim().MWsPerConn))
	}
	mw, err := p.pd.AllocMW(verbs.MWType(typ))
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", syscall.ENOMEM, err)
	}
	h := c.handleID()
	c.mws[h] = &mwObj{handle: h, pd: pdH, mw: mw}
	p.uses++
	return u32pair(h, mw.RKey()), nil, nil
}

func u32pair(a, b uint32) []byte { return le.AppendUint32(le.AppendUint32(nil, a), b) }

func (c *client) deallocMW(h uint32) error {
	o := c.mws[h]
	if o == nil {
		return fmt.Errorf("%w: no MW %d", syscall.EINVAL, h)
	}
	if err := o.mw.Dealloc(); err != nil {
		return err
	}
	delete(c.mws, h)
	c.pds[o.pd].uses--
	return nil
}

// Offsets of the BIND_MW fields of struct sr_send_wqe.
const (
	offWQEBindLKey = 60
	offWQEBindMW   = 76
)

// buildBind reads a BIND_MW WQE. The region is named by its L_Key and
// must be one of the client's; a type 1 window by its handle, which must
// be the client's too. The library computes a type 1 window's new key
// (ibv_inc_rkey, as the verb returns it at once) and the window takes
// exactly that key: binds posted on two QPs may reach the daemon in
// either order, so the key need not follow the last one drained. It must
// keep the window's index, so a client can only choose the key byte of
// its own window, as a BIND_MW work request does for type 2. What the
// binding rules refuse (range outside the region, rights, PDs) completes
// with MW_BIND_ERR and moves the QP to ERR, as on rxe.
func (q *qpObj) buildBind(w []byte) string {
	s := &q.swr
	lkey := le.Uint32(w[offWQEBindLKey:])
	b := wr.MWBind{MWKey: s.InvRKey, RKey: s.RKey, MRKey: lkey, Addr: s.RemoteAddr, Length: s.CompareAdd, Access: uint32(s.Swap)}
	if s.Swap > 0xffffffff {
		return "BIND_MW access flags out of range"
	}
	var mr *mrObj
	if lkey != 0 {
		if mr = q.c.mrByKey[lkey]; mr == nil {
			return "BIND_MW names a region the client does not own"
		}
	}
	h := le.Uint32(w[offWQEBindMW:])
	if h == 0 { // a work request: type 2
		s.Bind = b
		return ""
	}
	o := q.c.mws[h]
	switch {
	case o == nil:
		return "ibv_bind_mw names a window the client does not own"
	case o.mw.Type() != verbs.MWType1:
		return "ibv_bind_mw on a type 2 window"
	case b.RKey>>8 != o.mw.RKey()>>8:
		return "ibv_bind_mw key with another window's index"
	}
	q.bindMW = o
	q.bindInfo = verbs.MWBindInfo{Addr: b.Addr, Length: b.Length, Access: memreg.Access(b.Access)}
	if mr != nil {
		q.bindInfo.MR = mr.mr
	}
	return ""
}

// post hands the WQE buildSend read to verbs.
func (q *qpObj) post() error {
	if o := q.bindMW; o != nil {
		err := o.mw.BindKey(q.qp, q.bindInfo, q.swr.RKey, q.swr.ID, q.swr.Flags&(verbs.SendSignaled|verbs.SendFence))
		if !isQueueFull(err) { // a full queue is tried again with the same WQE
			q.bindMW = nil
		}
		return err
	}
	return q.qp.PostSend(&q.swr)
}
