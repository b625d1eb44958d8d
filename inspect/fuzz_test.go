package inspect

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/bth/mad"
	"github.com/softroce/softroce/icrc"
)

// FuzzDecode: any frame, under any of the link types understood, decodes,
// renders as a line, a field tree and JSON (json.Marshal's bytes), and
// summarises without panic.
func FuzzDecode(f *testing.F) {
	lts := []layers.LinkType{layers.LinkTypeEthernet, layers.LinkTypeRaw, layers.LinkTypeLinuxSLL, layers.LinkTypeLinuxSLL2}
	f.Fuzz(func(t *testing.T, frame []byte) {
		z := NewSummarizer("")
		for _, lt := range lts {
			r := DecodeLink(lt, frame, gopacket.CaptureInfo{})
			if r.RoCE && r.ICRC != "ok" && r.ICRC != "bad" && r.ICRC != "truncated" {
				t.Fatalf("icrc %q", r.ICRC)
			}
			_ = Line(&r)
			for _, fl := range Fields(&r) {
				if fl.Start < 0 || fl.End < fl.Start {
					t.Fatalf("field %v", fl)
				}
			}
			if err := WriteJSON(discard{}, &r); err != nil {
				t.Fatal(err)
			}
			want, _ := json.Marshal(&r)
			if got, err := AppendJSON(nil, &r); err != nil || !bytes.Equal(got, want) {
				t.Fatalf("AppendJSON %s, %v; json.Marshal %s", got, err, want)
			}
			z.Add(&r)
		}
		s := z.Summary()
		_ = WriteSummary(discard{}, &s)
	})
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// TestWriteFuzzSeeds regenerates testdata/fuzz/FuzzDecode when
// SOFTROCE_WRITE_SEEDS=1.
func TestWriteFuzzSeeds(t *testing.T) {
	if os.Getenv("SOFTROCE_WRITE_SEEDS") != "1" {
		t.Skip("set SOFTROCE_WRITE_SEEDS=1 to regenerate the fuzz seeds")
	}
	v6 := req(bth.RCWriteOnlyImm, 9, 5)
	v6.Kind, v6.Src, v6.Dst = icrc.KindRoCEv2IPv6, v6a, v6b
	v1 := req(bth.RCReadRequest, 10, 0)
	v1.Kind, v1.Src, v1.Dst = icrc.KindRoCEv1, v6a, v6b
	tagged := req(bth.RCFetchAdd, 3, 0)
	tagged.VLANs = []uint16{1, 2}
	specs := []*FrameSpec{req(bth.RCSendOnly, 1, 3), ack(bth.RNRNAK(4), 2, 1), ack(bth.SyndromePSNSeqError, 5, 1), v6, v1, tagged,
		{Src: v4a, Dst: v4b, Payload: make([]byte, 16), Fields: bth.Fields{BTH: bth.BTHFields{Opcode: bth.CNP, DestQP: 9}}}}
	// CM MADs on QP1: a REQ with its cma_hdr and a REJ.
	rej := mad.MAD(make([]byte, mad.Len)).Init(mad.AttrREJ, 1)
	rej.REJ().SetReason(mad.RejInvalidServiceID)
	for _, m := range []mad.MAD{testREQ(), rej} {
		specs = append(specs, &FrameSpec{Src: v4a, Dst: v4b, Payload: m,
			Fields: bth.Fields{BTH: bth.BTHFields{Opcode: bth.UDSendOnly, PKey: 0xffff, DestQP: 1}, QKey: mad.QP1QKey, SrcQP: 1}})
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzDecode")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for i, s := range specs {
		b := mustFrame(t, s)
		if i == 0 {
			b = b[:50] // truncated
		}
		data := "go test fuzz v1\n[]byte(" + strconv.Quote(string(b)) + ")\n"
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%03d", i)), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
