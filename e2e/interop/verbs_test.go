package interop

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/softroce/softroce/conformance/agent"
	"github.com/softroce/softroce/internal/devsync"
	"github.com/softroce/softroce/verbs"
)

// pairing is one RC connection between the rxe guest (through the verbs
// agent) and softroce on the host, each with a registered 1 MiB buffer.
type pairing struct {
	ag   *agent.Client
	apd  agent.PD
	aqp  agent.QP
	acq  agent.CQ
	amr  agent.MR
	dev  *verbs.Device
	pd   *verbs.PD
	qp   *verbs.QP
	cq   *verbs.CQ
	mr   *verbs.MR
	buf  []byte
	mtu  int
	wrID uint64
}

const bufLen = 1 << 20

func connectPair(t *testing.T, ctx context.Context, mtu int) *pairing {
	t.Helper()
	return connectPairWith(t, ctx, mtu, nil, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead|verbs.AccessRemoteAtomic)
}

// connectPairWith connects an rxe RC QP and one of softroce's over dev
// (nil: a new host device), softroce's buffer registered with access.
func connectPairWith(t *testing.T, ctx context.Context, mtu int, dev *verbs.Device, access verbs.Access) *pairing {
	t.Helper()
	ag, err := agent.Launch(ctx, vm, 7100+rand.IntN(800))
	if err != nil {
		t.Fatalf("launch the verbs agent: %v", err)
	}
	t.Cleanup(func() { ag.Close() })
	p := &pairing{ag: ag, mtu: mtu, dev: dev}
	must := mustOf(t)
	must(ag.Open(ctx, "rxe0"))
	pd, err := ag.AllocPD(ctx)
	must(err)
	p.apd = pd
	p.amr, err = ag.RegMR(ctx, pd, bufLen, agent.AccessAll)
	must(err)
	p.acq, err = ag.CreateCQ(ctx, 256)
	must(err)
	p.aqp, err = ag.CreateQP(ctx, pd, p.acq, p.acq, agent.QPCap{SendWR: 64, RecvWR: 64})
	must(err)
	must(ag.ModifyToInit(ctx, p.aqp, agent.AccessAll))
	agid, err := ag.GID(ctx, 1)
	must(err)

	if p.dev == nil {
		p.dev = hostDevice(t)
	}
	spd, err := p.dev.AllocPD()
	must(err)
	p.pd = spd
	p.buf = make([]byte, bufLen)
	p.mr, err = spd.RegMR(p.buf, access)
	must(err)
	p.cq, err = p.dev.CreateCQ(256)
	must(err)
	p.qp, err = spd.CreateQP(verbs.QPInitAttr{SendCQ: p.cq, RecvCQ: p.cq, Cap: verbs.QPCap{MaxSendWR: 64, MaxRecvWR: 64}})
	must(err)
	sgid, err := p.dev.QueryGID(0)
	must(err)
	apsn, spsn := uint32(0xfffff0), uint32(rand.IntN(1<<24))
	must(connectRC(ctx, ag, p.aqp, agid, p.qp, sgid, mtu, apsn, spsn, 0, verbs.ConnectOptions{MaxRDAtomic: 16}))
	return p
}

// post sends one WR from softroce and waits for its completion.
func (p *pairing) post(t *testing.T, wr verbs.SendWR) verbs.WC {
	t.Helper()
	p.wrID++
	wr.ID, wr.Flags = p.wrID, wr.Flags|verbs.SendSignaled
	if err := p.qp.PostSend(&wr); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	wcs := make([]verbs.WC, 1)
	if _, err := p.cq.Wait(ctx, wcs); err != nil {
		t.Fatalf("%v: no completion: %v (QP stats %+v)", wr.Opcode, err, p.qp.Stats())
	}
	if wcs[0].Status != 0 || wcs[0].WRID != wr.ID {
		t.Fatalf("%v: completion %+v", wr.Opcode, wcs[0])
	}
	return wcs[0]
}

// agentPost sends one WR from rxe and waits for its completion.
func (p *pairing) agentPost(t *testing.T, ctx context.Context, wr agent.SendWR) *agent.WC {
	t.Helper()
	p.wrID++
	wr.WRID, wr.MR = p.wrID, p.amr
	if err := p.ag.PostSend(ctx, p.aqp, wr); err != nil {
		t.Fatal(err)
	}
	wc, err := p.ag.Poll(ctx, p.acq, 20*time.Second)
	if err != nil {
		t.Fatalf("rxe %s: %v", wr.Op, err)
	}
	if wc.Status != 0 || wc.WRID != wr.WRID {
		t.Fatalf("rxe %s: completion %+v", wr.Op, wc)
	}
	return wc
}

// mem runs f on softroce's buffer under the engine lock, which the
// responder holds while it touches registered memory: the packets in
// between cross the kernel and the guest, where the race detector cannot
// see an ordering, and the lock gives it one.
func (p *pairing) mem(f func()) {
	devsync.Run(p.dev, f)
}

// pattern is n bytes of a PRNG stream keyed by seed and n. Nothing
// repeats at any offset, so data landing a packet, a page or 64 KiB away
// from its place never passes for the right data.
func pattern(n int, seed byte) []byte {
	r := rand.New(rand.NewPCG(uint64(seed), uint64(n)))
	b := make([]byte, n+7)
	for i := 0; i < n; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	return b[:n:n]
}

// TestVerbsAgainstRxe: softroce as requester and as responder against
// kernel rdma_rxe for RDMA WRITE, READ, SEND, compare-and-swap and
// fetch-and-add, every byte checked on both sides.
func TestVerbsAgainstRxe(t *testing.T) {
	needVM(t)
	for _, mtu := range []int{1024, 4096} {
		t.Run(fmt.Sprintf("mtu%d", mtu), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			p := connectPair(t, ctx, mtu)
			sizes := []int{0, 1, 4096, 4097, 65536, 300000}
			t.Run("softroce-requester", func(t *testing.T) {
				for _, n := range sizes {
					data := pattern(n, byte(n))
					p.mem(func() { copy(p.buf, data) })
					p.post(t, verbs.SendWR{Opcode: verbs.WRRDMAWrite, SGL: []verbs.SGE{{Addr: p.mr.Addr(), Length: uint32(n), LKey: p.mr.LKey()}},
						RemoteAddr: p.amr.Addr + 64, RKey: p.amr.RKey})
					got, err := p.ag.ReadMem(ctx, p.amr, 64, n)
					if err != nil || !bytes.Equal(got, data) {
						t.Fatalf("WRITE %d bytes: rxe memory differs (%v)", n, err)
					}
					// READ it back into another part of our buffer.
					wc := p.post(t, verbs.SendWR{Opcode: verbs.WRRDMARead, SGL: []verbs.SGE{{Addr: p.mr.Addr() + bufLen/2, Length: uint32(n), LKey: p.mr.LKey()}},
						RemoteAddr: p.amr.Addr + 64, RKey: p.amr.RKey})
					var same bool
					p.mem(func() { same = bytes.Equal(p.buf[bufLen/2:bufLen/2+n], data) })
					if wc.ByteLen != uint32(n) || !same {
						t.Fatalf("READ %d bytes: data differs", n)
					}
				}
				// Atomics on an 8-byte aligned word in rxe's memory (host order).
				var w [8]byte
				binary.LittleEndian.PutUint64(w[:], 1000)
				if err := p.ag.WriteMem(ctx, p.amr, 4096, w[:]); err != nil {
					t.Fatal(err)
				}
				p.post(t, verbs.SendWR{Opcode: verbs.WRAtomicFetchAndAdd, SGL: []verbs.SGE{{Addr: p.mr.Addr() + 8, Length: 8, LKey: p.mr.LKey()}},
					RemoteAddr: p.amr.Addr + 4096, RKey: p.amr.RKey, CompareAdd: 234})
				var o uint64
				p.mem(func() { o = binary.LittleEndian.Uint64(p.buf[8:]) })
				if o != 1000 {
					t.Fatalf("fetch-and-add returned %d, want 1000", o)
				}
				p.post(t, verbs.SendWR{Opcode: verbs.WRAtomicCmpAndSwp, SGL: []verbs.SGE{{Addr: p.mr.Addr() + 16, Length: 8, LKey: p.mr.LKey()}},
					RemoteAddr: p.amr.Addr + 4096, RKey: p.amr.RKey, CompareAdd: 1234, Swap: 77})
				p.mem(func() { o = binary.LittleEndian.Uint64(p.buf[16:]) })
				if o != 1234 {
					t.Fatalf("compare-and-swap returned %d, want 1234", o)
				}
				got, err := p.ag.ReadMem(ctx, p.amr, 4096, 8)
				if err != nil || binary.LittleEndian.Uint64(got) != 77 {
					t.Fatalf("rxe word after CAS = %x (%v), want 77", got, err)
				}
				// SEND with immediate into an rxe receive.
				if err := p.ag.PostRecv(ctx, p.aqp, 999, p.amr, 8192, 70000); err != nil {
					t.Fatal(err)
				}
				data := pattern(70000, 5)
				p.mem(func() { copy(p.buf, data) })
				p.post(t, verbs.SendWR{Opcode: verbs.WRSendWithImm, Imm: 0xcafe, SGL: []verbs.SGE{{Addr: p.mr.Addr(), Length: 70000, LKey: p.mr.LKey()}}})
				wc, err := p.ag.Poll(ctx, p.acq, 10*time.Second)
				if err != nil || wc.Status != 0 || wc.WRID != 999 || wc.ByteLen != 70000 || wc.Imm != 0xcafe {
					t.Fatalf("rxe receive completion %+v (%v)", wc, err)
				}
				got, err = p.ag.ReadMem(ctx, p.amr, 8192, 70000)
				if err != nil || !bytes.Equal(got, data) {
					t.Fatal("SEND data differs in rxe's buffer")
				}
			})
			t.Run("softroce-responder", func(t *testing.T) {
				for _, n := range sizes {
					data := pattern(n, byte(n)+1)
					if err := p.ag.WriteMem(ctx, p.amr, 0, data); err != nil {
						t.Fatal(err)
					}
					p.agentPost(t, ctx, agent.SendWR{Op: agent.OpWrite, Off: 0, Len: n, RemoteAddr: p.mr.Addr() + 100, RKey: p.mr.RKey()})
					var same bool
					p.mem(func() { same = bytes.Equal(p.buf[100:100+n], data) })
					if !same {
						t.Fatalf("rxe WRITE %d bytes: softroce memory differs", n)
					}
					p.mem(func() { copy(p.buf[bufLen/2:], pattern(n, 99)) })
					p.agentPost(t, ctx, agent.SendWR{Op: agent.OpRead, Off: bufLen / 4, Len: n, RemoteAddr: p.mr.Addr() + bufLen/2, RKey: p.mr.RKey()})
					got, err := p.ag.ReadMem(ctx, p.amr, bufLen/4, n)
					if err != nil || !bytes.Equal(got, pattern(n, 99)) {
						t.Fatalf("rxe READ %d bytes from softroce: data differs (%v)", n, err)
					}
				}
				p.mem(func() { binary.LittleEndian.PutUint64(p.buf[4096:], 5) })
				p.agentPost(t, ctx, agent.SendWR{Op: agent.OpFetchAdd, Off: 0, Len: 8, RemoteAddr: p.mr.Addr() + 4096, RKey: p.mr.RKey(), Add: 10})
				p.agentPost(t, ctx, agent.SendWR{Op: agent.OpCmpSwap, Off: 8, Len: 8, RemoteAddr: p.mr.Addr() + 4096, RKey: p.mr.RKey(), Compare: 15, Swap: 42})
				got, err := p.ag.ReadMem(ctx, p.amr, 0, 16)
				if err != nil || binary.LittleEndian.Uint64(got) != 5 || binary.LittleEndian.Uint64(got[8:]) != 15 {
					t.Fatalf("rxe atomic results %x (%v), want 5 and 15", got, err)
				}
				var v uint64
				p.mem(func() { v = binary.LittleEndian.Uint64(p.buf[4096:]) })
				if v != 42 {
					t.Fatalf("softroce word = %d, want 42", v)
				}
				// SEND with immediate from rxe into a softroce receive.
				if err := p.qp.PostRecv(&verbs.RecvWR{ID: 555, SGL: []verbs.SGE{{Addr: p.mr.Addr() + 8192, Length: 100000, LKey: p.mr.LKey()}}}); err != nil {
					t.Fatal(err)
				}
				data := pattern(90000, 3)
				if err := p.ag.WriteMem(ctx, p.amr, 0, data); err != nil {
					t.Fatal(err)
				}
				p.agentPost(t, ctx, agent.SendWR{Op: agent.OpSendImm, Off: 0, Len: 90000, Imm: 0xbeef})
				wcs := make([]verbs.WC, 1)
				wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				if _, err := p.cq.Wait(wctx, wcs); err != nil || wcs[0].WRID != 555 || wcs[0].ByteLen != 90000 || wcs[0].ImmData != 0xbeef {
					t.Fatalf("softroce receive completion %+v (%v)", wcs[0], err)
				}
				var same bool
				p.mem(func() { same = bytes.Equal(p.buf[8192:8192+90000], data) })
				if !same {
					t.Fatal("SEND data differs in softroce's buffer")
				}
			})
		})
	}
}
