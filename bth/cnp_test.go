package bth

import (
	"bytes"
	"encoding/hex"
	"errors"
	"testing"
)

func TestBuildCNP(t *testing.T) {
	tests := []struct {
		name string
		c    CNPFields
		want string // BTH, 16 reserved bytes, ICRC slot
	}{
		{"default pkey", CNPFields{DestQP: 0x000118, PKey: 0xffff},
			"81 00 ffff 40000118 00000000" + " 00000000000000000000000000000000" + " 00000000"},
		{"24-bit qp", CNPFields{DestQP: 0xabcdef, PKey: 0x8001},
			"81 00 8001 40abcdef 00000000" + " 00000000000000000000000000000000" + " 00000000"},
		{"qp masked to 24 bits", CNPFields{DestQP: 0x12345678, PKey: 0x7fff},
			"81 00 7fff 40345678 00000000" + " 00000000000000000000000000000000" + " 00000000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want, err := hex.DecodeString(stripSpaces(tt.want))
			if err != nil {
				t.Fatal(err)
			}
			buf := bytes.Repeat([]byte{0xee}, CNPLen+8) // stale bytes must be overwritten
			n, err := BuildCNP(buf, tt.c)
			if err != nil || n != CNPLen {
				t.Fatalf("BuildCNP = %d, %v; want %d", n, err, CNPLen)
			}
			if !bytes.Equal(buf[:n], want) {
				t.Errorf("CNP\n got % x\nwant % x", buf[:n], want)
			}
			var p Packet
			if err := Parse(&p, buf[:n]); err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if p.Info.Op != OpCNP || !p.BTH.BECN() || p.BTH.FECN() || p.BTH.PSN() != 0 || p.BTH.AckReq() || len(p.Payload) != CNPPayloadLen {
				t.Errorf("parsed %+v", p.BTH.Fields())
			}
			got, err := ParseCNP(buf[:n])
			if err != nil || got.DestQP != tt.c.DestQP&0xffffff || got.PKey != tt.c.PKey {
				t.Errorf("ParseCNP = %+v, %v", got, err)
			}
		})
	}
}

func stripSpaces(s string) string { return string(bytes.ReplaceAll([]byte(s), []byte(" "), nil)) }

func TestBuildCNPShort(t *testing.T) {
	if n, err := BuildCNP(make([]byte, CNPLen-1), CNPFields{DestQP: 1}); err == nil || n != 0 {
		t.Errorf("short buffer: %d, %v", n, err)
	}
}

func TestParseCNPErrors(t *testing.T) {
	cnp := make([]byte, CNPLen)
	if _, err := BuildCNP(cnp, CNPFields{DestQP: 7, PKey: 0xffff}); err != nil {
		t.Fatal(err)
	}
	ack := make([]byte, Len(RCAck, 0))
	if _, err := Build(ack, &Fields{BTH: BTHFields{Opcode: RCAck, DestQP: 7}}, nil); err != nil {
		t.Fatal(err)
	}
	long := append(append([]byte(nil), cnp[:BTHLen+CNPPayloadLen]...), make([]byte, 8)...) // 24 reserved bytes
	noBECN := append([]byte(nil), cnp...)
	noBECN[4] &^= 0x40
	tests := []struct {
		name    string
		b       []byte
		wantErr error // nil: accepted
	}{
		{"cnp", cnp, nil},
		{"longer reserved payload", long, nil},
		{"no BECN", noBECN, nil},
		{"short", cnp[:BTHLen+ICRCLen-1], ErrKindShort},
		{"ack", ack, ErrNotCNP},
		{"reserved opcode", append([]byte{0x82}, cnp[1:]...), ErrKindReservedOpcode},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := ParseCNP(tt.b)
			if tt.wantErr == nil {
				if err != nil || c.DestQP != 7 {
					t.Errorf("ParseCNP = %+v, %v; want QP 7", c, err)
				}
				return
			}
			if !errors.Is(err, tt.wantErr) {
				t.Errorf("ParseCNP error %v, want %v", err, tt.wantErr)
			}
		})
	}
}

// TestCNPNoAlloc: a CNP is built and parsed in a reused buffer without
// allocating, as a receiver sending one per congested QP must.
func TestCNPNoAlloc(t *testing.T) {
	buf := make([]byte, CNPLen)
	var qp uint32
	n := testing.AllocsPerRun(200, func() {
		qp++
		if _, err := BuildCNP(buf, CNPFields{DestQP: qp, PKey: 0xffff}); err != nil {
			panic(err)
		}
		if c, err := ParseCNP(buf); err != nil || c.DestQP != qp {
			panic(err)
		}
	})
	if n != 0 {
		t.Errorf("%v allocations per CNP build+parse", n)
	}
}

// FuzzParseCNP: ParseCNP never panics, fails only with a *ParseError or
// ErrNotCNP, and a CNP it accepts rebuilds to a CNP with the same QP and
// partition.
func FuzzParseCNP(f *testing.F) {
	seed := make([]byte, CNPLen)
	if _, err := BuildCNP(seed, CNPFields{DestQP: 0x118, PKey: 0xffff}); err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := ParseCNP(b)
		if err != nil {
			var pe *ParseError
			if !errors.As(err, &pe) && !errors.Is(err, ErrNotCNP) {
				t.Fatalf("untyped error %T: %v", err, err)
			}
			return
		}
		out := make([]byte, CNPLen)
		if _, err := BuildCNP(out, c); err != nil {
			t.Fatal(err)
		}
		if back, err := ParseCNP(out); err != nil || back != c {
			t.Fatalf("round trip: %+v, %v; want %+v", back, err, c)
		}
	})
}
