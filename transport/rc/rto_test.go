package rc

import (
	"strings"
	"testing"
	"time"

	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/transport/engine"
	"github.com/softroce/softroce/transport/internal/enginetest"
	"github.com/softroce/softroce/wr"
)

// slowWrites runs n 4 KiB WRITEs one after another over a path whose
// one-way delay is 200 us (a 400 us round trip) with a 65.5 us IBTA local
// ACK timeout (Timeout 4), and returns the requester's timeouts after the
// first WRITE and after all of them.
func slowWrites(t *testing.T, adaptive bool, n int) (first, all uint64, qps [2]*engine.QP) {
	s := enginetest.NewSim(t, 1, enginetest.Impairment{Delay: 200 * time.Microsecond})
	qps = s.Connect(enginetest.QPOpts{PMTU: 1024, Timeout: 4, Retry: 7, Adaptive: adaptive})
	lmr, _ := s.Reg(0, 4096)
	rmr, _ := s.Reg(1, 4096*n)
	for i := 0; i < n; i++ {
		enginetest.MustPost(t, qps[0], &wr.SendWR{ID: uint64(i), Opcode: wr.RDMAWrite, Flags: wr.Signaled,
			SGL: []wr.SGE{{Addr: lmr.Addr(), Length: 4096, LKey: lmr.LKey()}}, RemoteAddr: rmr.Addr() + uint64(4096*i), RKey: rmr.RKey()})
		wc := s.WaitWC(s.EP[0].SCQ, 1, time.Second)[0]
		if wc.Status != cq.Success {
			t.Fatalf("WRITE %d: %v", i, wc.Status)
		}
		if i == 0 {
			first = qps[0].Stats().Timeouts
		}
	}
	return first, qps[0].Stats().Timeouts, qps
}

// TestAdaptiveTimeoutFollowsSlowRTT: with a round trip six times the IBTA
// timeout, the fixed timeout expires for every WRITE (a spurious go-back-N
// each time), while the adaptive one, starting from its conservative
// initial value (1 ms, above this round trip), times the first WRITE,
// learns the round trip from it and never expires.
func TestAdaptiveTimeoutFollowsSlowRTT(t *testing.T) {
	const n = 20
	_, fixed, _ := slowWrites(t, false, n)
	if fixed < n {
		t.Fatalf("fixed timeout: %d expiries over %d WRITEs, want at least one each (the test's premise)", fixed, n)
	}
	_, all, qps := slowWrites(t, true, n)
	if all != 0 {
		t.Fatalf("adaptive: %d expiries over %d WRITEs of a 400 us round trip, want none", all, n)
	}
	base := localAckTimeout(4)
	got := rcOf(qps[0]).ackTimeout()
	if got <= 400*time.Microsecond || got > maxAdaptiveTimeout {
		t.Fatalf("adaptive timeout %v after a 400 us round trip (IBTA %v, cap %v)", got, base, maxAdaptiveTimeout)
	}
	if r := rcOf(qps[0]).rtt; r.srtt < 400*time.Microsecond || r.srtt > 450*time.Microsecond {
		t.Fatalf("srtt %v, want about 400 us", r.srtt)
	}
}

// TestAdaptiveTimeoutNeverBelowIBTA: on a fast path the estimate falls far
// below the IBTA timeout, which stays the floor.
func TestAdaptiveTimeoutNeverBelowIBTA(t *testing.T) {
	s := enginetest.NewSim(t, 1, enginetest.Impairment{})
	qps := s.Connect(enginetest.QPOpts{PMTU: 1024, Timeout: 10, Retry: 3, Adaptive: true})
	lmr, _ := s.Reg(0, 4096)
	rmr, _ := s.Reg(1, 4096)
	for i := 0; i < 10; i++ {
		enginetest.MustPost(t, qps[0], &wr.SendWR{ID: uint64(i), Opcode: wr.RDMAWrite, Flags: wr.Signaled,
			SGL: []wr.SGE{{Addr: lmr.Addr(), Length: 100, LKey: lmr.LKey()}}, RemoteAddr: rmr.Addr(), RKey: rmr.RKey()})
		if wc := s.WaitWC(s.EP[0].SCQ, 1, time.Second)[0]; wc.Status != cq.Success {
			t.Fatalf("status %v", wc.Status)
		}
	}
	if !rcOf(qps[0]).rtt.valid || rcOf(qps[0]).rtt.srtt >= localAckTimeout(10) {
		t.Fatalf("no fast sample: %+v", rcOf(qps[0]).rtt)
	}
	if got := rcOf(qps[0]).ackTimeout(); got != localAckTimeout(10) {
		t.Fatalf("timeout %v, want the IBTA %v", got, localAckTimeout(10))
	}
	// The backed-off timeout is still capped.
	rcOf(qps[0]).rtt.shift = 16
	if got := rcOf(qps[0]).ackTimeout(); got != maxAdaptiveTimeout {
		t.Fatalf("backed-off timeout %v, want the cap %v", got, maxAdaptiveTimeout)
	}
}

// TestAdaptiveTimeoutRecoversLoss: once the timeout has adapted to a slow
// round trip, a lost packet is still retransmitted after it (one expiry,
// later than the IBTA timeout, earlier than the cap) and the WRITE completes.
func TestAdaptiveTimeoutRecoversLoss(t *testing.T) {
	s := enginetest.NewSim(t, 1, enginetest.Impairment{Delay: 200 * time.Microsecond})
	s.Keep = true
	qps := s.Connect(enginetest.QPOpts{PMTU: 1024, Timeout: 4, Retry: 7, Adaptive: true})
	lmr, _ := s.Reg(0, 4096)
	rmr, _ := s.Reg(1, 4096)
	write := func(id uint64) time.Duration {
		t0 := s.Now
		enginetest.MustPost(t, qps[0], &wr.SendWR{ID: id, Opcode: wr.RDMAWrite, Flags: wr.Signaled,
			SGL: []wr.SGE{{Addr: lmr.Addr(), Length: 4096, LKey: lmr.LKey()}}, RemoteAddr: rmr.Addr(), RKey: rmr.RKey()})
		if wc := s.WaitWC(s.EP[0].SCQ, 1, time.Second)[0]; wc.Status != cq.Success {
			t.Fatalf("WRITE %d: %v", id, wc.Status)
		}
		return s.Now.Sub(t0)
	}
	for i := 0; i < 10; i++ {
		write(uint64(i))
	}
	rto := rcOf(qps[0]).ackTimeout()
	before := qps[0].Stats()
	// The next WRITE's last packet (10 WRITEs of 4 packets came before):
	// nothing follows it, so only the timeout can recover it.
	s.Rules = []enginetest.Rule{{From: 0, Opcode: -1, PSN: 43, Nth: 1, Action: "drop"}}
	el := write(10)
	after := qps[0].Stats()
	if s.Rules[0].Matched != 1 {
		t.Fatalf("the drop rule matched %d times\n%s", s.Rules[0].Matched, strings.Join(s.Trace, "\n"))
	}
	if after.Timeouts != before.Timeouts+1 || after.Retransmits == before.Retransmits {
		t.Fatalf("timeouts %d -> %d, retransmits %d -> %d", before.Timeouts, after.Timeouts, before.Retransmits, after.Retransmits)
	}
	if el < rto || el > maxAdaptiveTimeout {
		t.Fatalf("recovered after %v, want the adaptive timeout %v plus a round trip", el, rto)
	}
}

// TestPropertyLossyAdaptive runs TestPropertyLossy's workloads (10% loss,
// duplication, reordering, corruption) with the adaptive timeout: every
// work request still completes once, in order, byte-exact. The backoff
// must end with progress, or a long recovery waits at the cap.
func TestPropertyLossyAdaptive(t *testing.T) {
	propAdaptive = true
	defer func() { propAdaptive = false }()
	n := 200
	if testing.Short() || enginetest.RaceEnabled {
		n = 30
	}
	for seed := uint64(1); seed <= uint64(n); seed++ {
		if err := runWorkload(t, seed); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
	}
}
