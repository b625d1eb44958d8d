package rc

import (
	"encoding/binary"
	"time"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/qpstate"
	"github.com/softroce/softroce/transport/engine"
	"github.com/softroce/softroce/wr"
)

// complete is the completer: it matches an ACK, NAK, READ response or
// ATOMIC ACKNOWLEDGE to the oldest outstanding work requests (IBTA
// §9.7.5.1; rxe_comp.c), completing them strictly in posting order.
func (qp *rcQP) complete(p *bth.Packet) {
	psn := p.BTH.PSN()
	op := p.Info.Op
	var syn bth.Syndrome = bth.SyndromeACKUnlimited
	if p.AETH != nil {
		syn = p.AETH.Syndrome()
	}
	// A READ response or atomic ACK whose AETH is not an ACK is malformed
	// (rxe moves the QP to ERR); treat it as a bad response.
	if op != bth.OpAck && !syn.IsACK() {
		qp.Counters.Dropped++
		return
	}
	isNAK := op == bth.OpAck && !syn.IsACK()
	// A response beyond every PSN we sent is a ghost (IBTA §9.7.6: outside
	// the outstanding window): it acknowledges nothing.
	if !qp.sentAny || bth.PSNDiff(psn, qp.maxSentPSN) > 0 {
		qp.Counters.Dropped++
		return
	}
	for qp.SQCount > 0 {
		w := &qp.SQ[qp.SQHead]
		if w.State != engine.WQEStarted {
			return
		}
		wop := w.WR.Opcode
		switch {
		case wop.IsSend() || wop.IsWrite():
			// Any response at or beyond the last PSN acknowledges the
			// message (coalesced and implicit ACKs); a NAK acknowledges
			// everything before its PSN.
			if d := bth.PSNDiff(psn, w.LastPSN); d > 0 || d == 0 && !isNAK {
				qp.completeHead(cq.Success, 0)
				continue
			}
			if isNAK {
				if bth.PSNDiff(psn, w.FirstPSN) >= 0 {
					qp.handleNAK(w, psn, syn)
				}
				return
			}
			// A plain ACK inside the message: partial progress.
			if op == bth.OpAck && bth.PSNDiff(psn, qp.compPSN) >= 0 {
				qp.progress(bth.PSNAdd(psn, 1))
			}
			return
		case wop == wr.RDMARead:
			if op == bth.OpReadResponse && bth.PSNDiff(psn, w.FirstPSN) >= 0 && bth.PSNDiff(psn, w.LastPSN) <= 0 {
				qp.readResponse(w, p)
				return
			}
			if isNAK && bth.PSNDiff(psn, w.FirstPSN) >= 0 && bth.PSNDiff(psn, w.LastPSN) <= 0 {
				qp.handleNAK(w, psn, syn)
				return
			}
			if bth.PSNDiff(psn, w.LastPSN) > 0 {
				// Implied NAK: a later response means this READ's
				// responses were lost (rxe check_psn); re-read now.
				qp.retry(w, "implied NAK on READ", false)
			}
			return
		default: // atomics, ATOMIC_WRITE
			if psn == w.FirstPSN {
				switch {
				case op == bth.OpAtomicAck && wop.IsAtomic():
					orig := p.AtomicAckETH.Orig()
					var b [8]byte
					// The original value lands in the local buffer in host
					// order, as rxe and libibverbs users expect.
					binary.LittleEndian.PutUint64(b[:], orig)
					if err := engine.Scatter(qp.MRs(), qp.Config.PD, w.SGL, 0, b[:]); err != nil {
						qp.completeHead(cq.LocProtErr, 0)
						qp.ToError("atomic result: " + err.Error())
						return
					}
					qp.completeHead(cq.Success, orig)
					continue
				case op == bth.OpReadResponse && wop == wr.AtomicWrite:
					qp.completeHead(cq.Success, 0)
					continue
				case isNAK:
					qp.handleNAK(w, psn, syn)
					return
				}
			}
			if bth.PSNDiff(psn, w.LastPSN) > 0 {
				qp.retry(w, "implied NAK on atomic", false)
			}
			return
		}
	}
}

// readResponse places one READ response segment. Responses must arrive in
// PSN order; an out-of-order one re-reads at once from the first missing
// PSN, as ConnectX does (rxe waits for its timer instead).
func (qp *rcQP) readResponse(w *engine.SendWQE, p *bth.Packet) {
	pmtu := qp.Attr.PMTU
	psn := p.BTH.PSN()
	k := bth.PSNDiff(psn, w.FirstPSN)
	want := w.ReadDone / pmtu
	if w.ReadDone == w.Length && w.Length > 0 {
		want = w.NPSN
	}
	switch {
	case k < want:
		return // duplicate
	case k > want:
		qp.retry(w, "READ response gap", true)
		return
	}
	last := k == w.NPSN-1
	// Response opcode sequence (IBTA §9.7.6): FIRST (or ONLY) where a
	// request's responses start, MIDDLE inside, LAST (or ONLY) at the
	// READ's last PSN. A re-read may start with FIRST, as a new request,
	// or with MIDDLE, as rxe replays it.
	start := k == 0 || k == w.ReRead
	pos := p.Info.Pos
	ok := false
	switch {
	case last:
		ok = pos == bth.PosLast || pos == bth.PosOnly && start
	default:
		ok = pos == bth.PosMiddle && k > 0 || pos == bth.PosFirst && start
	}
	if !ok {
		qp.completeHead(cq.BadRespErr, 0)
		qp.ToError("READ response " + p.Info.Name + " out of sequence")
		return
	}
	plen := len(p.Payload)
	wantLen := min(pmtu, w.Length-k*pmtu)
	if plen != wantLen {
		qp.completeHead(cq.BadRespErr, 0)
		qp.ToError("READ response of wrong length")
		return
	}
	if plen > 0 {
		if err := engine.Scatter(qp.MRs(), qp.Config.PD, w.SGL, k*pmtu, p.Payload); err != nil {
			qp.completeHead(cq.LocProtErr, 0)
			qp.ToError("READ response placement: " + err.Error())
			return
		}
	}
	w.ReadDone += plen
	if last {
		qp.completeHead(cq.Success, 0)
		return
	}
	qp.progress(bth.PSNAdd(psn, 1))
}

// handleNAK acts on a NAK or RNR NAK for w at psn (IBTA §9.7.5.1.3-4).
// A NAK behind compPSN is stale (its PSN was acknowledged since, e.g. a
// delayed NAK after a retry got through) and is ignored, as rxe drops a
// response older than its completer PSN: compPSN never moves backwards.
func (qp *rcQP) handleNAK(w *engine.SendWQE, psn uint32, syn bth.Syndrome) {
	if bth.PSNDiff(psn, qp.compPSN) < 0 {
		qp.Counters.Dropped++
		return
	}
	qp.progress(psn) // everything before the NAKed PSN arrived
	switch {
	case syn.IsRNRNAK():
		qp.Counters.RNRNAKsRecv++
		if qp.Attr.RNRRetry != 7 {
			if qp.rnrLeft == 0 {
				qp.completeHead(cq.RNRRetryExcErr, 0)
				qp.ToError("RNR retry count exceeded")
				return
			}
			qp.rnrLeft--
		}
		qp.RNRDeadline = qp.Now().Add(max(bth.RNRTimer(syn.Value()), time.Microsecond))
		qp.RetryDeadline = time.Time{}
		qp.UpdateTimerSet()
	case syn.Value() == bth.NAKPSNSeqError:
		qp.Counters.SeqNAKsRecv++
		qp.retry(w, "PSN sequence error NAK", false)
	default:
		st := cq.RemOpErr
		switch syn.Value() {
		case bth.NAKInvalidRequest:
			st = cq.RemInvReqErr
		case bth.NAKRemoteAccessError:
			st = cq.RemAccessErr
		}
		qp.completeHead(st, 0)
		qp.ToError("remote NAK: " + syn.String())
	}
}

// retry goes back to compPSN, spending retry_cnt unless free is set (a
// re-read for a READ response gap costs nothing).
//
// One go-back-N per restart point: NAKs, implied NAKs and READ gaps that
// arrive while a retry from the same compPSN is on its way (duplicate
// ACKs, the rest of a gap) change nothing; only progress or the local ACK
// timeout allows another. rxe's started_retry plays the same role.
func (qp *rcQP) retry(w *engine.SendWQE, why string, free bool) {
	if qp.retrying && qp.retryFrom == qp.compPSN {
		return
	}
	qp.retrying, qp.retryFrom = true, qp.compPSN
	if !free {
		if qp.retryLeft == 0 {
			qp.completeHead(cq.RetryExcErr, 0)
			qp.ToError("transport retry counter exceeded (" + why + ")")
			return
		}
		qp.retryLeft--
	}
	qp.goBackN()
}

// goBackN rewinds the requester to the oldest unacknowledged PSN. A SEND
// or WRITE resumes mid-message with a MIDDLE or LAST packet; a READ is
// re-issued for the missing part only (rxe req_retry).
func (qp *rcQP) goBackN() {
	qp.SQSendOff, qp.SQPkt = 0, 0
	qp.rtt.timing = false // Karn: an ACK may now answer either copy
	if qp.SQCount == 0 {
		return
	}
	w := &qp.SQ[qp.SQHead]
	if w.State == engine.WQEStarted {
		k := bth.PSNDiff(qp.compPSN, w.FirstPSN)
		switch {
		case k <= 0 || w.WR.Opcode.IsAtomic() || w.WR.Opcode == wr.AtomicWrite:
			k = 0
		case k >= w.NPSN:
			k = w.NPSN - 1
		}
		if w.WR.Opcode == wr.RDMARead {
			k = w.ReadDone / qp.Attr.PMTU
		}
		qp.SQPkt = k
	}
	qp.RetryDeadline = time.Time{}
	qp.UpdateTimerSet()
	qp.Kick()
}

// progress records that every PSN before next has been acknowledged.
func (qp *rcQP) progress(next uint32) {
	if bth.PSNDiff(next, qp.compPSN) <= 0 {
		return
	}
	qp.compPSN = next
	qp.rtt.acked(qp, next)
	if qp.rtt.valid {
		// Progress ends a loss episode: back to the estimate. Before the
		// first sample the backed-off timeout stays, or a round trip
		// longer than the IBTA timeout would never be sampled (Karn).
		qp.rtt.shift = 0
	}
	qp.retryLeft = int(qp.Attr.RetryCnt)
	qp.rnrLeft = int(qp.Attr.RNRRetry)
	qp.retrying = false
	if qp.outstanding() && qp.Attr.Timeout != 0 {
		qp.RetryDeadline = qp.Now().Add(qp.ackTimeout())
	} else {
		qp.RetryDeadline = time.Time{}
	}
	qp.UpdateTimerSet()
	qp.Kick()
}

// completeHead completes the oldest WQE with status st and retires it.
func (qp *rcQP) completeHead(st cq.Status, orig uint64) {
	w := &qp.SQ[qp.SQHead]
	if st == cq.Success {
		qp.progress(bth.PSNAdd(w.LastPSN, 1))
	}
	if needsRDResource(w.WR.Opcode) && w.State == engine.WQEStarted {
		qp.RDOutstanding--
	}
	if !qp.CompleteHead(st, orig) {
		return
	}
	if !qp.outstanding() {
		qp.RetryDeadline = time.Time{}
		qp.UpdateTimerSet()
	}
	if st == cq.Success {
		qp.DrainLocal() // local work requests it was holding back
	}
	qp.Kick()
}

// checkTimers fires the RNR wait and the local ACK timeout.
func (qp *rcQP) checkTimers() {
	now := qp.Now()
	if !qp.RNRDeadline.IsZero() && !now.Before(qp.RNRDeadline) {
		qp.RNRDeadline = time.Time{}
		qp.goBackN()
	}
	if !qp.RetryDeadline.IsZero() && !now.Before(qp.RetryDeadline) {
		qp.RetryDeadline = time.Time{}
		qp.Counters.Timeouts++
		qp.rtt.backoff()
		if qp.outstanding() && qp.StateLocked() == qpstate.RTS {
			qp.retrying = false // a timeout always retries
			qp.retry(&qp.SQ[qp.SQHead], "local ACK timeout", false)
		}
	}
	qp.UpdateTimerSet()
}

// outstanding reports whether packets have been sent and not acknowledged:
// the next PSN to transmit is ahead of the oldest unacknowledged one.
func (qp *rcQP) outstanding() bool {
	next := qp.NextPSN
	if qp.SQSendOff < qp.SQCount {
		if w := &qp.SQ[(qp.SQHead+qp.SQSendOff)%len(qp.SQ)]; w.State == engine.WQEStarted {
			next = bth.PSNAdd(w.FirstPSN, qp.SQPkt)
		}
	}
	return bth.PSNDiff(next, qp.compPSN) > 0
}

// The adaptive local ACK timeout (Path.AdaptiveTimeout) estimates the
// round trip as TCP does (RFC 6298): one PSN at a time is timed from its
// first transmission to the ACK that covers it, and never a PSN sent again
// (Karn's rule: go-back-N cancels the sample). The timeout is SRTT +
// 4*RTTVAR (before the first sample: initialAdaptiveTimeout), doubled on
// each expiry until the next progress (before the first sample: until
// that sample), and bounded
// below by the QP's IBTA timeout (IBTA §9.7.6.1.3 makes that the least
// time to wait, so adapting may only lengthen it) and above by
// maxAdaptiveTimeout.

// initialAdaptiveTimeout is the adaptive timeout before the first sample
// (when the IBTA one is shorter): its seven doublings span a quarter of a
// second, where 8 us (IBTA timeout 1) spanned about 2 ms, less than a
// loaded host may take to run the peer once.
const initialAdaptiveTimeout = time.Millisecond

// maxAdaptiveTimeout caps the adaptive timeout (when the IBTA one is
// shorter): a lost packet is still retried within this.
const maxAdaptiveTimeout = time.Second

// rttEstimator is one QP's round-trip estimate.
type rttEstimator struct {
	srtt, rttvar time.Duration
	valid        bool      // srtt holds a sample
	timing       bool      // psn, sent time one sample
	psn          uint32    // the PSN being timed
	sent         time.Time // when it was first sent
	shift        uint8     // expiries since the last sample: timeout << shift
}

// start times psn, sent for the first time now, unless a sample runs.
func (r *rttEstimator) start(qp *rcQP, psn uint32) {
	if !qp.Attr.AdaptiveTimeout || r.timing {
		return
	}
	r.timing, r.psn, r.sent = true, psn, qp.Now()
}

// acked takes a sample when every PSN before next is acknowledged and the
// timed one is among them.
func (r *rttEstimator) acked(qp *rcQP, next uint32) {
	if !r.timing || bth.PSNDiff(next, r.psn) <= 0 {
		return
	}
	r.timing = false
	m := qp.Now().Sub(r.sent)
	if m < 0 {
		return
	}
	r.shift = 0
	if !r.valid {
		r.srtt, r.rttvar, r.valid = m, m/2, true
		return
	}
	d := r.srtt - m
	if d < 0 {
		d = -d
	}
	r.rttvar += (d - r.rttvar) / 4 // beta = 1/4
	r.srtt += (m - r.srtt) / 8     // alpha = 1/8
}

// backoff doubles the timeout after an expiry (RFC 6298 §5.5).
func (r *rttEstimator) backoff() {
	if r.shift < 16 {
		r.shift++
	}
}

// ackTimeout is the time the requester waits for an ACK before it
// retries: the IBTA local ACK timeout, or with AdaptiveTimeout the
// estimate above, never less than the IBTA one.
func (qp *rcQP) ackTimeout() time.Duration {
	base := localAckTimeout(qp.Attr.Timeout)
	r := &qp.rtt
	if !qp.Attr.AdaptiveTimeout || base == 0 {
		return base
	}
	// Before the first sample nothing is known of the path: start from a
	// conservative timeout, as RFC 6298 §2.1 does, so that the retries
	// before a first round trip span a host's scheduling stalls.
	t := max(base, initialAdaptiveTimeout)
	if r.valid {
		t = max(base, r.srtt+max(4*r.rttvar, time.Microsecond))
	}
	t = min(t<<r.shift, max(maxAdaptiveTimeout, base))
	return max(t, base)
}

// localAckTimeout is 4.096 us * 2^timeout (IBTA §9.7.6.1.3); 0 = never.
func localAckTimeout(t uint8) time.Duration {
	if t == 0 {
		return 0
	}
	return time.Duration(4096<<t) * time.Nanosecond
}
