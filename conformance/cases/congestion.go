package cases

import (
	"bytes"
	"time"

	"github.com/softroce/softroce/bth"
)

// ECN codepoints a peer sends with (RFC 3168, the IP header's low two
// bits of the traffic class).
const (
	ecnECT0 = 0b10
	ecnCE   = 0b11
)

// cnpBurst is how many CE-marked packets LU-08 sends back to back.
const cnpBurst = 16

// congestionCases are ECN and CNP (RoCEv2 annex A17.9, DCQCN's
// notification point; docs/congestion.md). On targets with congestion
// control the QP asks for it (QPSpec.CC).
var congestionCases = []*Case{
	{
		ID: "ce-marked-accepted",
		Spec: "IBTA annex A17.3.3: the IP header's ECN field is masked out of the ICRC; a packet a switch marked " +
			"Congestion Experienced is executed and acknowledged as any other, never dropped or NAKed for the mark",
		Run: func(x *X) {
			x.Open(QPSpec{})
			mr := x.S.MR(0)
			x.Must(x.S.PostRecv(x.Ctx, 7, 0, 64), "post receive")
			x.C.TClass = ecnCE
			x.Never("a NAK for a CE-marked packet", func(q *Pkt) bool { return q.Opcode() == bth.RCAck && !q.Syndrome().IsACK() })
			x.Send(sendOnly(0), []byte("congested"))
			x.Send(writeOnly(1, mr.Addr+1024, mr.RKey, 8), []byte("marked!!"))
			got := x.C.Collect(answerWait, answerAt(1))
			x.Observe("CE-marked SEND psn 0 and WRITE psn 1 -> %s", DescribeAll(got))
			x.Check(len(got) > 0 && isACK(got[len(got)-1], 1), "want an ACK of psn 1, got %s", DescribeAll(got))
			wc, err := x.S.Poll(x.Ctx, answerWait)
			x.Must(err, "poll")
			x.Check(wc != nil && wc.WRID == 7 && wc.Status == 0 && wc.ByteLen == 9, "receive completion %v, want wr 7 success 9 bytes", wc)
			mem, err := x.S.ReadMem(x.Ctx, 0, 1024, 8)
			x.Must(err, "read memory")
			x.Check(bytes.Equal(mem, []byte("marked!!")), "WRITE placed %q, want %q", mem, "marked!!")
		},
	},
	{
		ID: "cnp-on-ce-marked",
		Spec: "RoCEv2 annex A17.9 and DCQCN: the receiver answers a CE-marked packet with a CNP (opcode 0x81, BECN set, " +
			"DestQP the sender's QP, PSN 0, 16 reserved bytes) and sends at most one per QP per interval " +
			"(np_min_time_between_cnps); an unmarked packet draws none",
		Known: map[string]string{"rxe": "docs/congestion.md: rxe implements no congestion control and sends no CNPs"},
		Run: func(x *X) {
			x.Open(QPSpec{CC: true})
			mr := x.S.MR(0)
			isCNP := func(q *Pkt) bool { return q.ParseErr == nil && q.Opcode() == bth.CNP }
			cnps := func(ps []*Pkt) (n int) {
				for _, q := range ps {
					if isCNP(q) {
						n++
					}
				}
				return n
			}
			// Unmarked (ECN-capable) first: no CNP.
			x.C.TClass = ecnECT0
			x.Send(writeOnly(0, mr.Addr, mr.RKey, 8), make([]byte, 8))
			got := x.C.Collect(answerWait, answerAt(0))
			got = append(got, x.C.Collect(quietWait/5, isCNP)...)
			x.Observe("ECT(0) WRITE -> %s", DescribeAll(got))
			x.Check(cnps(got) == 0, "an unmarked packet drew a CNP")
			// One CE-marked packet: one CNP, well formed.
			x.C.TClass = ecnCE
			x.Send(writeOnly(1, mr.Addr, mr.RKey, 8), make([]byte, 8))
			acked, cnp := false, (*Pkt)(nil)
			got = x.C.Collect(answerWait, func(q *Pkt) bool {
				acked = acked || answerAt(1)(q)
				if isCNP(q) && cnp == nil {
					cnp = q
				}
				return acked && cnp != nil
			})
			x.Observe("CE WRITE -> %s", DescribeAll(got))
			if x.Check(cnp != nil, "no CNP for a CE-marked packet") {
				b := cnp.P.BTH
				x.Check(b.BECN() && b.DestQP() == x.C.PeerQPN && b.PSN() == 0 && bytes.Equal(cnp.P.Payload, make([]byte, bth.CNPPayloadLen)),
					"CNP becn %v dest qp 0x%06x psn %d payload % x: want BECN, qp 0x%06x, psn 0, 16 zero bytes",
					b.BECN(), b.DestQP(), b.PSN(), cnp.P.Payload, x.C.PeerQPN)
			}
			// A burst of CE-marked packets, well after that CNP: the
			// pacing rule allows about one CNP per interval, not one per
			// packet.
			time.Sleep(2 * time.Millisecond)
			t0 := time.Now()
			for i := 0; i < cnpBurst; i++ {
				f := writeOnly(uint32(2+i), mr.Addr, mr.RKey, 8)
				f.BTH.AckReq = i == cnpBurst-1
				x.Send(f, make([]byte, 8))
			}
			span := time.Since(t0)
			got = x.C.Collect(answerWait, answerAt(1+cnpBurst))
			got = append(got, x.C.Collect(quietWait/5, nil)...)
			n := cnps(got)
			x.Observe("%d CE WRITEs sent in %v -> %d CNPs", cnpBurst, span.Round(time.Microsecond), n)
			x.Check(n >= 1, "no CNP for a burst of CE-marked packets")
			x.Check(n < cnpBurst, "a CNP for every CE-marked packet of the burst (%d): no pacing", n)
			x.Notef("burst of %d CE-marked packets in %v drew %d CNPs", cnpBurst, span.Round(time.Microsecond), n)
		},
	},
	{
		ID: "nak-without-cnp",
		Spec: "CNPs answer CE marks only: a NAK (here PSN sequence error for an unmarked packet) is not accompanied by " +
			"a CNP (the \"CNP with NAK\" option is not implemented, as the catalogue declares)",
		Run: func(x *X) {
			x.Open(QPSpec{CC: true})
			mr := x.S.MR(0)
			x.C.TClass = ecnECT0
			x.Never("a CNP", func(q *Pkt) bool { return q.Opcode() == bth.CNP })
			x.Send(writeOnly(5, mr.Addr, mr.RKey, 8), make([]byte, 8))
			got := x.C.Collect(answerWait, func(q *Pkt) bool { return isNAK(q, bth.SyndromePSNSeqError, 0) })
			x.Observe("WRITE psn 5 while 0 is expected -> %s", DescribeAll(got))
			x.Check(len(got) > 0 && isNAK(got[len(got)-1], bth.SyndromePSNSeqError, 0), "want NAK PSN sequence error at psn 0, got %s", DescribeAll(got))
		},
	},
	{
		ID: "cnp-counters-equal-trace",
		Spec: "the target's np_ecn_marked_roce_packets counts the CE-marked packets it received and np_cnp_sent the " +
			"CNPs on the wire (ConnectX's counters)",
		Known: map[string]string{"rxe": "docs/congestion.md: rxe counts neither CE marks nor CNPs (rxe_hw_counters.c has no such counter)"},
		Run: func(x *X) {
			x.Open(QPSpec{CC: true})
			cs, ok := x.S.(CCSession)
			if !ok {
				// Said in the row too, not only among the failures.
				x.Observe("no np_ecn_marked_roce_packets or np_cnp_sent counters to read")
			}
			if !x.Check(ok, "the target reports no CNP or ECN counters") {
				return
			}
			m0, c0, err := cs.CCCounters(x.Ctx)
			x.Must(err, "read counters")
			mr := x.S.MR(0)
			marked, cnps := 0, 0
			// Marked packets 3 ms apart, each past any pacing interval,
			// and unmarked ones between them.
			for i := 0; i < 6; i++ {
				x.C.TClass = ecnECT0
				if i%2 == 1 {
					x.C.TClass = ecnCE
					marked++
				}
				x.Send(writeOnly(uint32(i), mr.Addr, mr.RKey, 8), make([]byte, 8))
				got := x.C.Collect(answerWait, answerAt(uint32(i)))
				got = append(got, x.C.Collect(3*time.Millisecond, nil)...)
				for _, q := range got {
					if q.ParseErr == nil && q.Opcode() == bth.CNP {
						cnps++
					}
				}
			}
			got := x.C.Collect(quietWait/5, nil)
			for _, q := range got {
				if q.ParseErr == nil && q.Opcode() == bth.CNP {
					cnps++
				}
			}
			m1, c1, err := cs.CCCounters(x.Ctx)
			x.Must(err, "read counters")
			x.Observe("%d CE-marked of 6 packets, %d CNPs on the wire; counters: np_ecn_marked_roce_packets +%d, np_cnp_sent +%d",
				marked, cnps, m1-m0, c1-c0)
			x.Check(m1-m0 == uint64(marked), "np_ecn_marked_roce_packets +%d, want %d", m1-m0, marked)
			x.Check(c1-c0 == uint64(cnps), "np_cnp_sent +%d, but %d CNPs came", c1-c0, cnps)
			x.Check(cnps == marked, "%d CNPs for %d CE-marked packets 3 ms apart", cnps, marked)
		},
	},
}
