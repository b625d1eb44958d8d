package rc

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"
	"time"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/memreg"
	"github.com/softroce/softroce/qpstate"
	"github.com/softroce/softroce/transport/internal/enginetest"
	"github.com/softroce/softroce/wr"
)

func TestAllOperations(t *testing.T) {
	for _, pmtu := range []int{256, 1024, 4096} {
		s := enginetest.NewSim(t, 1, enginetest.Impairment{})
		s.Keep = true
		qps := s.Connect(enginetest.QPOpts{PMTU: pmtu, PSN: [2]uint32{0xfffff0, 100}, Timeout: 14, Retry: 7, RNRRetry: 7})
		lmr, local := s.Reg(0, 64<<10)
		rmr, remote := s.Reg(1, 64<<10)
		enginetest.Fill(local, 3)
		// WRITE 10000 bytes, then READ them back elsewhere.
		enginetest.MustPost(t, qps[0], &wr.SendWR{ID: 1, Opcode: wr.RDMAWrite, Flags: wr.Signaled,
			SGL: []wr.SGE{{Addr: lmr.Addr(), Length: 10000, LKey: lmr.LKey()}}, RemoteAddr: rmr.Addr() + 8, RKey: rmr.RKey()})
		enginetest.MustPost(t, qps[0], &wr.SendWR{ID: 2, Opcode: wr.RDMARead, Flags: wr.Signaled,
			SGL:        []wr.SGE{{Addr: lmr.Addr() + 20000, Length: 5000, LKey: lmr.LKey()}, {Addr: lmr.Addr() + 30000, Length: 5000, LKey: lmr.LKey()}},
			RemoteAddr: rmr.Addr() + 8, RKey: rmr.RKey()})
		// Atomics on an 8-byte aligned word.
		binary.LittleEndian.PutUint64(remote[40000:], 5)
		enginetest.MustPost(t, qps[0], &wr.SendWR{ID: 3, Opcode: wr.AtomicFetchAndAdd, Flags: wr.Signaled,
			SGL: []wr.SGE{{Addr: lmr.Addr() + 40000, Length: 8, LKey: lmr.LKey()}}, RemoteAddr: rmr.Addr() + 40000, RKey: rmr.RKey(), CompareAdd: 10})
		enginetest.MustPost(t, qps[0], &wr.SendWR{ID: 4, Opcode: wr.AtomicCmpAndSwp, Flags: wr.Signaled,
			SGL: []wr.SGE{{Addr: lmr.Addr() + 40008, Length: 8, LKey: lmr.LKey()}}, RemoteAddr: rmr.Addr() + 40000, RKey: rmr.RKey(), CompareAdd: 15, Swap: 99})
		// SEND with immediate into a posted receive.
		if err := qps[1].PostRecv(&wr.RecvWR{ID: 77, SGL: []wr.SGE{{Addr: rmr.Addr() + 50000, Length: 8000, LKey: rmr.LKey()}}}); err != nil {
			t.Fatal(err)
		}
		enginetest.MustPost(t, qps[0], &wr.SendWR{ID: 5, Opcode: wr.SendWithImm, Flags: wr.Signaled, Imm: 0xdeadbeef,
			SGL: []wr.SGE{{Addr: lmr.Addr() + 100, Length: 3001, LKey: lmr.LKey()}}})
		wcs := s.WaitWC(s.EP[0].SCQ, 5, time.Second)
		for i, wc := range wcs {
			if wc.Status != cq.Success || wc.WRID != uint64(i+1) {
				t.Fatalf("pmtu %d: completion %d = %+v\n%s", pmtu, i, wc, strings.Join(s.Trace, "\n"))
			}
		}
		if !bytes.Equal(remote[8:10008], local[:10000]) {
			t.Fatalf("pmtu %d: WRITE data differs", pmtu)
		}
		if !bytes.Equal(local[20000:25000], local[:5000]) || !bytes.Equal(local[30000:35000], local[5000:10000]) {
			t.Fatalf("pmtu %d: READ data differs", pmtu)
		}
		if got := binary.LittleEndian.Uint64(local[40000:]); got != 5 {
			t.Fatalf("fetch-add original = %d, want 5", got)
		}
		if got := binary.LittleEndian.Uint64(local[40008:]); got != 15 {
			t.Fatalf("cmp-swap original = %d, want 15", got)
		}
		if got := binary.LittleEndian.Uint64(remote[40000:]); got != 99 {
			t.Fatalf("remote word = %d, want 99", got)
		}
		rw := s.WaitWC(s.EP[1].RCQ, 1, time.Second)[0]
		if rw.WRID != 77 || rw.ByteLen != 3001 || rw.ImmData != 0xdeadbeef || rw.Flags&cq.FlagWithImm == 0 || rw.Opcode != cq.OpRecv {
			t.Fatalf("recv completion %+v", rw)
		}
		if !bytes.Equal(remote[50000:53001], local[100:3101]) {
			t.Fatal("SEND data differs")
		}
	}
}

// TestSeqErrorOneNAK drops one packet in the middle of a WRITE: the
// responder sends exactly one PSN sequence error NAK, the requester goes
// back to the NAKed PSN with a MIDDLE packet, and the data arrives intact.
func TestSeqErrorOneNAK(t *testing.T) {
	s := enginetest.NewSim(t, 1, enginetest.Impairment{})
	s.Keep = true
	qps := s.Connect(enginetest.QPOpts{PMTU: 256, PSN: [2]uint32{1000, 5000}, Timeout: 14, Retry: 3})
	lmr, local := s.Reg(0, 4096)
	rmr, remote := s.Reg(1, 4096)
	enginetest.Fill(local, 9)
	s.Rules = []enginetest.Rule{{From: 0, Opcode: -1, PSN: 1002, Nth: 1, Action: "drop"}}
	enginetest.MustPost(t, qps[0], &wr.SendWR{ID: 1, Opcode: wr.RDMAWrite, Flags: wr.Signaled,
		SGL: []wr.SGE{{Addr: lmr.Addr(), Length: 2048, LKey: lmr.LKey()}}, RemoteAddr: rmr.Addr(), RKey: rmr.RKey()})
	wc := s.WaitWC(s.EP[0].SCQ, 1, time.Second)[0]
	if wc.Status != cq.Success {
		t.Fatalf("status %v", wc.Status)
	}
	if !bytes.Equal(remote[:2048], local[:2048]) {
		t.Fatal("data differs")
	}
	want := []string{
		"0>1 RDMA_WRITE_FIRST psn=1000",
		"0>1 RDMA_WRITE_MIDDLE psn=1001",
		"0>1 RDMA_WRITE_MIDDLE psn=1002 DROPPED",
		"0>1 RDMA_WRITE_MIDDLE psn=1003",
	}
	for i, w := range want {
		if s.Trace[i] != w {
			t.Fatalf("trace[%d] = %q, want %q\n%s", i, s.Trace[i], w, strings.Join(s.Trace, "\n"))
		}
	}
	naks := 0
	for _, l := range s.Trace {
		if strings.Contains(l, "PSN sequence error") {
			naks++
			if !strings.Contains(l, "psn=1002") {
				t.Errorf("NAK carries the wrong PSN: %s", l)
			}
		}
	}
	if naks != 1 {
		t.Fatalf("%d sequence NAKs, want exactly 1:\n%s", naks, strings.Join(s.Trace, "\n"))
	}
	// The retry resumes at 1002 with a MIDDLE (no RETH), as rxe does.
	found := false
	for i, l := range s.Trace {
		if strings.Contains(l, "PSN sequence error") {
			for _, m := range s.Trace[i+1:] {
				if strings.HasPrefix(m, "0>1") {
					found = m == "0>1 RDMA_WRITE_MIDDLE psn=1002"
					break
				}
			}
		}
	}
	if !found {
		t.Fatalf("retransmission does not resume at PSN 1002:\n%s", strings.Join(s.Trace, "\n"))
	}
	if qps[1].Stats().SeqNAKsSent != 1 || qps[0].Stats().SeqNAKsRecv != 1 {
		t.Fatalf("NAK counters: sent %d recv %d", qps[1].Stats().SeqNAKsSent, qps[0].Stats().SeqNAKsRecv)
	}
}

// TestRNR: a SEND with no receive posted draws an RNR NAK with the
// responder's min RNR timer; once a receive is posted, the retry after the
// timer succeeds.
func TestRNR(t *testing.T) {
	s := enginetest.NewSim(t, 1, enginetest.Impairment{})
	s.Keep = true
	qps := s.Connect(enginetest.QPOpts{PMTU: 1024, Timeout: 14, Retry: 7, RNRRetry: 7, MinRNR: 14}) // 1.28 ms
	lmr, _ := s.Reg(0, 4096)
	rmr, _ := s.Reg(1, 4096)
	enginetest.MustPost(t, qps[0], &wr.SendWR{ID: 1, Opcode: wr.Send, Flags: wr.Signaled, SGL: []wr.SGE{{Addr: lmr.Addr(), Length: 100, LKey: lmr.LKey()}}})
	s.Pump(nil, 500*time.Microsecond)
	if qps[0].Stats().RNRNAKsRecv != 1 {
		t.Fatalf("RNR NAKs received = %d, want 1\n%s", qps[0].Stats().RNRNAKsRecv, strings.Join(s.Trace, "\n"))
	}
	t0 := s.Now
	if err := qps[1].PostRecv(&wr.RecvWR{ID: 9, SGL: []wr.SGE{{Addr: rmr.Addr(), Length: 4096, LKey: rmr.LKey()}}}); err != nil {
		t.Fatal(err)
	}
	wc := s.WaitWC(s.EP[0].SCQ, 1, time.Second)[0]
	if wc.Status != cq.Success {
		t.Fatalf("status %v", wc.Status)
	}
	if waited := s.Now.Sub(enginetest.Epoch); waited < bth.RNRTimer(14) {
		t.Fatalf("retried after %v, before the RNR timer %v (posted at %v)", waited, bth.RNRTimer(14), t0.Sub(enginetest.Epoch))
	}
	if !strings.Contains(strings.Join(s.Trace, "\n"), "RNR NAK (timer 14") {
		t.Fatalf("no RNR NAK with timer 14 in trace:\n%s", strings.Join(s.Trace, "\n"))
	}
}

// TestRNRWriteWithImm: an RDMA WRITE with immediate that finds no receive
// posted draws an RNR NAK; its retry, once a receive is posted, is taken
// as the same message again (rxe's sequence check looks at the last
// executed opcode), not as a second message cutting into an open one, and
// completes on both sides. One packet (WRITE_ONLY_WITH_IMMEDIATE, what
// qperf's rc_rdma_write_lat sends) and several (the RNR NAK at the LAST).
func TestRNRWriteWithImm(t *testing.T) {
	for _, n := range []uint32{1, 3000} {
		s := enginetest.NewSim(t, 1, enginetest.Impairment{})
		s.Keep = true
		qps := s.Connect(enginetest.QPOpts{PMTU: 1024, Timeout: 14, Retry: 7, RNRRetry: 7, MinRNR: 1})
		lmr, local := s.Reg(0, 4096)
		rmr, remote := s.Reg(1, 4096)
		enginetest.Fill(local, 5)
		enginetest.MustPost(t, qps[0], &wr.SendWR{ID: 1, Opcode: wr.RDMAWriteWithImm, Flags: wr.Signaled, Imm: 0x1234,
			SGL: []wr.SGE{{Addr: lmr.Addr(), Length: n, LKey: lmr.LKey()}}, RemoteAddr: rmr.Addr(), RKey: rmr.RKey()})
		s.Pump(nil, 5*time.Microsecond)
		if qps[0].Stats().RNRNAKsRecv != 1 {
			t.Fatalf("%d bytes: RNR NAKs received = %d, want 1\n%s", n, qps[0].Stats().RNRNAKsRecv, strings.Join(s.Trace, "\n"))
		}
		if err := qps[1].PostRecv(&wr.RecvWR{ID: 9}); err != nil {
			t.Fatal(err)
		}
		wc := s.WaitWC(s.EP[0].SCQ, 1, time.Second)[0]
		if wc.Status != cq.Success {
			t.Fatalf("%d bytes: send completion %+v\n%s", n, wc, strings.Join(s.Trace, "\n"))
		}
		rw := s.WaitWC(s.EP[1].RCQ, 1, time.Second)[0]
		if rw.Status != cq.Success || rw.WRID != 9 || rw.Opcode != cq.OpRecvRDMAWithImm || rw.ImmData != 0x1234 || rw.ByteLen != n {
			t.Fatalf("%d bytes: receive completion %+v", n, rw)
		}
		if !bytes.Equal(remote[:n], local[:n]) {
			t.Fatalf("%d bytes: data differs", n)
		}
		if st := qps[1].State(); st != qpstate.RTS {
			t.Fatalf("%d bytes: responder QP %v, want RTS\n%s", n, st, strings.Join(s.Trace, "\n"))
		}
	}
}

// TestRNRRetryExceeded: rnr_retry 2 gives up after three RNR NAKs.
func TestRNRRetryExceeded(t *testing.T) {
	s := enginetest.NewSim(t, 1, enginetest.Impairment{})
	qps := s.Connect(enginetest.QPOpts{PMTU: 1024, Timeout: 14, Retry: 7, RNRRetry: 2, MinRNR: 1})
	lmr, _ := s.Reg(0, 4096)
	enginetest.MustPost(t, qps[0], &wr.SendWR{ID: 1, Opcode: wr.Send, Flags: wr.Signaled, SGL: []wr.SGE{{Addr: lmr.Addr(), Length: 100, LKey: lmr.LKey()}}})
	enginetest.MustPost(t, qps[0], &wr.SendWR{ID: 2, Opcode: wr.Send, SGL: []wr.SGE{{Addr: lmr.Addr(), Length: 100, LKey: lmr.LKey()}}})
	wcs := s.WaitWC(s.EP[0].SCQ, 2, time.Second)
	if wcs[0].Status != cq.RNRRetryExcErr || wcs[1].Status != cq.WRFlushErr || wcs[1].WRID != 2 {
		t.Fatalf("completions %+v", wcs)
	}
	if qps[0].State() != qpstate.Err {
		t.Fatalf("QP state %v, want ERR", qps[0].State())
	}
	if qps[0].Stats().RNRNAKsRecv != 3 {
		t.Fatalf("RNR NAKs = %d, want 3", qps[0].Stats().RNRNAKsRecv)
	}
}

// TestRemoteAccessError: a bad rkey draws NAK 0x62, the requester
// completes with REM_ACCESS_ERR, flushes the rest and both QPs go to ERR.
func TestRemoteAccessError(t *testing.T) {
	for _, tc := range []struct {
		name string
		wr   func(l, r *memreg.MR) wr.SendWR
		st   cq.Status
	}{
		{"bad rkey", func(l, r *memreg.MR) wr.SendWR {
			return wr.SendWR{Opcode: wr.RDMAWrite, SGL: []wr.SGE{{Addr: l.Addr(), Length: 64, LKey: l.LKey()}}, RemoteAddr: r.Addr(), RKey: r.RKey() ^ 0x5500}
		}, cq.RemAccessErr},
		{"out of bounds", func(l, r *memreg.MR) wr.SendWR {
			return wr.SendWR{Opcode: wr.RDMARead, SGL: []wr.SGE{{Addr: l.Addr(), Length: 64, LKey: l.LKey()}}, RemoteAddr: r.Addr() + 4090, RKey: r.RKey()}
		}, cq.RemAccessErr},
		{"misaligned atomic on the wire", func(l, r *memreg.MR) wr.SendWR {
			return wr.SendWR{Opcode: wr.AtomicFetchAndAdd, SGL: []wr.SGE{{Addr: l.Addr(), Length: 8, LKey: l.LKey()}}, RemoteAddr: r.Addr() + 8, RKey: r.RKey() ^ 0xff}
		}, cq.RemAccessErr},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := enginetest.NewSim(t, 1, enginetest.Impairment{})
			qps := s.Connect(enginetest.QPOpts{PMTU: 1024, Timeout: 14, Retry: 7})
			lmr, _ := s.Reg(0, 4096)
			rmr, _ := s.Reg(1, 4096)
			swr := tc.wr(lmr, rmr)
			swr.ID, swr.Flags = 1, wr.Signaled
			enginetest.MustPost(t, qps[0], &swr)
			enginetest.MustPost(t, qps[0], &wr.SendWR{ID: 2, Opcode: wr.Send, SGL: []wr.SGE{{Addr: lmr.Addr(), Length: 1, LKey: lmr.LKey()}}})
			wcs := s.WaitWC(s.EP[0].SCQ, 2, time.Second)
			if wcs[0].Status != tc.st || wcs[1].Status != cq.WRFlushErr {
				t.Fatalf("completions %v %v", wcs[0].Status, wcs[1].Status)
			}
			if qps[0].State() != qpstate.Err || qps[1].State() != qpstate.Err {
				t.Fatalf("states %v %v", qps[0].State(), qps[1].State())
			}
		})
	}
}

// TestAckLostTimeout drops the only ACK: the requester times out after the
// local ACK timeout, resends, and the responder re-ACKs the duplicate
// without executing it twice.
func TestAckLostTimeout(t *testing.T) {
	s := enginetest.NewSim(t, 1, enginetest.Impairment{})
	s.Keep = true
	qps := s.Connect(enginetest.QPOpts{PMTU: 1024, Timeout: 10, Retry: 3, PSN: [2]uint32{0xffffff, 0}}) // 4.2 ms
	lmr, _ := s.Reg(0, 4096)
	rmr, _ := s.Reg(1, 4096)
	if err := qps[1].PostRecv(&wr.RecvWR{ID: 9, SGL: []wr.SGE{{Addr: rmr.Addr(), Length: 4096, LKey: rmr.LKey()}}}); err != nil {
		t.Fatal(err)
	}
	s.Rules = []enginetest.Rule{{From: 1, Opcode: int(bth.RCAck), PSN: 0xffffff, Nth: 1, Action: "drop"}}
	enginetest.MustPost(t, qps[0], &wr.SendWR{ID: 1, Opcode: wr.Send, Flags: wr.Signaled, SGL: []wr.SGE{{Addr: lmr.Addr(), Length: 10, LKey: lmr.LKey()}}})
	wc := s.WaitWC(s.EP[0].SCQ, 1, time.Second)[0]
	if wc.Status != cq.Success {
		t.Fatalf("status %v", wc.Status)
	}
	if el := s.Now.Sub(enginetest.Epoch); el < localAckTimeout(10) {
		t.Fatalf("completed after %v, before the %v timeout", el, localAckTimeout(10))
	}
	if qps[0].Stats().Timeouts != 1 || qps[1].Stats().DupRequests != 1 {
		t.Fatalf("timeouts %d dups %d\n%s", qps[0].Stats().Timeouts, qps[1].Stats().DupRequests, strings.Join(s.Trace, "\n"))
	}
	if n := s.EP[1].RCQ.Poll(make([]cq.WC, 4)); n != 1 {
		t.Fatalf("%d receive completions, want exactly 1", n)
	}
}

// TestRetryExceeded: a peer that never answers exhausts retry_cnt.
func TestRetryExceeded(t *testing.T) {
	s := enginetest.NewSim(t, 1, enginetest.Impairment{Loss: 1})
	qps := s.Connect(enginetest.QPOpts{PMTU: 1024, Timeout: 8, Retry: 2})
	lmr, _ := s.Reg(0, 4096)
	enginetest.MustPost(t, qps[0], &wr.SendWR{ID: 1, Opcode: wr.RDMAWrite, SGL: []wr.SGE{{Addr: lmr.Addr(), Length: 10, LKey: lmr.LKey()}}, RemoteAddr: 0, RKey: 1})
	wc := s.WaitWC(s.EP[0].SCQ, 1, 10*time.Second)[0]
	if wc.Status != cq.RetryExcErr {
		t.Fatalf("status %v", wc.Status)
	}
	if qps[0].Stats().Timeouts != 3 {
		t.Fatalf("timeouts = %d, want 3 (1 + retry_cnt 2)", qps[0].Stats().Timeouts)
	}
}
