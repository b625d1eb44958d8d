package cases

import (
	"bytes"
	"encoding/binary"
	"time"

	"github.com/softroce/softroce/bth"
)

// docs/conformance-catalogue.md sections A.1, A.3 and A.4 (responder checks)
// and A.1 (requester retries: RS-12, RS-13, RS-19, RS-20).

// More responder cases from the catalogue (docs/conformance-catalogue.md
// A.1, A.3), inserted before the requester cases.
var moreResponder = []*Case{
	{
		ID: "psn-gap-mid-message-recovery",
		Spec: "A 4-packet WRITE (PMTU 1024) whose second packet is withheld: exactly one NAK 0x60 carrying the " +
			"missing PSN, the rest dropped; resent from the missing PSN (MIDDLE, MIDDLE, LAST) it is accepted, " +
			"ACKed at the last PSN, and all 4096 bytes land (IBTA §9.7.5 PSN check, §9.7.6 go-back-N)",
		Run: func(x *X) {
			n := randPSN()
			x.Open(QPSpec{RecvPSN: n, MTU: 1024})
			mr := x.S.MR(0)
			data := pattern(4096, 21)
			pkt := func(i int) (bth.Fields, []byte) {
				ops := []bth.Opcode{bth.RCWriteFirst, bth.RCWriteMiddle, bth.RCWriteMiddle, bth.RCWriteLast}
				f := bth.Fields{BTH: bth.BTHFields{Opcode: ops[i], PSN: bth.PSNAdd(n, i), AckReq: i == 3}}
				if i == 0 {
					f.VA, f.RKey, f.DMALen = mr.Addr, mr.RKey, 4096
				}
				return f, data[i*1024 : (i+1)*1024]
			}
			for _, i := range []int{0, 2, 3} {
				x.Send(pkt(i))
			}
			got := x.C.Collect(quietWait, nil)
			x.Observe("FIRST, (MIDDLE withheld), MIDDLE, LAST -> %s", DescribeAll(got))
			x.Check(len(got) == 1 && isNAK(got[0], bth.SyndromePSNSeqError, bth.PSNAdd(n, 1)),
				"want exactly one NAK 0x60 at the missing PSN 0x%06x", bth.PSNAdd(n, 1))
			x.Never("a second NAK", anyNAK)
			for i := 1; i < 4; i++ {
				x.Send(pkt(i))
			}
			got = x.C.Collect(answerWait, func(q *Pkt) bool { return isACK(q, bth.PSNAdd(n, 3)) })
			x.Observe("resent from the gap -> %s", DescribeAll(got))
			x.Check(len(got) > 0 && isACK(got[len(got)-1], bth.PSNAdd(n, 3)), "no ACK for the last PSN 0x%06x", bth.PSNAdd(n, 3))
			x.Check(!hasNAK(got), "NAKed again after the resend")
			x.Check(bytes.Equal(x.mem(0, 0, 4096), data), "memory differs from the WRITE's data")
		},
	},
	{
		ID: "duplicate-partial-read",
		Spec: "After a 4-packet READ (PMTU 1024), a duplicate READ at PSN+1 for the last 3072 bytes (a subset) is " +
			"re-executed from that PSN: 3 responses at PSN+1..PSN+3 carrying bytes 1024..4095; a new request at PSN+4 " +
			"is then accepted (IBTA §9.7.5.2.1). Whether the replay starts with READ_RESPONSE_FIRST or MIDDLE is noted",
		Run: func(x *X) {
			n := randPSN()
			x.Open(QPSpec{RecvPSN: n, MTU: 1024})
			mr := x.S.MR(0)
			data := pattern(4096, 51)
			x.setMem(0, 0, data)
			x.Send(readReq(n, mr.Addr, mr.RKey, 4096), nil)
			got := x.C.Expect(answerWait, 4)
			x.Observe("READ 4096 -> %d responses", len(got))
			x.Check(len(got) == 4, "want 4 responses to the original READ, got %d", len(got))
			x.Send(readReq(bth.PSNAdd(n, 1), mr.Addr+1024, mr.RKey, 3072), nil)
			got = x.C.Expect(answerWait, 3)
			x.Observe("duplicate READ at PSN+1 for bytes 1024.. -> %s", DescribeAll(got))
			var all []byte
			if x.Check(len(got) == 3, "want 3 responses to the duplicate, got %d", len(got)) {
				for i, q := range got {
					x.Check(q.PSN() == bth.PSNAdd(n, i+1) && q.P.Info.Op == bth.OpReadResponse,
						"response %d is %s, want a READ response at 0x%06x", i, Describe(q), bth.PSNAdd(n, i+1))
					all = append(all, q.P.Payload...)
				}
				x.Check(bytes.Equal(all, data[1024:]), "replayed data differs from bytes 1024..4095")
				x.Notef("the replay starts with %s", got[0].Opcode())
			}
			x.Send(writeOnly(bth.PSNAdd(n, 4), mr.Addr+8192, mr.RKey, 8), pattern(8, 1))
			got = x.C.Expect(answerWait, 1)
			x.Observe("request at PSN+4 -> %s", DescribeAll(got))
			x.Check(isACK(first(got), bth.PSNAdd(n, 4)), "the request at PSN+4 was not accepted")
		},
	},
	{
		ID:   "remote-access-read-bad-rkey",
		Spec: "An RDMA READ with an unknown R_Key: NAK remote access error (0x62) with the request's PSN and no READ response data, QP to error (IBTA §9.7.5 class C)",
		Run: func(x *X) {
			n := randPSN()
			x.Open(QPSpec{RecvPSN: n})
			mr := x.S.MR(0)
			fatalNAK(x, bth.SyndromeRemoteAccessError, readReq(n, mr.Addr, mr.RKey^0x00330000, 64), nil, 0)
		},
	},
	{
		ID:   "write-length-mismatch",
		Spec: "An RDMA WRITE ONLY whose payload (8 bytes) is shorter than its RETH DMA length (16): NAK invalid request (0x61), QP to error (IBTA C9-92 length checks, class C)",
		Run: func(x *X) {
			n := randPSN()
			x.Open(QPSpec{RecvPSN: n})
			mr := x.S.MR(0)
			fatalNAK(x, bth.SyndromeInvalidRequest, writeOnly(n, mr.Addr, mr.RKey, 16), pattern(8, 1), 0)
		},
	},
	{
		ID:   "atomic-misaligned",
		Spec: "A FETCH_ADD at an address that is not 8-byte aligned: NAK invalid request (0x61), memory unchanged, QP to error (IBTA §9.4.5 atomic operations, class C)",
		Run: func(x *X) {
			n := randPSN()
			x.Open(QPSpec{RecvPSN: n})
			mr := x.S.MR(0)
			f := bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCFetchAdd, PSN: n, AckReq: true}, VA: mr.Addr + 68, RKey: mr.RKey, SwapAdd: 1}
			fatalNAK(x, bth.SyndromeInvalidRequest, f, nil, 64)
		},
	},
	{
		ID: "atomic-compare-swap",
		Spec: "COMPARE_SWAP returns the original value in the ATOMIC ACKNOWLEDGE and swaps only when it equals " +
			"Compare: (compare 8, swap 9) on 7 leaves 7; (compare 7, swap 9) makes it 9 (IBTA §9.4.5)",
		Run: func(x *X) {
			n := randPSN()
			x.Open(QPSpec{RecvPSN: n})
			mr := x.S.MR(0)
			x.setMem(0, 128, le64(7))
			for i, c := range []struct{ cmp, swap, want uint64 }{{8, 9, 7}, {7, 9, 9}} {
				psn := bth.PSNAdd(n, i)
				x.Send(bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCCompareSwap, PSN: psn, AckReq: true}, VA: mr.Addr + 128, RKey: mr.RKey,
					SwapAdd: c.swap, Compare: c.cmp}, nil)
				got := x.C.Expect(answerWait, 1)
				v := binary.LittleEndian.Uint64(x.mem(0, 128, 8))
				x.Observe("CAS(cmp %d, swap %d) -> %s, memory %d", c.cmp, c.swap, DescribeAll(got), v)
				q := first(got)
				x.Check(q != nil && q.Opcode() == bth.RCAtomicAck && q.PSN() == psn && q.P.AtomicAckETH.Orig() == 7,
					"want ATOMIC_ACKNOWLEDGE at 0x%06x with original 7", psn)
				x.Check(v == c.want, "memory is %d, want %d", v, c.want)
			}
		},
	},
	{
		ID: "qp-without-remote-write",
		Spec: "An RDMA WRITE to a QP whose access flags do not enable remote write (the MR does): NAK invalid " +
			"request (0x61), QP to error (IBTA §9.7.5: the operation is not enabled on the QP, class C)",
		Run: func(x *X) {
			n := randPSN()
			x.Open(QPSpec{RecvPSN: n, Access: AccessLocalWrite | AccessRemoteRead})
			mr := x.S.MR(0)
			fatalNAK(x, bth.SyndromeInvalidRequest, writeOnly(n, mr.Addr, mr.RKey, 8), pattern(8, 1), 0)
		},
	},
	{
		ID: "reserved-opcode",
		Spec: "A request with the reserved RC opcode 0x1F is never ACKed or executed; IBTA classes an unsupported " +
			"or reserved opcode as an invalid request (NAK 0x61, class C) (§9.7.5); some stacks drop it at header check",
		Run: func(x *X) {
			n := randPSN()
			x.Open(QPSpec{RecvPSN: n})
			b := make([]byte, bth.BTHLen+8+bth.ICRCLen)
			bth.BTH(b).Encode(&bth.BTHFields{Opcode: 0x1f, PKey: 0xffff, DestQP: x.C.QPN, PSN: n, AckReq: true})
			if _, err := x.C.SendBytes(b, false); err != nil {
				x.Fatalf("peer send: %v", err)
			}
			got := x.C.Collect(quietWait, nil)
			x.Observe("opcode 0x1F -> %s", DescribeAll(got))
			for _, q := range got {
				x.Check(!(q.Opcode() == bth.RCAck && q.Syndrome().IsACK()), "the reserved opcode was ACKed")
			}
			switch {
			case len(got) == 0:
				x.Notef("dropped silently (header check), not NAKed")
				mr := x.S.MR(0)
				x.Send(writeOnly(n, mr.Addr, mr.RKey, 8), pattern(8, 1))
				after := x.C.Expect(answerWait, 1)
				x.Notef("a valid request at the same PSN afterwards -> %s", DescribeAll(after))
			case isNAK(got[0], bth.SyndromeInvalidRequest, n):
				x.Notef("NAKed invalid request")
			default:
				x.Failf("answered %s, want NAK 0x61 or silence", DescribeAll(got))
			}
		},
	},
	{
		ID: "header-validation-drops",
		Spec: "A request with a P_Key outside the QP's partition (0x1234), and one with TVer 1, are dropped " +
			"silently (no ACK or NAK, not executed); the same request then sent correctly is accepted at the same " +
			"PSN (IBTA §9.6 packet header validation, §10.9 partitions)",
		Run: func(x *X) {
			n := randPSN()
			x.Open(QPSpec{RecvPSN: n})
			mr := x.S.MR(0)
			f := writeOnly(n, mr.Addr, mr.RKey, 16)
			data := pattern(16, 31)
			bad := f
			bad.BTH.PKey = 0x1234
			x.Send(bad, data)
			got := x.C.Collect(quietWait, nil)
			x.Observe("P_Key 0x1234 -> %s", DescribeAll(got))
			x.Check(len(got) == 0, "the request with a foreign P_Key was answered")
			bad = f
			bad.BTH.TVer = 1
			x.Send(bad, data)
			got = x.C.Collect(quietWait, nil)
			x.Observe("TVer 1 -> %s", DescribeAll(got))
			x.Check(len(got) == 0, "the request with TVer 1 was answered")
			x.Check(bytes.Equal(x.mem(0, 0, 16), make([]byte, 16)), "a dropped request was executed")
			x.Send(f, data)
			got = x.C.Expect(answerWait, 1)
			x.Observe("valid -> %s", DescribeAll(got))
			x.Check(isACK(first(got), n), "the valid request was not ACKed at PSN 0x%06x", n)
			x.Never("a second answer at the PSN (an answer to a dropped request)", answerAt(n))
		},
	},
}

// More requester cases: the target posts, the peer plays a scripted
// responder.
var moreRequester = []*Case{
	{
		ID: "requester-rnr-retry",
		Spec: "A SEND answered with an RNR NAK (timer code 20 = 10.24 ms) is resent with the same PSN no sooner " +
			"than the RNR timer; ACKed, it completes successfully (IBTA §9.7.5.2.8, table 45)",
		Run: func(x *X) {
			s := randPSN()
			x.Open(QPSpec{SendPSN: s, RNRRetry: 3})
			x.setMem(0, 0, pattern(16, 41))
			x.Must(x.S.PostSend(x.Ctx, SendReq{WRID: 31, Op: SendSend, Len: 16}), "post SEND")
			got := x.C.Expect(answerWait, 1)
			q1 := first(got)
			if !x.Check(q1 != nil && q1.Opcode() == bth.RCSendOnly && q1.PSN() == s, "want SEND_ONLY at 0x%06x, got %s", s, DescribeAll(got)) {
				return
			}
			x.Send(bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCAck, PSN: s}, Syndrome: bth.RNRNAK(20)}, nil)
			got = x.C.Expect(answerWait, 1)
			q2 := first(got)
			if !x.Check(q2 != nil, "no retry after the RNR NAK") {
				return
			}
			gap := q2.Time.Sub(q1.Time)
			x.Observe("RNR NAK 0x34 -> %s after %.1f ms", Describe(q2), float64(gap.Microseconds())/1000)
			x.Check(q2.Opcode() == bth.RCSendOnly && q2.PSN() == s, "the retry is not the SEND at 0x%06x", s)
			x.Check(gap >= bth.RNRTimer(20)*9/10, "resent after %v, before the RNR timer %v", gap, bth.RNRTimer(20))
			if gap > 2*bth.RNRTimer(20)+5*time.Millisecond {
				// Not a spec violation (the timer is a minimum), but a
				// requester that waits much longer loses throughput.
				x.Notef("resent %.1f ms after the first send: far beyond the 10.24 ms RNR timer (the retry waited for another timer)", float64(gap.Microseconds())/1000)
			}
			x.Send(ackFields(s, 1), nil)
			wc, err := x.S.Poll(x.Ctx, answerWait)
			x.Must(err, "poll")
			x.Observe("ACKed -> completion status %v", statusOf(wc))
			x.Check(wc != nil && wc.WRID == 31 && wc.Status == 0, "completion %+v, want wr 31 success", wc)
		},
	},
	{
		ID: "requester-retry-exhausted",
		Spec: "With retry_cnt 1 and no ACK ever: the WRITE goes out exactly twice (once plus one retry) and " +
			"completes with RETRY_EXC_ERR (12); the QP moves to error (IBTA §9.7.6.1.3, §10.8.3)",
		Run: func(x *X) {
			s := randPSN()
			x.Open(QPSpec{SendPSN: s, Timeout: 14, Retry: 1})
			x.Must(x.S.PostSend(x.Ctx, SendReq{WRID: 32, Op: SendWrite, Len: 32, RemoteAddr: 0x30000, RKey: 0x99}), "post WRITE")
			got := x.C.Collect(600*time.Millisecond, nil)
			wc, err := x.S.Poll(x.Ctx, answerWait)
			x.Must(err, "poll")
			x.Observe("no ACKs -> %s; completion status %v", DescribeAll(got), statusOf(wc))
			x.Check(len(got) == 2, "%d transmissions, want 2", len(got))
			x.Never("a transmission after the retries ran out", func(q *Pkt) bool { return q.ParseErr == nil && q.Opcode() != bth.RCAck })
			for _, q := range got {
				x.Check(q.Opcode() == bth.RCWriteOnly && q.PSN() == s, "transmission %s is not the WRITE at 0x%06x", Describe(q), s)
			}
			x.Check(wc != nil && wc.WRID == 32 && wc.Status == 12, "completion %+v, want wr 32 RETRY_EXC_ERR (12)", wc)
			x.noteState("retry exhaustion")
		},
	},
	{
		ID: "requester-rnr-retry-exhausted",
		Spec: "With rnr_retry 1 and an RNR NAK for every try: the SEND goes out exactly twice and completes with " +
			"RNR_RETRY_EXC_ERR (13); the QP moves to error (IBTA §9.7.5.2.8, §10.8.3)",
		Run: func(x *X) {
			s := randPSN()
			x.Open(QPSpec{SendPSN: s, RNRRetry: 1})
			x.Must(x.S.PostSend(x.Ctx, SendReq{WRID: 33, Op: SendSend, Len: 8}), "post SEND")
			var got []*Pkt
			for i := 0; i < 3; i++ {
				ps := x.C.Expect(300*time.Millisecond, 1)
				if len(ps) == 0 {
					break
				}
				got = append(got, ps...)
				x.Send(bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCAck, PSN: ps[0].PSN()}, Syndrome: bth.RNRNAK(14)}, nil)
			}
			wc, err := x.S.Poll(x.Ctx, answerWait)
			x.Must(err, "poll")
			x.Observe("RNR NAK to every try -> %s; completion status %v", DescribeAll(got), statusOf(wc))
			x.Check(len(got) == 2, "%d transmissions, want 2", len(got))
			x.Never("a transmission after the RNR retries ran out", func(q *Pkt) bool { return q.ParseErr == nil && q.Opcode() != bth.RCAck })
			x.Check(wc != nil && wc.WRID == 33 && wc.Status == 13, "completion %+v, want wr 33 RNR_RETRY_EXC_ERR (13)", wc)
			x.noteState("RNR retry exhaustion")
		},
	},
	{
		ID: "requester-implied-nak",
		Spec: "A 1-byte RDMA READ answered by a READ_RESPONSE_ONLY one PSN ahead of the request is an implied " +
			"NAK: the data is not placed, nothing completes, the READ is re-issued at its own PSN; answered " +
			"correctly, it completes with the right byte (IBTA §9.7.6 implied NAK)",
		Run: func(x *X) {
			s := randPSN()
			x.Open(QPSpec{SendPSN: s, Timeout: 14, Retry: 3})
			x.Must(x.S.PostSend(x.Ctx, SendReq{WRID: 34, Op: SendRead, Len: 1, Off: 256, RemoteAddr: 0x40000, RKey: 0x77}), "post READ")
			got := x.C.Expect(answerWait, 1)
			q1 := first(got)
			if !x.Check(q1 != nil && q1.Opcode() == bth.RCReadRequest && q1.PSN() == s, "want READ request at 0x%06x, got %s", s, DescribeAll(got)) {
				return
			}
			resp := func(psn uint32, b byte) bth.Fields {
				return bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCReadResponseOnly, PSN: psn}, Syndrome: bth.SyndromeACKUnlimited, MSN: 1}
			}
			x.Send(resp(bth.PSNAdd(s, 1), 0xee), []byte{0xee})
			got = x.C.Expect(answerWait, 1)
			q2 := first(got)
			x.Observe("response at PSN+1 -> %s", DescribeAll(got))
			wc, err := x.S.Poll(x.Ctx, 10*time.Millisecond)
			x.Must(err, "poll")
			x.Check(wc == nil, "a completion came before the correct response: %+v", wc)
			if x.Check(q2 != nil && q2.Opcode() == bth.RCReadRequest && q2.PSN() == s, "the READ was not re-issued at 0x%06x", s) {
				x.Notef("re-issued %.1f ms after the request", float64(q2.Time.Sub(q1.Time).Microseconds())/1000)
			}
			x.Send(resp(s, 0xab), []byte{0xab})
			wc, err = x.S.Poll(x.Ctx, answerWait)
			x.Must(err, "poll")
			v := x.mem(0, 256, 1)
			x.Observe("correct response -> completion status %v, byte 0x%02x", statusOf(wc), v[0])
			x.Check(wc != nil && wc.WRID == 34 && wc.Status == 0, "completion %+v, want wr 34 success", wc)
			x.Check(v[0] == 0xab, "placed byte 0x%02x, want 0xab", v[0])
		},
	},
}
