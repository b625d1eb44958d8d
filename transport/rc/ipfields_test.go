package rc

import (
	"testing"
	"time"

	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/transport/engine"
	"github.com/softroce/softroce/wr"
)

type ipFields struct{ hop, tc uint8 }

// traceIPFields records the HopLimit and TClass of the packets an engine
// hands out.
func traceIPFields(e *engine.Engine) *[]ipFields {
	var out []ipFields
	e.SetPacketTrace(func(dir byte, p *nic.Packet) {
		if dir == 'T' {
			out = append(out, ipFields{p.HopLimit, p.TClass})
		}
	})
	return &out
}

// TestUDHopLimitTClass: a UD SEND leaves with its address handle's hop
// limit and traffic class (the link's IP TTL and TOS, as rxe sends them),
// and a handle without them asks for the link's defaults (0, 0).
func TestUDHopLimitTClass(t *testing.T) {
	s := newSim(t, 1, impairment{})
	qps := s.udQPs(udOpts{})
	got := traceIPFields(s.ep[0].e)
	lmr, _ := s.reg(0, 64)
	want := []ipFields{{7, 46<<2 | 1}, {0, 0}, {255, 0x03}, {1, 0}}
	for i, f := range want {
		w := s.udSend(0, qps[1], uint64(i), wr.SGE{Addr: lmr.Addr(), Length: 8, LKey: lmr.LKey()})
		w.AH.HopLimit, w.AH.TrafficClass = f.hop, f.tc
		mustPost(t, qps[0], w)
	}
	s.pump(nil, time.Millisecond)
	if len(*got) != len(want) {
		t.Fatalf("%d packets, want %d", len(*got), len(want))
	}
	for i, f := range *got {
		if f != want[i] {
			t.Errorf("packet %d: hop limit %d traffic class %#x, want %d %#x", i, f.hop, f.tc, want[i].hop, want[i].tc)
		}
	}
}

// TestRCHopLimitTClass: every packet of an RC QP, requests and the
// responder's ACKs and READ responses alike, carries its own path's hop
// limit and traffic class (Path.HopLimit and TrafficClass).
func TestRCHopLimitTClass(t *testing.T) {
	s := newSim(t, 1, impairment{})
	qps := s.connect(qpOpts{timeout: 14, retry: 7, rnrRetry: 7})
	sides := [2]ipFields{{5, 0x28}, {9, 0x61}}
	for i, qp := range qps {
		p := qp.Attr
		p.HopLimit, p.TrafficClass = sides[i].hop, sides[i].tc
		qp.SetPath(p)
	}
	got := [2]*[]ipFields{traceIPFields(s.ep[0].e), traceIPFields(s.ep[1].e)}
	lmr, _ := s.reg(0, 16384)
	rmr, _ := s.reg(1, 16384)
	mustPost(t, qps[0], &wr.SendWR{ID: 1, Opcode: wr.RDMAWrite, Flags: wr.Signaled,
		SGL: []wr.SGE{{Addr: lmr.Addr(), Length: 5000, LKey: lmr.LKey()}}, RemoteAddr: rmr.Addr(), RKey: rmr.RKey()})
	mustPost(t, qps[0], &wr.SendWR{ID: 2, Opcode: wr.RDMARead, Flags: wr.Signaled,
		SGL: []wr.SGE{{Addr: lmr.Addr() + 8192, Length: 3000, LKey: lmr.LKey()}}, RemoteAddr: rmr.Addr(), RKey: rmr.RKey()})
	s.waitWC(s.ep[0].scq, 2, time.Second)
	for i := range got {
		if len(*got[i]) == 0 {
			t.Fatalf("side %d sent nothing", i)
		}
		for k, f := range *got[i] {
			if f != sides[i] {
				t.Fatalf("side %d packet %d: hop limit %d traffic class %#x, want %+v", i, k, f.hop, f.tc, sides[i])
			}
		}
	}
}
