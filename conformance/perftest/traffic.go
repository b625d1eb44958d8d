package perftest

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/qpstate"
	"github.com/softroce/softroce/transport/rc"
	"github.com/softroce/softroce/verbs"
)

// maxAtomicResults bounds the local slots that keep every fetched atomic
// value (8 bytes each) for the active side's check.
const maxAtomicResults = 1 << 16

// roundUp rounds n up to a multiple of m.
func roundUp(n, m int) int { return (n + m - 1) / m * m }

// setup creates the PD, buffer, MR, CQ and QP and fills the local KEYS.
// The layout follows perftest: a region of max(size, cycle buffer) bytes
// rounded to the cache line, in which messages of at most half a cycle
// buffer land every INC(size) bytes (size rounded up to the cache line,
// at least one line), cycling over cycle_buffer/INC slots (catalogue B.3).
func (s *session) setup() error {
	cfg := &s.cfg
	cl, cyc := s.res.CacheLine, s.res.CycleBuffer
	s.inc = max(roundUp(cfg.Size, cl), cl)
	s.slots = 1
	if cfg.Size <= cyc/2 {
		s.slots = cyc / s.inc
	}
	region := roundUp(max(cfg.Size, cyc), cl)
	var n int
	switch {
	case !s.connector:
		n = region + cyc // a guard area the peer must never touch
	case cfg.Test == Read:
		n = 2 * region // the READ destinations, then a verification READ
	case cfg.Test == Atomic:
		n = min(cfg.Iters, maxAtomicResults) * 8
	default:
		n = region
	}
	s.buf = make([]byte, n)
	switch {
	case !s.connector && cfg.Test == Atomic:
		// Zero slots make the fetch-and-add total checkable; the guard
		// keeps the canary.
		for i := region; i < n; i++ {
			s.buf[i] = canary
		}
	case !s.connector && cfg.Test == Read, s.connector && (cfg.Test == Write || cfg.Test == Send):
		for i := range s.buf {
			s.buf[i] = byte(i*7+i>>8) ^ 0xa5
		}
	default:
		for i := range s.buf {
			s.buf[i] = canary
		}
	}
	var err error
	if s.pd, err = s.dev.AllocPD(); err != nil {
		return fmt.Errorf("perftest: allocate PD: %w", err)
	}
	if s.mr, err = s.pd.RegMR(s.buf, verbs.AccessLocalWrite|cfg.Test.access()); err != nil {
		return fmt.Errorf("perftest: register %d-byte buffer: %w", n, err)
	}
	rxDepth := 1
	if cfg.Test == Send && !s.connector {
		rxDepth = cfg.RxDepth
	}
	if s.cq, err = s.dev.CreateCQ(cfg.TxDepth + rxDepth + 1); err != nil {
		return fmt.Errorf("perftest: create CQ: %w", err)
	}
	if s.qp, err = s.pd.CreateQP(verbs.QPInitAttr{SendCQ: s.cq, RecvCQ: s.cq,
		Cap: verbs.QPCap{MaxSendWR: cfg.TxDepth, MaxRecvWR: rxDepth, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
		return fmt.Errorf("perftest: create QP: %w", err)
	}
	gid, err := s.dev.QueryGID(cfg.GIDIndex)
	if err != nil {
		return fmt.Errorf("perftest: GID index %d: %w", cfg.GIDIndex, err)
	}
	s.res.Local = Keys{OutReads: uint16(cfg.OutReads), QPN: s.qp.Num(), PSN: rand.Uint32() & 0xffffff,
		RKey: s.mr.RKey(), VAddr: s.mr.Addr(), GID: gid}
	return nil
}

// stats reads the QP's transport counters under the engine lock (the
// receive goroutine updates them).
func (s *session) stats() rc.QPStats {
	e := s.dev.Engine()
	e.Lock()
	defer e.Unlock()
	return s.qp.Transport().Stats
}

func (s *session) teardown() {
	if s.qp != nil {
		s.qp.Destroy()
	}
	if s.mr != nil {
		s.dev.DeregMR(s.mr)
	}
}

// connectQP moves the QP to RTR and RTS with perftest's attributes
// (catalogue B.3): the tool's single remote right, rq_psn = the peer's
// PSN, max_dest_rd_atomic = our announced out_reads, min RNR timer 12,
// timeout -u (14), retry and RNR retry 7, max_rd_atomic = the peer's out_reads.
// perftest leaves its passive QP in RTR; softroce's passive QP goes to RTS
// too, which changes nothing for a responder.
func (s *session) connectQP() error {
	cfg, rem := &s.cfg, s.res.Remote
	if err := s.qp.Init(cfg.Test.access()); err != nil {
		return fmt.Errorf("perftest: QP to INIT: %w", err)
	}
	a := verbs.QPAttr{State: verbs.StateRTR, PathMTU: s.res.MTU, DestQPN: rem.QPN, RQPSN: rem.PSN,
		MaxDestRDAtomic: uint8(cfg.OutReads), MinRNRTimer: 12,
		AV: verbs.AddressVector{DGID: rem.GID, SGIDIndex: uint8(cfg.GIDIndex), HopLimit: 0xff}}
	if err := s.qp.Modify(&a, qpstate.AttrState|qpstate.AttrAV|qpstate.AttrPathMTU|qpstate.AttrDestQPN|
		qpstate.AttrRQPSN|qpstate.AttrMaxDestRDAtomic|qpstate.AttrMinRNRTimer); err != nil {
		return fmt.Errorf("perftest: QP to RTR: %w", err)
	}
	rd := min(max(int(rem.OutReads), 1), cfg.OutReads)
	a = verbs.QPAttr{State: verbs.StateRTS, SQPSN: s.res.Local.PSN, Timeout: cfg.QPTimeout, RetryCnt: 7, RNRRetry: 7,
		MaxRDAtomic: uint8(rd)}
	if err := s.qp.Modify(&a, qpstate.AttrState|qpstate.AttrSQPSN|qpstate.AttrTimeout|qpstate.AttrRetryCnt|
		qpstate.AttrRNRRetry|qpstate.AttrMaxQPRDAtomic); err != nil {
		return fmt.Errorf("perftest: QP to RTS: %w", err)
	}
	if cfg.RemotePort != 0 {
		s.qp.SetRemotePort(cfg.RemotePort)
	}
	return nil
}

// traffic posts cfg.Iters WRs with at most TxDepth outstanding, one in
// CQMod signaled (and the last), as perftest's run_iter_bw does, and
// returns the numbers perftest reports.
func (s *session) traffic(ctx context.Context) (Report, error) {
	cfg, rem := &s.cfg, s.res.Remote
	wr := verbs.SendWR{SGL: []verbs.SGE{{Length: uint32(cfg.Size), LKey: s.mr.LKey()}}, RKey: rem.RKey}
	switch cfg.Test {
	case Send:
		wr.Opcode = verbs.WRSend
	case Write:
		wr.Opcode = verbs.WRRDMAWrite
	case Read:
		wr.Opcode = verbs.WRRDMARead
	case Atomic:
		wr.Opcode = verbs.WRAtomicFetchAndAdd
		wr.CompareAdd = 1
		if cfg.Atomic == CmpAndSwap {
			wr.Opcode, wr.CompareAdd, wr.Swap = verbs.WRAtomicCmpAndSwp, 0, 0
		}
	}
	base := s.mr.Addr()
	resSlots := len(s.buf) / 8
	wcs := make([]verbs.WC, 32)
	posted, done := 0, 0
	start := time.Now()
	win, winDone := start, 0
	var peak float64
	for done < cfg.Iters {
		for posted < cfg.Iters && posted-done < cfg.TxDepth {
			slot := uint64(posted % s.slots)
			wr.ID = uint64(posted)
			wr.RemoteAddr = rem.VAddr + slot*uint64(s.inc)
			if cfg.Test == Atomic {
				// Every fetched value in a slot of its own, for the check.
				wr.SGL[0].Addr = base + uint64(posted%resSlots)*8
			} else {
				wr.SGL[0].Addr = base + slot*uint64(s.inc)
			}
			wr.Flags = 0
			if (posted+1)%cfg.CQMod == 0 || posted == cfg.Iters-1 {
				wr.Flags = verbs.SendSignaled
			}
			if err := s.qp.PostSend(&wr); err != nil {
				return Report{}, fmt.Errorf("perftest: post %v %d: %w", wr.Opcode, posted, err)
			}
			posted++
		}
		n, err := s.cq.Wait(ctx, wcs)
		if err != nil {
			return Report{}, fmt.Errorf("perftest: waiting for completions after %d of %d: %w (QP stats %+v)",
				done, cfg.Iters, err, s.stats())
		}
		for _, wc := range wcs[:n] {
			if wc.Status != cq.Success {
				return Report{}, fmt.Errorf("perftest: %v %d completed with %v (QP stats %+v)",
					wr.Opcode, wc.WRID, wc.Status, s.stats())
			}
			// RC completes in order: a signaled WR retires all before it.
			done = max(done, int(wc.WRID)+1)
		}
		// The peak is the best rate over windows of at least 1 ms.
		if now := time.Now(); now.Sub(win) >= time.Millisecond || done == cfg.Iters {
			if dt := now.Sub(win).Seconds(); dt > 0 && done > winDone {
				peak = max(peak, float64(done-winDone)*float64(cfg.Size)/dt)
			}
			win, winDone = now, done
		}
	}
	rep := s.report(time.Since(start), peak)
	if err := s.checkActive(ctx); err != nil {
		return rep, err
	}
	return rep, nil
}

// report turns a run's duration and peak rate (bytes/s) into perftest's
// numbers.
func (s *session) report(el time.Duration, peak float64) Report {
	cfg := &s.cfg
	sec := el.Seconds()
	avg := float64(cfg.Iters) * float64(cfg.Size) / sec
	peak = max(peak, avg)
	scale := 1.0 / (1 << 20) // perftest's MB/sec is MiB/s
	if cfg.Gbits {
		scale = 8 / 1e9
	}
	return Report{Size: uint64(cfg.Size), Iters: uint64(cfg.Iters), PeakBW: peak * scale, AvgBW: avg * scale,
		MsgRate: float64(cfg.Iters) / sec / 1e6}
}

// postRecvs posts n receives of Size bytes into the message slots (the
// slot of receive i is i mod slots, as perftest's receiver cycles).
func (s *session) postRecvs(n int) error {
	for range n {
		slot := uint64(s.recvPosted % s.slots)
		wr := verbs.RecvWR{ID: uint64(s.recvPosted),
			SGL: []verbs.SGE{{Addr: s.mr.Addr() + slot*uint64(s.inc), Length: uint32(s.cfg.Size), LKey: s.mr.LKey()}}}
		if err := s.qp.PostRecv(&wr); err != nil {
			return fmt.Errorf("perftest: post receive %d: %w", s.recvPosted, err)
		}
		s.recvPosted++
	}
	return nil
}

// receive is ib_send_bw's receiver: it waits for Iters receive
// completions of exactly Size bytes, keeping receives posted, and
// measures the rate it received at (the clock starts at the first
// completion).
func (s *session) receive(ctx context.Context) (Report, error) {
	cfg := &s.cfg
	wcs := make([]verbs.WC, 32)
	done := 0
	var start, win time.Time
	winDone := 0
	var peak float64
	for done < cfg.Iters {
		n, err := s.cq.Wait(ctx, wcs)
		if err != nil {
			return Report{}, fmt.Errorf("perftest: waiting for receives after %d of %d: %w (QP stats %+v)",
				done, cfg.Iters, err, s.stats())
		}
		if done == 0 {
			start = time.Now()
			win = start
		}
		for _, wc := range wcs[:n] {
			if wc.Status != cq.Success {
				return Report{}, fmt.Errorf("perftest: receive %d completed with %v (QP stats %+v)", wc.WRID, wc.Status, s.stats())
			}
			if wc.ByteLen != uint32(cfg.Size) {
				return Report{}, fmt.Errorf("perftest: data check: receive %d got %d bytes, want %d", wc.WRID, wc.ByteLen, cfg.Size)
			}
			done++
		}
		if more := min(cfg.Iters-s.recvPosted, n); more > 0 {
			if err := s.postRecvs(more); err != nil {
				return Report{}, err
			}
		}
		if now := time.Now(); now.Sub(win) >= time.Millisecond || done == cfg.Iters {
			if dt := now.Sub(win).Seconds(); dt > 0 && done > winDone {
				peak = max(peak, float64(done-winDone)*float64(cfg.Size)/dt)
			}
			win, winDone = now, done
		}
	}
	return s.report(max(time.Since(start), time.Microsecond), peak), nil
}

// checkActive verifies what the active side can see of the peer's memory
// (perftest 4.5 has no data validation of its own, catalogue B.4):
//   - READ: one more READ of the whole span of the cycle must return the
//     same bytes every timed READ put into its slot;
//   - FETCH_AND_ADD: in every remote slot the fetched values go up by
//     exactly one from one visit to the next; CMP_AND_SWAP (compare 0,
//     swap 0) on perftest's random buffer must fetch the same value on
//     every visit;
//   - WRITE into a write-only perftest buffer cannot be read back.
func (s *session) checkActive(ctx context.Context) error {
	cfg := &s.cfg
	switch cfg.Test {
	case Read:
		span := (s.slots-1)*s.inc + cfg.Size
		region := len(s.buf) / 2
		wr := verbs.SendWR{ID: 1 << 62, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
			SGL:        []verbs.SGE{{Addr: s.mr.Addr() + uint64(region), Length: uint32(span), LKey: s.mr.LKey()}},
			RemoteAddr: s.res.Remote.VAddr, RKey: s.res.Remote.RKey}
		if err := s.qp.PostSend(&wr); err != nil {
			return fmt.Errorf("perftest: post verification READ: %w", err)
		}
		wcs := make([]verbs.WC, 1)
		if _, err := s.cq.Wait(ctx, wcs); err != nil {
			return fmt.Errorf("perftest: verification READ: %w", err)
		}
		if wcs[0].Status != cq.Success || wcs[0].ByteLen != uint32(span) {
			return fmt.Errorf("perftest: verification READ completed with %v, %d bytes", wcs[0].Status, wcs[0].ByteLen)
		}
		for k := 0; k < min(s.slots, cfg.Iters); k++ {
			got := s.buf[k*s.inc : k*s.inc+cfg.Size]
			want := s.buf[region+k*s.inc : region+k*s.inc+cfg.Size]
			if !bytes.Equal(got, want) {
				return fmt.Errorf("perftest: data check: READ slot %d differs from the verification READ", k)
			}
			if allByte(got, canary) && cfg.Size >= 8 {
				return fmt.Errorf("perftest: data check: READ slot %d was never filled", k)
			}
		}
		s.res.Checked = fmt.Sprintf("every READ slot equals a verification READ of the %d-byte span", span)
	case Atomic:
		if cfg.Iters > len(s.buf)/8 {
			return nil
		}
		val := func(i int) uint64 { return binary.LittleEndian.Uint64(s.buf[i*8:]) }
		for i := s.slots; i < cfg.Iters; i++ {
			want := val(i - s.slots)
			if cfg.Atomic == FetchAndAdd {
				want++
			}
			if got := val(i); got != want {
				return fmt.Errorf("perftest: data check: atomic %d (slot %d) fetched %#x, want %#x", i, i%s.slots, got, want)
			}
		}
		s.res.Checked = fmt.Sprintf("%d fetched originals consistent per slot", cfg.Iters)
	}
	return nil
}

// checkPassive verifies softroce's exposed buffer after the peer's
// traffic: nothing outside the message slots changed (the guard area
// included), and
//   - WRITE: every slot the peer wrote no longer holds the canary;
//   - READ: the buffer is unchanged;
//   - FETCH_AND_ADD: slot k was incremented exactly once per visit, so the
//     slots sum to the iterations the peer reported; CMP_AND_SWAP
//     (compare 0, swap 0) leaves zeros.
func (s *session) checkPassive() error {
	cfg, rep := &s.cfg, s.res.Report
	if rep.Size != uint64(cfg.Size) {
		return fmt.Errorf("perftest: peer reported %d-byte messages, this side was set up for %d (use the same -s)", rep.Size, cfg.Size)
	}
	iters := int(rep.Iters)
	switch cfg.Test {
	case Read:
		for i, b := range s.buf {
			if b != byte(i*7+i>>8)^0xa5 {
				return fmt.Errorf("perftest: data check: byte %d of a read-only buffer changed", i)
			}
		}
		s.res.Checked = "exposed buffer unchanged"
		return nil
	case Write, Send:
		written := make([]bool, len(s.buf))
		for k := 0; k < min(s.slots, iters); k++ {
			msg := s.buf[k*s.inc : k*s.inc+cfg.Size]
			if cfg.Size >= 8 && allByte(msg, canary) {
				return fmt.Errorf("perftest: data check: %v slot %d (offset %d) was never written", cfg.Test, k, k*s.inc)
			}
			for i := range msg {
				written[k*s.inc+i] = true
			}
		}
		for i, b := range s.buf {
			if !written[i] && b != canary {
				return fmt.Errorf("perftest: data check: byte %d outside every %v slot changed to %#x", i, cfg.Test, b)
			}
		}
		s.res.Checked = fmt.Sprintf("%d %v slots written, no byte outside them changed", min(s.slots, iters), cfg.Test)
		if cfg.Test == Send {
			s.res.Checked = fmt.Sprintf("%d receives of %d bytes; ", iters, cfg.Size) + s.res.Checked
		}
		return nil
	case Atomic:
		region := len(s.buf) - s.res.CycleBuffer
		for i := region; i < len(s.buf); i++ {
			if s.buf[i] != canary {
				return fmt.Errorf("perftest: data check: guard byte %d changed", i)
			}
		}
		var sum uint64
		for k := 0; k*s.inc < region; k++ {
			v := binary.LittleEndian.Uint64(s.buf[k*s.inc:])
			want := uint64(0)
			if cfg.Atomic == FetchAndAdd && k < s.slots {
				want = uint64(iters / s.slots)
				if k < iters%s.slots {
					want++
				}
			}
			if v != want {
				return fmt.Errorf("perftest: data check: atomic slot %d holds %d, want %d (%d iterations over %d slots)", k, v, want, iters, s.slots)
			}
			sum += v
			for i := k*s.inc + 8; i < min((k+1)*s.inc, region); i++ {
				if s.buf[i] != 0 {
					return fmt.Errorf("perftest: data check: byte %d between atomic slots changed", i)
				}
			}
		}
		s.res.Checked = fmt.Sprintf("atomic slots sum to %d", sum)
	}
	return nil
}

func allByte(b []byte, c byte) bool {
	for _, x := range b {
		if x != c {
			return false
		}
	}
	return true
}
