package inspect

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/bth/mad"
)

// cmFrame builds a UD SEND_ONLY to QP1 carrying m.
func cmFrame(t *testing.T, src, dst netip.Addr, qkey uint32, destQP uint32, m []byte) Record {
	t.Helper()
	s := &FrameSpec{Src: src, Dst: dst, Payload: m,
		Fields: bth.Fields{BTH: bth.BTHFields{Opcode: bth.UDSendOnly, PKey: 0xffff, DestQP: destQP, PSN: 7}, QKey: qkey, SrcQP: 1}}
	f := mustFrame(t, s)
	r := Decode(f, gopacket.CaptureInfo{Timestamp: time.Unix(0, 0), CaptureLength: len(f), Length: len(f)})
	r.Frame = 1
	return r
}

func testREQ() mad.MAD {
	m := mad.MAD(make([]byte, mad.Len)).Init(mad.AttrREQ, 0x100000042)
	r := m.REQ()
	r.SetLocalCommID(0x42)
	r.SetServiceID(mad.RDMACMServiceID(mad.PortSpaceTCP, 7174))
	r.SetLocalQPN(0x11)
	r.SetStartingPSN(0xabcdef)
	r.SetResponderResources(4)
	r.SetInitiatorDepth(2)
	r.SetPathMTU(3)
	r.SetRetryCount(7)
	r.SetRNRRetryCount(6)
	r.SetRemoteCMResponseTimeout(20)
	r.SetMaxCMRetries(15)
	r.Primary().SetLocalGID(v4a)
	r.Primary().SetRemoteGID(v4b)
	r.CMAHeader().Encode(netip.AddrPortFrom(v4a, 40000), v4b)
	copy(r.PrivateData()[mad.CMAHeaderLen:], "hi") // the consumer's private data after the cma_hdr
	return m
}

func TestCMDecodeREQ(t *testing.T) {
	r := cmFrame(t, v4a, v4b, mad.QP1QKey, 1, testREQ())
	c := r.CM
	if c == nil {
		t.Fatalf("no CM decoded: %s", Line(&r))
	}
	if c.Message != "REQ" || c.Error != "" || *c.LocalCommID != 0x42 || c.RemoteCommID != nil || c.TID != 0x100000042 ||
		*c.ServiceID != 0x1061c06 || c.PortSpace != "RDMA_PS_TCP" || *c.Port != 7174 || *c.QPN != 0x11 ||
		*c.StartingPSN != 0xabcdef || *c.ResponderResources != 4 || *c.InitiatorDepth != 2 || *c.PathMTU != 1024 ||
		*c.RNRRetry != 6 || *c.RetryCount != 7 || c.Transport != "RC" || c.CMA == nil || c.CMA.SrcPort != 40000 ||
		c.CMA.Src != v4a || c.CMA.Dst != v4b || c.PrivateDataLen != 56 || c.PrivateDataUsed != 2 ||
		c.LocalGID != "::ffff:192.0.2.1" {
		t.Errorf("decoded %+v", c)
	}
	line := Line(&r)
	for _, want := range []string{"CM REQ lcid 0x00000042 tid 0x100000042 svc RDMA_PS_TCP:7174 qpn 0x000011 spsn 0xabcdef rr 4 id 2 RC mtu 1024 retry 7 rnr 6",
		"cma 192.0.2.1:40000 > 192.0.2.2 pdata 2/56 len 256 icrc ok"} {
		if !strings.Contains(line, want) {
			t.Errorf("line %q lacks %q", line, want)
		}
	}
	if l := c.Label(); l != "REQ svc 0x106:7174 qpn 0x11 psn 0xabcdef" {
		t.Errorf("label %q", l)
	}
	// -v: the fields sit at their frame offsets (MAD at 14+20+8+20 = 62).
	const o = 62
	want := map[string]Field{
		"MAD.attr_id":              {Start: o + 16, End: o + 18, Value: "0x0010 REQ"},
		"MAD.tid":                  {Start: o + 8, End: o + 16, Value: "0x0000000100000042"},
		"CM.REQ.local_comm_id":     {Start: o + 24, End: o + 28, Value: "0x00000042"},
		"CM.REQ.service_id":        {Start: o + 32, End: o + 40, Value: "0x0000000001061c06 (RDMA_PS_TCP:7174)"},
		"CM.REQ.local_qpn":         {Start: o + 56, End: o + 59, Value: "0x000011"},
		"CM.REQ.starting_psn":      {Start: o + 68, End: o + 71, Value: "0xabcdef"},
		"CM.REQ.path_mtu":          {Start: o + 74, End: o + 75, Mask: 0xf0, Value: "3 (1024 bytes)"},
		"CM.REQ.rnr_retry_count":   {Start: o + 74, End: o + 75, Mask: 0x07, Value: "6"},
		"CM.REQ.primary.local_gid": {Start: o + 80, End: o + 96, Value: "::ffff:192.0.2.1"},
		"CMA.src_port":             {Start: o + 166, End: o + 168, Value: "40000"},
		"CMA.src_addr":             {Start: o + 180, End: o + 184, Value: "192.0.2.1"},
		"CMA.dst_addr":             {Start: o + 196, End: o + 200, Value: "192.0.2.2"},
		"CM.REQ.private_data":      {Start: o + 200, End: o + 256, Value: "56 bytes, 2 used"},
	}
	got := map[string]Field{}
	for _, f := range Fields(&r) {
		got[f.Name] = f
	}
	for name, w := range want {
		w.Name = name
		if g := got[name]; g != w {
			t.Errorf("field %s = %+v, want %+v", name, g, w)
		}
	}
	b, err := json.Marshal(&r)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"cm":{"message":"REQ","attr_id":16,"method":"Send","status":0,"tid":4294967362,"local_comm_id":66,`,
		`"port_space":"RDMA_PS_TCP","port":7174,"qpn":17,"starting_psn":11259375,`,
		`"cma_hdr":{"version":0,"ip_version":4,"src_port":40000,"src":"192.0.2.1","dst":"192.0.2.2"}`,
		`"private_data_len":56,"private_data_used":2`} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("JSON lacks %s:\n%s", want, b)
		}
	}
}

func TestCMDecodeMessages(t *testing.T) {
	mk := func(a mad.AttrID, fill func(m mad.MAD)) mad.MAD {
		m := mad.MAD(make([]byte, mad.Len)).Init(a, 9)
		fill(m)
		return m
	}
	cases := []struct {
		m     mad.MAD
		text  string
		label string
	}{
		{mk(mad.AttrREJ, func(m mad.MAD) {
			m.REJ().SetRemoteCommID(0x42)
			m.REJ().SetReason(mad.RejInvalidServiceID)
		}), "CM REJ lcid 0x00000000 rcid 0x00000042 tid 0x9 reason 8 (invalid service ID) rejects REQ pdata 0/148", "REJ 8 invalid service ID"},
		{mk(mad.AttrREJ, func(m mad.MAD) {
			m.REJ().SetReason(mad.RejConsumerDefined)
			m.REJ().SetMsgRejected(mad.RejectedREP)
			_ = m.REJ().SetARI([]byte{1})
			_ = m.REJ().SetPrivateData([]byte("busy"))
		}), "reason 28 (consumer defined) rejects REP ari 1 pdata 4/148", "REJ 28 consumer defined"},
		{mk(mad.AttrREP, func(m mad.MAD) {
			m.REP().SetLocalCommID(0x43)
			m.REP().SetRemoteCommID(0x42)
			m.REP().SetLocalQPN(0x12)
			m.REP().SetStartingPSN(0x1)
			m.REP().SetRNRRetryCount(7)
			m.REP().SetSRQ(true)
		}), "CM REP lcid 0x00000043 rcid 0x00000042 tid 0x9 qpn 0x000012 spsn 0x000001 rr 0 id 0 rnr 7 srq pdata 0/196", "REP qpn 0x12 psn 0x1"},
		{mk(mad.AttrDREQ, func(m mad.MAD) { m.DREQ().SetRemoteQPN(0x12) }), "CM DREQ lcid 0x00000000 rcid 0x00000000 tid 0x9 qpn 0x000012 pdata 0/220", "DREQ qpn 0x12"},
		{mk(mad.AttrMRA, func(m mad.MAD) { m.MRA().SetMsgMRAed(mad.MRAedREP); m.MRA().SetServiceTimeout(21) }), "for REP timeout 21 pdata 0/222", "MRA"},
		{mk(mad.AttrSIDRREQ, func(m mad.MAD) {
			m.SIDRREQ().SetRequestID(5)
			m.SIDRREQ().SetServiceID(mad.RDMACMServiceID(mad.PortSpaceUDP, 7174))
			m.SIDRREQ().CMAHeader().Encode(netip.MustParseAddrPort("[2001:db8::1]:9"), netip.MustParseAddr("2001:db8::2"))
		}), "CM SIDR_REQ reqid 0x00000005 tid 0x9 svc RDMA_PS_UDP:7174 cma [2001:db8::1]:9 > 2001:db8::2 pdata 0/180", "SIDR_REQ svc 0x111:7174"},
		{mk(mad.AttrSIDRREP, func(m mad.MAD) {
			m.SIDRREP().SetRequestID(5)
			m.SIDRREP().SetQPN(0x13)
			m.SIDRREP().SetQKey(mad.RDMAUDPQKey)
			m.SIDRREP().SetServiceID(mad.RDMACMServiceID(mad.PortSpaceUDP, 7174))
		}), "CM SIDR_REP reqid 0x00000005 tid 0x9 svc RDMA_PS_UDP:7174 qpn 0x000013 qkey 0x01234567 status 0 (success) pdata 0/136", "SIDR_REP qpn 0x13 success"},
		{mk(mad.AttrREQ, func(m mad.MAD) { m.SetClassVersion(1) }), "CM REQ tid 0x9 MAD REFUSED: mad: bad CM class version (REQ): class version 1", "REQ REFUSED"},
		{mk(0x0030, func(m mad.MAD) {}), "CM Attr(0x0030) tid 0x9 MAD REFUSED", "Attr(0x0030) REFUSED"},
	}
	for _, c := range cases {
		r := cmFrame(t, v4b, v4a, mad.QP1QKey, 1, c.m)
		if r.CM == nil {
			t.Errorf("%s: not decoded", c.m.AttrID())
			continue
		}
		if !strings.Contains(r.CM.Text(), c.text) {
			t.Errorf("text %q lacks %q", r.CM.Text(), c.text)
		}
		if r.CM.Label() != c.label {
			t.Errorf("label %q, want %q", r.CM.Label(), c.label)
		}
		_ = Fields(&r) // every message's field tree renders
	}
}

// TestCMNotDecoded: only QP1 traffic with the QP1 Q_Key and a CM-class
// MAD is decoded as CM.
func TestCMNotDecoded(t *testing.T) {
	req := testREQ()
	if r := cmFrame(t, v4a, v4b, 0x11111111, 1, req); r.CM != nil {
		t.Error("decoded with another Q_Key")
	}
	if r := cmFrame(t, v4a, v4b, mad.QP1QKey, 0x22, req); r.CM != nil {
		t.Error("decoded on another QP")
	}
	sa := bytes.Clone(req)
	sa[1] = 0x03 // subnet administration
	if r := cmFrame(t, v4a, v4b, mad.QP1QKey, 1, sa); r.CM != nil {
		t.Error("decoded another management class")
	}
	short := cmFrame(t, v4a, v4b, mad.QP1QKey, 1, req[:100])
	if short.CM == nil || !strings.Contains(short.CM.Error, "bad length") || short.CM.Message != "REQ" {
		t.Errorf("short MAD: %+v", short.CM)
	}
}

func TestCMSummaryCounts(t *testing.T) {
	z := NewSummarizer("x")
	r := cmFrame(t, v4a, v4b, mad.QP1QKey, 1, testREQ())
	z.Add(&r)
	z.Add(&r)
	s := z.Summary()
	if s.CM["REQ"] != 2 {
		t.Errorf("CM counts %v", s.CM)
	}
	var b bytes.Buffer
	if err := WriteSummary(&b, &s); err != nil || !strings.Contains(b.String(), "CM MADs: REQ=2") {
		t.Errorf("summary %q %v", b.String(), err)
	}
}

// TestCMTextGolden renders the project's rxe CM capture with -v and the
// summary and compares with testdata/rxe-cm.txt (SOFTROCE_UPDATE_GOLDEN=1
// rewrites it, as after re-recording the capture).
func TestCMTextGolden(t *testing.T) {
	const golden = "testdata/rxe-cm.txt"
	out, s := renderVerbose(t, cmCapture)
	matchGolden(t, golden, out)
	for _, m := range []string{"REQ", "REP", "RTU", "DREQ", "DREP", "MRA", "REJ", "SIDR_REQ", "SIDR_REP"} {
		if s.CM[m] == 0 {
			t.Errorf("no %s in the capture's summary: %v", m, s.CM)
		}
	}
}

// TestCMExchanges follows the exchanges of the project's rxe CM capture
// from REQ (SIDR_REQ) to what they came to.
func TestCMExchanges(t *testing.T) {
	recs, err := Records(cmCapture)
	if err != nil {
		t.Fatal(err)
	}
	z := NewSummarizer("")
	for i := range recs {
		z.Add(&recs[i])
	}
	s := z.Summary()
	want := []struct{ service, messages, state string }{
		{"RDMA_PS_TCP:7174", "REQ <REP RTU DREQ <DREP", "disconnected"},
		{"RDMA_PS_TCP:7178", "REQ x2 <MRA <REP REJ", "rejected: 28 (consumer defined)"},
		{"RDMA_PS_TCP:7175", "REQ <REJ", "rejected: 8 (invalid service ID)"},
		{"RDMA_PS_TCP:7176", "REQ x3 REJ", "rejected: 4 (timeout)"},
		{"RDMA_PS_TCP:7177", "REQ <REJ", "rejected: 28 (consumer defined)"},
		{"RDMA_PS_UDP:7174", "SIDR_REQ <SIDR_REP", "resolved"},
		{"RDMA_PS_UDP:7175", "SIDR_REQ <SIDR_REP", "SIDR status 1 (service ID not supported)"},
		{"RDMA_PS_UDP:7174", "SIDR_REQ <SIDR_REP", "resolved"},
	}
	if len(s.CMConns) != len(want) || s.CMUnmatched != 0 {
		t.Fatalf("%d exchanges (%d MADs unmatched), want %d", len(s.CMConns), s.CMUnmatched, len(want))
	}
	for i, w := range want {
		c := s.CMConns[i]
		if c.Service != w.service || c.messageList() != w.messages || c.State != w.state {
			t.Errorf("exchange %d: %s %q %q, want %s %q %q", i+1, c.Service, c.messageList(), c.State, w.service, w.messages, w.state)
		}
	}
	if c := s.CMConns[0]; c.PassiveID == nil || c.PassiveQPN == nil || *c.ActiveQPN != 0xabc || c.Retransmissions != 0 {
		t.Errorf("first exchange %+v", c)
	}
	if c := s.CMConns[3]; c.Retransmissions != 2 || c.Active.String() != "10.88.0.2" {
		t.Errorf("unanswered REQ: %d sent again, active %v", c.Retransmissions, c.Active)
	}
	if c := s.CMConns[7]; c.QKey == nil || *c.QKey != mad.RDMAUDPQKey || *c.PassiveQPN != 0xabd {
		t.Errorf("SIDR resolution %+v", c)
	}
}

// TestCMExchangesBounded: a flood of REQs from forged comm IDs tracks at
// most maxCMConns exchanges and counts the rest; a DREQ of no REQ seen is
// counted as unmatched.
func TestCMExchangesBounded(t *testing.T) {
	z := NewSummarizer("")
	m := testREQ()
	r := cmFrame(t, v4a, v4b, mad.QP1QKey, 1, m)
	for i := range maxCMConns + 500 {
		id := uint32(i + 1)
		r.CM.LocalCommID = &id
		z.Add(&r)
	}
	d := mad.MAD(make([]byte, mad.Len)).Init(mad.AttrDREQ, 1)
	d.DREQ().SetLocalCommID(0x77777777)
	d.DREQ().SetRemoteCommID(0x88888888)
	dr := cmFrame(t, v4a, v4b, mad.QP1QKey, 1, d)
	z.Add(&dr)
	s := z.Summary()
	if len(s.CMConns) != maxCMConns || s.CMUntracked != 500 || s.CMUnmatched != 1 {
		t.Errorf("%d tracked, %d untracked, %d unmatched", len(s.CMConns), s.CMUntracked, s.CMUnmatched)
	}
	var b bytes.Buffer
	if err := WriteSummary(&b, &s); err != nil || !strings.Contains(b.String(), "and 500 more exchanges not tracked") || !strings.Contains(b.String(), "... 950 more exchanges (listed by --json)") ||
		!strings.Contains(b.String(), "1 MAD matched no REQ or SIDR_REQ") {
		t.Errorf("summary: %v\n%s", err, b.String()[:min(b.Len(), 400)])
	}
}
