package icrc

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/softroce/softroce/bth"
)

// FuzzCheckFrame: arbitrary frames never panic, fail only with ErrNotRoCE
// or a *FrameError, and located packets lie inside the frame's lengths.
func FuzzCheckFrame(f *testing.F) {
	f.Fuzz(func(t *testing.T, frame []byte) {
		r, err := CheckFrame(frame)
		if err != nil {
			var fe *FrameError
			if !errors.Is(err, ErrNotRoCE) && !errors.As(err, &fe) {
				t.Fatalf("untyped error %T: %v", err, err)
			}
			// Only a capture cut before the UDP port (or inside the GRH)
			// leaves the kind open; a malformed RoCE header names it.
			if fe != nil && fe.Kind == 0 && !fe.Truncated {
				t.Fatalf("malformed without kind: %v", fe)
			}
			return
		}
		if r.L3 < 14 || r.BTH <= r.L3 || r.End < r.BTH+bthLen+Len {
			t.Fatalf("offsets %+v", r)
		}
		if (r.Status == StatusTruncated) != (len(frame) < r.End) {
			t.Fatalf("status %v with %d bytes, end %d", r.Status, len(frame), r.End)
		}
		if r.Status == StatusOK && r.Computed != r.Wire {
			t.Fatalf("ok with %08x != %08x", r.Computed, r.Wire)
		}
	})
}

// TestWriteFuzzSeeds regenerates testdata/fuzz/FuzzCheckFrame when
// SOFTROCE_WRITE_SEEDS=1.
func TestWriteFuzzSeeds(t *testing.T) {
	if os.Getenv("SOFTROCE_WRITE_SEEDS") != "1" {
		t.Skip("set SOFTROCE_WRITE_SEEDS=1 to regenerate the fuzz seeds")
	}
	small := buildV4(t, &bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCSendOnly, PKey: 0xffff, DestQP: 3}}, []byte{1, 2, 3})
	ack := buildV4(t, &bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCAck, PKey: 0xffff, DestQP: 3}, Syndrome: 0x1f}, nil)
	tagged := append(append(append([]byte(nil), small[:12]...), 0x81, 0x00, 0x00, 0x05), small[12:]...)
	v1 := make([]byte, 14+40+16)
	v1[12], v1[13] = 0x89, 0x15
	v1[14] = 0x60
	v1[14+5], v1[14+6] = 16, 0x1b
	seeds := [][]byte{small, ack, tagged, small[:40], v1, nil}
	dir := filepath.Join("testdata", "fuzz", "FuzzCheckFrame")
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
