package inspect

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"

	"github.com/softroce/softroce/bth"
)

// snifferCapture has the signature of ConnectX's offloaded RDMA sniffer:
// UDP source port 4791 on every packet and no ICRC that verifies. It is
// written by snifferFrames (SOFTROCE_UPDATE_GOLDEN=1 rewrites it).
const snifferCapture = "testdata/sniffer-signature.pcap"

// snifferFrames is a few RDMA WRITEs and their ACKs as that sniffer
// records them: source port 4791, ICRC bad (corrupt: true), or as a host
// sends them.
func snifferFrames(t *testing.T, port uint16, corrupt bool) [][]byte {
	var frames [][]byte
	for i := uint32(0); i < 3; i++ {
		w := req(bth.RCWriteOnly, 0x10+i, 16)
		a := ack(bth.SyndromeACKUnlimited, 0x10+i, 1+i)
		for _, s := range []*FrameSpec{w, a} {
			s.SrcPort = port
			fr := mustFrame(t, s)
			if corrupt {
				fr[len(fr)-2] ^= 0x5a // the ICRC's third byte
			}
			frames = append(frames, fr)
		}
	}
	return frames
}

func writeSniffer(t *testing.T) {
	f, err := os.Create(snifferCapture)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := pcapgo.NewWriterNanos(f)
	if err := w.WriteFileHeader(65535, layers.LinkTypeEthernet); err != nil {
		t.Fatal(err)
	}
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for i, fr := range snifferFrames(t, 4791, true) {
		ci := gopacket.CaptureInfo{Timestamp: start.Add(time.Duration(i) * 10 * time.Microsecond), CaptureLength: len(fr), Length: len(fr)}
		if err := w.WritePacket(ci, fr); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSnifferHint: a capture with the offloaded sniffer's signature gets
// a hint saying what it likely is; a wire capture with bad ICRCs, or one
// from port 4791 whose ICRCs verify, does not.
func TestSnifferHint(t *testing.T) {
	if os.Getenv("SOFTROCE_UPDATE_GOLDEN") == "1" {
		writeSniffer(t)
	}
	out, s := renderVerbose(t, snifferCapture)
	if s.RoCE != 6 || s.ICRCBad != 6 || len(s.Hints) != 1 || s.Hints[0] != SnifferHint {
		t.Fatalf("summary: %d RoCE, %d bad ICRC, hints %q", s.RoCE, s.ICRCBad, s.Hints)
	}
	if !strings.Contains(string(out), "   hint: every packet's ICRC fails and every UDP source port is 4791: this looks like a capture by ConnectX's offloaded RDMA sniffer") {
		t.Errorf("text summary lacks the hint:\n%s", out)
	}
	for _, c := range []struct {
		name    string
		port    uint16
		corrupt bool
	}{{"bad ICRCs from a host's source port", 0xc123, true}, {"port 4791, good ICRCs", 4791, false}} {
		z := NewSummarizer("")
		for _, fr := range snifferFrames(t, c.port, c.corrupt) {
			r := Decode(fr, gopacket.CaptureInfo{Length: len(fr), CaptureLength: len(fr)})
			z.Add(&r)
		}
		if s := z.Summary(); len(s.Hints) != 0 {
			t.Errorf("%s: hints %q", c.name, s.Hints)
		}
	}
	// One packet whose ICRC verifies: not the sniffer's capture.
	z := NewSummarizer("")
	frames := append(snifferFrames(t, 4791, true), snifferFrames(t, 4791, false)[0])
	for _, fr := range frames {
		r := Decode(fr, gopacket.CaptureInfo{Length: len(fr), CaptureLength: len(fr)})
		z.Add(&r)
	}
	if s := z.Summary(); len(s.Hints) != 0 {
		t.Errorf("one good ICRC: hints %q", s.Hints)
	}
}
