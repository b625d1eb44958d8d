package cases

import (
	"bytes"

	"github.com/softroce/softroce/bth"
)

// docs/conformance-catalogue.md sections A.2 (LU-02, LU-03) and A.3 (GU-07).

// Go-back-N overlap and boundary cases.
var overlapCases = []*Case{
	{
		ID: "duplicate-mid-message-resend",
		Spec: "A 3-packet WRITE whose FIRST and MIDDLE were received is resent from FIRST (go-back-N after a lost " +
			"ACK): the duplicates are acknowledged, not NAKed or re-executed as errors, and the LAST completes the " +
			"message: ACK at its PSN, all bytes in place (IBTA §9.7.5.2.1 duplicates inside an open message)",
		Run: func(x *X) {
			n := randPSN()
			x.Open(QPSpec{RecvPSN: n, MTU: 1024})
			mr := x.S.MR(0)
			data := pattern(3072, 111)
			ops := []bth.Opcode{bth.RCWriteFirst, bth.RCWriteMiddle, bth.RCWriteLast}
			pkt := func(i int) (bth.Fields, []byte) {
				f := bth.Fields{BTH: bth.BTHFields{Opcode: ops[i], PSN: bth.PSNAdd(n, i), AckReq: i != 0}}
				if i == 0 {
					f.VA, f.RKey, f.DMALen = mr.Addr, mr.RKey, 3072
				}
				return f, data[i*1024 : (i+1)*1024]
			}
			x.Send(pkt(0))
			x.Send(pkt(1))
			got := x.C.Collect(answerWait, func(q *Pkt) bool { return isACK(q, bth.PSNAdd(n, 1)) })
			x.Observe("FIRST, MIDDLE -> %s", DescribeAll(got))
			for i := 0; i < 3; i++ {
				x.Send(pkt(i))
			}
			got = x.C.Collect(answerWait, func(q *Pkt) bool { return isACK(q, bth.PSNAdd(n, 2)) || hasNAK([]*Pkt{q}) })
			got = append(got, x.C.Collect(quietWait/5, nil)...)
			x.Observe("resent FIRST, MIDDLE, LAST -> %s", DescribeAll(got))
			x.Check(!hasNAK(got), "NAKed")
			x.Never("a NAK", anyNAK)
			found := false
			for _, q := range got {
				found = found || isACK(q, bth.PSNAdd(n, 2))
			}
			x.Check(found, "no ACK for the LAST at 0x%06x", bth.PSNAdd(n, 2))
			x.Check(bytes.Equal(x.mem(0, 0, 3072), data), "memory differs from the WRITE's data")
		},
	},
	{
		ID:   "atomic-out-of-bounds",
		Spec: "A FETCH_ADD at the first aligned address past the end of the MR: NAK remote access error (0x62), QP to error (IBTA §9.7.5 class C, §10.6)",
		Run: func(x *X) {
			n := randPSN()
			x.Open(QPSpec{RecvPSN: n})
			mr := x.S.MR(0)
			f := bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCFetchAdd, PSN: n, AckReq: true}, VA: mr.Addr + uint64(mr.Len), RKey: mr.RKey, SwapAdd: 1}
			fatalNAK(x, bth.SyndromeRemoteAccessError, f, nil, mr.Len-64)
		},
	},
}

var requesterAckCases = []*Case{
	{
		ID: "requester-resume-after-partial-ack",
		Spec: "A 3-packet WRITE whose first packet alone is ACKed is, after the local ACK timeout, resent from " +
			"the first unacknowledged PSN (WRITE MIDDLE at PSN+1, then LAST), not from FIRST; ACKed, it completes " +
			"(IBTA §9.7.6 go-back-N from the oldest unacknowledged PSN)",
		Run: func(x *X) {
			s := randPSN()
			x.Open(QPSpec{SendPSN: s, Timeout: 14, Retry: 3, MTU: 1024})
			data := pattern(3072, 121)
			x.setMem(0, 0, data)
			x.Must(x.S.PostSend(x.Ctx, SendReq{WRID: 91, Op: SendWrite, Len: 3072, RemoteAddr: 0xa0000, RKey: 0xaa}), "post WRITE")
			got := x.C.Expect(answerWait, 3)
			if !x.Check(len(got) == 3, "want 3 packets, got %s", DescribeAll(got)) {
				return
			}
			x.Send(ackFields(s, 0), nil)
			got = x.C.Expect(answerWait, 2)
			x.Observe("ACK for FIRST only, then silence -> %s", DescribeAll(got))
			if x.Check(len(got) >= 1, "no retransmission") {
				q := got[0]
				x.Check(q.Opcode() == bth.RCWriteMiddle && q.PSN() == bth.PSNAdd(s, 1) && bytes.Equal(q.P.Payload, data[1024:2048]),
					"the retransmission starts with %s, want WRITE_MIDDLE@0x%06x", Describe(q), bth.PSNAdd(s, 1))
			}
			x.Send(ackFields(bth.PSNAdd(s, 2), 1), nil)
			wc, err := x.S.Poll(x.Ctx, answerWait)
			x.Must(err, "poll")
			x.Observe("ACKed -> completion %v", statusOf(wc))
			x.Check(wc != nil && wc.WRID == 91 && wc.Status == 0, "completion %+v, want wr 91 success", wc)
		},
	},
	{
		ID: "requester-stale-ack",
		Spec: "An ACK for the PSN just before the WRITE (older than anything outstanding) is ignored: the WRITE " +
			"does not complete; the real ACK completes it (IBTA §9.7.6: duplicate/stale acknowledgements)",
		Run: func(x *X) {
			s := randPSN()
			x.Open(QPSpec{SendPSN: s, Timeout: 14, Retry: 7})
			x.Must(x.S.PostSend(x.Ctx, SendReq{WRID: 92, Op: SendWrite, Len: 8, RemoteAddr: 0xb0000, RKey: 0xbb}), "post WRITE")
			got := x.C.Expect(answerWait, 1)
			if !x.Check(first(got) != nil && first(got).PSN() == s, "want the WRITE at 0x%06x, got %s", s, DescribeAll(got)) {
				return
			}
			x.Send(ackFields(bth.PSNAdd(s, -1), 0), nil)
			wc, err := x.S.Poll(x.Ctx, quietWait/2)
			x.Must(err, "poll")
			x.Observe("ACK at PSN-1 -> completion %v", statusOf(wc))
			x.Check(wc == nil, "the stale ACK completed the WRITE: %+v", wc)
			if wc != nil {
				return
			}
			x.Send(ackFields(s, 1), nil)
			wc, err = x.S.Poll(x.Ctx, answerWait)
			x.Must(err, "poll")
			x.Observe("real ACK -> completion %v", statusOf(wc))
			x.Check(wc != nil && wc.WRID == 92 && wc.Status == 0, "completion %+v, want wr 92 success", wc)
		},
	},
}
