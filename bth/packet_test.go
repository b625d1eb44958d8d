package bth

import (
	"bytes"
	"errors"
	"testing"
)

// fullFields sets every field to a distinctive value so that a header
// written at the wrong offset shows up.
func fullFields(op Opcode) *Fields {
	return &Fields{
		BTH: BTHFields{Opcode: op, SE: true, MigReq: true, TVer: 0, PKey: 0x7fff, FECN: true, BECN: false,
			DestQP: 0xabcdef, AckReq: true, PSN: 0xfedcba},
		VA: 0x0102030405060708, RKey: 0x11223344, DMALen: 0x55667788, Syndrome: RNRNAK(12), MSN: 0x123456,
		SwapAdd: 0x99aabbccddeeff00, Compare: 0x0f1e2d3c4b5a6978, Orig: 0x8877665544332211, Imm: 0xdeadbeef,
		InvRKey: 0xcafef00d, QKey: 0x80010000, SrcQP: 0x000001, EEContext: 0x654321, XRCSRQ: 0x0000aa,
		Placement: 2, Selectivity: 1,
	}
}

func payloadSizes(info *OpInfo) []int {
	switch info.Payload {
	case PayloadNone:
		return []int{0}
	case PayloadFixed:
		return []int{info.FixedLen}
	}
	return []int{0, 1, 2, 3, 4, 5, 7, 256, 4096}
}

// TestBuildParseRoundTrip builds every valid opcode with every pad count
// and parses it back.
func TestBuildParseRoundTrip(t *testing.T) {
	buf := make([]byte, 8192)
	for i := range 256 {
		op := Opcode(i)
		info := op.Info()
		if !info.Valid {
			continue
		}
		for _, n := range payloadSizes(info) {
			payload := make([]byte, n)
			for j := range payload {
				payload[j] = byte(j*31 + 7)
			}
			for j := range buf {
				buf[j] = 0xee // Build must overwrite pad and ICRC slot
			}
			f := fullFields(op)
			size, err := Build(buf, f, payload)
			if err != nil {
				t.Fatalf("%s/%d: %v", info.Name, n, err)
			}
			if size != Len(op, n) || size%4 != 0 {
				t.Fatalf("%s/%d: size %d, Len %d", info.Name, n, size, Len(op, n))
			}
			pkt := buf[:size]
			var p Packet
			if err := Parse(&p, pkt); err != nil {
				t.Fatalf("%s/%d: %v", info.Name, n, err)
			}
			want := f.BTH
			want.PadCnt = PadFor(n)
			if got := p.BTH.Fields(); got != want {
				t.Errorf("%s/%d: BTH %+v, want %+v", info.Name, n, got, want)
			}
			if !bytes.Equal(p.Payload, payload) || len(p.Pad) != PadFor(n) || !bytes.Equal(p.Pad, make([]byte, PadFor(n))) {
				t.Errorf("%s/%d: payload %d bytes, pad %x", info.Name, n, len(p.Payload), p.Pad)
			}
			if !bytes.Equal(p.ICRC, []byte{0, 0, 0, 0}) {
				t.Errorf("%s/%d: ICRC slot %x", info.Name, n, p.ICRC)
			}
			checkHeaders(t, info, &p, f)
		}
	}
}

func checkHeaders(t *testing.T, info *OpInfo, p *Packet, f *Fields) {
	t.Helper()
	present := map[Header]bool{HdrRDETH: p.RDETH != nil, HdrDETH: p.DETH != nil, HdrXRCETH: p.XRCETH != nil,
		HdrFETH: p.FETH != nil, HdrRETH: p.RETH != nil, HdrAtomicETH: p.AtomicETH != nil, HdrAETH: p.AETH != nil,
		HdrAtomicAckETH: p.AtomicAckETH != nil, HdrImmDt: p.ImmDt != nil, HdrIETH: p.IETH != nil}
	for h, ok := range present {
		if ok != (info.Headers&h != 0) {
			t.Errorf("%s: header %s present=%v", info.Name, h, ok)
		}
	}
	bad := func(what string) { t.Errorf("%s: %s mismatch", info.Name, what) }
	if p.RDETH != nil && p.RDETH.EEContext() != f.EEContext {
		bad("RDETH")
	}
	if p.DETH != nil && (p.DETH.QKey() != f.QKey || p.DETH.SrcQP() != f.SrcQP) {
		bad("DETH")
	}
	if p.XRCETH != nil && p.XRCETH.XRCSRQ() != f.XRCSRQ {
		bad("XRCETH")
	}
	if p.FETH != nil && (p.FETH.PlacementType() != f.Placement || p.FETH.Selectivity() != f.Selectivity) {
		bad("FETH")
	}
	if p.RETH != nil && (p.RETH.VA() != f.VA || p.RETH.RKey() != f.RKey || p.RETH.DMALen() != f.DMALen) {
		bad("RETH")
	}
	if p.AtomicETH != nil && (p.AtomicETH.VA() != f.VA || p.AtomicETH.RKey() != f.RKey ||
		p.AtomicETH.SwapAdd() != f.SwapAdd || p.AtomicETH.Compare() != f.Compare) {
		bad("AtomicETH")
	}
	if p.AETH != nil && (p.AETH.Syndrome() != f.Syndrome || p.AETH.MSN() != f.MSN) {
		bad("AETH")
	}
	if p.AtomicAckETH != nil && p.AtomicAckETH.Orig() != f.Orig {
		bad("AtomicAckETH")
	}
	if p.ImmDt != nil && p.ImmDt.Imm() != f.Imm {
		bad("ImmDt")
	}
	if p.IETH != nil && p.IETH.RKey() != f.InvRKey {
		bad("IETH")
	}
}

// TestBTHWireLayout pins the bit positions against a hand-assembled BTH
// (IBTA §9.2; docs/rxe-behaviour.md §0).
func TestBTHWireLayout(t *testing.T) {
	b := make(BTH, BTHLen)
	b.Encode(&BTHFields{Opcode: 0x0a, SE: true, PadCnt: 2, TVer: 0, PKey: 0xffff, BECN: true, DestQP: 0x000011, AckReq: true, PSN: 0x8c84dd})
	want := []byte{0x0a, 0xa0, 0xff, 0xff, 0x40, 0x00, 0x00, 0x11, 0x80, 0x8c, 0x84, 0xdd}
	if !bytes.Equal(b, want) {
		t.Fatalf("encoded % x, want % x", []byte(b), want)
	}
	b.SetPSN(0x123456)
	b.SetDestQP(0xabcdef)
	b.SetAckReq(false)
	b.SetSE(false)
	b.SetPadCnt(3)
	b.SetOpcode(RCAck)
	if b.PSN() != 0x123456 || b.DestQP() != 0xabcdef || b.AckReq() || b.SE() || b.PadCnt() != 3 || b.Opcode() != RCAck || !b.BECN() {
		t.Errorf("setters: %+v", b.Fields())
	}
}

func TestParseMalformed(t *testing.T) {
	build := func(op Opcode, n int) []byte {
		b := make([]byte, Len(op, n))
		if _, err := Build(b, fullFields(op), make([]byte, n)); err != nil {
			t.Fatal(err)
		}
		return b
	}
	withPad := func(b []byte, pad int) []byte { BTH(b).SetPadCnt(pad); return b }
	cases := []struct {
		name string
		b    []byte
		want *ParseError
	}{
		{"empty", nil, ErrKindShort},
		{"one byte", []byte{4}, ErrKindShort},
		{"BTH without ICRC", build(RCSendOnly, 0)[:BTHLen], ErrKindShort},
		{"15 bytes", build(RCSendOnly, 0)[:15], ErrKindShort},
		{"reserved RC 0x18", withPad(build(RCSendOnly, 4), 0), nil}, // patched below
		{"vendor 0xC5", nil, ErrKindReservedOpcode},
		{"WRITE_ONLY without RETH", build(RCSendOnly, 8), nil}, // patched below
		{"ACK cut in AETH", build(RCAck, 0)[:BTHLen+2+ICRCLen], ErrKindMissingHeader},
		{"UD without DETH", append(build(UDSendOnly, 0)[:BTHLen+4], 0, 0, 0, 0), ErrKindMissingHeader},
		{"PadCnt beyond payload", withPad(build(RCSendOnly, 0), 3), ErrKindPadCnt},
		{"PadCnt 3 with 2 bytes", withPad(build(RCSendOnly, 2)[:BTHLen+2+ICRCLen], 3), ErrKindPadCnt},
		{"READ request with payload", append(build(RCReadRequest, 0), 1, 2, 3, 4), ErrKindPayloadLen},
		{"ACK with payload", append(build(RCAck, 0), 0, 0, 0, 0), ErrKindPayloadLen},
		{"ATOMIC_WRITE 4 bytes", build(RCAtomicWrite, 4), ErrKindPayloadLen},
	}
	cases[4].b[0] = 0x18
	cases[4].want = ErrKindReservedOpcode
	cases[5].b = build(RCSendOnly, 4)
	cases[5].b[0] = 0xC5
	cases[6].b[0] = byte(RCWriteOnly) // 8 payload bytes < 16-byte RETH
	cases[6].want = ErrKindMissingHeader
	for _, c := range cases {
		var p Packet
		err := Parse(&p, c.b)
		var pe *ParseError
		if !errors.As(err, &pe) || !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want.Kind)
			continue
		}
		if pe.Error() == "" || pe.Kind.String() == "" {
			t.Errorf("%s: empty message", c.name)
		}
		if c.want == ErrKindReservedOpcode && (p.BTH == nil || p.Info == nil || p.Info.Valid) {
			t.Errorf("%s: reserved opcode should leave BTH and Info set", c.name)
		}
	}
	// Every reserved and vendor opcode is refused.
	for i := range 256 {
		if Opcode(i).Info().Valid {
			continue
		}
		b := build(RCSendOnly, 4)
		b[0] = byte(i)
		var p Packet
		if err := Parse(&p, b); !errors.Is(err, ErrKindReservedOpcode) {
			t.Errorf("opcode 0x%02x: %v", i, err)
		}
	}
}

func TestParseHeadersTruncated(t *testing.T) {
	b := make([]byte, Len(RCWriteOnly, 1000))
	if _, err := Build(b, fullFields(RCWriteOnly), make([]byte, 1000)); err != nil {
		t.Fatal(err)
	}
	var p Packet
	if err := ParseHeaders(&p, b[:100]); err != nil || p.RETH.DMALen() != 0x55667788 || len(p.Payload) != 100-28 || p.ICRC != nil {
		t.Fatalf("%v %+v", err, p)
	}
	if err := ParseHeaders(&p, b[:20]); !errors.Is(err, ErrKindMissingHeader) {
		t.Errorf("cut in RETH: %v", err)
	}
	if err := ParseHeaders(&p, b[:5]); !errors.Is(err, ErrKindShort) {
		t.Errorf("cut in BTH: %v", err)
	}
	b[0] = 0x1f
	if err := ParseHeaders(&p, b[:40]); !errors.Is(err, ErrKindReservedOpcode) {
		t.Errorf("reserved: %v", err)
	}
}

func TestBuildShortBuffer(t *testing.T) {
	if _, err := Build(make([]byte, 20), fullFields(RCWriteOnly), nil); err == nil {
		t.Error("Build into a short buffer succeeded")
	}
	if n := WriteHeaders(make([]byte, 10), fullFields(RCSendOnly), 0); n != -1 {
		t.Errorf("WriteHeaders: %d", n)
	}
}

func TestPSN(t *testing.T) {
	cases := []struct {
		a, b uint32
		diff int
	}{{5, 3, 2}, {3, 5, -2}, {0, 0xffffff, 1}, {0xffffff, 0, -1}, {0x7fffff, 0, 0x7fffff}, {0x800000, 0, -0x800000}}
	for _, c := range cases {
		if d := PSNDiff(c.a, c.b); d != c.diff {
			t.Errorf("PSNDiff(%#x, %#x) = %d, want %d", c.a, c.b, d, c.diff)
		}
	}
	if PSNAdd(0xffffff, 1) != 0 || PSNAdd(0, -1) != 0xffffff || PSNAdd(10, 5) != 15 {
		t.Error("PSNAdd wraps wrongly")
	}
	for n, want := range map[int]int{0: 0, 1: 3, 2: 2, 3: 1, 4: 0, 4097: 3} {
		if PadFor(n) != want {
			t.Errorf("PadFor(%d) = %d", n, PadFor(n))
		}
	}
}

// write4K is an RC RDMA_WRITE_ONLY packet with a 4 KiB payload.
func write4K(tb testing.TB) []byte {
	b := make([]byte, Len(RCWriteOnly, 4096))
	if _, err := Build(b, fullFields(RCWriteOnly), make([]byte, 4096)); err != nil {
		tb.Fatal(err)
	}
	return b
}

func TestParseAllocs(t *testing.T) {
	b := write4K(t)
	var p Packet
	if n := testing.AllocsPerRun(1000, func() {
		if err := Parse(&p, b); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("Parse of a 4 KiB WRITE allocates %v times", n)
	}
	f := fullFields(RCWriteOnly)
	if n := testing.AllocsPerRun(1000, func() { WriteHeaders(b, f, 4096) }); n != 0 {
		t.Errorf("WriteHeaders allocates %v times", n)
	}
}

func BenchmarkParseWrite4K(b *testing.B) {
	pkt := write4K(b)
	var p Packet
	b.SetBytes(int64(len(pkt)))
	b.ReportAllocs()
	for b.Loop() {
		if err := Parse(&p, pkt); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkWriteHeaders(b *testing.B) {
	pkt := write4K(b)
	f := fullFields(RCWriteOnly)
	b.ReportAllocs()
	for b.Loop() {
		WriteHeaders(pkt, f, 4096)
	}
}
