package cases

import (
	"bytes"
	"fmt"

	"github.com/softroce/softroce/bth"
)

// docs/conformance-catalogue.md has no entry for a SEND with invalidate naming
// an ordinary MR: IBTA vol. 1 §9.4.1.1 (SEND with invalidate) and §10.6
// (memory protection).

// Remote invalidation.
var invalidateCases = []*Case{
	{
		ID: "send-invalidate-ordinary-mr",
		Spec: "A SEND_ONLY_WITH_INVALIDATE whose IETH names the R_Key of an ordinary MR (ibv_reg_mr): a remote " +
			"invalidate may target only a type 2 memory window or a fast-registered region, so the MR must survive — " +
			"a WRITE then a READ through its R_Key on a fresh QP succeed, every byte checked — and nothing the peer sent " +
			"touches memory outside the receive buffer; the receive does not complete successfully. The responder " +
			"either sends no NAK (a class J error: the receive completes with REM_INV_REQ_ERR and the QP moves to " +
			"error; rxe does this and even ACKs the SEND) or NAKs invalid request (0x61) or remote access error (0x62), as some NICs do " +
			"(IBTA §9.4.1.1 SEND with invalidate, §10.6 memory protection: remote invalidation)",
		Run: runSendInvalidateOrdinaryMR,
	},
}

// runSendInvalidateOrdinaryMR: MR 0 holds the receive buffer, MR 1 is the
// ordinary region the IETH names. Both are filled with distinct data
// first, so that any byte the peer's packets touch shows.
func runSendInvalidateOrdinaryMR(x *X) {
	const recvLen, sendLen = 256, 64
	n := randPSN()
	x.Open(QPSpec{RecvPSN: n, MRs: []MRSpec{{Len: 4096, Access: AccessAll}, {Len: 16384, Access: AccessAll}}})
	mr := x.S.MR(1)
	mem0, mem1 := pattern(4096, 0xa0), pattern(mr.Len, 0xa1)
	x.setMem(0, 0, mem0)
	x.setMem(1, 0, mem1)
	x.Must(x.S.PostRecv(x.Ctx, 51, 0, recvLen), "post receive")

	f := bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCSendOnlyInv, PSN: n, AckReq: true}, InvRKey: mr.RKey}
	x.Send(f, pattern(sendLen, 0xa2))
	got := x.C.Collect(quietWait, nil)
	x.Observe("SEND_ONLY_WITH_INVALIDATE naming MR rkey 0x%08x -> %s", mr.RKey, DescribeAll(got))
	var naks []*Pkt
	for _, q := range got {
		if anyNAK(q) {
			naks = append(naks, q)
		}
	}
	switch {
	case len(naks) == 0:
		x.Notef("answer: no NAK (%s)", DescribeAll(got))
	case len(naks) == 1 && (isNAK(naks[0], bth.SyndromeInvalidRequest, n) || isNAK(naks[0], bth.SyndromeRemoteAccessError, n)):
		x.Notef("answer: NAK 0x%02x (%v)", uint8(naks[0].Syndrome()), naks[0].Syndrome())
	default:
		x.Failf("answered %s: want no NAK, or one NAK 0x61 or 0x62 at PSN 0x%06x", DescribeAll(got), n)
	}
	// The answer recorded is the whole answer: nothing more may follow.
	if len(got) == 0 {
		x.Never("a late answer to the SEND (the answer recorded was none)", answerAt(n))
	} else {
		x.Never("a second answer to the SEND", answerAt(n))
	}

	wc, err := x.S.Poll(x.Ctx, answerWait)
	x.Must(err, "poll")
	if wc == nil {
		x.Notef("receive completion: none")
	} else {
		x.Observe("receive completion %s", wcStatusName(wc.Status))
		x.Notef("receive completion: wr %d status %s", wc.WRID, wcStatusName(wc.Status))
		x.Check(wc.WRID == 51 && wc.Status != 0, "receive completion %+v: the invalidation of an ordinary MR was reported done", wc)
	}
	x.noteState("the SEND with invalidate")

	// Nothing outside the receive buffer changed; MR 1 not at all.
	b0 := x.mem(0, 0, len(mem0))
	x.Check(bytes.Equal(b0[recvLen:], mem0[recvLen:]), "MR 0 changed outside the receive buffer")
	x.Check(bytes.Equal(x.mem(1, 0, mr.Len), mem1), "the MR the IETH named changed")

	// The MR still works, through its R_Key, on a fresh QP.
	m := randPSN()
	x.OpenQP(QPSpec{RecvPSN: m, MTU: 1024})
	const wOff, wLen = 4096, 4096
	data := pattern(wLen, 0xa3)
	for i := 0; i < wLen/1024; i++ {
		op := []bth.Opcode{bth.RCWriteFirst, bth.RCWriteMiddle, bth.RCWriteMiddle, bth.RCWriteLast}[i]
		wf := bth.Fields{BTH: bth.BTHFields{Opcode: op, PSN: bth.PSNAdd(m, i), AckReq: i == 3}}
		if i == 0 {
			wf.VA, wf.RKey, wf.DMALen = mr.Addr+wOff, mr.RKey, wLen
		}
		x.Send(wf, data[i*1024:(i+1)*1024])
	}
	got = x.C.Collect(answerWait, func(q *Pkt) bool { return isACK(q, bth.PSNAdd(m, 3)) || anyNAK(q) })
	x.Observe("fresh QP: WRITE %d bytes through the rkey -> %s", wLen, DescribeAll(got))
	x.Check(len(got) > 0 && isACK(got[len(got)-1], bth.PSNAdd(m, 3)), "the WRITE through the MR's rkey on a fresh QP was not ACKed: the MR did not survive")
	want := append([]byte(nil), mem1...)
	copy(want[wOff:], data)
	x.Check(bytes.Equal(x.mem(1, 0, mr.Len), want), "after the WRITE the MR does not hold exactly its old bytes with the WRITE's in place")

	rpsn := bth.PSNAdd(m, 4)
	segs := mr.Len / 1024
	x.Send(readReq(rpsn, mr.Addr, mr.RKey, mr.Len), nil)
	got = x.C.Collect(answerWait, func(q *Pkt) bool {
		return anyNAK(q) || q.ParseErr == nil && q.PSN() == bth.PSNAdd(rpsn, segs-1) && q.P.Info.Op == bth.OpReadResponse
	})
	var read []byte
	ok := len(got) == segs
	for i, q := range got {
		ok = ok && q.ParseErr == nil && q.P.Info.Op == bth.OpReadResponse && q.PSN() == bth.PSNAdd(rpsn, i)
		if q.ParseErr == nil {
			read = append(read, q.P.Payload...)
		}
	}
	x.Observe("READ %d bytes -> %s", mr.Len, summarizeRead(got))
	if x.Check(ok, "the READ of the whole MR through its rkey on a fresh QP was not answered by %d READ responses", segs) {
		x.Check(bytes.Equal(read, want), "the READ returned other bytes than the MR holds")
	}
}

// summarizeRead describes a long READ answer briefly.
func summarizeRead(ps []*Pkt) string {
	if len(ps) <= 3 {
		return DescribeAll(ps)
	}
	return fmt.Sprintf("%s ... %s (%d packets)", Describe(ps[0]), Describe(ps[len(ps)-1]), len(ps))
}

// wcStatusName names an enum ibv_wc_status value.
func wcStatusName(st int) string {
	names := []string{"SUCCESS", "LOC_LEN_ERR", "LOC_QP_OP_ERR", "LOC_EEC_OP_ERR", "LOC_PROT_ERR", "WR_FLUSH_ERR",
		"MW_BIND_ERR", "BAD_RESP_ERR", "LOC_ACCESS_ERR", "REM_INV_REQ_ERR", "REM_ACCESS_ERR", "REM_OP_ERR",
		"RETRY_EXC_ERR", "RNR_RETRY_EXC_ERR", "LOC_RDD_VIOL_ERR", "REM_INV_RD_REQ_ERR", "REM_ABORT_ERR", "INV_EECN_ERR",
		"INV_EEC_STATE_ERR", "FATAL_ERR", "RESP_TIMEOUT_ERR", "GENERAL_ERR", "TM_ERR", "TM_RNDV_INCOMPLETE"}
	if st >= 0 && st < len(names) {
		return fmt.Sprintf("%s (%d)", names[st], st)
	}
	return fmt.Sprintf("UNKNOWN (%d)", st)
}
