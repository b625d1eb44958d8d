package rc

import (
	"bytes"
	"testing"
	"time"

	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/memreg"
	"github.com/softroce/softroce/qpstate"
	"github.com/softroce/softroce/transport/engine"
	"github.com/softroce/softroce/transport/internal/enginetest"
	"github.com/softroce/softroce/wr"
)

// mwSim is a connected pair whose endpoint 1 has a region that windows may
// be bound to, and a type 2 window.
type mwSim struct {
	s          *enginetest.Sim
	qps        [2]*engine.QP
	lmr, rmr   *memreg.MR
	local, rem []byte
	mw         *memreg.MW
}

func newMWSim(t *testing.T) *mwSim {
	m := &mwSim{s: enginetest.NewSim(t, 1, enginetest.Impairment{})}
	m.s.Keep = true
	m.qps = m.s.Connect(enginetest.QPOpts{PMTU: 1024, Timeout: 14, Retry: 7, RNRRetry: 7})
	m.lmr, m.local = m.s.Reg(0, 8192)
	m.rem = make([]byte, 8192)
	var err error
	ep := m.s.EP[1]
	if m.rmr, err = ep.MRs.RegMR(ep.PD, m.rem, enginetest.AllAccess|memreg.AccessMWBind); err != nil {
		t.Fatal(err)
	}
	if m.mw, err = ep.MRs.AllocMW(ep.PD, memreg.MWType2); err != nil {
		t.Fatal(err)
	}
	return m
}

const rw = uint32(memreg.AccessRemoteRead | memreg.AccessRemoteWrite)

// bind posts a signaled BIND_MW of [off, off+n) of the remote region on
// endpoint 1's QP and waits for its completion; it returns the new rkey.
func (m *mwSim) bind(t *testing.T, qp *engine.QP, off, n uint64, lowKey byte) uint32 {
	t.Helper()
	k := m.mw.RKey()&^0xFF | uint32(lowKey)
	enginetest.MustPost(t, qp, &wr.SendWR{ID: 100, Opcode: wr.BindMW, Flags: wr.Signaled, Bind: wr.MWBind{MWKey: m.mw.RKey(), RKey: k,
		MRKey: m.rmr.LKey(), Addr: m.rmr.Addr() + off, Length: n, Access: rw}})
	wc := m.s.WaitWC(m.s.EP[1].SCQ, 1, time.Second)[0]
	if wc.Status != cq.Success || wc.Opcode != cq.OpBindMW || wc.WRID != 100 {
		t.Fatalf("bind completion %+v", wc)
	}
	if m.mw.RKey() != k {
		t.Fatalf("window key %#x, want %#x", m.mw.RKey(), k)
	}
	return k
}

// op posts one signaled WRITE or READ from endpoint 0 and returns its status.
func (m *mwSim) op(t *testing.T, qp *engine.QP, o wr.Opcode, loff int, n uint32, raddr uint64, rkey uint32) cq.Status {
	t.Helper()
	enginetest.MustPost(t, qp, &wr.SendWR{ID: 7, Opcode: o, Flags: wr.Signaled,
		SGL: []wr.SGE{{Addr: m.lmr.Addr() + uint64(loff), Length: n, LKey: m.lmr.LKey()}}, RemoteAddr: raddr, RKey: rkey})
	return m.s.WaitWC(m.s.EP[0].SCQ, 1, time.Second)[0].Status
}

// A BIND_MW work request binds a type 2 window; the peer WRITEs (three
// packets) and READs through the window's rkey; an access past the window,
// though inside the region, is a remote access error.
func TestMWBindWriteRead(t *testing.T) {
	m := newMWSim(t)
	k := m.bind(t, m.qps[1], 1024, 3000, 0x42)
	enginetest.Fill(m.local, 9)
	if st := m.op(t, m.qps[0], wr.RDMAWrite, 0, 3000, m.rmr.Addr()+1024, k); st != cq.Success {
		t.Fatalf("write through window: %v", st)
	}
	if !bytes.Equal(m.rem[1024:4024], m.local[:3000]) {
		t.Fatal("WRITE data differs")
	}
	if m.rem[1023] != 0 || m.rem[4024] != 0 {
		t.Fatal("WRITE touched bytes outside the window")
	}
	if st := m.op(t, m.qps[0], wr.RDMARead, 4096, 3000, m.rmr.Addr()+1024, k); st != cq.Success {
		t.Fatalf("read through window: %v", st)
	}
	if !bytes.Equal(m.local[4096:7096], m.local[:3000]) {
		t.Fatal("READ data differs")
	}
	if st := m.op(t, m.qps[0], wr.RDMARead, 0, 2, m.rmr.Addr()+1024+2999, k); st != cq.RemAccessErr {
		t.Fatalf("read past the window: %v", st)
	}
	if m.qps[1].State() != qpstate.Err {
		t.Fatalf("responder state %v", m.qps[1].State())
	}
}

// LOCAL_INV of the window completes with IBV_WC_LOCAL_INV; the peer's next
// access through its rkey is NAKed.
func TestMWLocalInvalidate(t *testing.T) {
	m := newMWSim(t)
	k := m.bind(t, m.qps[1], 0, 4096, 0x10)
	if st := m.op(t, m.qps[0], wr.RDMAWrite, 0, 100, m.rmr.Addr(), k); st != cq.Success {
		t.Fatalf("write before invalidate: %v", st)
	}
	enginetest.MustPost(t, m.qps[1], &wr.SendWR{ID: 5, Opcode: wr.LocalInv, Flags: wr.Signaled, InvRKey: k})
	if wc := m.s.WaitWC(m.s.EP[1].SCQ, 1, time.Second)[0]; wc.Status != cq.Success || wc.Opcode != cq.OpLocalInv || wc.WRID != 5 {
		t.Fatalf("local inv completion %+v", wc)
	}
	if st := m.op(t, m.qps[0], wr.RDMAWrite, 0, 100, m.rmr.Addr(), k); st != cq.RemAccessErr {
		t.Fatalf("write after invalidate: %v", st)
	}
}

// A SEND with invalidate naming the type 2 window invalidates it: the
// receive completes with WITH_INV and the rkey; later accesses are NAKed.
func TestMWSendWithInvalidate(t *testing.T) {
	m := newMWSim(t)
	k := m.bind(t, m.qps[1], 0, 4096, 0x77)
	if err := m.qps[1].PostRecv(&wr.RecvWR{ID: 9, SGL: []wr.SGE{{Addr: m.rmr.Addr() + 6000, Length: 64, LKey: m.rmr.LKey()}}}); err != nil {
		t.Fatal(err)
	}
	copy(m.local, "invalidate!")
	enginetest.MustPost(t, m.qps[0], &wr.SendWR{ID: 3, Opcode: wr.SendWithInv, Flags: wr.Signaled, InvRKey: k,
		SGL: []wr.SGE{{Addr: m.lmr.Addr(), Length: 11, LKey: m.lmr.LKey()}}})
	if wc := m.s.WaitWC(m.s.EP[0].SCQ, 1, time.Second)[0]; wc.Status != cq.Success {
		t.Fatalf("send completion %+v", wc)
	}
	rc := m.s.WaitWC(m.s.EP[1].RCQ, 1, time.Second)[0]
	if rc.Status != cq.Success || rc.Flags&cq.FlagWithInv == 0 || rc.InvalidatedRKey != k || rc.ByteLen != 11 || string(m.rem[6000:6011]) != "invalidate!" {
		t.Fatalf("receive completion %+v", rc)
	}
	if _, _, _, _, bound := m.mw.Bound(); bound {
		t.Fatal("window still bound")
	}
	if st := m.op(t, m.qps[0], wr.RDMARead, 0, 8, m.rmr.Addr(), k); st != cq.RemAccessErr {
		t.Fatalf("read after remote invalidate: %v", st)
	}
}

// A type 2 window bound on QP A is refused to requests arriving on QP B of
// the same PD; a type 1 window serves both.
func TestMWBoundToQP(t *testing.T) {
	m := newMWSim(t)
	b := m.s.Connect(enginetest.QPOpts{PMTU: 1024, Timeout: 14, Retry: 7, RNRRetry: 7})
	k := m.bind(t, m.qps[1], 0, 4096, 0x21)
	ep := m.s.EP[1]
	mw1, _ := ep.MRs.AllocMW(ep.PD, memreg.MWType1)
	k1, err := ep.MRs.BindMW(mw1, ep.PD, m.qps[1].Num(), memreg.Bind{MRKey: m.rmr.LKey(), Addr: m.rmr.Addr(), Length: 4096, Access: memreg.Access(rw)})
	if err != nil {
		t.Fatal(err)
	}
	for _, qp := range []*engine.QP{m.qps[0], b[0]} {
		if st := m.op(t, qp, wr.RDMARead, 0, 64, m.rmr.Addr(), k1); st != cq.Success {
			t.Fatalf("type 1 window from QP %d: %v", qp.Num(), st)
		}
	}
	if st := m.op(t, m.qps[0], wr.RDMARead, 0, 64, m.rmr.Addr(), k); st != cq.Success {
		t.Fatalf("type 2 window on its QP: %v", st)
	}
	if st := m.op(t, b[0], wr.RDMAWrite, 0, 64, m.rmr.Addr(), k); st != cq.RemAccessErr {
		t.Fatalf("type 2 window on another QP: %v", st)
	}
	if b[1].State() != qpstate.Err || m.qps[1].State() != qpstate.RTS {
		t.Fatalf("states %v %v", b[1].State(), m.qps[1].State())
	}
}

// Local work requests complete in send-queue order: a BIND_MW behind a READ
// completes after it, an unsignaled one completes silently, and a failed
// one completes MW_BIND_ERR after what precedes it, flushes what follows
// and moves the QP to ERR, leaving the window as it was.
func TestMWLocalOrdering(t *testing.T) {
	m := newMWSim(t)
	q := m.qps[1]
	src, _ := m.s.Reg(0, 4096)
	enginetest.MustPost(t, q, &wr.SendWR{ID: 1, Opcode: wr.RDMARead, Flags: wr.Signaled,
		SGL: []wr.SGE{{Addr: m.rmr.Addr() + 4096, Length: 4096, LKey: m.rmr.LKey()}}, RemoteAddr: src.Addr(), RKey: src.RKey()})
	k := m.mw.RKey()&^0xFF | 0x01
	enginetest.MustPost(t, q, &wr.SendWR{ID: 2, Opcode: wr.BindMW, Flags: wr.Signaled | wr.Fence, Bind: wr.MWBind{MWKey: m.mw.RKey(), RKey: k,
		MRKey: m.rmr.LKey(), Addr: m.rmr.Addr(), Length: 64, Access: rw}})
	enginetest.MustPost(t, q, &wr.SendWR{ID: 3, Opcode: wr.LocalInv, InvRKey: k}) // unsignaled
	wcs := m.s.WaitWC(m.s.EP[1].SCQ, 2, time.Second)
	if len(wcs) != 2 || wcs[0].WRID != 1 || wcs[0].Opcode != cq.OpRDMARead || wcs[1].WRID != 2 || wcs[1].Opcode != cq.OpBindMW || wcs[1].Status != cq.Success {
		t.Fatalf("completions %+v", wcs)
	}
	if _, _, _, _, bound := m.mw.Bound(); bound {
		t.Fatal("unsignaled LOCAL_INV did not run")
	}
	// A failing bind (range past the region) behind a READ.
	enginetest.MustPost(t, q, &wr.SendWR{ID: 4, Opcode: wr.RDMARead, Flags: wr.Signaled,
		SGL: []wr.SGE{{Addr: m.rmr.Addr() + 4096, Length: 4096, LKey: m.rmr.LKey()}}, RemoteAddr: src.Addr(), RKey: src.RKey()})
	enginetest.MustPost(t, q, &wr.SendWR{ID: 5, Opcode: wr.BindMW, Bind: wr.MWBind{MWKey: m.mw.RKey(), RKey: k + 1,
		MRKey: m.rmr.LKey(), Addr: m.rmr.Addr() + 8000, Length: 1000, Access: rw}})
	enginetest.MustPost(t, q, &wr.SendWR{ID: 6, Opcode: wr.Send, SGL: []wr.SGE{{Addr: m.rmr.Addr(), Length: 1, LKey: m.rmr.LKey()}}})
	wcs = m.s.WaitWC(m.s.EP[1].SCQ, 3, time.Second)
	if wcs[0].WRID != 4 || wcs[0].Status != cq.Success || wcs[1].WRID != 5 || wcs[1].Status != cq.MWBindErr || wcs[1].Opcode != cq.OpBindMW ||
		wcs[2].WRID != 6 || wcs[2].Status != cq.WRFlushErr {
		t.Fatalf("completions %+v", wcs)
	}
	if q.State() != qpstate.Err || m.mw.RKey() != k {
		t.Fatalf("state %v key %#x", q.State(), m.mw.RKey())
	}
}

// LOCAL_INV of an ordinary region still works, and of a bad key fails
// LOC_QP_OP_ERR.
func TestLocalInvRegion(t *testing.T) {
	m := newMWSim(t)
	enginetest.MustPost(t, m.qps[1], &wr.SendWR{ID: 1, Opcode: wr.LocalInv, InvRKey: m.rmr.RKey()})
	enginetest.MustPost(t, m.qps[1], &wr.SendWR{ID: 2, Opcode: wr.LocalInv, Flags: wr.Signaled, InvRKey: m.rmr.RKey() ^ 0x80})
	if wc := m.s.WaitWC(m.s.EP[1].SCQ, 1, time.Second)[0]; wc.WRID != 2 || wc.Status != cq.LocQPOpErr || wc.Opcode != cq.OpLocalInv {
		t.Fatalf("completion %+v", wc)
	}
	// The QP is in ERR now; the first LOCAL_INV ran before the failure.
	if err := m.s.EP[1].MRs.CheckRemote(m.s.EP[1].PD, m.rmr.RKey(), m.rmr.Addr(), 8, memreg.AccessRemoteRead); err == nil {
		t.Fatal("region still valid after LOCAL_INV")
	}
}

// A SEND with invalidate arriving on another QP than the one the type 2
// window is bound to, or naming a type 1 window, is refused (class J: the
// receive completes REM_INV_REQ_ERR, the QP goes to ERR) and the window
// stays usable on its own QP.
func TestMWSendWithInvalidateRefused(t *testing.T) {
	for _, tc := range []string{"other QP", "type 1"} {
		t.Run(tc, func(t *testing.T) {
			m := newMWSim(t)
			b := m.s.Connect(enginetest.QPOpts{PMTU: 1024, Timeout: 14, Retry: 7, RNRRetry: 7})
			k := m.bind(t, m.qps[1], 0, 4096, 0x31)
			if tc == "type 1" {
				ep := m.s.EP[1]
				mw1, _ := ep.MRs.AllocMW(ep.PD, memreg.MWType1)
				var err error
				if k, err = ep.MRs.BindMW(mw1, ep.PD, b[1].Num(), memreg.Bind{MRKey: m.rmr.LKey(), Addr: m.rmr.Addr(), Length: 4096, Access: memreg.Access(rw)}); err != nil {
					t.Fatal(err)
				}
			}
			if err := b[1].PostRecv(&wr.RecvWR{ID: 9, SGL: []wr.SGE{{Addr: m.rmr.Addr() + 6000, Length: 64, LKey: m.rmr.LKey()}}}); err != nil {
				t.Fatal(err)
			}
			enginetest.MustPost(t, b[0], &wr.SendWR{ID: 3, Opcode: wr.SendWithInv, Flags: wr.Signaled, InvRKey: k,
				SGL: []wr.SGE{{Addr: m.lmr.Addr(), Length: 8, LKey: m.lmr.LKey()}}})
			if rc := m.s.WaitWC(m.s.EP[1].RCQ, 1, time.Second)[0]; rc.Status != cq.RemInvReqErr || rc.WRID != 9 || rc.Flags&cq.FlagWithInv != 0 {
				t.Fatalf("receive completion %+v", rc)
			}
			if b[1].State() != qpstate.Err {
				t.Fatalf("state %v", b[1].State())
			}
			m.s.WaitWC(m.s.EP[0].SCQ, 1, time.Second) // the SEND itself (ACKed, as rxe)
			if st := m.op(t, m.qps[0], wr.RDMARead, 0, 8, m.rmr.Addr(), k); st != cq.Success {
				t.Fatalf("window after the refused invalidate: %v", st)
			}
		})
	}
}
