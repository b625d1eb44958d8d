package inspect

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/icrc"
)

// TestSummaryCongestion: CE marks (IP ECN 11, IPv4 and IPv6) are counted
// on the flow that carried them and the CNPs that answer them on the
// reverse flow of the same connection, which the text summary shows.
func TestSummaryCongestion(t *testing.T) {
	for _, kind := range []icrc.Kind{icrc.KindRoCEv2IPv4, icrc.KindRoCEv2IPv6} {
		a, b := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
		if kind == icrc.KindRoCEv2IPv6 {
			a, b = netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2")
		}
		const qpA, qpB = 0x11, 0x22
		var recs []Record
		add := func(src, dst netip.Addr, tos uint8, f bth.Fields, payload []byte) {
			t.Helper()
			f.BTH.PKey = 0xffff
			frame, err := BuildFrame(&FrameSpec{Kind: kind, Src: src, Dst: dst, TOS: tos, Fields: f, Payload: payload})
			if err != nil {
				t.Fatal(err)
			}
			recs = append(recs, Decode(frame, gopacket.CaptureInfo{Timestamp: time.Unix(0, 0), CaptureLength: len(frame), Length: len(frame)}))
		}
		for psn, tos := range []uint8{0x02, 0x03, 0x03, 0x02} {
			add(a, b, tos, bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCSendOnly, DestQP: qpB, PSN: uint32(psn), AckReq: true}}, make([]byte, 64))
		}
		add(b, a, 0x00, bth.Fields{BTH: bth.BTHFields{Opcode: bth.CNP, DestQP: qpA, BECN: true}}, make([]byte, bth.CNPPayloadLen))
		add(b, a, 0x02, bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCAck, DestQP: qpA, PSN: 3}, Syndrome: bth.SyndromeACKUnlimited}, nil)
		if recs[1].ECN != 3 || recs[0].ECN != 2 || recs[1].ICRC != "ok" {
			t.Fatalf("%v: ECN %d, %d, ICRC %s: want 2, 3 and a CE-marked packet that verifies", kind, recs[0].ECN, recs[1].ECN, recs[1].ICRC)
		}
		s := summarize(t, recs)
		if len(s.Connections) != 1 || s.Connections[0].BtoA == nil {
			t.Fatalf("%v: connections %+v", kind, s.Connections)
		}
		c := s.Connections[0]
		if c.AtoB.CEMarked != 2 || c.AtoB.CNPs != 0 || c.BtoA.CNPs != 1 || c.BtoA.CEMarked != 0 || s.CEMarked != 2 || s.CNPs != 1 {
			t.Errorf("%v: A->B CE %d CNPs %d, B->A CE %d CNPs %d, total CE %d CNPs %d", kind, c.AtoB.CEMarked, c.AtoB.CNPs, c.BtoA.CEMarked, c.BtoA.CNPs, s.CEMarked, s.CNPs)
		}
		var out strings.Builder
		if err := WriteSummary(&out, &s); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out.String(), "congestion experienced (IP ECN 11): 2 packets") {
			t.Errorf("%v: summary lacks the CE marks:\n%s", kind, out.String())
		}
		if js, err := RenderJSON(nil, &recs[1]); err != nil || !strings.Contains(string(js), `"ecn":3`) {
			t.Errorf("%v: JSON of a CE-marked packet: %s, %v", kind, js, err)
		}
	}
}
