package cases

import (
	"bytes"

	"github.com/softroce/softroce/bth"
)

// docs/conformance-catalogue.md section A.3, GU-09.

// More responder access checks.
var moreAccessCases = []*Case{
	{
		ID: "write-imm-bad-rkey",
		Spec: "An RDMA WRITE ONLY WITH IMMEDIATE with an unknown R_Key while a receive is posted: NAK remote access " +
			"error (0x62) at its PSN, no data placed, the QP to error; the receive WQE does not complete successfully " +
			"(IBTA §9.7.5 class C; the responder's WQE may complete LOC_ACCESS_ERR/LOC_PROT_ERR or be flushed)",
		Run: func(x *X) {
			n := randPSN()
			x.Open(QPSpec{RecvPSN: n})
			mr := x.S.MR(0)
			mem := pattern(mr.Len, 0xe1)
			x.setMem(0, 0, mem)
			x.Must(x.S.PostRecv(x.Ctx, 95, 0, 256), "post receive")
			f := bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCWriteOnlyImm, PSN: n, AckReq: true}, VA: mr.Addr + 4096,
				RKey: mr.RKey ^ 0x3c3c00, DMALen: 64, Imm: 0x5566aabb}
			x.Send(f, pattern(64, 0xe2))
			got := x.C.Collect(quietWait, nil)
			x.Observe("WRITE_ONLY_WITH_IMM, bad rkey -> %s", DescribeAll(got))
			x.Check(len(got) == 1 && isNAK(got[0], bth.SyndromeRemoteAccessError, n), "want exactly one NAK 0x62 at PSN 0x%06x", n)
			x.Never("a second answer to the WRITE", answerAt(n))
			wc, err := x.S.Poll(x.Ctx, answerWait)
			x.Must(err, "poll")
			if wc == nil {
				x.Observe("receive completion: none")
			} else {
				x.Observe("receive completion wr %d %s", wc.WRID, wcStatusName(wc.Status))
				x.Check(wc.Status != 0, "the receive completed successfully (opcode %d, imm 0x%08x) for a WRITE that was refused", wc.Opcode, wc.Imm)
			}
			x.Check(bytes.Equal(x.mem(0, 0, mr.Len), mem), "memory changed")
			x.noteState("the NAK")
		},
	},
}
