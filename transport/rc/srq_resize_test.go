package rc

import (
	"testing"
	"time"

	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/transport/engine"
	"github.com/softroce/softroce/wr"
)

// TestSRQResize: growing keeps the posted WQEs and makes room for more;
// shrinking is allowed down to the posted count and refused below it or
// below the armed limit; a size below 1 is refused; a refused Modify
// changes nothing; the WQEs are then consumed, across both QPs, in
// posting order, none lost.
func TestSRQResize(t *testing.T) {
	f := newSRQFixture(t, 4)
	next := uint64(0)
	post := func(n int) {
		for range n {
			f.postSRQ(t, 100+next, int(next%8)*4096, 4096)
			next++
		}
	}
	post(4)
	if err := f.srq.PostRecv(f.recvWR(999)); err == nil {
		t.Fatal("post past max_wr accepted")
	}
	if err := f.srq.Modify(engine.SRQChange{MaxWR: 10, Resize: true}); err != nil {
		t.Fatal(err)
	}
	post(6)
	if q := f.srq.Query(); q.MaxWR != 10 || q.Posted != 10 {
		t.Fatalf("after growing: %+v", q)
	}
	for _, c := range []engine.SRQChange{
		{MaxWR: 9, Resize: true},                             // below the posted WQEs
		{MaxWR: 0, Resize: true},                             // below 1
		{MaxWR: 12, Limit: 13, Resize: true, SetLimit: true}, // limit above the new size
		{MaxWR: 11, Limit: 11, Resize: true, SetLimit: true}, // fine, but
		{MaxWR: 10, Resize: true},                            // now below the armed limit 11
		{MaxWR: 10, Limit: 2, Resize: true, SetLimit: false}, // still
	} {
		err := f.srq.Modify(c)
		if c.MaxWR == 11 {
			if err != nil {
				t.Fatalf("%+v: %v", c, err)
			}
			continue
		}
		if err == nil {
			t.Fatalf("%+v accepted", c)
		}
	}
	if q := f.srq.Query(); q.MaxWR != 11 || q.Limit != 11 || q.Posted != 10 {
		t.Fatalf("after refused modifies: %+v", q)
	}
	// Shrink and lower the limit at once.
	if err := f.srq.Modify(engine.SRQChange{MaxWR: 10, Limit: 1, Resize: true, SetLimit: true}); err != nil {
		t.Fatal(err)
	}
	// Three SENDs, then shrink to exactly what is left, then the rest.
	order := []int{1, 0, 0, 1, 0, 1, 1, 0, 0, 1}
	for i, k := range order {
		if i == 3 {
			if err := f.srq.Modify(engine.SRQChange{MaxWR: 7, Resize: true}); err != nil {
				t.Fatal(err)
			}
			if err := f.srq.PostRecv(f.recvWR(999)); err == nil {
				t.Fatal("post into the shrunk, full SRQ accepted")
			}
		}
		f.send(t, k, uint64(i+1), i*64, 100+i)
		f.s.WaitWC(f.s.EP[0].SCQ, 1, time.Second)
	}
	wcs := make([]cq.WC, 16)
	if n := f.s.EP[1].RCQ.Poll(wcs); n != len(order) {
		t.Fatalf("%d receive completions, want %d", n, len(order))
	}
	for i, k := range order {
		wc := wcs[i]
		if wc.Status != cq.Success || wc.WRID != uint64(100+i) || wc.QPNum != f.qps[k][1].Num() || wc.ByteLen != uint32(100+i) {
			t.Fatalf("completion %d: %+v, want WQE %d on QP %d", i, wc, 100+i, f.qps[k][1].Num())
		}
	}
	if f.limits != 1 {
		t.Fatalf("%d limit events, want 1", f.limits)
	}
	if q := f.srq.Query(); q.MaxWR != 7 || q.Posted != 0 {
		t.Fatalf("at the end: %+v", q)
	}
}

// Posting to a resized SRQ does not allocate.
func TestSRQResizedPostNoAlloc(t *testing.T) {
	f := newSRQFixture(t, 4)
	if err := f.srq.Modify(engine.SRQChange{MaxWR: 64, Resize: true}); err != nil {
		t.Fatal(err)
	}
	rwr := f.recvWR(1)
	rwr.SGL = append(rwr.SGL, rwr.SGL[0])
	n := testing.AllocsPerRun(32, func() {
		if err := f.srq.PostRecv(rwr); err != nil {
			t.Fatal(err)
		}
	})
	if n != 0 {
		t.Fatalf("%v allocations per post", n)
	}
}

func (f *srqFixture) recvWR(id uint64) *wr.RecvWR {
	return &wr.RecvWR{ID: id, SGL: []wr.SGE{{Addr: f.rmr.Addr(), Length: 64, LKey: f.rmr.LKey()}}}
}
