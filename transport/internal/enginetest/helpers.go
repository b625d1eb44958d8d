package enginetest

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/memreg"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/transport/engine"
	"github.com/softroce/softroce/wr"
)

// AllAccess is every access right a memory region can grant but binding
// windows.
const AllAccess = memreg.AccessLocalWrite | memreg.AccessRemoteWrite | memreg.AccessRemoteRead | memreg.AccessRemoteAtomic

// Reg registers n new bytes with AllAccess on endpoint i.
func (s *Sim) Reg(i int, n int) (*memreg.MR, []byte) {
	buf := make([]byte, n)
	mr, err := s.EP[i].MRs.RegMR(s.EP[i].PD, buf, AllAccess)
	if err != nil {
		s.T.Fatal(err)
	}
	return mr, buf
}

// Fill fills b with a byte pattern of the position, from seed.
func Fill(b []byte, seed byte) {
	for i := range b {
		b[i] = seed + byte(i*7) + byte(i>>8)
	}
}

// FillRandom fills b with a PRNG stream keyed by seed. Nothing repeats,
// so bytes placed at a wrong offset (by a packet, a page or 64 KiB, whose
// multiples a byte pattern of the position repeats at) never match.
func FillRandom(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	var w [8]byte
	for i := 0; i < len(b); i += 8 {
		binary.LittleEndian.PutUint64(w[:], r.Uint64())
		copy(b[i:], w[:])
	}
}

// MustPost posts swr to qp's send queue; a refusal fails the test.
func MustPost(t testing.TB, qp *engine.QP, swr *wr.SendWR) {
	t.Helper()
	if err := qp.PostSend(swr); err != nil {
		t.Fatal(err)
	}
}

// PostRecv posts a receive of n bytes at addr under lkey to qp; a
// refusal fails the test.
func (s *Sim) PostRecv(qp *engine.QP, id uint64, addr uint64, n uint32, lkey uint32) {
	s.T.Helper()
	if err := qp.PostRecv(&wr.RecvWR{ID: id, SGL: []wr.SGE{{Addr: addr, Length: n, LKey: lkey}}}); err != nil {
		s.T.Fatal(err)
	}
}

// PostRecvSGE posts a receive of one scatter entry to qp; a refusal
// fails the test.
func PostRecvSGE(t testing.TB, qp *engine.QP, id uint64, sge wr.SGE) {
	t.Helper()
	if err := qp.PostRecv(&wr.RecvWR{ID: id, SGL: []wr.SGE{sge}}); err != nil {
		t.Fatal(err)
	}
}

// WaitWC pumps until c has n completions and returns them; fewer by the
// simulated deadline fails the test.
func (s *Sim) WaitWC(c *cq.CQ, n int, limit time.Duration) []cq.WC {
	var got []cq.WC
	buf := make([]cq.WC, 64)
	s.Pump(func() bool {
		k := c.Poll(buf)
		got = append(got, buf[:k]...)
		return len(got) >= n
	}, limit)
	if len(got) < n {
		s.T.Fatalf("got %d completions, want %d (now +%v); trace:\n%s", len(got), n, s.Now.Sub(Epoch), strings.Join(s.Trace, "\n"))
	}
	return got
}

// Feed hands one crafted packet to endpoint i's QP without running
// Progress: what the engine builds in answer stays in its transmit batch.
func (s *Sim) Feed(i int, qp *engine.QP, f bth.Fields, payload []byte) {
	f.BTH.PKey = 0xffff
	f.BTH.DestQP = qp.Num()
	buf := make([]byte, bth.Len(f.BTH.Opcode, len(payload)))
	n, err := bth.Build(buf, &f, payload)
	if err != nil {
		s.T.Fatal(err)
	}
	s.EP[i].E.Receive(s.Now, []nic.Packet{{Buf: buf, N: n, Remote: netip.AddrPortFrom(s.EP[1-i].Addr, 4791)}})
}

// Drain runs endpoint i's Progress until it has nothing more and returns
// one line per packet it handed out.
func (s *Sim) Drain(i int) []string {
	var lines []string
	for {
		out, more := s.EP[i].E.Progress(s.Now)
		for j := range out {
			var p bth.Packet
			if err := bth.Parse(&p, out[j].Bytes()); err != nil {
				s.T.Fatal(err)
			}
			l := fmt.Sprintf("%s psn=%d", ShortOp(p.BTH.Opcode()), p.BTH.PSN())
			if p.AETH != nil {
				l += " " + p.AETH.Syndrome().String()
			}
			lines = append(lines, l)
		}
		s.EP[i].E.Release(out)
		if !more {
			return lines
		}
	}
}

// ProgressOnce runs one Progress call on endpoint i and returns how many
// packets it handed out.
func (s *Sim) ProgressOnce(i int) int {
	out, _ := s.EP[i].E.Progress(s.Now)
	n := len(out)
	s.EP[i].E.Release(out)
	return n
}

// Inject hands one crafted request to endpoint 1's QP and returns the
// responses it produces, one line each ("ACKNOWLEDGE psn=5 NAK ...").
func (s *Sim) Inject(qp *engine.QP, f bth.Fields, payload []byte) []string {
	f.BTH.PKey = 0xffff
	f.BTH.DestQP = qp.Num()
	buf := make([]byte, bth.Len(f.BTH.Opcode, len(payload)))
	n, err := bth.Build(buf, &f, payload)
	if err != nil {
		s.T.Fatal(err)
	}
	s.EP[1].E.Receive(s.Now, []nic.Packet{{Buf: buf, N: n, Remote: netip.AddrPortFrom(s.EP[0].Addr, 4791)}})
	var lines []string
	for {
		out, more := s.EP[1].E.Progress(s.Now)
		for i := range out {
			var p bth.Packet
			if err := bth.Parse(&p, out[i].Bytes()); err != nil {
				s.T.Fatal(err)
			}
			l := fmt.Sprintf("%s psn=%d", ShortOp(p.BTH.Opcode()), p.BTH.PSN())
			if p.AETH != nil {
				l += fmt.Sprintf(" %s msn=%d", p.AETH.Syndrome(), p.AETH.MSN())
			}
			if p.AtomicAckETH != nil {
				l += fmt.Sprintf(" orig=%d", p.AtomicAckETH.Orig())
			}
			if len(p.Payload) > 0 {
				l += fmt.Sprintf(" len=%d", len(p.Payload))
			}
			lines = append(lines, l)
		}
		s.EP[1].E.Release(out)
		if !more {
			return lines
		}
	}
}

// ExpectLines fails the test unless got is want, line for line.
func ExpectLines(t testing.TB, what string, got []string, want ...string) {
	t.Helper()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("%s:\ngot:\n  %s\nwant:\n  %s", what, strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
}

// Capture records the packets an engine hands out.
func Capture(e *engine.Engine) *[][]byte {
	var out [][]byte
	e.SetPacketTrace(func(dir byte, p *nic.Packet) {
		if dir == 'T' {
			out = append(out, append([]byte(nil), p.Bytes()...))
		}
	})
	return &out
}

// IPFields are the IP header fields a packet asks its link for.
type IPFields struct{ Hop, TC uint8 }

// TraceIPFields records the HopLimit and TClass of the packets an engine
// hands out.
func TraceIPFields(e *engine.Engine) *[]IPFields {
	var out []IPFields
	e.SetPacketTrace(func(dir byte, p *nic.Packet) {
		if dir == 'T' {
			out = append(out, IPFields{p.HopLimit, p.TClass})
		}
	})
	return &out
}
