package netns

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/netnstest"
	"github.com/softroce/softroce/nic/udp"
	"github.com/softroce/softroce/verbs"
)

// pingPong is two devices over a veth pair exchanging 64-byte SENDs, one
// at a time, each side reposting its receive.
type pingPong struct {
	la, lb     *udp.Link
	qa, qb     *verbs.QP
	ca, cb     *verbs.CQ
	ma, mb     *verbs.MR
	busy       bool
	wa, wb     []verbs.WC
	devA, devB *verbs.Device
}

func newPingPong(t testing.TB, busyPoll time.Duration) *pingPong {
	v := netnstest.Pair(t, netnstest.VethConfig{MTU: 9000})
	p := &pingPong{busy: busyPoll > 0, wa: make([]verbs.WC, 1), wb: make([]verbs.WC, 1)}
	p.la, p.lb = udpBackend.open(t, v.A).(*udp.Link), udpBackend.open(t, v.B).(*udp.Link)
	var err error
	if p.devA, err = verbs.Open(p.la, &verbs.Options{BusyPoll: busyPoll}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.devA.Close() })
	if p.devB, err = verbs.Open(p.lb, &verbs.Options{BusyPoll: busyPoll}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.devB.Close() })
	pda, _ := p.devA.AllocPD()
	pdb, _ := p.devB.AllocPD()
	if p.ma, err = pda.RegMR(make([]byte, 128), verbs.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	if p.mb, err = pdb.RegMR(make([]byte, 128), verbs.AccessLocalWrite); err != nil {
		t.Fatal(err)
	}
	p.ca, _ = p.devA.CreateCQ(8)
	p.cb, _ = p.devB.CreateCQ(8)
	if p.qa, err = pda.CreateQP(verbs.QPInitAttr{SendCQ: p.ca, RecvCQ: p.ca, Cap: verbs.QPCap{MaxSendWR: 2, MaxRecvWR: 2}}); err != nil {
		t.Fatal(err)
	}
	if p.qb, err = pdb.CreateQP(verbs.QPInitAttr{SendCQ: p.cb, RecvCQ: p.cb, Cap: verbs.QPCap{MaxSendWR: 2, MaxRecvWR: 2}}); err != nil {
		t.Fatal(err)
	}
	gidA, _ := p.devA.QueryGID(0)
	gidB, _ := p.devB.QueryGID(0)
	// Seven retries: a host stalled past one ACK timeout (16 ms) only
	// retransmits.
	o := &verbs.ConnectOptions{PathMTU: 4096, SQPSN: 1, Timeout: 12, RetryCnt: 7, RNRRetry: 7}
	if err := p.qa.Connect(verbs.RemoteInfo{QPN: p.qb.Num(), PSN: 1, GID: gidB}, o); err != nil {
		t.Fatal(err)
	}
	if err := p.qb.Connect(verbs.RemoteInfo{QPN: p.qa.Num(), PSN: 1, GID: gidA}, o); err != nil {
		t.Fatal(err)
	}
	p.recv(t, p.qa, p.ma)
	p.recv(t, p.qb, p.mb)
	return p
}

func (p *pingPong) recv(t testing.TB, qp *verbs.QP, mr *verbs.MR) {
	if err := qp.PostRecv(&verbs.RecvWR{ID: 1, SGL: []verbs.SGE{{Addr: mr.Addr() + 64, Length: 64, LKey: mr.LKey()}}}); err != nil {
		t.Fatal(err)
	}
}

func (p *pingPong) send(t testing.TB, qp *verbs.QP, mr *verbs.MR) {
	// Unsignaled: the peer's answer is the completion that counts.
	if err := qp.PostSend(&verbs.SendWR{ID: 2, Opcode: verbs.WRSend, SGL: []verbs.SGE{{Addr: mr.Addr(), Length: 64, LKey: mr.LKey()}}}); err != nil {
		t.Fatal(err)
	}
}

// await returns the next receive completion on cq: spinning on Poll when
// busy-polling, else sleeping in Wait.
func (p *pingPong) await(t testing.TB, cq *verbs.CQ, wc []verbs.WC) {
	for {
		if p.busy {
			for cq.Poll(wc) == 0 {
				runtime.Gosched()
			}
		} else {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := cq.Wait(ctx, wc)
			cancel()
			if err != nil {
				t.Fatal(err)
			}
		}
		if wc[0].Status.String() != "success" {
			t.Fatalf("completion %+v", wc[0])
		}
		if wc[0].WRID == 1 {
			return
		}
	}
}

// round is one round trip: A sends, B answers.
func (p *pingPong) round(t testing.TB) {
	p.send(t, p.qa, p.ma)
	p.await(t, p.ca, p.wa)
	p.recv(t, p.qa, p.ma)
}

// serve is B's side: answer every SEND.
func (p *pingPong) serve(t testing.TB, n int) {
	for i := 0; i < n; i++ {
		p.await(t, p.cb, p.wb)
		p.recv(t, p.qb, p.mb)
		p.send(t, p.qb, p.mb)
	}
}

// TestBusyPoll: with verbs.Options.BusyPoll the devices' receive loops
// take packets by polling the link (udp.Link.Polled counts them), and
// the exchange works; without it, no packet is polled.
func TestBusyPoll(t *testing.T) {
	netnstest.Require(t)
	for _, bp := range []time.Duration{0, time.Second} {
		p := newPingPong(t, bp)
		const n = 100
		go p.serve(t, n)
		for i := 0; i < n; i++ {
			p.round(t)
		}
		polled := p.la.Polled() + p.lb.Polled()
		if bp == 0 && polled != 0 || bp > 0 && polled == 0 {
			t.Errorf("BusyPoll %v: %d packets polled", bp, polled)
		}
		if bp > 0 && p.la.Polled() < n/2 {
			// A spins for a second after each packet: the answers
			// arrive while it does.
			t.Errorf("BusyPoll %v: A polled %d of %d answers", bp, p.la.Polled(), n)
		}
	}
}

// BenchmarkRCLat64 is a 64-byte SEND ping-pong between the two ends of a
// veth: blocking, and with BusyPoll (the devices' receive loops and the
// CQ both polled). ns/op is one round trip.
func BenchmarkRCLat64(b *testing.B) {
	netnstest.Require(b)
	for _, c := range []struct {
		name string
		bp   time.Duration
	}{{"blocking", 0}, {"busy-poll", time.Millisecond}} {
		b.Run(c.name, func(b *testing.B) {
			p := newPingPong(b, c.bp)
			go p.serve(b, b.N)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				p.round(b)
			}
		})
	}
}
