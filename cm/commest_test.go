package cm

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/softroce/softroce/bth/mad"
	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/verbs"
)

// frozenClock is simulated time that never advances: no CM timer fires,
// so nothing is retransmitted.
type frozenClock struct{ t time.Time }

type frozenTimer struct{ c chan time.Time }

func (c frozenClock) Now() time.Time               { return c.t }
func (c frozenClock) NewTimer(time.Duration) Timer { return frozenTimer{make(chan time.Time)} }
func (t frozenTimer) C() <-chan time.Time          { return t.c }
func (t frozenTimer) Stop() bool                   { return true }

// TestAcceptEstablishedByFirstPacket: the RTU is lost and time stands
// still (the REP would be retransmitted only after 4 s). The first packet
// the client sends on its QP establishes the passive side (COMM_EST):
// Accept returns, with one REP sent, and the SEND is received.
func TestAcceptEstablishedByFirstPacket(t *testing.T) {
	opts := &Options{Clock: frozenClock{time.Unix(1000, 0)}}
	a, b := sides(t, opts)
	var reps, rtus atomic.Int32
	a.tx.setDrop(func(m []byte) bool {
		if mad.MAD(m).AttrID() == mad.AttrRTU {
			rtus.Add(1)
			return true
		}
		return false
	})
	b.tx.setDrop(func(m []byte) bool {
		if mad.MAD(m).AttrID() == mad.AttrREP {
			reps.Add(1)
		}
		return false
	})
	l, err := b.cm.Listen(PortSpaceTCP, 7471)
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	bqp := b.newQP(t)
	if err := bqp.Init(0); err != nil {
		t.Fatal(err)
	}
	if err := bqp.PostRecv(&verbs.RecvWR{ID: 9, SGL: []verbs.SGE{{Addr: b.mr.Addr(), Length: 64, LKey: b.mr.LKey()}}}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var kb *Conn
	var aerr error
	accepted := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(accepted)
		req, err := l.Next(ctx)
		if err != nil {
			aerr = err
			return
		}
		kb, aerr = req.Accept(ctx, bqp, nil)
	}()
	aqp := a.newQP(t)
	ka, err := a.cm.Dial(ctx, b.cm.Local(), PortSpaceTCP, 7471, aqp, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The RTU was sent and lost: the passive side still waits.
	select {
	case <-accepted:
		t.Fatalf("accept returned before any packet: %v", aerr)
	case <-time.After(50 * time.Millisecond):
	}
	copy(a.buf, "ping")
	if err := aqp.PostSend(&verbs.SendWR{ID: 1, Opcode: verbs.WRSend, Flags: verbs.SendSignaled,
		SGL: []verbs.SGE{{Addr: a.mr.Addr(), Length: 4, LKey: a.mr.LKey()}}}); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if aerr != nil {
		t.Fatalf("accept: %v", aerr)
	}
	if reps.Load() != 1 || rtus.Load() != 1 {
		t.Fatalf("%d REPs, %d RTUs sent, want 1 each", reps.Load(), rtus.Load())
	}
	wc := make([]verbs.WC, 1)
	if _, err := b.cq.Wait(ctx, wc); err != nil || wc[0].Status != cq.Success || string(b.buf[:4]) != "ping" {
		t.Fatalf("receive: %v %+v %q", err, wc[0], b.buf[:4])
	}
	if err := ka.Disconnect(ctx); err != nil {
		t.Fatal(err)
	}
	<-kb.Done()
}
