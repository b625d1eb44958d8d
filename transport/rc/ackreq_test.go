package rc

import (
	"bytes"
	"slices"
	"testing"
	"time"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/transport/internal/enginetest"
	"github.com/softroce/softroce/wr"
)

// TestAckReqEvery64: a 200-packet WRITE asks for an ACK on every 64th
// packet and on its last (rxe's rate), and the responder answers each
// AckReq with at most one ACK: four for the message, where every 32nd
// packet asked for seven.
func TestAckReqEvery64(t *testing.T) {
	s := enginetest.NewSim(t, 1, enginetest.Impairment{})
	const start = 0xffffc0 // the PSNs wrap inside the message
	qps := s.Connect(enginetest.QPOpts{PMTU: 256, PSN: [2]uint32{start, 5}})
	var asked []int
	acks := 0
	s.TraceSent(func(i int, pk *bth.Packet) {
		switch {
		case i == 0 && pk.BTH.AckReq():
			asked = append(asked, bth.PSNDiff(pk.BTH.PSN(), start))
		case i == 1 && pk.Info.Op == bth.OpAck:
			acks++
		}
	})
	const n = 200 * 256
	lmr, local := s.Reg(0, n)
	rmr, remote := s.Reg(1, n)
	enginetest.Fill(local, 3)
	enginetest.MustPost(t, qps[0], &wr.SendWR{ID: 1, Opcode: wr.RDMAWrite, Flags: wr.Signaled,
		SGL: []wr.SGE{{Addr: lmr.Addr(), Length: n, LKey: lmr.LKey()}}, RemoteAddr: rmr.Addr(), RKey: rmr.RKey()})
	if wc := s.WaitWC(s.EP[0].SCQ, 1, time.Second); wc[0].Status != cq.Success {
		t.Fatalf("completion %+v", wc[0])
	}
	if !bytes.Equal(local, remote) {
		t.Fatal("data differs")
	}
	if want := []int{63, 127, 191, 199}; !slices.Equal(asked, want) {
		t.Fatalf("AckReq on packets %v, want %v", asked, want)
	}
	if acks < 1 || acks > 4 || qps[0].Stats().Retransmits != 0 {
		t.Fatalf("%d ACKs, %d retransmissions; want 1..4 ACKs, none", acks, qps[0].Stats().Retransmits)
	}
}

// TestRequesterWindow: with nothing acknowledged, the requester sends at
// most 512 PSNs and at most 1 MiB of payload, then waits: 256 packets at
// a path MTU of 4096, 512 at 1024 and at 256.
func TestRequesterWindow(t *testing.T) {
	for _, c := range []struct{ pmtu, want int }{{4096, 256}, {1024, 512}, {256, 512}} {
		s := enginetest.NewSim(t, 1, enginetest.Impairment{Loss: 1}) // no packet arrives
		qps := s.Connect(enginetest.QPOpts{PMTU: c.pmtu, Timeout: 14})
		sent := map[uint32]bool{}
		s.TraceSent(func(i int, pk *bth.Packet) {
			if i == 0 {
				sent[pk.BTH.PSN()] = true
			}
		})
		const n = 4 << 20
		lmr, _ := s.Reg(0, n)
		rmr, _ := s.Reg(1, n)
		enginetest.MustPost(t, qps[0], &wr.SendWR{ID: 1, Opcode: wr.RDMAWrite, Flags: wr.Signaled,
			SGL: []wr.SGE{{Addr: lmr.Addr(), Length: n, LKey: lmr.LKey()}}, RemoteAddr: rmr.Addr(), RKey: rmr.RKey()})
		s.Pump(func() bool { return false }, time.Millisecond) // well within the 67 ms ACK timeout
		if len(sent) != c.want || qps[0].Stats().Retransmits != 0 {
			t.Errorf("path MTU %d: %d PSNs sent (%d retransmissions) before an ACK, want %d", c.pmtu, len(sent), qps[0].Stats().Retransmits, c.want)
		}
	}
}
