package replay

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gopacket/gopacket"

	"github.com/softroce/softroce/inspect"
	"github.com/softroce/softroce/nic/capture"
)

// fuzzRecords turns fuzz input into a capture: chunks of [flags, length,
// length bytes of RoCE packet], flags bit 0 the direction (requester to
// responder or back), bit 1 a second requester, bit 2 IPv6.
func fuzzRecords(data []byte) []inspect.Record {
	v4 := []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.3")}
	v6 := []netip.Addr{netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2"), netip.MustParseAddr("fd00::3")}
	var recs []inspect.Record
	for len(data) >= 2 && len(recs) < 64 {
		flags, n := data[0], int(data[1])
		data = data[2:]
		n = min(n, len(data))
		roce := data[:n]
		data = data[n:]
		addrs := v4
		if flags&4 != 0 {
			addrs = v6
		}
		req, resp := addrs[0], addrs[1]
		if flags&2 != 0 {
			req = addrs[2]
		}
		src, dst := netip.AddrPortFrom(req, 50000), netip.AddrPortFrom(resp, 4791)
		if flags&1 != 0 {
			src, dst = netip.AddrPortFrom(resp, 50001), netip.AddrPortFrom(req, 4791)
		}
		frame, err := capture.AppendFrame(nil, src, dst, roce)
		if err != nil {
			continue
		}
		if flags&8 != 0 && len(frame) > 60 {
			frame = frame[:60] // cut by a snap length
		}
		r := inspect.Decode(frame, gopacket.CaptureInfo{Timestamp: time.Unix(0, int64(len(recs))), CaptureLength: len(frame), Length: len(frame) + int(flags>>4)})
		r.Frame = len(recs) + 1
		recs = append(recs, r)
	}
	return recs
}

// fuzzEncode is fuzzRecords' inverse for seeds.
func fuzzEncode(pkts [][]byte, toResp []bool) []byte {
	var b []byte
	for i, p := range pkts {
		if len(p) > 255 {
			p = p[:255]
		}
		f := byte(1)
		if toResp[i] {
			f = 0
		}
		b = append(b, f, byte(len(p)))
		b = append(b, p...)
	}
	return b
}

// FuzzReplayMapping: whatever the capture, cutting it into flows, tying
// answers to requests, deriving MRs and replaying never panics, and the
// verdicts add up.
func FuzzReplayMapping(f *testing.F) {
	f.Add([]byte{0, 12, 0x04, 0, 0xff, 0xff, 0, 0, 0, 0x22, 0x80, 0, 0, 100})
	requesterQuiet = 20 * time.Millisecond
	f.Cleanup(func() { requesterQuiet = 3 * time.Second })
	f.Fuzz(func(t *testing.T, data []byte) {
		recs := fuzzRecords(data)
		for i := range recs {
			if r := recs[i].RETH; r != nil && r.DMALen > 64<<10 {
				return // large regions are mirrored and READs answered in full: correct, but slow to fuzz
			}
		}
		pl := newPlan(recs)
		for _, fl := range pl.flows {
			fl.keys()
		}
		if len(recs) > 16 {
			return // the replay itself opens devices: keep executions cheap
		}
		rep := Records("fuzz", recs)
		if rep.Requests != rep.Agree+rep.AllowedN+rep.DifferN || rep.Requests != len(rep.Exchanges) {
			t.Fatalf("verdicts do not add up: %s, %d exchanges", rep.Summary(), len(rep.Exchanges))
		}
		var sink discard
		rep.WriteText(&sink, true)
		rep.WriteJSON(&sink)
		rep.WriteDiagram(&sink)
	})
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// TestWriteFuzzSeeds writes the seed corpus from the synthetic and the
// recorded captures when SOFTROCE_WRITE_SEEDS=1 (as the other packages'
// seed writers).
func TestWriteFuzzSeeds(t *testing.T) {
	if os.Getenv("SOFTROCE_WRITE_SEEDS") != "1" {
		t.Skip("set SOFTROCE_WRITE_SEEDS=1 to regenerate the fuzz seeds")
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzReplayMapping")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name string, recs []inspect.Record, reqSrc netip.Addr) {
		var pkts [][]byte
		var toResp []bool
		for i := range recs {
			r := &recs[i]
			if b := roceBytes(r); b != nil && r.CM == nil {
				pkts = append(pkts, b)
				toResp = append(toResp, r.Src == reqSrc)
			}
			if len(pkts) == 16 {
				break
			}
		}
		body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", fuzzEncode(pkts, toResp))
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("lossy", lossyCapture(t).recs, reqA)
	recs, err := inspect.Records("../../icrc/testdata/rxe/rxe-ipv4.pcap")
	if err != nil {
		t.Fatal(err)
	}
	write("rxe-requests", recs, netip.MustParseAddr("10.88.0.2"))
	write("rxe-naks", recs[36:], netip.MustParseAddr("10.88.0.1"))
}
