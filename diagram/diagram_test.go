package diagram_test

import (
	"bytes"
	"context"
	"fmt"
	"image"
	"image/png"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/demo"
	"github.com/softroce/softroce/diagram"
	"github.com/softroce/softroce/inspect"
)

var (
	reqA = netip.MustParseAddr("192.0.2.1")
	rspB = netip.MustParseAddr("192.0.2.2")
)

// frame builds one decoded record.
func frame(t *testing.T, at time.Duration, src, dst netip.Addr, f bth.Fields, payload int, corrupt bool) inspect.Record {
	t.Helper()
	fr, err := inspect.BuildFrame(&inspect.FrameSpec{Src: src, Dst: dst, Fields: f, Payload: make([]byte, payload)})
	if err != nil {
		t.Fatal(err)
	}
	if corrupt {
		fr[len(fr)-1] ^= 0xff
	}
	return inspect.Decode(fr, gopacket.CaptureInfo{Timestamp: time.Unix(1000, 0).Add(at), Length: len(fr), CaptureLength: len(fr)})
}

// trouble is a conversation with one of everything the diagram must
// highlight: a PSN sequence NAK, a retransmission, an RNR NAK and a packet
// whose ICRC fails.
func trouble(t *testing.T) []inspect.Record {
	w := func(op bth.Opcode, psn uint32) bth.Fields {
		return bth.Fields{BTH: bth.BTHFields{Opcode: op, PKey: 0xffff, DestQP: 0x12, PSN: psn, AckReq: op == bth.RCWriteLast || op == bth.RCSendOnly}, VA: 0x1000, RKey: 7, DMALen: 3000}
	}
	ack := func(s bth.Syndrome, psn, msn uint32) bth.Fields {
		return bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCAck, PKey: 0xffff, DestQP: 0x34, PSN: psn}, Syndrome: s, MSN: msn}
	}
	ms := time.Millisecond
	return []inspect.Record{
		frame(t, 0, reqA, rspB, w(bth.RCWriteFirst, 10), 1024, false),
		frame(t, 1*ms, reqA, rspB, w(bth.RCWriteLast, 12), 952, false), // 11 went missing
		frame(t, 2*ms, rspB, reqA, ack(bth.SyndromePSNSeqError, 11, 0), 0, false),
		frame(t, 3*ms, reqA, rspB, w(bth.RCWriteMiddle, 11), 1024, false),
		frame(t, 4*ms, reqA, rspB, w(bth.RCWriteLast, 12), 952, false),
		frame(t, 5*ms, rspB, reqA, ack(bth.SyndromeACKUnlimited, 12, 1), 0, false),
		frame(t, 6*ms, reqA, rspB, w(bth.RCSendOnly, 13), 64, true),
		frame(t, 80*ms, reqA, rspB, w(bth.RCSendOnly, 13), 64, false),
		frame(t, 81*ms, rspB, reqA, ack(bth.RNRNAK(14), 13, 1), 0, false),
		frame(t, 90*ms, reqA, rspB, w(bth.RCSendOnly, 13), 64, false),
		frame(t, 91*ms, rspB, reqA, ack(bth.SyndromeACKUnlimited, 13, 2), 0, false),
	}
}

func TestRenderMarks(t *testing.T) {
	recs := trouble(t)
	for _, format := range []string{"html", "svg"} {
		var b bytes.Buffer
		if err := diagram.Render(&b, recs, format); err != nil {
			t.Fatal(err)
		}
		out := b.String()
		if keep := os.Getenv("DIAGRAM_KEEP"); keep != "" {
			os.WriteFile(keep+"-trouble."+format, b.Bytes(), 0o644)
		}
		count := func(class string) int {
			return len(regexp.MustCompile(`<g class="pkt `+class+`"`).FindAllStringIndex(out, -1))
		}
		// 12 resent after the NAK, 13 resent after the bad ICRC and after
		// the RNR NAK.
		if n := count("retx"); n != 3 {
			t.Errorf("%s: %d retransmissions marked, want 3", format, n)
		}
		if count("nak") != 1 || count("rnr") != 1 || count("bad") != 1 {
			t.Errorf("%s: nak %d rnr %d bad %d, want 1 each", format, count("nak"), count("rnr"), count("bad"))
		}
		if count("req")+count("resp")+count("retx")+count("nak")+count("rnr")+count("bad") != len(recs) {
			t.Errorf("%s: arrows do not add up to %d packets", format, len(recs))
		}
		for _, want := range []string{"NAK PSN sequence error psn 11", "RNR NAK psn 13", "ICRC BAD", "192.0.2.1 (requester)", "qp 0x000012", "pass"} {
			if !strings.Contains(out, want) {
				t.Errorf("%s: lacks %q", format, want)
			}
		}
		if strings.Contains(out, "http://") && format == "html" && strings.Count(out, "http://") != strings.Count(out, "http://www.w3.org/2000/svg") {
			t.Errorf("html refers to the network")
		}
		if strings.Contains(out, "src=") || strings.Contains(out, "href=\"http") {
			t.Error("page loads external resources")
		}
	}
	if err := diagram.Render(&bytes.Buffer{}, recs, "pdf"); err == nil {
		t.Error("unknown format accepted")
	}
	if err := diagram.Render(&bytes.Buffer{}, nil, "svg"); err == nil {
		t.Error("empty input accepted")
	}
}

// TestChromium renders a demo run with loss and the trouble conversation
// in headless Chromium: the page's own script must have run (it writes
// data-rendered on <body>), no script error may be logged, and the
// screenshot must not be blank.
func TestChromium(t *testing.T) {
	bin := ""
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			bin = p
			break
		}
	}
	if bin == "" {
		t.Skip("chromium not installed (Debian package chromium): skipping the browser rendering test")
	}
	var sink bytes.Buffer
	res, err := demo.Run(&sink, demo.Options{Impair: "loss=15%,seed=1"})
	if err != nil {
		t.Fatal(err)
	}
	recs := append(res.Records, trouble(t)...)
	lost := append(res.Lost, make([]bool, len(recs)-len(res.Lost))...)
	dir := t.TempDir()
	page := filepath.Join(dir, "ladder.html")
	var b bytes.Buffer
	if err := diagram.Write(&b, recs, diagram.Options{Title: "test run", Lost: lost}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(page, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	shot := filepath.Join(dir, "shot.png")
	args := func(extra ...string) []string {
		a := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
			"--disable-component-update", "--disable-sync", "--no-first-run", "--user-data-dir=" + t.TempDir(),
			"--enable-logging=stderr", "--v=0", "--window-size=1200,900"}
		return append(append(a, extra...), "file://"+page)
	}
	run := func(extra ...string) (stdout, stderr string) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, args(extra...)...)
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		if err := cmd.Run(); err != nil {
			t.Fatalf("%s: %v\n%s", bin, err, e.String())
		}
		return o.String(), e.String()
	}
	dom, logs := run("--dump-dom")
	if !regexp.MustCompile(`data-rendered="[1-9][0-9]*"`).MatchString(dom) {
		t.Errorf("the page's script did not run: no data-rendered in the DOM")
	}
	for _, bad := range []string{"Uncaught", "SyntaxError", "ReferenceError", "TypeError"} {
		if strings.Contains(logs, bad) {
			t.Errorf("script error in the browser log:\n%s", logs)
		}
	}
	if os.Getenv("DIAGRAM_KEEP") != "" {
		os.WriteFile(os.Getenv("DIAGRAM_KEEP")+".html", b.Bytes(), 0o644)
	}
	run("--screenshot=" + shot)
	f, err := os.Open(shot)
	if err != nil {
		t.Fatalf("no screenshot: %v", err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if colors := distinct(img, 16); colors < 5 {
		t.Errorf("screenshot has %d colours: blank page?", colors)
	}

	// The plain SVG renders too.
	svg := filepath.Join(dir, "ladder.svg")
	b.Reset()
	if err := diagram.Write(&b, recs, diagram.Options{Format: "svg", Lost: lost}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(svg, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	page = svg
	shot2 := filepath.Join(dir, "svg.png")
	run("--screenshot=" + shot2)
	f2, err := os.Open(shot2)
	if err != nil {
		t.Fatalf("no SVG screenshot: %v", err)
	}
	defer f2.Close()
	img2, err := png.Decode(f2)
	if err != nil {
		t.Fatalf("SVG screenshot: %v", err)
	}
	if colors := distinct(img2, 16); colors < 5 {
		t.Errorf("SVG screenshot has %d colours: blank?", colors)
	}
	if keep := os.Getenv("DIAGRAM_KEEP"); keep != "" {
		data, _ := os.ReadFile(shot2)
		os.WriteFile(keep+"-svg.png", data, 0o644)
	}
	if keep := os.Getenv("DIAGRAM_KEEP"); keep != "" {
		data, _ := os.ReadFile(shot)
		os.WriteFile(keep+".png", data, 0o644)
	}
}

// distinct counts distinct colours, stopping at limit.
func distinct(img image.Image, limit int) int {
	seen := map[[4]uint32]bool{}
	r := img.Bounds()
	for y := r.Min.Y; y < r.Max.Y; y += 3 {
		for x := r.Min.X; x < r.Max.X; x += 3 {
			c0, c1, c2, c3 := img.At(x, y).RGBA()
			seen[[4]uint32{c0, c1, c2, c3}] = true
			if len(seen) >= limit {
				return len(seen)
			}
		}
	}
	return len(seen)
}

// TestConversations interleaves two QP pairs between the same two hosts
// and traffic in the other direction: each requester QP gets its own
// ladder, and answers land in the ladder of the requests they answer.
func TestConversations(t *testing.T) {
	req := func(qp, psn uint32) bth.Fields {
		return bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCSendOnly, PKey: 0xffff, DestQP: qp, PSN: psn, AckReq: true}}
	}
	ack := func(qp, psn uint32) bth.Fields {
		return bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCAck, PKey: 0xffff, DestQP: qp, PSN: psn}, Syndrome: bth.SyndromeACKUnlimited}
	}
	ms := time.Millisecond
	recs := []inspect.Record{
		frame(t, 0, reqA, rspB, req(0xb1, 1000), 8, false),    // QP a1 -> b1
		frame(t, 1*ms, reqA, rspB, req(0xb2, 7000), 8, false), // QP a2 -> b2
		frame(t, 2*ms, rspB, reqA, ack(0xa2, 7000), 0, false), // answers a2's request
		frame(t, 3*ms, rspB, reqA, ack(0xa1, 1000), 0, false), // answers a1's
		frame(t, 4*ms, rspB, reqA, req(0xa1, 300), 8, false),  // B's QP b1 sends to a1
		frame(t, 5*ms, reqA, rspB, ack(0xb1, 300), 0, false),
		frame(t, 6*ms, reqA, rspB, req(0xb1, 1001), 8, false),
		frame(t, 7*ms, rspB, reqA, ack(0xa1, 1001), 0, false),
	}
	var b bytes.Buffer
	if err := diagram.Render(&b, recs, "svg"); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	titles := regexp.MustCompile(`conversation (\d+): (\d+) packets`).FindAllStringSubmatch(out, -1)
	got := map[string]string{}
	for _, m := range titles {
		got[m[1]] = m[2]
	}
	// 1: a1 -> b1 (two SENDs, two ACKs); 2: a2 -> b2; 3: b1 -> a1.
	if len(titles) != 3 || got["1"] != "4" || got["2"] != "2" || got["3"] != "2" {
		t.Errorf("conversations %v, want 3 with 4, 2 and 2 packets", titles)
	}
	if !strings.Contains(out, "192.0.2.2 (requester)") {
		t.Error("B's own requests are not drawn with B as requester")
	}

	// The cap: 5 packets drawn, the rest counted.
	var many []inspect.Record
	for i := 0; i < 12; i++ {
		many = append(many, frame(t, time.Duration(i)*ms, reqA, rspB, req(0xb1, uint32(i)), 8, false))
	}
	b.Reset()
	if err := diagram.Write(&b, many, diagram.Options{Format: "svg", MaxArrows: 5}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "conversation 1: 5 packets (and 7 more not drawn)") || strings.Count(b.String(), `<g class="pkt`) != 5 {
		t.Errorf("cap not applied:\n%s", b.String())
	}
}

// TestCaptures draws the real-hardware captures: every RoCE packet lands
// in some conversation, and a capture with a bad ICRC shows it.
func TestCaptures(t *testing.T) {
	const dir = "../../shared/captures/hardware"
	files, _ := filepath.Glob(filepath.Join(dir, "*.pcap"))
	if len(files) == 0 {
		t.Skip("no captures in " + dir + " (shared captures are not part of the repository)")
	}
	for _, f := range files {
		recs, err := inspect.Records(f)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		roce := 0
		for _, r := range recs {
			if r.RoCE {
				roce++
			}
		}
		var b bytes.Buffer
		err = diagram.Write(&b, recs, diagram.Options{Format: "svg", MaxArrows: 1 << 30})
		if roce == 0 {
			if err == nil {
				t.Errorf("%s: no RoCE packets but no error", f)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if n := strings.Count(b.String(), `<g class="pkt`); n != roce {
			t.Errorf("%s: %d arrows for %d RoCE packets", filepath.Base(f), n, roce)
		}
		if strings.Contains(f, "bad-icrc") && !strings.Contains(b.String(), "ICRC BAD") {
			t.Errorf("%s: bad ICRC not shown", f)
		}
		if os.Getenv("DIAGRAM_KEEP") != "" {
			os.WriteFile(os.Getenv("DIAGRAM_KEEP")+"-"+strings.TrimSuffix(filepath.Base(f), ".pcap")+".svg", b.Bytes(), 0o644)
		}
	}
}

// TestCMLadder draws the project's rxe CM capture: one connection
// management conversation holding both directions' MADs, labelled by
// message, with the guest's REQ retransmissions and the REJs marked (the
// UD datagram at its end is a conversation of its own).
func TestCMLadder(t *testing.T) {
	recs, err := inspect.Records("../inspect/testdata/rxe-cm/rxe-cm.pcap")
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := diagram.Render(&b, recs, "svg"); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if n := strings.Count(out, "connection management (QP1)"); n != 1 {
		t.Errorf("%d CM conversations, want 1", n)
	}
	mads := 0
	for _, r := range recs {
		if r.CM != nil {
			mads++
		}
	}
	if !strings.Contains(out, fmt.Sprintf("conversation 1: connection management (QP1), %d MADs", mads)) {
		t.Errorf("CM conversation title missing (%d MADs):\n%s", mads, out)
	}
	cmPart := out
	if i := strings.Index(out, "conversation 2:"); i > 0 {
		cmPart = out[:i]
	}
	labels := regexp.MustCompile(`<g class="pkt (\w+)"[^>]*>\n<title>[^<]*</title>\n<text class="time"[^>]*>[^<]*</text>\n(?:<[^>]*>\n)*?<text class="label"[^>]*>([^<]*)</text>`).FindAllStringSubmatch(cmPart, -1)
	var got []string
	for _, l := range labels {
		got = append(got, l[1]+": "+l[2])
	}
	want := []string{
		"req: REQ svc 0x106:7174 qpn 0xabc psn 0x123456",
		"resp: REP qpn 0x",
		"req: RTU",
		"req: DREQ qpn 0x11",
		"resp: DREP",
		"req: REQ svc 0x106:7178 qpn 0xabc psn 0x123456",
		"retx: REQ svc 0x106:7178 qpn 0xabc psn 0x123456", // the duplicate
		"resp: MRA",
		"resp: REP qpn 0x",
		"nak: REJ 28 consumer defined",
		"req: REQ svc 0x106:7175 qpn 0xabc psn 0x123456",
		"nak: REJ 8 invalid service ID",
		"resp: REQ svc 0x106:7176 qpn 0x",
		"retx: REQ svc 0x106:7176 qpn 0x", // and more, as many as the CM sent in the time
		"nak: REJ 4 timeout",
		"resp: REQ svc 0x106:7177 qpn 0x",
		"nak: REJ 28 consumer defined",
		"req: SIDR_REQ svc 0x111:7174",
		"resp: SIDR_REP qpn 0x",
		"req: SIDR_REQ svc 0x111:7175",
		"resp: SIDR_REP qpn 0x0 service ID not supported",
		"resp: SIDR_REQ svc 0x111:7174",
		"req: SIDR_REP qpn 0xabd success",
	}
	// Fold the further retransmissions of the unanswered REQ into the first.
	for i := 1; i < len(got); i++ {
		if strings.HasPrefix(got[i], "retx: REQ svc 0x106:7176") && got[i] == got[i-1] {
			got = append(got[:i], got[i+1:]...)
			i--
		}
	}
	if len(got) != len(want) || len(got) != mads-(len(labels)-len(got)) {
		t.Fatalf("%d labels, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("arrow %d: %q, want prefix %q", i+1, got[i], want[i])
		}
	}
}

// TestLostReadResponse draws a demo capture in which B's READ response
// MIDDLE psn 105 was lost: the arrows follow the capture's order, the READ
// asked again from psn 105 is a retransmission (though no request had that
// PSN), and so are the responses it brings again.
func TestLostReadResponse(t *testing.T) {
	recs, err := inspect.Records("../inspect/testdata/demo-read-loss.pcap")
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := diagram.Render(&b, recs, "svg"); err != nil {
		t.Fatal(err)
	}
	labels := regexp.MustCompile(`<g class="pkt (\w+)"[^>]*>\n<title>[^<]*</title>\n<text class="time"[^>]*>[^<]*</text>\n<line[^>]*/>\n<text class="label"[^>]*>([^<]*)</text>`).FindAllStringSubmatch(b.String(), -1)
	var got []string
	for _, m := range labels {
		got = append(got, m[1]+" "+m[2])
	}
	want := []string{
		"req RDMA_READ_REQUEST psn 104",
		"resp RDMA_READ_RESPONSE_FIRST psn 104",
		"resp RDMA_READ_RESPONSE_LAST psn 106",
		"retx RDMA_READ_REQUEST psn 105 (retransmit)",
		"retx RDMA_READ_RESPONSE_MIDDLE psn 105 (retransmit)",
		"retx RDMA_READ_RESPONSE_LAST psn 106 (retransmit)",
		"req COMPARE_SWAP psn 107",
	}
	if len(got) != len(recs) {
		t.Fatalf("%d arrows for %d packets:\n%s", len(got), len(recs), strings.Join(got, "\n"))
	}
	if strings.Join(got[6:13], "\n") != strings.Join(want, "\n") {
		t.Errorf("arrows 7-13:\n%s\nwant\n%s", strings.Join(got[6:13], "\n"), strings.Join(want, "\n"))
	}
}

// TestDemoTimesInOrder: a demo run's records, lost packets included, come
// in the order things happened and their times never go back, so the
// diagram's time column reads down the page (a lost packet was offered
// before the packet ahead of it reached the wire, but dropped after).
func TestDemoTimesInOrder(t *testing.T) {
	for seed := 1; seed <= 6; seed++ {
		res, err := demo.Run(io.Discard, demo.Options{Impair: fmt.Sprintf("loss=10%%,seed=%d", seed)})
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		lost := 0
		for i, r := range res.Records {
			if res.Lost[i] {
				lost++
			}
			if i > 0 && r.Time.Before(res.Records[i-1].Time) {
				t.Errorf("seed %d: packet %d (%s psn %d, lost %v) is %v before the one drawn above it",
					seed, i+1, r.OpcodeName, r.PSN, res.Lost[i], res.Records[i-1].Time.Sub(r.Time))
			}
		}
		if lost == 0 {
			t.Errorf("seed %d: nothing lost", seed)
		}
	}
}

// TestCongestionMarks: a CE-marked request is labelled [CE] and the CNP
// that answers it is drawn as one, in the same conversation as the
// request and its ACK.
func TestCongestionMarks(t *testing.T) {
	mk := func(at time.Duration, src, dst netip.Addr, tos uint8, f bth.Fields, payload int) inspect.Record {
		t.Helper()
		f.BTH.PKey = 0xffff
		fr, err := inspect.BuildFrame(&inspect.FrameSpec{Src: src, Dst: dst, TOS: tos, Fields: f, Payload: make([]byte, payload)})
		if err != nil {
			t.Fatal(err)
		}
		return inspect.Decode(fr, gopacket.CaptureInfo{Timestamp: time.Unix(1000, 0).Add(at), Length: len(fr), CaptureLength: len(fr)})
	}
	w := func(psn uint32) bth.Fields {
		return bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCWriteOnly, DestQP: 0x12, PSN: psn, AckReq: true}, VA: 0x1000, RKey: 7, DMALen: 64}
	}
	recs := []inspect.Record{
		mk(0, reqA, rspB, 0x02, w(1), 64),
		mk(time.Microsecond, rspB, reqA, 0x02, bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCAck, DestQP: 0x34, PSN: 1}, Syndrome: bth.SyndromeACKUnlimited, MSN: 1}, 0),
		mk(2*time.Microsecond, reqA, rspB, 0x03, w(2), 64),
		mk(3*time.Microsecond, rspB, reqA, 0x00, bth.Fields{BTH: bth.BTHFields{Opcode: bth.CNP, DestQP: 0x34, BECN: true}}, bth.CNPPayloadLen),
		mk(4*time.Microsecond, rspB, reqA, 0x02, bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCAck, DestQP: 0x34, PSN: 2}, Syndrome: bth.SyndromeACKUnlimited, MSN: 2}, 0),
	}
	var b bytes.Buffer
	if err := diagram.Render(&b, recs, "svg"); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if n := strings.Count(out, `<text class="conv"`); n != 1 {
		t.Errorf("%d conversations, want 1", n)
	}
	if n := len(regexp.MustCompile(`<g class="pkt cnp"`).FindAllStringIndex(out, -1)); n != 1 {
		t.Errorf("%d CNP arrows, want 1", n)
	}
	for _, want := range []string{"WRITE_ONLY psn 2 [CE]", "CNP: slow down qp 0x000034"} {
		if !strings.Contains(out, want) {
			t.Errorf("lacks %q", want)
		}
	}
	if strings.Contains(out, "psn 1 [CE]") {
		t.Error("an ECT(0) packet labelled CE")
	}
}
