package rc

import (
	"strings"
	"testing"
	"time"

	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/memreg"
	"github.com/softroce/softroce/qpstate"
	"github.com/softroce/softroce/transport/internal/enginetest"
	"github.com/softroce/softroce/wr"
)

// verbBind is the work request the bind-MW verb posts for a type 1 window.
func verbBind(id uint64, flags wr.SendFlags, key uint32, mr *memreg.MR, off, n uint64) wr.SendWR {
	return wr.SendWR{ID: id, Opcode: wr.BindMW, Flags: flags, Bind: wr.MWBind{RKey: key, MRKey: mr.LKey(),
		Addr: mr.Addr() + off, Length: n, Access: rw}}
}

// The bind-MW verb's work request for a type 1 window runs in send-queue
// order: behind a WRITE it completes after it, with BIND_MW, the WR ID and
// the QP; the window takes the key chosen at post time only then; an
// unsignaled one completes silently, unless sq_sig_all; the peer reaches
// the new binding, and an earlier key fails.
func TestMWType1VerbBind(t *testing.T) {
	m := newMWSim(t)
	ep := m.s.EP[1]
	q := m.qps[1]
	mw1, err := ep.MRs.AllocMW(ep.PD, memreg.MWType1)
	if err != nil {
		t.Fatal(err)
	}
	k0 := mw1.RKey()
	k1 := k0&^0xFF | (k0+1)&0xFF
	// Endpoint 1 WRITEs 3000 bytes into endpoint 0's region, then binds.
	enginetest.MustPost(t, q, &wr.SendWR{ID: 1, Opcode: wr.RDMAWrite, Flags: wr.Signaled,
		SGL: []wr.SGE{{Addr: m.rmr.Addr(), Length: 3000, LKey: m.rmr.LKey()}}, RemoteAddr: m.lmr.Addr(), RKey: m.lmr.LKey()})
	b := verbBind(2, wr.Signaled, k1, m.rmr, 0, 4096)
	if err := q.PostBindMW(&b, mw1); err != nil {
		t.Fatal(err)
	}
	if mw1.RKey() != k0 {
		t.Fatal("the bind ran when posted")
	}
	wcs := m.s.WaitWC(ep.SCQ, 2, time.Second)
	if wcs[0].WRID != 1 || wcs[0].Opcode != cq.OpRDMAWrite || wcs[1].WRID != 2 || wcs[1].Opcode != cq.OpBindMW ||
		wcs[1].Status != cq.Success || wcs[1].QPNum != q.Num() {
		t.Fatalf("completions %+v", wcs)
	}
	if mw1.RKey() != k1 {
		t.Fatalf("window key %#x, want %#x", mw1.RKey(), k1)
	}
	if st := m.op(t, m.qps[0], wr.RDMARead, 0, 64, m.rmr.Addr()+100, k1); st != cq.Success {
		t.Fatalf("read through the window: %v", st)
	}
	// Unsignaled rebind to [0, 64), then a signaled WRITE: one completion.
	k2 := k1&^0xFF | (k1+1)&0xFF
	b = verbBind(3, 0, k2, m.rmr, 0, 64)
	if err := q.PostBindMW(&b, mw1); err != nil {
		t.Fatal(err)
	}
	enginetest.MustPost(t, q, &wr.SendWR{ID: 4, Opcode: wr.RDMAWrite, Flags: wr.Signaled,
		SGL: []wr.SGE{{Addr: m.rmr.Addr(), Length: 8, LKey: m.rmr.LKey()}}, RemoteAddr: m.lmr.Addr(), RKey: m.lmr.LKey()})
	if wc := m.s.WaitWC(ep.SCQ, 1, time.Second)[0]; wc.WRID != 4 || wc.Status != cq.Success {
		t.Fatalf("completion %+v", wc)
	}
	if n := ep.SCQ.Poll(make([]cq.WC, 4)); n != 0 {
		t.Fatalf("%d completions for an unsignaled bind", n)
	}
	if _, _, length, _, ok := mw1.Bound(); !ok || length != 64 || mw1.RKey() != k2 {
		t.Fatalf("window after the unsignaled bind: %v %d %#x", ok, length, mw1.RKey())
	}
	// With sq_sig_all an unsignaled bind completes too.
	m.s.EP[1].E.SignalAllFor(q, true)
	k3 := incKey(k2)
	b = verbBind(5, 0, k3, m.rmr, 0, 128)
	if err := q.PostBindMW(&b, mw1); err != nil {
		t.Fatal(err)
	}
	if wc := m.s.WaitWC(ep.SCQ, 1, time.Second)[0]; wc.WRID != 5 || wc.Opcode != cq.OpBindMW || wc.Status != cq.Success || mw1.RKey() != k3 {
		t.Fatalf("sq_sig_all bind completion %+v", wc)
	}
	if st := m.op(t, m.qps[0], wr.RDMARead, 0, 64, m.rmr.Addr(), k1); st != cq.RemAccessErr {
		t.Fatalf("read with an earlier key: %v", st)
	}
}

// A type 1 bind that fails when it runs (here: past the region's end)
// completes MW_BIND_ERR after the WRITE before it, flushes what follows,
// moves the QP to ERR and leaves the window as it was. A BIND_MW work
// request naming a type 1 window is refused when posted, and the verb's
// path refuses a type 2 window.
func TestMWType1VerbBindError(t *testing.T) {
	m := newMWSim(t)
	ep := m.s.EP[1]
	q := m.qps[1]
	mw1, _ := ep.MRs.AllocMW(ep.PD, memreg.MWType1)
	k0 := mw1.RKey()
	direct := wr.SendWR{ID: 9, Opcode: wr.BindMW, Bind: wr.MWBind{MWKey: k0, RKey: k0 ^ 1, MRKey: m.rmr.LKey(), Addr: m.rmr.Addr(), Length: 8, Access: rw}}
	if err := q.PostSend(&direct); err == nil || !strings.Contains(err.Error(), "type 1") {
		t.Fatalf("BIND_MW for a type 1 window: %v", err)
	}
	b := verbBind(9, 0, incKey(m.mw.RKey()), m.rmr, 0, 8)
	if err := q.PostBindMW(&b, m.mw); err == nil {
		t.Fatal("the bind-MW verb path took a type 2 window")
	}
	enginetest.MustPost(t, q, &wr.SendWR{ID: 1, Opcode: wr.RDMAWrite, Flags: wr.Signaled,
		SGL: []wr.SGE{{Addr: m.rmr.Addr(), Length: 2000, LKey: m.rmr.LKey()}}, RemoteAddr: m.lmr.Addr(), RKey: m.lmr.LKey()})
	b = verbBind(2, 0, incKey(k0), m.rmr, 8000, 500) // unsignaled: errors complete anyway
	if err := q.PostBindMW(&b, mw1); err != nil {
		t.Fatal(err)
	}
	enginetest.MustPost(t, q, &wr.SendWR{ID: 3, Opcode: wr.RDMAWrite, Flags: wr.Signaled,
		SGL: []wr.SGE{{Addr: m.rmr.Addr(), Length: 8, LKey: m.rmr.LKey()}}, RemoteAddr: m.lmr.Addr(), RKey: m.lmr.LKey()})
	wcs := m.s.WaitWC(ep.SCQ, 3, time.Second)
	if wcs[0].WRID != 1 || wcs[0].Status != cq.Success || wcs[1].WRID != 2 || wcs[1].Status != cq.MWBindErr ||
		wcs[1].Opcode != cq.OpBindMW || wcs[2].WRID != 3 || wcs[2].Status != cq.WRFlushErr {
		t.Fatalf("completions %+v", wcs)
	}
	if q.State() != qpstate.Err {
		t.Fatalf("QP state %v", q.State())
	}
	if _, _, _, _, ok := mw1.Bound(); ok || mw1.RKey() != k0 {
		t.Fatalf("window changed by a failed bind: %v %#x", ok, mw1.RKey())
	}
}

// A type 1 bind of a window of another PD than the QP's completes in error.
func TestMWType1VerbBindOtherPD(t *testing.T) {
	m := newMWSim(t)
	ep := m.s.EP[1]
	other, _ := ep.MRs.AllocPD()
	mw1, _ := ep.MRs.AllocMW(other, memreg.MWType1)
	b := verbBind(5, wr.Signaled, incKey(mw1.RKey()), m.rmr, 0, 64)
	if err := m.qps[1].PostBindMW(&b, mw1); err != nil {
		t.Fatal(err)
	}
	if wc := m.s.WaitWC(ep.SCQ, 1, time.Second)[0]; wc.Status != cq.MWBindErr || m.qps[1].State() != qpstate.Err {
		t.Fatalf("completion %+v, state %v", wc, m.qps[1].State())
	}
}

func incKey(k uint32) uint32 { return k&^0xFF | (k+1)&0xFF }
