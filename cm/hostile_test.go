package cm

import (
	"math/rand/v2"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/softroce/softroce/bth/mad"
)

type discardTx struct{ n int }

func (d *discardTx) SendMAD(Peer, []byte) error { d.n++; return nil }

func build(m *msg) []byte {
	b := make([]byte, MADSize)
	encode(b, m)
	return b
}

func TestMalformedMADsCountedAndDropped(t *testing.T) {
	tx := &discardTx{}
	e := newEngine(Config{Seed: 1}, tx, func(*event) {})
	e.listen(svc, nil)
	from := Peer{netip.MustParseAddrPort("10.0.0.9:4791"), 1}
	good := build(&msg{attr: attrREQ, tid: 1, localID: 5, serviceID: svc, qpn: 9, mtu: 3})
	cases := map[string][]byte{
		"short":         good[:100],
		"long":          append(append([]byte(nil), good...), 0),
		"empty":         nil,
		"base version":  mutate(good, 0, 2),
		"class":         mutate(good, 1, 0x81),
		"class version": mutate(good, 2, 1),
		"method":        mutate(good, 3, 0x01),
	}
	for name, b := range cases {
		e.Receive(t0, from, b)
		if s := e.Stats(); s.Conns != 0 {
			t.Fatalf("%s: created state", name)
		}
	}
	s := e.Stats()
	if s.Malformed != uint64(len(cases)) || tx.n != 0 {
		t.Errorf("malformed %d of %d, %d sent", s.Malformed, len(cases), tx.n)
	}
	// Unknown attributes, and LAP/APR, which RoCE does not do.
	for _, a := range []uint16{0x0020, 0xffff, attrLAP, attrAPR} {
		b := append([]byte(nil), good...)
		mad.MAD(b).SetAttrID(mad.AttrID(a))
		e.Receive(t0, from, b)
	}
	if s := e.Stats(); s.UnknownAttr != 4 || s.Conns != 0 {
		t.Errorf("unknown attributes: %+v", s)
	}
	// A REQ of another transport or a reserved MTU is rejected, not kept.
	e.Receive(t0, from, build(&msg{attr: attrREQ, tid: 2, localID: 6, serviceID: svc, qpn: 10, mtu: 3, transport: transportUC}))
	e.Receive(t0, from, build(&msg{attr: attrREQ, tid: 3, localID: 7, serviceID: svc, qpn: 11, mtu: 7}))
	if s := e.Stats(); s.RejectedOther != 2 || s.Conns != 0 || tx.n != 2 {
		t.Errorf("bad REQs: %+v, %d sent", s, tx.n)
	}
}

func mutate(b []byte, i int, v byte) []byte {
	c := append([]byte(nil), b...)
	c[i] = v
	return c
}

func TestUnknownCommIDs(t *testing.T) {
	tx := &discardTx{}
	e := newEngine(Config{Seed: 1}, tx, func(*event) { t.Error("event for an unknown comm ID") })
	from := Peer{netip.MustParseAddrPort("10.0.0.9:4791"), 1}
	for _, m := range []msg{
		{attr: attrREP, localID: 1, remoteID: 2, qpn: 3},
		{attr: attrRTU, localID: 1, remoteID: 2},
		{attr: attrDREP, localID: 1, remoteID: 2},
		{attr: attrREJ, localID: 1, remoteID: 2, reason: RejConsumerDefined},
		{attr: attrREJ, localID: 1, remoteID: 2, reason: RejTimeout, ari: guidBytes(5)},
		{attr: attrMRA, localID: 1, remoteID: 2, msgMRAed: msgRespREP},
		{attr: attrSIDRRep, localID: 1},
	} {
		e.Receive(t0, from, build(&m))
	}
	if s := e.Stats(); s.Unmatched != 7 || s.Conns != 0 || tx.n != 0 {
		t.Errorf("stats %+v, %d sent", s, tx.n)
	}
	// A DREQ for an unknown connection is answered with a DREP, as the
	// kernel does, so a peer that lost our DREP can finish.
	e.Receive(t0, from, build(&msg{attr: attrDREQ, localID: 1, remoteID: 2, qpn: 3}))
	if s := e.Stats(); s.Unmatched != 8 || tx.n != 1 {
		t.Errorf("DREQ: %+v, %d sent", s, tx.n)
	}
}

// TestREQFloodBounded feeds 100,000 REQs from forged comm IDs, QPNs, CA
// GUIDs and addresses to a listening engine: entries never pass the
// half-open cap, memory stays within a few MiB, and everything times out.
func TestREQFloodBounded(t *testing.T) {
	const n = 100_000
	const limit = 1024
	tx := &discardTx{}
	reqs := 0
	e := newEngine(Config{Seed: 1, MaxHalfOpen: limit}, tx, func(ev *event) {
		if ev.typ == evReqReceived {
			reqs++
		}
	})
	e.listen(svc, nil)
	rnd := rand.New(rand.NewPCG(1, 2))
	b := make([]byte, MADSize)
	m := msg{attr: attrREQ, serviceID: svc, mtu: 3, private: make([]byte, 56)}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	maxConns := 0
	for i := range n {
		m.tid = rnd.Uint64()
		m.localID = rnd.Uint32()
		m.qpn = rnd.Uint32() & 0xFFFFFF
		m.caGUID = rnd.Uint64()
		encode(b, &m)
		from := Peer{netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), 4791), 1}
		e.Receive(t0.Add(time.Duration(i)*time.Microsecond), from, b)
		if c := e.Stats().Conns; c > maxConns {
			maxConns = c
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	s := e.Stats()
	t.Logf("flood: %d REQs, max %d entries, %d half-open, %d dropped at the cap; heap %d KiB before, %d KiB after (+%d KiB)",
		n, maxConns, s.HalfOpen, s.HalfOpenDropped, before.HeapAlloc>>10, after.HeapAlloc>>10,
		(int64(after.HeapAlloc)-int64(before.HeapAlloc))>>10)
	if maxConns > limit || len(e.ids) > limit || len(e.remoteIDs) > limit || len(e.timed) > limit {
		t.Fatalf("%d entries (ids %d remote %d timed %d), cap %d", maxConns, len(e.ids), len(e.remoteIDs), len(e.timed), limit)
	}
	if reqs != limit || s.HalfOpenDropped != n-limit {
		t.Errorf("%d delivered, %d dropped", reqs, s.HalfOpenDropped)
	}
	if grow := int64(after.HeapAlloc) - int64(before.HeapAlloc); grow > 4<<20 {
		t.Errorf("heap grew %d KiB", grow>>10)
	}
	// Twenty seconds later a real requester finds the table full of
	// requests nobody retransmitted: the oldest gives way to it.
	later := t0.Add(20 * time.Second)
	m = msg{attr: attrREQ, tid: 1, localID: 0xabc, serviceID: svc, mtu: 3, qpn: 0x77, caGUID: 0x99, remoteCMTimeout: 20}
	encode(b, &m)
	e.Receive(later, Peer{netip.MustParseAddrPort("10.200.0.1:4791"), 1}, b)
	if s := e.Stats(); s.HalfOpenEvicted != 1 || s.HalfOpen != limit || e.remoteIDs[remoteKey{0xabc, 0x99}] == nil {
		t.Fatalf("a real REQ after the flood: %+v", s)
	}
	// Nobody accepts: every half-open entry is rejected and forgotten.
	e.Tick(t0.Add(2 * time.Minute))
	if s := e.Stats(); s.Conns != 0 || s.HalfOpen != 0 || len(e.timed) != 0 || len(e.remoteIDs) != 0 {
		t.Fatalf("after the accept timeout: %+v", s)
	}
	runtime.GC()
	var end runtime.MemStats
	runtime.ReadMemStats(&end)
	t.Logf("after the timeouts: heap %d KiB", end.HeapAlloc>>10)
}

// TestHalfOpenEvictionSparesLiveRequests: when the table is full, a
// request whose sender retransmitted it (a live peer, answered with an
// MRA) or that the application accepted is never evicted; only an old,
// silent one is, and a young one is not.
func TestHalfOpenEvictionSparesLiveRequests(t *testing.T) {
	tx := &discardTx{}
	var reqs []*conn
	e := newEngine(Config{Seed: 1, MaxHalfOpen: 3}, tx, func(ev *event) {
		if ev.typ == evReqReceived {
			reqs = append(reqs, ev.c)
		}
	})
	e.listen(svc, nil)
	b := make([]byte, MADSize)
	req := func(now time.Time, id uint32) {
		encode(b, &msg{attr: attrREQ, tid: uint64(id), localID: id, serviceID: svc, mtu: 3, qpn: id, caGUID: 7, remoteCMTimeout: 20})
		e.Receive(now, Peer{netip.MustParseAddrPort("10.0.0.9:4791"), 1}, b)
	}
	req(t0, 1)
	req(t0, 2)
	req(t0, 3)
	req(t0.Add(time.Second), 2) // the sender of 2 retransmits: live
	e.accept(t0, reqs[2], &repParams{qpn: 0x22})
	// Too young: nothing is evicted.
	req(t0.Add(2*time.Second), 4)
	if s := e.Stats(); s.HalfOpenEvicted != 0 || s.HalfOpenDropped != 1 {
		t.Fatalf("young table: %+v", s)
	}
	// Old enough (2 x 4096 ms + 1 s): only 1 may go.
	req(t0.Add(10*time.Second), 5)
	if s := e.Stats(); s.HalfOpenEvicted != 1 || !reqs[0].dead || reqs[1].dead || reqs[2].dead {
		t.Fatalf("old table: %+v, dead %v %v %v", s, reqs[0].dead, reqs[1].dead, reqs[2].dead)
	}
	req(t0.Add(11*time.Second), 6)
	if s := e.Stats(); s.HalfOpenEvicted != 1 || s.HalfOpenDropped != 2 {
		t.Fatalf("nothing else to evict: %+v", s)
	}
	if err := e.check(); err != nil {
		t.Fatal(err)
	}
}
