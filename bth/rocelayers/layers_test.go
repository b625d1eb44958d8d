package rocelayers

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/icrc"
	"github.com/softroce/softroce/inspect"
)

func frame(t testing.TB, s *inspect.FrameSpec) []byte {
	t.Helper()
	b, err := inspect.BuildFrame(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var (
	v4a, v4b = netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	v6a, v6b = netip.MustParseAddr("fe80::1"), netip.MustParseAddr("fe80::2")
)

func writeSpec(kind icrc.Kind, src, dst netip.Addr, vlans []uint16, n int) *inspect.FrameSpec {
	return &inspect.FrameSpec{Kind: kind, Src: src, Dst: dst, VLANs: vlans, MinFrame: true,
		Fields: bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCWriteOnlyImm, PKey: 0xffff, DestQP: 0x123, PSN: 77, AckReq: true},
			VA: 0xdead0000, RKey: 0x99, DMALen: uint32(n), Imm: 0x01020304},
		Payload: bytes.Repeat([]byte{0x5a}, n)}
}

func TestNewPacket(t *testing.T) {
	cases := []struct {
		name string
		spec *inspect.FrameSpec
		want []gopacket.LayerType
	}{
		{"v2 ipv4", writeSpec(icrc.KindRoCEv2IPv4, v4a, v4b, nil, 13),
			[]gopacket.LayerType{layers.LayerTypeEthernet, layers.LayerTypeIPv4, layers.LayerTypeUDP, LayerTypeRoCE, gopacket.LayerTypePayload}},
		{"v2 ipv4 vlan", writeSpec(icrc.KindRoCEv2IPv4, v4a, v4b, []uint16{7}, 1),
			[]gopacket.LayerType{layers.LayerTypeEthernet, layers.LayerTypeDot1Q, layers.LayerTypeIPv4, layers.LayerTypeUDP, LayerTypeRoCE, gopacket.LayerTypePayload}},
		{"v2 ipv6", writeSpec(icrc.KindRoCEv2IPv6, v6a, v6b, nil, 4096),
			[]gopacket.LayerType{layers.LayerTypeEthernet, layers.LayerTypeIPv6, layers.LayerTypeUDP, LayerTypeRoCE, gopacket.LayerTypePayload}},
		{"v1", writeSpec(icrc.KindRoCEv1, v6a, v6b, nil, 3),
			[]gopacket.LayerType{layers.LayerTypeEthernet, LayerTypeGRH, LayerTypeRoCE, gopacket.LayerTypePayload}},
		{"v1 no payload", writeSpec(icrc.KindRoCEv1, v6a, v6b, []uint16{1, 2}, 0),
			[]gopacket.LayerType{layers.LayerTypeEthernet, layers.LayerTypeDot1Q, layers.LayerTypeDot1Q, LayerTypeGRH, LayerTypeRoCE}},
	}
	for _, c := range cases {
		fr := frame(t, c.spec)
		pkt := gopacket.NewPacket(fr, layers.LayerTypeEthernet, gopacket.Default)
		if el := pkt.ErrorLayer(); el != nil {
			t.Errorf("%s: %v", c.name, el.Error())
			continue
		}
		var got []gopacket.LayerType
		for _, l := range pkt.Layers() {
			got = append(got, l.LayerType())
		}
		if len(got) != len(c.want) {
			t.Errorf("%s: layers %v, want %v", c.name, got, c.want)
			continue
		}
		for i := range got {
			if got[i] != c.want[i] {
				t.Errorf("%s: layers %v, want %v", c.name, got, c.want)
				break
			}
		}
		r := pkt.Layer(LayerTypeRoCE).(*RoCE)
		f := r.Packet.Fields()
		if f.BTH.PSN != 77 || f.BTH.DestQP != 0x123 || f.VA != 0xdead0000 || f.Imm != 0x01020304 || len(r.Payload) != len(c.spec.Payload) {
			t.Errorf("%s: fields %+v, payload %d", c.name, f, len(r.Payload))
		}
		if len(r.Contents) != bth.RCWriteOnlyImm.Info().HdrLen {
			t.Errorf("%s: contents %d bytes", c.name, len(r.Contents))
		}
		res, err := icrc.CheckFrame(fr)
		if err != nil || r.ICRC() != res.Computed {
			t.Errorf("%s: layer ICRC %08x, computed %08x (%v)", c.name, r.ICRC(), res.Computed, err)
		}
		if g, ok := pkt.Layer(LayerTypeGRH).(*GRH); ok {
			if g.PayloadLen != uint16(bth.Len(bth.RCWriteOnlyImm, len(c.spec.Payload))) || !g.SGID.Equal(v6a.AsSlice()) || g.NextHeader != GRHNextHeaderBTH {
				t.Errorf("%s: GRH %+v", c.name, g)
			}
			if pkt.NetworkLayer() == nil {
				t.Errorf("%s: no network layer", c.name)
			}
		}
	}
}

func TestNewPacketMalformed(t *testing.T) {
	fr := frame(t, writeSpec(icrc.KindRoCEv2IPv4, v4a, v4b, nil, 0))
	fr[42] = 0x1e // reserved opcode
	pkt := gopacket.NewPacket(fr, layers.LayerTypeEthernet, gopacket.Default)
	if pkt.ErrorLayer() == nil {
		t.Error("reserved opcode decoded without error")
	}
	// A truncated RoCEv1 frame must not panic.
	v1 := frame(t, writeSpec(icrc.KindRoCEv1, v6a, v6b, nil, 100))
	for cut := 0; cut < len(v1); cut++ {
		gopacket.NewPacket(v1[:cut], layers.LayerTypeEthernet, gopacket.Default)
	}
}

func TestDecodingLayerParserAllocs(t *testing.T) {
	var d Decoded
	p := NewParser(&d)
	decoded := make([]gopacket.LayerType, 0, 16)
	frames := [][]byte{
		frame(t, writeSpec(icrc.KindRoCEv2IPv4, v4a, v4b, nil, 4096)),
		frame(t, writeSpec(icrc.KindRoCEv2IPv4, v4a, v4b, []uint16{5}, 100)),
		frame(t, writeSpec(icrc.KindRoCEv2IPv6, v6a, v6b, nil, 1024)),
		frame(t, writeSpec(icrc.KindRoCEv1, v6a, v6b, nil, 64)),
	}
	for i, fr := range frames {
		if err := p.DecodeLayers(fr, &decoded); err != nil {
			t.Fatalf("frame %d: %v (decoded %v)", i, err, decoded)
		}
		if decoded[len(decoded)-2] != LayerTypeRoCE || d.RoCE.Packet.BTH.PSN() != 77 {
			t.Fatalf("frame %d: decoded %v", i, decoded)
		}
	}
	for i, fr := range frames {
		n := testing.AllocsPerRun(200, func() {
			if err := p.DecodeLayers(fr, &decoded); err != nil {
				t.Fatal(err)
			}
		})
		if n != 0 {
			t.Errorf("frame %d: %v allocations per packet", i, n)
		}
	}
}

func BenchmarkDecodingLayerParser4K(b *testing.B) {
	var d Decoded
	p := NewParser(&d)
	decoded := make([]gopacket.LayerType, 0, 16)
	fr := frame(b, writeSpec(icrc.KindRoCEv2IPv4, v4a, v4b, nil, 4096))
	b.SetBytes(int64(len(fr)))
	b.ReportAllocs()
	for b.Loop() {
		if err := p.DecodeLayers(fr, &decoded); err != nil {
			b.Fatal(err)
		}
	}
}

// FuzzDecodingLayerParser: arbitrary frames never panic the RoCE and GRH
// decoders.
func FuzzDecodingLayerParser(f *testing.F) {
	f.Add(frame(f, writeSpec(icrc.KindRoCEv2IPv4, v4a, v4b, nil, 10)))
	f.Add(frame(f, writeSpec(icrc.KindRoCEv1, v6a, v6b, []uint16{3}, 10)))
	var d Decoded
	p := NewParser(&d)
	p.IgnorePanic = true // a panic must surface as a test failure
	decoded := make([]gopacket.LayerType, 0, 16)
	f.Fuzz(func(t *testing.T, b []byte) {
		_ = p.DecodeLayers(b, &decoded)
		var r RoCE
		_ = r.DecodeFromBytes(b, gopacket.NilDecodeFeedback)
		var g GRH
		_ = g.DecodeFromBytes(b, gopacket.NilDecodeFeedback)
	})
}
