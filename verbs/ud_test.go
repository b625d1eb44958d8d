package verbs

import (
	"bytes"
	"errors"
	"testing"

	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/internal/devsync"
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
			SrcQP: from.qp.Num(), Flags: cq.FlagGRH | cq.FlagWithImm, ImmData: 77}
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

// TestGSIOverPipe: each device's QP1 exchanges a 256-byte MAD with the
// other's (RemoteQPN 1, Q_Key 0x80010000) into a 296-byte buffer; QP1 is
// unique per device, drops datagrams with another Q_Key, and can be made
// again once destroyed.
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
	// A datagram to QP1 with another Q_Key is dropped; then a MAD.
	for _, qk := range []uint32{0x1234, GSIQKey} {
		if err := sides[0].qp.PostSend(mad(qk)); err != nil {
			t.Fatal(err)
		}
		if wc := waitOne(t, sides[0].cq, "send"); wc.Status != cq.Success {
			t.Fatalf("send %+v", wc)
		}
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
