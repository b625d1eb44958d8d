package cm

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"

	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/verbs"
)

// Open starts a CM on dev's QP1, which it creates (see New for the rest).
func Open(dev *verbs.Device, opts *Options) (*CM, error) {
	sgid := 0
	if opts != nil {
		sgid = opts.SGIDIndex
	}
	if sgid == 0 {
		sgid = DefaultSGIDIndex(dev)
	}
	t, err := OpenQP1(dev, sgid)
	if err != nil {
		return nil, err
	}
	c, err := New(dev, t, opts)
	if err != nil {
		t.Close()
		return nil, err
	}
	return c, nil
}

const (
	qp1Depth = 64
	qp1Slot  = verbs.GRHLen + MADSize
)

// QP1 is a MADConn over a device's GSI QP: MADs go out as UD SENDs to QP 1
// of the peer with Q_Key 0x80010000, and come in with the 40-byte GRH the
// reply address is read from (IPv4 as rxe writes it: 20 zero bytes, then
// the IPv4 header), as the kernel's CM builds its reply from the GRH and
// the work completion.
type QP1 struct {
	dev    *verbs.Device
	pd     *verbs.PD
	scq    *verbs.CQ
	rcq    *verbs.CQ
	qp     *verbs.QP
	mr     *verbs.MR
	buf    []byte // qp1Depth receive slots, then qp1Depth send slots
	sgid   int
	ctx    context.Context
	cancel context.CancelFunc

	mu      sync.Mutex // send side
	next    int
	pending int
	swc     []verbs.WC

	rwc  []verbs.WC
	once sync.Once
}

// OpenQP1 creates dev's GSI QP and its queues, with receives posted.
// sgidIndex is the GID whose address MADs are sent from.
func OpenQP1(dev *verbs.Device, sgidIndex int) (*QP1, error) {
	t := &QP1{dev: dev, sgid: sgidIndex, buf: make([]byte, 2*qp1Depth*qp1Slot), swc: make([]verbs.WC, qp1Depth),
		rwc: make([]verbs.WC, 1)}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	var err error
	fail := func(what string, e error) (*QP1, error) {
		t.release()
		return nil, fmt.Errorf("cm: QP1 on %s: %s: %w", dev.Name(), what, e)
	}
	if t.pd, err = dev.AllocPD(); err != nil {
		return fail("alloc PD", err)
	}
	if t.scq, err = dev.CreateCQ(qp1Depth); err != nil {
		return fail("send CQ", err)
	}
	if t.rcq, err = dev.CreateCQ(qp1Depth); err != nil {
		return fail("receive CQ", err)
	}
	if t.mr, err = t.pd.RegMR(t.buf, verbs.AccessLocalWrite); err != nil {
		return fail("register buffers", err)
	}
	if t.qp, err = dev.CreateGSI(t.pd, t.scq, t.rcq, verbs.QPCap{MaxSendWR: qp1Depth, MaxRecvWR: qp1Depth}); err != nil {
		return fail("create GSI QP", err)
	}
	for i := range qp1Depth {
		if err := t.postRecv(i); err != nil {
			return fail("post receive", err)
		}
	}
	return t, nil
}

func (t *QP1) postRecv(slot int) error {
	return t.qp.PostRecv(&verbs.RecvWR{ID: uint64(slot), SGL: []verbs.SGE{{Addr: t.mr.Addr() + uint64(slot*qp1Slot),
		Length: qp1Slot, LKey: t.mr.LKey()}}})
}

// QP is the GSI QP.
func (t *QP1) QP() *verbs.QP { return t.qp }

var errSendQueueFull = errors.New("cm: QP1 send queue full")

// SendMAD sends one MAD to QP 1 at to's address.
func (t *QP1) SendMAD(to Peer, b []byte) error {
	if len(b) > MADSize {
		return fmt.Errorf("cm: MAD of %d bytes", len(b))
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	// Reclaim the slots of completed sends.
	for {
		n := t.scq.Poll(t.swc)
		t.pending -= n
		if n < len(t.swc) {
			break
		}
	}
	if t.pending >= qp1Depth {
		return errSendQueueFull
	}
	// A link-local peer is answered from the link-local GID (SGIDFor).
	sgid := t.sgid
	if a := to.Addr.Addr().Unmap(); a.Is6() && a.IsLinkLocalUnicast() {
		sgid, _ = SGIDFor(t.dev.GIDTable(), a, t.sgid)
	}
	ah, err := t.pd.CreateAH(verbs.AHAttr{DGID: verbs.GIDFromAddr(to.Addr.Addr()), SGIDIndex: sgid, HopLimit: 64})
	if err != nil {
		return err
	}
	// The work request copies the address vector when posted.
	defer ah.Destroy()
	slot := qp1Depth + t.next
	t.next = (t.next + 1) % qp1Depth
	off := slot * qp1Slot
	copy(t.buf[off:off+MADSize], b)
	err = t.qp.PostSend(&verbs.SendWR{ID: uint64(slot), Opcode: verbs.WRSend, Flags: verbs.SendSignaled,
		SGL: []verbs.SGE{{Addr: t.mr.Addr() + uint64(off), Length: uint32(len(b)), LKey: t.mr.LKey()}},
		AH:  ah.AV(), RemoteQPN: 1, RemoteQKey: verbs.GSIQKey})
	if err == nil {
		t.pending++
	}
	return err
}

// RecvMAD waits for the next MAD on QP1.
func (t *QP1) RecvMAD(buf []byte) (int, Peer, error) {
	for {
		n, err := t.rcq.Wait(t.ctx, t.rwc)
		if err != nil {
			if t.ctx.Err() != nil {
				return 0, Peer{}, ErrClosed
			}
			return 0, Peer{}, err
		}
		if n == 0 {
			continue
		}
		wc := t.rwc[0]
		slot := int(wc.WRID)
		if slot < 0 || slot >= qp1Depth {
			continue
		}
		off := slot * qp1Slot
		var from netip.Addr
		ok := wc.Status == cq.Success && wc.ByteLen >= verbs.GRHLen
		if ok {
			from, ok = grhSource(t.buf[off : off+verbs.GRHLen])
		}
		k := 0
		if ok {
			k = copy(buf, t.buf[off+verbs.GRHLen:off+int(wc.ByteLen)])
		}
		perr := t.postRecv(slot)
		if ok {
			return k, Peer{Addr: netip.AddrPortFrom(from, nic.RoCEv2Port), QPN: wc.SrcQP}, nil
		}
		if perr != nil {
			return 0, Peer{}, perr
		}
	}
}

// grhSource is the sender's address in a UD receive buffer's GRH: the
// IPv6 source, or for IPv4 the source of the IPv4 header that follows 20
// zero bytes.
func grhSource(g []byte) (netip.Addr, bool) {
	switch {
	case g[0]>>4 == 6:
		return netip.AddrFrom16([16]byte(g[8:24])).Unmap(), true
	case g[20]>>4 == 4:
		return netip.AddrFrom4([4]byte(g[32:36])), true
	}
	return netip.Addr{}, false
}

// Close destroys QP1 and its queues; a blocked RecvMAD returns ErrClosed.
func (t *QP1) Close() error {
	t.once.Do(func() {
		t.cancel()
		t.mu.Lock()
		t.release()
		t.mu.Unlock()
	})
	return nil
}

func (t *QP1) release() {
	if t.qp != nil {
		t.qp.Destroy()
	}
	if t.mr != nil {
		t.dev.DeregMR(t.mr)
	}
	if t.scq != nil {
		t.dev.DestroyCQ(t.scq)
	}
	if t.rcq != nil {
		t.dev.DestroyCQ(t.rcq)
	}
	if t.pd != nil {
		t.pd.Dealloc()
	}
}
