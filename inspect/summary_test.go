package inspect

import (
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket"

	"github.com/softroce/softroce/bth"
)

// demoReadLoss is `softroce demo --impair loss=10%,seed=3 --pcap`: B's
// RDMA_READ_RESPONSE_MIDDLE psn 105 was lost on the wire (FIRST 104, then
// LAST 106), and A asked again from psn 105 with a second READ.
const demoReadLoss = "testdata/demo-read-loss.pcap"

func summarize(t *testing.T, recs []Record) Summary {
	t.Helper()
	z := NewSummarizer("")
	for i := range recs {
		z.Add(&recs[i])
	}
	return z.Summary()
}

// TestSummaryLostReadResponse: a READ response lost mid-message is a gap
// in the response flow, and the READ asked again at the missing PSN is a
// retransmission of the requester, though its PSN is above every request
// PSN before it.
func TestSummaryLostReadResponse(t *testing.T) {
	recs, err := Records(demoReadLoss)
	if err != nil {
		t.Fatal(err)
	}
	s := summarize(t, recs)
	if len(s.Connections) != 1 || s.Connections[0].BtoA == nil {
		t.Fatalf("connections %+v", s.Connections)
	}
	c := s.Connections[0]
	req, resp := c.AtoB, c.BtoA
	if req.Requests == nil || resp.Responses == nil {
		t.Fatalf("A->B %+v, B->A %+v", req, resp)
	}
	if req.Retransmissions != 1 || req.PSNGaps != 0 {
		t.Errorf("requests: %d retransmissions, %d gaps; want the READ at psn 105 as the one retransmission, no gap", req.Retransmissions, req.PSNGaps)
	}
	if resp.PSNGaps != 1 || resp.MissingPSNs != 1 || resp.Retransmissions != 2 {
		t.Errorf("responses: %d gaps (%d PSNs missing), %d retransmissions; want 1 gap of 1 PSN (105) and MIDDLE 105, LAST 106 again",
			resp.PSNGaps, resp.MissingPSNs, resp.Retransmissions)
	}
}

// TestSummaryResponseGaps: the packets of a READ response message take
// consecutive PSNs; whatever follows a FIRST or MIDDLE at more than the
// next PSN skipped some, a MIDDLE or LAST with no FIRST before it lost its
// start, and ACKs that skip PSNs (coalesced) are no gap.
func TestSummaryResponseGaps(t *testing.T) {
	resp := func(op bth.Opcode, psn uint32) *FrameSpec {
		f := ack(bth.SyndromeACKUnlimited, psn, 1)
		f.Fields.BTH.Opcode = op
		if op == bth.RCReadResponseFirst || op == bth.RCReadResponseMiddle {
			f.Payload = make([]byte, 256)
		}
		return f
	}
	for _, c := range []struct {
		name                string
		specs               []*FrameSpec
		gaps, missing, retx int
		reqRetx             int
	}{
		{"whole read", []*FrameSpec{req(bth.RCReadRequest, 10, 0), resp(bth.RCReadResponseFirst, 10), resp(bth.RCReadResponseMiddle, 11), resp(bth.RCReadResponseLast, 12)}, 0, 0, 0, 0},
		{"coalesced acks", []*FrameSpec{req(bth.RCSendOnly, 10, 8), req(bth.RCSendOnly, 11, 8), req(bth.RCSendOnly, 12, 8), ack(bth.SyndromeACKUnlimited, 10, 1), ack(bth.SyndromeACKUnlimited, 12, 3)}, 0, 0, 0, 0},
		{"middle lost", []*FrameSpec{req(bth.RCReadRequest, 10, 0), resp(bth.RCReadResponseFirst, 10), resp(bth.RCReadResponseLast, 12),
			req(bth.RCReadRequest, 11, 0), resp(bth.RCReadResponseMiddle, 11), resp(bth.RCReadResponseLast, 12)}, 1, 1, 2, 1},
		{"tail lost, then an ACK", []*FrameSpec{req(bth.RCReadRequest, 10, 0), req(bth.RCSendOnly, 13, 8), resp(bth.RCReadResponseFirst, 10), ack(bth.SyndromeACKUnlimited, 13, 2)}, 1, 2, 0, 0},
		{"first lost", []*FrameSpec{req(bth.RCReadRequest, 10, 0), resp(bth.RCReadResponseMiddle, 11), resp(bth.RCReadResponseLast, 12)}, 1, 1, 0, 0},
	} {
		var recs []Record
		for i, sp := range c.specs {
			fr := mustFrame(t, sp)
			recs = append(recs, Decode(fr, gopacket.CaptureInfo{Timestamp: time.Unix(1700000000, int64(i)), Length: len(fr), CaptureLength: len(fr)}))
		}
		s := summarize(t, recs)
		var rq, rs *Flow
		for _, cn := range s.Connections {
			for _, f := range []*Flow{cn.AtoB, cn.BtoA} {
				switch {
				case f == nil:
				case f.Src == v4a:
					rq = f
				default:
					rs = f
				}
			}
		}
		if rq == nil || rs == nil {
			t.Errorf("%s: flows %+v", c.name, s.Connections)
			continue
		}
		if rs.PSNGaps != c.gaps || rs.MissingPSNs != c.missing || rs.Retransmissions != c.retx || rq.Retransmissions != c.reqRetx {
			t.Errorf("%s: responses %d gaps (%d missing), %d retransmissions; requests %d retransmissions; want %d (%d), %d; %d",
				c.name, rs.PSNGaps, rs.MissingPSNs, rs.Retransmissions, rq.Retransmissions, c.gaps, c.missing, c.retx, c.reqRetx)
		}
	}
}

// TestSummaryDatagramQPs: datagrams name their sender's QP in the DETH, so
// the CM's MADs between two hosts are one connection, QP1 to QP1 in both
// directions, and a lone UD datagram shows its sender's QP, not "qp ?";
// counts of one are singular.
func TestSummaryDatagramQPs(t *testing.T) {
	recs, err := Records(cmCapture)
	if err != nil {
		t.Fatal(err)
	}
	s := summarize(t, recs)
	if len(s.Connections) != 2 {
		t.Fatalf("%d connections, want the CM's and one UD datagram's", len(s.Connections))
	}
	cm, ud := s.Connections[0], s.Connections[1]
	if cm.QPA == nil || *cm.QPA != 1 || cm.QPB != 1 || cm.BtoA == nil || cm.AtoB.Packets+cm.BtoA.Packets != 24 {
		t.Errorf("CM connection %+v, want QP1 <-> QP1 with both directions' 24 MADs", cm)
	}
	if ud.QPA == nil || *ud.QPA != 0x16 || ud.QPB != 0xabd || ud.BtoA != nil {
		t.Errorf("UD datagram's connection %+v, want qp 0x16 -> 0xabd", ud)
	}
	var b strings.Builder
	if err := WriteSummary(&b, &s); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"connection 1 (RoCEv2): 10.88.0.1 qp 0x000001 <-> 10.88.0.2 qp 0x000001: connection management (QP1)",
		"connection 2 (RoCEv2): 10.88.0.2 qp 0x000016 <-> 10.88.0.1 qp 0x000abd",
		"qp 0x000abd: 1 packet, 170 bytes",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "qp ?") || strings.Contains(out, " 1 packets") {
		t.Errorf("summary:\n%s", out)
	}
	if Plural(1, "PSN") != "1 PSN" || Plural(0, "PSN") != "0 PSNs" || Plural(2, "frame") != "2 frames" {
		t.Error("Plural")
	}
}
