package rc

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/memreg"
	"github.com/softroce/softroce/qpstate"
	"github.com/softroce/softroce/transport/engine"
	"github.com/softroce/softroce/transport/internal/enginetest"
	"github.com/softroce/softroce/wr"
)

// TestRemoteInvalidateOfUserMRIsClassJ: a peer's SEND_ONLY_WITH_INVALIDATE
// naming the rkey of an ordinary MR must not invalidate it. As rxe (class
// J): no NAK goes out (the SEND is ACKed), the receive completes REM_INV_REQ_ERR, the QP moves
// to ERR; the MR stays writable through another QP.
func TestRemoteInvalidateOfUserMRIsClassJ(t *testing.T) {
	s := enginetest.NewSim(t, 1, enginetest.Impairment{})
	qps := s.Connect(enginetest.QPOpts{PMTU: 1024, PSN: [2]uint32{40, 0}, Timeout: 14, Retry: 7})
	rmr, rbuf := s.Reg(1, 4096)
	var fatal []string
	s.EP[1].E.OnAsyncError = func(qpn uint32, reason string) { fatal = append(fatal, reason) }
	if err := qps[1].PostRecv(&wr.RecvWR{ID: 5, SGL: []wr.SGE{{Addr: rmr.Addr(), Length: 64, LKey: rmr.LKey()}}}); err != nil {
		t.Fatal(err)
	}
	// A WRITE first, in the same batch: its ACK is owed and still goes out.
	swr := bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCWriteOnly, PSN: 40, AckReq: true}, VA: rmr.Addr() + 100, RKey: rmr.RKey(), DMALen: 4}
	s.Feed(1, qps[1], swr, []byte{1, 2, 3, 4})
	inv := bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCSendOnlyInv, PSN: 41, AckReq: true}, InvRKey: rmr.RKey()}
	s.Feed(1, qps[1], inv, []byte("hello"))
	lines := s.Drain(1)
	enginetest.ExpectLines(t, "answers to WRITE + SEND_WITH_INV(user MR)", lines, "ACKNOWLEDGE psn=40 ACK (credits unlimited)",
		"ACKNOWLEDGE psn=41 ACK (credits unlimited)")
	wcs := make([]cq.WC, 4)
	if n := s.EP[1].RCQ.Poll(wcs); n != 1 || wcs[0].WRID != 5 || wcs[0].Status != cq.RemInvReqErr || wcs[0].Flags&cq.FlagWithInv != 0 {
		t.Fatalf("receive completions %+v", wcs[:n])
	}
	if qps[1].State() != qpstate.Err || len(fatal) != 1 {
		t.Fatalf("state %v, fatal events %q", qps[1].State(), fatal)
	}
	// The MR survives: a WRITE through a fresh QP pair lands.
	qps2 := s.Connect(enginetest.QPOpts{PMTU: 1024, Timeout: 14, Retry: 7})
	lmr, lbuf := s.Reg(0, 4096)
	enginetest.Fill(lbuf, 11)
	enginetest.MustPost(t, qps2[0], &wr.SendWR{ID: 9, Opcode: wr.RDMAWrite, Flags: wr.Signaled, SGL: []wr.SGE{{Addr: lmr.Addr(), Length: 256, LKey: lmr.LKey()}},
		RemoteAddr: rmr.Addr() + 1024, RKey: rmr.RKey()})
	if wc := s.WaitWC(s.EP[0].SCQ, 1, time.Second)[0]; wc.Status != cq.Success {
		t.Fatalf("WRITE to the MR after the refused invalidate: %v", wc.Status)
	}
	if !bytes.Equal(rbuf[1024:1280], lbuf[:256]) {
		t.Fatal("WRITE data did not land")
	}
}

// readThenStop sets up a 512 KiB READ at MTU 256 (2048 responses) against
// endpoint 1 and lets the responder send one batch of it.
func readThenStop(t *testing.T) (*enginetest.Sim, [2]*engine.QP) {
	s := enginetest.NewSim(t, 1, enginetest.Impairment{})
	qps := s.Connect(enginetest.QPOpts{PMTU: 256, PSN: [2]uint32{7, 0}, Timeout: 14, Retry: 7})
	rmr, _ := s.Reg(1, 512<<10)
	rd := bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCReadRequest, PSN: 7, AckReq: true}, VA: rmr.Addr(), RKey: rmr.RKey(), DMALen: 512 << 10}
	s.Feed(1, qps[1], rd, nil)
	if n := s.ProgressOnce(1); n == 0 {
		t.Fatal("no READ responses")
	}
	// A WRITE with AckReq waits in the backlog behind the READ.
	swr := bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCWriteOnly, PSN: 7 + 2048, AckReq: true}, VA: rmr.Addr(), RKey: rmr.RKey(), DMALen: 4}
	s.Feed(1, qps[1], swr, []byte{1, 2, 3, 4})
	if rcOf(qps[1]).resp.blN != 1 || len(rcOf(qps[1]).resp.jobs) != 1 {
		t.Fatalf("setup: backlog %d jobs %d", rcOf(qps[1]).resp.blN, len(rcOf(qps[1]).resp.jobs))
	}
	return s, qps
}

// TestErrStopsReadResponses: a QP moved to ERR in the middle of a long
// READ sends nothing more: no READ response, no ACK, nothing from the
// backlog, nothing already built.
func TestErrStopsReadResponses(t *testing.T) {
	s, qps := readThenStop(t)
	qps[1].SetState(qpstate.Err)
	s.Now = s.Now.Add(time.Second)
	if lines := s.Drain(1); len(lines) != 0 {
		t.Fatalf("%d packets after ERR, first %q", len(lines), lines[0])
	}
	if !s.EP[1].E.NextDeadline().IsZero() {
		t.Fatal("a timer is still armed")
	}
	// Requests arriving in ERR are dropped silently, too.
	s.Feed(1, qps[1], bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCSendOnly, PSN: 7 + 2049, AckReq: true}}, nil)
	if lines := s.Drain(1); len(lines) != 0 {
		t.Fatalf("answer in ERR: %q", lines)
	}
}

// TestErrKeepsBuiltACKs: an ACK and an atomic ACK that Receive built for
// requests it executed still go out once the QP is in ERR (their
// completions may already be visible); they are not the QP's any more.
func TestErrKeepsBuiltACKs(t *testing.T) {
	s := enginetest.NewSim(t, 1, enginetest.Impairment{})
	qps := s.Connect(enginetest.QPOpts{PMTU: 1024, PSN: [2]uint32{3, 0}})
	rmr, _ := s.Reg(1, 4096)
	s.Feed(1, qps[1], bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCWriteOnly, PSN: 3, AckReq: true}, VA: rmr.Addr(), RKey: rmr.RKey(), DMALen: 4}, []byte{1, 2, 3, 4})
	s.Feed(1, qps[1], bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCFetchAdd, PSN: 4, AckReq: true}, VA: rmr.Addr() + 8, RKey: rmr.RKey(), SwapAdd: 1}, nil)
	if n := qps[1].Batched(); n != 2 {
		t.Fatalf("setup: %d packets built", n)
	}
	qps[1].SetState(qpstate.Err)
	lines := s.Drain(1)
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "ACKNOWLEDGE psn=3 ") || !strings.HasPrefix(lines[1], "ATOMIC_ACKNOWLEDGE psn=4 ") {
		t.Fatalf("packets after ERR: %q, want the ACK of PSN 3 and the atomic ACK of PSN 4", lines)
	}
	if qps[1].Stats().TxPackets != 0 {
		t.Fatalf("kept ACKs counted on the stopped QP: %d", qps[1].Stats().TxPackets)
	}
	s.Now = s.Now.Add(time.Second)
	if lines := s.Drain(1); len(lines) != 0 {
		t.Fatalf("more packets later: %q", lines)
	}
}

// TestErrStopsRequester: a requester moved to ERR mid-WRITE sends nothing
// more (not the rest of the message, no retransmission after its timer)
// and flushes its WQEs with WR_FLUSH_ERR.
func TestErrStopsRequester(t *testing.T) {
	s := enginetest.NewSim(t, 1, enginetest.Impairment{})
	qps := s.Connect(enginetest.QPOpts{PMTU: 256, Timeout: 8, Retry: 7})
	lmr, _ := s.Reg(0, 64<<10)
	rmr, _ := s.Reg(1, 64<<10)
	enginetest.MustPost(t, qps[0], &wr.SendWR{ID: 1, Opcode: wr.RDMAWrite, Flags: wr.Signaled, SGL: []wr.SGE{{Addr: lmr.Addr(), Length: 32 << 10, LKey: lmr.LKey()}}, RemoteAddr: rmr.Addr(), RKey: rmr.RKey()})
	enginetest.MustPost(t, qps[0], &wr.SendWR{ID: 2, Opcode: wr.RDMARead, Flags: wr.Signaled, SGL: []wr.SGE{{Addr: lmr.Addr(), Length: 64, LKey: lmr.LKey()}}, RemoteAddr: rmr.Addr(), RKey: rmr.RKey()})
	if n := s.ProgressOnce(0); n == 0 {
		t.Fatal("nothing sent")
	}
	// Some packets of the WRITE are built and waiting (a second batch).
	e := s.EP[0].E
	var built int
	e.Sync(func() {
		rcOf(qps[0]).transmit(qps[0].Batched() + 5)
		built = qps[0].Batched()
	})
	if built == 0 {
		t.Fatal("setup: nothing built")
	}
	qps[0].SetState(qpstate.Err)
	s.Now = s.Now.Add(time.Second)
	if lines := s.Drain(0); len(lines) != 0 {
		t.Fatalf("%d packets after ERR, first %q", len(lines), lines[0])
	}
	if !s.EP[0].E.NextDeadline().IsZero() {
		t.Fatal("retransmission timer still armed")
	}
	wcs := make([]cq.WC, 4)
	if n := s.EP[0].SCQ.Poll(wcs); n != 2 || wcs[0].Status != cq.WRFlushErr || wcs[1].Status != cq.WRFlushErr || wcs[0].WRID != 1 {
		t.Fatalf("completions %+v", wcs[:n])
	}
}

// TestDestroyQPRemovesEveryTrace: DestroyQP in the middle of a long READ
// stops it at once and leaves the QP nowhere in the engine; a second
// destroy fails.
func TestDestroyQPRemovesEveryTrace(t *testing.T) {
	s, qps := readThenStop(t)
	e := s.EP[1].E
	// Give it an armed timer and a pending ACK as well.
	qp := qps[1]
	e.Sync(func() {
		qp.RetryDeadline = s.Now.Add(time.Millisecond)
		qp.UpdateTimerSet()
		rq := rcOf(qp)
		rq.ackPending, rq.ackPSN = true, 6
		rq.sendAck() // built, not handed out
	})
	if err := e.DestroyQP(qp); err != nil {
		t.Fatal(err)
	}
	s.Now = s.Now.Add(time.Second)
	// The ACK it had built still goes out (kept, not the QP's any more);
	// nothing else does.
	if lines := s.Drain(1); len(lines) != 1 || !strings.HasPrefix(lines[0], "ACKNOWLEDGE psn=6 ") {
		t.Fatalf("packets after DestroyQP: %q, want only the ACK built before", lines)
	}
	timed, inPending, known := e.Holds(qp)
	if timed || inPending || known || rcOf(qp).resp.blN != 0 || len(rcOf(qp).resp.jobs) != 0 {
		t.Fatalf("traces left: timed %v pending/tx %v known %v backlog %d jobs %d", timed, inPending, known, rcOf(qp).resp.blN, len(rcOf(qp).resp.jobs))
	}
	if !e.NextDeadline().IsZero() {
		t.Fatal("a deadline is still reported")
	}
	if err := e.DestroyQP(qp); !errors.Is(err, engine.ErrNoQP) {
		t.Fatalf("second DestroyQP = %v, want ErrNoQP", err)
	}
	if err := qp.PostSend(&wr.SendWR{Opcode: wr.Send}); !errors.Is(err, engine.ErrState) {
		t.Fatalf("PostSend after destroy = %v", err)
	}
	if err := qp.PostRecv(&wr.RecvWR{}); !errors.Is(err, engine.ErrState) {
		t.Fatalf("PostRecv after destroy = %v", err)
	}
	// A state change after destroy does nothing (no flush, no schedule).
	qp.SetState(qpstate.Err)
	if qp.State() != qpstate.Reset {
		t.Fatalf("state after destroy %v", qp.State())
	}
	if other := s.EP[0].E; other.DestroyQP(qp) == nil {
		t.Fatal("DestroyQP of another engine's QP succeeded")
	}
}

// ackTo builds a response for endpoint 0's requester.
func ackTo(op bth.Opcode, psn uint32, syn bth.Syndrome) bth.Fields {
	return bth.Fields{BTH: bth.BTHFields{Opcode: op, PSN: psn}, Syndrome: syn}
}

// TestStaleNAKKeepsCompPSN: after an ACK moved compPSN forward inside a
// long WRITE, a delayed PSN sequence error NAK or RNR NAK for an earlier
// PSN must not move it back.
func TestStaleNAKKeepsCompPSN(t *testing.T) {
	for _, syn := range []bth.Syndrome{bth.SyndromePSNSeqError, bth.RNRNAK(1)} {
		t.Run(syn.String(), func(t *testing.T) {
			s := enginetest.NewSim(t, 1, enginetest.Impairment{})
			qps := s.Connect(enginetest.QPOpts{PMTU: 256, PSN: [2]uint32{100, 0}, Timeout: 14, Retry: 7, RNRRetry: 7})
			lmr, _ := s.Reg(0, 4096)
			rmr, _ := s.Reg(1, 4096)
			enginetest.MustPost(t, qps[0], &wr.SendWR{ID: 1, Opcode: wr.RDMAWrite, Flags: wr.Signaled, SGL: []wr.SGE{{Addr: lmr.Addr(), Length: 2048, LKey: lmr.LKey()}}, RemoteAddr: rmr.Addr(), RKey: rmr.RKey()})
			if lines := s.Drain(0); len(lines) != 8 {
				t.Fatalf("sent %q", lines)
			}
			s.Feed(0, qps[0], ackTo(bth.RCAck, 104, bth.SyndromeACKUnlimited), nil)
			if rcOf(qps[0]).compPSN != 105 {
				t.Fatalf("compPSN %d after ACK 104", rcOf(qps[0]).compPSN)
			}
			s.Feed(0, qps[0], ackTo(bth.RCAck, 102, syn), nil)
			if rcOf(qps[0]).compPSN != 105 {
				t.Fatalf("compPSN moved back to %d by a stale %v at 102", rcOf(qps[0]).compPSN, syn)
			}
			if lines := s.Drain(0); len(lines) != 0 {
				t.Fatalf("stale NAK caused a retransmission: %q", lines)
			}
			s.Feed(0, qps[0], ackTo(bth.RCAck, 107, bth.SyndromeACKUnlimited), nil)
			wcs := make([]cq.WC, 2)
			if n := s.EP[0].SCQ.Poll(wcs); n != 1 || wcs[0].Status != cq.Success {
				t.Fatalf("completions %+v", wcs[:n])
			}
		})
	}
}

// TestDuplicateReadRangeWraps: a duplicate READ whose va+len wraps past
// 2^64 is not a subset of the original and is not replayed.
func TestDuplicateReadRangeWraps(t *testing.T) {
	s := enginetest.NewSim(t, 1, enginetest.Impairment{})
	qps := s.Connect(enginetest.QPOpts{PMTU: 256, PSN: [2]uint32{10, 0}})
	rmr, _ := s.Reg(1, 4096)
	rd := bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCReadRequest, PSN: 10, AckReq: true}, VA: rmr.Addr(), RKey: rmr.RKey(), DMALen: 512}
	enginetest.ExpectLines(t, "READ", s.Inject(qps[1], rd, nil),
		"RDMA_READ_RESPONSE_FIRST psn=10 ACK (credits unlimited) msn=1 len=256",
		"RDMA_READ_RESPONSE_LAST psn=11 ACK (credits unlimited) msn=1 len=256")
	dup := rd
	dup.VA, dup.DMALen = ^uint64(0)-7, 16 // va+len wraps to 8
	enginetest.ExpectLines(t, "duplicate READ with a wrapping range", s.Inject(qps[1], dup, nil))
	// A genuine subset is still replayed.
	dup.BTH.PSN, dup.VA, dup.DMALen = 11, rmr.Addr()+256, 256
	enginetest.ExpectLines(t, "duplicate READ of the second half", s.Inject(qps[1], dup, nil),
		"RDMA_READ_RESPONSE_LAST psn=11 ACK (credits unlimited) msn=1 len=256")
}

// TestSendCQOverrun: a send CQ too small for the completions raises its
// CQ_ERR event, and the QP goes to ERR with the QP-fatal hook, as the
// receive side does.
func TestSendCQOverrun(t *testing.T) {
	s := enginetest.NewSim(t, 1, enginetest.Impairment{})
	small, _ := cq.New(1)
	s.EP[0].SCQ = small
	var fatal []string
	s.EP[0].E.OnAsyncError = func(qpn uint32, reason string) { fatal = append(fatal, fmt.Sprintf("%d %s", qpn, reason)) }
	qps := s.Connect(enginetest.QPOpts{PMTU: 1024, Timeout: 14, Retry: 7})
	lmr, _ := s.Reg(0, 4096)
	rmr, _ := s.Reg(1, 4096)
	for i := 0; i < 3; i++ {
		enginetest.MustPost(t, qps[0], &wr.SendWR{ID: uint64(i), Opcode: wr.RDMAWrite, Flags: wr.Signaled, SGL: []wr.SGE{{Addr: lmr.Addr(), Length: 8, LKey: lmr.LKey()}}, RemoteAddr: rmr.Addr(), RKey: rmr.RKey()})
	}
	s.Pump(nil, 100*time.Millisecond)
	select {
	case ev := <-small.Events():
		if ev.Type != cq.EventCQErr {
			t.Fatalf("CQ event %+v", ev)
		}
	default:
		t.Fatal("no CQ error event")
	}
	if qps[0].State() != qpstate.Err {
		t.Fatalf("QP state %v after a send CQ overrun, want ERR", qps[0].State())
	}
	if len(fatal) != 1 || !strings.Contains(fatal[0], fmt.Sprint(qps[0].Num())) || !strings.Contains(fatal[0], "send CQ overrun") {
		t.Fatalf("fatal events %q", fatal)
	}
}

// TestAtomicByteLen: CAS and FAA completions report 8 bytes (cq.WC).
func TestAtomicByteLen(t *testing.T) {
	s := enginetest.NewSim(t, 1, enginetest.Impairment{})
	qps := s.Connect(enginetest.QPOpts{PMTU: 1024, Timeout: 14, Retry: 7})
	lmr, _ := s.Reg(0, 4096)
	rmr, _ := s.Reg(1, 4096)
	enginetest.MustPost(t, qps[0], &wr.SendWR{ID: 1, Opcode: wr.AtomicFetchAndAdd, Flags: wr.Signaled, SGL: []wr.SGE{{Addr: lmr.Addr(), Length: 8, LKey: lmr.LKey()}}, RemoteAddr: rmr.Addr(), RKey: rmr.RKey(), CompareAdd: 1})
	enginetest.MustPost(t, qps[0], &wr.SendWR{ID: 2, Opcode: wr.AtomicCmpAndSwp, Flags: wr.Signaled, SGL: []wr.SGE{{Addr: lmr.Addr() + 8, Length: 8, LKey: lmr.LKey()}}, RemoteAddr: rmr.Addr(), RKey: rmr.RKey(), CompareAdd: 1, Swap: 5})
	for _, wc := range s.WaitWC(s.EP[0].SCQ, 2, time.Second) {
		if wc.Status != cq.Success || wc.ByteLen != 8 {
			t.Errorf("%v completion: status %v byte_len %d, want 8", wc.Opcode, wc.Status, wc.ByteLen)
		}
	}
}

// TestSGELimitsSplit: the send and receive SGE limits are checked apart.
func TestSGELimitsSplit(t *testing.T) {
	mrs := memreg.NewTable(memreg.Limits{})
	pd, _ := mrs.AllocPD()
	c, _ := cq.New(16)
	e := engine.NewEngine(mrs)
	sges := func(n int) []wr.SGE { return make([]wr.SGE, n) }
	for _, tc := range []struct{ send, recv int }{{1, 3}, {3, 1}} {
		qp, err := e.CreateQP(engine.QPConfig{PD: pd, SendCQ: c, RecvCQ: c, MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: tc.send, MaxRecvSGE: tc.recv})
		if err != nil {
			t.Fatal(err)
		}
		qp.SetState(qpstate.Init)
		qp.SetState(qpstate.RTR)
		qp.SetState(qpstate.RTS)
		if err := qp.PostSend(&wr.SendWR{Opcode: wr.Send, SGL: sges(tc.send + 1)}); err == nil || !strings.Contains(err.Error(), "max_send_sge") {
			t.Errorf("send %d/recv %d: post send with %d SGEs = %v", tc.send, tc.recv, tc.send+1, err)
		}
		if err := qp.PostSend(&wr.SendWR{Opcode: wr.Send, SGL: sges(tc.send)}); err != nil {
			t.Errorf("send %d/recv %d: post send with %d SGEs = %v", tc.send, tc.recv, tc.send, err)
		}
		if err := qp.PostRecv(&wr.RecvWR{SGL: sges(tc.recv + 1)}); err == nil || !strings.Contains(err.Error(), "max_recv_sge") {
			t.Errorf("send %d/recv %d: post recv with %d SGEs = %v", tc.send, tc.recv, tc.recv+1, err)
		}
		if err := qp.PostRecv(&wr.RecvWR{SGL: sges(tc.recv)}); err != nil {
			t.Errorf("send %d/recv %d: post recv with %d SGEs = %v", tc.send, tc.recv, tc.recv, err)
		}
	}
}

// TestResetForgetsSentPSNs: RESET starts the QP afresh. A QP reconnected
// with an SQPSN behind the PSNs of its previous life must not count its
// new packets as retransmissions, nor take its old high PSN as a bound.
func TestResetForgetsSentPSNs(t *testing.T) {
	s := enginetest.NewSim(t, 1, enginetest.Impairment{})
	qps := s.Connect(enginetest.QPOpts{PMTU: 1024, PSN: [2]uint32{5000, 0}, Timeout: 14, Retry: 7})
	lmr, _ := s.Reg(0, 4096)
	rmr, _ := s.Reg(1, 4096)
	enginetest.MustPost(t, qps[0], &wr.SendWR{ID: 1, Opcode: wr.RDMAWrite, Flags: wr.Signaled, SGL: []wr.SGE{{Addr: lmr.Addr(), Length: 8, LKey: lmr.LKey()}}, RemoteAddr: rmr.Addr(), RKey: rmr.RKey()})
	s.WaitWC(s.EP[0].SCQ, 1, time.Second)
	for i, qp := range qps {
		qp.SetState(qpstate.Reset)
		qp.SetState(qpstate.Init)
		p := qp.Path()
		p.SQPSN, p.RQPSN = [2]uint32{10, 0}[i], [2]uint32{0, 10}[i]
		qp.SetPath(p)
		qp.SetState(qpstate.RTR)
		qp.SetState(qpstate.RTS)
	}
	enginetest.MustPost(t, qps[0], &wr.SendWR{ID: 2, Opcode: wr.RDMAWrite, Flags: wr.Signaled, SGL: []wr.SGE{{Addr: lmr.Addr(), Length: 8, LKey: lmr.LKey()}}, RemoteAddr: rmr.Addr(), RKey: rmr.RKey()})
	if wc := s.WaitWC(s.EP[0].SCQ, 1, time.Second)[0]; wc.Status != cq.Success || wc.WRID != 2 {
		t.Fatalf("completion %+v", wc)
	}
	if qps[0].Stats().Retransmits != 0 || rcOf(qps[0]).maxSentPSN != 10 {
		t.Fatalf("after RESET: %d retransmits counted, maxSentPSN %d", qps[0].Stats().Retransmits, rcOf(qps[0]).maxSentPSN)
	}
}

// TestRecvCQOverrunNotAcked: a SEND whose receive completion overruns the
// CQ is not acknowledged (the requester must not see it as delivered);
// the SEND before it keeps its ACK, and the QP goes to ERR.
func TestRecvCQOverrunNotAcked(t *testing.T) {
	s := enginetest.NewSimCQ(t, 1, enginetest.Impairment{}, 1)
	qps := s.Connect(enginetest.QPOpts{PMTU: 1024, PSN: [2]uint32{20, 0}})
	rmr, _ := s.Reg(1, 4096)
	for i := 0; i < 2; i++ {
		if err := qps[1].PostRecv(&wr.RecvWR{ID: uint64(i), SGL: []wr.SGE{{Addr: rmr.Addr() + uint64(i)*64, Length: 64, LKey: rmr.LKey()}}}); err != nil {
			t.Fatal(err)
		}
	}
	s.Feed(1, qps[1], bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCSendOnly, PSN: 20, AckReq: true}}, []byte("one"))
	s.Feed(1, qps[1], bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCSendOnly, PSN: 21, AckReq: true}}, []byte("two"))
	enginetest.ExpectLines(t, "answers", s.Drain(1), "ACKNOWLEDGE psn=20 ACK (credits unlimited)")
	if qps[1].State() != qpstate.Err {
		t.Fatalf("state %v", qps[1].State())
	}
}

// TestErrFlushesReceiveInProgress: a receive WQE that a multi-packet SEND
// has taken (FIRST arrived, LAST not yet) is flushed with WR_FLUSH_ERR when
// the QP enters ERR, before the WQEs still queued behind it.
func TestErrFlushesReceiveInProgress(t *testing.T) {
	s := enginetest.NewSim(t, 1, enginetest.Impairment{})
	qps := s.Connect(enginetest.QPOpts{PMTU: 256, PSN: [2]uint32{9, 0}})
	rmr, _ := s.Reg(1, 4096)
	for id := uint64(1); id <= 2; id++ {
		if err := qps[1].PostRecv(&wr.RecvWR{ID: id, SGL: []wr.SGE{{Addr: rmr.Addr(), Length: 1024, LKey: rmr.LKey()}}}); err != nil {
			t.Fatal(err)
		}
	}
	s.Feed(1, qps[1], bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCSendFirst, PSN: 9}}, make([]byte, 256))
	qps[1].SetState(qpstate.Err)
	wcs := make([]cq.WC, 4)
	n := s.EP[1].RCQ.Poll(wcs)
	if n != 2 || wcs[0].WRID != 1 || wcs[1].WRID != 2 || wcs[0].Status != cq.WRFlushErr || wcs[1].Status != cq.WRFlushErr {
		t.Fatalf("receive completions %+v, want WR 1 then WR 2, both WR_FLUSH_ERR", wcs[:n])
	}
}

// backlogBuffers counts the packet buffers a QP's backlog holds.
func backlogBuffers(qp *engine.QP) int {
	n := 0
	for _, b := range rcOf(qp).resp.backlog {
		if b != nil {
			n++
		}
	}
	return n
}

// TestBacklogHoldsBuffersOnlyWhileDeferred: a deferred request holds one
// pool buffer, given back once it has run or the QP stops, so a QP that
// once deferred does not keep a backlog's worth of packet buffers.
func TestBacklogHoldsBuffersOnlyWhileDeferred(t *testing.T) {
	s, qps := readThenStop(t)
	if n := backlogBuffers(qps[1]); n != 1 {
		t.Fatalf("%d buffers held for 1 deferred request", n)
	}
	lines := s.Drain(1) // the rest of the READ, then the deferred WRITE's ACK
	if len(lines) == 0 || !strings.HasPrefix(lines[len(lines)-1], "ACKNOWLEDGE psn=2055 ") {
		t.Fatalf("deferred WRITE not answered last: %d packets, last %q", len(lines), lines[len(lines)-1])
	}
	if n := backlogBuffers(qps[1]); n != 0 || rcOf(qps[1]).resp.blN != 0 {
		t.Fatalf("after the drain: %d buffers held, %d deferred", n, rcOf(qps[1]).resp.blN)
	}
	_, qps2 := readThenStop(t)
	qps2[1].SetState(qpstate.Err)
	if n := backlogBuffers(qps2[1]); n != 0 {
		t.Fatalf("after ERR: %d buffers held", n)
	}
}
