package perf

import (
	"context"
	"fmt"
	"time"

	"github.com/softroce/softroce/cc/dcqcn"
	"github.com/softroce/softroce/internal/traffic"
	"github.com/softroce/softroce/verbs"
)

// BWResult is one row of a bandwidth report. MB is 2^20 bytes. Every
// figure comes from the traffic engine that `softroce perftest` measures
// with too.
type BWResult struct {
	Test        Test          `json:"test"`
	Bytes       int           `json:"bytes"`
	Iterations  int64         `json:"iterations"`
	PeakMBps    float64       `json:"bw_peak_mb_per_sec"`
	AvgMBps     float64       `json:"bw_average_mb_per_sec"`
	MsgRateMpps float64       `json:"msg_rate_mpps"`
	Elapsed     time.Duration `json:"elapsed_ns"`
	QPs         int           `json:"qps"`
	// TxPackets and RxPackets are the packets the client's QPs sent and
	// received during this size (retransmissions included), as the
	// transport counted them; the rates are those over Elapsed.
	TxPackets     uint64  `json:"tx_packets"`
	RxPackets     uint64  `json:"rx_packets"`
	TxPktRateMpps float64 `json:"tx_pkt_rate_mpps"`
	RxPktRateMpps float64 `json:"rx_pkt_rate_mpps"`
	// Retransmits counts packets the client's QPs sent again (go-back-N
	// after a loss or timeout) during this size: non-zero means the
	// path dropped packets, which costs bandwidth.
	Retransmits uint64 `json:"retransmits"`
	// CC is congestion control's state at the end of this size, when it
	// is on.
	CC *CCResult `json:"cc,omitempty"`
}

// CCResult is what congestion control did on this side: the device's
// counters (ConnectX's names) and each QP's rate and time held back by
// its pacer, all since the device opened.
type CCResult struct {
	Device dcqcn.Counters    `json:"device"`
	QPs    []verbs.CCQPStats `json:"qps"`
}

// ccResult reports congestion control on e, nil when none of its QPs
// has it on.
func (e *Endpoint) ccResult() *CCResult {
	r := &CCResult{Device: e.dev.Stats().CC}
	on := false
	for _, qp := range e.qps {
		s := qp.Stats().CC
		on = on || s.Enabled
		r.QPs = append(r.QPs, s)
	}
	if !on {
		return nil
	}
	return r
}

// bwResult turns the engine's figures into a row.
func bwResult(t Test, size, qps int, r traffic.Result) BWResult {
	return BWResult{Test: t, Bytes: size, QPs: qps, Iterations: r.Messages, Elapsed: r.Elapsed,
		PeakMBps: r.Peak / traffic.MiB, AvgMBps: r.Avg / traffic.MiB, MsgRateMpps: r.MsgRate / 1e6,
		TxPackets: r.Stats.TxPackets, RxPackets: r.Stats.RxPackets,
		TxPktRateMpps: r.TxPktRate / 1e6, RxPktRateMpps: r.RxPktRate / 1e6, Retransmits: r.Stats.Retransmits}
}

// RunBW measures bandwidth of size-byte operations against the peer r:
// every operation signaled, TxDepth in flight per QP.
func (e *Endpoint) RunBW(ctx context.Context, c *Config, size int, r Info) (BWResult, error) {
	res := BWResult{Test: c.Test, Bytes: size, QPs: len(e.qps)}
	if c.Test == Atomic {
		size = 8
	}
	if size > r.Len || size > len(e.buf) {
		return res, fmt.Errorf("size %d exceeds the registered buffers (%d local, %d remote)", size, len(e.buf), r.Len)
	}
	s := traffic.Sender{CQ: e.cq, Size: size, Iters: c.Iters, Duration: c.Duration, TxDepth: c.TxDepth, Progress: c.Progress}
	for _, qp := range e.qps {
		s.QPs = append(s.QPs, qp)
		s.WRs = append(s.WRs, e.wr(c.Test, size, r))
	}
	tr, err := traffic.Send(ctx, &s)
	if err != nil {
		return res, fmt.Errorf("%s: %w", c.Test, err)
	}
	res = bwResult(res.Test, res.Bytes, res.QPs, tr)
	res.CC = e.ccResult()
	return res, nil
}

func (e *Endpoint) postRecv(q, size int) error {
	return e.qps[q].PostRecv(&verbs.RecvWR{ID: traffic.WRID(q, 0), SGL: []verbs.SGE{{Addr: e.mr.Addr(), Length: uint32(size), LKey: e.mr.LKey()}}})
}

// ServeReceives re-posts a receive for every one that completes, until
// ctx ends; it returns the number of messages received.
func (e *Endpoint) ServeReceives(ctx context.Context, size int) (int64, error) {
	r := traffic.Receiver{CQ: e.cq, Size: size, OnRecv: func(q, _ int, _ *verbs.WC) error {
		if err := e.postRecv(q, size); err != nil {
			return fmt.Errorf("re-post receive: %w", err)
		}
		return nil
	}}
	for _, qp := range e.qps {
		r.QPs = append(r.QPs, qp)
	}
	res, err := traffic.Receive(ctx, &r)
	return res.Messages, err
}
