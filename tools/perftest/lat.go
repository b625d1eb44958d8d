package perftest

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"slices"
	"time"

	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/verbs"
)

// The latency protocol of perftest's ib_write_lat, ib_read_lat,
// ib_atomic_lat and ib_send_lat. Its exchange is the bandwidth one's up to
// the MTU, then, with its one QP, four KEYS exchanges: the keys, the same
// again, again after the QPs reached RTR (when each side prints the
// peer's address), and a barrier before the traffic (a send receiver has
// posted its receives by then). What follows depends on the test:
//
//   - write: a ping-pong of RDMA WRITEs. Each side writes -s bytes to the
//     start of the peer's buffer, the last byte holding its write count,
//     and waits for the peer's count to appear in the last byte of its own
//     buffer before it writes again. The listener writes first. Nothing is
//     exchanged afterwards.
//   - send: the same ping-pong with SENDs into posted receives; the
//     connector sends first. A closing barrier and "done" follow.
//   - read, atomic: the connector posts one READ (or atomic) at a time
//     and waits for its completion; the listener goes straight to the
//     closing barrier, where it waits until the connector is done.
//
// A side that posts times every post; one iteration is the time between
// two posts. Of the -n - 1 iterations the two longest are left out (as
// perftest does); a ping-pong iteration is a round trip, reported halved.

// LatReport is one row of perftest's latency table, in microseconds.
type LatReport struct {
	Size    uint64 // message size in bytes
	Iters   uint64 // iterations posted (-n)
	Min     float64
	Max     float64 // the longest iteration after the two left out
	Typical float64 // the median
	Avg     float64
	Stdev   float64
	P99     float64 // 99% percentile
	P999    float64 // 99.9% percentile
}

// latTail is how many of the longest iterations perftest leaves out.
const latTail = 2

// latDefaults applies the latency tools' defaults (-s 2, atomics 8, -n
// 1000) and refuses what the latency mode does not implement.
func (c *Config) latDefaults() error {
	switch {
	case c.Conn != verbs.QPTypeRC:
		return fmt.Errorf("perftest: the latency tests are implemented over RC only")
	case c.RDMACM:
		return fmt.Errorf("perftest: the latency tests are implemented over the TCP exchange only (drop -R)")
	case c.QPs > 1:
		return fmt.Errorf("perftest: the latency tests run one QP")
	case c.Duplex:
		return fmt.Errorf("perftest: -b is a bandwidth option")
	case c.All || c.Duration > 0 || c.Infinite:
		return fmt.Errorf("perftest: -a, -D and --run_infinitely are not implemented for the latency tests")
	}
	if c.Size == 0 && c.Test != Atomic {
		c.Size = 2
	}
	if c.Iters == 0 {
		c.Iters = 1000
	}
	if c.Iters < latTail+2 {
		return fmt.Errorf("perftest: a latency test needs at least %d iterations", latTail+2)
	}
	return nil
}

// latStats computes perftest's table row from the times of the posts
// (since the start). factor divides every figure: 2 for a ping-pong,
// whose iteration is a round trip.
func latStats(posted []time.Duration, size int, factor float64) LatReport {
	d := make([]float64, len(posted)-1)
	for i := range d {
		d[i] = float64(posted[i+1]-posted[i]) / float64(time.Microsecond) / factor
	}
	slices.Sort(d)
	n := len(d) - latTail
	r := LatReport{Size: uint64(size), Iters: uint64(len(posted)), Min: d[0], Max: d[n]}
	if n%2 == 0 {
		r.Typical = (d[n/2] + d[n/2-1]) / 2
	} else {
		r.Typical = d[n/2]
	}
	var sum, sq float64
	for _, v := range d[:n] {
		sum += v
	}
	r.Avg = sum / float64(n)
	for _, v := range d[:n] {
		sq += (v - r.Avg) * (v - r.Avg)
	}
	r.Stdev = math.Sqrt(sq / float64(n))
	r.P99 = d[int(math.Ceil(float64(n)*0.99))]
	r.P999 = d[int(math.Ceil(float64(n)*0.999))]
	return r
}

// runLat is the latency tools' part after the MTU exchange and setup.
func (s *session) runLat(ctx context.Context) (*Result, error) {
	cfg := &s.cfg
	c := s.qps[0]
	var err error
	if c.remote, err = s.keysXchg("keys exchange", c.local); err != nil {
		return nil, err
	}
	s.res.Local, s.res.Remote = c.local, c.remote
	s.res.LocalQPs, s.res.RemoteQPs = []Keys{c.local}, []Keys{c.remote}
	if l, r := c.local.GID, c.remote.GID; l.Addr().Is4() != r.Addr().Is4() {
		return nil, fmt.Errorf("perftest: GID type mismatch (local %v, remote %v): use the same IP version on both sides", l, r)
	}
	if err := s.connectQP(c); err != nil {
		return nil, err
	}
	same := func(step string) error {
		again, err := s.keysXchg(step, c.local)
		if err == nil && again != c.remote {
			err = fmt.Errorf("%w: keys changed between exchanges (%+v, then %+v)", ErrMalformed, c.remote, again)
		}
		return err
	}
	if err := same("second keys exchange"); err != nil {
		return nil, err
	}
	fmt.Fprintln(s.out, dashes)
	s.printAddr("local", c.local)
	if err := same("keys exchange after RTR"); err != nil {
		return nil, err
	}
	s.printAddr("remote", c.remote)
	fmt.Fprintln(s.out, dashes)
	if cfg.Test == Send {
		if err := s.postRecvs(0, min(cfg.RxDepth, cfg.Iters)); err != nil {
			return nil, err
		}
	}
	if err := s.barrier("barrier before the traffic"); err != nil {
		return nil, err
	}
	measures := cfg.Test == Write || cfg.Test == Send || s.connector
	if measures {
		fmt.Fprintln(s.out, latHeader)
	}
	var posted []time.Duration
	switch {
	case cfg.Test == Write:
		posted, err = s.latWrite(ctx)
	case cfg.Test == Send:
		posted, err = s.latSend(ctx)
	case s.connector:
		posted, err = s.latRequest(ctx)
	}
	if err != nil {
		return nil, err
	}
	if measures {
		factor := 1.0
		if cfg.Test == Write || cfg.Test == Send {
			factor = 2
		}
		r := latStats(posted, s.size, factor)
		s.res.Lat = &r
		fmt.Fprintf(s.out, " %-7d %-10d       %-7.2f        %-7.2f      %-7.2f          %-7.2f        %-7.2f         %-7.2f                %-7.2f\n",
			r.Size, r.Iters, r.Min, r.Max, r.Typical, r.Avg, r.Stdev, r.P99, r.P999)
	}
	if cfg.Test != Write {
		// ib_write_lat ends without a word; the others close the
		// exchange as the bandwidth tools do.
		if err := s.barrier("closing barrier"); err != nil {
			return nil, err
		}
		if _, err := s.conn.Write([]byte("done\x00")); err != nil {
			return nil, fmt.Errorf("perftest close: send done: %w", err)
		}
	}
	fmt.Fprintln(s.out, dashes)
	s.res.Stats = s.stats()
	return &s.res, nil
}

// latHeader is the latency table's header line.
const latHeader = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] "

// awaitWC waits for one completion of the run's CQ and checks its status.
func (s *session) awaitWC(ctx context.Context, wc []verbs.WC) error {
	if s.cq.Poll(wc) == 0 {
		if _, err := s.cq.Wait(ctx, wc[:1]); err != nil {
			return fmt.Errorf("perftest: wait for a completion: %w", err)
		}
	}
	if wc[0].Status != 0 {
		return fmt.Errorf("perftest: %v completed with status %v", wc[0].Opcode, wc[0].Status)
	}
	return nil
}

// latWrite is ib_write_lat's ping-pong.
func (s *session) latWrite(ctx context.Context) ([]time.Duration, error) {
	c, n, size := s.qps[0], s.cfg.Iters, s.size
	last := c.off + size - 1  // the count this side writes
	poll := c.tOff + size - 1 // where the peer's count lands
	wr := verbs.SendWR{Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled, RemoteAddr: c.remote.VAddr, RKey: c.remote.RKey,
		SGL: []verbs.SGE{{Addr: s.mr.Addr() + uint64(c.off), Length: uint32(size), LKey: s.mr.LKey()}}}
	posted := make([]time.Duration, n)
	wc := make([]verbs.WC, 1)
	start := time.Now()
	for scnt, rcnt := 0, 0; scnt < n || rcnt < n; {
		if rcnt < n && (scnt > 0 || s.connector) {
			rcnt++
			if err := awaitByte(ctx, &s.buf[poll], byte(rcnt)); err != nil {
				return nil, fmt.Errorf("perftest: wait for the peer's WRITE %d: %w", rcnt, err)
			}
		}
		if scnt < n {
			posted[scnt] = time.Since(start)
			scnt++
			s.buf[last] = byte(scnt)
			if err := c.qp.PostSend(&wr); err != nil {
				return nil, fmt.Errorf("perftest: post WRITE %d: %w", scnt, err)
			}
			if err := s.pollWC(ctx, wc); err != nil {
				return nil, err
			}
		}
	}
	return posted, nil
}

// pollWC is awaitWC without CQ.Wait, which would take the device's
// receive path onto this goroutine: its receive goroutine then stands
// aside for a while after each wait, and the peer's WRITE, which brings
// no completion, would wait in the socket for it.
func (s *session) pollWC(ctx context.Context, wc []verbs.WC) error {
	for i := 0; s.cq.Poll(wc) == 0; i++ {
		if i&255 == 0 {
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("perftest: wait for a completion: %w", err)
			}
		}
		if i < spinPolls {
			runtime.Gosched()
		} else {
			time.Sleep(20 * time.Microsecond)
		}
	}
	if wc[0].Status != 0 {
		return fmt.Errorf("perftest: %v completed with status %v", wc[0].Opcode, wc[0].Status)
	}
	return nil
}

// spinPolls is how many times awaitByte polls, yielding in between,
// before it sleeps between polls: a poller that keeps spinning holds a
// processor the peer and softroce's receive path need on a small host.
const spinPolls = 200

// awaitByte waits until *p holds want, which the peer's WRITE puts
// there: it polls, yielding, for a while, then every 20 us.
func awaitByte(ctx context.Context, p *byte, want byte) error {
	for i := 0; peek(p) != want; i++ {
		if i&255 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		if i < spinPolls {
			runtime.Gosched()
		} else {
			time.Sleep(20 * time.Microsecond)
		}
	}
	return nil
}

// peek reads a byte the transport writes into on another goroutine, with
// no ordering: the caller only compares it and reads nothing else the
// WRITE brought (so the race detector is not told about it).
//
//go:norace
//go:noinline
func peek(p *byte) byte { return *p }

// latSend is ib_send_lat's ping-pong: receive (the connector skips its
// first), then send; every send signaled and completed before the next.
func (s *session) latSend(ctx context.Context) ([]time.Duration, error) {
	c, n, size := s.qps[0], s.cfg.Iters, s.size
	wr := verbs.SendWR{Opcode: verbs.WRSend, Flags: verbs.SendSignaled,
		SGL: []verbs.SGE{{Addr: s.mr.Addr() + uint64(c.off), Length: uint32(size), LKey: s.mr.LKey()}}}
	posted := make([]time.Duration, n)
	wc := make([]verbs.WC, 1)
	sent := 0 // send completions
	// next takes one completion, counting sends, and reports a receive.
	next := func() (bool, error) {
		if err := s.awaitWC(ctx, wc); err != nil {
			return false, err
		}
		if wc[0].Opcode != cq.OpRecv {
			sent++
			return false, nil
		}
		if wc[0].ByteLen != uint32(size) {
			return false, fmt.Errorf("perftest: receive of %d bytes, want %d (use the same -s on both sides)", wc[0].ByteLen, size)
		}
		c.recvDone++
		if c.recvPosted < n {
			return true, s.postRecvs(0, 1)
		}
		return true, nil
	}
	start := time.Now()
	for scnt, rcnt := 0, 0; scnt < n || rcnt < n; {
		if rcnt < n && (scnt > 0 || !s.connector) {
			for c.recvDone <= rcnt {
				if _, err := next(); err != nil {
					return nil, err
				}
			}
			rcnt++
		}
		if scnt < n {
			for sent < scnt {
				if _, err := next(); err != nil {
					return nil, err
				}
			}
			posted[scnt] = time.Since(start)
			scnt++
			if err := c.qp.PostSend(&wr); err != nil {
				return nil, fmt.Errorf("perftest: post SEND %d: %w", scnt, err)
			}
		}
	}
	for sent < n {
		if _, err := next(); err != nil {
			return nil, err
		}
	}
	return posted, nil
}

// latRequest is ib_read_lat's and ib_atomic_lat's requester: one READ or
// atomic at a time, each waited for.
func (s *session) latRequest(ctx context.Context) ([]time.Duration, error) {
	c, n, size := s.qps[0], s.cfg.Iters, s.size
	wr := verbs.SendWR{Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled, RemoteAddr: c.remote.VAddr, RKey: c.remote.RKey,
		SGL: []verbs.SGE{{Addr: s.mr.Addr() + uint64(c.off), Length: uint32(size), LKey: s.mr.LKey()}}}
	if s.cfg.Test == Atomic {
		wr.Opcode, wr.CompareAdd = verbs.WRAtomicFetchAndAdd, 1
		if s.cfg.Atomic == CmpAndSwap {
			wr.Opcode, wr.CompareAdd, wr.Swap = verbs.WRAtomicCmpAndSwp, 0, 0
		}
	}
	posted := make([]time.Duration, n)
	wc := make([]verbs.WC, 1)
	start := time.Now()
	for i := range n {
		posted[i] = time.Since(start)
		if err := c.qp.PostSend(&wr); err != nil {
			return nil, fmt.Errorf("perftest: post %v %d: %w", s.cfg.Test, i+1, err)
		}
		if err := s.awaitWC(ctx, wc); err != nil {
			return nil, err
		}
	}
	return posted, nil
}
