package mad

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// FuzzParseMAD feeds arbitrary bytes to Parse: it must never panic, must
// fail only with a *ParseError, and for what it accepts every getter must
// work and writing each field back with its setter must leave the bytes
// unchanged (getters and setters agree on every offset and mask).
func FuzzParseMAD(f *testing.F) {
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Parse(b)
		if err != nil {
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("untyped error %T: %v", err, err)
			}
			if m != nil && len(m) != Len {
				t.Fatalf("view of %d bytes returned with %v", len(m), err)
			}
			return
		}
		orig := bytes.Clone(m)
		rewrite(t, m)
		if !bytes.Equal(orig, m) {
			for i := range m {
				if m[i] != orig[i] {
					t.Fatalf("%s: rewriting the fields changed byte %d: 0x%02x -> 0x%02x", m.AttrID(), i, orig[i], m[i])
				}
			}
		}
	})
}

// rewrite sets every field of m's message to the value its getter reads.
func rewrite(t *testing.T, m MAD) {
	m.SetBaseVersion(m.BaseVersion())
	m.SetMgmtClass(m.MgmtClass())
	m.SetClassVersion(m.ClassVersion())
	m.SetMethod(m.Method())
	m.SetStatus(m.Status())
	m.SetClassSpecific(m.ClassSpecific())
	m.SetTID(m.TID())
	m.SetAttrID(m.AttrID())
	m.SetAttrMod(m.AttrMod())
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	switch m.AttrID() {
	case AttrREQ:
		r := m.REQ()
		r.SetLocalCommID(r.LocalCommID())
		r.SetServiceID(r.ServiceID())
		r.SetLocalCAGUID(r.LocalCAGUID())
		r.SetLocalQKey(r.LocalQKey())
		r.SetLocalQPN(r.LocalQPN())
		r.SetResponderResources(r.ResponderResources())
		r.SetLocalEECN(r.LocalEECN())
		r.SetInitiatorDepth(r.InitiatorDepth())
		r.SetRemoteEECN(r.RemoteEECN())
		r.SetRemoteCMResponseTimeout(r.RemoteCMResponseTimeout())
		r.SetTransportType(r.TransportType())
		r.SetE2EFlowControl(r.E2EFlowControl())
		r.SetStartingPSN(r.StartingPSN())
		r.SetLocalCMResponseTimeout(r.LocalCMResponseTimeout())
		r.SetRetryCount(r.RetryCount())
		r.SetPKey(r.PKey())
		r.SetPathMTU(r.PathMTU())
		r.SetRDCExists(r.RDCExists())
		r.SetRNRRetryCount(r.RNRRetryCount())
		r.SetMaxCMRetries(r.MaxCMRetries())
		r.SetSRQ(r.SRQ())
		r.SetExtTransportType(r.ExtTransportType())
		for _, p := range []Path{r.Primary(), r.Alternate()} {
			p.SetLocalLID(p.LocalLID())
			p.SetRemoteLID(p.RemoteLID())
			p.SetLocalGID(p.LocalGID())
			p.SetRemoteGID(p.RemoteGID())
			p.SetFlowLabel(p.FlowLabel())
			p.SetPacketRate(p.PacketRate())
			p.SetTrafficClass(p.TrafficClass())
			p.SetHopLimit(p.HopLimit())
			p.SetSL(p.SL())
			p.SetSubnetLocal(p.SubnetLocal())
			p.SetLocalAckTimeout(p.LocalAckTimeout())
		}
		r.SetSAPSupported(r.SAPSupported())
		must(r.SetPrivateData(bytes.Clone(r.PrivateData())))
		rewriteCMA(r.PrivateData())
	case AttrMRA:
		r := m.MRA()
		r.SetLocalCommID(r.LocalCommID())
		r.SetRemoteCommID(r.RemoteCommID())
		r.SetMsgMRAed(r.MsgMRAed())
		r.SetServiceTimeout(r.ServiceTimeout())
		must(r.SetPrivateData(bytes.Clone(r.PrivateData())))
	case AttrREJ:
		r := m.REJ()
		r.SetLocalCommID(r.LocalCommID())
		r.SetRemoteCommID(r.RemoteCommID())
		r.SetMsgRejected(r.MsgRejected())
		r.SetReason(r.Reason())
		_ = r.Reason().String()
		// SetARI zeroes the ARI area past the length: only the length
		// and reason are rewritten here, ARI bytes are checked by view.
		r.SetARILength(r.ARILength())
		if len(r.ARI()) != int(r.ARILength()) {
			t.Fatalf("ARI view %d bytes, length %d", len(r.ARI()), r.ARILength())
		}
		must(r.SetPrivateData(bytes.Clone(r.PrivateData())))
	case AttrREP:
		r := m.REP()
		r.SetLocalCommID(r.LocalCommID())
		r.SetRemoteCommID(r.RemoteCommID())
		r.SetLocalQKey(r.LocalQKey())
		r.SetLocalQPN(r.LocalQPN())
		r.SetLocalEECN(r.LocalEECN())
		r.SetStartingPSN(r.StartingPSN())
		r.SetResponderResources(r.ResponderResources())
		r.SetInitiatorDepth(r.InitiatorDepth())
		r.SetTargetAckDelay(r.TargetAckDelay())
		r.SetFailoverAccepted(r.FailoverAccepted())
		r.SetE2EFlowControl(r.E2EFlowControl())
		r.SetRNRRetryCount(r.RNRRetryCount())
		r.SetSRQ(r.SRQ())
		r.SetLocalCAGUID(r.LocalCAGUID())
		must(r.SetPrivateData(bytes.Clone(r.PrivateData())))
	case AttrRTU:
		r := m.RTU()
		r.SetLocalCommID(r.LocalCommID())
		r.SetRemoteCommID(r.RemoteCommID())
		must(r.SetPrivateData(bytes.Clone(r.PrivateData())))
	case AttrDREQ:
		r := m.DREQ()
		r.SetLocalCommID(r.LocalCommID())
		r.SetRemoteCommID(r.RemoteCommID())
		r.SetRemoteQPN(r.RemoteQPN())
		must(r.SetPrivateData(bytes.Clone(r.PrivateData())))
	case AttrDREP:
		r := m.DREP()
		r.SetLocalCommID(r.LocalCommID())
		r.SetRemoteCommID(r.RemoteCommID())
		must(r.SetPrivateData(bytes.Clone(r.PrivateData())))
	case AttrSIDRREQ:
		r := m.SIDRREQ()
		r.SetRequestID(r.RequestID())
		r.SetPKey(r.PKey())
		r.SetServiceID(r.ServiceID())
		must(r.SetPrivateData(bytes.Clone(r.PrivateData())))
		rewriteCMA(r.PrivateData())
	case AttrSIDRREP:
		r := m.SIDRREP()
		r.SetRequestID(r.RequestID())
		r.SetStatus(r.Status())
		r.SetQPN(r.QPN())
		r.SetServiceID(r.ServiceID())
		r.SetQKey(r.QKey())
		_ = r.Info()
		must(r.SetPrivateData(bytes.Clone(r.PrivateData())))
	case AttrLAP:
		_ = m.LAP().RemoteQPN()
	case AttrAPR:
		_ = m.APR().APStatus()
	}
	_, _, _ = m.CommIDs()
}

// rewriteCMA rewrites a valid cma_hdr's fields (an invalid one is only read).
func rewriteCMA(pd []byte) {
	h, err := ParseCMAHeader(pd)
	if err != nil {
		if h != nil {
			_, _, _ = h.SrcAddr(), h.DstAddr(), h.Port()
		}
		return
	}
	src, dst := h.SrcAddr(), h.DstAddr()
	if h.IPVersion() == 4 && (!bytes.Equal(h[4:16], make([]byte, 12)) || !bytes.Equal(h[20:32], make([]byte, 12))) {
		return // IPv4 with bytes in the pad: the setter writes the canonical form
	}
	h.SetIPVersion(h.IPVersion())
	h.SetPort(h.Port())
	h.SetSrcAddr(src)
	h.SetDstAddr(dst)
}

// seedMADs are synthetic MADs of every message, valid and not.
func seedMADs() [][]byte {
	var seeds [][]byte
	add := func(attr AttrID, fill func(m MAD)) {
		m := MAD(make([]byte, Len)).Init(attr, 0x0000000252b5cf34)
		fill(m)
		seeds = append(seeds, m)
	}
	src := netip.MustParseAddrPort("192.0.2.1:40000")
	dst := netip.MustParseAddr("192.0.2.2")
	add(AttrREQ, func(m MAD) {
		r := m.REQ()
		r.SetLocalCommID(0x11111111)
		r.SetServiceID(RDMACMServiceID(PortSpaceTCP, 7174))
		r.SetLocalQPN(0x11)
		r.SetResponderResources(1)
		r.SetInitiatorDepth(1)
		r.SetRemoteCMResponseTimeout(20)
		r.SetStartingPSN(0xabcdef)
		r.SetLocalCMResponseTimeout(20)
		r.SetRetryCount(7)
		r.SetPKey(0xffff)
		r.SetPathMTU(3)
		r.SetRNRRetryCount(7)
		r.SetMaxCMRetries(15)
		r.Primary().SetLocalLID(0xffff)
		r.Primary().SetRemoteLID(0xffff)
		r.Primary().SetLocalGID(src.Addr())
		r.Primary().SetRemoteGID(dst)
		r.Primary().SetHopLimit(64)
		r.Primary().SetLocalAckTimeout(19)
		r.CMAHeader().Encode(src, dst)
	})
	add(AttrREP, func(m MAD) {
		r := m.REP()
		r.SetLocalCommID(0x22222222)
		r.SetRemoteCommID(0x11111111)
		r.SetLocalQPN(0x12)
		r.SetStartingPSN(0x123456)
		r.SetRNRRetryCount(7)
	})
	add(AttrRTU, func(m MAD) { m.RTU().SetLocalCommID(0x11111111); m.RTU().SetRemoteCommID(0x22222222) })
	add(AttrREJ, func(m MAD) {
		m.REJ().SetRemoteCommID(0x11111111)
		m.REJ().SetReason(RejInvalidServiceID)
	})
	add(AttrREJ, func(m MAD) {
		m.REJ().SetReason(RejConsumerDefined)
		_ = m.REJ().SetARI([]byte{1, 2, 3})
		_ = m.REJ().SetPrivateData([]byte("busy"))
	})
	add(AttrMRA, func(m MAD) { m.MRA().SetMsgMRAed(MRAedREP); m.MRA().SetServiceTimeout(20) })
	add(AttrDREQ, func(m MAD) { m.DREQ().SetRemoteQPN(0x12) })
	add(AttrDREP, func(m MAD) { m.DREP().SetLocalCommID(0x22222222) })
	add(AttrSIDRREQ, func(m MAD) {
		m.SIDRREQ().SetServiceID(RDMACMServiceID(PortSpaceUDP, 7174))
		m.SIDRREQ().CMAHeader().Encode(netip.MustParseAddrPort("[2001:db8::1]:5000"), netip.MustParseAddr("2001:db8::2"))
	})
	add(AttrSIDRREP, func(m MAD) { m.SIDRREP().SetQPN(0x13); m.SIDRREP().SetQKey(RDMAUDPQKey) })
	add(AttrLAP, func(m MAD) {})
	add(AttrAPR, func(m MAD) {})
	add(AttrClassPortInfo, func(m MAD) { m.SetMethod(MethodGet) })
	// Refused: unknown attribute, wrong class version, REJ ARI too long, short.
	add(0x0020, func(m MAD) {})
	add(AttrREQ, func(m MAD) { m.SetClassVersion(1) })
	add(AttrREJ, func(m MAD) { m.REJ().SetARILength(100) })
	seeds = append(seeds, seeds[0][:100], nil)
	return seeds
}

func TestSeedsParse(t *testing.T) {
	seeds := seedMADs()
	ok := 0
	for _, s := range seeds {
		if _, err := Parse(s); err == nil {
			ok++
		}
	}
	if ok != 13 || len(seeds)-ok != 5 {
		t.Errorf("%d seeds parse, %d refused; want 13 and 5", ok, len(seeds)-ok)
	}
}

// TestWriteFuzzSeeds regenerates testdata/fuzz/FuzzParseMAD when
// SOFTROCE_WRITE_SEEDS=1.
func TestWriteFuzzSeeds(t *testing.T) {
	if os.Getenv("SOFTROCE_WRITE_SEEDS") != "1" {
		t.Skip("set SOFTROCE_WRITE_SEEDS=1 to regenerate the fuzz seeds")
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzParseMAD")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for i, s := range seedMADs() {
		data := "go test fuzz v1\n[]byte(" + strconv.Quote(string(s)) + ")\n"
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%03d", i)), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
