package cm

import (
	"fmt"
	"net/netip"
	"testing"
	"time"
)

// The fuzz targets feed raw MADs to an engine whose application accepts,
// answers and disconnects everything, so that a sequence of messages can
// walk it through every state. Seeds (testdata/fuzz) are real exchanges
// recorded from the in-memory tests, whose comm IDs match the engines'
// fixed seeds. After every MAD the engine's tables must agree with each
// other and with the half-open cap.

const fuzzCap = 8

// fuzzEngine is an engine as a passive side (listening on svc) that has
// also sent a REQ of its own, with an application that says yes to all.
func fuzzEngine(tx Transport) (*engine, time.Time) {
	var e *engine
	now := t0
	e = newEngine(Config{Seed: 8, GUID: 0x2222, MaxHalfOpen: fuzzCap}, tx, func(ev *event) {
		switch ev.typ {
		case evReqReceived:
			e.accept(now, ev.c, &repParams{qpn: 0x22, psn: 0x123456, respRes: 1, initDepth: 1})
		case evRepReceived:
			e.rtu(now, ev.c, []byte("rtu"))
			// Established connections live forever; end this one so the
			// test can demand that everything ends.
			e.disconnect(now, ev.c, nil)
		case evDreqReceived:
			e.disconnect(now, ev.c, nil)
		case evSIDRReqReceived:
			e.sidrReply(ev.c, SIDRSuccess, 0x33, 0x01234567, nil)
		case evEstablished:
			e.disconnect(now, ev.c, []byte("bye"))
		}
	})
	e.listen(svc, nil)
	e.connect(now, &reqParams{peer: Peer{netip.MustParseAddrPort("10.0.0.1:4791"), 1}, serviceID: svc,
		qpn: 0x44, psn: 7, mtu: 3, hopLimit: 64})
	return e, now
}

func fuzzFeed(t *testing.T, data []byte) {
	e, now := fuzzEngine(&discardTx{})
	from := Peer{netip.MustParseAddrPort("10.0.0.1:4791"), 1}
	for len(data) > 0 {
		n := min(len(data), MADSize)
		chunk := data[:n]
		data = data[n:]
		// A chunk shorter than a MAD is fed as is: it must be refused.
		e.Receive(now, from, chunk)
		now = now.Add(time.Second)
		e.Tick(now)
		if err := e.check(); err != nil {
			t.Fatal(err)
		}
	}
	// Whatever was fed, everything ends once time runs out.
	for i := 0; i < 200; i++ {
		d := e.NextDeadline()
		if d.IsZero() {
			break
		}
		e.Tick(d)
	}
	if s := e.Stats(); s.Conns != 0 || s.HalfOpen != 0 || !e.NextDeadline().IsZero() {
		t.Fatalf("once every timer ran out: %+v", s)
	}
}

// check verifies the engine's tables agree.
func (e *engine) check() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	half := 0
	for id, c := range e.ids {
		if c.dead || c.localID != id {
			return fmt.Errorf("ids[%#x] holds %#x dead=%v", id, c.localID, c.dead)
		}
		if c.passive && c.state.halfOpen() {
			half++
		}
		if (c.rt.on || !c.waitAt.IsZero()) != (func() bool { _, ok := e.timed[c]; return ok })() {
			return fmt.Errorf("conn %#x in %v: timer set and timed table disagree", id, c.state)
		}
	}
	if half != e.halfOpen || half > e.cfg.MaxHalfOpen {
		return fmt.Errorf("half-open %d counted %d cap %d", half, e.halfOpen, e.cfg.MaxHalfOpen)
	}
	if len(e.ids) != e.stats.Conns {
		return fmt.Errorf("%d ids, %d counted", len(e.ids), e.stats.Conns)
	}
	for k, c := range e.remoteIDs {
		if c.dead || e.ids[c.localID] != c || c.remoteID != k.id {
			return fmt.Errorf("remoteIDs entry %+v stale", k)
		}
	}
	for k, c := range e.remoteQPs {
		if c.dead || e.ids[c.localID] != c || c.remoteQPN != k.id {
			return fmt.Errorf("remoteQPs entry %+v stale", k)
		}
	}
	for c := range e.timed {
		if c.dead {
			return fmt.Errorf("dead conn %#x in the timer set", c.localID)
		}
	}
	for k, c := range e.sidr {
		if c.dead || c.state != stSIDRReqRcvd {
			return fmt.Errorf("sidr entry %+v in %v", k, c.state)
		}
	}
	return nil
}

// seedExchange records what a peer sends to the fuzz engine in a full
// exchange: REQ to its listener, RTU, DREQ, REP for its own REQ, SIDR_REQ,
// and the duplicates and strays of the hostile tests.
func seedExchanges() [][]byte {
	var seeds [][]byte
	e, now := fuzzEngine(&discardTx{})
	// Find the fuzz engine's own REQ comm ID to answer it.
	var active *conn
	for _, c := range e.ids {
		active = c
	}
	rep := build(&msg{attr: attrREP, tid: active.tid, localID: 0x5151, remoteID: active.localID, qpn: 0x66, psn: 9,
		respRes: 1, initDepth: 1, caGUID: 0x1111})
	req := build(&msg{attr: attrREQ, tid: 0x77, localID: 0x6161, serviceID: svc, caGUID: 0x1111, qpn: 0x55, psn: 5,
		mtu: 3, localCMTimeout: 20, maxCMRetries: 15, localAckTimeout: 17, private: make([]byte, 36)})
	// The engine's reply to the REQ names its passive comm ID; learn it.
	var rec recTx
	e2, _ := fuzzEngine(&rec)
	e2.Receive(now, Peer{netip.MustParseAddrPort("10.0.0.1:4791"), 1}, req)
	var passiveID uint32
	for _, b := range rec.sent {
		var m msg
		if decode(b, &m) == nil && m.attr == attrREP {
			passiveID = m.localID
		}
	}
	rtu := build(&msg{attr: attrRTU, tid: 0x77, localID: 0x6161, remoteID: passiveID})
	dreq := build(&msg{attr: attrDREQ, tid: 0x78, localID: 0x6161, remoteID: passiveID, qpn: 0x22})
	drep := build(&msg{attr: attrDREP, tid: 0x79, localID: 0x5151, remoteID: active.localID})
	mra := build(&msg{attr: attrMRA, tid: active.tid, localID: 0x5151, remoteID: active.localID, msgMRAed: msgRespREQ, serviceTimeout: 20})
	rej := build(&msg{attr: attrREJ, tid: active.tid, localID: 0x5151, remoteID: active.localID, msgRejected: msgRespREQ, reason: RejConsumerDefined})
	sidr := build(&msg{attr: attrSIDRReq, tid: 0x80, localID: 0x7171, serviceID: svc})
	cat := func(parts ...[]byte) []byte {
		var b []byte
		for _, p := range parts {
			b = append(b, p...)
		}
		return b
	}
	seeds = append(seeds,
		cat(req, rtu, dreq),
		cat(req, req, rtu, rtu, dreq, dreq),
		cat(rep, rep, drep),
		cat(mra, rep),
		cat(rej),
		cat(sidr, sidr),
		cat(req, rej),
		cat(rep, dreq, drep),
		req[:100],
	)
	_ = now
	return seeds
}

type recTx struct{ sent [][]byte }

func (r *recTx) SendMAD(_ Peer, b []byte) error {
	r.sent = append(r.sent, append([]byte(nil), b...))
	return nil
}

func FuzzCMReceive(f *testing.F) {
	for _, s := range seedExchanges() {
		f.Add(s)
	}
	f.Fuzz(fuzzFeed)
}

// TestFuzzSeedsReachStates checks that the seeds walk the engine through
// its states, so the fuzzer starts deep: the REQ seed establishes and
// disconnects a passive connection, the REP seed an active one.
func TestFuzzSeedsReachStates(t *testing.T) {
	seeds := seedExchanges()
	var rec recTx
	e, now := fuzzEngine(&rec)
	from := Peer{netip.MustParseAddrPort("10.0.0.1:4791"), 1}
	for i := 0; i+MADSize <= len(seeds[0]); i += MADSize {
		e.Receive(now, from, seeds[0][i:i+MADSize])
	}
	for i := 0; i+MADSize <= len(seeds[2]); i += MADSize {
		e.Receive(now, from, seeds[2][i:i+MADSize])
	}
	var sent []uint16
	for _, b := range rec.sent {
		var m msg
		if decode(b, &m) == nil {
			sent = append(sent, m.attr)
		}
	}
	want := map[uint16]bool{attrREQ: true, attrREP: true, attrRTU: true, attrDREQ: true, attrDREP: true}
	for _, a := range sent {
		delete(want, a)
	}
	if len(want) != 0 {
		t.Fatalf("seeds never made the engine send %v (sent %#x)", want, sent)
	}
}

// FuzzCMExchange runs a whole exchange between two engines (a dials, b
// accepts, both disconnect once established) through a network the fuzzer
// controls: each input byte decides the fate of the next MAD in flight
// (deliver, lose, duplicate, corrupt one byte, or let time run to the next
// timer first). Whatever it does, both engines' tables stay consistent,
// every communication ends once time runs out, and when no MAD was
// corrupted the two ends agree on QPNs and PSNs.
func FuzzCMExchange(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{4, 0, 0, 0, 0, 0})          // lose the REQ
	f.Add([]byte{0, 4, 0, 0, 0, 0, 0})       // lose the REP
	f.Add([]byte{0, 0, 4, 7, 0, 0, 0})       // lose the RTU
	f.Add([]byte{5, 5, 5, 5, 5, 5, 5, 5})    // duplicate everything
	f.Add([]byte{7, 7, 7, 7, 7, 7, 7, 7, 7}) // let timers run between messages
	f.Add([]byte{6, 30, 1, 0, 6, 40, 9, 0})  // corrupt
	f.Fuzz(func(t *testing.T, data []byte) {
		nw := newMemNet()
		a := nw.add("10.0.0.1:4791", Config{MaxHalfOpen: fuzzCap})
		b := nw.add("10.0.0.2:4791", Config{MaxHalfOpen: fuzzCap})
		b.e.listen(svc, nil)
		now := t0
		corrupted := false
		var ac, bc *conn
		a.on = func(n *node, ev *event) {
			if ev.typ == evRepReceived {
				ac = ev.c
				n.e.rtu(now, ev.c, nil)
				n.e.disconnect(now, ev.c, nil)
			}
		}
		b.on = func(n *node, ev *event) {
			switch ev.typ {
			case evReqReceived:
				n.e.accept(now, ev.c, &repParams{qpn: 0x22, psn: 0x123456, respRes: ev.c.respRes, initDepth: ev.c.initDepth})
			case evEstablished:
				bc = ev.c
			case evDreqReceived:
				n.e.disconnect(now, ev.c, nil)
			}
		}
		a.e.connect(now, testReq(b))
		for len(nw.queue) > 0 || len(data) > 0 {
			if len(nw.queue) == 0 {
				// Nothing in flight: let the next timer fire.
				d := earliest(a, b)
				if d.IsZero() {
					break
				}
				now = d
				a.e.Tick(now)
				b.e.Tick(now)
				continue
			}
			p := nw.queue[0]
			nw.queue = nw.queue[1:]
			act := byte(0)
			if len(data) > 0 {
				act, data = data[0]%8, data[1:]
			}
			dst := nw.nodes[p.to.Addr]
			switch act {
			case 4:
				continue
			case 5:
				dst.e.Receive(now, p.from, p.b)
			case 6:
				if len(data) >= 2 {
					p.b[int(data[0])%len(p.b)] ^= data[1] | 1
					data = data[2:]
					corrupted = true
				}
			case 7:
				if d := earliest(a, b); !d.IsZero() {
					now = d
					a.e.Tick(now)
					b.e.Tick(now)
				}
			}
			dst.e.Receive(now, p.from, p.b)
			for _, n := range []*node{a, b} {
				if err := n.e.check(); err != nil {
					t.Fatal(err)
				}
			}
		}
		if !corrupted && ac != nil && bc != nil {
			if ac.remoteQPN != 0x22 || bc.remoteQPN != 0x11 || ac.sqPSN != bc.rqPSN || bc.sqPSN != ac.rqPSN ||
				ac.remoteID != bc.localID || bc.remoteID != ac.localID {
				t.Fatalf("the ends disagree: active %+v passive %+v", ac, bc)
			}
		}
		for i := 0; i < 400; i++ {
			d := earliest(a, b)
			if d.IsZero() {
				break
			}
			now = d
			a.e.Tick(now)
			b.e.Tick(now)
			nw.deliver(now)
		}
		// The IB CM has no keepalive: a side whose every DREQ was lost
		// stays established. Nothing else may be left.
		for _, n := range []*node{a, b} {
			for _, c := range n.e.ids {
				if c.state != stEstablished {
					t.Fatalf("%v: communication %#x left in %v", n.addr, c.localID, c.state)
				}
			}
			if s := n.e.Stats(); s.HalfOpen != 0 {
				t.Fatalf("%v: left %+v", n.addr, s)
			}
		}
	})
}

func earliest(nodes ...*node) time.Time {
	var d time.Time
	for _, n := range nodes {
		if t := n.e.NextDeadline(); !t.IsZero() && (d.IsZero() || t.Before(d)) {
			d = t
		}
	}
	return d
}
