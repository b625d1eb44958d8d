package verbs

import (
	"bytes"
	"errors"
	"testing"

	"github.com/softroce/softroce/cq"
)

func TestQueryDeviceMW(t *testing.T) {
	a, _ := openPair(t)
	at := a.QueryDevice()
	if at.MaxMW <= 0 || at.DeviceCapFlags&DeviceMemWindow == 0 || at.DeviceCapFlags&DeviceMemWindowType2B == 0 {
		t.Fatalf("max_mw %d caps %#x", at.MaxMW, at.DeviceCapFlags)
	}
	if DeviceMemWindow != 0x20000 || DeviceMemWindowType2B != 0x1000000 || IncRKey(0x123456ff) != 0x12345600 {
		t.Fatal("ibv constants")
	}
}

// Windows over a nic/pipe link: a type 1 window bound with MW.Bind and a
// type 2 one bound with a BIND_MW work request; the peer WRITEs and READs
// through their rkeys (every byte checked), then invalidates the type 2
// window with a SEND_WITH_INV and is refused afterwards.
func TestMWOverPipe(t *testing.T) {
	a, b := openPair(t)
	pda, _ := a.AllocPD()
	pdb, _ := b.AllocPD()
	bufa := make([]byte, 16384)
	mra, _ := pda.RegMR(bufa, AccessLocalWrite)
	bufb := make([]byte, 16384)
	// The region itself grants no remote rights: only the windows do.
	mrb, err := pdb.RegMR(bufb, AccessLocalWrite|AccessMWBind)
	if err != nil {
		t.Fatal(err)
	}
	p := connectPair(t, a, b, pda, pdb, &ConnectOptions{Timeout: 16, RetryCnt: 2})

	for i := range bufa[:8192] {
		bufa[i] = byte(i*13 + i>>8 + 1)
	}
	check := func(name string, rkey uint32, roff int) {
		t.Helper()
		if wc := p.post(t, SendWR{ID: 1, Opcode: WRRDMAWrite, RemoteAddr: mrb.Addr() + uint64(roff), RKey: rkey,
			SGL: []SGE{{Addr: mra.Addr(), Length: 4000, LKey: mra.LKey()}}}); wc.Status != cq.Success {
			t.Fatalf("%s: WRITE %v", name, wc.Status)
		}
		if !bytes.Equal(bufb[roff:roff+4000], bufa[:4000]) {
			t.Fatalf("%s: WRITE data differs", name)
		}
		if wc := p.post(t, SendWR{ID: 2, Opcode: WRRDMARead, RemoteAddr: mrb.Addr() + uint64(roff), RKey: rkey,
			SGL: []SGE{{Addr: mra.Addr() + 8192, Length: 4000, LKey: mra.LKey()}}}); wc.Status != cq.Success || wc.ByteLen != 4000 {
			t.Fatalf("%s: READ %+v", name, wc)
		}
		if !bytes.Equal(bufa[8192:12192], bufa[:4000]) {
			t.Fatalf("%s: READ data differs", name)
		}
		clear(bufa[8192:12192])
	}

	// Type 1.
	mw1, err := pdb.AllocMW(MWType1)
	if err != nil {
		t.Fatal(err)
	}
	k0 := mw1.RKey()
	k1, err := mw1.Bind(p.qb, MWBindInfo{MR: mrb, Addr: mrb.Addr(), Length: 8192, Access: AccessRemoteRead | AccessRemoteWrite}, 31, SendSignaled)
	if err != nil || k1 == k0 || k1 != IncRKey(k0) || mw1.RKey() != k1 {
		t.Fatalf("type 1 bind: %#x %v", k1, err)
	}
	if wc := waitOne(t, p.cb, "type 1 bind"); wc.Status != cq.Success || wc.Opcode != cq.OpBindMW || wc.WRID != 31 {
		t.Fatalf("type 1 bind completion %+v", wc)
	}
	check("type 1", k1, 100)
	if err := b.DeregMR(mrb); !errors.Is(err, ErrBusy) {
		t.Fatalf("dereg with a window bound: %v", err)
	}
	if _, err := mw1.Bind(p.qb, MWBindInfo{}, 32, SendSignaled); err != nil {
		t.Fatalf("unbind: %v", err)
	}
	if wc := waitOne(t, p.cb, "type 1 unbind"); wc.Status != cq.Success || wc.WRID != 32 {
		t.Fatalf("type 1 unbind completion %+v", wc)
	}

	// Type 2.
	mw2, _ := pdb.AllocMW(MWType2)
	if _, err := mw2.Bind(p.qb, MWBindInfo{MR: mrb, Addr: mrb.Addr(), Length: 8, Access: AccessRemoteRead}, 1, 0); err == nil {
		t.Fatal("MW.Bind accepted a type 2 window")
	}
	k2 := IncRKey(mw2.RKey())
	bw := mw2.BindWR(9, SendSignaled, mrb, mrb.Addr()+4096, 8192, AccessRemoteRead|AccessRemoteWrite, k2)
	if err := p.qb.PostSend(&bw); err != nil {
		t.Fatal(err)
	}
	if wc := waitOne(t, p.cb, "bind"); wc.Status != cq.Success || wc.Opcode != cq.OpBindMW || wc.WRID != 9 || mw2.RKey() != k2 {
		t.Fatalf("bind completion %+v, key %#x", wc, mw2.RKey())
	}
	check("type 2", k2, 4096+200)

	if err := p.qb.PostRecv(&RecvWR{ID: 7, SGL: []SGE{{Addr: mrb.Addr() + 12800, Length: 64, LKey: mrb.LKey()}}}); err != nil {
		t.Fatal(err)
	}
	if wc := p.post(t, SendWR{ID: 3, Opcode: WRSendWithInv, InvRKey: k2, SGL: []SGE{{Addr: mra.Addr(), Length: 33, LKey: mra.LKey()}}}); wc.Status != cq.Success {
		t.Fatalf("SEND_WITH_INV %v", wc.Status)
	}
	if wc := waitOne(t, p.cb, "receive"); wc.Status != cq.Success || wc.Flags&cq.FlagWithInv == 0 || wc.InvalidatedRKey != k2 || wc.ByteLen != 33 ||
		!bytes.Equal(bufb[12800:12833], bufa[:33]) {
		t.Fatalf("receive %+v", wc)
	}
	if wc := p.post(t, SendWR{ID: 4, Opcode: WRRDMARead, RemoteAddr: mrb.Addr() + 4096, RKey: k2,
		SGL: []SGE{{Addr: mra.Addr(), Length: 8, LKey: mra.LKey()}}}); wc.Status != cq.RemAccessErr {
		t.Fatalf("READ after invalidation: %v", wc.Status)
	}
	if err := mw1.Dealloc(); err != nil {
		t.Fatal(err)
	}
	if err := mw2.Dealloc(); err != nil {
		t.Fatal(err)
	}
	if err := b.DeregMR(mrb); err != nil {
		t.Fatal(err)
	}
}

// The bind-MW verb checks at post time what ibv_bind_mw checks (a range
// without a region, a region of another PD than the window's, a QP not
// ready to send); what the bind rules refuse (here LOCAL_WRITE among a
// window's rights) completes MW_BIND_ERR after the send work requests
// before it and moves the QP to ERR. The key Bind returned is then the window's RKey, naming no binding.
func TestMWType1BindErrors(t *testing.T) {
	a, b := openPair(t)
	pda, _ := a.AllocPD()
	pdb, _ := b.AllocPD()
	other, _ := b.AllocPD()
	bufa := make([]byte, 4096)
	mra, _ := pda.RegMR(bufa, AccessLocalWrite|AccessRemoteWrite)
	bufb := make([]byte, 4096)
	mrb, _ := pdb.RegMR(bufb, AccessLocalWrite|AccessMWBind)
	mro, _ := other.RegMR(make([]byte, 64), AccessLocalWrite|AccessMWBind)
	p := connectPair(t, a, b, pda, pdb, &ConnectOptions{Timeout: 8, RetryCnt: 2})
	mw1, _ := pdb.AllocMW(MWType1)
	k0 := mw1.RKey()
	if _, err := mw1.Bind(p.qb, MWBindInfo{Addr: 64, Length: 8}, 1, SendSignaled); err == nil {
		t.Fatal("bind of a range without a region")
	}
	if _, err := mw1.Bind(p.qb, MWBindInfo{MR: mro, Addr: mro.Addr(), Length: 8, Access: AccessRemoteRead}, 1, SendSignaled); err == nil {
		t.Fatal("bind to a region of another PD")
	}
	cq0, _ := b.CreateCQ(4)
	idle, _ := pdb.CreateQP(QPInitAttr{SendCQ: cq0, RecvCQ: cq0})
	if _, err := mw1.Bind(idle, MWBindInfo{MR: mrb, Addr: mrb.Addr(), Length: 8, Access: AccessRemoteRead}, 1, SendSignaled); err == nil {
		t.Fatal("bind on a QP in RESET")
	}
	if mw1.RKey() != k0 {
		t.Fatal("a bind refused at post time changed the key")
	}
	// A WRITE to a, then the bad bind, then a SEND: WRITE succeeds, the
	// bind fails, the SEND is flushed.
	if err := p.qb.PostSend(&SendWR{ID: 1, Opcode: WRRDMAWrite, Flags: SendSignaled, RemoteAddr: mra.Addr(), RKey: mra.RKey(),
		SGL: []SGE{{Addr: mrb.Addr(), Length: 1000, LKey: mrb.LKey()}}}); err != nil {
		t.Fatal(err)
	}
	k, err := mw1.Bind(p.qb, MWBindInfo{MR: mrb, Addr: mrb.Addr(), Length: 64, Access: AccessRemoteRead | AccessLocalWrite}, 2, 0)
	if err != nil || k != IncRKey(k0) || mw1.RKey() != k {
		t.Fatalf("bind posted: %#x %v", k, err)
	}
	if err := p.qb.PostSend(&SendWR{ID: 3, Opcode: WRSend, Flags: SendSignaled, SGL: []SGE{{Addr: mrb.Addr(), Length: 8, LKey: mrb.LKey()}}}); err != nil {
		t.Fatal(err)
	}
	want := []struct {
		id uint64
		st cq.Status
		op cq.Opcode
	}{{1, cq.Success, cq.OpRDMAWrite}, {2, cq.MWBindErr, cq.OpBindMW}, {3, cq.WRFlushErr, 0}}
	for _, w := range want {
		wc := waitOne(t, p.cb, "completion")
		if wc.WRID != w.id || wc.Status != w.st || (w.op != 0 && wc.Opcode != w.op) {
			t.Fatalf("completion %+v, want WR %d %v", wc, w.id, w.st)
		}
	}
	if st := p.qb.State(); st != StateErr {
		t.Fatalf("QP state %v", st)
	}
}

// BindKey gives a type 1 window exactly the key it names, whatever the
// window's key was: binds posted on two QPs may run in either order (as
// the library's ibv_bind_mw computes keys before the daemon posts them).
// A key with another index is refused at post time and changes nothing.
func TestMWBindKey(t *testing.T) {
	a, b := openPair(t)
	pda, _ := a.AllocPD()
	pdb, _ := b.AllocPD()
	bufa := make([]byte, 4096)
	mra, _ := pda.RegMR(bufa, AccessLocalWrite)
	bufb := make([]byte, 4096)
	mrb, _ := pdb.RegMR(bufb, AccessLocalWrite|AccessMWBind)
	p1 := connectPair(t, a, b, pda, pdb, &ConnectOptions{Timeout: 16, RetryCnt: 2})
	p2 := connectPair(t, a, b, pda, pdb, &ConnectOptions{Timeout: 16, RetryCnt: 2})
	mw, _ := pdb.AllocMW(MWType1)
	k0 := mw.RKey()
	info := MWBindInfo{MR: mrb, Addr: mrb.Addr(), Length: 4096, Access: AccessRemoteWrite}
	for _, k := range []uint32{k0 ^ 0x100, k0 ^ 0x80000000, 0} {
		if k>>8 == k0>>8 {
			continue
		}
		if err := mw.BindKey(p1.qb, info, k, 1, SendSignaled); err == nil || mw.RKey() != k0 {
			t.Fatalf("BindKey %#x of a window %#x: %v, key now %#x", k, k0, err, mw.RKey())
		}
	}
	write := func(rkey uint32) cq.Status {
		t.Helper()
		return p1.post(t, SendWR{ID: 5, Opcode: WRRDMAWrite, RemoteAddr: mrb.Addr(), RKey: rkey,
			SGL: []SGE{{Addr: mra.Addr(), Length: 8, LKey: mra.LKey()}}}).Status
	}
	// The second key "goes back" from the first, as when the later call's
	// bind is drained first: each bind takes its own key.
	kA, kB := k0&^0xff|(k0+7)&0xff, k0&^0xff|(k0+3)&0xff
	for i, s := range []struct {
		qp  *QP
		c   *CQ
		key uint32
	}{{p2.qb, p2.cb, kA}, {p1.qb, p1.cb, kB}} {
		if err := mw.BindKey(s.qp, info, s.key, uint64(10+i), SendSignaled); err != nil || mw.RKey() != s.key {
			t.Fatalf("BindKey %#x: %v, RKey %#x", s.key, err, mw.RKey())
		}
		if wc := waitOne(t, s.c, "bind"); wc.Status != cq.Success || wc.Opcode != cq.OpBindMW || wc.WRID != uint64(10+i) {
			t.Fatalf("bind %#x: %+v", s.key, wc)
		}
	}
	if st := write(kB); st != cq.Success {
		t.Fatalf("WRITE with the last bound key: %v", st)
	}
	if st := write(kA); st != cq.RemAccessErr {
		t.Fatalf("WRITE with the key of the earlier binding: %v", st)
	}
	// Bind still steps from the key BindKey gave.
	if k, err := mw.Bind(p2.qb, info, 20, SendSignaled); err != nil || k != IncRKey(kB) {
		t.Fatalf("Bind after BindKey: %#x %v", k, err)
	}
}
