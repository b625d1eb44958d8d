package rc

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/icrc"
	"github.com/softroce/softroce/memreg"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/qpstate"
	"github.com/softroce/softroce/transport/internal/enginetest"
	"github.com/softroce/softroce/wr"
)

// The RC benchmarks over the in-process wire, each with the ICRC on and
// off (enginetest.WithICRC): BenchmarkSend64/qps=1/icrc=on and so on.

func BenchmarkSend64(b *testing.B) {
	for _, n := range []int{1, 16} {
		b.Run(fmt.Sprintf("qps=%d", n), func(b *testing.B) {
			enginetest.WithICRC(b, func(b *testing.B, on bool) { enginetest.BenchService(b, qpstate.RC, n, wr.Send, 64, 4096, on) })
		})
	}
}

func BenchmarkWrite64K(b *testing.B) {
	for _, n := range []int{1, 16} {
		b.Run(fmt.Sprintf("qps=%d", n), func(b *testing.B) {
			enginetest.WithICRC(b, func(b *testing.B, on bool) {
				enginetest.BenchService(b, qpstate.RC, n, wr.RDMAWrite, 64<<10, 4096, on)
			})
		})
	}
}

func BenchmarkRead64K(b *testing.B) {
	enginetest.WithICRC(b, func(b *testing.B, on bool) {
		enginetest.BenchService(b, qpstate.RC, 1, wr.RDMARead, 64<<10, 4096, on)
	})
}

// TestWireICRC: the wire puts a correct ICRC on every packet it carries,
// checked independently of icrc.Synth against the IPv4 and UDP header a
// kernel socket would send, and both directions carry packets.
func TestWireICRC(t *testing.T) {
	w := enginetest.NewWire(t)
	pairs := w.Connect(t, 1, 1024, 64)
	lmr, _ := w.EP[0].MRs.RegMR(w.EP[0].PD, make([]byte, 8192), enginetest.AllAccess)
	rmr, _ := w.EP[1].MRs.RegMR(w.EP[1].PD, make([]byte, 8192), enginetest.AllAccess)
	var seen [2]int
	w.Tap = func(from int, p *nic.Packet) {
		roce := p.Bytes()
		ip := make([]byte, 20)
		ip[0] = 0x45
		binary.BigEndian.PutUint16(ip[2:], uint16(20+8+len(roce)))
		ip[6] = 0x40 // DF; ID 0, as Linux sends with IP_PMTUDISC_DO
		ip[8], ip[9] = 64, 17
		src, dst := w.EP[from].Addr.As4(), w.EP[1-from].Addr.As4()
		copy(ip[12:], src[:])
		copy(ip[16:], dst[:])
		udp := make([]byte, 8, 8+len(roce))
		binary.BigEndian.PutUint16(udp[0:], p.SrcPort)
		binary.BigEndian.PutUint16(udp[2:], nic.RoCEv2Port)
		binary.BigEndian.PutUint16(udp[4:], uint16(8+len(roce)))
		udp = append(udp, roce...)
		want, err := icrc.IPv4(ip, udp)
		if err != nil || icrc.Wire(roce) != want {
			t.Fatalf("packet from %d: ICRC %08x, want %08x (%v)", from, icrc.Wire(roce), want, err)
		}
		if p.ICRC != nic.ICRCVerified {
			t.Fatalf("packet from %d marked %v", from, p.ICRC)
		}
		seen[from]++
	}
	swr := wr.SendWR{Opcode: wr.RDMAWrite, Flags: wr.Signaled, SGL: []wr.SGE{{Addr: lmr.Addr(), Length: 8192, LKey: lmr.LKey()}}, RemoteAddr: rmr.Addr(), RKey: rmr.RKey()}
	wcs := make([]cq.WC, 8)
	for i := 0; i < 4; i++ {
		if err := pairs[0][0].PostSend(&swr); err != nil {
			t.Fatal(err)
		}
	}
	for got := 0; got < 4; {
		if w.Step() == 0 {
			t.Fatal("stalled")
		}
		got += w.EP[0].SCQ.Poll(wcs)
	}
	if seen[0] < 4*8 || seen[1] == 0 || seen != w.Moved {
		t.Fatalf("checked %v packets, the wire moved %v; want at least 32 requests and an ACK", seen, w.Moved)
	}
}

// TestSteadyStateNoAlloc: once buffers are warm, moving WRITE traffic
// allocates nothing per packet.
func TestSteadyStateNoAlloc(t *testing.T) {
	w := enginetest.NewWire(t)
	pairs := w.Connect(t, 1, 1024, 64)
	buf := make([]byte, 8192)
	lmr, _ := w.EP[0].MRs.RegMR(w.EP[0].PD, buf, enginetest.AllAccess)
	rmr, _ := w.EP[1].MRs.RegMR(w.EP[1].PD, make([]byte, 8192), enginetest.AllAccess)
	swr := wr.SendWR{Opcode: wr.RDMAWrite, Flags: wr.Signaled, SGL: []wr.SGE{{Addr: lmr.Addr(), Length: 8192, LKey: lmr.LKey()}}, RemoteAddr: rmr.Addr(), RKey: rmr.RKey()}
	wcs := make([]cq.WC, 8)
	round := func() {
		for i := 0; i < 4; i++ {
			if err := pairs[0][0].PostSend(&swr); err != nil {
				t.Fatal(err)
			}
		}
		for got := 0; got < 4; {
			w.Step()
			got += w.EP[0].SCQ.Poll(wcs)
		}
	}
	for i := 0; i < 10; i++ {
		round() // warm up buffer pools and slices
	}
	if a := testing.AllocsPerRun(50, round); a != 0 {
		t.Fatalf("%.1f allocations per round of 4 x 8 KiB WRITEs (32 packets + ACKs), want 0", a)
	}
}

var _ = qpstate.RTS
var _ = memreg.AccessLocalWrite
