package verbs

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"testing"

	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/internal/devsync"
	"github.com/softroce/softroce/nic/pipe"
	"github.com/softroce/softroce/qpstate"
)

// udSide is one device's UD QP for the tests.
type udSide struct {
	d   *Device
	pd  *PD
	cq  *CQ
	qp  *QP
	mr  *MR
	buf []byte
	ah  *AH // to the other side
}

func newUDSide(t *testing.T, d *Device, qkey uint32) *udSide {
	t.Helper()
	s := &udSide{d: d, buf: make([]byte, 8192)}
	s.pd, _ = d.AllocPD()
	s.cq, _ = d.CreateCQ(64)
	var err error
	s.mr, err = s.pd.RegMR(s.buf, AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	s.qp, err = s.pd.CreateQP(QPInitAttr{Type: QPTypeUD, SendCQ: s.cq, RecvCQ: s.cq})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.qp.ReadyUD(qkey, 0x100); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestUDOverPipe: UD SENDs both ways between two devices through address
// handles; receives carry the GRH and the UD completion fields; Query
// reports the Q_Key.
func TestUDOverPipe(t *testing.T) {
	a, b := openPair(t)
	sa, sb := newUDSide(t, a, 0x1234), newUDSide(t, b, 0x5678)
	ga, _ := a.QueryGID(0)
	gb, _ := b.QueryGID(0)
	var err error
	if sa.ah, err = sa.pd.CreateAH(AHAttr{DGID: gb, HopLimit: 64}); err != nil {
		t.Fatal(err)
	}
	if sb.ah, err = sb.pd.CreateAH(AHAttr{DGID: ga, HopLimit: 64}); err != nil {
		t.Fatal(err)
	}
	attr, init := sb.qp.Query()
	if attr.QKey != 0x5678 || attr.State != StateRTS || init.Type != QPTypeUD {
		t.Fatalf("Query: %+v %+v", attr, init)
	}
	for _, dir := range []struct {
		from, to *udSide
		fromGID  GID
		qkey     uint32
	}{{sa, sb, ga, 0x5678}, {sb, sa, gb, 0x1234}} {
		from, to := dir.from, dir.to
		copy(from.buf, "hello over UD, 31 bytes long...")
		if err := to.qp.PostRecv(&RecvWR{ID: 9, SGL: []SGE{{Addr: to.mr.Addr() + 4096, Length: GRHLen + 1024, LKey: to.mr.LKey()}}}); err != nil {
			t.Fatal(err)
		}
		if err := from.qp.PostSend(&SendWR{ID: 1, Opcode: WRSendWithImm, Imm: 77, Flags: SendSignaled,
			SGL: []SGE{{Addr: from.mr.Addr(), Length: 31, LKey: from.mr.LKey()}},
			AH:  from.ah.AV(), RemoteQPN: to.qp.Num(), RemoteQKey: dir.qkey}); err != nil {
			t.Fatal(err)
		}
		if wc := waitOne(t, from.cq, "send"); wc.Status != cq.Success || wc.WRID != 1 {
			t.Fatalf("send completion %+v", wc)
		}
		wc := waitOne(t, to.cq, "receive")
		want := WC{WRID: 9, Status: cq.Success, Opcode: cq.OpRecv, ByteLen: GRHLen + 31, QPNum: to.qp.Num(),
			SrcQP: from.qp.Num(), Flags: cq.FlagGRH | cq.FlagWithImm, ImmData: 77, IPVersion: 4}
		if wc != want {
			t.Fatalf("receive\n got %+v\nwant %+v", wc, want)
		}
		var got []byte
		devsync.Run(to.d, func() { got = append(got, to.buf[4096:4096+GRHLen+31]...) })
		src := dir.fromGID.Addr().As4()
		if !bytes.Equal(got[:20], make([]byte, 20)) || got[20] != 0x45 || !bytes.Equal(got[32:36], src[:]) || string(got[40:]) != "hello over UD, 31 bytes long..." {
			t.Fatalf("buffer %x", got)
		}
	}
	if err := sa.pd.Dealloc(); !errors.Is(err, ErrBusy) {
		t.Fatalf("Dealloc with an AH: %v", err)
	}
	if err := sa.ah.Destroy(); err != nil {
		t.Fatal(err)
	}
	if err := sa.ah.Destroy(); err == nil {
		t.Fatal("second AH destroy succeeded")
	}
}

// TestCreateAHChecks: the checks of ibv_create_ah.
func TestCreateAHChecks(t *testing.T) {
	a, b := openPair(t)
	pd, _ := a.AllocPD()
	gb, _ := b.QueryGID(0)
	v6 := GID{0xfd, 15: 1}
	for _, bad := range []AHAttr{
		{DGID: gb, SGIDIndex: 1},
		{DGID: gb, SGIDIndex: -1},
		{},
		{DGID: gb, FlowLabel: 1 << 20},
		{DGID: gb, SL: 16},
		{DGID: v6},
	} {
		if _, err := pd.CreateAH(bad); err == nil {
			t.Errorf("CreateAH(%+v) accepted", bad)
		}
	}
	ah, err := pd.CreateAH(AHAttr{DGID: gb, FlowLabel: 0x12345, TrafficClass: 3, HopLimit: 9, SL: 2})
	if err != nil {
		t.Fatal(err)
	}
	if av := ah.AV(); av.Remote != gb.Addr() || av.FlowLabel != 0x12345 || av.TrafficClass != 3 || av.HopLimit != 9 || av.SL != 2 || !av.Local.IsValid() {
		t.Fatalf("AV %+v", av)
	}
	if ah.Attr().FlowLabel != 0x12345 {
		t.Fatalf("Attr %+v", ah.Attr())
	}
}

// TestUDModifyRules: UD QPs follow the UD attribute masks (Q_Key at INIT;
// no path attributes), an RC QP refuses ReadyUD, a UD QP refuses RC
// opcodes, and a UD message longer than the port MTU completes without
// being sent.
func TestUDModifyRules(t *testing.T) {
	a, b := openPair(t)
	pd, _ := a.AllocPD()
	c, _ := a.CreateCQ(16)
	qp, err := pd.CreateQP(QPInitAttr{Type: QPTypeUD, SendCQ: c, RecvCQ: c})
	if err != nil {
		t.Fatal(err)
	}
	// INIT without the Q_Key is refused (IBV_QP_QKEY is required for UD).
	if err := qp.Modify(&QPAttr{State: StateInit, Port: 1}, qpstate.AttrState|qpstate.AttrPKeyIndex|qpstate.AttrPort); err == nil {
		t.Fatal("UD INIT without QKEY accepted")
	}
	if err := qp.Modify(&QPAttr{State: StateInit, Port: 1, QKey: 5}, qpstate.AttrState|qpstate.AttrPKeyIndex|qpstate.AttrPort|qpstate.AttrQKey); err != nil {
		t.Fatal(err)
	}
	// RTR with an address vector is an RC attribute.
	if err := qp.Modify(&QPAttr{State: StateRTR}, qpstate.AttrState|qpstate.AttrAV); err == nil {
		t.Fatal("UD RTR with AV accepted")
	}
	if err := qp.Modify(&QPAttr{State: StateRTR}, qpstate.AttrState); err != nil {
		t.Fatal(err)
	}
	if err := qp.Modify(&QPAttr{State: StateRTS, SQPSN: 1, QKey: 6}, qpstate.AttrState|qpstate.AttrSQPSN|qpstate.AttrQKey); err != nil {
		t.Fatal(err)
	}
	if at, _ := qp.Query(); at.QKey != 6 {
		t.Fatalf("QKey after RTS %#x", at.QKey)
	}
	rcqp, _ := pd.CreateQP(QPInitAttr{SendCQ: c, RecvCQ: c})
	if err := rcqp.ReadyUD(1, 1); err == nil {
		t.Fatal("ReadyUD on an RC QP accepted")
	}
	gb, _ := b.QueryGID(0)
	ah, _ := pd.CreateAH(AHAttr{DGID: gb})
	buf := make([]byte, 4096)
	mr, _ := pd.RegMR(buf, AccessLocalWrite)
	if err := qp.PostSend(&SendWR{Opcode: WRRDMAWrite, SGL: []SGE{{Addr: mr.Addr(), Length: 8, LKey: mr.LKey()}}, AH: ah.AV()}); err == nil {
		t.Fatal("RDMA WRITE on UD accepted")
	}
	before := a.Stats().TxPackets
	if err := qp.PostSend(&SendWR{ID: 3, Opcode: WRSend, Flags: SendSignaled, SGL: []SGE{{Addr: mr.Addr(), Length: uint32(a.QueryPort().ActiveMTU + 1), LKey: mr.LKey()}}, AH: ah.AV(), RemoteQPN: 2}); err != nil {
		t.Fatal(err)
	}
	if wc := waitOne(t, c, "send"); wc.Status != cq.Success || wc.WRID != 3 {
		t.Fatalf("completion %+v", wc)
	}
	if got := a.Stats().TxPackets; got != before {
		t.Fatalf("a message above the MTU sent %d packets", got-before)
	}
}

// TestGSIOverPipe: one device's QP1 sends a 256-byte MAD to the other's
// (RemoteQPN 1) into a 296-byte buffer, with Q_Key 0x80010000 whatever the
// work request says; QP1 is unique per device, drops datagrams with
// another Q_Key, and can be made again once destroyed.
func TestGSIOverPipe(t *testing.T) {
	a, b := openPair(t)
	var sides [2]*udSide
	for i, d := range []*Device{a, b} {
		s := &udSide{d: d, buf: make([]byte, 4096)}
		s.pd, _ = d.AllocPD()
		s.cq, _ = d.CreateCQ(64)
		s.mr, _ = s.pd.RegMR(s.buf, AccessLocalWrite)
		var err error
		if s.qp, err = d.CreateGSI(s.pd, s.cq, s.cq, QPCap{}); err != nil {
			t.Fatal(err)
		}
		if s.qp.Num() != 1 || s.qp.State() != StateRTS {
			t.Fatalf("GSI QP %d in %v", s.qp.Num(), s.qp.State())
		}
		if at, _ := s.qp.Query(); at.QKey != GSIQKey {
			t.Fatalf("GSI Q_Key %#x", at.QKey)
		}
		sides[i] = s
	}
	if _, err := a.CreateGSI(sides[0].pd, sides[0].cq, sides[0].cq, QPCap{}); !errors.Is(err, ErrBusy) {
		t.Fatalf("second CreateGSI: %v", err)
	}
	if _, err := a.CreateGSI(sides[1].pd, sides[0].cq, sides[0].cq, QPCap{}); err == nil {
		t.Fatal("CreateGSI with another device's PD accepted")
	}
	ga, _ := a.QueryGID(0)
	gb, _ := b.QueryGID(0)
	ah, _ := sides[0].pd.CreateAH(AHAttr{DGID: gb})
	for i := range 256 {
		sides[0].buf[i] = byte(i)
	}
	rb := sides[1]
	for k := range 2 {
		if err := rb.qp.PostRecv(&RecvWR{ID: uint64(k), SGL: []SGE{{Addr: rb.mr.Addr() + 1024 + uint64(k)*512, Length: GRHLen + 256, LKey: rb.mr.LKey()}}}); err != nil {
			t.Fatal(err)
		}
	}
	mad := func(qkey uint32) *SendWR {
		return &SendWR{ID: 5, Opcode: WRSend, Flags: SendSignaled, SGL: []SGE{{Addr: sides[0].mr.Addr(), Length: 256, LKey: sides[0].mr.LKey()}},
			AH: ah.AV(), RemoteQPN: 1, RemoteQKey: qkey}
	}
	// A datagram to QP1 from a UD QP with another Q_Key is dropped; QP1
	// itself always sends Q_Key 0x80010000, whatever the work request says.
	other := newUDSide(t, a, 0x1234)
	oah, _ := other.pd.CreateAH(AHAttr{DGID: gb})
	if err := other.qp.PostSend(&SendWR{ID: 6, Opcode: WRSend, Flags: SendSignaled, AH: oah.AV(), RemoteQPN: 1, RemoteQKey: 0x1234}); err != nil {
		t.Fatal(err)
	}
	if wc := waitOne(t, other.cq, "send"); wc.Status != cq.Success {
		t.Fatalf("send %+v", wc)
	}
	if err := sides[0].qp.PostSend(mad(0x1234)); err != nil {
		t.Fatal(err)
	}
	if wc := waitOne(t, sides[0].cq, "send"); wc.Status != cq.Success {
		t.Fatalf("send %+v", wc)
	}
	wc := waitOne(t, rb.cq, "receive")
	if wc.WRID != 0 || wc.ByteLen != GRHLen+256 || wc.SrcQP != 1 || wc.QPNum != 1 || wc.Flags != cq.FlagGRH {
		t.Fatalf("MAD receive %+v", wc)
	}
	if st := b.Stats(); st.RxBadQKey != 1 {
		t.Fatalf("stats %+v", st)
	}
	var got []byte
	devsync.Run(b, func() { got = append(got, rb.buf[1024:1024+GRHLen+256]...) })
	src := ga.Addr().As4()
	if !bytes.Equal(got[32:36], src[:]) || !bytes.Equal(got[GRHLen:], sides[0].buf[:256]) {
		t.Fatalf("MAD buffer %x", got[:64])
	}
	if err := sides[0].qp.Destroy(); err != nil {
		t.Fatal(err)
	}
	if q, err := a.CreateGSI(sides[0].pd, sides[0].cq, sides[0].cq, QPCap{}); err != nil || q.Num() != 1 {
		t.Fatalf("CreateGSI after destroy: %v", err)
	}
}

// TestAHFromWC: an address handle built from a UD receive's completion
// and GRH answers the sender (ibv_create_ah_from_wc), for the IPv4 layout
// the transport writes and an IPv6 one.
func TestAHFromWC(t *testing.T) {
	a, b := openPair(t)
	sa, sb := newUDSide(t, a, 7), newUDSide(t, b, 7)
	gb, _ := b.QueryGID(0)
	ga, _ := a.QueryGID(0)
	ah, err := sa.pd.CreateAH(AHAttr{DGID: gb})
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.qp.PostRecv(&RecvWR{ID: 1, SGL: []SGE{{Addr: sb.mr.Addr(), Length: GRHLen + 64, LKey: sb.mr.LKey()}}}); err != nil {
		t.Fatal(err)
	}
	if err := sa.qp.PostSend(&SendWR{ID: 1, Opcode: WRSend, AH: ah.AV(), RemoteQPN: sb.qp.Num(), RemoteQKey: 7}); err != nil {
		t.Fatal(err)
	}
	wc := waitOne(t, sb.cq, "receive")
	var grh []byte
	devsync.Run(b, func() { grh = append(grh, sb.buf[:GRHLen]...) })
	back, err := sb.pd.CreateAHFromWC(&wc, grh)
	if err != nil {
		t.Fatal(err)
	}
	if at := back.Attr(); at.DGID != ga || at.SGIDIndex != 0 || at.HopLimit != 0xff {
		t.Fatalf("AH back %+v", at)
	}
	// The answer arrives.
	if err := sa.qp.PostRecv(&RecvWR{ID: 2, SGL: []SGE{{Addr: sa.mr.Addr(), Length: GRHLen, LKey: sa.mr.LKey()}}}); err != nil {
		t.Fatal(err)
	}
	if err := sb.qp.PostSend(&SendWR{ID: 2, Opcode: WRSend, AH: back.AV(), RemoteQPN: wc.SrcQP, RemoteQKey: 7}); err != nil {
		t.Fatal(err)
	}
	if w := waitOne(t, sa.cq, "answer"); w.WRID != 2 || w.SrcQP != sb.qp.Num() {
		t.Fatalf("answer %+v", w)
	}
	// IPv6 layout: the traffic class and flow label come back; a
	// destination not in the GID table or no GRH flag is refused.
	g6 := make([]byte, GRHLen)
	binary.BigEndian.PutUint32(g6, 6<<28|0xa0<<20|0x12345)
	copy(g6[8:], netip.MustParseAddr("fd00::1").AsSlice())
	copy(g6[24:], netip.MustParseAddr("fd00::2").AsSlice())
	if _, err := b.AHAttrFromWC(&wc, g6); err == nil {
		t.Fatal("GRH to an address not in the GID table accepted")
	}
	if _, err := b.AHAttrFromWC(&WC{}, grh); err == nil {
		t.Fatal("completion without a GRH accepted")
	}
	la, _ := pipe.New(pipe.Config{AddrA: netip.MustParseAddr("fd00::2"), AddrB: netip.MustParseAddr("fd00::1")})
	d6, err := Open(la, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d6.Close()
	at, err := d6.AHAttrFromWC(&wc, g6)
	if err != nil || at.DGID != GIDFromAddr(netip.MustParseAddr("fd00::1")) || at.TrafficClass != 0xa0 || at.FlowLabel != 0x12345 {
		t.Fatalf("IPv6 AH attr %+v %v", at, err)
	}
}

// TestUDOnSRQ: a UD QP created on an SRQ takes its receives from it; a
// datagram too long for the WQE it takes completes that WQE
// REM_INV_REQ_ERR and the QP carries on.
func TestUDOnSRQ(t *testing.T) {
	a, b := openPair(t)
	sa := newUDSide(t, a, 9)
	pd, _ := b.AllocPD()
	c, _ := b.CreateCQ(16)
	buf := make([]byte, 4096)
	mr, _ := pd.RegMR(buf, AccessLocalWrite)
	srq, err := pd.CreateSRQ(SRQInitAttr{MaxWR: 4})
	if err != nil {
		t.Fatal(err)
	}
	qp, err := pd.CreateQP(QPInitAttr{Type: QPTypeUD, SendCQ: c, RecvCQ: c, SRQ: srq})
	if err != nil {
		t.Fatal(err)
	}
	if err := qp.ReadyUD(9, 0); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := srq.PostRecv(&RecvWR{ID: uint64(i), SGL: []SGE{{Addr: mr.Addr() + uint64(i)*1024, Length: GRHLen + 64, LKey: mr.LKey()}}}); err != nil {
			t.Fatal(err)
		}
	}
	gb, _ := b.QueryGID(0)
	ah, _ := sa.pd.CreateAH(AHAttr{DGID: gb})
	for _, n := range []uint32{65, 64} {
		if err := sa.qp.PostSend(&SendWR{Opcode: WRSend, SGL: []SGE{{Addr: sa.mr.Addr(), Length: n, LKey: sa.mr.LKey()}}, AH: ah.AV(), RemoteQPN: qp.Num(), RemoteQKey: 9}); err != nil {
			t.Fatal(err)
		}
	}
	if w := waitOne(t, c, "too long"); w.WRID != 0 || w.Status != cq.RemInvReqErr {
		t.Fatalf("completion %+v", w)
	}
	if w := waitOne(t, c, "fits"); w.WRID != 1 || w.Status != cq.Success || w.ByteLen != GRHLen+64 {
		t.Fatalf("completion %+v", w)
	}
	if qp.State() != StateRTS {
		t.Fatalf("QP in %v", qp.State())
	}
}

// TestUDOverIPv6: on an IPv6 link the GRH is the IPv6 header, and the
// address handle back to the sender built from it answers.
func TestUDOverIPv6(t *testing.T) {
	la, lb := pipe.New(pipe.Config{AddrA: netip.MustParseAddr("fd00::1"), AddrB: netip.MustParseAddr("fd00::2")})
	a, err := Open(la, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := Open(lb, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	sa, sb := newUDSide(t, a, 3), newUDSide(t, b, 3)
	gb, _ := b.QueryGID(0)
	ah, err := sa.pd.CreateAH(AHAttr{DGID: gb})
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.qp.PostRecv(&RecvWR{ID: 1, SGL: []SGE{{Addr: sb.mr.Addr(), Length: GRHLen + 16, LKey: sb.mr.LKey()}}}); err != nil {
		t.Fatal(err)
	}
	copy(sa.buf, "sixteen bytes..!")
	if err := sa.qp.PostSend(&SendWR{ID: 1, Opcode: WRSend, SGL: []SGE{{Addr: sa.mr.Addr(), Length: 16, LKey: sa.mr.LKey()}}, AH: ah.AV(), RemoteQPN: sb.qp.Num(), RemoteQKey: 3}); err != nil {
		t.Fatal(err)
	}
	wc := waitOne(t, sb.cq, "receive")
	var g []byte
	devsync.Run(b, func() { g = append(g, sb.buf[:GRHLen+16]...) })
	if g[0]>>4 != 6 || g[6] != 17 || binary.BigEndian.Uint16(g[4:]) != 8+12+8+16+4 ||
		!bytes.Equal(g[8:24], netip.MustParseAddr("fd00::1").AsSlice()) || !bytes.Equal(g[24:40], netip.MustParseAddr("fd00::2").AsSlice()) ||
		string(g[40:]) != "sixteen bytes..!" || wc.ByteLen != GRHLen+16 {
		t.Fatalf("IPv6 GRH %x, completion %+v", g, wc)
	}
	back, err := sb.pd.CreateAHFromWC(&wc, g)
	if err != nil {
		t.Fatal(err)
	}
	if at := back.Attr(); at.DGID != GIDFromAddr(netip.MustParseAddr("fd00::1")) {
		t.Fatalf("AH back %+v", at)
	}
}
