package interop

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/conformance/agent"
	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/internal/devsync"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/nic/udp"
	"github.com/softroce/softroce/verbs"
)

// ucPairing is one UC connection between the rxe guest (through the verbs
// agent, with separate send and receive CQs) and softroce on the host.
type ucPairing struct {
	ag         *agent.Client
	aqp        agent.QP
	ascq, arcq agent.CQ
	amr        agent.MR
	dev        *verbs.Device
	qp         *verbs.QP
	scq, rcq   *verbs.CQ
	mr         *verbs.MR
	buf        []byte
	wrID       uint64
}

// dropLink drops, in either direction, the packets drop picks.
type dropLink struct {
	nic.Link
	mu   sync.Mutex
	drop func(dir byte, p []byte) bool
	n    int // packets dropped
}

func (l *dropLink) pick(dir byte, p *nic.Packet) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.drop != nil && l.drop(dir, p.Bytes()) {
		l.n++
		return true
	}
	return false
}

func (l *dropLink) dropped() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n
}

func (l *dropLink) Send(pkts []nic.Packet) (int, error) {
	keep := make([]nic.Packet, 0, len(pkts))
	for i := range pkts {
		if !l.pick('T', &pkts[i]) {
			keep = append(keep, pkts[i])
		}
	}
	if _, err := l.Link.Send(keep); err != nil {
		return 0, err
	}
	return len(pkts), nil
}

func (l *dropLink) Recv(pkts []nic.Packet) (int, error) {
	for {
		n, err := l.Link.Recv(pkts)
		if err != nil {
			return n, err
		}
		k := 0
		for i := 0; i < n; i++ {
			if !l.pick('R', &pkts[i]) {
				pkts[k], pkts[i] = pkts[i], pkts[k] // swap: every buffer stays in the batch
				k++
			}
		}
		if k > 0 || n == 0 {
			return k, nil
		}
	}
}

// firstOf drops the first packet going in direction dir with opcode op.
func firstOf(dir byte, op bth.Opcode) func(byte, []byte) bool {
	done := false
	return func(d byte, p []byte) bool {
		if done || d != dir || len(p) == 0 || bth.Opcode(p[0]) != op {
			return false
		}
		done = true
		return true
	}
}

func connectUC(t *testing.T, ctx context.Context, mtu int, link *dropLink) *ucPairing {
	t.Helper()
	must := mustOf(t)
	ag, err := agent.Launch(ctx, vm, 7100+rand.IntN(800))
	must(err)
	t.Cleanup(func() { ag.Close() })
	p := &ucPairing{ag: ag}
	must(ag.Open(ctx, "rxe0"))
	apd, err := ag.AllocPD(ctx)
	must(err)
	p.amr, err = ag.RegMR(ctx, apd, bufLen, agent.AccessAll)
	must(err)
	p.ascq, err = ag.CreateCQ(ctx, 256)
	must(err)
	p.arcq, err = ag.CreateCQ(ctx, 256)
	must(err)
	p.aqp, err = ag.CreateQP(ctx, apd, p.ascq, p.arcq, agent.QPCap{SendWR: 64, RecvWR: 64, Type: agent.QPTypeUC})
	must(err)
	must(ag.ModifyToInit(ctx, p.aqp, agent.AccessAll))
	agid, err := ag.GID(ctx, 1)
	must(err)

	err = vm.Do(func() error {
		l, err := udp.Open(udp.Config{Addr: vm.HostAddr()})
		link.Link = l
		return err
	})
	must(err)
	p.dev, err = verbs.Open(link, nil)
	must(err)
	t.Cleanup(func() { p.dev.Close() })
	pd, err := p.dev.AllocPD()
	must(err)
	p.buf = make([]byte, bufLen)
	p.mr, err = pd.RegMR(p.buf, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	must(err)
	p.scq, err = p.dev.CreateCQ(256)
	must(err)
	p.rcq, err = p.dev.CreateCQ(256)
	must(err)
	p.qp, err = pd.CreateQP(verbs.QPInitAttr{Type: verbs.QPTypeUC, SendCQ: p.scq, RecvCQ: p.rcq, Cap: verbs.QPCap{MaxSendWR: 64, MaxRecvWR: 64}})
	must(err)
	sgid, err := p.dev.QueryGID(0)
	must(err)
	apsn, spsn := uint32(0xfffff0), uint32(rand.IntN(1<<24))
	must(ag.ModifyToRTR(ctx, p.aqp, agent.RTRAttr{DestQPN: p.qp.Num(), RecvPSN: spsn, DestGID: sgid, MTU: mtu}))
	must(ag.ModifyToRTS(ctx, p.aqp, agent.RTSAttr{SendPSN: apsn}))
	must(p.qp.Connect(verbs.RemoteInfo{QPN: p.aqp.QPN, PSN: apsn, GID: agid}, &verbs.ConnectOptions{PathMTU: mtu, SQPSN: spsn}))
	return p
}

func (p *ucPairing) mem(f func()) { devsync.Run(p.dev, f) }

// post sends one WR from softroce; a UC WR completes once sent.
func (p *ucPairing) post(t *testing.T, wr verbs.SendWR) {
	t.Helper()
	p.wrID++
	wr.ID, wr.Flags = p.wrID, wr.Flags|verbs.SendSignaled
	if err := p.qp.PostSend(&wr); err != nil {
		t.Fatal(err)
	}
	if wc := p.wait(t, p.scq); wc.Status != 0 || wc.WRID != wr.ID {
		t.Fatalf("%v: completion %+v", wr.Opcode, wc)
	}
}

func (p *ucPairing) wait(t *testing.T, c *verbs.CQ) verbs.WC {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	wcs := make([]verbs.WC, 1)
	if _, err := c.Wait(ctx, wcs); err != nil {
		t.Fatalf("no completion: %v (QP stats %+v)", err, p.qp.Stats())
	}
	return wcs[0]
}

// agentPost sends one WR from rxe and waits for its send completion.
func (p *ucPairing) agentPost(t *testing.T, ctx context.Context, wr agent.SendWR) {
	t.Helper()
	p.wrID++
	wr.WRID, wr.MR = p.wrID, p.amr
	if err := p.ag.PostSend(ctx, p.aqp, wr); err != nil {
		t.Fatal(err)
	}
	wc, err := p.ag.Poll(ctx, p.ascq, 20*time.Second)
	if err != nil || wc == nil || wc.Status != 0 || wc.WRID != wr.WRID {
		t.Fatalf("rxe %s: completion %+v (%v)", wr.Op, wc, err)
	}
}

// agentRecv waits for one receive completion on rxe.
func (p *ucPairing) agentRecv(t *testing.T, ctx context.Context, timeout time.Duration) *agent.WC {
	t.Helper()
	wc, err := p.ag.Poll(ctx, p.arcq, timeout)
	if err != nil {
		t.Fatal(err)
	}
	return wc
}

// TestUCAgainstRxe: softroce UC and rxe UC exchange RDMA WRITE, WRITE with
// immediate and SEND (with immediate) in both directions, at two MTUs,
// every byte checked. A WRITE's arrival is proven by the SEND that follows
// it on the same QP: UC delivers in order and acknowledges nothing.
func TestUCAgainstRxe(t *testing.T) {
	needVM(t)
	for _, mtu := range []int{1024, 4096} {
		t.Run(fmt.Sprintf("mtu%d", mtu), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			p := connectUC(t, ctx, mtu, &dropLink{})
			sizes := []int{1, 4096, 4097, 65536}
			t.Run("softroce-requester", func(t *testing.T) {
				for i, n := range sizes {
					data, msg := pattern(n, byte(n)), pattern(n+3, byte(n)+7)
					p.mem(func() { copy(p.buf, data); copy(p.buf[bufLen/2:], msg) })
					mustOK(t, p.ag.PostRecv(ctx, p.aqp, uint64(100+i), p.amr, bufLen/2, n+3))
					p.post(t, verbs.SendWR{Opcode: verbs.WRRDMAWrite, SGL: []verbs.SGE{{Addr: p.mr.Addr(), Length: uint32(n), LKey: p.mr.LKey()}},
						RemoteAddr: p.amr.Addr + 64, RKey: p.amr.RKey})
					p.post(t, verbs.SendWR{Opcode: verbs.WRSendWithImm, Imm: uint32(n), SGL: []verbs.SGE{{Addr: p.mr.Addr() + bufLen/2, Length: uint32(n + 3), LKey: p.mr.LKey()}}})
					wc := p.agentRecv(t, ctx, 20*time.Second)
					if wc == nil || wc.Status != 0 || wc.WRID != uint64(100+i) || wc.ByteLen != uint32(n+3) || wc.Imm != uint32(n) {
						t.Fatalf("rxe receive %+v", wc)
					}
					got, err := p.ag.ReadMem(ctx, p.amr, 64, n)
					if err != nil || !bytes.Equal(got, data) {
						t.Fatalf("WRITE %d bytes: rxe memory differs (%v)", n, err)
					}
					got, err = p.ag.ReadMem(ctx, p.amr, bufLen/2, n+3)
					if err != nil || !bytes.Equal(got, msg) {
						t.Fatalf("SEND %d bytes: rxe memory differs (%v)", n+3, err)
					}
				}
				// WRITE with immediate consumes an rxe receive.
				mustOK(t, p.ag.PostRecv(ctx, p.aqp, 200, p.amr, 0, 0))
				p.post(t, verbs.SendWR{Opcode: verbs.WRRDMAWriteWithImm, Imm: 0x1234, SGL: []verbs.SGE{{Addr: p.mr.Addr(), Length: 5000, LKey: p.mr.LKey()}},
					RemoteAddr: p.amr.Addr + 8192, RKey: p.amr.RKey})
				wc := p.agentRecv(t, ctx, 20*time.Second)
				if wc == nil || wc.Status != 0 || wc.WRID != 200 || wc.ByteLen != 5000 || wc.Imm != 0x1234 || wc.Opcode != agent.WCRecvRDMAWithImm {
					t.Fatalf("rxe WRITE_WITH_IMM receive %+v", wc)
				}
				got, err := p.ag.ReadMem(ctx, p.amr, 8192, 5000)
				var want []byte
				p.mem(func() { want = append(want, p.buf[:5000]...) })
				if err != nil || !bytes.Equal(got, want) {
					t.Fatal("WRITE_WITH_IMM data differs in rxe's memory")
				}
			})
			t.Run("softroce-responder", func(t *testing.T) {
				tx := p.qp.Stats().TxPackets
				for i, n := range sizes {
					data, msg := pattern(n, byte(n)+1), pattern(n+5, byte(n)+9)
					mustOK(t, p.ag.WriteMem(ctx, p.amr, 0, data))
					mustOK(t, p.ag.WriteMem(ctx, p.amr, bufLen/2, msg))
					mustOK(t, p.qp.PostRecv(&verbs.RecvWR{ID: uint64(300 + i), SGL: []verbs.SGE{{Addr: p.mr.Addr() + bufLen/2, Length: uint32(n + 5), LKey: p.mr.LKey()}}}))
					p.agentPost(t, ctx, agent.SendWR{Op: agent.OpWrite, Off: 0, Len: n, RemoteAddr: p.mr.Addr() + 100, RKey: p.mr.RKey()})
					p.agentPost(t, ctx, agent.SendWR{Op: agent.OpSendImm, Off: bufLen / 2, Len: n + 5, Imm: 0xbeef})
					wc := p.wait(t, p.rcq)
					if wc.Status != 0 || wc.WRID != uint64(300+i) || wc.ByteLen != uint32(n+5) || wc.ImmData != 0xbeef {
						t.Fatalf("softroce receive %+v", wc)
					}
					var okW, okS bool
					p.mem(func() {
						okW = bytes.Equal(p.buf[100:100+n], data)
						okS = bytes.Equal(p.buf[bufLen/2:bufLen/2+n+5], msg)
					})
					if !okW || !okS {
						t.Fatalf("rxe WRITE/SEND of %d bytes: softroce memory differs (write ok %v, send ok %v)", n, okW, okS)
					}
				}
				mustOK(t, p.qp.PostRecv(&verbs.RecvWR{ID: 400}))
				p.agentPost(t, ctx, agent.SendWR{Op: agent.OpWriteImm, Off: 0, Len: 3000, RemoteAddr: p.mr.Addr() + 200000, RKey: p.mr.RKey(), Imm: 77})
				wc := p.wait(t, p.rcq)
				if wc.Status != 0 || wc.WRID != 400 || wc.Opcode != cq.OpRecvRDMAWithImm || wc.ByteLen != 3000 || wc.ImmData != 77 {
					t.Fatalf("softroce WRITE_WITH_IMM receive %+v", wc)
				}
				want, err := p.ag.ReadMem(ctx, p.amr, 0, 3000)
				var same bool
				p.mem(func() { same = bytes.Equal(p.buf[200000:203000], want) })
				if err != nil || !same {
					t.Fatal("rxe WRITE_WITH_IMM data differs in softroce's memory")
				}
				if n := p.qp.Stats().TxPackets - tx; n != 0 {
					t.Fatalf("the softroce UC responder sent %d packets", n)
				}
			})
		})
	}
}

func mustOK(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// TestUCGapAgainstRxe loses one MIDDLE packet of a 3-packet SEND and
// sends two single-packet SENDs after it, in both roles. The broken SEND
// is dropped silently on both sides and nothing is ever NAKed. softroce
// then delivers both later SENDs, the first into the receive WQE the
// broken one left (IBTA class D1); rxe drops the first later SEND too
// (its check_op_seq refuses a new message while the broken one is open,
// then its expected PSN is stale), and delivers the second into the WQE
// the broken SEND had taken.
func TestUCGapAgainstRxe(t *testing.T) {
	needVM(t)
	const mtu = 1024
	ucMiddle := bth.Opcode(uint8(bth.TransportUC)<<5 | uint8(bth.RCSendMiddle))
	t.Run("rxe-responder", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		link := &dropLink{drop: firstOf('T', ucMiddle)}
		p := connectUC(t, ctx, mtu, link)
		for i := range 3 {
			mustOK(t, p.ag.PostRecv(ctx, p.aqp, uint64(10+i), p.amr, i*8192, 8192))
		}
		p.mem(func() {
			copy(p.buf, pattern(3000, 1))
			copy(p.buf[4096:], "B-message")
			copy(p.buf[8192:], "C-message")
		})
		p.post(t, verbs.SendWR{Opcode: verbs.WRSend, SGL: []verbs.SGE{{Addr: p.mr.Addr(), Length: 3000, LKey: p.mr.LKey()}}})
		p.post(t, verbs.SendWR{Opcode: verbs.WRSend, SGL: []verbs.SGE{{Addr: p.mr.Addr() + 4096, Length: 9, LKey: p.mr.LKey()}}})
		p.post(t, verbs.SendWR{Opcode: verbs.WRSend, SGL: []verbs.SGE{{Addr: p.mr.Addr() + 8192, Length: 9, LKey: p.mr.LKey()}}})
		if link.dropped() != 1 {
			t.Fatalf("dropped %d packets, want the one MIDDLE", link.dropped())
		}
		wc := p.agentRecv(t, ctx, 10*time.Second)
		if wc == nil || wc.Status != 0 || wc.ByteLen != 9 {
			t.Fatalf("rxe receive %+v", wc)
		}
		got, err := p.ag.ReadMem(ctx, p.amr, 0, 9)
		mustOK(t, err)
		t.Logf("rxe delivered %q into WQE %d", got, wc.WRID)
		if wc.WRID != 10 || string(got) != "C-message" {
			t.Fatalf("rxe delivered %q into WQE %d; expected C-message into WQE 10 (rxe drops B as well)", got, wc.WRID)
		}
		if wc := p.agentRecv(t, ctx, 2*time.Second); wc != nil {
			t.Fatalf("rxe completed a second receive: %+v", wc)
		}
		if n := p.qp.Stats().RxPackets; n != 0 {
			t.Fatalf("rxe answered %d packets to a UC requester", n)
		}
	})
	t.Run("softroce-responder", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		link := &dropLink{drop: firstOf('R', ucMiddle)}
		p := connectUC(t, ctx, mtu, link)
		for i := range 3 {
			mustOK(t, p.qp.PostRecv(&verbs.RecvWR{ID: uint64(20 + i), SGL: []verbs.SGE{{Addr: p.mr.Addr() + uint64(i)*8192, Length: 8192, LKey: p.mr.LKey()}}}))
		}
		mustOK(t, p.ag.WriteMem(ctx, p.amr, 0, pattern(3000, 2)))
		mustOK(t, p.ag.WriteMem(ctx, p.amr, 4096, []byte("B-message")))
		mustOK(t, p.ag.WriteMem(ctx, p.amr, 8192, []byte("C-message")))
		p.agentPost(t, ctx, agent.SendWR{Op: agent.OpSend, Off: 0, Len: 3000})
		p.agentPost(t, ctx, agent.SendWR{Op: agent.OpSend, Off: 4096, Len: 9})
		p.agentPost(t, ctx, agent.SendWR{Op: agent.OpSend, Off: 8192, Len: 9})
		b, c := p.wait(t, p.rcq), p.wait(t, p.rcq)
		var gotB, gotC string
		p.mem(func() { gotB, gotC = string(p.buf[:9]), string(p.buf[8192:8201]) })
		if b.WRID != 20 || b.ByteLen != 9 || gotB != "B-message" || c.WRID != 21 || gotC != "C-message" {
			t.Fatalf("softroce receives %+v %+v, data %q %q", b, c, gotB, gotC)
		}
		if link.dropped() != 1 {
			t.Fatalf("dropped %d packets, want the one MIDDLE", link.dropped())
		}
		if st := p.qp.Stats(); st.TxPackets != 0 || st.OutOfSeqRequests != 1 {
			t.Fatalf("softroce UC responder stats %+v", st)
		}
	})
}

// TestUCBadRKeyAgainstRxe: a UC WRITE with a bad R_Key is dropped
// silently in both roles. The responder stays in RTS, answers nothing,
// and places the next message.
func TestUCBadRKeyAgainstRxe(t *testing.T) {
	needVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	p := connectUC(t, ctx, 1024, &dropLink{})
	t.Run("rxe-responder", func(t *testing.T) {
		mustOK(t, p.ag.Fill(ctx, p.amr, 0, 8192, 0))
		mustOK(t, p.ag.PostRecv(ctx, p.aqp, 50, p.amr, 0, 0))
		p.mem(func() { copy(p.buf, pattern(3000, 4)) })
		p.post(t, verbs.SendWR{Opcode: verbs.WRRDMAWrite, SGL: []verbs.SGE{{Addr: p.mr.Addr(), Length: 3000, LKey: p.mr.LKey()}},
			RemoteAddr: p.amr.Addr, RKey: p.amr.RKey ^ 0x80})
		p.post(t, verbs.SendWR{Opcode: verbs.WRRDMAWriteWithImm, Imm: 9, SGL: []verbs.SGE{{Addr: p.mr.Addr(), Length: 100, LKey: p.mr.LKey()}},
			RemoteAddr: p.amr.Addr + 4096, RKey: p.amr.RKey})
		wc := p.agentRecv(t, ctx, 10*time.Second)
		if wc == nil || wc.Status != 0 || wc.WRID != 50 || wc.Imm != 9 {
			t.Fatalf("rxe receive %+v", wc)
		}
		got, err := p.ag.ReadMem(ctx, p.amr, 0, 3000)
		mustOK(t, err)
		if !bytes.Equal(got, make([]byte, 3000)) {
			t.Fatal("the WRITE with a bad R_Key changed rxe's memory")
		}
		a, err := p.ag.Query(ctx, p.aqp)
		mustOK(t, err)
		if a.State != "RTS" {
			t.Fatalf("rxe UC QP in %s after a bad R_Key", a.State)
		}
		if n := p.qp.Stats().RxPackets; n != 0 {
			t.Fatalf("rxe answered %d packets", n)
		}
	})
	t.Run("softroce-responder", func(t *testing.T) {
		tx := p.qp.Stats().TxPackets
		mustOK(t, p.qp.PostRecv(&verbs.RecvWR{ID: 60}))
		mustOK(t, p.ag.WriteMem(ctx, p.amr, 0, pattern(3000, 6)))
		p.mem(func() { clear(p.buf[:8192]) })
		p.agentPost(t, ctx, agent.SendWR{Op: agent.OpWrite, Off: 0, Len: 3000, RemoteAddr: p.mr.Addr(), RKey: p.mr.RKey() ^ 0x80})
		p.agentPost(t, ctx, agent.SendWR{Op: agent.OpWriteImm, Off: 0, Len: 100, RemoteAddr: p.mr.Addr() + 4096, RKey: p.mr.RKey(), Imm: 10})
		wc := p.wait(t, p.rcq)
		if wc.Status != 0 || wc.WRID != 60 || wc.ImmData != 10 {
			t.Fatalf("softroce receive %+v", wc)
		}
		var untouched bool
		p.mem(func() { untouched = bytes.Equal(p.buf[:3000], make([]byte, 3000)) })
		if !untouched {
			t.Fatal("the WRITE with a bad R_Key changed softroce's memory")
		}
		if st := p.qp.Stats(); st.TxPackets != tx || st.Dropped == 0 || p.qp.State() != verbs.StateRTS {
			t.Fatalf("softroce UC responder after a bad R_Key: state %v, stats %+v", p.qp.State(), st)
		}
	})
}
