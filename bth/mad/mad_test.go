package mad

import (
	"bytes"
	"encoding/hex"
	"errors"
	"net/netip"
	"strings"
	"testing"
)

// put writes hex bytes at frame offset off (spaces ignored).
func put(t *testing.T, b []byte, off int, h string) {
	t.Helper()
	v, err := hex.DecodeString(strings.ReplaceAll(h, " ", ""))
	if err != nil {
		t.Fatal(err)
	}
	copy(b[off:], v)
}

// header writes the expected bytes of a CM Send header.
func header(t *testing.T, b []byte, attr string, tid string) {
	put(t, b, 0, "01 07 02 03 0000 0000")
	put(t, b, 8, tid)
	put(t, b, 16, attr+" 0000 00000000")
}

func check(t *testing.T, name string, got, want []byte) {
	t.Helper()
	if !bytes.Equal(got, want) {
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("%s: byte %d (data %d) = 0x%02x, want 0x%02x", name, i, i-HeaderLen, got[i], want[i])
			}
		}
	}
}

// TestREQBytes builds a REQ like the kernel's for rping over RoCEv2/IPv4
// and checks every byte against the table offsets (IBTA table 106, frame
// offset = 24 + table offset).
func TestREQBytes(t *testing.T) {
	buf := make([]byte, Len)
	m := MAD(buf).Init(AttrREQ, 0x0000000252b5cf34)
	r := m.REQ()
	r.SetLocalCommID(0x34cfb552)
	r.SetServiceID(RDMACMServiceID(PortSpaceTCP, 7471))
	r.SetLocalCAGUID(0x505400fffe0aaaba)
	r.SetLocalQPN(0x000011)
	r.SetResponderResources(1)
	r.SetInitiatorDepth(1)
	r.SetRemoteCMResponseTimeout(20)
	r.SetTransportType(TransportRC)
	r.SetStartingPSN(0xe1a47d)
	r.SetLocalCMResponseTimeout(20)
	r.SetRetryCount(7)
	r.SetPKey(0xffff)
	r.SetPathMTU(3)
	r.SetRNRRetryCount(7)
	r.SetMaxCMRetries(15)
	p := r.Primary()
	p.SetLocalLID(0xffff)
	p.SetRemoteLID(0xffff)
	p.SetLocalGID(netip.MustParseAddr("192.168.65.5"))
	p.SetRemoteGID(netip.MustParseAddr("192.168.65.4"))
	p.SetFlowLabel(0x00204)
	p.SetPacketRate(0x20)
	p.SetHopLimit(64)
	p.SetLocalAckTimeout(19)
	r.CMAHeader().Encode(netip.MustParseAddrPort("192.168.65.5:37847"), netip.MustParseAddr("192.168.65.4"))

	want := make([]byte, Len)
	header(t, want, "0010", "0000000252b5cf34")
	put(t, want, 24+0, "34cfb552 00000000")
	put(t, want, 24+8, "0000000001061d2f")
	put(t, want, 24+16, "505400fffe0aaaba")
	put(t, want, 24+32, "000011 01 000000 01 000000 a0 e1a47d a7 ffff 37 f0")
	put(t, want, 24+52, "ffff ffff")
	put(t, want, 24+56, "00000000000000000000ffff c0a84105")
	put(t, want, 24+72, "00000000000000000000ffff c0a84104")
	put(t, want, 24+88, "00204020 00 40 00 98")
	put(t, want, 24+140, "00 40 93d7 000000000000000000000000 c0a84105 000000000000000000000000 c0a84104")
	check(t, "REQ", m, want)

	if _, err := Parse(m); err != nil {
		t.Fatal(err)
	}
	// Every getter reads back what was set.
	got := []struct {
		name string
		v, w any
	}{
		{"LocalCommID", r.LocalCommID(), uint32(0x34cfb552)},
		{"ServiceID", r.ServiceID().String(), "RDMA_PS_TCP:7471"},
		{"ServiceID.Short", r.ServiceID().Short(), "0x106:7471"},
		{"LocalCAGUID", r.LocalCAGUID(), uint64(0x505400fffe0aaaba)},
		{"LocalQPN", r.LocalQPN(), uint32(0x11)},
		{"ResponderResources", r.ResponderResources(), uint8(1)},
		{"InitiatorDepth", r.InitiatorDepth(), uint8(1)},
		{"RemoteCMResponseTimeout", r.RemoteCMResponseTimeout(), uint8(20)},
		{"TransportType", r.TransportType(), uint8(0)},
		{"StartingPSN", r.StartingPSN(), uint32(0xe1a47d)},
		{"LocalCMResponseTimeout", r.LocalCMResponseTimeout(), uint8(20)},
		{"RetryCount", r.RetryCount(), uint8(7)},
		{"PKey", r.PKey(), uint16(0xffff)},
		{"PathMTU", r.PathMTU(), uint8(3)},
		{"RNRRetryCount", r.RNRRetryCount(), uint8(7)},
		{"MaxCMRetries", r.MaxCMRetries(), uint8(15)},
		{"LocalGID", p.LocalGID().Unmap().String(), "192.168.65.5"},
		{"RemoteGID", p.RemoteGID().Unmap().String(), "192.168.65.4"},
		{"FlowLabel", p.FlowLabel(), uint32(0x204)},
		{"PacketRate", p.PacketRate(), uint8(0x20)},
		{"HopLimit", p.HopLimit(), uint8(64)},
		{"LocalAckTimeout", p.LocalAckTimeout(), uint8(19)},
		{"cma IPVersion", r.CMAHeader().IPVersion(), uint8(4)},
		{"cma Port", r.CMAHeader().Port(), uint16(37847)},
		{"cma Src", r.CMAHeader().SrcAddr().String(), "192.168.65.5"},
		{"cma Dst", r.CMAHeader().DstAddr().String(), "192.168.65.4"},
		{"TID", m.TID(), uint64(0x252b5cf34)},
		{"Attr", m.AttrID().String(), "REQ"},
	}
	for _, g := range got {
		if g.v != g.w {
			t.Errorf("%s = %v, want %v", g.name, g.v, g.w)
		}
	}
}

// TestBitFieldsIsolated sets each bit field to all ones on a zeroed MAD
// and checks it touches only its own bits, then clears it back.
func TestBitFieldsIsolated(t *testing.T) {
	cases := []struct {
		name string
		off  int // frame offset
		mask string
		set  func(m MAD, all bool)
	}{
		{"REQ.RemoteCMResponseTimeout", 24 + 43, "f8", func(m MAD, a bool) { m.REQ().SetRemoteCMResponseTimeout(ones(a, 0x1f)) }},
		{"REQ.TransportType", 24 + 43, "06", func(m MAD, a bool) { m.REQ().SetTransportType(ones(a, 3)) }},
		{"REQ.E2EFlowControl", 24 + 43, "01", func(m MAD, a bool) { m.REQ().SetE2EFlowControl(a) }},
		{"REQ.LocalCMResponseTimeout", 24 + 47, "f8", func(m MAD, a bool) { m.REQ().SetLocalCMResponseTimeout(ones(a, 0x1f)) }},
		{"REQ.RetryCount", 24 + 47, "07", func(m MAD, a bool) { m.REQ().SetRetryCount(ones(a, 7)) }},
		{"REQ.PathMTU", 24 + 50, "f0", func(m MAD, a bool) { m.REQ().SetPathMTU(ones(a, 0xf)) }},
		{"REQ.RDCExists", 24 + 50, "08", func(m MAD, a bool) { m.REQ().SetRDCExists(a) }},
		{"REQ.RNRRetryCount", 24 + 50, "07", func(m MAD, a bool) { m.REQ().SetRNRRetryCount(ones(a, 7)) }},
		{"REQ.MaxCMRetries", 24 + 51, "f0", func(m MAD, a bool) { m.REQ().SetMaxCMRetries(ones(a, 0xf)) }},
		{"REQ.SRQ", 24 + 51, "08", func(m MAD, a bool) { m.REQ().SetSRQ(a) }},
		{"REQ.ExtTransportType", 24 + 51, "07", func(m MAD, a bool) { m.REQ().SetExtTransportType(ones(a, 7)) }},
		{"REQ.LocalQPN", 24 + 32, "ffffff00", func(m MAD, a bool) { m.REQ().SetLocalQPN(uint32(ones(a, 0xff)) * 0x10101) }},
		{"REQ.ResponderResources", 24 + 32, "000000ff", func(m MAD, a bool) { m.REQ().SetResponderResources(ones(a, 0xff)) }},
		{"REQ.StartingPSN", 24 + 44, "ffffff00", func(m MAD, a bool) { m.REQ().SetStartingPSN(uint32(ones(a, 0xff)) * 0x10101) }},
		{"REQ.Primary.FlowLabel", 24 + 88, "fffff000", func(m MAD, a bool) { m.REQ().Primary().SetFlowLabel(flowAll(a)) }},
		{"REQ.Primary.PacketRate", 24 + 91, "3f", func(m MAD, a bool) { m.REQ().Primary().SetPacketRate(ones(a, 0x3f)) }},
		{"REQ.Primary.SL", 24 + 94, "f0", func(m MAD, a bool) { m.REQ().Primary().SetSL(ones(a, 0xf)) }},
		{"REQ.Primary.SubnetLocal", 24 + 94, "08", func(m MAD, a bool) { m.REQ().Primary().SetSubnetLocal(a) }},
		{"REQ.Primary.LocalAckTimeout", 24 + 95, "f8", func(m MAD, a bool) { m.REQ().Primary().SetLocalAckTimeout(ones(a, 0x1f)) }},
		{"REQ.Alternate.LocalAckTimeout", 24 + 139, "f8", func(m MAD, a bool) { m.REQ().Alternate().SetLocalAckTimeout(ones(a, 0x1f)) }},
		{"REQ.SAPSupported", 24 + 139, "04", func(m MAD, a bool) { m.REQ().SetSAPSupported(a) }},
		{"REP.TargetAckDelay", 24 + 26, "f8", func(m MAD, a bool) { m.REP().SetTargetAckDelay(ones(a, 0x1f)) }},
		{"REP.FailoverAccepted", 24 + 26, "06", func(m MAD, a bool) { m.REP().SetFailoverAccepted(ones(a, 3)) }},
		{"REP.E2EFlowControl", 24 + 26, "01", func(m MAD, a bool) { m.REP().SetE2EFlowControl(a) }},
		{"REP.RNRRetryCount", 24 + 27, "e0", func(m MAD, a bool) { m.REP().SetRNRRetryCount(ones(a, 7)) }},
		{"REP.SRQ", 24 + 27, "10", func(m MAD, a bool) { m.REP().SetSRQ(a) }},
		{"REP.LocalQPN", 24 + 12, "ffffff00", func(m MAD, a bool) { m.REP().SetLocalQPN(uint32(ones(a, 0xff)) * 0x10101) }},
		{"REP.StartingPSN", 24 + 20, "ffffff00", func(m MAD, a bool) { m.REP().SetStartingPSN(uint32(ones(a, 0xff)) * 0x10101) }},
		{"MRA.MsgMRAed", 24 + 8, "c0", func(m MAD, a bool) { m.MRA().SetMsgMRAed(ones(a, 3)) }},
		{"MRA.ServiceTimeout", 24 + 9, "f8", func(m MAD, a bool) { m.MRA().SetServiceTimeout(ones(a, 0x1f)) }},
		{"REJ.MsgRejected", 24 + 8, "c0", func(m MAD, a bool) { m.REJ().SetMsgRejected(ones(a, 3)) }},
		{"REJ.ARILength", 24 + 9, "fe", func(m MAD, a bool) { m.REJ().SetARILength(ones(a, 0x7f)) }},
		{"REJ.Reason", 24 + 10, "ffff", func(m MAD, a bool) { m.REJ().SetReason(RejReason(uint16(ones(a, 0xff)) * 0x101)) }},
		{"DREQ.RemoteQPN", 24 + 8, "ffffff00", func(m MAD, a bool) { m.DREQ().SetRemoteQPN(uint32(ones(a, 0xff)) * 0x10101) }},
		{"SIDRREP.QPN", 24 + 8, "ffffff00", func(m MAD, a bool) { m.SIDRREP().SetQPN(uint32(ones(a, 0xff)) * 0x10101) }},
		{"SIDRREP.Status", 24 + 4, "ff", func(m MAD, a bool) { m.SIDRREP().SetStatus(ones(a, 0xff)) }},
	}
	for _, c := range cases {
		m := MAD(make([]byte, Len))
		c.set(m, true)
		want := make([]byte, Len)
		put(t, want, c.off, c.mask)
		check(t, c.name, m, want)
		// Setting over ones elsewhere keeps them.
		for i := range m {
			m[i] = 0xff
		}
		c.set(m, false)
		for i := range want {
			want[i] ^= 0xff
		}
		check(t, c.name+" cleared", m, want)
	}
}

func ones(all bool, v uint8) uint8 {
	if all {
		return v
	}
	return 0
}

func flowAll(all bool) uint32 {
	if all {
		return 0xfffff
	}
	return 0
}

// TestMessagesBytes builds each of the other messages and checks their
// bytes at the table offsets.
func TestMessagesBytes(t *testing.T) {
	t.Run("REP", func(t *testing.T) {
		m := MAD(make([]byte, Len)).Init(AttrREP, 0x252b5cf34)
		r := m.REP()
		r.SetLocalCommID(0xa980e2d3)
		r.SetRemoteCommID(0x34cfb552)
		r.SetLocalQPN(0x11)
		r.SetStartingPSN(0x8c84dd)
		r.SetResponderResources(1)
		r.SetInitiatorDepth(1)
		r.SetTargetAckDelay(15)
		r.SetRNRRetryCount(7)
		r.SetLocalCAGUID(0x505400fffebf4369)
		if err := r.SetPrivateData([]byte{0, 0, 0xaa, 0xab}); err != nil {
			t.Fatal(err)
		}
		want := make([]byte, Len)
		header(t, want, "0013", "0000000252b5cf34")
		put(t, want, 24, "a980e2d3 34cfb552 00000000 00001100 00000000 8c84dd00 01 01 78 e0 505400fffebf4369 0000aaab")
		check(t, "REP", m, want)
		if r.LocalQPN() != 0x11 || r.StartingPSN() != 0x8c84dd || r.TargetAckDelay() != 15 || r.RNRRetryCount() != 7 ||
			r.LocalCAGUID() != 0x505400fffebf4369 || len(r.PrivateData()) != 196 {
			t.Errorf("REP getters: qpn %#x psn %#x delay %d rnr %d guid %#x", r.LocalQPN(), r.StartingPSN(), r.TargetAckDelay(), r.RNRRetryCount(), r.LocalCAGUID())
		}
	})
	t.Run("REJ", func(t *testing.T) {
		m := MAD(make([]byte, Len)).Init(AttrREJ, 0x1234)
		r := m.REJ()
		r.SetLocalCommID(0)
		r.SetRemoteCommID(0x11223344)
		r.SetMsgRejected(RejectedREQ)
		r.SetReason(RejInvalidServiceID)
		if err := r.SetARI([]byte{9, 8, 7}); err != nil {
			t.Fatal(err)
		}
		if err := r.SetPrivateData([]byte("no")); err != nil {
			t.Fatal(err)
		}
		want := make([]byte, Len)
		header(t, want, "0012", "0000000000001234")
		put(t, want, 24, "00000000 11223344 00 06 0008 090807")
		put(t, want, 24+84, "6e6f")
		check(t, "REJ", m, want)
		if r.ARILength() != 3 || !bytes.Equal(r.ARI(), []byte{9, 8, 7}) || r.Reason().String() != "invalid service ID" {
			t.Errorf("REJ getters: ari %d %x reason %v", r.ARILength(), r.ARI(), r.Reason())
		}
		if err := r.SetARI(make([]byte, 73)); !errors.Is(err, ErrPrivateDataLen) {
			t.Errorf("ARI of 73 bytes: %v", err)
		}
		if err := r.SetPrivateData(make([]byte, 149)); !errors.Is(err, ErrPrivateDataLen) {
			t.Errorf("private data of 149 bytes: %v", err)
		}
	})
	t.Run("RTU DREQ DREP MRA", func(t *testing.T) {
		for _, c := range []struct {
			attr AttrID
			fill func(m MAD)
			data string
			pd   int
		}{
			{AttrRTU, func(m MAD) {
				m.RTU().SetLocalCommID(1)
				m.RTU().SetRemoteCommID(2)
				_ = m.RTU().SetPrivateData([]byte{0xee})
			}, "00000001 00000002 ee", 224},
			{AttrDREQ, func(m MAD) {
				m.DREQ().SetLocalCommID(1)
				m.DREQ().SetRemoteCommID(2)
				m.DREQ().SetRemoteQPN(0xabcdef)
				_ = m.DREQ().SetPrivateData([]byte{0xee})
			}, "00000001 00000002 abcdef00 ee", 220},
			{AttrDREP, func(m MAD) {
				m.DREP().SetLocalCommID(1)
				m.DREP().SetRemoteCommID(2)
				_ = m.DREP().SetPrivateData([]byte{0xee})
			}, "00000001 00000002 ee", 224},
			{AttrMRA, func(m MAD) {
				m.MRA().SetLocalCommID(1)
				m.MRA().SetRemoteCommID(2)
				m.MRA().SetMsgMRAed(MRAedREP)
				m.MRA().SetServiceTimeout(0x1f)
				_ = m.MRA().SetPrivateData([]byte{0xee})
			}, "00000001 00000002 40 f8 ee", 222},
		} {
			m := MAD(make([]byte, Len)).Init(c.attr, 7)
			c.fill(m)
			want := make([]byte, Len)
			header(t, want, strings.ToLower(hex.EncodeToString([]byte{0, byte(c.attr)})), "0000000000000007")
			put(t, want, 24, c.data)
			check(t, c.attr.String(), m, want)
			l, r, ok := m.CommIDs()
			if !ok || l != 1 || r != 2 {
				t.Errorf("%s CommIDs = %d %d %v", c.attr, l, r, ok)
			}
			var pd []byte
			switch c.attr {
			case AttrRTU:
				pd = m.RTU().PrivateData()
			case AttrDREQ:
				pd = m.DREQ().PrivateData()
			case AttrDREP:
				pd = m.DREP().PrivateData()
			case AttrMRA:
				pd = m.MRA().PrivateData()
			}
			if len(pd) != c.pd || pd[0] != 0xee || &pd[len(pd)-1] != &m[Len-1] {
				t.Errorf("%s private data: %d bytes, want %d ending at the MAD's end", c.attr, len(pd), c.pd)
			}
		}
	})
	t.Run("SIDR", func(t *testing.T) {
		m := MAD(make([]byte, Len)).Init(AttrSIDRREQ, 9)
		q := m.SIDRREQ()
		q.SetRequestID(0xcafe)
		q.SetPKey(0xffff)
		q.SetServiceID(RDMACMServiceID(PortSpaceUDP, 7174))
		q.CMAHeader().Encode(netip.MustParseAddrPort("[fe80::1]:5000"), netip.MustParseAddr("fe80::2"))
		want := make([]byte, Len)
		header(t, want, "0017", "0000000000000009")
		put(t, want, 24, "0000cafe ffff0000 0000000001111c06 00 60 1388 fe800000000000000000000000000001 fe800000000000000000000000000002")
		check(t, "SIDR_REQ", m, want)
		if h, err := ParseCMAHeader(q.PrivateData()); err != nil || h.SrcAddr().String() != "fe80::1" || h.DstAddr().String() != "fe80::2" || h.Port() != 5000 {
			t.Errorf("cma_hdr: %v %v %v %d", err, h.SrcAddr(), h.DstAddr(), h.Port())
		}
		if q.ServiceID().String() != "RDMA_PS_UDP:7174" {
			t.Errorf("service %v", q.ServiceID())
		}

		m = MAD(make([]byte, Len)).Init(AttrSIDRREP, 9)
		p := m.SIDRREP()
		p.SetRequestID(0xcafe)
		p.SetStatus(SIDRSuccess)
		p.SetQPN(0x12)
		p.SetServiceID(RDMACMServiceID(PortSpaceUDP, 7174))
		p.SetQKey(RDMAUDPQKey)
		if err := p.SetInfo([]byte{1, 2}); err != nil {
			t.Fatal(err)
		}
		want = make([]byte, Len)
		header(t, want, "0018", "0000000000000009")
		put(t, want, 24, "0000cafe 00 02 0000 00001200 0000000001111c06 01234567 0102")
		check(t, "SIDR_REP", m, want)
		if _, err := Parse(m); err != nil {
			t.Fatal(err)
		}
	})
}

func TestParseRefuses(t *testing.T) {
	good := func() MAD {
		m := MAD(make([]byte, Len)).Init(AttrREJ, 1)
		m.REJ().SetReason(RejConsumerDefined)
		return m
	}
	cases := []struct {
		name string
		edit func(m MAD) []byte
		kind *ParseError
	}{
		{"short", func(m MAD) []byte { return m[:255] }, ErrKindLength},
		{"long", func(m MAD) []byte { return append(m, 0) }, ErrKindLength},
		{"empty", func(m MAD) []byte { return nil }, ErrKindLength},
		{"base version", func(m MAD) []byte { m[0] = 2; return m }, ErrKindBaseVersion},
		{"class", func(m MAD) []byte { m[1] = 0x03; return m }, ErrKindClass},
		{"class version", func(m MAD) []byte { m[2] = 1; return m }, ErrKindClassVersion},
		{"method", func(m MAD) []byte { m.SetMethod(MethodGet); return m }, ErrKindMethod},
		{"attribute", func(m MAD) []byte { m.SetAttrID(0x0020); return m }, ErrKindAttribute},
		{"REJ msg code", func(m MAD) []byte { m.REJ().SetMsgRejected(3); return m }, ErrKindField},
		{"REJ ARI length", func(m MAD) []byte { m.REJ().SetARILength(73); return m }, ErrKindField},
		{"MRA msg code", func(m MAD) []byte { m.SetAttrID(AttrMRA); m.MRA().SetMsgMRAed(3); return m }, ErrKindField},
		{"SIDR_REP info", func(m MAD) []byte { m.SetAttrID(AttrSIDRREP); m[HeaderLen+5] = 80; return m }, ErrKindField},
		{"APR info", func(m MAD) []byte { m.SetAttrID(AttrAPR); m[HeaderLen+8] = 80; return m }, ErrKindField},
		{"ClassPortInfo Send", func(m MAD) []byte { m.SetAttrID(AttrClassPortInfo); return m }, ErrKindMethod},
	}
	for _, c := range cases {
		b := c.edit(good())
		v, err := Parse(b)
		if !errors.Is(err, c.kind) {
			t.Errorf("%s: err %v, want kind %v", c.name, err, c.kind.Kind)
			continue
		}
		var pe *ParseError
		if !errors.As(err, &pe) || pe.Error() == "" {
			t.Errorf("%s: not a *ParseError", c.name)
		}
		if (c.kind == ErrKindLength) != (v == nil) {
			t.Errorf("%s: view %v returned with a %v", c.name, v != nil, pe.Kind)
		}
	}
	m := good()
	m.SetAttrID(AttrClassPortInfo)
	m.SetMethod(MethodGet)
	if _, err := Parse(m); err != nil {
		t.Errorf("ClassPortInfo Get: %v", err)
	}
	if _, err := Parse(good()); err != nil {
		t.Errorf("good REJ: %v", err)
	}
}

func TestNames(t *testing.T) {
	for r := RejReason(1); r <= 33; r++ {
		if !r.Known() || strings.HasPrefix(r.String(), "reason") {
			t.Errorf("reason %d has no name", r)
		}
	}
	if RejReason(34).Known() || RejReason(34).String() != "reason 34" {
		t.Errorf("reason 34: %q", RejReason(34))
	}
	for _, c := range []struct{ got, want string }{
		{RejInvalidServiceID.String(), "invalid service ID"},
		{RejStaleConn.String(), "stale connection"},
		{RejConsumerDefined.String(), "consumer defined"},
		{AttrSIDRREP.String(), "SIDR_REP"},
		{AttrID(0x99).String(), "Attr(0x0099)"},
		{MethodSend.String(), "Send"},
		{Method(0x42).String(), "Method(0x42)"},
		{PortSpaceTCP.String(), "RDMA_PS_TCP"},
		{PortSpaceUDP.String(), "RDMA_PS_UDP"},
		{PortSpaceIB.String(), "RDMA_PS_IB"},
		{PortSpace(7).String(), "PS(0x0007)"},
		{ServiceID(0x0000000001060000 | 7174).String(), "RDMA_PS_TCP:7174"},
		{ServiceID(0x0000000001060000 | 7174).Short(), "0x106:7174"},
		{ServiceID(0x1000000000000001).String(), "0x1000000000000001"},
		{SIDRStatusName(SIDRUnsupported), "service ID not supported"},
		{SIDRStatusName(9), "reserved"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
	s := RDMACMServiceID(PortSpaceIB, 1)
	if uint64(s) != 0x00000000013F0001 || !s.IsRDMACM() || s.PortSpace() != PortSpaceIB || s.Port() != 1 {
		t.Errorf("RDMA_PS_IB:1 = %#x", uint64(s))
	}
	for code, n := range map[uint8]int{0: 0, 1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096, 6: 0} {
		if PathMTUBytes(code) != n {
			t.Errorf("PathMTUBytes(%d) = %d, want %d", code, PathMTUBytes(code), n)
		}
	}
}

func TestCMAHeaderParse(t *testing.T) {
	pd := make([]byte, 56)
	if _, err := ParseCMAHeader(pd[:35]); !errors.Is(err, ErrCMAShort) {
		t.Errorf("35 bytes: %v", err)
	}
	if _, err := ParseCMAHeader(pd); !errors.Is(err, ErrCMAIPVersion) {
		t.Errorf("IP version 0: %v", err)
	}
	pd[0] = 1
	pd[1] = 0x40
	if _, err := ParseCMAHeader(pd); !errors.Is(err, ErrCMAVersion) {
		t.Errorf("version 1: %v", err)
	}
	h := CMAHeader(pd)
	h.Encode(netip.MustParseAddrPort("10.0.0.1:1"), netip.MustParseAddr("::ffff:10.0.0.2"))
	if h.IPVersion() != 4 || h.DstAddr().String() != "10.0.0.2" || !bytes.Equal(pd[20:32], make([]byte, 12)) {
		t.Errorf("mapped destination: v%d %v % x", h.IPVersion(), h.DstAddr(), pd[20:36])
	}
}

// TestBuildNoAlloc: building and parsing a REQ in a reused buffer allocates nothing.
func TestBuildNoAlloc(t *testing.T) {
	buf := make([]byte, Len)
	src := netip.MustParseAddrPort("192.168.1.1:4000")
	dst := netip.MustParseAddr("192.168.1.2")
	n := testing.AllocsPerRun(100, func() {
		m := MAD(buf).Init(AttrREQ, 42)
		r := m.REQ()
		r.SetLocalCommID(1)
		r.SetServiceID(RDMACMServiceID(PortSpaceTCP, 7174))
		r.SetLocalQPN(0x11)
		r.SetStartingPSN(0x123456)
		r.Primary().SetLocalGID(src.Addr())
		r.Primary().SetRemoteGID(dst)
		r.CMAHeader().Encode(src, dst)
		if _, err := Parse(m); err != nil {
			panic(err)
		}
		_ = r.CMAHeader().SrcAddr()
	})
	if n != 0 {
		t.Errorf("%v allocations per REQ", n)
	}
}
