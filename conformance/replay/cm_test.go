package replay

import (
	"strings"
	"testing"

	"github.com/gopacket/gopacket"

	"github.com/softroce/softroce/bth/mad"
	"github.com/softroce/softroce/inspect"
)

const rxeCM = "../../inspect/testdata/rxe-cm/rxe-cm.pcap"

// editMAD rewrites the MAD of recs' frame n in place and decodes it again.
func editMAD(t *testing.T, recs []inspect.Record, n int, edit func(mad.MAD)) {
	t.Helper()
	for i := range recs {
		r := &recs[i]
		if r.Frame != n {
			continue
		}
		data := append([]byte(nil), r.Data...)
		r.Data = data
		m := madOf(r)
		if m == nil {
			t.Fatalf("frame %d holds no MAD", n)
		}
		edit(m)
		off := r.Base + r.Loc.BTH + 20
		copy(data[off:], m)
		d := inspect.Decode(data, gopacket.CaptureInfo{Timestamp: r.Time, CaptureLength: len(data), Length: len(data)})
		d.Frame = n
		if d.CM == nil {
			t.Fatalf("frame %d: edited MAD no longer decodes as CM", n)
		}
		*r = d
		return
	}
	t.Fatalf("no frame %d", n)
}

func cmByFrame(rep *Report, side string, frame int) *CMExchange {
	for i := range rep.CMExchanges {
		if e := &rep.CMExchanges[i]; e.Frame == frame && e.Side == side {
			return e
		}
	}
	return nil
}

// TestCMRecorded: the rxe CM capture's exchanges, both sides, agree or
// differ only as allowed, and each kind of answer was judged.
func TestCMRecorded(t *testing.T) {
	recs, err := inspect.Records(rxeCM)
	if err != nil {
		t.Fatal(err)
	}
	rep := Records("rxe-cm.pcap", recs)
	if rep.CMDiffer != 0 || rep.CMReplayed < 9 || rep.CMReplayed != rep.CMAgree+rep.CMAllowed+rep.CMDiffer {
		t.Fatalf("%s: %+v", rep.CMSummary(), rep.CMExchanges)
	}
	for _, c := range []struct {
		side  string
		frame int
		soft  string
	}{{"passive", 1, "CM REP"}, {"passive", 4, "CM DREP"}, {"active", 2, "CM RTU"}, {"passive", 11, "CM REJ"}, {"passive", 17, "CM REJ"}} {
		e := cmByFrame(rep, c.side, c.frame)
		if e == nil || len(e.Softroce) != 1 || !strings.Contains(e.Softroce[0], c.soft) {
			t.Errorf("%s side frame %d: want softroce's %s, got %+v", c.side, c.frame, c.soft, e)
		}
	}
	// REJ 8 (nobody listening) is softroce's CM's own answer, not the
	// application's: the reason must match.
	if e := cmByFrame(rep, "passive", 11); e == nil || !strings.Contains(e.Softroce[0], "reason 8") {
		t.Errorf("frame 11: %+v", e)
	}
}

// TestCMRealRejectsSoftAccepts: the real passive side refuses a REQ (REJ 3,
// no resources) that softroce accepts: a failure, with both MADs decoded.
func TestCMRealRejectsSoftAccepts(t *testing.T) {
	recs, err := inspect.Records(rxeCM)
	if err != nil {
		t.Fatal(err)
	}
	editMAD(t, recs, 2, func(m mad.MAD) {
		lid, rid := m.REP().LocalCommID(), m.REP().RemoteCommID()
		clear(m.Data())
		m.SetAttrID(mad.AttrREJ)
		m.REJ().SetLocalCommID(lid)
		m.REJ().SetRemoteCommID(rid)
		m.REJ().SetReason(3)
	})
	rep := Records("synthetic.pcap", recs)
	e := cmByFrame(rep, "passive", 1)
	if e == nil || e.Verdict != Differ || rep.CMDiffer == 0 {
		t.Fatalf("want a failure: %s %+v", rep.CMSummary(), e)
	}
	if !strings.Contains(strings.Join(e.Failures, ";"), "real REJ, softroce REP") || len(e.Real) != 1 || !strings.Contains(e.Real[0], "reason 3") || len(e.Softroce) != 1 || !strings.Contains(e.Softroce[0], "CM REP") {
		t.Errorf("failure not explained with both MADs: %+v", e)
	}
	var b strings.Builder
	rep.WriteText(&b, false)
	if !strings.Contains(b.String(), "DIFFERS: message: real REJ, softroce REP") || !strings.Contains(b.String(), "CM: replayed") {
		t.Errorf("text report:\n%s", b.String())
	}
}

// TestCMRealAcceptsSoftRejects: a REQ for a UC QP the real passive side
// answered with a REP; softroce's CM refuses anything but RC (REJ 9).
func TestCMRealAcceptsSoftRejects(t *testing.T) {
	recs, err := inspect.Records(rxeCM)
	if err != nil {
		t.Fatal(err)
	}
	editMAD(t, recs, 1, func(m mad.MAD) { m.REQ().SetTransportType(1) })
	rep := Records("synthetic.pcap", recs)
	e := cmByFrame(rep, "passive", 1)
	if e == nil || e.Verdict != Differ || !strings.Contains(strings.Join(e.Failures, ";"), "real REP, softroce REJ") {
		t.Fatalf("want a failure: %+v", e)
	}
}

// TestCMMalformedREQ: a REQ softroce's CM refuses as malformed (a class
// version it does not know) while the real side answered it: softroce
// drops it unanswered, and that is a failure, not a crash.
func TestCMMalformedREQ(t *testing.T) {
	recs, err := inspect.Records(rxeCM)
	if err != nil {
		t.Fatal(err)
	}
	editMAD(t, recs, 1, func(m mad.MAD) { m.SetClassVersion(7) })
	rep := Records("synthetic.pcap", recs)
	e := cmByFrame(rep, "passive", 1)
	if e == nil || e.Verdict != Differ || len(e.Softroce) != 0 || !strings.Contains(strings.Join(e.Failures, ";"), "softroce no answer") {
		t.Fatalf("want a failure with no softroce answer: %+v", e)
	}
}
