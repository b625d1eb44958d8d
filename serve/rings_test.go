package serve

import (
	"encoding/binary"
	"testing"

	"github.com/softroce/softroce/transport/engine"
)

// fakeKind is a ring's WQE kind that records, for every WQE verbs takes,
// the consumer index the client could see at that moment, and refuses
// posts as full while full is set.
type fakeKind struct {
	b         []byte
	r         *wqeRing
	built     []uint32 // the WQEs built, by their first word
	posted    []uint32
	consAtPut []uint32 // the published consumer index when each was posted
	full      bool
	cur       uint32
}

func (k *fakeKind) build(w []byte) string {
	k.cur = binary.LittleEndian.Uint32(w)
	k.built = append(k.built, k.cur)
	return ""
}

func (k *fakeKind) post() error {
	if k.full {
		return engine.ErrQueueFull
	}
	k.posted = append(k.posted, k.cur)
	k.consAtPut = append(k.consAtPut, load32(k.b, k.r.consAt))
	return nil
}

func (k *fakeKind) fail(*wqeRing, string) {}

func fakeRing(size uint32) (*wqeRing, *fakeKind, []byte, func(v uint32)) {
	const stride = 16
	b := make([]byte, ctlPage+int(size)*stride)
	k := &fakeKind{b: b}
	r := &wqeRing{kind: k, c: &client{s: &Server{}}, name: "send ring", off: ctlPage, size: size, stride: stride,
		prodAt: offSQProd, consAt: offSQCons}
	k.r = r
	// post writes WQE v into the next slot and publishes it, as the
	// library's post_send does.
	post := func(v uint32) {
		prod := load32(b, offSQProd)
		binary.LittleEndian.PutUint32(b[ctlPage+int(prod&(size-1))*stride:], v)
		store32(b, offSQProd, prod+1)
	}
	return r, k, b, post
}

// A WQE's slot is free (the consumer index past it) before the WQE goes to
// verbs: its completion can reach the client before post returns, and a
// client keeping the ring exactly full posts again on it (perftest's
// ib_send_bw saw ibv_post_send and ibv_post_recv fail with ENOMEM).
func TestRingSlotFreeBeforePost(t *testing.T) {
	r, k, b, post := fakeRing(4)
	for v := range uint32(4) {
		post(v + 100)
	}
	r.drain(b)
	if len(k.posted) != 4 {
		t.Fatalf("posted %v", k.posted)
	}
	for i, c := range k.consAtPut {
		if c != uint32(i+1) {
			t.Fatalf("WQE %d went to verbs with the consumer index at %d: its slot was not yet free", i, c)
		}
	}
}

// A WQE verbs refuses as full is taken all the same (its slot already
// free, the client may reuse it at once) and goes to verbs first on the
// next pass, unchanged, without being read again.
func TestRingHeldWQE(t *testing.T) {
	r, k, b, post := fakeRing(2)
	post(1)
	post(2)
	k.full = true
	r.drain(b)
	if got := load32(b, offSQCons); got != 1 || !r.held || len(k.posted) != 0 {
		t.Fatalf("after a full queue: consumer index %d, held %v, posted %v", got, r.held, k.posted)
	}
	post(3) // into the slot WQE 1 left
	k.full = false
	r.drain(b)
	if want := []uint32{1, 2, 3}; len(k.posted) != 3 || k.posted[0] != want[0] || k.posted[1] != want[1] || k.posted[2] != want[2] {
		t.Fatalf("posted %v, want %v", k.posted, want)
	}
	if len(k.built) != 3 || r.held || load32(b, offSQCons) != 3 {
		t.Fatalf("built %v, held %v, consumer index %d", k.built, r.held, load32(b, offSQCons))
	}
	if n := r.c.s.queueFull.Load(); n != 1 {
		t.Fatalf("queue full counted %d times", n)
	}
}
