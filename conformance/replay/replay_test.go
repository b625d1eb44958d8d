package replay

import (
	"bytes"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/inspect"
)

// sharedDir holds real hardware captures outside the repository; the
// tests that read them skip with "shared captures absent:" when it is
// missing. SOFTROCE_SHARED_CAPTURES names another place for it.
func sharedDir() string {
	if d := os.Getenv("SOFTROCE_SHARED_CAPTURES"); d != "" {
		return d
	}
	return "../../../shared/captures"
}

// goldenCheck compares the replay's text report with testdata/golden/NAME.txt;
// SOFTROCE_UPDATE_GOLDEN=1 rewrites it.
func goldenCheck(t *testing.T, path string) *Report {
	t.Helper()
	recs, err := inspect.Records(path)
	if err != nil {
		t.Fatal(err)
	}
	name := filepath.Base(path)
	rep := Records(name, recs)
	var b bytes.Buffer
	if err := rep.WriteText(&b, false); err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "golden", strings.TrimSuffix(name, filepath.Ext(name))+".txt")
	if os.Getenv("SOFTROCE_UPDATE_GOLDEN") == "1" {
		if err := os.MkdirAll(filepath.Dir(golden), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(golden, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (SOFTROCE_UPDATE_GOLDEN=1 writes it)", err)
	}
	if !bytes.Equal(b.Bytes(), want) {
		t.Errorf("%s: the replay's verdicts changed; got:\n%s\nwant (%s):\n%s", name, b.String(), golden, want)
	}
	return rep
}

// TestGoldenRecorded replays the rxe captures committed with the project
// (always present): every exchange agrees or differs only as allowed.
func TestGoldenRecorded(t *testing.T) {
	for _, path := range []string{"../../icrc/testdata/rxe/rxe-ipv4.pcap", "../../icrc/testdata/rxe/rxe-ipv6.pcap", "../../inspect/testdata/rxe-cm/rxe-cm.pcap"} {
		t.Run(filepath.Base(path), func(t *testing.T) {
			rep := goldenCheck(t, path)
			if rep.DifferN != 0 || rep.CMDiffer != 0 {
				t.Errorf("%s; %s", rep.Summary(), rep.CMSummary())
			}
		})
	}
	rep := goldenCheck(t, "../../icrc/testdata/rxe/rxe-ipv4.pcap")
	// Memory the READ responses and atomics revealed was set up, so the
	// payloads and original values were compared and agreed.
	var sawRead, sawAtomic bool
	for _, e := range rep.Exchanges {
		sawRead = sawRead || e.Opcode == "RC RDMA_READ_REQUEST" && e.Verdict == Agree
		sawAtomic = sawAtomic || e.Opcode == "RC FETCH_ADD" && e.Verdict == Agree
	}
	if !sawRead || !sawAtomic || rep.Requests != 21 {
		t.Errorf("READ agreed %v, atomic agreed %v, %d requests", sawRead, sawAtomic, rep.Requests)
	}
	if rep := goldenCheck(t, "../../inspect/testdata/rxe-cm/rxe-cm.pcap"); rep.CMSkipped == 0 {
		t.Error("no CM MAD counted as skipped")
	}
}

// TestGoldenShared replays the shared hardware captures.
func TestGoldenShared(t *testing.T) {
	names := []string{"connectx-rdmacm-read.pcap", "connectx-rdmacm-send.pcap", "connectx-rdmacm-write.pcap",
		"rxe-rdmacm-write-read.pcap", "connectx-ib-send-bw.pcap", "connectx-srq-pingpong-send.pcap"}
	dir := filepath.Join(sharedDir(), "hardware")
	if _, err := os.Stat(filepath.Join(dir, names[0])); err != nil {
		t.Skipf("shared captures absent: %v", err)
	}
	for _, n := range names {
		t.Run(n, func(t *testing.T) {
			p := filepath.Join(dir, n)
			if _, err := os.Stat(p); err != nil {
				t.Skipf("shared captures absent: %v", err)
			}
			rep := goldenCheck(t, p)
			if strings.Contains(n, "rdmacm") && (rep.CMReplayed == 0 || rep.CMDiffer != 0) {
				t.Errorf("%s", rep.CMSummary())
			}
		})
	}
}

var (
	reqA  = netip.MustParseAddr("10.0.0.1")
	respB = netip.MustParseAddr("10.0.0.2")
)

const (
	reqQP  = 0x11
	respQP = 0x22
	rkey   = 0x55
)

type synth struct {
	t    *testing.T
	recs []inspect.Record
}

func (s *synth) add(toResp bool, f bth.Fields, payload []byte) {
	s.t.Helper()
	spec := &inspect.FrameSpec{Src: reqA, Dst: respB, SrcPort: 50000, Fields: f, Payload: payload}
	spec.Fields.BTH.PKey = 0xffff
	if toResp {
		spec.Fields.BTH.DestQP = respQP
	} else {
		spec.Src, spec.Dst, spec.SrcPort = respB, reqA, 50001
		spec.Fields.BTH.DestQP = reqQP
	}
	b, err := inspect.BuildFrame(spec)
	if err != nil {
		s.t.Fatal(err)
	}
	r := inspect.Decode(b, gopacket.CaptureInfo{Timestamp: time.Unix(1000, int64(len(s.recs))*1000), CaptureLength: len(b), Length: len(b)})
	r.Frame = len(s.recs) + 1
	s.recs = append(s.recs, r)
}

func (s *synth) req(op bth.Opcode, psn uint32, f bth.Fields, payload []byte) {
	f.BTH.Opcode, f.BTH.PSN, f.BTH.AckReq = op, psn, true
	s.add(true, f, payload)
}

func (s *synth) ack(op bth.Opcode, psn uint32, syn bth.Syndrome, msn uint32, f bth.Fields, payload []byte) {
	f.BTH.Opcode, f.BTH.PSN, f.Syndrome, f.MSN = op, psn, syn, msn
	s.add(false, f, payload)
}

func exchange(t *testing.T, rep *Report, frame int) *Exchange {
	t.Helper()
	for i := range rep.Exchanges {
		if rep.Exchanges[i].Frame == frame {
			return &rep.Exchanges[i]
		}
	}
	t.Fatalf("no exchange for frame %d", frame)
	return nil
}

// lossyCapture is a conversation caught mid-connection: no CM, MSNs that
// do not start at 0, a coalesced ACK, a request lost before the
// responder (its PSN sequence error NAK shows it) and retransmitted, a
// READ of what the WRITEs wrote, an atomic whose original value seeds the
// memory.
func lossyCapture(t *testing.T) *synth {
	s := &synth{t: t}
	w := bth.Fields{VA: 0x7000, RKey: rkey, DMALen: 8}
	s.req(bth.RCWriteOnly, 100, w, []byte("AAAAAAAA")) // 1: coalesced into 3's ACK
	w.VA = 0x7008
	s.req(bth.RCWriteOnly, 101, w, []byte("BBBBBBBB"))                                                         // 2
	s.ack(bth.RCAck, 101, bth.SyndromeACKUnlimited, 7, bth.Fields{}, nil)                                      // 3
	s.req(bth.RCSendOnly, 102, bth.Fields{}, []byte("lost"))                                                   // 4: lost
	s.req(bth.RCSendOnly, 103, bth.Fields{}, []byte("next"))                                                   // 5
	s.ack(bth.RCAck, 102, bth.SyndromePSNSeqError, 7, bth.Fields{}, nil)                                       // 6
	s.req(bth.RCSendOnly, 102, bth.Fields{}, []byte("lost"))                                                   // 7: retransmitted
	s.ack(bth.RCAck, 102, bth.SyndromeACKUnlimited, 8, bth.Fields{}, nil)                                      // 8
	s.req(bth.RCSendOnly, 103, bth.Fields{}, []byte("next"))                                                   // 9
	s.ack(bth.RCAck, 103, bth.SyndromeACKUnlimited, 9, bth.Fields{}, nil)                                      // 10
	s.req(bth.RCReadRequest, 104, bth.Fields{VA: 0x7000, RKey: rkey, DMALen: 16}, nil)                         // 11
	s.ack(bth.RCReadResponseOnly, 104, bth.SyndromeACKUnlimited, 10, bth.Fields{}, []byte("AAAAAAAABBBBBBBB")) // 12
	s.req(bth.RCFetchAdd, 105, bth.Fields{VA: 0x7100, RKey: rkey, SwapAdd: 1}, nil)                            // 13
	s.ack(bth.RCAtomicAck, 105, bth.SyndromeACKUnlimited, 11, bth.Fields{Orig: 41}, nil)                       // 14
	s.req(bth.RCWriteOnly, 106, bth.Fields{VA: 0x7000, RKey: 0x99, DMALen: 4}, []byte("CCCC"))                 // 15: a bad rkey
	s.ack(bth.RCAck, 106, bth.SyndromeRemoteAccessError, 11, bth.Fields{}, nil)                                // 16
	return s
}

// TestLossyMidConnection: every difference in the lossy capture is one the
// spec allows or the capture explains, and each is named.
func TestLossyMidConnection(t *testing.T) {
	s := lossyCapture(t)
	rep := Records("lossy", s.recs)
	var b bytes.Buffer
	rep.WriteText(&b, true)
	t.Log("\n" + b.String())
	if rep.DifferN != 0 || rep.Requests != 8 {
		t.Fatalf("%s", rep.Summary())
	}
	if e := exchange(t, rep, 1); e.Verdict != Allowed || !strings.Contains(strings.Join(e.Allowed, ";"), "ACK coalescing") {
		t.Errorf("frame 1: %s %v", e.Verdict, e.Allowed)
	}
	if e := exchange(t, rep, 2); !strings.Contains(strings.Join(e.Allowed, ";"), "MSN offset 5") {
		t.Errorf("frame 2: %s %v", e.Verdict, e.Allowed)
	}
	if n := rep.Flows[0].NotReplayed["lost before the real responder (its PSN sequence error NAK says so)"]; n != 1 {
		t.Errorf("lost requests %d, want 1: %v", n, rep.Flows[0].NotReplayed)
	}
	for _, f := range []int{5, 7, 9, 11, 13, 15} {
		if e := exchange(t, rep, f); e.Verdict != Agree {
			t.Errorf("frame %d: %s %v %v", f, e.Verdict, e.Allowed, e.Failures)
		}
	}
	// The requester side: softroce's requester, fed the same answers,
	// goes back to the NAKed PSN, lands the READ's bytes and the atomic's
	// original value, and fails the WRITE the responder refused.
	if len(rep.Completions) != 7 || rep.ReqDiffer != 0 {
		t.Fatalf("%s: %+v", rep.RequesterSummary(), rep.Completions)
	}
	for i, c := range rep.Completions {
		want := "success"
		if i == 6 {
			want = "remote access error"
		}
		if c.Want != want || c.Got != want {
			t.Errorf("work request %d (%s): want %s, real answers %s, softroce %s", i, c.Op, want, c.Want, c.Got)
		}
	}
}

// TestRequesterDiffers: a completion of softroce's requester other than
// the one the answers suggest is a difference. The READ response here
// carries 4 of the 8 bytes asked for: the answers look complete, softroce
// completes the READ with a bad response error.
func TestRequesterDiffers(t *testing.T) {
	s := &synth{t: t}
	s.req(bth.RCReadRequest, 7, bth.Fields{VA: 0x100, RKey: rkey, DMALen: 8}, nil)
	s.ack(bth.RCReadResponseOnly, 7, bth.SyndromeACKUnlimited, 1, bth.Fields{}, []byte("abcd"))
	rep := Records("short-read", s.recs)
	if len(rep.Completions) != 1 {
		t.Fatalf("%s", rep.RequesterSummary())
	}
	c := rep.Completions[0]
	t.Logf("%+v", c)
	if c.Verdict != Differ {
		t.Errorf("a READ answered with 4 of 8 bytes: %+v", c)
	}
}

// TestDifferentSyndrome: a capture whose responder NAKed with another
// syndrome than softroce does is a failure, shown with both packets.
func TestDifferentSyndrome(t *testing.T) {
	s := lossyCapture(t)
	// The real responder answered the bad rkey with a remote operational
	// error instead of a remote access error.
	s.recs = s.recs[:len(s.recs)-1]
	s.ack(bth.RCAck, 106, bth.SyndromeRemoteOpError, 11, bth.Fields{}, nil)
	rep := Records("syndrome", s.recs)
	if rep.DifferN != 1 {
		t.Fatalf("%s", rep.Summary())
	}
	e := exchange(t, rep, 15)
	if e.Verdict != Differ || len(e.Failures) != 1 || !strings.Contains(e.Failures[0], "AETH syndrome: real 0x63") {
		t.Fatalf("frame 15: %s %v", e.Verdict, e.Failures)
	}
	var b bytes.Buffer
	rep.WriteText(&b, false)
	out := b.String()
	for _, want := range []string{"DIFFERS: AETH syndrome", "real:        16", "NAK remote operational error", "softroce:    15", "NAK remote access error",
		"replayed 8 requests: 5 agree, 2 allowed differences, 1 differ"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
}

// TestReadPayloadDiffers: a READ response whose bytes are not what the
// capture's own WRITE put there is a failure.
func TestReadPayloadDiffers(t *testing.T) {
	s := &synth{t: t}
	s.req(bth.RCWriteOnly, 5, bth.Fields{VA: 0x100, RKey: rkey, DMALen: 4}, []byte("abcd"))
	s.ack(bth.RCAck, 5, bth.SyndromeACKUnlimited, 1, bth.Fields{}, nil)
	s.req(bth.RCReadRequest, 6, bth.Fields{VA: 0x100, RKey: rkey, DMALen: 4}, nil)
	s.ack(bth.RCReadResponseOnly, 6, bth.SyndromeACKUnlimited, 2, bth.Fields{}, []byte("abXd"))
	rep := Records("read", s.recs)
	e := exchange(t, rep, 3)
	if e.Verdict != Differ || !strings.Contains(strings.Join(e.Failures, ";"), "first difference at byte 2") {
		t.Fatalf("%s %v", e.Verdict, e.Failures)
	}
}

// TestDiagramAndJSON: the side-by-side page has both ladders; the JSON
// carries the summary.
func TestDiagramAndJSON(t *testing.T) {
	rep := Records("lossy", lossyCapture(t).recs)
	var b bytes.Buffer
	if err := rep.WriteDiagram(&b); err != nil {
		t.Fatal(err)
	}
	page := b.String()
	if strings.Count(page, "<svg") != 2 || !strings.Contains(page, "LOST") || !strings.Contains(page, "softroce responder") {
		t.Errorf("diagram page: %d SVGs, LOST %v", strings.Count(page, "<svg"), strings.Contains(page, "LOST"))
	}
	b.Reset()
	if err := rep.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), `"summary": "replayed 8 requests`) || !strings.Contains(b.String(), `"verdict": "allowed"`) {
		t.Errorf("JSON: %s", b.String())
	}
}

// TestOddPackets: a capture that starts inside a message, a WRITE cut by
// the snap length, a reserved opcode and an unknown QP's answer are each
// handled and named, never a panic.
func TestOddPackets(t *testing.T) {
	s := &synth{t: t}
	s.req(bth.RCSendMiddle, 9, bth.Fields{}, make([]byte, 256))
	s.req(bth.RCSendLast, 10, bth.Fields{}, []byte("end"))
	s.req(bth.RCSendOnly, 11, bth.Fields{}, []byte("hello"))
	s.ack(bth.RCAck, 11, bth.SyndromeACKUnlimited, 5, bth.Fields{}, nil)
	s.req(bth.RCWriteOnly, 12, bth.Fields{VA: 0x40, RKey: rkey, DMALen: 64}, make([]byte, 64))
	cut := &s.recs[len(s.recs)-1]
	*cut = inspect.Decode(cut.Data[:70], gopacket.CaptureInfo{Timestamp: cut.Time, CaptureLength: 70, Length: len(cut.Data)})
	cut.Frame = len(s.recs)
	s.ack(bth.RCAck, 12, bth.SyndromeACKUnlimited, 6, bth.Fields{}, nil)
	s.req(bth.RCSendOnly, 13, bth.Fields{}, []byte("odd"))
	odd := &s.recs[len(s.recs)-1]
	odd.Data[42] = 0x1e // a reserved RC opcode
	*odd = inspect.Decode(odd.Data, gopacket.CaptureInfo{Timestamp: odd.Time, CaptureLength: len(odd.Data), Length: len(odd.Data)})
	odd.Frame = len(s.recs)
	// An ACK to a QP no captured request came from.
	s.ack(bth.RCAck, 99, bth.SyndromeACKUnlimited, 1, bth.Fields{}, nil)
	s.recs[len(s.recs)-1].Dst = netip.MustParseAddr("10.0.0.9")
	rep := Records("odd", s.recs)
	var b bytes.Buffer
	rep.WriteText(&b, true)
	t.Log("\n" + b.String())
	if n := rep.Flows[0].NotReplayed["capture starts inside this message"]; n != 2 {
		t.Errorf("mid-message packets not replayed: %d, want 2", n)
	}
	if e := exchange(t, rep, 5); !strings.Contains(strings.Join(e.Allowed, ";"), "zero-filled") || e.Verdict == Differ {
		t.Errorf("cut WRITE: %s %v %v", e.Verdict, e.Allowed, e.Failures)
	}
	if e := exchange(t, rep, 7); e.Opcode == "" || e.Verdict == Differ {
		t.Errorf("reserved opcode: %+v", e)
	}
	if rep.Skipped["answers to no captured request"] != 1 || rep.DifferN != 0 {
		t.Errorf("skipped %v; %s", rep.Skipped, rep.Summary())
	}
}

// TestDuplicateWrite: a duplicate WRITE is re-ACKed with the PSN of the
// last request taken (as rxe answers it); softroce answers the same, and
// the ACK is tied to the duplicate, not to the original.
func TestDuplicateWrite(t *testing.T) {
	s := &synth{t: t}
	w := bth.Fields{VA: 0x200, RKey: rkey, DMALen: 4}
	s.req(bth.RCWriteOnly, 5, w, []byte("five"))
	s.ack(bth.RCAck, 5, bth.SyndromeACKUnlimited, 1, bth.Fields{}, nil)
	s.req(bth.RCWriteOnly, 6, w, []byte("six!"))
	s.ack(bth.RCAck, 6, bth.SyndromeACKUnlimited, 2, bth.Fields{}, nil)
	s.req(bth.RCWriteOnly, 5, w, []byte("five")) // 5: the duplicate
	s.ack(bth.RCAck, 6, bth.SyndromeACKUnlimited, 2, bth.Fields{}, nil)
	rep := Records("dup", s.recs)
	var b bytes.Buffer
	rep.WriteText(&b, true)
	if rep.Agree != 3 || rep.Requests != 3 {
		t.Fatalf("%s\n%s", rep.Summary(), b.String())
	}
	if e := exchange(t, rep, 5); len(e.real) != 1 || e.real[0].Frame != 6 {
		t.Errorf("the duplicate's answer: %v", e.Real)
	}
}

// TestRNRAndRereads: an RNR NAK then the retransmission the receive
// arrived for; a READ, a duplicate of it, and a re-read of its second
// half (answered from MIDDLE on, as rxe does). Both sides agree, the RNR
// timer aside.
func TestRNRAndRereads(t *testing.T) {
	s := &synth{t: t}
	s.req(bth.RCSendOnly, 20, bth.Fields{}, []byte("early"))
	s.ack(bth.RCAck, 20, bth.RNRNAK(1), 0, bth.Fields{}, nil)
	s.req(bth.RCSendOnly, 20, bth.Fields{}, []byte("early")) // 3: after the RNR timer
	s.ack(bth.RCAck, 20, bth.SyndromeACKUnlimited, 1, bth.Fields{}, nil)
	data := make([]byte, 600)
	for i := range data {
		data[i] = byte(i * 7)
	}
	rd := bth.Fields{VA: 0x1000, RKey: rkey, DMALen: 600}
	s.req(bth.RCReadRequest, 21, rd, nil) // 5: PSNs 21..23 at MTU 256
	s.ack(bth.RCReadResponseFirst, 21, bth.SyndromeACKUnlimited, 2, bth.Fields{}, data[:256])
	s.ack(bth.RCReadResponseMiddle, 22, 0, 0, bth.Fields{}, data[256:512])
	s.ack(bth.RCReadResponseLast, 23, bth.SyndromeACKUnlimited, 2, bth.Fields{}, data[512:])
	s.req(bth.RCReadRequest, 21, rd, nil) // 9: a duplicate
	s.ack(bth.RCReadResponseFirst, 21, bth.SyndromeACKUnlimited, 2, bth.Fields{}, data[:256])
	s.ack(bth.RCReadResponseMiddle, 22, 0, 0, bth.Fields{}, data[256:512])
	s.ack(bth.RCReadResponseLast, 23, bth.SyndromeACKUnlimited, 2, bth.Fields{}, data[512:])
	s.req(bth.RCReadRequest, 22, bth.Fields{VA: 0x1100, RKey: rkey, DMALen: 344}, nil) // 13: a re-read from PSN 22
	s.ack(bth.RCReadResponseMiddle, 22, 0, 0, bth.Fields{}, data[256:512])
	s.ack(bth.RCReadResponseLast, 23, bth.SyndromeACKUnlimited, 2, bth.Fields{}, data[512:])
	rep := Records("rereads", s.recs)
	var b bytes.Buffer
	rep.WriteText(&b, true)
	if rep.DifferN != 0 || rep.Requests != 5 || rep.ReqDiffer != 0 {
		t.Fatalf("%s\n%s", rep.Summary(), b.String())
	}
	if e := exchange(t, rep, 1); e.Verdict != Allowed || !strings.Contains(e.Allowed[0], "RNR NAK timer") {
		t.Errorf("RNR NAK: %s %v", e.Verdict, e.Allowed)
	}
	for _, f := range []int{3, 5, 9, 13} {
		if e := exchange(t, rep, f); e.Verdict != Agree || len(e.soft) != len(e.real) {
			t.Errorf("frame %d: %s %v %v\n%s", f, e.Verdict, e.Allowed, e.Failures, b.String())
		}
	}
	// The requester side: softroce waits out the RNR timer, resends the
	// SEND and lands the READ's 600 bytes.
	if len(rep.Completions) != 2 || rep.Completions[0].Got != "success" || rep.Completions[1].Got != "success" {
		t.Errorf("%s: %+v", rep.RequesterSummary(), rep.Completions)
	}
}
