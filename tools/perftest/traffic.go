package perftest

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/internal/traffic"
	"github.com/softroce/softroce/qpstate"
	"github.com/softroce/softroce/verbs"
)

// maxAtomicResults bounds the local slots per QP that keep every fetched
// atomic value (8 bytes each) for the active side's check.
const maxAtomicResults = 1 << 16

// roundUp rounds n up to a multiple of m.
func roundUp(n, m int) int { return (n + m - 1) / m * m }

// qpCtx is one of the run's QPs (perftest -q) and its part of the buffer.
type qpCtx struct {
	qp            *verbs.QP
	local, remote Keys
	off           int       // offset of this QP's part of the buffer: its local area
	tOff          int       // offset of its target area, the one the peer accesses
	posted, done  int       // send WRs posted and completed (active side)
	recvPosted    int       // receives posted (send test, receiving side)
	recvDone      int       // receives completed (send test, receiving side)
	ah            *verbs.AH // UD: the peer's QP's address (active side)
	destQPN       uint32    // UD: where the sends go (the KEYS', or SIDR's with -R)
	destQKey      uint32
}

// QKey is the Q_Key of perftest's UD QPs, and the one its UD sends name.
const QKey = 0x11111111

// verifyFlag marks the active READ side's verification READ.
const verifyFlag = 1 << 31

// pattern is the content of buffers whose bytes are sent or exposed for
// reading, so that a changed byte can be told from an untouched one: a
// hash of the byte's offset, so that no two offsets a fixed distance apart
// (a packet, a page, 64 KiB) hold the same run of bytes and data read or
// written at a wrong offset shows.
func pattern(i int) byte {
	x := uint64(i) * 0x9e3779b97f4a7c15
	x ^= x >> 31
	x *= 0xbf58476d1ce4e5b9
	return byte(x>>56) ^ 0xa5
}

// setup creates the PD, buffer, MR, CQ and QPs and fills the local KEYS.
// The layout follows perftest: each QP has a part of one buffer with a
// local area (what its own WRs read from or write into) and a target area
// (what the peer's WRs access, announced in the KEYS). A target area is a
// region of max(size, cycle buffer) bytes rounded to the cache line, in
// which messages of at most half a cycle buffer land every INC(size)
// bytes (size rounded up to the cache line, at least one line), cycling
// over cycle_buffer/INC slots (catalogue B.3). The local area mirrors
// that layout, except for atomics (every fetched value in its own 8-byte
// slot) and READ (a second region for a verification READ).
func (s *session) setup() error {
	cfg := &s.cfg
	cl, cyc := s.res.CacheLine, s.res.CycleBuffer
	// A UD receive starts with the GRH: each slot has room for it.
	if cfg.Conn == verbs.QPTypeUD {
		s.grh = verbs.GRHLen
	}
	// The regions hold the largest message (-a: 8 MiB).
	s.region = roundUp(max(cfg.Size+s.grh, cyc), cl)
	s.layout(cfg.Size)
	switch cfg.Test {
	case Read:
		s.local = 2 * s.region
	case Atomic:
		s.local = roundUp(min(cfg.Iters, maxAtomicResults)*8, cl)
	default:
		s.local = s.region
	}
	s.part = s.local + s.region
	n := cfg.QPs*s.part + cyc // and a guard area the peer must never touch
	s.buf = make([]byte, n)
	for i := range s.buf {
		s.buf[i] = canary
	}
	for q := range cfg.QPs {
		local := s.buf[q*s.part : q*s.part+s.local]
		target := s.buf[q*s.part+s.local : (q+1)*s.part]
		if cfg.Test == Write || cfg.Test == Send {
			// What this side sends.
			for i := range local {
				local[i] = pattern(q*s.part + i)
			}
		}
		switch cfg.Test {
		case Read:
			// What the peer reads.
			for i := range target {
				target[i] = pattern(q*s.part + s.local + i)
			}
		case Atomic:
			// Zero slots make the fetch-and-add total checkable.
			clear(target)
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
	if cfg.Test == Send && (!s.connector || cfg.Latency) {
		rxDepth = cfg.RxDepth
	}
	if s.cq, err = s.dev.CreateCQ(min(cfg.QPs*(cfg.TxDepth+rxDepth)+1, verbs.MaxCQE)); err != nil {
		return fmt.Errorf("perftest: create CQ: %w", err)
	}
	gid, err := s.dev.QueryGID(cfg.GIDIndex)
	if err != nil {
		return fmt.Errorf("perftest: GID index %d: %w", cfg.GIDIndex, err)
	}
	for i := range cfg.QPs {
		qp, err := s.pd.CreateQP(verbs.QPInitAttr{Type: cfg.Conn, SendCQ: s.cq, RecvCQ: s.cq,
			Cap: verbs.QPCap{MaxSendWR: cfg.TxDepth, MaxRecvWR: rxDepth, MaxSendSGE: 1, MaxRecvSGE: 1}})
		if err != nil {
			return fmt.Errorf("perftest: create QP %d: %w", i, err)
		}
		c := &qpCtx{qp: qp, off: i * s.part, tOff: i*s.part + s.local}
		c.local = Keys{OutReads: uint16(cfg.OutReads), QPN: qp.Num(), PSN: rand.Uint32() & 0xffffff,
			RKey: s.mr.RKey(), VAddr: s.mr.Addr() + uint64(c.tOff), GID: gid}
		s.qps = append(s.qps, c)
	}
	return nil
}

// layout sets the message size and where messages of that size land:
// every inc bytes over slots slots, or always at the start of the region
// when a message is more than half a cycle buffer (perftest does the same
// for every size of -a).
func (s *session) layout(size int) {
	cl, cyc := s.res.CacheLine, s.res.CycleBuffer
	msg := size + s.grh
	s.size = size
	s.inc = max(roundUp(msg, cl), cl)
	s.slots = 1
	if msg <= cyc/2 {
		s.slots = cyc / s.inc
	}
}

// stats sums the QPs' transport counters.
func (s *session) stats() verbs.QPStats { return traffic.Sum(s.engineQPs()) }

func (s *session) teardown() {
	for _, c := range s.qps {
		if c.ah != nil {
			c.ah.Destroy()
		}
		c.qp.Destroy()
	}
	if s.mr != nil {
		s.dev.DeregMR(s.mr)
	}
	if s.pd != nil {
		s.pd.Dealloc()
	}
}

// The attribute masks perftest's ctx_modify_qp_to_rtr and _rts use for RC
// and for UC.
const (
	ucRTR = qpstate.AttrState | qpstate.AttrAV | qpstate.AttrPathMTU | qpstate.AttrDestQPN | qpstate.AttrRQPSN
	rcRTR = ucRTR | qpstate.AttrMaxDestRDAtomic | qpstate.AttrMinRNRTimer
	ucRTS = qpstate.AttrState | qpstate.AttrSQPSN
	rcRTS = ucRTS | qpstate.AttrTimeout | qpstate.AttrRetryCnt | qpstate.AttrRNRRetry | qpstate.AttrMaxQPRDAtomic
)

// connectQP moves QP i to RTR and RTS with perftest's attributes
// (catalogue B.3): the tool's single remote right, rq_psn = the peer's
// PSN, max_dest_rd_atomic = our announced out_reads, min RNR timer 12,
// timeout -u (14), retry and RNR retry 7, max_rd_atomic = the peer's
// out_reads; a UC QP takes only the path and the PSNs. perftest leaves its
// passive QPs in RTR; softroce's passive QPs go to RTS too, which changes
// nothing for a responder.
func (s *session) connectQP(c *qpCtx) error {
	cfg, rem := &s.cfg, c.remote
	if cfg.Conn == verbs.QPTypeUD {
		return s.readyUD(c)
	}
	if err := c.qp.Init(cfg.Test.access()); err != nil {
		return fmt.Errorf("perftest: QP to INIT: %w", err)
	}
	a := verbs.QPAttr{State: verbs.StateRTR, PathMTU: s.res.MTU, DestQPN: rem.QPN, RQPSN: rem.PSN,
		MaxDestRDAtomic: uint8(cfg.OutReads), MinRNRTimer: 12,
		AV: verbs.AddressVector{DGID: rem.GID, SGIDIndex: uint8(cfg.GIDIndex), HopLimit: 0xff}}
	rtr, rts := rcRTR, rcRTS
	if cfg.Conn == verbs.QPTypeUC {
		rtr, rts = ucRTR, ucRTS // UC has no READ depth, RNR timer, timeout or retries
	}
	if err := c.qp.Modify(&a, rtr); err != nil {
		return fmt.Errorf("perftest: QP to RTR: %w", err)
	}
	rd := min(max(int(rem.OutReads), 1), cfg.OutReads)
	a = verbs.QPAttr{State: verbs.StateRTS, SQPSN: c.local.PSN, Timeout: cfg.QPTimeout, RetryCnt: 7, RNRRetry: 7,
		MaxRDAtomic: uint8(rd)}
	if err := c.qp.Modify(&a, rts); err != nil {
		return fmt.Errorf("perftest: QP to RTS: %w", err)
	}
	if cfg.RemotePort != 0 {
		c.qp.SetRemotePort(cfg.RemotePort)
	}
	if cfg.AdaptiveTimeout && cfg.Conn == verbs.QPTypeRC {
		c.qp.SetAdaptiveTimeout(true)
	}
	return nil
}

// readyUD brings a UD QP to RTS with perftest's Q_Key and, on the
// sending side, makes the address handle of the peer's QP from its GID
// (hop limit 0xff, traffic class 0, as perftest's ah_attr).
func (s *session) readyUD(c *qpCtx) error {
	if err := c.qp.ReadyUD(QKey, c.local.PSN); err != nil {
		return fmt.Errorf("perftest: UD QP to RTS: %w", err)
	}
	if !s.connector {
		return nil
	}
	return s.udDest(c, c.remote.GID, c.remote.QPN, QKey)
}

// udDest makes the address handle a UD sender sends through.
func (s *session) udDest(c *qpCtx, gid verbs.GID, qpn, qkey uint32) error {
	ah, err := s.pd.CreateAH(verbs.AHAttr{DGID: gid, SGIDIndex: s.cfg.GIDIndex, HopLimit: 0xff})
	if err != nil {
		return fmt.Errorf("perftest: address handle for %v: %w", gid, err)
	}
	c.ah, c.destQPN, c.destQKey = ah, qpn, qkey
	return nil
}

// engineQPs are the QPs as the traffic engine takes them.
func (s *session) engineQPs() []traffic.QP {
	qps := make([]traffic.QP, len(s.qps))
	for i, c := range s.qps {
		qps[i] = c.qp
	}
	return qps
}

// transmit posts Iters WRs on every QP with at most TxDepth outstanding
// per QP, one in CQMod signaled (and the last), as perftest's run_iter_bw
// does, through the traffic engine, and returns the numbers perftest
// reports (over all QPs). A timed run posts for Duration and reports its
// middle (see Config.Duration); an endless one prints a row every
// Duration until Stop or the peer's going and reports the whole run.
func (s *session) transmit(ctx context.Context) (Report, error) {
	cfg := &s.cfg
	tmpl := verbs.SendWR{}
	switch cfg.Test {
	case Send:
		tmpl.Opcode = verbs.WRSend
	case Write:
		tmpl.Opcode = verbs.WRRDMAWrite
	case Read:
		tmpl.Opcode = verbs.WRRDMARead
	case Atomic:
		tmpl.Opcode = verbs.WRAtomicFetchAndAdd
		tmpl.CompareAdd = 1
		if cfg.Atomic == CmpAndSwap {
			tmpl.Opcode, tmpl.CompareAdd, tmpl.Swap = verbs.WRAtomicCmpAndSwp, 0, 0
		}
	}
	base := s.mr.Addr()
	resSlots := s.local / 8
	var count atomic.Int64
	e := traffic.Sender{QPs: s.engineQPs(), CQ: s.cq, Size: s.size, Iters: cfg.Iters * len(s.qps),
		TxDepth: cfg.TxDepth, Signal: cfg.CQMod, Count: &count}
	if cfg.timed() {
		e.Duration = cfg.Duration
	}
	if cfg.Infinite {
		e.Duration, e.Stop = endless, s.stop
	}
	for _, c := range s.qps {
		wr := tmpl
		wr.SGL = []verbs.SGE{{Length: uint32(s.size), LKey: s.mr.LKey()}}
		wr.RKey = c.remote.RKey
		if c.ah != nil {
			wr.AH, wr.RemoteQPN, wr.RemoteQKey = c.ah.AV(), c.destQPN, c.destQKey
		}
		e.WRs = append(e.WRs, wr)
	}
	e.Prepare = func(q, n int, wr *verbs.SendWR) {
		c := s.qps[q]
		slot := uint64(n % s.slots)
		if cfg.Test != Send {
			wr.RemoteAddr = c.remote.VAddr + slot*uint64(s.inc)
		}
		if cfg.Test == Atomic {
			// Every fetched value in a slot of its own, for the check.
			wr.SGL[0].Addr = base + uint64(c.off) + uint64(n%resSlots)*8
		} else {
			wr.SGL[0].Addr = base + uint64(c.off) + slot*uint64(s.inc)
		}
	}
	smp := s.sampler(&count, nil)
	res, err := traffic.Send(ctx, &e)
	win := smp.finish()
	if err != nil {
		return Report{}, fmt.Errorf("perftest: %w", err)
	}
	rep := s.report(res)
	switch {
	case cfg.Infinite:
		rep.PeakBW = 0 // perftest measures no peak in a timed run
		return rep, nil
	case cfg.timed():
		return s.windowReport(win), nil
	}
	if err := s.checkActive(ctx); err != nil {
		return rep, err
	}
	return rep, nil
}

// endless is the Duration of an endless run's engine.
const endless = time.Duration(1 << 62)

// window is what a timed run's sample saw: completions n0 at t0, n1 at
// t1.
type window struct {
	t0, t1 time.Time
	n0, n1 int64
}

// sampling watches a running engine's completion count: in a timed run
// it takes perftest's sample (a margin of a quarter of the duration,
// whole seconds, at either end); in an endless one it prints a row every
// Duration.
type sampling struct {
	done    chan struct{}
	quit    chan struct{}
	count   *atomic.Int64
	started bool // the sample began (the first margin passed)
	closed  bool // and ended
	win     window
}

// sampler starts watching count, from now; end, if set, is called when a
// timed run's duration is over (a receiver has no clock of its own). It
// returns nil when the run is neither timed nor endless.
func (s *session) sampler(count *atomic.Int64, end func()) *sampling {
	cfg := &s.cfg
	if !cfg.timed() {
		return nil
	}
	sm := &sampling{done: make(chan struct{}), quit: make(chan struct{}), count: count}
	start := time.Now()
	go func() {
		defer close(sm.done)
		if cfg.Infinite {
			t := time.NewTicker(cfg.Duration)
			defer t.Stop()
			lastT, lastN := start, int64(0)
			for {
				select {
				case <-sm.quit:
					return
				case now := <-t.C:
					n := count.Load()
					s.printRow(s.rate(n-lastN, now.Sub(lastT)))
					lastT, lastN = now, n
				}
			}
		}
		margin := cfg.Duration / time.Second / 4 * time.Second
		wait := func(d time.Duration) bool {
			select {
			case <-sm.quit:
				return false
			case <-time.After(time.Until(start.Add(d))):
				return true
			}
		}
		sm.win.t0, sm.win.t1 = start, start
		if !wait(margin) {
			return
		}
		sm.win.t0, sm.win.n0 = time.Now(), count.Load()
		sm.started = true
		if !wait(cfg.Duration - margin) {
			return
		}
		sm.win.t1, sm.win.n1 = time.Now(), count.Load()
		sm.closed = true
		if end != nil && wait(cfg.Duration) {
			end()
		}
	}()
	return sm
}

// finish stops the sampling and returns the window it took (zero when
// the run ended before the sample did).
func (sm *sampling) finish() window {
	if sm == nil {
		return window{}
	}
	close(sm.quit)
	<-sm.done
	if sm.started && !sm.closed {
		// With no end margin the run's end is the sample's, and the
		// engine may get there first.
		sm.win.t1, sm.win.n1 = time.Now(), sm.count.Load()
	}
	return sm.win
}

// rate is perftest's report of n messages of the current size in d, with
// no peak (a timed run measures none).
func (s *session) rate(n int64, d time.Duration) Report {
	sec := max(d.Seconds(), 1e-9)
	scale := 1.0 / traffic.MiB
	if s.cfg.Gbits {
		scale = 8 / 1e9
	}
	return Report{Size: uint64(s.size), Iters: uint64(max(n, 0)), AvgBW: float64(n) * float64(s.size) / sec * scale,
		MsgRate: float64(n) / sec / 1e6}
}

// windowReport is a timed run's report: what completed in its sample.
func (s *session) windowReport(w window) Report {
	return s.rate(w.n1-w.n0, w.t1.Sub(w.t0))
}

// report turns the engine's figures into perftest's numbers.
func (s *session) report(r traffic.Result) Report {
	scale := 1.0 / traffic.MiB // perftest's MB/sec is MiB/s
	if s.cfg.Gbits {
		scale = 8 / 1e9
	}
	s.res.Engine = &r
	return Report{Size: uint64(s.size), Iters: uint64(r.Messages), PeakBW: r.Peak * scale, AvgBW: r.Avg * scale,
		MsgRate: r.MsgRate / 1e6}
}

// postRecvs posts n receives of Size bytes on QP qi into its message
// slots (receive i goes to slot i mod slots, as perftest's receiver
// cycles).
func (s *session) postRecvs(qi, n int) error {
	c := s.qps[qi]
	// One WR reused for every receive (PostRecv copies it): no allocation
	// per message.
	if s.rwr.SGL == nil {
		s.rwr.SGL = make([]verbs.SGE, 1)
	}
	wr := &s.rwr
	for range n {
		slot := uint64(c.recvPosted % s.slots)
		wr.ID = traffic.WRID(qi, c.recvPosted)
		wr.SGL[0] = verbs.SGE{Addr: s.mr.Addr() + uint64(c.tOff) + slot*uint64(s.inc), Length: uint32(s.grh + s.size), LKey: s.mr.LKey()}
		if err := c.qp.PostRecv(wr); err != nil {
			return fmt.Errorf("perftest: post receive %d on QP %d: %w", c.recvPosted, qi, err)
		}
		c.recvPosted++
	}
	return nil
}

// receive is ib_send_bw's receiver: it waits for Iters receive
// completions of exactly the message size (behind the GRH with UD) on
// every QP, keeping receives posted, and measures the rate it received at
// (the clock starts at the first completion). Over UC or UD, where a lost
// message is never resent, it stops after RecvIdle without one and
// reports what arrived, as perftest's receiver gives up on a silent
// sender. A timed receiver counts for Duration from its first receive
// and reports the sample in its middle; an endless one prints a row every
// Duration until Stop or the peer's going.
func (s *session) receive(ctx context.Context) (Report, error) {
	cfg := &s.cfg
	total := cfg.Iters * len(s.qps)
	if cfg.timed() {
		total = 0 // until the time is up
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var count atomic.Int64
	var smp *sampling
	if cfg.Infinite {
		smp = s.sampler(&count, nil)
		go func() {
			select {
			case <-s.stop:
			case <-s.peerGone:
			case <-rctx.Done():
			}
			cancel()
		}()
	}
	var recvErr error // OnRecv's own error, returned as it is
	r := traffic.Receiver{QPs: s.engineQPs(), CQ: s.cq, Size: s.size, Total: total, Window: 2 * len(s.qps), Count: &count,
		OnRecv: func(qi, seq int, wc *verbs.WC) error {
			if wc.ByteLen != uint32(s.grh+s.size) {
				recvErr = fmt.Errorf("perftest: data check: receive %d on QP %d got %d bytes, want %d (use the same -s on both sides)",
					seq, qi, int(wc.ByteLen)-s.grh, s.size)
				return recvErr
			}
			if smp == nil && cfg.timed() {
				// perftest's receiver starts its clock with the traffic.
				smp = s.sampler(&count, cancel)
			}
			c := s.qps[qi]
			c.recvDone++
			if c.recvPosted < cfg.Iters || cfg.timed() {
				recvErr = s.postRecvs(qi, 1)
			}
			return recvErr
		}}
	if cfg.Conn != verbs.QPTypeRC && !cfg.timed() {
		r.Idle = cfg.RecvIdle
	}
	res, err := traffic.Receive(rctx, &r)
	win := smp.finish()
	if recvErr != nil {
		return Report{}, recvErr
	}
	if err != nil {
		return Report{}, fmt.Errorf("perftest: %w", err)
	}
	if res.Lost > 0 {
		s.res.Lost = res.Lost
		fmt.Fprintf(s.out, " No message for %v: %d of %d messages lost, reporting the %d received\n", cfg.RecvIdle, res.Lost, total, res.Messages)
	}
	switch {
	case cfg.Infinite:
		rep := s.report(res)
		rep.PeakBW = 0
		return rep, nil
	case cfg.timed():
		if ctx.Err() != nil {
			return Report{}, fmt.Errorf("perftest: %w", ctx.Err())
		}
		s.report(res)
		return s.windowReport(win), nil
	}
	// The rates are those of what arrived, in the time it took.
	return s.report(res), nil
}

// checkActive verifies what the active side can see of the peer's memory
// (perftest 4.5 has no data validation of its own, catalogue B.4), on
// every QP:
//   - READ: one more READ of the whole span of the cycle must return the
//     same bytes every timed READ put into its slot;
//   - FETCH_AND_ADD: in every remote slot the fetched values go up by
//     exactly one from one visit to the next; CMP_AND_SWAP (compare 0,
//     swap 0) on perftest's random buffer must fetch the same value on
//     every visit;
//   - WRITE into a write-only perftest buffer, or SEND into its receives,
//     cannot be read back.
func (s *session) checkActive(ctx context.Context) error {
	cfg := &s.cfg
	switch cfg.Test {
	case Read:
		span := (s.slots-1)*s.inc + s.size
		for qi, c := range s.qps {
			wr := verbs.SendWR{ID: traffic.WRID(qi, verifyFlag), Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
				SGL:        []verbs.SGE{{Addr: s.mr.Addr() + uint64(c.off+s.region), Length: uint32(span), LKey: s.mr.LKey()}},
				RemoteAddr: c.remote.VAddr, RKey: c.remote.RKey}
			if err := c.qp.PostSend(&wr); err != nil {
				return fmt.Errorf("perftest: post verification READ on QP %d: %w", qi, err)
			}
		}
		wcs := make([]verbs.WC, len(s.qps))
		for got := 0; got < len(s.qps); {
			n, err := s.cq.Wait(ctx, wcs[:len(s.qps)-got])
			if err != nil {
				return fmt.Errorf("perftest: verification READ: %w", err)
			}
			for _, wc := range wcs[:n] {
				if wc.Status != cq.Success || wc.ByteLen != uint32(span) {
					return fmt.Errorf("perftest: verification READ completed with %v, %d bytes", wc.Status, wc.ByteLen)
				}
			}
			got += n
		}
		for qi, c := range s.qps {
			for k := 0; k < min(s.slots, cfg.Iters); k++ {
				at := c.off + k*s.inc
				got := s.buf[at : at+s.size]
				want := s.buf[at+s.region : at+s.region+s.size]
				if !bytes.Equal(got, want) {
					return fmt.Errorf("perftest: data check: QP %d READ slot %d differs from the verification READ", qi, k)
				}
				if allByte(got, canary) && s.size >= 8 {
					return fmt.Errorf("perftest: data check: QP %d READ slot %d was never filled", qi, k)
				}
			}
		}
		s.res.Checked = fmt.Sprintf("every READ slot equals a verification READ of the %d-byte span", span)
	case Atomic:
		if cfg.Iters > s.local/8 {
			return nil
		}
		for qi, c := range s.qps {
			val := func(i int) uint64 { return binary.LittleEndian.Uint64(s.buf[c.off+i*8:]) }
			for i := s.slots; i < cfg.Iters; i++ {
				want := val(i - s.slots)
				if cfg.Atomic == FetchAndAdd {
					want++
				}
				if got := val(i); got != want {
					return fmt.Errorf("perftest: data check: QP %d atomic %d (slot %d) fetched %#x, want %#x", qi, i, i%s.slots, got, want)
				}
			}
		}
		s.res.Checked = fmt.Sprintf("%d fetched originals consistent per slot", cfg.Iters*len(s.qps))
	}
	return nil
}

// checkTarget verifies softroce's target areas after the peer's traffic:
// nothing outside the message slots changed (the guard area included),
// and in every QP's target area
//   - WRITE, SEND: every slot the peer wrote no longer holds the canary;
//   - READ: the area is unchanged;
//   - FETCH_AND_ADD: slot k was incremented exactly once per visit, so the
//     slots sum to the iterations the peer reported; CMP_AND_SWAP
//     (compare 0, swap 0) leaves zeros.
//
// The local areas are the active side's business (checkActive).
func (s *session) checkTarget(peer Report) error {
	cfg := &s.cfg
	// After several sizes (-a) or a timed run, which slots were written
	// last, and how often, is not known exactly: the check is then that
	// nothing outside the target areas changed and that the last size's
	// messages landed.
	loose := cfg.All || cfg.timed()
	if peer.Size != uint64(s.size) {
		return fmt.Errorf("perftest: peer reported %d-byte messages, this side was set up for %d (use the same -s)", peer.Size, s.size)
	}
	if cfg.Test != Send && !cfg.timed() && peer.Iters%uint64(len(s.qps)) != 0 {
		return fmt.Errorf("perftest: peer reported %d iterations, not a multiple of %d QPs (use the same -q)", peer.Iters, len(s.qps))
	}
	iters := int(peer.Iters) / len(s.qps) // per QP
	if cfg.timed() {
		iters = min(iters, 1) // the sample's count: only slot 0 is sure to be written
	}
	received, slotsSeen := 0, 0
	guard := s.buf[len(s.qps)*s.part:]
	if !allByte(guard, canary) {
		return fmt.Errorf("perftest: data check: the guard area behind the last QP's buffer changed")
	}
	var sum uint64
	for qi, c := range s.qps {
		target := s.buf[c.tOff : c.tOff+s.region]
		if cfg.Test == Send {
			// What this side received itself (fewer when UC or UD lost some).
			iters = c.recvDone
			received += iters
		}
		switch cfg.Test {
		case Read:
			for i, b := range target {
				if b != pattern(c.tOff+i) {
					return fmt.Errorf("perftest: data check: QP %d: byte %d of a read-only buffer changed", qi, i)
				}
			}
		case Write, Send:
			written := make([]bool, len(target))
			slotsSeen += min(s.slots, iters)
			for k := 0; k < min(s.slots, iters); k++ {
				// A UD receive has the GRH, then the message.
				at := k*s.inc + s.grh
				msg := target[at : at+s.size]
				if s.size >= 8 && allByte(msg, canary) {
					return fmt.Errorf("perftest: data check: QP %d %v slot %d (offset %d) was never written", qi, cfg.Test, k, at)
				}
				for i := k * s.inc; i < at+s.size; i++ {
					written[i] = true
				}
			}
			for i, b := range target {
				if !written[i] && b != canary && !loose {
					return fmt.Errorf("perftest: data check: QP %d: byte %d outside every %v slot changed to %#x", qi, i, cfg.Test, b)
				}
			}
		case Atomic:
			for k := 0; k*s.inc < len(target); k++ {
				v := binary.LittleEndian.Uint64(target[k*s.inc:])
				want := uint64(0)
				if cfg.Atomic == FetchAndAdd && k < s.slots && cfg.timed() {
					want = v // each slot took what the run gave it
				} else if cfg.Atomic == FetchAndAdd && k < s.slots {
					want = uint64(iters / s.slots)
					if k < iters%s.slots {
						want++
					}
				}
				if v != want {
					return fmt.Errorf("perftest: data check: QP %d atomic slot %d holds %d, want %d (%d iterations over %d slots)", qi, k, v, want, iters, s.slots)
				}
				sum += v
				if !allByte(target[k*s.inc+8:min((k+1)*s.inc, len(target))], 0) {
					return fmt.Errorf("perftest: data check: QP %d: bytes between atomic slots %d and %d changed", qi, k, k+1)
				}
			}
		}
	}
	switch cfg.Test {
	case Read:
		s.res.Checked = "exposed buffer unchanged"
	case Write, Send:
		s.res.Checked = fmt.Sprintf("%d %v slots written, no byte outside them changed", slotsSeen, cfg.Test)
		if cfg.Test == Send {
			s.res.Checked = fmt.Sprintf("%d receives of %d bytes; ", received, s.size) + s.res.Checked
		}
	case Atomic:
		s.res.Checked = fmt.Sprintf("atomic slots sum to %d", sum)
	}
	switch {
	case cfg.All:
		s.res.Checked += " (the last size's slots)"
	case cfg.timed():
		s.res.Checked += " (a timed run)"
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
