package inspect

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/icrc"
)

// sharedDir holds further real captures outside the repository: the
// tests that read it are extra checks beside the known-answer captures of
// ../icrc/testdata/rxe (kat_test.go), and skip with a message starting
// "shared captures absent:" when it is missing. SOFTROCE_SHARED_CAPTURES
// names another place for it.
var sharedDir = sharedCaptureDir()

func sharedCaptureDir() string {
	if d := os.Getenv("SOFTROCE_SHARED_CAPTURES"); d != "" {
		return d
	}
	return "../../shared/captures"
}

func sharedCaptures(t *testing.T) []string {
	t.Helper()
	files, _ := filepath.Glob(sharedDir + "/hardware/*.pcap")
	if len(files) == 0 {
		t.Skipf("shared captures absent: no %s/hardware/*.pcap", sharedDir)
	}
	return append(files, sharedDir+"/vectors/hex_vectors.pcap")
}

// TestSharedCaptures: every RoCE frame of every verifying capture is ICRC
// ok, every RoCE frame of the negative one is bad, nothing is malformed.
func TestSharedCaptures(t *testing.T) {
	for _, path := range sharedCaptures(t) {
		recs, err := Records(path)
		if err != nil {
			t.Fatal(err)
		}
		bad := strings.Contains(path, "bad-icrc")
		z := NewSummarizer(path)
		for i := range recs {
			r := &recs[i]
			z.Add(r)
			if r.Frame != i+1 {
				t.Fatalf("%s: frame numbering %d at %d", path, r.Frame, i)
			}
			if !r.RoCE {
				continue
			}
			want := "ok"
			if bad {
				want = "bad"
			}
			if r.ICRC != want || r.Malformed != "" {
				t.Errorf("%s frame %d: icrc %s (%s), want %s", filepath.Base(path), r.Frame, r.ICRC, r.Malformed, want)
			}
			if len(Fields(r)) < 30 {
				t.Errorf("%s frame %d: short field tree", filepath.Base(path), r.Frame)
			}
		}
		s := z.Summary()
		if s.RoCE == 0 || s.Frames != len(recs) || s.RoCE+s.NonRoCE != s.Frames {
			t.Errorf("%s: summary %+v", path, s)
		}
		t.Logf("%s: %d frames, %d RoCE, %d connections, opcodes %v", filepath.Base(path), s.Frames, s.RoCE, len(s.Connections), s.Opcodes)
	}
}

func TestSummaryKnownCapture(t *testing.T) {
	recs, err := Records(sharedDir + "/hardware/connectx-rdmacm-read.pcap")
	if err != nil {
		t.Skipf("shared captures absent: %v", err)
	}
	z := NewSummarizer("")
	for i := range recs {
		z.Add(&recs[i])
	}
	s := z.Summary()
	if s.Frames != 16 || s.RoCE != 13 || s.NonRoCE != 3 || s.Opcodes["RC RDMA_READ_RESPONSE_ONLY"] != 1 || s.Opcodes["UD SEND_ONLY"] != 5 {
		t.Fatalf("summary %+v", s)
	}
	// The RC connection pairs 0x139 on .47 with 0x169 on .56.
	var rc *Connection
	for _, c := range s.Connections {
		if c.BtoA != nil && c.QPA != nil && (c.QPB == 0x169 || c.QPB == 0x139) {
			rc = c
		}
	}
	if rc == nil || *rc.QPA+rc.QPB != 0x139+0x169 {
		t.Fatalf("RC connection not paired: %+v", s.Connections)
	}
	if rc.AtoB.Requests.Packets+rc.BtoA.Requests.Packets != 4 || rc.AtoB.Retransmissions+rc.BtoA.Retransmissions != 0 {
		t.Errorf("flows %+v %+v", rc.AtoB, rc.BtoA)
	}
}

var (
	v4a, v4b = netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	v6a, v6b = netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("2001:db8::2")
)

func mustFrame(t *testing.T, s *FrameSpec) []byte {
	t.Helper()
	b, err := BuildFrame(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func req(op bth.Opcode, psn uint32, n int) *FrameSpec {
	return &FrameSpec{Src: v4a, Dst: v4b, Fields: bth.Fields{BTH: bth.BTHFields{Opcode: op, PKey: 0xffff, DestQP: 0x22, PSN: psn, AckReq: true},
		VA: 0x1000, RKey: 7, DMALen: uint32(n)}, Payload: make([]byte, n)}
}

func ack(s bth.Syndrome, psn, msn uint32) *FrameSpec {
	return &FrameSpec{Src: v4b, Dst: v4a, Fields: bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCAck, PKey: 0xffff, DestQP: 0x11, PSN: psn},
		Syndrome: s, MSN: msn}}
}

// TestDecodeSynthetic covers the encapsulations the shared captures lack.
func TestDecodeSynthetic(t *testing.T) {
	ci := gopacket.CaptureInfo{Timestamp: time.Unix(1700000000, 0)}
	v6 := req(bth.RCWriteOnlyImm, 9, 5)
	v6.Kind, v6.Src, v6.Dst, v6.TOS = icrc.KindRoCEv2IPv6, v6a, v6b, 0x03
	v6.Fields.Imm = 0xabcdef01
	v1 := req(bth.RCSendOnlyInv, 10, 3)
	v1.Kind, v1.Src, v1.Dst = icrc.KindRoCEv1, v6a, v6b
	v1.Fields.InvRKey = 0x4242
	vlan := req(bth.RCCompareSwap, 11, 0)
	vlan.VLANs = []uint16{100, 200}
	vlan.Fields.SwapAdd, vlan.Fields.Compare = 5, 6
	padded := req(bth.RCSendOnly, 12, 0)
	padded.MinFrame = true // 58-byte SEND_ONLY padded to 60
	ud := &FrameSpec{Src: v4a, Dst: v4b, Payload: make([]byte, 256),
		Fields: bth.Fields{BTH: bth.BTHFields{Opcode: bth.UDSendOnly, PKey: 0xffff, DestQP: 1}, QKey: 0x80010000, SrcQP: 1}}

	cases := []struct {
		name  string
		frame []byte
		check func(r *Record) bool
	}{
		{"ipv6", mustFrame(t, v6), func(r *Record) bool {
			return r.Transport == "RoCEv2" && r.Src == v6a && r.Imm != nil && *r.Imm == 0xabcdef01 && r.PayloadLen == 5 && r.PadCnt == 3
		}},
		{"rocev1", mustFrame(t, v1), func(r *Record) bool {
			return r.Transport == "RoCEv1" && r.Dst == v6b && r.IETH != nil && r.IETH.RKey == 0x4242 && r.SrcPort == 0 && r.PayloadLen == 3
		}},
		{"qinq", mustFrame(t, vlan), func(r *Record) bool {
			return len(r.VLAN) == 2 && r.VLAN[1] == 200 && r.AtomicETH != nil && r.AtomicETH.Compare == 6
		}},
		{"eth padding", mustFrame(t, padded), func(r *Record) bool {
			return r.CapLen == 60 && r.PayloadLen == 0 && r.Loc.End == 58
		}},
		{"rnr nak", mustFrame(t, ack(bth.RNRNAK(14), 12, 3)), func(r *Record) bool {
			return r.AETH != nil && r.AETH.Kind == "RNR_NAK" && *r.AETH.RNRTimerUS == 1280 && r.AETH.MSN == 3 &&
				strings.Contains(Line(r), "RNR NAK timer 14 (1.28ms) msn 3")
		}},
		{"ud", mustFrame(t, ud), func(r *Record) bool {
			return r.DETH != nil && r.DETH.QKey == 0x80010000 && r.PayloadLen == 256
		}},
	}
	for _, c := range cases {
		r := Decode(c.frame, ci)
		if !r.RoCE || r.ICRC != "ok" || r.Malformed != "" || !c.check(&r) {
			t.Errorf("%s: %+v", c.name, r)
		}
		if !strings.Contains(Line(&r), "icrc ok") {
			t.Errorf("%s: line %q", c.name, Line(&r))
		}
		// Every snap length: truncated (or not RoCE when cut before the
		// UDP port), never bad, never a panic.
		for cut := 0; cut < len(c.frame); cut++ {
			r := Decode(c.frame[:cut], ci)
			if r.RoCE && (r.ICRC == "bad" || r.Bad()) {
				t.Errorf("%s cut at %d: bad (%s)", c.name, cut, r.Malformed)
			}
			if r.RoCE && r.ICRC == "ok" && cut < len(c.frame)-4 && c.name != "eth padding" {
				t.Errorf("%s cut at %d: ok", c.name, cut)
			}
			_ = Line(&r)
			_ = Fields(&r)
		}
	}
	// A truncated WRITE still shows its RETH and full payload length.
	w := mustFrame(t, req(bth.RCWriteOnly, 1, 1000))
	r := Decode(w[:100], gopacket.CaptureInfo{Length: len(w)})
	if r.ICRC != "truncated" || r.RETH == nil || r.RETH.DMALen != 1000 || r.PayloadLen != 1000 || r.WireLen != len(w) || r.Bad() {
		t.Errorf("truncated write: %+v", r)
	}
	// A corrupted payload byte is bad; ECN marking is not.
	w = mustFrame(t, req(bth.RCWriteOnly, 1, 100))
	w[15] |= 3
	if r := Decode(w, ci); r.ICRC != "ok" {
		t.Errorf("CE-marked frame: %s", r.ICRC)
	}
	w[len(w)-10] ^= 0x40
	if r := Decode(w, ci); r.ICRC != "bad" || !r.Bad() || !strings.Contains(Line(&r), "icrc BAD") {
		t.Errorf("corrupted frame: %s", r.ICRC)
	}
}

func TestDecodeMalformedAndOther(t *testing.T) {
	ci := gopacket.CaptureInfo{}
	w := mustFrame(t, req(bth.RCSendOnly, 1, 0))
	w[42] = 0x1e // reserved opcode: ICRC still checked, record malformed
	r := Decode(w, ci)
	if !r.RoCE || r.Malformed == "" || !r.Bad() || !strings.Contains(r.OpcodeName, "RESERVED") {
		t.Errorf("reserved opcode: %+v", r)
	}
	w = mustFrame(t, req(bth.RCSendOnly, 1, 0))
	w[38], w[39] = 0xff, 0xff // UDP length beyond the IP packet
	if r := Decode(w, ci); !r.RoCE || r.Transport != "RoCE" || r.Located() || !r.Bad() || !strings.Contains(Line(&r), "RoCE MALFORMED") {
		t.Errorf("bad UDP length: %+v", r)
	}
	arp := make([]byte, 42)
	arp[12], arp[13] = 0x08, 0x06
	if r := Decode(arp, ci); r.RoCE || r.Bad() {
		t.Errorf("ARP: %+v", r)
	}
	if r := DecodeLink(layers.LinkTypeNull, w, ci); r.RoCE {
		t.Error("unknown link type decoded as RoCE")
	}
}

// TestFieldTreeOffsets pins the offsets of the -v tree on a plain frame.
func TestFieldTreeOffsets(t *testing.T) {
	w := mustFrame(t, req(bth.RCWriteOnly, 0x123456, 18))
	r := Decode(w, gopacket.CaptureInfo{})
	var lines []string
	for _, f := range Fields(&r) {
		lines = append(lines, f.String())
	}
	all := strings.Join(lines, "\n")
	for _, want := range []string{
		"[12:14] Ethernet.type = 0x0800",
		"[26:30] IPv4.src = 192.0.2.1",
		"[36:38] UDP.dst_port = 4791",
		"[42:43] BTH.opcode = 0x0a RC RDMA_WRITE_ONLY",
		"[43:44] BTH.pad_cnt = 2 (mask 0x30)",
		"[47:50] BTH.dest_qp = 0x000022",
		"[51:54] BTH.psn = 1193046 (0x123456)",
		"[54:62] RETH.va = 0x0000000000001000",
		"[66:70] RETH.dma_len = 18",
		"[70:88] payload = 18 bytes",
		"[88:90] pad = 2 bytes",
		"[90:94] ICRC = ",
	} {
		if !strings.Contains(all, want) {
			t.Errorf("missing %q in\n%s", want, all)
		}
	}
}

// writeCapture writes frames to a pcapng file with two interfaces of
// different link types (Ethernet and raw IP), the case pcap cannot hold.
func writeCapture(t *testing.T, frames [][]byte, rawIP map[int]bool) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "mixed.pcapng")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w, err := pcapgo.NewNgWriterInterface(f, pcapgo.NgInterface{Name: "eth0", LinkType: layers.LinkTypeEthernet, SnapLength: 65535}, pcapgo.DefaultNgWriterOptions)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := w.AddInterface(pcapgo.NgInterface{Name: "tun0", LinkType: layers.LinkTypeRaw, SnapLength: 65535})
	if err != nil {
		t.Fatal(err)
	}
	for i, fr := range frames {
		ci := gopacket.CaptureInfo{Timestamp: time.Unix(1700000000, int64(i)*1000), CaptureLength: len(fr), Length: len(fr)}
		if rawIP[i] {
			fr = fr[14:]
			ci.CaptureLength, ci.Length, ci.InterfaceIndex = len(fr), len(fr), raw
		}
		if err := w.WritePacket(ci, fr); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestSummaryAndJSON runs a small conversation with a gap, a go-back-N
// retransmission, NAKs, an RNR NAK, a CNP, a bad ICRC and ARP noise
// through a pcapng file and checks the summary and the JSON Lines.
func TestSummaryAndJSON(t *testing.T) {
	corrupt := mustFrame(t, req(bth.RCSendOnly, 104, 8))
	corrupt[50] ^= 1
	cnp := &FrameSpec{Src: v4b, Dst: v4a, Payload: make([]byte, 16),
		Fields: bth.Fields{BTH: bth.BTHFields{Opcode: bth.CNP, PKey: 0xffff, DestQP: 0x11, BECN: true}}}
	arp := make([]byte, 60)
	arp[12], arp[13] = 0x08, 0x06
	frames := [][]byte{
		mustFrame(t, req(bth.RCSendFirst, 100, 1024)),
		mustFrame(t, req(bth.RCSendLast, 101, 10)),
		mustFrame(t, ack(bth.SyndromeACKUnlimited, 101, 1)),
		mustFrame(t, req(bth.RCWriteOnly, 103, 8)), // 102 missing: gap
		mustFrame(t, ack(bth.SyndromePSNSeqError, 102, 1)),
		mustFrame(t, req(bth.RCWriteOnly, 102, 8)), // go-back-N: retransmission
		mustFrame(t, req(bth.RCWriteOnly, 103, 8)), // retransmission
		mustFrame(t, ack(bth.RNRNAK(3), 103, 2)),
		arp,
		mustFrame(t, ack(bth.SyndromeRemoteAccessError, 103, 2)),
		mustFrame(t, cnp),
		corrupt,
	}
	path := writeCapture(t, frames, map[int]bool{3: true, 4: true})
	recs, err := Records(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != len(frames) {
		t.Fatalf("%d records", len(recs))
	}
	if recs[3].Interface != 1 || !recs[3].RoCE || recs[3].ICRC != "ok" || recs[3].PSN != 103 {
		t.Errorf("raw-IP frame on the second interface: %+v", recs[3])
	}
	z := NewSummarizer(path)
	var out bytes.Buffer
	for i := range recs {
		z.Add(&recs[i])
		if err := WriteJSON(&out, &recs[i]); err != nil {
			t.Fatal(err)
		}
	}
	s := z.Summary()
	if err := WriteJSONSummary(&out, &s); err != nil {
		t.Fatal(err)
	}
	if s.Frames != 12 || s.NonRoCE != 1 || s.RoCE != 11 || s.ICRCBad != 1 || s.CNPs != 1 || s.RNRNAKs != 1 ||
		s.NAKs["PSN sequence error"] != 1 || s.NAKs["remote access error"] != 1 {
		t.Errorf("totals: %+v", s)
	}
	if len(s.Connections) != 1 || s.Connections[0].BtoA == nil {
		t.Fatalf("connections: %+v", s.Connections)
	}
	c := s.Connections[0]
	a, b := c.AtoB, c.BtoA
	if c.QPB != 0x22 || *c.QPA != 0x11 || a.PSNGaps != 1 || a.MissingPSNs != 1 || a.Retransmissions != 2 || a.ICRCBad != 1 ||
		a.Requests.Min != 100 || a.Requests.Max != 104 || a.Requests.First != 100 || a.Requests.Last != 104 {
		t.Errorf("A->B: %+v %+v", a, a.Requests)
	}
	if b.ACKs != 1 || b.RNRNAKs != 1 || b.CNPs != 1 || b.NAKs["PSN sequence error"] != 1 || b.ECNMarked != 1 {
		t.Errorf("B->A: %+v", b)
	}

	// JSON Lines: one object per RoCE frame, then the summary.
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 12 {
		t.Fatalf("%d JSON lines", len(lines))
	}
	for i, l := range lines[:11] {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("line %d: %v", i, err)
		}
		for _, k := range []string{"frame", "transport", "opcode", "opcode_name", "dest_qp", "psn", "icrc"} {
			if _, ok := m[k]; !ok {
				t.Errorf("line %d lacks %q: %s", i, k, l)
			}
		}
	}
	var first struct {
		Frame  int    `json:"frame"`
		Opcode int    `json:"opcode"`
		ICRC   string `json:"icrc"`
		PSN    uint32 `json:"psn"`
	}
	json.Unmarshal([]byte(lines[0]), &first)
	if first.Frame != 1 || first.Opcode != 0 || first.ICRC != "ok" || first.PSN != 100 {
		t.Errorf("first line %s", lines[0])
	}
	if !strings.Contains(lines[8], `"frame":10`) || !strings.Contains(lines[8], `"kind":"NAK"`) {
		t.Errorf("frame numbers must skip non-RoCE frames, not renumber: %s", lines[8])
	}
	if !strings.Contains(lines[10], `"icrc":"bad"`) {
		t.Errorf("bad ICRC line: %s", lines[10])
	}
	var sum struct {
		Summary *Summary `json:"summary"`
	}
	if err := json.Unmarshal([]byte(lines[11]), &sum); err != nil || sum.Summary == nil || sum.Summary.Frames != 12 {
		t.Errorf("summary line %s: %v", lines[11], err)
	}
	var text bytes.Buffer
	if err := WriteSummary(&text, &s); err != nil || !strings.Contains(text.String(), "retransmissions 2") {
		t.Errorf("text summary:\n%s", text.String())
	}
}

func TestUnreadable(t *testing.T) {
	if _, err := Records(filepath.Join(t.TempDir(), "missing.pcap")); err == nil {
		t.Error("missing file: no error")
	}
	junk := filepath.Join(t.TempDir(), "junk.pcap")
	os.WriteFile(junk, []byte("this is not a capture file"), 0o644)
	if _, err := Records(junk); err == nil {
		t.Error("junk file: no error")
	}
	// A capture cut inside a packet record keeps the frames before it.
	path := writeCapture(t, [][]byte{mustFrame(t, req(bth.RCSendOnly, 1, 8)), mustFrame(t, req(bth.RCSendOnly, 2, 8))}, nil)
	data, _ := os.ReadFile(path)
	os.WriteFile(path, data[:len(data)-20], 0o644)
	n := 0
	err := Walk(path, func(*Record) error { n++; return nil })
	if err == nil || n != 1 || errors.Is(err, os.ErrNotExist) {
		t.Errorf("cut file: %d records, %v", n, err)
	}
}

// TestLinuxCooked covers captures taken with tcpdump -i any: SLL (with a
// VLAN tag left in place) and SLL2.
func TestLinuxCooked(t *testing.T) {
	s := req(bth.RCSendOnlyImm, 5, 9)
	s.VLANs = []uint16{42}
	fr := mustFrame(t, s)
	sll := append(make([]byte, 14), fr[12:]...) // protocol field = first TPID
	sll[2], sll[3], sll[5] = 0, 1, 6
	r := DecodeLink(layers.LinkTypeLinuxSLL, sll, gopacket.CaptureInfo{})
	if !r.RoCE || r.ICRC != "ok" || len(r.VLAN) != 1 || r.VLAN[0] != 42 || r.Imm == nil {
		t.Errorf("SLL: %+v", r)
	}
	tree := fmt.Sprint(Fields(&r))
	for _, want := range []string{"[14:16] VLAN.tpid = 0x8100", "[16:18] VLAN.vid = 42", "[18:20] SLL.protocol = 0x0800", "[48:49] BTH.opcode = 0x05"} {
		if !strings.Contains(tree, want) {
			t.Errorf("SLL tree lacks %q: %s", want, tree)
		}
	}
	plain := mustFrame(t, req(bth.RCSendOnly, 6, 4))
	sll2 := append(make([]byte, 20), plain[14:]...)
	sll2[0], sll2[1] = 0x08, 0x00
	if r := DecodeLink(layers.LinkTypeLinuxSLL2, sll2, gopacket.CaptureInfo{}); !r.RoCE || r.ICRC != "ok" || r.PSN != 6 {
		t.Errorf("SLL2: %+v", r)
	}
	if r := DecodeLink(layers.LinkTypeRaw, plain[14:], gopacket.CaptureInfo{}); !r.RoCE || r.ICRC != "ok" {
		t.Errorf("raw IP: %+v", r)
	}
}
