package cm

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/softroce/softroce/bth/mad"
)

// rawMAD is a 256-byte MAD with the given header fields and a payload
// pattern, so an answer's body can be compared.
func rawMAD(class, version uint8, method mad.Method, attr mad.AttrID) []byte {
	b := make([]byte, MADSize)
	b[0], b[1], b[2], b[3] = mad.BaseVersion, class, version, byte(method)
	binary.BigEndian.PutUint64(b[8:], 0x1122334455667788)
	binary.BigEndian.PutUint16(b[16:], uint16(attr))
	binary.BigEndian.PutUint32(b[20:], 0xa5a5a5a5)
	for i := 24; i < len(b); i++ {
		b[i] = byte(i)
	}
	return b
}

// A Get or Set that nothing on QP1 serves is answered as the kernel's MAD
// layer answers it (a host whose only QP1 agent is the CM): the same MAD
// with method GetResp and status 0x000C. SMPs, other methods, other base
// versions, and CM attributes other than ClassPortInfo with a method other
// than Send are dropped without an answer.
func TestUnsupportedGetSetAnswered(t *testing.T) {
	tx := &recTx{}
	e := newEngine(Config{Seed: 1}, tx, func(*event) { t.Error("event for an unsupported MAD") })
	from := Peer{netip.MustParseAddrPort("10.0.0.9:4791"), 1}
	answered := []struct {
		name string
		b    []byte
	}{
		{"PerfMgmt Get PortCounters", rawMAD(0x04, 1, mad.MethodGet, 0x0012)},
		{"SA Get ClassPortInfo", rawMAD(0x03, 2, mad.MethodGet, mad.AttrClassPortInfo)},
		{"DevMgmt Set", rawMAD(0x06, 1, mad.MethodSet, 0x0010)},
		{"vendor class Get", rawMAD(0x09, 1, mad.MethodGet, 0x0001)},
		{"CM Get ClassPortInfo", rawMAD(mad.ClassCM, mad.CMClassVersion, mad.MethodGet, mad.AttrClassPortInfo)},
		{"CM Set ClassPortInfo, class version 1", rawMAD(mad.ClassCM, 1, mad.MethodSet, mad.AttrClassPortInfo)},
	}
	for i, c := range answered {
		e.Receive(t0, from, c.b)
		if len(tx.sent) != i+1 {
			t.Fatalf("%s: no answer", c.name)
		}
		r := tx.sent[i]
		want := append([]byte(nil), c.b...)
		want[3] = byte(mad.MethodGetResp)
		want[4], want[5] = 0x00, 0x0c
		if !bytes.Equal(r, want) {
			t.Errorf("%s: answer\n%x\nwant\n%x", c.name, r[:32], want[:32])
		}
	}
	silent := []struct {
		name string
		b    []byte
	}{
		{"LID-routed SMP Get", rawMAD(0x01, 1, mad.MethodGet, 0x0015)},
		{"directed-route SMP Get", rawMAD(0x81, 1, mad.MethodGet, 0x0015)},
		{"PerfMgmt GetResp", rawMAD(0x04, 1, mad.MethodGetResp, 0x0012)},
		{"SA Report", rawMAD(0x03, 2, mad.MethodReport, 0x0002)},
		{"PerfMgmt Send", rawMAD(0x04, 1, mad.MethodSend, 0x0012)},
		{"base version 2 Get", func() []byte { b := rawMAD(0x04, 1, mad.MethodGet, 0x0012); b[0] = 2; return b }()},
		{"CM Get of a REQ", rawMAD(mad.ClassCM, mad.CMClassVersion, mad.MethodGet, mad.AttrREQ)},
		{"CM Send of an unknown attribute", rawMAD(mad.ClassCM, mad.CMClassVersion, mad.MethodSend, 0x0030)},
		{"short Get", rawMAD(0x04, 1, mad.MethodGet, 0x0012)[:100]},
	}
	for _, c := range silent {
		n := len(tx.sent)
		e.Receive(t0, from, c.b)
		if len(tx.sent) != n {
			t.Errorf("%s: answered %x", c.name, tx.sent[n][:24])
		}
	}
	s := e.Stats()
	if s.Unsupported != uint64(len(answered)) || s.Sent != uint64(len(answered)) || s.Conns != 0 {
		t.Errorf("stats %+v, want %d answered", s, len(answered))
	}
	if got := s.Unsupported + s.Malformed + s.UnknownAttr; got != s.Received {
		t.Errorf("%d MADs received, %d counted once", s.Received, got)
	}
}
