package rc

import (
	"testing"
	"time"

	"github.com/softroce/softroce/transport/internal/enginetest"
	"github.com/softroce/softroce/wr"
)

// TestRCHopLimitTClass: every packet of an RC QP, requests and the
// responder's ACKs and READ responses alike, carries its own path's hop
// limit and traffic class (Path.HopLimit and TrafficClass).
func TestRCHopLimitTClass(t *testing.T) {
	s := enginetest.NewSim(t, 1, enginetest.Impairment{})
	qps := s.Connect(enginetest.QPOpts{Timeout: 14, Retry: 7, RNRRetry: 7})
	sides := [2]enginetest.IPFields{{Hop: 5, TC: 0x28}, {Hop: 9, TC: 0x61}}
	for i, qp := range qps {
		p := qp.Attr
		p.HopLimit, p.TrafficClass = sides[i].Hop, sides[i].TC
		qp.SetPath(p)
	}
	got := [2]*[]enginetest.IPFields{enginetest.TraceIPFields(s.EP[0].E), enginetest.TraceIPFields(s.EP[1].E)}
	lmr, _ := s.Reg(0, 16384)
	rmr, _ := s.Reg(1, 16384)
	enginetest.MustPost(t, qps[0], &wr.SendWR{ID: 1, Opcode: wr.RDMAWrite, Flags: wr.Signaled,
		SGL: []wr.SGE{{Addr: lmr.Addr(), Length: 5000, LKey: lmr.LKey()}}, RemoteAddr: rmr.Addr(), RKey: rmr.RKey()})
	enginetest.MustPost(t, qps[0], &wr.SendWR{ID: 2, Opcode: wr.RDMARead, Flags: wr.Signaled,
		SGL: []wr.SGE{{Addr: lmr.Addr() + 8192, Length: 3000, LKey: lmr.LKey()}}, RemoteAddr: rmr.Addr(), RKey: rmr.RKey()})
	s.WaitWC(s.EP[0].SCQ, 2, time.Second)
	for i := range got {
		if len(*got[i]) == 0 {
			t.Fatalf("side %d sent nothing", i)
		}
		for k, f := range *got[i] {
			if f != sides[i] {
				t.Fatalf("side %d packet %d: hop limit %d traffic class %#x, want %+v", i, k, f.Hop, f.TC, sides[i])
			}
		}
	}
}
