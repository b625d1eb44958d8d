package ud

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/memreg"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/qpstate"
	"github.com/softroce/softroce/transport/engine"
	"github.com/softroce/softroce/transport/internal/enginetest"
	_ "github.com/softroce/softroce/transport/rc" // the RC QPs UD packets must not reach
	"github.com/softroce/softroce/wr"
)

// TestUDExchange: SEND and SEND_WITH_IMM each become one packet, land
// behind a 40-byte GRH, and complete on both sides with the UD fields; no
// packet comes back (no ACK).
func TestUDExchange(t *testing.T) {
	s := enginetest.NewSim(t, 1, enginetest.Impairment{})
	s.Keep = true
	qps := s.UDQPs(enginetest.UDOpts{})
	lmr, local := s.Reg(0, 4096)
	rmr, remote := s.Reg(1, 4096)
	enginetest.Fill(local, 3)
	enginetest.PostRecvSGE(t, qps[1], 7, wr.SGE{Addr: rmr.Addr(), Length: 40 + 1000, LKey: rmr.LKey()})
	enginetest.PostRecvSGE(t, qps[1], 8, wr.SGE{Addr: rmr.Addr() + 2048, Length: 40 + 100, LKey: rmr.LKey()})
	enginetest.MustPost(t, qps[0], s.UDSend(0, qps[1], 1, wr.SGE{Addr: lmr.Addr(), Length: 1000, LKey: lmr.LKey()}))
	imm := s.UDSend(0, qps[1], 2, wr.SGE{Addr: lmr.Addr() + 1000, Length: 100, LKey: lmr.LKey()})
	imm.Opcode, imm.Imm, imm.Flags = wr.SendWithImm, 0xcafef00d, wr.Signaled|wr.Solicited
	enginetest.MustPost(t, qps[0], imm)
	rwc := s.WaitWC(s.EP[1].RCQ, 2, time.Second)
	swc := s.WaitWC(s.EP[0].SCQ, 2, time.Second)
	for i, wc := range swc {
		if wc.Status != cq.Success || wc.WRID != uint64(i+1) || wc.Opcode != cq.OpSend {
			t.Fatalf("send completion %d: %+v", i, wc)
		}
	}
	want := []cq.WC{
		{WRID: 7, Status: cq.Success, Opcode: cq.OpRecv, ByteLen: 1040, QPNum: qps[1].Num(), SrcQP: qps[0].Num(), Flags: cq.FlagGRH, IPVersion: 4},
		{WRID: 8, Status: cq.Success, Opcode: cq.OpRecv, ByteLen: 140, QPNum: qps[1].Num(), SrcQP: qps[0].Num(), Flags: cq.FlagGRH | cq.FlagWithImm, ImmData: 0xcafef00d, IPVersion: 4},
	}
	for i := range want {
		if rwc[i] != want[i] {
			t.Fatalf("receive completion %d\n got %+v\nwant %+v", i, rwc[i], want[i])
		}
	}
	if !bytes.Equal(remote[40:1040], local[:1000]) || !bytes.Equal(remote[2048+40:2048+140], local[1000:1100]) {
		t.Fatal("payload not behind the GRH")
	}
	if a, err := SourceOfGRH(remote[:40]); err != nil || a != s.EP[0].Addr {
		t.Fatalf("GRH source %v %v", a, err)
	}
	if st := s.EP[1].E.Stats(); st.TxPackets != 0 {
		t.Fatalf("the UD receiver sent %d packets", st.TxPackets)
	}
	if len(s.Trace) != 2 || s.Trace[0] != "0>1 UD SEND_ONLY psn=100" || s.Trace[1] != "0>1 UD SEND_ONLY_WITH_IMMEDIATE psn=101" {
		t.Fatalf("trace %q", s.Trace)
	}
}

// TestUDQKeyRule: a work request Q_Key with the high-order bit set sends
// the QP's own Q_Key; a packet whose Q_Key is not the receiver's is
// dropped and counted, and its WQE stays for the next one.
func TestUDQKeyRule(t *testing.T) {
	s := enginetest.NewSim(t, 1, enginetest.Impairment{})
	qps := s.UDQPs(enginetest.UDOpts{QKey: [2]uint32{0x0000abcd, 0x0000abcd}})
	lmr, _ := s.Reg(0, 256)
	rmr, _ := s.Reg(1, 256)
	sent := enginetest.Capture(s.EP[0].E)
	enginetest.PostRecvSGE(t, qps[1], 9, wr.SGE{Addr: rmr.Addr(), Length: 200, LKey: rmr.LKey()})
	w := s.UDSend(0, qps[1], 1, wr.SGE{Addr: lmr.Addr(), Length: 16, LKey: lmr.LKey()})
	w.RemoteQKey = 0xabce // not the receiver's
	enginetest.MustPost(t, qps[0], w)
	s.Pump(nil, time.Millisecond)
	if st := s.EP[1].E.Stats(); st.RxBadQKey != 1 || s.EP[1].RCQ.Len() != 0 {
		t.Fatalf("mismatching Q_Key: stats %+v, %d completions", st, s.EP[1].RCQ.Len())
	}
	w.RemoteQKey = 0x80000000 // the QP's own: 0xabcd
	enginetest.MustPost(t, qps[0], w)
	wcs := s.WaitWC(s.EP[1].RCQ, 1, time.Second)
	if wcs[0].WRID != 9 || wcs[0].Status != cq.Success {
		t.Fatalf("completion %+v", wcs[0])
	}
	var p bth.Packet
	for i, want := range []uint32{0xabce, 0xabcd} {
		if err := bth.Parse(&p, (*sent)[i]); err != nil || p.DETH.QKey() != want || p.DETH.SrcQP() != qps[0].Num() || p.BTH.AckReq() {
			t.Fatalf("packet %d: %v qkey %#x srcqp %d ackreq %v", i, err, p.DETH.QKey(), p.DETH.SrcQP(), p.BTH.AckReq())
		}
	}
	if st := qps[1].Stats(); st.Dropped != 1 {
		t.Fatalf("QP stats %+v", st)
	}
}

// TestUDTooLongDropped: a datagram whose payload does not fit the WQE
// behind the GRH is dropped and counted, and the WQE stays for the next
// datagram; an empty receive queue drops and counts too. Nothing is
// answered.
func TestUDTooLongDropped(t *testing.T) {
	s := enginetest.NewSim(t, 1, enginetest.Impairment{})
	qps := s.UDQPs(enginetest.UDOpts{})
	lmr, _ := s.Reg(0, 4096)
	rmr, _ := s.Reg(1, 4096)
	enginetest.MustPost(t, qps[0], s.UDSend(0, qps[1], 1, wr.SGE{Addr: lmr.Addr(), Length: 8, LKey: lmr.LKey()}))
	s.Pump(nil, time.Millisecond)
	enginetest.PostRecvSGE(t, qps[1], 5, wr.SGE{Addr: rmr.Addr(), Length: 40 + 100, LKey: rmr.LKey()})
	enginetest.MustPost(t, qps[0], s.UDSend(0, qps[1], 2, wr.SGE{Addr: lmr.Addr(), Length: 101, LKey: lmr.LKey()}))
	s.Pump(nil, time.Millisecond)
	st := s.EP[1].E.Stats()
	if st.RxUDNoRecv != 1 || st.RxUDTooLong != 1 || s.EP[1].RCQ.Len() != 0 || st.TxPackets != 0 {
		t.Fatalf("stats %+v, %d completions", st, s.EP[1].RCQ.Len())
	}
	enginetest.MustPost(t, qps[0], s.UDSend(0, qps[1], 3, wr.SGE{Addr: lmr.Addr(), Length: 100, LKey: lmr.LKey()}))
	wcs := s.WaitWC(s.EP[1].RCQ, 1, time.Second)
	if wcs[0].WRID != 5 || wcs[0].ByteLen != 140 || wcs[0].Status != cq.Success {
		t.Fatalf("completion %+v", wcs[0])
	}
	if qps[1].State() != qpstate.RTS {
		t.Fatalf("receiver in %v", qps[1].State())
	}
	if sw := s.WaitWC(s.EP[0].SCQ, 3, time.Second); sw[2].Status != cq.Success {
		t.Fatalf("send completions %+v", sw)
	}
}

// TestUDSendLongerThanMTU: a message longer than the MTU sends nothing and
// completes successfully (IBTA C10-93.1.1, as rxe does); the next one goes.
func TestUDSendLongerThanMTU(t *testing.T) {
	s := enginetest.NewSim(t, 1, enginetest.Impairment{})
	s.Keep = true
	qps := s.UDQPs(enginetest.UDOpts{PMTU: 1024})
	lmr, _ := s.Reg(0, 4096)
	rmr, _ := s.Reg(1, 4096)
	enginetest.PostRecvSGE(t, qps[1], 5, wr.SGE{Addr: rmr.Addr(), Length: 4096, LKey: rmr.LKey()})
	enginetest.MustPost(t, qps[0], s.UDSend(0, qps[1], 1, wr.SGE{Addr: lmr.Addr(), Length: 1025, LKey: lmr.LKey()}))
	enginetest.MustPost(t, qps[0], s.UDSend(0, qps[1], 2, wr.SGE{Addr: lmr.Addr(), Length: 1024, LKey: lmr.LKey()}))
	swc := s.WaitWC(s.EP[0].SCQ, 2, time.Second)
	if swc[0].WRID != 1 || swc[0].Status != cq.Success || swc[1].WRID != 2 || swc[1].Status != cq.Success {
		t.Fatalf("send completions %+v", swc)
	}
	rwc := s.WaitWC(s.EP[1].RCQ, 1, time.Second)
	if rwc[0].ByteLen != 40+1024 {
		t.Fatalf("receive %+v", rwc[0])
	}
	if len(s.Trace) != 1 || s.Trace[0] != "0>1 UD SEND_ONLY psn=101" {
		t.Fatalf("trace %q", s.Trace)
	}
}

// TestUDPostChecks: UD refuses other opcodes and a missing address handle
// at post time, and sends nothing before RTS.
func TestUDPostChecks(t *testing.T) {
	s := enginetest.NewSim(t, 1, enginetest.Impairment{})
	qps := s.UDQPs(enginetest.UDOpts{})
	lmr, _ := s.Reg(0, 256)
	sge := wr.SGE{Addr: lmr.Addr(), Length: 8, LKey: lmr.LKey()}
	for _, op := range []wr.Opcode{wr.RDMAWrite, wr.RDMARead, wr.AtomicCmpAndSwp, wr.SendWithInv} {
		w := s.UDSend(0, qps[1], 1, sge)
		w.Opcode = op
		if err := qps[0].PostSend(w); !errors.Is(err, ErrOpcode) {
			t.Errorf("%v on UD: %v", op, err)
		}
	}
	w := s.UDSend(0, qps[1], 1, sge)
	w.AH = nil
	if err := qps[0].PostSend(w); err == nil {
		t.Error("no address handle accepted")
	}
	// A UD QP in RTR receives but does not send.
	qp, _ := s.EP[0].E.CreateQP(engine.QPConfig{Type: qpstate.UD, PD: s.EP[0].PD, SendCQ: s.EP[0].SCQ, RecvCQ: s.EP[0].RCQ, MaxSendWR: 4, MaxRecvWR: 4})
	qp.SetState(qpstate.Init)
	qp.SetState(qpstate.RTR)
	if err := qp.PostSend(s.UDSend(0, qps[1], 1, sge)); !errors.Is(err, engine.ErrState) {
		t.Errorf("post send in RTR: %v", err)
	}
}

// TestUDStates: a UD QP receives only from RTR on (RESET and INIT drop),
// and a UD packet to an RC QP or an RC packet to a UD QP is dropped.
func TestUDStates(t *testing.T) {
	s := enginetest.NewSim(t, 1, enginetest.Impairment{})
	qps := s.UDQPs(enginetest.UDOpts{})
	lmr, _ := s.Reg(0, 256)
	rmr, _ := s.Reg(1, 256)
	e1 := s.EP[1].E
	qp, _ := e1.CreateQP(engine.QPConfig{Type: qpstate.UD, PD: s.EP[1].PD, SendCQ: s.EP[1].SCQ, RecvCQ: s.EP[1].RCQ, MaxSendWR: 4, MaxRecvWR: 4})
	qp.SetState(qpstate.Init)
	qp.SetPath(engine.Path{PMTU: 1024, QKey: enginetest.QKey})
	enginetest.PostRecvSGE(t, qp, 1, wr.SGE{Addr: rmr.Addr(), Length: 200, LKey: rmr.LKey()})
	enginetest.MustPost(t, qps[0], s.UDSend(0, qp, 1, wr.SGE{Addr: lmr.Addr(), Length: 8, LKey: lmr.LKey()}))
	s.Pump(nil, time.Millisecond)
	if st := e1.Stats(); st.RxUnknownQP != 1 || s.EP[1].RCQ.Len() != 0 {
		t.Fatalf("INIT: stats %+v", st)
	}
	qp.SetState(qpstate.RTR)
	enginetest.MustPost(t, qps[0], s.UDSend(0, qp, 2, wr.SGE{Addr: lmr.Addr(), Length: 8, LKey: lmr.LKey()}))
	if wcs := s.WaitWC(s.EP[1].RCQ, 1, time.Second); wcs[0].Status != cq.Success || wcs[0].QPNum != qp.Num() {
		t.Fatalf("RTR: %+v", wcs)
	}
	// An RC QP on endpoint 1: the UD packet is of another service.
	rcq := s.Connect(enginetest.QPOpts{})
	enginetest.MustPost(t, qps[0], s.UDSend(0, rcq[1], 3, wr.SGE{Addr: lmr.Addr(), Length: 8, LKey: lmr.LKey()}))
	before := e1.Stats().RxBadHeader
	s.Pump(nil, time.Millisecond)
	if got := e1.Stats().RxBadHeader; got != before+1 {
		t.Fatalf("UD packet to an RC QP: RxBadHeader %d -> %d", before, got)
	}
}

// udPacket builds a UD SEND_ONLY to dst as a link would deliver it.
func udPacket(_ testing.TB, from, to netip.AddrPort, local netip.Addr, dst, src, qkey uint32, payload []byte) nic.Packet {
	buf := make([]byte, engine.MaxPacket)
	n := WriteHeaders(buf, &Send{Opcode: wr.Send, DestQP: dst, SrcQP: src, QKey: qkey}, len(payload))
	copy(buf[PayloadOffset(wr.Send):], payload)
	return nic.Packet{Buf: buf, N: n, Remote: from, Local: local, ICRC: nic.ICRCVerified}
}

// TestUDGRHBytes: the GRH of the receive buffer is the received IP header
// as the link reports it: for IPv4, 20 zero bytes and the IPv4 header,
// for IPv6 the IPv6 header.
func TestUDGRHBytes(t *testing.T) {
	s := enginetest.NewSim(t, 1, enginetest.Impairment{})
	qps := s.UDQPs(enginetest.UDOpts{})
	rmr, remote := s.Reg(1, 256)
	e := s.EP[1].E
	payload := []byte("0123456789abcdef")
	pk := udPacket(t, netip.MustParseAddrPort("192.168.0.1:49152"), netip.AddrPort{}, netip.MustParseAddr("192.168.0.199"), qps[1].Num(), 0x42, enginetest.QKey, payload)
	pk.IPKnown, pk.HopLimit, pk.TClass, pk.IPID = true, 63, 0x02, 0xbeef
	enginetest.PostRecvSGE(t, qps[1], 1, wr.SGE{Addr: rmr.Addr(), Length: 200, LKey: rmr.LKey()})
	e.Receive(s.Now, []nic.Packet{pk})
	udpLen := 8 + pk.N
	want := make([]byte, 40)
	ip := want[20:]
	copy(ip, []byte{0x45, 0x02, 0, 0, 0xbe, 0xef, 0x40, 0, 63, 17, 0, 0, 192, 168, 0, 1, 192, 168, 0, 199})
	binary.BigEndian.PutUint16(ip[2:], uint16(20+udpLen))
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(ip[i:]))
	}
	sum = sum&0xffff + sum>>16
	binary.BigEndian.PutUint16(ip[10:], ^uint16(sum+sum>>16))
	if !bytes.Equal(remote[:40], want) || !bytes.Equal(remote[40:56], payload) {
		t.Fatalf("IPv4 GRH\n got %x\nwant %x", remote[:56], want)
	}

	pk = udPacket(t, netip.MustParseAddrPort("[fd00::1]:49152"), netip.AddrPort{}, netip.MustParseAddr("fd00::2"), qps[1].Num(), 0x42, enginetest.QKey, payload)
	pk.IPKnown, pk.HopLimit, pk.TClass, pk.FlowLabel = true, 64, 0xa0, 0x12345
	enginetest.PostRecvSGE(t, qps[1], 2, wr.SGE{Addr: rmr.Addr(), Length: 200, LKey: rmr.LKey()})
	e.Receive(s.Now, []nic.Packet{pk})
	want = append([]byte{0x6a, 0x01, 0x23, 0x45, 0, byte(udpLen), 17, 64},
		append(netip.MustParseAddr("fd00::1").AsSlice(), netip.MustParseAddr("fd00::2").AsSlice()...)...)
	if !bytes.Equal(remote[:40], want) {
		t.Fatalf("IPv6 GRH\n got %x\nwant %x", remote[:40], want)
	}
	wcs := make([]cq.WC, 4)
	if n := s.EP[1].RCQ.Poll(wcs); n != 2 || wcs[0].SrcQP != 0x42 || wcs[1].ByteLen != 56 {
		t.Fatalf("completions %+v", wcs[:n])
	}
}

// TestUDSRQTooLongCompletesInError: on an SRQ, a datagram too long for
// the WQE it takes completes that WQE with REM_INV_REQ_ERR (class E, as
// rxe) and the QP keeps working; UD QPs share the SRQ with RC ones.
func TestUDSRQTooLongCompletesInError(t *testing.T) {
	s := enginetest.NewSim(t, 1, enginetest.Impairment{})
	srq, err := s.EP[1].E.CreateSRQ(engine.SRQConfig{MaxWR: 8})
	if err != nil {
		t.Fatal(err)
	}
	qps := s.UDQPs(enginetest.UDOpts{SRQ: [2]*engine.SRQ{nil, srq}})
	if err := qps[1].PostRecv(&wr.RecvWR{ID: 1}); err == nil {
		t.Fatal("PostRecv on a QP of an SRQ accepted")
	}
	lmr, _ := s.Reg(0, 4096)
	rmr, _ := s.Reg(1, 4096)
	for i := range 2 {
		if err := srq.PostRecv(&wr.RecvWR{ID: uint64(10 + i), SGL: []wr.SGE{{Addr: rmr.Addr() + uint64(i)*1024, Length: 40 + 64, LKey: rmr.LKey()}}}); err != nil {
			t.Fatal(err)
		}
	}
	enginetest.MustPost(t, qps[0], s.UDSend(0, qps[1], 1, wr.SGE{Addr: lmr.Addr(), Length: 65, LKey: lmr.LKey()}))
	enginetest.MustPost(t, qps[0], s.UDSend(0, qps[1], 2, wr.SGE{Addr: lmr.Addr(), Length: 64, LKey: lmr.LKey()}))
	wcs := s.WaitWC(s.EP[1].RCQ, 2, time.Second)
	if wcs[0].WRID != 10 || wcs[0].Status != cq.RemInvReqErr || wcs[1].WRID != 11 || wcs[1].Status != cq.Success || wcs[1].ByteLen != 104 {
		t.Fatalf("completions %+v", wcs)
	}
	if st := s.EP[1].E.Stats(); st.RxUDTooLong != 1 || qps[1].State() != qpstate.RTS {
		t.Fatalf("stats %+v state %v", st, qps[1].State())
	}
	// An empty SRQ drops and counts.
	enginetest.MustPost(t, qps[0], s.UDSend(0, qps[1], 3, wr.SGE{Addr: lmr.Addr(), Length: 8, LKey: lmr.LKey()}))
	s.Pump(nil, time.Millisecond)
	if st := s.EP[1].E.Stats(); st.RxUDNoRecv != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestGSIQP1: QP1 is number 1, one per engine, and accepts only Q_Key
// 0x80010000 whatever Q_Key it was given; it sends with the DETH source
// QP 1 and Q_Key 0x80010000 whatever the work request says.
func TestGSIQP1(t *testing.T) {
	s := enginetest.NewSim(t, 1, enginetest.Impairment{})
	var gsi [2]*engine.QP
	for i, ep := range s.EP {
		qp, err := CreateGSI(ep.E, engine.QPConfig{PD: ep.PD, SendCQ: ep.SCQ, RecvCQ: ep.RCQ, MaxSendWR: 8, MaxRecvWR: 8})
		if err != nil {
			t.Fatal(err)
		}
		if qp.Num() != 1 {
			t.Fatalf("GSI QP number %d", qp.Num())
		}
		qp.SetState(qpstate.Init)
		qp.SetPath(engine.Path{PMTU: 1024, QKey: GSIQKey})
		qp.SetState(qpstate.RTR)
		qp.SetState(qpstate.RTS)
		gsi[i] = qp
	}
	if _, err := CreateGSI(s.EP[0].E, engine.QPConfig{PD: s.EP[0].PD, SendCQ: s.EP[0].SCQ, RecvCQ: s.EP[0].RCQ, MaxSendWR: 8, MaxRecvWR: 8}); !errors.Is(err, engine.ErrQPNumInUse) {
		t.Fatalf("second GSI: %v", err)
	}
	sent := enginetest.Capture(s.EP[0].E)
	lmr, _ := s.Reg(0, 512)
	rmr, _ := s.Reg(1, 1024)
	for i := range 2 {
		enginetest.PostRecvSGE(t, gsi[1], uint64(i), wr.SGE{Addr: rmr.Addr() + uint64(i)*512, Length: 296, LKey: rmr.LKey()})
	}
	mad := func(qkey uint32) *wr.SendWR {
		return &wr.SendWR{ID: 1, Opcode: wr.Send, Flags: wr.Signaled, SGL: []wr.SGE{{Addr: lmr.Addr(), Length: 256, LKey: lmr.LKey()}},
			AH: &wr.AH{Remote: s.EP[1].Addr}, RemoteQPN: 1, RemoteQKey: qkey}
	}
	// From an ordinary UD QP whose Q_Key is not QP1's: dropped.
	other, _ := s.EP[0].E.CreateQP(engine.QPConfig{Type: qpstate.UD, PD: s.EP[0].PD, SendCQ: s.EP[0].SCQ, RecvCQ: s.EP[0].RCQ, MaxSendWR: 8, MaxRecvWR: 8})
	other.SetState(qpstate.Init)
	other.SetPath(engine.Path{PMTU: 1024, QKey: 0x12345678})
	other.SetState(qpstate.RTR)
	other.SetState(qpstate.RTS)
	enginetest.MustPost(t, other, mad(0x12345678))
	enginetest.MustPost(t, gsi[0], mad(0x12345678)) // QP1 sends 0x80010000 anyway
	wcs := s.WaitWC(s.EP[1].RCQ, 1, time.Second)
	if wcs[0].ByteLen != 296 || wcs[0].SrcQP != 1 || wcs[0].QPNum != 1 || wcs[0].WRID != 0 {
		t.Fatalf("completion %+v", wcs[0])
	}
	if st := s.EP[1].E.Stats(); st.RxBadQKey != 1 {
		t.Fatalf("stats %+v", st)
	}
	var p bth.Packet
	found := false
	for _, b := range *sent {
		if err := bth.Parse(&p, b); err != nil || p.DETH.SrcQP() != 1 {
			continue
		}
		found = true
		if p.DETH.QKey() != GSIQKey || p.BTH.DestQP() != 1 {
			t.Fatalf("MAD packet: %+v", p.Fields())
		}
	}
	if !found || len(*sent) != 2 {
		t.Fatalf("%d packets sent, QP1's among them: %v", len(*sent), found)
	}
	// Destroyed, QP1 can be made again.
	if err := s.EP[0].E.DestroyQP(gsi[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := CreateGSI(s.EP[0].E, engine.QPConfig{PD: s.EP[0].PD, SendCQ: s.EP[0].SCQ, RecvCQ: s.EP[0].RCQ, MaxSendWR: 8, MaxRecvWR: 8}); err != nil {
		t.Fatal(err)
	}
	// Random QP numbers are never 1 (nor 0).
	for range 100 {
		qp, err := s.EP[1].E.CreateQP(engine.QPConfig{Type: qpstate.UD, PD: s.EP[1].PD, SendCQ: s.EP[1].SCQ, RecvCQ: s.EP[1].RCQ, MaxSendWR: 1, MaxRecvWR: 1})
		if err != nil || qp.Num() <= 1 {
			t.Fatalf("QP %v %v", qp, err)
		}
	}
}

// TestUDSrcPort: the UDP source port comes from the address handle's flow
// label, or is the QP's own without one.
func TestUDSrcPort(t *testing.T) {
	s := enginetest.NewSim(t, 1, enginetest.Impairment{})
	qps := s.UDQPs(enginetest.UDOpts{})
	var ports []uint16
	s.EP[0].E.SetPacketTrace(func(dir byte, p *nic.Packet) {
		if dir == 'T' {
			ports = append(ports, p.SrcPort)
		}
	})
	lmr, _ := s.Reg(0, 64)
	w := s.UDSend(0, qps[1], 1, wr.SGE{Addr: lmr.Addr(), Length: 8, LKey: lmr.LKey()})
	enginetest.MustPost(t, qps[0], w)
	w.AH = &wr.AH{Remote: s.EP[1].Addr, FlowLabel: 0x12345}
	enginetest.MustPost(t, qps[0], w)
	s.Pump(nil, time.Millisecond)
	if len(ports) != 2 || ports[0] != engine.SrcPort(qps[0].Num()) || ports[1] != 0xe341 {
		t.Fatalf("source ports %#x (QP's %#x)", ports, engine.SrcPort(qps[0].Num()))
	}
}

// TestUDSteadyStateNoAlloc: a UD SEND/receive loop allocates nothing per
// packet once warm.
func TestUDSteadyStateNoAlloc(t *testing.T) {
	w := enginetest.NewWire(t)
	s := w.Sim(t)
	qps := s.UDQPs(enginetest.UDOpts{})
	lmr, _ := w.EP[0].MRs.RegMR(w.EP[0].PD, make([]byte, 1024), enginetest.AllAccess)
	rmr, _ := w.EP[1].MRs.RegMR(w.EP[1].PD, make([]byte, 2048), enginetest.AllAccess)
	swr := s.UDSend(0, qps[1], 1, wr.SGE{Addr: lmr.Addr(), Length: 1024, LKey: lmr.LKey()})
	rwr := &wr.RecvWR{SGL: []wr.SGE{{Addr: rmr.Addr(), Length: 2048, LKey: rmr.LKey()}}}
	wcs := make([]cq.WC, 8)
	round := func() {
		for range 4 {
			if err := qps[1].PostRecv(rwr); err != nil {
				t.Fatal(err)
			}
			if err := qps[0].PostSend(swr); err != nil {
				t.Fatal(err)
			}
		}
		for got := 0; got < 4; {
			w.Step()
			got += w.EP[1].RCQ.Poll(wcs)
		}
		for w.EP[0].SCQ.Poll(wcs) > 0 {
		}
	}
	for range 10 {
		round()
	}
	if a := testing.AllocsPerRun(50, round); a != 0 {
		t.Fatalf("%.1f allocations per round of 4 UD SENDs, want 0", a)
	}
}

// BenchmarkUDSend64: 64-byte UD SENDs from one QP to another through the
// engines back to back (no link): the transport's datagrams per second,
// with the wire's ICRC on and off (enginetest.WithICRC).
func BenchmarkUDSend64(b *testing.B) { enginetest.WithICRC(b, benchmarkUDSend64) }

func benchmarkUDSend64(b *testing.B, checkICRC bool) {
	w := enginetest.NewWire(b)
	w.ICRC = checkICRC
	s := w.Sim(b)
	qps := s.UDQPs(enginetest.UDOpts{})
	lmr, _ := w.EP[0].MRs.RegMR(w.EP[0].PD, make([]byte, 64), enginetest.AllAccess)
	rmr, _ := w.EP[1].MRs.RegMR(w.EP[1].PD, make([]byte, 128), enginetest.AllAccess)
	swr := s.UDSend(0, qps[1], 1, wr.SGE{Addr: lmr.Addr(), Length: 64, LKey: lmr.LKey()})
	swr.Flags = 0 // unsignaled, as a datagram sender usually is
	rwr := &wr.RecvWR{SGL: []wr.SGE{{Addr: rmr.Addr(), Length: 128, LKey: rmr.LKey()}}}
	wcs := make([]cq.WC, 64)
	b.ReportAllocs()
	b.ResetTimer()
	r := enginetest.StartRates(w)
	for done := 0; done < b.N; {
		k := min(32, b.N-done)
		for range k {
			if err := qps[1].PostRecv(rwr); err != nil {
				b.Fatal(err)
			}
			if err := qps[0].PostSend(swr); err != nil {
				b.Fatal(err)
			}
		}
		w.Step()
		for got := 0; got < k; {
			n := w.EP[1].RCQ.Poll(wcs)
			if n == 0 {
				b.Fatalf("lost datagrams: %d of %d", got, k)
			}
			got += n
		}
		done += k
	}
	r.Report(b, w, b.N)
}

// TestUDNoPacketsWhenStopped: work posted to a UD QP that leaves RTS
// before Progress runs is not sent: moved to ERR it is flushed, in SQD it
// waits; a packet to a UD QP in ERR is dropped.
func TestUDNoPacketsWhenStopped(t *testing.T) {
	s := enginetest.NewSim(t, 1, enginetest.Impairment{})
	s.Keep = true
	qps := s.UDQPs(enginetest.UDOpts{})
	lmr, _ := s.Reg(0, 256)
	rmr, _ := s.Reg(1, 256)
	enginetest.PostRecvSGE(t, qps[1], 1, wr.SGE{Addr: rmr.Addr(), Length: 200, LKey: rmr.LKey()})
	enginetest.MustPost(t, qps[0], s.UDSend(0, qps[1], 1, wr.SGE{Addr: lmr.Addr(), Length: 8, LKey: lmr.LKey()}))
	qps[0].SetState(qpstate.SQD)
	s.Pump(nil, time.Millisecond)
	if len(s.Trace) != 0 {
		t.Fatalf("SQD sent %q", s.Trace)
	}
	qps[0].SetState(qpstate.RTS)
	s.WaitWC(s.EP[1].RCQ, 1, time.Second)
	enginetest.MustPost(t, qps[0], s.UDSend(0, qps[1], 2, wr.SGE{Addr: lmr.Addr(), Length: 8, LKey: lmr.LKey()}))
	qps[0].SetState(qpstate.Err)
	wcs := s.WaitWC(s.EP[0].SCQ, 2, time.Second)
	if wcs[0].Status != cq.Success || wcs[1].WRID != 2 || wcs[1].Status != cq.WRFlushErr {
		t.Fatalf("send completions %+v", wcs)
	}
	// The receiver in ERR: its WQE is flushed and a datagram dropped.
	enginetest.PostRecvSGE(t, qps[1], 3, wr.SGE{Addr: rmr.Addr(), Length: 200, LKey: rmr.LKey()})
	qps[1].SetState(qpstate.Err)
	if w := s.WaitWC(s.EP[1].RCQ, 1, time.Second); w[0].WRID != 3 || w[0].Status != cq.WRFlushErr {
		t.Fatalf("flush %+v", w)
	}
	pk := udPacket(t, engine.Remote(s.EP[0].Addr), netip.AddrPort{}, s.EP[1].Addr, qps[1].Num(), 5, enginetest.QKey, []byte("x"))
	before := s.EP[1].E.Stats().RxUnknownQP
	s.EP[1].E.Receive(s.Now, []nic.Packet{pk})
	if got := s.EP[1].E.Stats().RxUnknownQP; got != before+1 || s.EP[1].RCQ.Len() != 0 {
		t.Fatalf("datagram to a QP in ERR: RxUnknownQP %d -> %d", before, got)
	}
	if len(s.Trace) != 1 {
		t.Fatalf("trace %q", s.Trace)
	}
}

// TestUDMalformed: UD packets cut inside the DETH, or with a reserved
// opcode on a UD QP, are counted as malformed and dropped, never panic.
func TestUDMalformed(t *testing.T) {
	s := enginetest.NewSim(t, 1, enginetest.Impairment{})
	qps := s.UDQPs(enginetest.UDOpts{})
	e := s.EP[1].E
	good := udPacket(t, engine.Remote(s.EP[0].Addr), netip.AddrPort{}, s.EP[1].Addr, qps[1].Num(), 5, enginetest.QKey, []byte("abcd"))
	var batch []nic.Packet
	for n := 0; n < good.N; n++ {
		p := good
		p.Buf = append([]byte(nil), good.Buf[:n]...)
		p.N = n
		batch = append(batch, p)
	}
	e.Receive(s.Now, batch)
	st := e.Stats()
	if st.RxMalformed == 0 || st.RxMalformed+st.RxBadHeader+st.RxUDNoRecv+st.RxUnknownQP+st.RxBadQKey != uint64(len(batch)) {
		t.Fatalf("stats %+v for %d truncated packets", st, len(batch))
	}
}

// FuzzUDReceive feeds arbitrary packets to a UD QP in RTS whose receive
// buffers lie between canaries: nothing may panic, nothing outside the
// buffers may change, and the QP answers nothing (UD has no responses).
func FuzzUDReceive(f *testing.F) {
	for _, n := range []int{0, 1, 100, 161, 1100} {
		p := udPacket(nil, netip.AddrPort{}, netip.AddrPort{}, netip.Addr{}, 0, 7, enginetest.QKey, make([]byte, n))
		f.Add(p.Bytes(), true)
	}
	f.Fuzz(func(t *testing.T, p []byte, aim bool) {
		s := enginetest.NewSim(t, 1, enginetest.Impairment{})
		qps := s.UDQPs(enginetest.UDOpts{})
		backing := make([]byte, 3*4096)
		for i := range backing {
			backing[i] = 0xA5
		}
		region := backing[4096 : 2*4096]
		mr, err := s.EP[1].MRs.RegMR(s.EP[1].PD, region, memreg.AccessLocalWrite)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 3 {
			enginetest.PostRecvSGE(t, qps[1], uint64(i), wr.SGE{Addr: mr.Addr() + uint64(i)*200, Length: 200, LKey: mr.LKey()})
		}
		q := append([]byte(nil), p...)
		if aim && len(q) >= bth.BTHLen+bth.DETHLen {
			// Get past the cheap checks often: the QP and its Q_Key.
			bth.BTH(q).SetDestQP(qps[1].Num())
			binary.BigEndian.PutUint32(q[bth.BTHLen:], enginetest.QKey)
		}
		s.EP[1].E.Receive(s.Now, []nic.Packet{{Buf: q, N: len(q), Remote: engine.Remote(s.EP[0].Addr), Local: s.EP[1].Addr}})
		if out, _ := s.EP[1].E.Progress(s.Now); len(out) != 0 {
			t.Fatalf("a UD QP answered with %d packets", len(out))
		}
		if !bytes.Equal(backing[:4096], bytes.Repeat([]byte{0xA5}, 4096)) || !bytes.Equal(backing[2*4096:], bytes.Repeat([]byte{0xA5}, 4096)) ||
			!bytes.Equal(region[600:], bytes.Repeat([]byte{0xA5}, 4096-600)) {
			t.Fatal("memory outside the receive buffers changed")
		}
	})
}
