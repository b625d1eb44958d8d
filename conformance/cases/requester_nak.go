package cases

import (
	"fmt"

	"github.com/softroce/softroce/bth"
)

// docs/conformance-catalogue.md sections A.1 (RS-15, RS-17) and A.3 (GU-05,
// GU-14).

// Requester cases about NAK classes and acknowledgements that match no
// outstanding request.
var requesterNAKCases = []*Case{
	fatalNAKCompletion("requester-nak-invalid-request", bth.SyndromeInvalidRequest, 9, "REM_INV_REQ_ERR"),
	fatalNAKCompletion("requester-nak-remote-access", bth.SyndromeRemoteAccessError, 10, "REM_ACCESS_ERR"),
	fatalNAKCompletion("requester-nak-remote-op", bth.SyndromeRemoteOpError, 11, "REM_OP_ERR"),
	{
		ID: "requester-ghost-ack",
		Spec: "An ACK whose PSN is beyond every PSN the requester has sent (a ghost acknowledgement) is " +
			"discarded: the outstanding WRITE is not completed by it; the real ACK then completes it " +
			"(IBTA §9.7.6 requester: acknowledgements outside the outstanding window)",
		Known: map[string]string{"rxe": "docs/rxe-behaviour.md §3.6: rxe completes a SEND/WRITE on any response beyond " +
			"its last PSN, with no upper bound"},
		Run: func(x *X) {
			s := randPSN()
			// retry_cnt 7 (infinite on rxe, 8 tries on softroce) keeps the
			// WRITE outstanding while the peer waits.
			x.Open(QPSpec{SendPSN: s, Timeout: 14, Retry: 7})
			x.Must(x.S.PostSend(x.Ctx, SendReq{WRID: 61, Op: SendWrite, Len: 16, RemoteAddr: 0x60000, RKey: 0x66}), "post WRITE")
			got := x.C.Expect(answerWait, 1)
			if !x.Check(first(got) != nil && first(got).PSN() == s, "want the WRITE at 0x%06x, got %s", s, DescribeAll(got)) {
				return
			}
			x.Send(ackFields(bth.PSNAdd(s, 5), 1), nil)
			wc, err := x.S.Poll(x.Ctx, quietWait/2)
			x.Must(err, "poll")
			x.Observe("ACK at PSN+5 (never sent) -> completion %v", statusOf(wc))
			x.Check(wc == nil, "the ghost ACK completed the WRITE: %+v", wc)
			if wc != nil {
				return
			}
			x.Send(ackFields(s, 1), nil)
			wc, err = x.S.Poll(x.Ctx, answerWait)
			x.Must(err, "poll")
			x.Observe("real ACK -> completion %v", statusOf(wc))
			x.Check(wc != nil && wc.WRID == 61 && wc.Status == 0, "completion %+v, want wr 61 success", wc)
		},
	},
}

// fatalNAKCompletion: the target posts two WRITEs; the peer NAKs the first
// with a fatal code. The first completes with the matching status, the
// second is flushed, the QP is in error.
func fatalNAKCompletion(id string, syn bth.Syndrome, status int, name string) *Case {
	return &Case{
		ID: id,
		Spec: fmt.Sprintf("Two WRITEs posted; the first is NAKed 0x%02x: it completes with %s (%d), the second "+
			"with WR_FLUSH_ERR (5), and the QP moves to error (IBTA §9.7.6 NAK handling, §10.8.3 completion "+
			"statuses, §10.3 error state flushes)", uint8(syn), name, status),
		Run: func(x *X) {
			s := randPSN()
			x.Open(QPSpec{SendPSN: s, Timeout: 14, Retry: 3})
			for i := 0; i < 2; i++ {
				x.Must(x.S.PostSend(x.Ctx, SendReq{WRID: uint64(71 + i), Op: SendWrite, Off: 64 * i, Len: 16, RemoteAddr: 0x70000, RKey: 0x77}), "post WRITE")
			}
			got := x.C.Expect(answerWait, 2)
			if !x.Check(len(got) >= 1 && got[0].PSN() == s, "want the first WRITE at 0x%06x, got %s", s, DescribeAll(got)) {
				return
			}
			x.Send(bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCAck, PSN: s}, Syndrome: syn}, nil)
			var wcs []*Completion
			for i := 0; i < 2; i++ {
				wc, err := x.S.Poll(x.Ctx, answerWait)
				x.Must(err, "poll")
				if wc == nil {
					break
				}
				wcs = append(wcs, wc)
			}
			var obs []string
			for _, wc := range wcs {
				obs = append(obs, fmt.Sprintf("wr %d status %s", wc.WRID, wcStatusName(wc.Status)))
			}
			x.Observe("NAK 0x%02x -> completions: %v", uint8(syn), obs)
			x.Check(len(wcs) == 2, "%d completions, want 2", len(wcs))
			if len(wcs) > 0 {
				x.Check(wcs[0].WRID == 71 && wcs[0].Status == status, "first completion %v, want wr 71 %s", wcs[0], wcStatusName(status))
			}
			if len(wcs) > 1 {
				x.Check(wcs[1].WRID == 72 && wcs[1].Status == 5, "second completion %+v, want wr 72 WR_FLUSH_ERR (5)", wcs[1])
			}
			if st := x.noteState("the NAK"); st != "" {
				x.Check(st == "ERR", "QP state %s after a fatal NAK, want ERR", st)
			}
		},
	}
}
