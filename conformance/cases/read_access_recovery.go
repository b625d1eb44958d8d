package cases

import (
	"bytes"
	"time"

	"github.com/softroce/softroce/bth"
)

// docs/conformance-catalogue.md sections A.3 (access rights: GU-12), A.1 and
// A.2 (READ recovery: RS-11, LU-11, LU-12).

// Access-right cases for READ and atomics, and requester READ recovery.
var accessCases = []*Case{
	{
		ID:   "remote-access-read-no-permission",
		Spec: "An RDMA READ from an MR registered without REMOTE_READ: NAK remote access error (0x62), no data returned, QP to error (IBTA §9.7.5 class C, §10.6 access rights)",
		Run: func(x *X) {
			n := randPSN()
			x.Open(QPSpec{RecvPSN: n, MRs: []MRSpec{{Len: 16384, Access: AccessLocalWrite | AccessRemoteWrite}}})
			mr := x.S.MR(0)
			fatalNAK(x, bth.SyndromeRemoteAccessError, readReq(n, mr.Addr, mr.RKey, 64), nil, 0)
		},
	},
	{
		ID:   "remote-access-atomic-no-permission",
		Spec: "A FETCH_ADD on an MR registered without REMOTE_ATOMIC: NAK remote access error (0x62), memory unchanged, QP to error (IBTA §9.7.5 class C, §10.6 access rights)",
		Run: func(x *X) {
			n := randPSN()
			x.Open(QPSpec{RecvPSN: n, MRs: []MRSpec{{Len: 16384, Access: AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead}}})
			mr := x.S.MR(0)
			f := bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCFetchAdd, PSN: n, AckReq: true}, VA: mr.Addr + 64, RKey: mr.RKey, SwapAdd: 1}
			fatalNAK(x, bth.SyndromeRemoteAccessError, f, nil, 64)
		},
	},
}

var readRecoveryCases = []*Case{
	{
		ID: "requester-read-retransmit-after-timeout",
		Spec: "An RDMA READ whose request is lost (no response) is re-issued with the same PSN, VA and length " +
			"after the local ACK timeout (T = 67 ms, IBTA §9.7.6.1.3 allows T..4T; 10% granularity allowed, " +
			"rxe two jiffies); " +
			"answered, it completes with the data (IBTA §9.7.6)",
		Run: func(x *X) {
			s := randPSN()
			x.Open(QPSpec{SendPSN: s, Timeout: 14, Retry: 3})
			x.Must(x.S.PostSend(x.Ctx, SendReq{WRID: 81, Op: SendRead, Off: 512, Len: 40, RemoteAddr: 0x80000, RKey: 0x88}), "post READ")
			got := x.C.Expect(answerWait, 1)
			q1 := first(got)
			if !x.Check(q1 != nil && q1.Opcode() == bth.RCReadRequest && q1.PSN() == s, "want a READ request at 0x%06x, got %s", s, DescribeAll(got)) {
				return
			}
			got = x.C.Expect(answerWait, 1)
			q2 := first(got)
			if !x.Check(q2 != nil, "no retransmission within %v", answerWait) {
				return
			}
			gap := q2.Time.Sub(q1.Time)
			x.Observe("READ, no response -> %s after %.1f ms", Describe(q2), float64(gap.Microseconds())/1000)
			T := 67108864 * time.Nanosecond
			x.Check(q2.Opcode() == bth.RCReadRequest && q2.PSN() == s && q2.P.RETH.VA() == 0x80000 && q2.P.RETH.DMALen() == 40,
				"the retransmission is %s, want the same READ", q2)
			x.Check(gap >= timeoutLow(x, T) && gap <= 4*T+50*time.Millisecond, "re-issued after %v, want %v..%v", gap, T, 4*T)
			data := pattern(40, 91)
			x.Send(bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCReadResponseOnly, PSN: s}, Syndrome: bth.SyndromeACKUnlimited, MSN: 1}, data)
			wc, err := x.S.Poll(x.Ctx, answerWait)
			x.Must(err, "poll")
			x.Observe("answered -> completion %v", statusOf(wc))
			x.Check(wc != nil && wc.WRID == 81 && wc.Status == 0 && wc.ByteLen == 40, "completion %+v, want wr 81 success 40 bytes", wc)
			x.Check(bytes.Equal(x.mem(0, 512, 40), data), "READ data not placed")
		},
	},
	{
		ID: "requester-read-resume-after-partial-response",
		Spec: "A 3-packet RDMA READ (PMTU 1024) of which only READ_RESPONSE_FIRST arrives is re-issued after the " +
			"local ACK timeout either whole (PSN n, same VA and length) or for the rest (PSN n+1, VA+1024, 2048 bytes); " +
			"answered accordingly it completes with all 3072 bytes in place (IBTA §9.7.6 READ retry)",
		Run: func(x *X) {
			s := randPSN()
			x.Open(QPSpec{SendPSN: s, Timeout: 14, Retry: 3, MTU: 1024})
			x.Must(x.S.PostSend(x.Ctx, SendReq{WRID: 82, Op: SendRead, Len: 3072, RemoteAddr: 0x90000, RKey: 0x99}), "post READ")
			got := x.C.Expect(answerWait, 1)
			if !x.Check(first(got) != nil && first(got).Opcode() == bth.RCReadRequest && first(got).PSN() == s, "want a READ at 0x%06x, got %s", s, DescribeAll(got)) {
				return
			}
			data := pattern(3072, 101)
			resp := func(op bth.Opcode, psn uint32) bth.Fields {
				return bth.Fields{BTH: bth.BTHFields{Opcode: op, PSN: psn}, Syndrome: bth.SyndromeACKUnlimited, MSN: 1}
			}
			x.Send(resp(bth.RCReadResponseFirst, s), data[:1024])
			got = x.C.Expect(answerWait, 1)
			q := first(got)
			if !x.Check(q != nil && q.Opcode() == bth.RCReadRequest, "no READ re-issued after the partial response (%s)", DescribeAll(got)) {
				return
			}
			va, l, psn := q.P.RETH.VA(), q.P.RETH.DMALen(), q.PSN()
			x.Observe("FIRST only -> re-issued READ psn=0x%06x va=0x%x len=%d", psn, va, l)
			switch {
			case psn == s && va == 0x90000 && l == 3072:
				x.Notef("re-read the whole READ")
				x.Send(resp(bth.RCReadResponseFirst, s), data[:1024])
				x.Send(resp(bth.RCReadResponseMiddle, bth.PSNAdd(s, 1)), data[1024:2048])
				x.Send(resp(bth.RCReadResponseLast, bth.PSNAdd(s, 2)), data[2048:])
			case psn == bth.PSNAdd(s, 1) && va == 0x90000+1024 && l == 2048:
				x.Notef("re-read only the missing 2048 bytes from PSN+1")
				// A responder answers a re-read as a new READ of 2 packets.
				x.Send(resp(bth.RCReadResponseFirst, bth.PSNAdd(s, 1)), data[1024:2048])
				x.Send(resp(bth.RCReadResponseLast, bth.PSNAdd(s, 2)), data[2048:])
			default:
				x.Failf("re-issued READ psn=0x%06x va=0x%x len=%d matches neither form", psn, va, l)
				return
			}
			wc, err := x.S.Poll(x.Ctx, answerWait)
			x.Must(err, "poll")
			x.Observe("answered -> completion %v", statusOf(wc))
			x.Check(wc != nil && wc.WRID == 82 && wc.Status == 0 && wc.ByteLen == 3072, "completion %+v, want wr 82 success 3072 bytes", wc)
			x.Check(bytes.Equal(x.mem(0, 0, 3072), data), "READ data not placed correctly")
		},
	},
}

// timeoutLow is the earliest a retransmission after the local ACK timeout
// T may come: 10% below T for timer granularity. rxe arms a kernel timer
// of whole jiffies (4 ms at the usual HZ 250), which can fire almost a
// jiffy early, and in a guest the first packet can leave a tick after
// the timer was armed while the capture's clock is the host's: it gets
// two jiffies below T.
func timeoutLow(x *X, T time.Duration) time.Duration {
	low := T * 9 / 10
	if DriverOf(x.Target) == "rxe" {
		low = min(low, T-8*time.Millisecond)
	}
	return low
}
