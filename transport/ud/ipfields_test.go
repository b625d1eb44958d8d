package ud

import (
	"testing"
	"time"

	"github.com/softroce/softroce/transport/internal/enginetest"
	"github.com/softroce/softroce/wr"
)

// TestUDHopLimitTClass: a UD SEND leaves with its address handle's hop
// limit and traffic class (the link's IP TTL and TOS, as rxe sends them),
// and a handle without them asks for the link's defaults (0, 0).
func TestUDHopLimitTClass(t *testing.T) {
	s := enginetest.NewSim(t, 1, enginetest.Impairment{})
	qps := s.UDQPs(enginetest.UDOpts{})
	got := enginetest.TraceIPFields(s.EP[0].E)
	lmr, _ := s.Reg(0, 64)
	want := []enginetest.IPFields{{Hop: 7, TC: 46<<2 | 1}, {Hop: 0, TC: 0}, {Hop: 255, TC: 0x03}, {Hop: 1, TC: 0}}
	for i, f := range want {
		w := s.UDSend(0, qps[1], uint64(i), wr.SGE{Addr: lmr.Addr(), Length: 8, LKey: lmr.LKey()})
		w.AH.HopLimit, w.AH.TrafficClass = f.Hop, f.TC
		enginetest.MustPost(t, qps[0], w)
	}
	s.Pump(nil, time.Millisecond)
	if len(*got) != len(want) {
		t.Fatalf("%d packets, want %d", len(*got), len(want))
	}
	for i, f := range *got {
		if f != want[i] {
			t.Errorf("packet %d: hop limit %d traffic class %#x, want %d %#x", i, f.Hop, f.TC, want[i].Hop, want[i].TC)
		}
	}
}
