package ud

import (
	"bytes"
	"encoding/hex"
	"net/netip"
	"strings"
	"testing"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/wr"
)

func unhex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestSendQKeyHighBitMeansTheQPs(t *testing.T) {
	for _, c := range []struct{ wr, qp, want uint32 }{
		{0x11111111, 0x22222222, 0x11111111},
		{0x80000000, 0x22222222, 0x22222222},
		{0x80010000, 0x80010000, 0x80010000},
		{0xffffffff, 0x01234567, 0x01234567},
		{0x7fffffff, 0x01234567, 0x7fffffff},
	} {
		if got := SendQKey(c.wr, c.qp); got != c.want {
			t.Errorf("SendQKey(%#x, %#x) = %#x, want %#x", c.wr, c.qp, got, c.want)
		}
	}
}

func TestQKeyToSendQP1(t *testing.T) {
	if got := QKeyToSend(GSIQPN, 0x1234, 0x5678); got != GSIQKey {
		t.Errorf("QP1 sends %#x, want 0x80010000", got)
	}
	if got := QKeyToSend(2, 0x1234, 0x5678); got != 0x1234 {
		t.Errorf("QP 2 sends %#x, want the work request's", got)
	}
	if got := QKeyToSend(2, 0x80001234, 0x5678); got != 0x5678 {
		t.Errorf("QP 2 with the high bit sends %#x, want the QP's", got)
	}
}

func TestAcceptQKey(t *testing.T) {
	for _, c := range []struct {
		qpn, qp, got uint32
		ok           bool
	}{
		{0x11, 0x1234, 0x1234, true},
		{0x11, 0x1234, 0x1235, false},
		{0x11, 0x80010000, 0x80010000, true},
		{GSIQPN, GSIQKey, GSIQKey, true},
		{GSIQPN, 0, GSIQKey, true},      // QP1's key is fixed
		{GSIQPN, 0x1234, 0x1234, false}, // whatever it was given
		{GSIQPN, GSIQKey, 0x80010001, false},
	} {
		if ok := AcceptQKey(c.qpn, c.qp, c.got); ok != c.ok {
			t.Errorf("AcceptQKey(qpn %d, qp %#x, got %#x) = %v, want %v", c.qpn, c.qp, c.got, ok, c.ok)
		}
	}
}

func TestWriteHeadersSendOnlyImmBytes(t *testing.T) {
	buf := make([]byte, 64)
	for i := range buf {
		buf[i] = 0xee
	}
	s := Send{Opcode: wr.SendWithImm, DestQP: 1, SrcQP: 0x123456, QKey: 0x80010000, PSN: 0xabc, Imm: 0xdeadbeef, Solicited: true}
	n := WriteHeaders(buf, &s, 3)
	if n != 32 {
		t.Fatalf("length %d, want 32", n)
	}
	copy(buf[PayloadOffset(s.Opcode):], "abc")
	want := unhex(t, "65 90 ffff 00000001 00000abc"+ // BTH: opcode, SE|pad 1, P_Key, DestQP, PSN (no AckReq)
		"80010000 00123456"+ // DETH: Q_Key, source QP
		"deadbeef"+ // ImmDt
		"616263 00"+ // payload, pad
		"00000000") // ICRC slot
	if !bytes.Equal(buf[:n], want) {
		t.Fatalf("packet\n got %x\nwant %x", buf[:n], want)
	}
	var p bth.Packet
	if err := bth.Parse(&p, buf[:n]); err != nil {
		t.Fatal(err)
	}
	if p.Info.Transport != bth.TransportUD || p.DETH.QKey() != 0x80010000 || p.DETH.SrcQP() != 0x123456 || string(p.Payload) != "abc" {
		t.Fatalf("parsed back: %+v payload %q", p.Fields(), p.Payload)
	}
}

func TestWriteHeadersSendOnlyBytes(t *testing.T) {
	buf := make([]byte, 64)
	s := Send{Opcode: wr.Send, DestQP: 0xabcdef, SrcQP: 0x11, QKey: 0x01234567, PSN: 0xffffff}
	n := WriteHeaders(buf, &s, 4)
	copy(buf[PayloadOffset(s.Opcode):], "wxyz")
	want := unhex(t, "64 00 ffff 00abcdef 00ffffff 01234567 00000011 7778797a 00000000")
	if !bytes.Equal(buf[:n], want) {
		t.Fatalf("packet\n got %x\nwant %x", buf[:n], want)
	}
}

func TestWriteHeadersRefuses(t *testing.T) {
	buf := make([]byte, 64)
	if n := WriteHeaders(buf, &Send{Opcode: wr.RDMAWrite}, 0); n != -1 {
		t.Errorf("RDMA WRITE on UD: %d, want -1", n)
	}
	if n := WriteHeaders(buf[:20], &Send{Opcode: wr.Send}, 8); n != -1 {
		t.Errorf("short buffer: %d, want -1", n)
	}
	if _, err := Opcode(wr.RDMARead); err == nil {
		t.Error("Opcode(RDMA_READ) succeeded")
	}
}

func TestFlowLabelToUDPSport(t *testing.T) {
	for _, c := range []struct {
		fl   uint32
		port uint16
	}{
		{0, 0xc000},
		{1, 0xc001},
		{0x12345, 0xe341}, // 0x2345 ^ 0x4
		{0xfffff, 0xffc0}, // 0x3fff ^ 0x3f
		{0x04000, 0xc001}, // a high bit folds onto bit 0
	} {
		if got := FlowLabelToUDPSport(c.fl); got != c.port {
			t.Errorf("FlowLabelToUDPSport(%#x) = %#x, want %#x", c.fl, got, c.port)
		}
	}
	if got := SrcPort(0, 0xd123); got != 0xd123 {
		t.Errorf("SrcPort without a flow label = %#x, want the QP's 0xd123", got)
	}
	if got := SrcPort(0x12345, 0xd123); got != 0xe341 {
		t.Errorf("SrcPort(0x12345) = %#x, want 0xe341", got)
	}
}

// The IPv4 layout: 20 zero bytes, then the header as it was on the wire.
// The header here is a well-known one whose checksum (0xb861) was
// computed elsewhere.
func TestWriteGRHIPv4(t *testing.T) {
	g := make([]byte, 40)
	for i := range g {
		g[i] = 0xee
	}
	h := IPHeader{Src: netip.MustParseAddr("192.168.0.1"), Dst: netip.MustParseAddr("192.168.0.199"),
		UDPLen: 0x73 - 20, TTL: 64, DF: true}
	if err := WriteGRH(g, &h); err != nil {
		t.Fatal(err)
	}
	want := unhex(t, "0000000000000000000000000000000000000000"+
		"45000073 00004000 4011b861 c0a80001 c0a800c7")
	if !bytes.Equal(g, want) {
		t.Fatalf("GRH\n got %x\nwant %x", g, want)
	}
	if a, err := SourceOfGRH(g); err != nil || a != h.Src {
		t.Fatalf("SourceOfGRH = %v, %v", a, err)
	}
	// TOS, ID, no DF.
	h = IPHeader{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), UDPLen: 48, TOS: 0x02, TTL: 1, ID: 0x1234}
	if err := WriteGRH(g, &h); err != nil {
		t.Fatal(err)
	}
	ip := g[20:]
	if ip[1] != 2 || ip[4] != 0x12 || ip[5] != 0x34 || ip[6] != 0 || ip[8] != 1 {
		t.Fatalf("header %x", ip)
	}
	if ipv4Checksum(ip) != 0 {
		t.Fatalf("checksum of %x does not verify", ip)
	}
}

func TestWriteGRHIPv6(t *testing.T) {
	g := make([]byte, 40)
	h := IPHeader{Src: netip.MustParseAddr("fe80::1"), Dst: netip.MustParseAddr("fd00::abcd"),
		UDPLen: 48, TOS: 0x12, FlowLabel: 0x34567, TTL: 64}
	if err := WriteGRH(g, &h); err != nil {
		t.Fatal(err)
	}
	want := unhex(t, "61234567 0030 11 40"+
		"fe800000000000000000000000000001"+
		"fd00000000000000000000000000abcd")
	if !bytes.Equal(g, want) {
		t.Fatalf("GRH\n got %x\nwant %x", g, want)
	}
	if a, err := SourceOfGRH(g); err != nil || a != h.Src {
		t.Fatalf("SourceOfGRH = %v, %v", a, err)
	}
}

func TestWriteGRHRefuses(t *testing.T) {
	g := make([]byte, 40)
	h := IPHeader{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("fe80::1")}
	if err := WriteGRH(g, &h); err == nil {
		t.Error("mixed families accepted")
	}
	if err := WriteGRH(g[:39], &IPHeader{Src: h.Src, Dst: h.Src}); err == nil {
		t.Error("short buffer accepted")
	}
	if _, err := SourceOfGRH(make([]byte, 40)); err == nil {
		t.Error("SourceOfGRH of zeros succeeded")
	}
}

func TestWriteHeadersNoAlloc(t *testing.T) {
	buf := make([]byte, 64)
	g := make([]byte, 40)
	s := Send{Opcode: wr.Send, DestQP: 1, SrcQP: 2, QKey: 3}
	h := IPHeader{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), UDPLen: 48}
	if n := testing.AllocsPerRun(100, func() {
		WriteHeaders(buf, &s, 8)
		_ = WriteGRH(g, &h)
	}); n != 0 {
		t.Fatalf("%v allocations per packet", n)
	}
}
