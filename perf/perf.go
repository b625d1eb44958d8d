// Package perf measures bandwidth and latency of RC operations between
// two softroce endpoints, the way perftest's ib_write_bw, ib_read_bw,
// ib_send_bw, ib_atomic_bw and their _lat siblings do: a client posts RDMA
// WRITE, RDMA READ, SEND or atomic work requests at a server's registered
// memory and times their completions.
//
// The two sides find each other over TCP (Serve, Dial: a small versioned
// JSON exchange of QP numbers, PSNs, GIDs, rkeys and addresses); the data
// goes over whatever nic.Link the caller opens. RunLocal runs both sides in
// one process on an in-process pipe, with no network at all.
//
// Results come in perftest's columns (WriteBW, WriteLat) or as JSON.
package perf

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/softroce/softroce/verbs"
)

// Test is the operation measured.
type Test string

// Tests.
const (
	Write  Test = "write"
	Read   Test = "read"
	Send   Test = "send"
	Atomic Test = "atomic" // fetch-and-add on one 8-byte word (ib_atomic_bw's default)
)

// ParseTest checks a test name.
func ParseTest(s string) (Test, error) {
	switch t := Test(s); t {
	case Write, Read, Send, Atomic:
		return t, nil
	}
	return "", fmt.Errorf("unknown test %q: want write, read, send or atomic", s)
}

// Config says what to measure. Zero fields take defaults.
type Config struct {
	Test Test
	// Sizes are the message sizes to run, one result each (default 65536
	// for bandwidth, 2 for latency; atomic is always 8).
	Sizes []int
	// Iters is the number of operations per size (default 5000 for
	// bandwidth, 1000 for latency). Ignored when Duration is set.
	Iters int
	// Duration runs each size for this long instead of Iters operations.
	Duration time.Duration
	// QPs is the number of queue pairs, used round robin (default 1).
	QPs int
	// MTU is the IB path MTU (default 1024).
	MTU int
	// TxDepth is how many operations each QP keeps outstanding in a
	// bandwidth test (default 128).
	TxDepth int
	// Progress, if set, is called now and then with the operations done
	// and the total (0 when running for a Duration).
	Progress func(done, total int64)
	// BusyPoll is the devices' verbs.Options.BusyPoll (0: off).
	BusyPoll time.Duration
	// NoInlineWait is the devices' verbs.Options.NoInlineWait: blocking
	// waits leave receiving to the device's receive goroutine (for
	// comparisons).
	NoInlineWait bool
	// CC is the devices' congestion control: verbs.CCDCQCN opens them
	// with verbs.CCDefaults (docs/congestion.md), and the server's too;
	// anything else leaves it off.
	CC verbs.CCMode
	// Started, if set, is called with the client's QPs once they are
	// connected, before traffic starts: for a caller that samples them
	// while the run goes (softroce bw --plot). They are not its to use.
	Started func(qps []*verbs.QP)
}

// deviceOptions are the verbs options of a device of this run.
func deviceOptions(name string, busy time.Duration, noInlineWait bool, cc verbs.CCMode) *verbs.Options {
	o := &verbs.Options{Name: name, BusyPoll: busy, NoInlineWait: noInlineWait}
	if cc == verbs.CCDCQCN {
		p := verbs.CCDefaults()
		o.CC = &p
	}
	return o
}

// Defaults and limits.
const (
	DefaultBWSize  = 65536
	DefaultLatSize = 2
	DefaultBWIters = 5000
	DefaultLatIter = 1000
	DefaultTxDepth = 128
	MaxQPs         = 64
	MaxSize        = 8 << 20
)

// SweepSizes are the sizes of --sweep: powers of two from 2 bytes to 64 KiB.
func SweepSizes() []int {
	var s []int
	for n := 2; n <= 65536; n *= 2 {
		s = append(s, n)
	}
	return s
}

// fill checks c and fills defaults; lat selects the latency defaults.
func (c *Config) fill(lat bool) error {
	if _, err := ParseTest(string(c.Test)); err != nil {
		return err
	}
	if len(c.Sizes) == 0 {
		if lat {
			c.Sizes = []int{DefaultLatSize}
		} else {
			c.Sizes = []int{DefaultBWSize}
		}
	}
	if c.Test == Atomic {
		c.Sizes = []int{8}
	}
	for _, s := range c.Sizes {
		if s < 1 || s > MaxSize {
			return fmt.Errorf("message size %d out of range 1..%d", s, MaxSize)
		}
	}
	if c.Iters == 0 {
		c.Iters = DefaultBWIters
		if lat {
			c.Iters = DefaultLatIter
		}
	}
	if c.Iters < 1 {
		return fmt.Errorf("iterations %d: need at least 1", c.Iters)
	}
	if c.Duration < 0 {
		return fmt.Errorf("duration %v is negative", c.Duration)
	}
	if c.QPs == 0 {
		c.QPs = 1
	}
	if c.QPs < 1 || c.QPs > MaxQPs {
		return fmt.Errorf("%d QPs: want 1..%d", c.QPs, MaxQPs)
	}
	if c.MTU == 0 {
		c.MTU = 1024
	}
	switch c.MTU {
	case 256, 512, 1024, 2048, 4096:
	default:
		return fmt.Errorf("MTU %d: an IB MTU is 256, 512, 1024, 2048 or 4096", c.MTU)
	}
	if c.TxDepth == 0 {
		c.TxDepth = DefaultTxDepth
	}
	if c.TxDepth < 1 || c.TxDepth > 4096 {
		return fmt.Errorf("tx depth %d: want 1..4096", c.TxDepth)
	}
	return nil
}

func (c *Config) maxSize() int {
	m := 8
	for _, s := range c.Sizes {
		m = max(m, s)
	}
	return m
}

// Info is what one side tells the other out of band.
type Info struct {
	QPs []QPInfo `json:"qps"`
	// GID is the data address of the side (IPv4-mapped for IPv4).
	GID verbs.GID `json:"gid"`
	// UDPPort is the UDP port the side's link receives on.
	UDPPort uint16 `json:"udp_port"`
	VA      uint64 `json:"va"`
	RKey    uint32 `json:"rkey"`
	Len     int    `json:"len"`
}

// QPInfo is one QP's number and first PSN.
type QPInfo struct {
	QPN uint32 `json:"qpn"`
	PSN uint32 `json:"psn"`
}

// Endpoint is one side: a device with a PD, one registered buffer, one CQ
// and the QPs.
type Endpoint struct {
	dev   *verbs.Device
	pd    *verbs.PD
	mr    *verbs.MR
	buf   []byte
	cq    *verbs.CQ
	qps   []*verbs.QP
	psns  []uint32
	recvs int // receive WRs posted per QP (send test server)
}

// NewEndpoint sets up qps QPs and a buffer of bufSize bytes on dev, with
// room for depth outstanding operations per QP in each direction.
func NewEndpoint(dev *verbs.Device, qps, bufSize, depth int) (*Endpoint, error) {
	e := &Endpoint{dev: dev, buf: make([]byte, max(bufSize, 8))}
	var err error
	if e.pd, err = dev.AllocPD(); err != nil {
		return nil, fmt.Errorf("alloc PD: %w", err)
	}
	acc := verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead | verbs.AccessRemoteAtomic
	if e.mr, err = e.pd.RegMR(e.buf, acc); err != nil {
		return nil, fmt.Errorf("register %d bytes: %w", len(e.buf), err)
	}
	cqDepth := min(qps*depth*2+16, verbs.MaxCQE)
	if e.cq, err = dev.CreateCQ(cqDepth); err != nil {
		return nil, fmt.Errorf("create CQ: %w", err)
	}
	for i := 0; i < qps; i++ {
		qp, err := e.pd.CreateQP(verbs.QPInitAttr{SendCQ: e.cq, RecvCQ: e.cq, Cap: verbs.QPCap{MaxSendWR: depth, MaxRecvWR: depth}})
		if err != nil {
			return nil, fmt.Errorf("create QP %d: %w", i, err)
		}
		var b [4]byte
		_, _ = rand.Read(b[:])
		e.qps = append(e.qps, qp)
		e.psns = append(e.psns, binary.LittleEndian.Uint32(b[:])&0xffffff)
	}
	return e, nil
}

// Buf is the registered buffer (tests check its contents).
func (e *Endpoint) Buf() []byte { return e.buf }

// Info describes the endpoint for its peer; udpPort is the port its link
// receives on.
func (e *Endpoint) Info(udpPort uint16) Info {
	gid, _ := e.dev.QueryGID(0)
	in := Info{GID: gid, UDPPort: udpPort, VA: e.mr.Addr(), RKey: e.mr.RKey(), Len: len(e.buf)}
	for i, qp := range e.qps {
		in.QPs = append(in.QPs, QPInfo{QPN: qp.Num(), PSN: e.psns[i]})
	}
	return in
}

// Connect brings every QP to RTS against the peer's QP of the same index.
func (e *Endpoint) Connect(r Info, mtu int) error {
	if len(r.QPs) != len(e.qps) {
		return fmt.Errorf("peer has %d QPs, we have %d", len(r.QPs), len(e.qps))
	}
	for i, qp := range e.qps {
		// Timeout 14 (67 ms) and retry 7 are ibv_rc_pingpong's defaults.
		if err := qp.Connect(verbs.RemoteInfo{QPN: r.QPs[i].QPN, PSN: r.QPs[i].PSN, GID: r.GID},
			&verbs.ConnectOptions{PathMTU: mtu, SQPSN: e.psns[i]}); err != nil {
			return fmt.Errorf("connect QP 0x%06x to 0x%06x: %w", qp.Num(), r.QPs[i].QPN, err)
		}
	}
	return nil
}

// Close destroys the device (and its link).
func (e *Endpoint) Close() error { return e.dev.Close() }

// PostReceives keeps n receive WRs of size bytes posted on every QP, for
// the server of a send test.
func (e *Endpoint) PostReceives(n, size int) error {
	for q := range e.qps {
		for i := 0; i < n; i++ {
			if err := e.postRecv(q, size); err != nil {
				return err
			}
		}
	}
	e.recvs = n
	return nil
}

// wr builds the work request template for one QP.
func (e *Endpoint) wr(t Test, size int, r Info) verbs.SendWR {
	w := verbs.SendWR{Flags: verbs.SendSignaled, SGL: []verbs.SGE{{Addr: e.mr.Addr(), Length: uint32(size), LKey: e.mr.LKey()}},
		RemoteAddr: r.VA, RKey: r.RKey}
	switch t {
	case Write:
		w.Opcode = verbs.WRRDMAWrite
	case Read:
		w.Opcode = verbs.WRRDMARead
	case Send:
		w.Opcode = verbs.WRSend
	case Atomic:
		w.Opcode = verbs.WRAtomicFetchAndAdd
		w.CompareAdd = 1
		w.SGL[0].Length = 8
	}
	return w
}

// LatResult is one row of a latency report, in microseconds. Each sample
// is one operation from post to completion (a full round trip).
type LatResult struct {
	Test       Test    `json:"test"`
	Bytes      int     `json:"bytes"`
	Iterations int64   `json:"iterations"`
	Min        float64 `json:"t_min_usec"`
	Max        float64 `json:"t_max_usec"`
	Typical    float64 `json:"t_typical_usec"`
	Avg        float64 `json:"t_avg_usec"`
	Stdev      float64 `json:"t_stdev_usec"`
	P99        float64 `json:"p99_usec"`
	P999       float64 `json:"p99_9_usec"`
	// Retransmits counts packets the client's QPs sent again.
	Retransmits uint64 `json:"retransmits"`
}

// retransmits sums the client QPs' retransmission counters.
func (e *Endpoint) retransmits() uint64 {
	var n uint64
	for _, qp := range e.qps {
		n += qp.Stats().Retransmits
	}
	return n
}

// RunLat measures latency: one operation at a time, each timed from post
// to completion (one CQ poll, then a wait on the CQ: see await).
func (e *Endpoint) RunLat(ctx context.Context, c *Config, size int, r Info) (LatResult, error) {
	res := LatResult{Test: c.Test, Bytes: size}
	if c.Test == Atomic {
		size = 8
	}
	if size > r.Len || size > len(e.buf) {
		return res, fmt.Errorf("size %d exceeds the registered buffers (%d local, %d remote)", size, len(e.buf), r.Len)
	}
	wrs := make([]verbs.SendWR, len(e.qps))
	for i := range wrs {
		wrs[i] = e.wr(c.Test, size, r)
	}
	total := int64(c.Iters)
	var deadline time.Time
	start := time.Now()
	if c.Duration > 0 {
		total = math.MaxInt64
		deadline = start.Add(c.Duration)
	}
	retx0 := e.retransmits()
	samples := make([]float64, 0, min(total, 1<<20))
	wc := make([]verbs.WC, 1)
	clk := latClock{start: start}
	for i := int64(0); i < total; i++ {
		q := int(i % int64(len(e.qps)))
		t0 := clk.now()
		if !deadline.IsZero() && t0 > c.Duration {
			break
		}
		if err := e.qps[q].PostSend(&wrs[q]); err != nil {
			return res, fmt.Errorf("post %s: %w", c.Test, err)
		}
		if err := e.await(ctx, wc, c.BusyPoll); err != nil {
			return res, fmt.Errorf("after %d operations: %w", i, err)
		}
		t1 := clk.now()
		if wc[0].Status != 0 {
			return res, fmt.Errorf("%s completed with status %v after %d operations", c.Test, wc[0].Status, i)
		}
		samples = append(samples, float64((t1-t0).Nanoseconds())/1000)
		clk.progress(c, t1, i+1, total)
	}
	if c.Progress != nil {
		c.Progress(int64(len(samples)), int64(len(samples)))
	}
	if len(samples) == 0 {
		return res, errors.New("no operation completed")
	}
	fillLat(&res, samples)
	res.Retransmits = e.retransmits() - retx0
	return res, nil
}

// latClock times latency samples from the monotonic clock alone, two
// reads per sample: time.Now also reads the wall clock, and a clock read
// costs over 100 ns on a virtual machine, in a round trip of a few
// microseconds. The raw UDP reference is timed the same way.
type latClock struct {
	start      time.Time
	lastReport time.Duration
}

// now is the time since start.
func (l *latClock) now() time.Duration { return time.Since(l.start) }

// progress reports to c.Progress at most every 100 ms, at time t.
func (l *latClock) progress(c *Config, t time.Duration, done, total int64) {
	if c.Progress == nil || t-l.lastReport < 100*time.Millisecond {
		return
	}
	l.lastReport = t
	if c.Duration > 0 {
		total = 0
	}
	c.Progress(done, total)
}

// await waits for one completion: one poll, then a wait on the CQ. It
// does not spin: on a host with few cores a spinning waiter holds the
// processor the device's receive goroutine needs to deliver the very
// completion it waits for (a 50 us spin made every round trip last 50 us
// on two cores), and a yielding one keeps the Go scheduler from polling
// the network.
//
// With busy-poll (busy > 0) it spins on Poll until the completion comes,
// as perftest's latency tests poll their CQ: the device is then in
// busy-poll mode, where each empty Poll runs the device's receive path on
// this goroutine (verbs.Options.BusyPoll), so the spin is the receive
// loop and the device's receive goroutine sleeps meanwhile. It does not
// fall back to Wait after a while: the receive goroutine takes over only
// once polls have stopped for a while (up to twice the busy-poll time),
// which would add that to every round trip slower than the fallback.
func (e *Endpoint) await(ctx context.Context, wc []verbs.WC, busy time.Duration) error {
	if e.cq.Poll(wc) == 1 {
		return nil
	}
	if busy > 0 {
		for i := 1; ; i++ {
			if e.cq.Poll(wc) == 1 {
				return nil
			}
			if i&1023 == 0 {
				if err := ctx.Err(); err != nil {
					return err
				}
			}
		}
	}
	_, err := e.cq.Wait(ctx, wc[:1])
	return err
}

// fillLat computes the statistics of samples (sorted in place).
func fillLat(r *LatResult, samples []float64) {
	sort.Float64s(samples)
	n := len(samples)
	r.Iterations = int64(n)
	r.Min, r.Max = samples[0], samples[n-1]
	r.Typical = samples[n/2]
	var sum float64
	for _, s := range samples {
		sum += s
	}
	r.Avg = sum / float64(n)
	var v float64
	for _, s := range samples {
		v += (s - r.Avg) * (s - r.Avg)
	}
	r.Stdev = math.Sqrt(v / float64(n))
	pct := func(p float64) float64 {
		i := int(math.Ceil(p*float64(n))) - 1
		return samples[min(max(i, 0), n-1)]
	}
	r.P99, r.P999 = pct(0.99), pct(0.999)
}
