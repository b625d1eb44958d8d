package interop

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/softroce/softroce/conformance/agent"
	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/verbs"
)

// TestMWAgainstRxe: kernel rxe as the requester through softroce's memory
// windows. rxe WRITEs and READs through a type 1 window (bound with
// MW.Bind, whose work request completes BIND_MW) and a type 2 window
// (bound by a BIND_MW work request on the connected QP), every byte checked on both sides; then rxe's SEND_WITH_INV
// invalidates the type 2 window, softroce's receive completes WITH_INV
// with its rkey, and rxe's next READ through it fails REM_ACCESS_ERR.
func TestMWAgainstRxe(t *testing.T) {
	needVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p := connectPair(t, ctx, 1024)
	const n, winOff, winLen = 20000, 64 << 10, 128 << 10
	wbuf := make([]byte, 256<<10)
	// The region grants no remote right itself: only the windows do.
	wmr, err := p.pd.RegMR(wbuf, verbs.AccessLocalWrite|verbs.AccessMWBind)
	if err != nil {
		t.Fatal(err)
	}
	winAddr := wmr.Addr() + winOff

	through := func(name string, rkey uint32, seed byte) {
		t.Helper()
		data := pattern(n, seed)
		if err := p.ag.WriteMem(ctx, p.amr, 0, data); err != nil {
			t.Fatal(err)
		}
		p.agentPost(t, ctx, agent.SendWR{Op: agent.OpWrite, Off: 0, Len: n, RemoteAddr: winAddr + 100, RKey: rkey})
		var same, untouched bool
		p.mem(func() {
			same = bytes.Equal(wbuf[winOff+100:winOff+100+n], data)
			untouched = wbuf[winOff+99] == 0 && wbuf[winOff+100+n] == 0
		})
		if !same || !untouched {
			t.Fatalf("%s: rxe WRITE through the window: data differs (%v) or spilled (%v)", name, !same, !untouched)
		}
		back := pattern(n, seed+1)
		p.mem(func() { copy(wbuf[winOff+40000:], back) })
		p.agentPost(t, ctx, agent.SendWR{Op: agent.OpRead, Off: bufLen / 2, Len: n, RemoteAddr: winAddr + 40000, RKey: rkey})
		got, err := p.ag.ReadMem(ctx, p.amr, bufLen/2, n)
		if err != nil || !bytes.Equal(got, back) {
			t.Fatalf("%s: rxe READ through the window: data differs (%v)", name, err)
		}
		p.mem(func() { clear(wbuf) })
	}

	mw1, err := p.pd.AllocMW(verbs.MWType1)
	if err != nil {
		t.Fatal(err)
	}
	wcs := make([]verbs.WC, 1)
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	// ibv_bind_mw: the bind is a work request on the QP; its key is known
	// at once, and it completes with BIND_MW.
	p.wrID++
	k1, err := mw1.Bind(p.qp, verbs.MWBindInfo{MR: wmr, Addr: winAddr, Length: winLen, Access: verbs.AccessRemoteRead | verbs.AccessRemoteWrite}, p.wrID, verbs.SendSignaled)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.cq.Wait(wctx, wcs); err != nil || wcs[0].Status != 0 || wcs[0].Opcode != cq.OpBindMW || wcs[0].WRID != p.wrID || mw1.RKey() != k1 {
		t.Fatalf("type 1 bind completion %+v (%v)", wcs[0], err)
	}
	through("type 1", k1, 11)
	p.wrID++
	if _, err := mw1.Bind(p.qp, verbs.MWBindInfo{}, p.wrID, verbs.SendSignaled); err != nil {
		t.Fatal(err)
	}
	if _, err := p.cq.Wait(wctx, wcs); err != nil || wcs[0].Status != 0 || wcs[0].WRID != p.wrID {
		t.Fatalf("type 1 unbind completion %+v (%v)", wcs[0], err)
	}

	mw2, err := p.pd.AllocMW(verbs.MWType2)
	if err != nil {
		t.Fatal(err)
	}
	k2 := verbs.IncRKey(mw2.RKey())
	p.wrID++
	bw := mw2.BindWR(p.wrID, verbs.SendSignaled, wmr, winAddr, winLen, verbs.AccessRemoteRead|verbs.AccessRemoteWrite, k2)
	if err := p.qp.PostSend(&bw); err != nil {
		t.Fatal(err)
	}
	if _, err := p.cq.Wait(wctx, wcs); err != nil || wcs[0].Status != 0 || wcs[0].Opcode != cq.OpBindMW || mw2.RKey() != k2 {
		t.Fatalf("BIND_MW completion %+v (%v)", wcs[0], err)
	}
	through("type 2", k2, 22)

	// SEND_WITH_INV from rxe names the type 2 window.
	if err := p.qp.PostRecv(&verbs.RecvWR{ID: 4242, SGL: []verbs.SGE{{Addr: p.mr.Addr(), Length: 4096, LKey: p.mr.LKey()}}}); err != nil {
		t.Fatal(err)
	}
	msg := pattern(777, 33)
	if err := p.ag.WriteMem(ctx, p.amr, 0, msg); err != nil {
		t.Fatal(err)
	}
	p.agentPost(t, ctx, agent.SendWR{Op: agent.OpSendInv, Off: 0, Len: len(msg), RKey: k2})
	if _, err := p.cq.Wait(wctx, wcs); err != nil || wcs[0].WRID != 4242 || wcs[0].Status != 0 || wcs[0].Flags&cq.FlagWithInv == 0 ||
		wcs[0].InvalidatedRKey != k2 || wcs[0].ByteLen != uint32(len(msg)) {
		t.Fatalf("softroce receive of SEND_WITH_INV %+v (%v)", wcs[0], err)
	}
	var same bool
	p.mem(func() { same = bytes.Equal(p.buf[:len(msg)], msg) })
	if !same {
		t.Fatal("SEND_WITH_INV data differs")
	}
	// The invalidated window refuses rxe's READ.
	p.wrID++
	if err := p.ag.PostSend(ctx, p.aqp, agent.SendWR{WRID: p.wrID, Op: agent.OpRead, MR: p.amr, Off: 0, Len: 64, RemoteAddr: winAddr, RKey: k2}); err != nil {
		t.Fatal(err)
	}
	wc, err := p.ag.Poll(ctx, p.acq, 20*time.Second)
	if err != nil || wc == nil || wc.Status != agent.WCRemAccessErr {
		t.Fatalf("rxe READ through the invalidated window: %+v (%v), want REM_ACCESS_ERR", wc, err)
	}
}

// TestRxeMWFromSoftroce: the other role, softroce as the requester through
// rxe's windows: a type 1 window bound with ibv_bind_mw and a type 2 one
// bound by a BIND_MW work request, softroce WRITEs and READs through them
// (every byte checked), then its SEND_WITH_INV invalidates the type 2
// window: rxe's receive succeeds and softroce's next READ through the
// window completes REM_ACCESS_ERR.
func TestRxeMWFromSoftroce(t *testing.T) {
	needVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p := connectPair(t, ctx, 4096)
	const n, winOff, winLen = 30000, 64 << 10, 128 << 10
	wmr, err := p.ag.RegMR(ctx, p.apd, 256<<10, agent.AccessLocalWrite|agent.AccessMWBind)
	if err != nil {
		t.Fatal(err)
	}
	winAddr := wmr.Addr + winOff
	bind := func(typ int) agent.MW {
		t.Helper()
		mw, err := p.ag.AllocMW(ctx, p.apd, typ)
		if err != nil {
			t.Fatal(err)
		}
		old := mw.RKey
		p.wrID++
		if err := p.ag.BindMW(ctx, p.aqp, p.wrID, &mw, wmr, winOff, winLen, agent.AccessRemoteRead|agent.AccessRemoteWrite, true); err != nil {
			t.Fatal(err)
		}
		wc, err := p.ag.Poll(ctx, p.acq, 20*time.Second)
		if err != nil || wc == nil || wc.Status != 0 || wc.WRID != p.wrID || wc.Opcode != 5 /* IBV_WC_BIND_MW */ || mw.RKey == old {
			t.Fatalf("rxe bind of a type %d window: %+v (%v), rkey %#x -> %#x", typ, wc, err, old, mw.RKey)
		}
		return mw
	}
	through := func(name string, rkey uint32, seed byte) {
		t.Helper()
		data := pattern(n, seed)
		p.mem(func() { copy(p.buf, data) })
		p.post(t, verbs.SendWR{Opcode: verbs.WRRDMAWrite, SGL: []verbs.SGE{{Addr: p.mr.Addr(), Length: n, LKey: p.mr.LKey()}},
			RemoteAddr: winAddr + 100, RKey: rkey})
		got, err := p.ag.ReadMem(ctx, wmr, winOff+99, n+2)
		if err != nil || !bytes.Equal(got[1:n+1], data) || got[0] != 0 || got[n+1] != 0 {
			t.Fatalf("%s: WRITE through rxe's window: data differs or spilled (%v)", name, err)
		}
		back := pattern(n, seed+1)
		if err := p.ag.WriteMem(ctx, wmr, winOff+50000, back); err != nil {
			t.Fatal(err)
		}
		wc := p.post(t, verbs.SendWR{Opcode: verbs.WRRDMARead, SGL: []verbs.SGE{{Addr: p.mr.Addr() + bufLen/2, Length: n, LKey: p.mr.LKey()}},
			RemoteAddr: winAddr + 50000, RKey: rkey})
		var same bool
		p.mem(func() { same = bytes.Equal(p.buf[bufLen/2:bufLen/2+n], back) })
		if wc.ByteLen != n || !same {
			t.Fatalf("%s: READ through rxe's window: data differs", name)
		}
		if err := p.ag.Fill(ctx, wmr, 0, 256<<10, 0); err != nil {
			t.Fatal(err)
		}
	}
	mw1 := bind(1)
	through("type 1", mw1.RKey, 41)
	mw2 := bind(2)
	through("type 2", mw2.RKey, 52)

	if err := p.ag.PostRecv(ctx, p.aqp, 777, p.amr, 0, 4096); err != nil {
		t.Fatal(err)
	}
	msg := pattern(500, 61)
	p.mem(func() { copy(p.buf, msg) })
	p.post(t, verbs.SendWR{Opcode: verbs.WRSendWithInv, InvRKey: mw2.RKey, SGL: []verbs.SGE{{Addr: p.mr.Addr(), Length: uint32(len(msg)), LKey: p.mr.LKey()}}})
	wc, err := p.ag.Poll(ctx, p.acq, 20*time.Second)
	// What proves the invalidation is the READ below. rxe's completion
	// flags and invalidated_rkey are only logged: through this agent they
	// do not read as libibverbs' IBV_WC_WITH_INV and the IETH rkey.
	if err != nil || wc == nil || wc.Status != 0 || wc.WRID != 777 || wc.ByteLen != uint32(len(msg)) {
		t.Fatalf("rxe receive of SEND_WITH_INV: %+v (%v), rkey %#x", wc, err, mw2.RKey)
	}
	t.Logf("rxe receive of SEND_WITH_INV of %#x: wc_flags %#x, imm/invalidated_rkey field %#x", mw2.RKey, wc.Flags, wc.Imm)
	got, err := p.ag.ReadMem(ctx, p.amr, 0, len(msg))
	if err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("SEND_WITH_INV data differs in rxe (%v)", err)
	}
	p.wrID++
	if err := p.qp.PostSend(&verbs.SendWR{ID: p.wrID, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
		SGL: []verbs.SGE{{Addr: p.mr.Addr(), Length: 64, LKey: p.mr.LKey()}}, RemoteAddr: winAddr, RKey: mw2.RKey}); err != nil {
		t.Fatal(err)
	}
	wcs := make([]verbs.WC, 1)
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	defer wcancel()
	if _, err := p.cq.Wait(wctx, wcs); err != nil || wcs[0].Status != cq.RemAccessErr {
		t.Fatalf("READ through rxe's invalidated window: %+v (%v), want REM_ACCESS_ERR", wcs[0], err)
	}
}

// TestMWLocalInvAgainstRxe: LOCAL_INV of a type 2 window, in each role. rxe
// invalidates its window and softroce's next READ through it completes
// REM_ACCESS_ERR; softroce invalidates its window and rxe's next READ
// completes REM_ACCESS_ERR.
func TestMWLocalInvAgainstRxe(t *testing.T) {
	needVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	t.Run("rxe-window", func(t *testing.T) {
		p := connectPair(t, ctx, 1024)
		wmr, err := p.ag.RegMR(ctx, p.apd, 64<<10, agent.AccessLocalWrite|agent.AccessMWBind)
		if err != nil {
			t.Fatal(err)
		}
		mw, err := p.ag.AllocMW(ctx, p.apd, 2)
		if err != nil {
			t.Fatal(err)
		}
		p.wrID++
		if err := p.ag.BindMW(ctx, p.aqp, p.wrID, &mw, wmr, 0, 64<<10, agent.AccessRemoteRead, false); err != nil {
			t.Fatal(err)
		}
		data := pattern(5000, 71)
		if err := p.ag.WriteMem(ctx, wmr, 0, data); err != nil {
			t.Fatal(err)
		}
		p.post(t, verbs.SendWR{Opcode: verbs.WRRDMARead, SGL: []verbs.SGE{{Addr: p.mr.Addr(), Length: 5000, LKey: p.mr.LKey()}},
			RemoteAddr: wmr.Addr, RKey: mw.RKey})
		var same bool
		p.mem(func() { same = bytes.Equal(p.buf[:5000], data) })
		if !same {
			t.Fatal("READ through rxe's window: data differs")
		}
		p.wrID++
		if err := p.ag.LocalInv(ctx, p.aqp, p.wrID, mw.RKey, true); err != nil {
			t.Fatal(err)
		}
		wc, err := p.ag.Poll(ctx, p.acq, 20*time.Second)
		if err != nil || wc == nil || wc.Status != 0 || wc.Opcode != 6 /* IBV_WC_LOCAL_INV */ {
			t.Fatalf("rxe LOCAL_INV completion %+v (%v)", wc, err)
		}
		p.wrID++
		if err := p.qp.PostSend(&verbs.SendWR{ID: p.wrID, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
			SGL: []verbs.SGE{{Addr: p.mr.Addr(), Length: 64, LKey: p.mr.LKey()}}, RemoteAddr: wmr.Addr, RKey: mw.RKey}); err != nil {
			t.Fatal(err)
		}
		wcs := make([]verbs.WC, 1)
		wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
		defer wcancel()
		if _, err := p.cq.Wait(wctx, wcs); err != nil || wcs[0].Status != cq.RemAccessErr {
			t.Fatalf("READ after rxe's LOCAL_INV: %+v (%v), want REM_ACCESS_ERR", wcs[0], err)
		}
	})
	t.Run("softroce-window", func(t *testing.T) {
		p := connectPair(t, ctx, 1024)
		wbuf := make([]byte, 64<<10)
		wmr, err := p.pd.RegMR(wbuf, verbs.AccessLocalWrite|verbs.AccessMWBind)
		if err != nil {
			t.Fatal(err)
		}
		mw, err := p.pd.AllocMW(verbs.MWType2)
		if err != nil {
			t.Fatal(err)
		}
		bw := mw.BindWR(0, 0, wmr, wmr.Addr(), 64<<10, verbs.AccessRemoteRead, verbs.IncRKey(mw.RKey()))
		if wc := p.post(t, bw); wc.Opcode != cq.OpBindMW {
			t.Fatalf("bind completion %+v", wc)
		}
		data := pattern(5000, 72)
		p.mem(func() { copy(wbuf, data) })
		p.agentPost(t, ctx, agent.SendWR{Op: agent.OpRead, Off: 0, Len: 5000, RemoteAddr: wmr.Addr(), RKey: mw.RKey()})
		got, err := p.ag.ReadMem(ctx, p.amr, 0, 5000)
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("rxe READ through softroce's window: data differs (%v)", err)
		}
		p.post(t, verbs.SendWR{Opcode: verbs.WRLocalInv, InvRKey: mw.RKey()})
		p.wrID++
		if err := p.ag.PostSend(ctx, p.aqp, agent.SendWR{WRID: p.wrID, Op: agent.OpRead, MR: p.amr, Off: 0, Len: 64, RemoteAddr: wmr.Addr(), RKey: mw.RKey()}); err != nil {
			t.Fatal(err)
		}
		wc, err := p.ag.Poll(ctx, p.acq, 20*time.Second)
		if err != nil || wc == nil || wc.Status != agent.WCRemAccessErr {
			t.Fatalf("rxe READ after softroce's LOCAL_INV: %+v (%v), want REM_ACCESS_ERR", wc, err)
		}
	})
}
