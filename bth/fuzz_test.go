package bth

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// FuzzParse feeds arbitrary bytes to Parse: it must never panic, must fail
// only with a *ParseError, and what it accepts must survive a Build/Parse
// round trip with the same fields and payload.
func FuzzParse(f *testing.F) {
	f.Fuzz(func(t *testing.T, b []byte) {
		var p Packet
		err := Parse(&p, b)
		if err != nil {
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("untyped error %T: %v", err, err)
			}
			return
		}
		if p.Info.HdrLen+len(p.Payload)+len(p.Pad)+ICRCLen != len(b) {
			t.Fatalf("lengths: hdr %d payload %d pad %d total %d", p.Info.HdrLen, len(p.Payload), len(p.Pad), len(b))
		}
		fields := p.Fields()
		out := make([]byte, Len(fields.BTH.Opcode, len(p.Payload)))
		if _, err := Build(out, &fields, p.Payload); err != nil {
			t.Fatal(err)
		}
		var q Packet
		if err := Parse(&q, out); err != nil {
			// Build uses the canonical pad for the payload length; the
			// rebuilt packet must still be valid.
			t.Fatalf("rebuilt packet does not parse: %v", err)
		}
		g := q.Fields()
		g.BTH.PadCnt = fields.BTH.PadCnt
		if g != fields || !bytes.Equal(q.Payload, p.Payload) {
			t.Fatalf("round trip: %+v != %+v", g, fields)
		}
	})
}

// FuzzParseHeaders checks the truncation-tolerant parser the same way.
func FuzzParseHeaders(f *testing.F) {
	f.Fuzz(func(t *testing.T, b []byte) {
		var p Packet
		err := ParseHeaders(&p, b)
		if err != nil {
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("untyped error %T: %v", err, err)
			}
			return
		}
		if p.Info.HdrLen+len(p.Payload) != len(b) {
			t.Fatalf("lengths: hdr %d payload %d total %d", p.Info.HdrLen, len(p.Payload), len(b))
		}
	})
}

// TestWriteFuzzSeeds regenerates testdata/fuzz seeds (one packet per valid
// opcode, plus malformed ones) when SOFTROCE_WRITE_SEEDS=1.
func TestWriteFuzzSeeds(t *testing.T) {
	if os.Getenv("SOFTROCE_WRITE_SEEDS") != "1" {
		t.Skip("set SOFTROCE_WRITE_SEEDS=1 to regenerate the fuzz seeds")
	}
	var seeds [][]byte
	for i := range 256 {
		op := Opcode(i)
		if !op.Info().Valid {
			continue
		}
		n := payloadSizes(op.Info())[0]
		if op.Info().Payload == PayloadUpTo {
			n = 5
		}
		b := make([]byte, Len(op, n))
		if _, err := Build(b, fullFields(op), bytes.Repeat([]byte{0xa5}, n)); err != nil {
			t.Fatal(err)
		}
		seeds = append(seeds, b)
	}
	seeds = append(seeds, nil, []byte{0x1f, 0x30, 0xff, 0xff, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0},
		[]byte{0x04, 0x30, 0xff, 0xff, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0})
	for _, name := range []string{"FuzzParse", "FuzzParseHeaders"} {
		dir := filepath.Join("testdata", "fuzz", name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for i, s := range seeds {
			data := "go test fuzz v1\n[]byte(" + strconv.Quote(string(s)) + ")\n"
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%03d", i)), []byte(data), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}
