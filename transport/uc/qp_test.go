package uc

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/memreg"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/qpstate"
	"github.com/softroce/softroce/transport/engine"
	"github.com/softroce/softroce/transport/internal/enginetest"
	_ "github.com/softroce/softroce/transport/rc" // the RC QPs UC is compared and mixed with
	"github.com/softroce/softroce/wr"
)

// ucSim connects a UC QP on each side at PMTU 256 and checks every packet
// either engine hands out: UC opcodes only, never AckReq, and nothing at
// all from the receiving side 1.
func ucSim(t *testing.T, o enginetest.QPOpts) (*enginetest.Sim, [2]*engine.QP) {
	t.Helper()
	s := enginetest.NewSim(t, 1, enginetest.Impairment{})
	s.Keep = true
	o.Type = qpstate.UC
	if o.PMTU == 0 {
		o.PMTU = 256
	}
	qps := s.Connect(o)
	s.TraceSent(func(i int, pk *bth.Packet) {
		if i == 1 {
			t.Errorf("the UC receiver sent %v psn %d: UC never answers", pk.Info.Name, pk.BTH.PSN())
		}
		if pk.Info.Transport != bth.TransportUC || pk.BTH.AckReq() {
			t.Errorf("UC requester sent %v with AckReq=%v", pk.Info.Name, pk.BTH.AckReq())
		}
	})
	return s, qps
}

func ucOp(rc bth.Opcode) int { return int(Opcode(rc)) }

// TestUCExchange: multi-packet SEND, SEND with immediate, WRITE and WRITE
// with immediate arrive intact; each send completes once its last packet
// has left, with no ACK coming back.
func TestUCExchange(t *testing.T) {
	s, qps := ucSim(t, enginetest.QPOpts{PSN: [2]uint32{0xfffffe, 77}})
	lmr, local := s.Reg(0, 64<<10)
	rmr, remote := s.Reg(1, 64<<10)
	enginetest.Fill(local, 9)
	s.PostRecv(qps[1], 10, rmr.Addr(), 2000, rmr.LKey())
	s.PostRecv(qps[1], 11, rmr.Addr()+2000, 2000, rmr.LKey())
	s.PostRecv(qps[1], 12, rmr.Addr()+4000, 100, rmr.LKey())
	sge := func(off, n int) []wr.SGE {
		return []wr.SGE{{Addr: lmr.Addr() + uint64(off), Length: uint32(n), LKey: lmr.LKey()}}
	}
	enginetest.MustPost(t, qps[0], &wr.SendWR{ID: 1, Opcode: wr.Send, Flags: wr.Signaled, SGL: sge(0, 1000)})
	enginetest.MustPost(t, qps[0], &wr.SendWR{ID: 2, Opcode: wr.SendWithImm, Flags: wr.Signaled | wr.Solicited, Imm: 0xabcd, SGL: sge(1000, 513)})
	enginetest.MustPost(t, qps[0], &wr.SendWR{ID: 3, Opcode: wr.RDMAWrite, Flags: wr.Signaled, SGL: sge(2000, 3000), RemoteAddr: rmr.Addr() + 10000, RKey: rmr.RKey()})
	enginetest.MustPost(t, qps[0], &wr.SendWR{ID: 4, Opcode: wr.RDMAWriteWithImm, Flags: wr.Signaled, Imm: 7, SGL: sge(6000, 700), RemoteAddr: rmr.Addr() + 20000, RKey: rmr.RKey()})
	enginetest.MustPost(t, qps[0], &wr.SendWR{ID: 5, Opcode: wr.Send, Flags: wr.Signaled | wr.Inline, InlineData: []byte("inline")})
	sw := s.WaitWC(s.EP[0].SCQ, 5, time.Second)
	for i, wc := range sw {
		if wc.Status != cq.Success || wc.WRID != uint64(i+1) {
			t.Fatalf("send completion %d: %+v", i, wc)
		}
	}
	rw := s.WaitWC(s.EP[1].RCQ, 3, time.Second)
	want := []cq.WC{
		{WRID: 10, Opcode: cq.OpRecv, ByteLen: 1000},
		{WRID: 11, Opcode: cq.OpRecv, ByteLen: 513, ImmData: 0xabcd, Flags: cq.FlagWithImm},
		{WRID: 12, Opcode: cq.OpRecvRDMAWithImm, ByteLen: 700, ImmData: 7, Flags: cq.FlagWithImm},
	}
	for i, w := range want {
		g := rw[i]
		if g.Status != cq.Success || g.WRID != w.WRID || g.Opcode != w.Opcode || g.ByteLen != w.ByteLen || g.ImmData != w.ImmData ||
			g.Flags&cq.FlagWithImm != w.Flags&cq.FlagWithImm || g.QPNum != qps[1].Num() || g.SrcQP != qps[0].Num() {
			t.Fatalf("receive completion %d: %+v, want %+v", i, g, w)
		}
	}
	if !bytes.Equal(remote[:1000], local[:1000]) || !bytes.Equal(remote[2000:2513], local[1000:1513]) ||
		!bytes.Equal(remote[10000:13000], local[2000:5000]) || !bytes.Equal(remote[20000:20700], local[6000:6700]) {
		t.Fatal("data differs")
	}
	// The inline SEND found no receive WQE: UC drops it silently (rxe:
	// class D, no RNR NAK).
	s.Pump(nil, time.Second)
	if len(rw) != 3 || s.EP[1].RCQ.Poll(make([]cq.WC, 1)) != 0 || qps[1].Stats().Dropped != 1 {
		t.Fatalf("SEND without a receive WQE not counted as dropped: %+v", qps[1].Stats())
	}
	if st := qps[1].State(); st != qpstate.RTS {
		t.Fatalf("receiver state %v", st)
	}
	if !s.EP[0].E.NextDeadline().IsZero() || qps[0].Stats().Retransmits != 0 {
		t.Fatal("a UC requester armed a timer or retransmitted")
	}
	if n := strings.Count(strings.Join(s.Trace, "\n"), "1>0"); n != 0 {
		t.Fatalf("receiver sent %d packets", n)
	}
	// 4 + 3 + 12 + 3 + 1 packets, PSNs wrapping from 0xfffffe.
	if got := qps[0].Stats().TxPackets; got != 23 {
		t.Fatalf("requester sent %d packets, want 23", got)
	}
	if e := qps[1].Service().(*ucQP).recv.ExpectedPSN(); e != bth.PSNAdd(0xfffffe, 23) {
		t.Fatalf("receiver expects PSN %d", e)
	}
}

// TestUCGapDropsMessage: a lost MIDDLE drops the rest of its SEND (no
// completion, no NAK); the next SEND arrives in the same receive WQE,
// which the broken message left for it.
func TestUCGapDropsMessage(t *testing.T) {
	for _, dropAt := range []struct {
		name string
		op   bth.Opcode
		off  uint32
	}{{"middle", bth.RCSendMiddle, 1}, {"last", bth.RCSendLast, 3}, {"first", bth.RCSendFirst, 0}} {
		t.Run(dropAt.name, func(t *testing.T) {
			s, qps := ucSim(t, enginetest.QPOpts{PSN: [2]uint32{100, 500}})
			s.Rules = append(s.Rules, enginetest.Rule{From: 0, Opcode: ucOp(dropAt.op), PSN: 100 + dropAt.off, Nth: 1, Action: "drop"})
			lmr, local := s.Reg(0, 8192)
			rmr, remote := s.Reg(1, 8192)
			enginetest.Fill(local, 1)
			s.PostRecv(qps[1], 20, rmr.Addr(), 2048, rmr.LKey())
			s.PostRecv(qps[1], 21, rmr.Addr()+4096, 2048, rmr.LKey())
			// A: 4 packets (PSN 100..103), B: 2 packets (104, 105).
			enginetest.MustPost(t, qps[0], &wr.SendWR{ID: 1, Opcode: wr.Send, Flags: wr.Signaled, SGL: []wr.SGE{{Addr: lmr.Addr(), Length: 1000, LKey: lmr.LKey()}}})
			enginetest.MustPost(t, qps[0], &wr.SendWR{ID: 2, Opcode: wr.Send, Flags: wr.Signaled, SGL: []wr.SGE{{Addr: lmr.Addr() + 2000, Length: 300, LKey: lmr.LKey()}}})
			sw := s.WaitWC(s.EP[0].SCQ, 2, time.Second)
			if sw[0].Status != cq.Success || sw[1].Status != cq.Success {
				t.Fatalf("a UC send completes once sent, lost or not: %+v", sw)
			}
			rw := s.WaitWC(s.EP[1].RCQ, 1, time.Second)
			if rw[0].WRID != 20 || rw[0].Status != cq.Success || rw[0].ByteLen != 300 || !bytes.Equal(remote[:300], local[2000:2300]) {
				t.Fatalf("message after the broken one: %+v", rw[0])
			}
			s.Pump(nil, time.Second)
			if n := s.EP[1].RCQ.Poll(make([]cq.WC, 4)); n != 0 {
				t.Fatalf("%d more receive completions: the broken message completed", n)
			}
			st := qps[1].Stats()
			if st.OutOfSeqRequests == 0 && dropAt.off != 3 {
				t.Fatalf("gap not counted: %+v", st)
			}
			// The second WQE is still posted: a third message lands in it.
			enginetest.MustPost(t, qps[0], &wr.SendWR{ID: 3, Opcode: wr.Send, SGL: []wr.SGE{{Addr: lmr.Addr() + 3000, Length: 10, LKey: lmr.LKey()}}})
			if rw := s.WaitWC(s.EP[1].RCQ, 1, time.Second); rw[0].WRID != 21 || !bytes.Equal(remote[4096:4106], local[3000:3010]) {
				t.Fatalf("third message: %+v", rw[0])
			}
		})
	}
}

// TestUCWriteGap: a WRITE whose MIDDLE is lost leaves the packets before
// the gap in memory (UC gives no atomicity), writes nothing after it, and
// the next WRITE is placed whole.
func TestUCWriteGap(t *testing.T) {
	s, qps := ucSim(t, enginetest.QPOpts{PSN: [2]uint32{0, 0}})
	s.Rules = append(s.Rules, enginetest.Rule{From: 0, Opcode: ucOp(bth.RCWriteMiddle), PSN: 1, Nth: 1, Action: "drop"})
	lmr, local := s.Reg(0, 8192)
	rmr, remote := s.Reg(1, 8192)
	enginetest.Fill(local, 5)
	enginetest.MustPost(t, qps[0], &wr.SendWR{ID: 1, Opcode: wr.RDMAWrite, SGL: []wr.SGE{{Addr: lmr.Addr(), Length: 1024, LKey: lmr.LKey()}}, RemoteAddr: rmr.Addr(), RKey: rmr.RKey()})
	enginetest.MustPost(t, qps[0], &wr.SendWR{ID: 2, Opcode: wr.RDMAWrite, Flags: wr.Signaled, SGL: []wr.SGE{{Addr: lmr.Addr() + 2048, Length: 600, LKey: lmr.LKey()}}, RemoteAddr: rmr.Addr() + 4096, RKey: rmr.RKey()})
	s.WaitWC(s.EP[0].SCQ, 1, time.Second)
	s.Pump(nil, time.Second)
	if !bytes.Equal(remote[:256], local[:256]) {
		t.Fatal("the FIRST before the gap was not placed")
	}
	if !bytes.Equal(remote[256:1024], make([]byte, 768)) {
		t.Fatal("packets after the gap were placed")
	}
	if !bytes.Equal(remote[4096:4696], local[2048:2648]) {
		t.Fatal("the next WRITE was not placed")
	}
}

// ucFeed hands crafted UC packets to endpoint 1 and checks it answers
// nothing.
func ucFeed(s *enginetest.Sim, qp *engine.QP, op bth.Opcode, psn uint32, payload []byte, f bth.Fields) {
	s.T.Helper()
	f.BTH.Opcode, f.BTH.PSN = Opcode(op), psn
	s.Feed(1, qp, f, payload)
	if out := s.Drain(1); len(out) != 0 {
		s.T.Fatalf("UC responder answered %v", out)
	}
}

// TestUCDuplicates: UC cannot tell a duplicate from a gap. A duplicated
// MIDDLE breaks its message; a duplicated ONLY is delivered twice; a
// duplicated FIRST restarts the message in the same receive WQE.
func TestUCDuplicates(t *testing.T) {
	s, qps := ucSim(t, enginetest.QPOpts{PSN: [2]uint32{0, 0}})
	rmr, remote := s.Reg(1, 8192)
	for i := range 6 {
		s.PostRecv(qps[1], uint64(30+i), rmr.Addr()+uint64(i)*1024, 1024, rmr.LKey())
	}
	full := bytes.Repeat([]byte{1}, 256)
	// Duplicate MIDDLE: the message is dropped; the next ONLY reuses its WQE.
	ucFeed(s, qps[1], bth.RCSendFirst, 0, full, bth.Fields{})
	ucFeed(s, qps[1], bth.RCSendMiddle, 1, full, bth.Fields{})
	ucFeed(s, qps[1], bth.RCSendMiddle, 1, full, bth.Fields{})
	ucFeed(s, qps[1], bth.RCSendLast, 2, []byte{2}, bth.Fields{})
	if n := s.EP[1].RCQ.Poll(make([]cq.WC, 4)); n != 0 {
		t.Fatalf("a message with a duplicated MIDDLE completed (%d)", n)
	}
	ucFeed(s, qps[1], bth.RCSendOnly, 3, []byte("one"), bth.Fields{})
	ucFeed(s, qps[1], bth.RCSendOnly, 3, []byte("two"), bth.Fields{})
	// Duplicate FIRST: restarts.
	ucFeed(s, qps[1], bth.RCSendFirst, 4, full, bth.Fields{})
	ucFeed(s, qps[1], bth.RCSendFirst, 4, bytes.Repeat([]byte{3}, 256), bth.Fields{})
	ucFeed(s, qps[1], bth.RCSendLast, 5, []byte{4}, bth.Fields{})
	wcs := make([]cq.WC, 8)
	n := s.EP[1].RCQ.Poll(wcs)
	if n != 3 || wcs[0].WRID != 30 || wcs[1].WRID != 31 || wcs[2].WRID != 32 || wcs[2].ByteLen != 257 {
		t.Fatalf("completions %+v", wcs[:n])
	}
	if string(remote[:3]) != "one" || string(remote[1024:1027]) != "two" || remote[2048] != 3 || remote[2048+256] != 4 {
		t.Fatal("data differs")
	}
	if qps[1].State() != qpstate.RTS {
		t.Fatalf("state %v", qps[1].State())
	}
}

// TestUCSilentErrors: a bad R_Key, a WRITE to a QP without remote write,
// a SEND longer than its buffer, a wrong packet length and a missing
// receive WQE are all dropped without an answer, the QP stays in RTS,
// and the next message goes through (rxe: class D, no NAK exists on UC).
func TestUCSilentErrors(t *testing.T) {
	s, qps := ucSim(t, enginetest.QPOpts{PSN: [2]uint32{0, 0}})
	rmr, remote := s.Reg(1, 8192)
	ok := func(psn uint32) {
		t.Helper()
		ucFeed(s, qps[1], bth.RCWriteOnly, psn, []byte("ok"), bth.Fields{VA: rmr.Addr() + 100, RKey: rmr.RKey(), DMALen: 2})
		if string(remote[100:102]) != "ok" {
			t.Fatalf("the WRITE after the error was not placed")
		}
		remote[100], remote[101] = 0, 0
	}
	ucFeed(s, qps[1], bth.RCWriteOnly, 0, []byte("xx"), bth.Fields{VA: rmr.Addr(), RKey: rmr.RKey() ^ 0x80, DMALen: 2})
	ok(1)
	ucFeed(s, qps[1], bth.RCWriteOnly, 2, []byte("xx"), bth.Fields{VA: rmr.Addr() + 8190, RKey: rmr.RKey(), DMALen: 4})
	ok(3)
	// Multi-packet WRITE with a bad key: its MIDDLE and LAST are dropped too.
	ucFeed(s, qps[1], bth.RCWriteFirst, 4, make([]byte, 256), bth.Fields{VA: rmr.Addr(), RKey: 12345, DMALen: 300})
	ucFeed(s, qps[1], bth.RCWriteLast, 5, make([]byte, 44), bth.Fields{})
	ok(6)
	// SEND longer than the receive buffer: the WQE is kept for the next.
	s.PostRecv(qps[1], 40, rmr.Addr()+4096, 10, rmr.LKey())
	ucFeed(s, qps[1], bth.RCSendOnly, 7, make([]byte, 11), bth.Fields{})
	ucFeed(s, qps[1], bth.RCSendOnly, 8, []byte("fits"), bth.Fields{})
	// A FIRST shorter than the PMTU.
	ucFeed(s, qps[1], bth.RCSendFirst, 9, make([]byte, 100), bth.Fields{})
	ucFeed(s, qps[1], bth.RCSendLast, 10, make([]byte, 1), bth.Fields{})
	// No receive WQE: dropped (no RNR NAK on UC).
	ucFeed(s, qps[1], bth.RCSendOnly, 11, []byte("lost"), bth.Fields{})
	ok(12)
	wcs := make([]cq.WC, 4)
	if n := s.EP[1].RCQ.Poll(wcs); n != 1 || wcs[0].WRID != 40 || wcs[0].Status != cq.Success || string(remote[4096:4100]) != "fits" {
		t.Fatalf("receive completions %+v", wcs[:n])
	}
	// Remote write not enabled on the QP.
	qps[1].SetPath(func() engine.Path { p := qps[1].Path(); p.Access = 0; return p }())
	ucFeed(s, qps[1], bth.RCWriteOnly, 13, []byte("no"), bth.Fields{VA: rmr.Addr() + 200, RKey: rmr.RKey(), DMALen: 2})
	if remote[200] != 0 {
		t.Fatal("WRITE placed on a QP without remote write")
	}
	if qps[1].State() != qpstate.RTS {
		t.Fatalf("state %v after silent errors", qps[1].State())
	}
	if st := qps[1].Stats(); st.Dropped < 6 {
		t.Fatalf("drops not counted: %+v", st)
	}
}

// TestUCReceiveBufferErrorIsFatal: a receive WQE whose buffer is unusable
// (bad lkey) is class A, as rxe: it completes in error and the QP goes to
// ERR, still without a packet on the wire.
func TestUCReceiveBufferErrorIsFatal(t *testing.T) {
	s, qps := ucSim(t, enginetest.QPOpts{PSN: [2]uint32{0, 0}})
	rmr, _ := s.Reg(1, 4096)
	s.PostRecv(qps[1], 50, rmr.Addr(), 100, rmr.LKey()+0x100)
	s.PostRecv(qps[1], 51, rmr.Addr(), 100, rmr.LKey())
	ucFeed(s, qps[1], bth.RCSendOnly, 0, []byte("x"), bth.Fields{})
	wcs := make([]cq.WC, 4)
	n := s.EP[1].RCQ.Poll(wcs)
	if n != 2 || wcs[0].WRID != 50 || wcs[0].Status != cq.LocProtErr || wcs[1].WRID != 51 || wcs[1].Status != cq.WRFlushErr {
		t.Fatalf("completions %+v", wcs[:n])
	}
	if qps[1].State() != qpstate.Err {
		t.Fatalf("state %v", qps[1].State())
	}
}

// TestUCSRQAbandonCompletesInError: with an SRQ, a broken message's WQE
// cannot go back; it completes REM_INV_REQ_ERR when the next message
// starts (rxe: class E), and the next message takes a new WQE.
func TestUCSRQAbandonCompletesInError(t *testing.T) {
	s := enginetest.NewSim(t, 1, enginetest.Impairment{})
	srq, err := s.EP[1].E.CreateSRQ(engine.SRQConfig{MaxWR: 8, MaxSGE: 1})
	if err != nil {
		t.Fatal(err)
	}
	qps := s.Connect(enginetest.QPOpts{Type: qpstate.UC, PMTU: 256, SRQ: [2]*engine.SRQ{nil, srq}})
	rmr, remote := s.Reg(1, 8192)
	for i := range 2 {
		if err := srq.PostRecv(&wr.RecvWR{ID: uint64(60 + i), SGL: []wr.SGE{{Addr: rmr.Addr() + uint64(i)*2048, Length: 2048, LKey: rmr.LKey()}}}); err != nil {
			t.Fatal(err)
		}
	}
	ucFeed(s, qps[1], bth.RCSendFirst, 0, make([]byte, 256), bth.Fields{})
	ucFeed(s, qps[1], bth.RCSendOnly, 7, []byte("new"), bth.Fields{})
	wcs := make([]cq.WC, 4)
	n := s.EP[1].RCQ.Poll(wcs)
	if n != 2 || wcs[0].WRID != 60 || wcs[0].Status != cq.RemInvReqErr || wcs[1].WRID != 61 || wcs[1].Status != cq.Success || string(remote[2048:2051]) != "new" {
		t.Fatalf("completions %+v", wcs[:n])
	}
	if qps[1].State() != qpstate.RTS {
		t.Fatalf("state %v", qps[1].State())
	}
}

// TestUCErrSendsNothing: a UC QP in ERR flushes what is posted and sends
// nothing; one receiving in ERR places nothing.
func TestUCErrSendsNothing(t *testing.T) {
	s, qps := ucSim(t, enginetest.QPOpts{PSN: [2]uint32{0, 0}})
	lmr, _ := s.Reg(0, 4096)
	rmr, remote := s.Reg(1, 4096)
	qps[0].SetState(qpstate.Err)
	enginetest.MustPost(t, qps[0], &wr.SendWR{ID: 1, Opcode: wr.RDMAWrite, SGL: []wr.SGE{{Addr: lmr.Addr(), Length: 1000, LKey: lmr.LKey()}}, RemoteAddr: rmr.Addr(), RKey: rmr.RKey()})
	if out := s.Drain(0); len(out) != 0 {
		t.Fatalf("QP in ERR sent %v", out)
	}
	if wc := s.WaitWC(s.EP[0].SCQ, 1, time.Second); wc[0].Status != cq.WRFlushErr {
		t.Fatalf("completion %+v", wc[0])
	}
	qps[1].SetState(qpstate.Err)
	s.EP[1].E.SetPacketTrace(nil)
	ucFeed(s, qps[1], bth.RCWriteOnly, 0, []byte("zz"), bth.Fields{VA: rmr.Addr(), RKey: rmr.RKey(), DMALen: 2})
	if remote[0] != 0 {
		t.Fatal("QP in ERR placed a WRITE")
	}
}

// TestUCLocalErrorKeepsSentPackets: a WQE that fails its lkey moves the
// QP to ERR, but the packets of the WQEs before it, already completed,
// still leave.
func TestUCLocalErrorKeepsSentPackets(t *testing.T) {
	s, qps := ucSim(t, enginetest.QPOpts{PSN: [2]uint32{0, 0}})
	lmr, _ := s.Reg(0, 4096)
	rmr, _ := s.Reg(1, 4096)
	enginetest.MustPost(t, qps[0], &wr.SendWR{ID: 1, Opcode: wr.RDMAWrite, Flags: wr.Signaled, SGL: []wr.SGE{{Addr: lmr.Addr(), Length: 600, LKey: lmr.LKey()}}, RemoteAddr: rmr.Addr(), RKey: rmr.RKey()})
	enginetest.MustPost(t, qps[0], &wr.SendWR{ID: 2, Opcode: wr.RDMAWrite, Flags: wr.Signaled, SGL: []wr.SGE{{Addr: lmr.Addr(), Length: 10, LKey: lmr.LKey() + 0x100}}, RemoteAddr: rmr.Addr(), RKey: rmr.RKey()})
	enginetest.MustPost(t, qps[0], &wr.SendWR{ID: 3, Opcode: wr.RDMAWrite, Flags: wr.Signaled, SGL: []wr.SGE{{Addr: lmr.Addr(), Length: 10, LKey: lmr.LKey()}}, RemoteAddr: rmr.Addr(), RKey: rmr.RKey()})
	out := s.Drain(0)
	if strings.Join(out, ",") != "UC RDMA_WRITE_FIRST psn=0,UC RDMA_WRITE_MIDDLE psn=1,UC RDMA_WRITE_LAST psn=2" {
		t.Fatalf("sent %v", out)
	}
	wcs := make([]cq.WC, 4)
	n := s.EP[0].SCQ.Poll(wcs)
	if n != 3 || wcs[0].Status != cq.Success || wcs[1].Status != cq.LocProtErr || wcs[2].Status != cq.WRFlushErr {
		t.Fatalf("completions %+v", wcs[:n])
	}
}

// TestUCPostRefused: UC has no READ, atomics, ATOMIC_WRITE or SEND with
// invalidate; posting one fails at once with an error naming UC.
func TestUCPostRefused(t *testing.T) {
	_, qps := ucSim(t, enginetest.QPOpts{})
	for _, op := range []wr.Opcode{wr.RDMARead, wr.AtomicCmpAndSwp, wr.AtomicFetchAndAdd, wr.AtomicWrite, wr.SendWithInv} {
		err := qps[0].PostSend(&wr.SendWR{Opcode: op, SGL: []wr.SGE{{Length: 8}}})
		if err == nil || !strings.Contains(err.Error(), "UC") {
			t.Errorf("post %v on UC: %v", op, err)
		}
	}
}

// TestUCAndRCDoNotMix: a UC QP drops RC packets and an RC QP drops UC
// packets (IBTA §9.6.1.5.1), counted as bad headers.
func TestUCAndRCDoNotMix(t *testing.T) {
	s, qps := ucSim(t, enginetest.QPOpts{})
	rmr, remote := s.Reg(1, 4096)
	s.Feed(1, qps[1], bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCWriteOnly}, VA: rmr.Addr(), RKey: rmr.RKey(), DMALen: 2}, []byte("rc"))
	rcQPs := s.Connect(enginetest.QPOpts{})
	s.Feed(1, rcQPs[1], bth.Fields{BTH: bth.BTHFields{Opcode: Opcode(bth.RCWriteOnly)}, VA: rmr.Addr(), RKey: rmr.RKey(), DMALen: 2}, []byte("uc"))
	if remote[0] != 0 || s.EP[1].E.Stats().RxBadHeader != 2 {
		t.Fatalf("mixed services: %+v", s.EP[1].E.Stats())
	}
}

// ucFuzzOps are the UC opcodes a FuzzUCResponder record can pick.
var ucFuzzOps = [12]bth.Opcode{bth.RCSendFirst, bth.RCSendMiddle, bth.RCSendLast, bth.RCSendLastImm, bth.RCSendOnly,
	bth.RCSendOnlyImm, bth.RCWriteFirst, bth.RCWriteMiddle, bth.RCWriteLast, bth.RCWriteLastImm, bth.RCWriteOnly, bth.RCWriteOnlyImm}

// ucFuzzLens are the payload lengths a record can pick, around PMTU 256.
var ucFuzzLens = [8]int{0, 1, 3, 100, 255, 256, 257, 600}

// FuzzUCResponder feeds a UC responder sequences of packets: every UC
// opcode at PSNs around the expected one, with lengths around the PMTU,
// RETHs inside, across and outside the registered region, good and bad
// R_Keys, and raw bytes. Nothing may panic; the responder never sends a
// packet; memory outside the registered region never changes; receive
// completions never outnumber the WQEs posted nor exceed their buffers;
// and the QP stays in RTS (no error on UC moves it to ERR but an unusable
// receive buffer, which the posted WQEs never have).
//
// A record is 4 bytes: b0 picks ucFuzzOps[b0%12] (b0%13 == 12: a raw
// packet of the next b2 bytes), b1 is the PSN offset (int8) from the
// PSN the receiver expects, b2 picks the payload length ucFuzzLens[b2&7],
// b3 bit 0 spoils the R_Key and b3>>1 offsets the RETH VA by 64-byte steps
// from the region's start (past its end for large values).
func FuzzUCResponder(f *testing.F) {
	rec := func(op int, off int8, lenIdx, flags byte) []byte { return []byte{byte(op), byte(off), lenIdx, flags} }
	cat := func(rs ...[]byte) []byte { return bytes.Join(rs, nil) }
	f.Add(cat(rec(0, 0, 5, 0), rec(1, 0, 5, 0), rec(2, 0, 3, 0)))                   // a 3-packet SEND
	f.Add(cat(rec(6, 0, 5, 0), rec(7, 1, 5, 0), rec(8, 0, 3, 0), rec(10, 0, 1, 0))) // WRITE with a gap
	f.Add(cat(rec(0, 0, 5, 0), rec(4, 5, 2, 0), rec(5, -3, 3, 0)))                  // abandoned SEND
	f.Add(cat(rec(11, 0, 3, 1), rec(11, 0, 3, 0), rec(9, 0, 3, 0)))                 // bad key then WRITE_IMM
	f.Add(cat(rec(10, 0, 7, 127), rec(6, 0, 5, 126)))                               // beyond the region
	f.Add(append(rec(12, 0, 20, 0), make([]byte, 20)...))                           // raw
	f.Fuzz(func(t *testing.T, data []byte) {
		s := enginetest.NewSimCQ(t, 1, enginetest.Impairment{}, 64)
		qps := s.Connect(enginetest.QPOpts{Type: qpstate.UC, PMTU: 256, Depth: 16})
		qp := qps[1]
		backing := bytes.Repeat([]byte{0xA5}, 3*4096)
		region := backing[4096 : 2*4096]
		mr, err := s.EP[1].MRs.RegMR(s.EP[1].PD, region, enginetest.AllAccess)
		if err != nil {
			t.Fatal(err)
		}
		const nRecv, recvLen = 8, 512
		for i := range nRecv {
			s.PostRecv(qp, uint64(i), mr.Addr()+uint64(i)*recvLen, recvLen, mr.LKey())
		}
		var wcs []cq.WC
		buf := make([]cq.WC, 16)
		for len(data) >= 4 {
			r := data[:4]
			data = data[4:]
			var pkt []byte
			if r[0]%13 == 12 {
				n := min(int(r[2]), len(data))
				pkt = append([]byte(nil), data[:n]...)
				data = data[n:]
				if len(pkt) >= bth.BTHLen {
					bth.BTH(pkt).SetDestQP(qp.Num())
				}
			} else {
				op := Opcode(ucFuzzOps[r[0]%12])
				payload := bytes.Repeat([]byte{r[1]}, ucFuzzLens[r[2]&7])
				f := bth.Fields{BTH: bth.BTHFields{Opcode: op, PKey: 0xffff, DestQP: qp.Num(),
					PSN: bth.PSNAdd(qp.Service().(*ucQP).recv.ExpectedPSN(), int(int8(r[1])))}}
				f.VA, f.RKey, f.DMALen = mr.Addr()+uint64(r[3]>>1)*64, mr.RKey(), uint32(len(payload))
				if r[3]&1 != 0 {
					f.RKey ^= 0x100
				}
				pkt = make([]byte, bth.Len(op, len(payload)))
				n, err := bth.Build(pkt, &f, payload)
				if err != nil {
					t.Fatal(err)
				}
				pkt = pkt[:n]
			}
			s.EP[1].E.Receive(s.Now, []nic.Packet{{Buf: pkt, N: len(pkt), Remote: engine.Remote(s.EP[0].Addr)}})
			if out := s.Drain(1); len(out) != 0 {
				t.Fatalf("UC responder sent %v", out)
			}
			n := s.EP[1].RCQ.Poll(buf)
			wcs = append(wcs, buf[:n]...)
		}
		if len(wcs) > nRecv {
			t.Fatalf("%d receive completions for %d WQEs", len(wcs), nRecv)
		}
		for _, wc := range wcs {
			if wc.Status == cq.Success && wc.Opcode == cq.OpRecv && wc.ByteLen > recvLen {
				t.Fatalf("completion of %d bytes into a %d-byte buffer", wc.ByteLen, recvLen)
			}
		}
		if st := qp.State(); st != qpstate.RTS {
			t.Fatalf("UC QP moved to %v", st)
		}
		if !bytes.Equal(backing[:4096], bytes.Repeat([]byte{0xA5}, 4096)) || !bytes.Equal(backing[2*4096:], bytes.Repeat([]byte{0xA5}, 4096)) {
			t.Fatal("memory outside the registered region changed")
		}
	})
}

// BenchmarkServiceWrite64K compares RC and UC WRITE throughput of the
// engine alone (no link, no ICRC) at PMTU 4096.
func BenchmarkServiceWrite64K(b *testing.B) {
	for _, typ := range []qpstate.Type{qpstate.RC, qpstate.UC} {
		b.Run(typ.String(), func(b *testing.B) { enginetest.BenchService(b, typ, 1, wr.RDMAWrite, 64<<10, 4096, false) })
	}
}

// BenchmarkServiceSend64 compares RC and UC small-SEND message rates
// (engine alone, as above).
func BenchmarkServiceSend64(b *testing.B) {
	for _, typ := range []qpstate.Type{qpstate.RC, qpstate.UC} {
		b.Run(typ.String(), func(b *testing.B) { enginetest.BenchService(b, typ, 1, wr.Send, 64, 4096, false) })
	}
}

// TestUCSteadyStateNoAlloc: UC WRITE and SEND traffic, once warm,
// allocates nothing per packet on either side.
func TestUCSteadyStateNoAlloc(t *testing.T) {
	w := enginetest.NewWire(t)
	w.Type = qpstate.UC
	pairs := w.Connect(t, 1, 1024, 64)
	buf := make([]byte, 8192)
	lmr, _ := w.EP[0].MRs.RegMR(w.EP[0].PD, buf, enginetest.AllAccess)
	rmr, _ := w.EP[1].MRs.RegMR(w.EP[1].PD, make([]byte, 8192), enginetest.AllAccess)
	wrs := []wr.SendWR{
		{Opcode: wr.RDMAWrite, Flags: wr.Signaled, SGL: []wr.SGE{{Addr: lmr.Addr(), Length: 8192, LKey: lmr.LKey()}}, RemoteAddr: rmr.Addr(), RKey: rmr.RKey()},
		{Opcode: wr.SendWithImm, Flags: wr.Signaled, SGL: []wr.SGE{{Addr: lmr.Addr(), Length: 3000, LKey: lmr.LKey()}}},
	}
	rwr := wr.RecvWR{SGL: []wr.SGE{{Addr: rmr.Addr(), Length: 8192, LKey: rmr.LKey()}}}
	wcs := make([]cq.WC, 8)
	round := func() {
		for i := 0; i < 4; i++ {
			if i%2 == 1 {
				if err := pairs[0][1].PostRecv(&rwr); err != nil {
					t.Fatal(err)
				}
			}
			if err := pairs[0][0].PostSend(&wrs[i%2]); err != nil {
				t.Fatal(err)
			}
		}
		for got := 0; got < 4; {
			w.Step()
			got += w.EP[0].SCQ.Poll(wcs)
		}
		for w.Step() > 0 {
		}
		for got := 0; got < 2; {
			got += w.EP[1].RCQ.Poll(wcs)
		}
	}
	for i := 0; i < 10; i++ {
		round()
	}
	if a := testing.AllocsPerRun(50, round); a != 0 {
		t.Fatalf("%.1f allocations per round of UC WRITEs and SENDs, want 0", a)
	}
}

// TestUCPropertyLossy runs seeded UC workloads of multi-packet SENDs and
// WRITEs under loss, duplication, reordering and corruption, and checks
// what UC promises: every send completes successfully once; every receive
// completion holds exactly the bytes of one message that was sent (never
// a mix of two); every byte of a WRITE target is either untouched or the
// byte the WRITE carried there; the receiver never sends a packet and
// both QPs stay in RTS.
func TestUCPropertyLossy(t *testing.T) {
	n := 200
	if testing.Short() || enginetest.RaceEnabled {
		n = 30
	}
	for seed := uint64(1); seed <= uint64(n); seed++ {
		if err := runUCWorkload(t, seed); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
	}
}

func runUCWorkload(t *testing.T, seed uint64) error {
	s := enginetest.NewSim(t, seed, enginetest.Impairment{Loss: 0.05, Dup: 0.05, Reorder: 0.10, Corrupt: 0.01, Delay: 2 * time.Microsecond})
	qps := s.Connect(enginetest.QPOpts{Type: qpstate.UC, PMTU: 256, PSN: [2]uint32{uint32(seed*0x9e3779) & bth.PSNMask, 0}})
	const nMsg, maxLen, slot = 40, 3000, 4096
	lmr, local := s.Reg(0, nMsg*slot)
	rmr, remote := s.Reg(1, 2*nMsg*slot)
	enginetest.FillRandom(local, seed)
	rng := s.Rng
	var sends [][]byte // the bytes of each SEND
	for i := range nMsg {
		s.PostRecv(qps[1], uint64(i), rmr.Addr()+uint64(i)*slot, slot, rmr.LKey())
	}
	for i := range nMsg {
		n := 1 + rng.IntN(maxLen)
		w := wr.SendWR{ID: uint64(i), Flags: wr.Signaled, SGL: []wr.SGE{{Addr: lmr.Addr() + uint64(i)*slot, Length: uint32(n), LKey: lmr.LKey()}}}
		if rng.IntN(2) == 0 {
			w.Opcode = wr.Send
			sends = append(sends, local[i*slot:i*slot+n])
		} else {
			w.Opcode, w.RemoteAddr, w.RKey = wr.RDMAWrite, rmr.Addr()+uint64(nMsg+i)*slot, rmr.RKey()
		}
		if err := qps[0].PostSend(&w); err != nil {
			return err
		}
	}
	var sw []cq.WC
	buf := make([]cq.WC, 64)
	s.Pump(func() bool { sw = append(sw, buf[:s.EP[0].SCQ.Poll(buf)]...); return false }, time.Second)
	if len(sw) != nMsg {
		return fmt.Errorf("%d send completions, want %d", len(sw), nMsg)
	}
	for i, wc := range sw {
		if wc.Status != cq.Success || wc.WRID != uint64(i) {
			return fmt.Errorf("send completion %d: %+v", i, wc)
		}
	}
	for {
		k := s.EP[1].RCQ.Poll(buf)
		if k == 0 {
			break
		}
		for _, wc := range buf[:k] {
			if wc.Status != cq.Success {
				return fmt.Errorf("receive completion %+v", wc)
			}
			got := remote[int(wc.WRID)*slot : int(wc.WRID)*slot+int(wc.ByteLen)]
			match := false
			for _, m := range sends {
				match = match || bytes.Equal(got, m)
			}
			if !match {
				return fmt.Errorf("receive %d holds %d bytes that are no message sent", wc.WRID, wc.ByteLen)
			}
		}
	}
	for i := range nMsg {
		target, src := remote[(nMsg+i)*slot:(nMsg+i+1)*slot], local[i*slot:(i+1)*slot]
		for j, b := range target {
			if b != 0 && b != src[j] {
				return fmt.Errorf("WRITE target %d byte %d is %#x, neither untouched nor the WRITE's %#x", i, j, b, src[j])
			}
		}
	}
	if qps[1].Stats().TxPackets != 0 || qps[0].Stats().RxPackets != 0 {
		return fmt.Errorf("UC answered: receiver %+v, sender %+v", qps[1].Stats(), qps[0].Stats())
	}
	if qps[0].State() != qpstate.RTS || qps[1].State() != qpstate.RTS {
		return fmt.Errorf("states %v %v", qps[0].State(), qps[1].State())
	}
	return nil
}

// TestUCBadKeyAllocs: a flood of UC WRITEs with a bad R_Key (which UC
// drops without moving the QP to ERR, so it can go on forever) costs at
// most the key table's error value per packet: nothing is formatted.
func TestUCBadKeyAllocs(t *testing.T) {
	s := enginetest.NewSim(t, 1, enginetest.Impairment{})
	qps := s.Connect(enginetest.QPOpts{Type: qpstate.UC, PMTU: 256})
	rmr, _ := s.Reg(1, 4096)
	f := bth.Fields{BTH: bth.BTHFields{Opcode: Opcode(bth.RCWriteOnly), PKey: 0xffff, DestQP: qps[1].Num()}, VA: rmr.Addr(), RKey: rmr.RKey() ^ 0x80, DMALen: 2}
	buf := make([]byte, bth.Len(f.BTH.Opcode, 2))
	n, err := bth.Build(buf, &f, []byte("xx"))
	if err != nil {
		t.Fatal(err)
	}
	pk := []nic.Packet{{Buf: buf, N: n, Remote: engine.Remote(s.EP[0].Addr)}}
	if a := testing.AllocsPerRun(100, func() { s.EP[1].E.Receive(s.Now, pk) }); a > 1 {
		t.Logf("%.1f", a)
		t.Fatalf("%.1f allocations per dropped UC packet, want at most 1", a)
	}
	if st := qps[1].Stats(); st.Dropped < 100 || qps[1].State() != qpstate.RTS {
		t.Fatalf("state %v, stats %+v", qps[1].State(), st)
	}
}

// TestUCMemoryWindow: a type 2 window bound by a BIND_MW work request on
// a UC QP takes UC WRITEs through its key; after LOCAL_INV, a WRITE
// through the old key is dropped silently.
func TestUCMemoryWindow(t *testing.T) {
	s := enginetest.NewSim(t, 1, enginetest.Impairment{})
	qps := s.Connect(enginetest.QPOpts{Type: qpstate.UC, PMTU: 1024})
	lmr, local := s.Reg(0, 8192)
	enginetest.Fill(local, 3)
	ep := s.EP[1]
	rem := make([]byte, 8192)
	rmr, err := ep.MRs.RegMR(ep.PD, rem, enginetest.AllAccess|memreg.AccessMWBind)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := ep.MRs.AllocMW(ep.PD, memreg.MWType2)
	if err != nil {
		t.Fatal(err)
	}
	k := mw.RKey()&^0xFF | 0x33
	enginetest.MustPost(t, qps[1], &wr.SendWR{ID: 1, Opcode: wr.BindMW, Flags: wr.Signaled, Bind: wr.MWBind{MWKey: mw.RKey(), RKey: k,
		MRKey: rmr.LKey(), Addr: rmr.Addr() + 1024, Length: 3000, Access: uint32(memreg.AccessRemoteWrite)}})
	if wc := s.WaitWC(ep.SCQ, 1, time.Second)[0]; wc.Status != cq.Success || wc.Opcode != cq.OpBindMW {
		t.Fatalf("bind on a UC QP: %+v", wc)
	}
	write := func(n uint32) {
		enginetest.MustPost(t, qps[0], &wr.SendWR{Opcode: wr.RDMAWrite, SGL: []wr.SGE{{Addr: lmr.Addr(), Length: n, LKey: lmr.LKey()}}, RemoteAddr: rmr.Addr() + 1024, RKey: k})
		s.Pump(nil, time.Second)
	}
	write(3000)
	if !bytes.Equal(rem[1024:4024], local[:3000]) {
		t.Fatal("WRITE through the window not placed")
	}
	enginetest.MustPost(t, qps[1], &wr.SendWR{ID: 2, Opcode: wr.LocalInv, Flags: wr.Signaled, InvRKey: k})
	if wc := s.WaitWC(ep.SCQ, 1, time.Second)[0]; wc.Status != cq.Success || wc.Opcode != cq.OpLocalInv {
		t.Fatalf("LOCAL_INV on a UC QP: %+v", wc)
	}
	clear(rem)
	write(100)
	if !bytes.Equal(rem, make([]byte, len(rem))) || qps[1].State() != qpstate.RTS {
		t.Fatalf("WRITE through an invalidated window: placed or QP %v", qps[1].State())
	}
}
