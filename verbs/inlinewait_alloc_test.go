package verbs

import (
	"context"
	"testing"

	"github.com/softroce/softroce/cq"
)

// TestInlineWaitRoundTripAllocs: a WRITE round trip whose completion the
// consumer waits for in CQ.Wait, receiving the ACK itself (inline wait),
// allocates nothing.
func TestInlineWaitRoundTripAllocs(t *testing.T) {
	a, pa := openUDPDevice(t, nil)
	b, pb := openUDPDevice(t, nil)
	qa, qb, _, cb := connectRC(t, a, b, pa, pb, 8)
	w := write64(t, qa, qb)
	wcs := make([]cq.WC, 1)
	ctx := context.Background()
	round := func() {
		if err := qb.PostSend(w); err != nil {
			t.Fatal(err)
		}
		if n, err := cb.Wait(ctx, wcs); n != 1 || err != nil || wcs[0].Status != 0 {
			t.Fatalf("wait = %d, %v, status %v", n, err, wcs[0].Status)
		}
	}
	roundTripAllocs(t, b, round, "the waiting goroutine")
}

// write64 is a signaled 64-byte WRITE from qb into a fresh MR of qa.
func write64(t *testing.T, qa, qb *QP) *SendWR {
	t.Helper()
	mr, err := qa.pd.RegMR(make([]byte, 64), AccessLocalWrite|AccessRemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	src, _ := qb.pd.RegMR(make([]byte, 64), AccessLocalWrite)
	return &SendWR{Opcode: WRRDMAWrite, Flags: SendSignaled, RemoteAddr: mr.Addr(), RKey: mr.RKey(),
		SGL: []SGE{{Addr: src.Addr(), Length: 64, LKey: src.LKey()}}}
}

// roundTripAllocs warms round up, then fails if it allocates or if no
// ACK was handled inline on b (by who, for the message).
func roundTripAllocs(t *testing.T, b *Device, round func(), who string) {
	t.Helper()
	for i := 0; i < 20; i++ {
		round()
	}
	before := b.drv.Stats().Inline
	if a := testing.AllocsPerRun(50, round); a != 0 {
		t.Fatalf("%v allocations per round trip, want 0", a)
	}
	if b.drv.Stats().Inline == before {
		t.Fatalf("no ACK was received by %s", who)
	}
}
