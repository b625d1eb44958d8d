package inspect

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/icrc"
)

// The synthetic capture holds what the shared hardware captures lack:
// RoCEv2 over IPv6, RoCEv1, VLAN tags, a truncated snap, Ethernet padding,
// atomics, immediate data, invalidate, NAKs, a CNP, a bad ICRC and non-RoCE
// traffic, on two pcapng interfaces (Ethernet and raw IP).
const (
	syntheticCapture = "testdata/synthetic.pcapng"
	syntheticGolden  = "testdata/synthetic.txt"
)

func syntheticFrames(t *testing.T) (frames [][]byte, iface []int, wireLen []int) {
	add := func(b []byte, ifc int) {
		frames = append(frames, b)
		iface = append(iface, ifc)
		wireLen = append(wireLen, len(b))
	}
	v6 := req(bth.RCWriteOnlyImm, 9, 5)
	v6.Kind, v6.Src, v6.Dst, v6.TOS = icrc.KindRoCEv2IPv6, v6a, v6b, 0x02
	v6.Fields.Imm = 0xabcdef01
	add(mustFrame(t, v6), 0)
	v1 := req(bth.RCSendOnlyInv, 10, 3)
	v1.Kind, v1.Src, v1.Dst = icrc.KindRoCEv1, v6a, v6b
	v1.Fields.InvRKey = 0x4242
	add(mustFrame(t, v1), 0)
	cas := req(bth.RCCompareSwap, 11, 0)
	cas.VLANs = []uint16{100}
	cas.Fields.SwapAdd, cas.Fields.Compare = 5, 6
	add(mustFrame(t, cas), 0)
	aack := ack(0x1f, 11, 4)
	aack.Fields.BTH.Opcode, aack.Fields.Orig, aack.VLANs = bth.RCAtomicAck, 0x77, []uint16{100}
	add(mustFrame(t, aack), 0)
	small := req(bth.RCSendOnly, 12, 0)
	small.MinFrame = true
	add(mustFrame(t, small), 0)
	add(mustFrame(t, ack(bth.RNRNAK(14), 12, 4)), 0)
	add(mustFrame(t, ack(bth.SyndromeRemoteAccessError, 12, 4)), 0)
	big := mustFrame(t, req(bth.RCWriteFirst, 13, 1024))
	frames = append(frames, big[:128])
	iface = append(iface, 0)
	wireLen = append(wireLen, len(big))
	raw := mustFrame(t, req(bth.RCWriteMiddle, 14, 1024))
	add(raw[14:], 1)
	bad := mustFrame(t, req(bth.RCWriteLast, 15, 7))
	bad[60] ^= 0x10
	add(bad, 0)
	add(mustFrame(t, &FrameSpec{Src: v4b, Dst: v4a, Payload: make([]byte, 16),
		Fields: bth.Fields{BTH: bth.BTHFields{Opcode: bth.CNP, PKey: 0xffff, DestQP: 0x11, BECN: true}}}), 0)
	ud := &FrameSpec{Src: v4a, Dst: v4b, Payload: []byte("hello"),
		Fields: bth.Fields{BTH: bth.BTHFields{Opcode: bth.UDSendOnlyImm, PKey: 0xffff, DestQP: 0x33, PSN: 1}, QKey: 0x11111111, SrcQP: 0x44, Imm: 7}}
	add(mustFrame(t, ud), 0)
	arp := make([]byte, 60)
	arp[12], arp[13] = 0x08, 0x06
	add(arp, 0)
	return frames, iface, wireLen
}

// TestSyntheticGolden renders the synthetic capture with -v and the
// summary and compares with the golden text. SOFTROCE_UPDATE_GOLDEN=1
// rewrites both files.
func TestSyntheticGolden(t *testing.T) {
	if os.Getenv("SOFTROCE_UPDATE_GOLDEN") == "1" {
		writeSynthetic(t)
	}
	out, s := renderVerbose(t, syntheticCapture)
	if s.Frames != 13 || s.NonRoCE != 1 || s.ICRCBad != 1 || s.ICRCTruncated != 1 || s.ICRCOK != 10 || s.Malformed != 0 {
		t.Errorf("summary %+v", s)
	}
	matchGolden(t, syntheticGolden, out)
}

// renderVerbose renders a capture's records with -v, then its summary.
func renderVerbose(t *testing.T, path string) ([]byte, Summary) {
	t.Helper()
	var out bytes.Buffer
	z := NewSummarizer(filepath.Base(path))
	err := Walk(path, func(r *Record) error {
		z.Add(r)
		return WriteText(&out, r, true)
	})
	if err != nil {
		t.Fatal(err)
	}
	s := z.Summary()
	if err := WriteSummary(&out, &s); err != nil {
		t.Fatal(err)
	}
	return out.Bytes(), s
}

// matchGolden compares out with the golden file (rewritten first under
// SOFTROCE_UPDATE_GOLDEN=1).
func matchGolden(t *testing.T, golden string, out []byte) {
	t.Helper()
	if os.Getenv("SOFTROCE_UPDATE_GOLDEN") == "1" {
		if err := os.WriteFile(golden, out, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out, want) {
		t.Errorf("output differs from %s (SOFTROCE_UPDATE_GOLDEN=1 to accept):\n%s", golden, out)
	}
}

func writeSynthetic(t *testing.T) {
	frames, iface, wireLen := syntheticFrames(t)
	f, err := os.Create(syntheticCapture)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w, err := pcapgo.NewNgWriterInterface(f, pcapgo.NgInterface{Name: "eth0", LinkType: layers.LinkTypeEthernet, SnapLength: 128,
		TimestampResolution: 9}, pcapgo.NgWriterOptions{SectionInfo: pcapgo.NgSectionInfo{Application: "softroce tests"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.AddInterface(pcapgo.NgInterface{Name: "tun0", LinkType: layers.LinkTypeRaw, SnapLength: 65535, TimestampResolution: 9}); err != nil {
		t.Fatal(err)
	}
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for i, fr := range frames {
		ci := gopacket.CaptureInfo{Timestamp: start.Add(time.Duration(i) * 1500 * time.Microsecond), CaptureLength: len(fr),
			Length: wireLen[i], InterfaceIndex: iface[i]}
		if err := w.WritePacket(ci, fr); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
}
