package rc

import (
	"bytes"
	"encoding/binary"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/memreg"
	"github.com/softroce/softroce/transport/engine"
	"github.com/softroce/softroce/transport/internal/enginetest"
	"github.com/softroce/softroce/wr"
)

var (
	propSeeds = flag.Int("rc.seeds", 1000, "number of seeded random workloads in TestPropertyLossy")
	propSeed  = flag.Int64("rc.seed", -1, "replay only this seed of TestPropertyLossy")
)

// propAdaptive turns Path.AdaptiveTimeout on for the QPs of runWorkload.
var propAdaptive bool

// op is one work request of a random workload and what it must produce.
type propOp struct {
	side   int
	wr     wr.SendWR
	src    []byte // bytes that must arrive
	dst    []byte // where they must arrive
	recvID uint64
	add    uint64
}

// TestPropertyLossy runs seeded random workloads (every operation, sizes
// 0..1 MiB, several QPs, both directions) under 10% loss, 5% duplication,
// 10% reordering and 1% corruption, and checks that every work request
// completes exactly once, in order, successfully, that memory and receive
// buffers are byte-exact, and that no atomic is applied twice.
func TestPropertyLossy(t *testing.T) {
	n := *propSeeds
	if testing.Short() {
		n = 50
	} else if enginetest.RaceEnabled && n > 100 {
		// The race detector makes each run ~10x slower; .ci/run also runs
		// the full set without it.
		n = 100
	}
	first := int64(1)
	if *propSeed >= 0 {
		first, n = *propSeed, 1
	}
	for seed := first; seed < first+int64(n); seed++ {
		if err := runWorkload(t, uint64(seed)); err != nil {
			t.Fatalf("seed %d: %v\nreplay with: go test ./transport/rc -run TestPropertyLossy -rc.seed=%d -v", seed, err, seed)
		}
	}
}

func runWorkload(t *testing.T, seed uint64) error {
	s := enginetest.NewSim(t, seed, enginetest.Impairment{Loss: 0.10, Dup: 0.05, Reorder: 0.10, Corrupt: 0.01, Delay: 2 * time.Microsecond})
	s.Keep = *propSeed >= 0
	s.Verbose = s.Keep
	defer func() {
		if s.Keep {
			if f := os.Getenv("RC_TRACE_FILE"); f != "" {
				os.WriteFile(f, []byte(strings.Join(s.Trace, "\n")+"\n"+s.Dump(debug)), 0o644)
			}
		}
	}()
	rng := rand.New(rand.NewPCG(seed, 42))
	pmtus := []int{256, 512, 1024, 2048, 4096}
	nqp := 1 + rng.IntN(3)
	type pair struct {
		qps     [2]*engine.QP
		ops     [2][]*propOp
		counter [2][]byte // 8-byte atomic target on each side
		ctrMR   [2]*memreg.MR
		adds    [2]uint64
	}
	pairs := make([]*pair, nqp)
	for i := range pairs {
		psn := [2]uint32{uint32(rng.IntN(1 << 24)), 0xffffff - uint32(rng.IntN(64))}
		pr := &pair{qps: s.Connect(enginetest.QPOpts{PMTU: pmtus[rng.IntN(len(pmtus))], PSN: psn, Timeout: 10, Retry: 7, RNRRetry: 7, MinRNR: 1, MaxRD: 1 << rng.IntN(4), Adaptive: propAdaptive})}
		for side := 0; side < 2; side++ {
			pr.ctrMR[side], pr.counter[side] = s.Reg(side, 8)
		}
		pairs[i] = pr
	}
	size := func() int {
		switch r := rng.IntN(100); {
		case r < 5:
			return 0
		case r < 70:
			return rng.IntN(4096)
		case r < 97:
			return rng.IntN(64 << 10)
		default:
			return rng.IntN(1 << 20)
		}
	}
	total := 0
	for _, pr := range pairs {
		for side := 0; side < 2; side++ {
			peer := 1 - side
			nops := 1 + rng.IntN(12)
			for k := 0; k < nops; k++ {
				op := &propOp{side: side}
				n := size()
				lmr, local := s.Reg(side, max(n, 1))
				rmr, remote := s.Reg(peer, max(n, 1))
				enginetest.FillRandom(local[:n], rng.Uint64())
				enginetest.FillRandom(remote[:n], rng.Uint64())
				id := uint64(k + 1)
				sgl := []wr.SGE{{Addr: lmr.Addr(), Length: uint32(n), LKey: lmr.LKey()}}
				if n > 8 && rng.IntN(3) == 0 { // split the local side into two SGEs
					h := n / 3
					sgl = []wr.SGE{{Addr: lmr.Addr(), Length: uint32(h), LKey: lmr.LKey()}, {Addr: lmr.Addr() + uint64(h), Length: uint32(n - h), LKey: lmr.LKey()}}
				}
				switch rng.IntN(6) {
				case 0:
					op.wr = wr.SendWR{ID: id, Opcode: wr.RDMAWrite, SGL: sgl, RemoteAddr: rmr.Addr(), RKey: rmr.RKey()}
					op.src, op.dst = local[:n], remote[:n]
				case 1:
					op.wr = wr.SendWR{ID: id, Opcode: wr.RDMAWriteWithImm, SGL: sgl, RemoteAddr: rmr.Addr(), RKey: rmr.RKey(), Imm: uint32(id)}
					op.src, op.dst = local[:n], remote[:n]
					op.recvID = id
				case 2:
					op.wr = wr.SendWR{ID: id, Opcode: wr.RDMARead, SGL: sgl, RemoteAddr: rmr.Addr(), RKey: rmr.RKey()}
					op.src, op.dst = remote[:n], local[:n]
				case 3:
					op.wr = wr.SendWR{ID: id, Opcode: wr.SendWithImm, SGL: sgl, Imm: uint32(id)}
					op.src, op.dst = local[:n], remote[:n]
					op.recvID = id
					// The receive buffer: the peer's region, posted up front.
				case 4, 5:
					add := uint64(rng.IntN(1000) + 1)
					res, _ := s.Reg(side, 8)
					op.wr = wr.SendWR{ID: id, Opcode: wr.AtomicFetchAndAdd, SGL: []wr.SGE{{Addr: res.Addr(), Length: 8, LKey: res.LKey()}},
						RemoteAddr: pr.ctrMR[peer].Addr(), RKey: pr.ctrMR[peer].RKey(), CompareAdd: add}
					op.add = add
					op.dst = res.Buf()
					pr.adds[peer] += add
				}
				op.wr.Flags = wr.Signaled
				if op.recvID != 0 {
					rsgl := []wr.SGE{{Addr: rmr.Addr(), Length: uint32(max(n, 1)), LKey: rmr.LKey()}}
					if op.wr.Opcode == wr.RDMAWriteWithImm {
						rsgl = nil
					}
					if err := pr.qps[peer].PostRecv(&wr.RecvWR{ID: id, SGL: rsgl}); err != nil {
						return err
					}
				}
				if err := pr.qps[side].PostSend(&op.wr); err != nil {
					return err
				}
				pr.ops[side] = append(pr.ops[side], op)
				total++
			}
		}
	}
	// Every QP shares its endpoint's CQs; completions of one QP must come
	// in its posting order.
	var wcs [2][]cq.WC
	var rwcs [2][]cq.WC
	buf := make([]cq.WC, 256)
	s.Pump(func() bool {
		for i := 0; i < 2; i++ {
			n := s.EP[i].SCQ.Poll(buf)
			wcs[i] = append(wcs[i], buf[:n]...)
			n = s.EP[i].RCQ.Poll(buf)
			rwcs[i] = append(rwcs[i], buf[:n]...)
		}
		return len(wcs[0])+len(wcs[1]) >= total
	}, 120*time.Second)
	if got := len(wcs[0]) + len(wcs[1]); got != total {
		return fmt.Errorf("%d of %d work requests completed after %v simulated\n%s", got, total, s.Now.Sub(enginetest.Epoch), s.Dump(debug))
	}
	for _, pr := range pairs {
		for side := 0; side < 2; side++ {
			var mine []cq.WC
			for _, wc := range wcs[side] {
				if wc.QPNum == pr.qps[side].Num() {
					mine = append(mine, wc)
				}
			}
			if len(mine) != len(pr.ops[side]) {
				return fmt.Errorf("QP %d: %d completions for %d WRs", pr.qps[side].Num(), len(mine), len(pr.ops[side]))
			}
			for k, wc := range mine {
				op := pr.ops[side][k]
				if wc.WRID != op.wr.ID || wc.Status != cq.Success {
					return fmt.Errorf("QP %d completion %d: wr_id %d status %v, want wr_id %d success (%v)", pr.qps[side].Num(), k, wc.WRID, wc.Status, op.wr.ID, op.wr.Opcode)
				}
				if op.add == 0 && !bytes.Equal(op.src, op.dst) {
					return fmt.Errorf("QP %d %v of %d bytes: data differs", pr.qps[side].Num(), op.wr.Opcode, len(op.src))
				}
			}
			// Receive completions: one per SEND / WRITE_WITH_IMM, in order.
			var recvs []cq.WC
			for _, wc := range rwcs[1-side] {
				if wc.QPNum == pr.qps[1-side].Num() {
					recvs = append(recvs, wc)
				}
			}
			k := 0
			for _, op := range pr.ops[side] {
				if op.recvID == 0 {
					continue
				}
				if k >= len(recvs) {
					return fmt.Errorf("missing receive completion for %v id %d", op.wr.Opcode, op.recvID)
				}
				wc := recvs[k]
				k++
				if wc.WRID != op.recvID || wc.Status != cq.Success || wc.ImmData != uint32(op.recvID) || wc.ByteLen != uint32(len(op.src)) {
					return fmt.Errorf("receive completion %+v for %v id %d len %d", wc, op.wr.Opcode, op.recvID, len(op.src))
				}
			}
			if k != len(recvs) {
				return fmt.Errorf("%d extra receive completions", len(recvs)-k)
			}
			// Atomics: the counter is the sum of the adds (none applied
			// twice), and the originals returned are distinct prefix sums.
			if got := binary.LittleEndian.Uint64(pr.counter[1-side]); got != pr.adds[1-side] {
				return fmt.Errorf("atomic counter = %d, want %d: an atomic was applied twice or lost", got, pr.adds[1-side])
			}
			seen := map[uint64]bool{}
			for _, op := range pr.ops[side] {
				if op.add != 0 {
					o := binary.LittleEndian.Uint64(op.dst)
					if seen[o] {
						return fmt.Errorf("two fetch-and-adds returned the same original %d", o)
					}
					seen[o] = true
				}
			}
		}
	}
	return nil
}
