package cases

import (
	"bytes"
	"time"

	"github.com/softroce/softroce/bth"
)

// docs/conformance-catalogue.md sections A.1 (RS-03, RS-04, RS-16, RS-22)
// and A.3 (GU-24).

// Cases on message assembly, ACK generation and response checking.
var assemblyCases = []*Case{
	{
		ID: "ack-coalescing-msn",
		Spec: "Three WRITEs, AckReq only on the last: the responder may coalesce, but the last ACK carries the " +
			"last PSN and MSN 3 (three messages completed since the QP reached RTR); nothing is NAKed " +
			"(IBTA §9.7.5 ACK generation, AETH MSN §9.3.5)",
		Run: func(x *X) {
			n := randPSN()
			x.Open(QPSpec{RecvPSN: n})
			mr := x.S.MR(0)
			for i := 0; i < 3; i++ {
				f := writeOnly(bth.PSNAdd(n, i), mr.Addr+uint64(64*i), mr.RKey, 8)
				f.BTH.AckReq = i == 2
				x.Send(f, pattern(8, byte(60+i)))
			}
			got := x.C.Collect(answerWait, func(q *Pkt) bool { return isACK(q, bth.PSNAdd(n, 2)) })
			got = append(got, x.C.Collect(quietWait/3, nil)...)
			x.Observe("3 WRITEs, AckReq on the last -> %s", DescribeAll(got))
			var last *Pkt
			for _, q := range got {
				if q.Opcode() == bth.RCAck && q.Syndrome().IsACK() {
					last = q
				}
			}
			x.Check(!hasNAK(got), "NAKed")
			x.Never("a NAK", anyNAK)
			if x.Check(last != nil && last.PSN() == bth.PSNAdd(n, 2), "no ACK for the last PSN 0x%06x", bth.PSNAdd(n, 2)) {
				x.Observe("MSN %d", last.P.AETH.MSN())
				x.Check(last.P.AETH.MSN() == 3, "the last ACK's MSN is %d, want 3", last.P.AETH.MSN())
			}
			for i := 0; i < 3; i++ {
				x.Check(bytes.Equal(x.mem(0, 64*i, 8), pattern(8, byte(60+i))), "WRITE %d not executed", i)
			}
		},
	},
	{
		ID: "send-multi-packet-with-imm",
		Spec: "A SEND of FIRST (1024 B), MIDDLE (1024 B), LAST_WITH_IMMEDIATE (500 B) fills one receive WQE: ACK " +
			"at the last PSN, one completion of 2548 bytes carrying the immediate data as sent, the bytes in order " +
			"(IBTA §9.4.1 SEND, §9.7.5)",
		Run: func(x *X) {
			n := randPSN()
			x.Open(QPSpec{RecvPSN: n, MTU: 1024})
			x.Must(x.S.PostRecv(x.Ctx, 41, 0, 4096), "post receive")
			data := pattern(2548, 71)
			x.Send(bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCSendFirst, PSN: n}}, data[:1024])
			x.Send(bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCSendMiddle, PSN: bth.PSNAdd(n, 1)}}, data[1024:2048])
			x.Send(bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCSendLastImm, PSN: bth.PSNAdd(n, 2), AckReq: true}, Imm: 0x11223344}, data[2048:])
			got := x.C.Collect(answerWait, func(q *Pkt) bool { return isACK(q, bth.PSNAdd(n, 2)) || hasNAK([]*Pkt{q}) })
			x.Observe("SEND FIRST, MIDDLE, LAST_WITH_IMM -> %s", DescribeAll(got))
			x.Check(len(got) > 0 && isACK(got[len(got)-1], bth.PSNAdd(n, 2)), "no ACK at the last PSN")
			wc, err := x.S.Poll(x.Ctx, answerWait)
			x.Must(err, "poll")
			if x.Check(wc != nil, "no receive completion") {
				x.Observe("completion: status %s, %d bytes, imm 0x%08x", wcStatusName(wc.Status), wc.ByteLen, wc.Imm)
				x.Check(wc.WRID == 41 && wc.Status == 0 && wc.ByteLen == 2548 && wc.WithImm && wc.Imm == 0x11223344,
					"completion %+v, want wr 41 success 2548 bytes imm 0x11223344", wc)
			}
			x.Check(bytes.Equal(x.mem(0, 0, 2548), data), "received bytes differ")
		},
	},
	{
		ID: "write-imm-zero-length",
		Spec: "A zero-length RDMA WRITE ONLY WITH IMMEDIATE consumes one receive WQE: ACK, and a RECV_RDMA_WITH_IMM " +
			"completion of 0 bytes carrying the immediate data (IBTA §9.4.3, C9-88)",
		Run: func(x *X) {
			n := randPSN()
			x.Open(QPSpec{RecvPSN: n})
			mr := x.S.MR(0)
			x.Must(x.S.PostRecv(x.Ctx, 42, 0, 64), "post receive")
			x.Send(bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCWriteOnlyImm, PSN: n, AckReq: true}, VA: mr.Addr, RKey: mr.RKey, Imm: 0xa1b2c3d4}, nil)
			got := x.C.Expect(answerWait, 1)
			x.Observe("WRITE_ONLY_WITH_IMM 0 bytes -> %s", DescribeAll(got))
			x.Check(isACK(first(got), n), "not ACKed")
			wc, err := x.S.Poll(x.Ctx, answerWait)
			x.Must(err, "poll")
			if x.Check(wc != nil, "no receive completion") {
				x.Observe("completion: status %s, opcode %d, %d bytes, imm 0x%08x", wcStatusName(wc.Status), wc.Opcode, wc.ByteLen, wc.Imm)
				x.Check(wc.WRID == 42 && wc.Status == 0 && wc.Opcode == 129 && wc.ByteLen == 0 && wc.WithImm && wc.Imm == 0xa1b2c3d4,
					"completion %+v, want wr 42 success RECV_RDMA_WITH_IMM (129) 0 bytes imm 0xa1b2c3d4", wc)
			}
		},
	},
	{
		ID: "invalid-request-first-while-open",
		Spec: "A WRITE ONLY arriving while a SEND (FIRST received, no LAST) is still open: NAK invalid request " +
			"(0x61) at the WRITE's PSN, QP to error (IBTA §9.7.5 opcode sequence check, class C)",
		Run: func(x *X) {
			n := randPSN()
			x.Open(QPSpec{RecvPSN: n, MTU: 1024})
			mr := x.S.MR(0)
			x.Must(x.S.PostRecv(x.Ctx, 43, 0, 4096), "post receive")
			x.Send(bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCSendFirst, PSN: n}}, pattern(1024, 3))
			fatalNAK(x, bth.SyndromeInvalidRequest, writeOnly(bth.PSNAdd(n, 1), mr.Addr+8192, mr.RKey, 8), pattern(8, 1), 8192)
		},
	},
	{
		ID: "invalid-request-short-first",
		Spec: "An RDMA WRITE FIRST carrying 512 bytes at PMTU 1024 (FIRST must carry exactly PMTU): NAK invalid " +
			"request (0x61), QP to error (IBTA C9-92 packet length checks, class C)",
		Run: func(x *X) {
			n := randPSN()
			x.Open(QPSpec{RecvPSN: n, MTU: 1024})
			mr := x.S.MR(0)
			f := bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCWriteFirst, PSN: n, AckReq: true}, VA: mr.Addr, RKey: mr.RKey, DMALen: 2048}
			fatalNAK(x, bth.SyndromeInvalidRequest, f, pattern(512, 1), 0)
		},
	},
}

var responseCases = []*Case{
	{
		ID: "requester-bad-response-sequence",
		Spec: "A 3-packet READ answered FIRST, MIDDLE, MIDDLE (MIDDLE where LAST is required at the READ's last " +
			"PSN): the READ must not complete successfully; IBTA's requester reports BAD_RESP_ERR (7) and moves " +
			"the QP to error (§9.7.6 response opcode sequence, §10.8.3)",
		Known: map[string]string{"rxe": "observed by this harness on kernel 6.1: rxe takes the READ_RESPONSE_MIDDLE at the " +
			"READ's last PSN as a middle packet and then neither completes the READ, retries it nor moves the QP to " +
			"error within 1 s: the work request hangs (docs/rxe-behaviour.md §3.6 lists only FIRST/ONLY/ACK as bad opcodes after a MIDDLE)"},
		Run: func(x *X) {
			s := randPSN()
			x.Open(QPSpec{SendPSN: s, Timeout: 14, Retry: 1, MTU: 1024})
			x.Must(x.S.PostSend(x.Ctx, SendReq{WRID: 44, Op: SendRead, Len: 3072, RemoteAddr: 0x50000, RKey: 0x55}), "post READ")
			got := x.C.Expect(answerWait, 1)
			q := first(got)
			if !x.Check(q != nil && q.Opcode() == bth.RCReadRequest && q.PSN() == s, "want a READ request at 0x%06x, got %s", s, DescribeAll(got)) {
				return
			}
			ops := []bth.Opcode{bth.RCReadResponseFirst, bth.RCReadResponseMiddle, bth.RCReadResponseMiddle}
			for i, op := range ops {
				x.Send(bth.Fields{BTH: bth.BTHFields{Opcode: op, PSN: bth.PSNAdd(s, i)}, Syndrome: bth.SyndromeACKUnlimited, MSN: 1}, pattern(1024, byte(i)))
			}
			wc, err := x.S.Poll(x.Ctx, time.Second)
			x.Must(err, "poll")
			after := x.C.Collect(quietWait, nil)
			x.Observe("FIRST, MIDDLE, MIDDLE -> completion status %v; then %s", statusOf(wc), DescribeAll(after))
			x.Check(wc == nil || wc.Status != 0, "the READ completed successfully from a broken response sequence")
			x.Check(wc != nil && wc.Status == 7, "completion %+v, want BAD_RESP_ERR (7)", wc)
			x.noteState("the bad response")
		},
	},
}
