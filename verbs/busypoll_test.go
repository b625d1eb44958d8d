package verbs

import (
	"context"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/nic/udp"
)

// openUDPDevice opens a device on a nic/udp link on 127.0.0.1 (a free
// port) and returns it with the port.
func openUDPDevice(t *testing.T, opts *Options) (*Device, uint16) {
	t.Helper()
	for try := 0; ; try++ {
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Skipf("no loopback UDP: %v", err)
		}
		port := c.LocalAddr().(*net.UDPAddr).Port
		c.Close()
		l, err := udp.Open(udp.Config{Addr: netip.MustParseAddr("127.0.0.1"), Port: port, MTU: 1500})
		if err != nil && try < 5 {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		d, err := Open(l, opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		return d, l.LocalAddrPort().Port()
	}
}

// busyPair connects an RC QP on a blocking device a to one on a
// busy-polling device b, over loopback UDP.
func busyPair(t *testing.T, depth int) (qa, qb *QP, ca, cb *CQ, b *Device) {
	a, pa := openUDPDevice(t, nil)
	b, pb := openUDPDevice(t, &Options{BusyPoll: 200 * time.Microsecond})
	qa, qb, ca, cb = connectRC(t, a, b, pa, pb, depth)
	return qa, qb, ca, cb, b
}

// connectRC connects an RC QP on a (UDP port pa) to one on b (port pb),
// each with its own CQ of 2*depth entries for both queues.
func connectRC(t *testing.T, a, b *Device, pa, pb uint16, depth int) (qa, qb *QP, ca, cb *CQ) {
	t.Helper()
	pda, _ := a.AllocPD()
	pdb, _ := b.AllocPD()
	ca, _ = a.CreateCQ(2 * depth)
	cb, _ = b.CreateCQ(2 * depth)
	cp := QPCap{MaxSendWR: depth, MaxRecvWR: depth}
	var err error
	if qa, err = pda.CreateQP(QPInitAttr{SendCQ: ca, RecvCQ: ca, Cap: cp}); err != nil {
		t.Fatal(err)
	}
	if qb, err = pdb.CreateQP(QPInitAttr{SendCQ: cb, RecvCQ: cb, Cap: cp}); err != nil {
		t.Fatal(err)
	}
	ga, _ := a.QueryGID(0)
	gb, _ := b.QueryGID(0)
	if err := qa.Connect(RemoteInfo{QPN: qb.Num(), PSN: 200, GID: gb}, &ConnectOptions{SQPSN: 100, Timeout: 14, RetryCnt: 7, RNRRetry: 7, RemotePort: pb}); err != nil {
		t.Fatal(err)
	}
	if err := qb.Connect(RemoteInfo{QPN: qa.Num(), PSN: 100, GID: ga}, &ConnectOptions{SQPSN: 200, Timeout: 14, RetryCnt: 7, RNRRetry: 7, RemotePort: pa}); err != nil {
		t.Fatal(err)
	}
	return qa, qb, ca, cb
}

// TestBusyPollInlineAndReceiveGoroutineRace: a stream of SENDs with
// immediate data reaches a busy-polling device whose consumer alternates
// between spinning on Poll (which runs the receive path on its goroutine)
// and sleeping in Wait (the device's receive goroutine delivers), so the
// two take turns and race at each switch. Every message completes exactly
// once, in order, on the receive CQ.
func TestBusyPollInlineAndReceiveGoroutineRace(t *testing.T) {
	const depth, total = 64, 3000
	qa, qb, ca, cb, b := busyPair(t, depth)
	for i := 0; i < depth; i++ {
		if err := qb.PostRecv(&RecvWR{ID: uint64(i)}); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(1)
	sendErr := make(chan error, 1)
	go func() {
		defer wg.Done()
		wcs := make([]cq.WC, 16)
		out := 0
		for i := 0; i < total; {
			for out < depth/2 && i < total {
				if err := qa.PostSend(&SendWR{ID: uint64(i), Opcode: WRSendWithImm, Flags: SendSignaled, Imm: uint32(i)}); err != nil {
					sendErr <- err
					return
				}
				i++
				out++
			}
			n, err := ca.Wait(ctx, wcs)
			if err != nil {
				sendErr <- err
				return
			}
			for _, wc := range wcs[:n] {
				if wc.Status != 0 {
					sendErr <- &wcError{wc}
					return
				}
			}
			out -= n
		}
	}()
	wcs := make([]cq.WC, 4)
	next := 0
	inline := 0
	for next < total {
		var n int
		if (next/50)%2 == 0 {
			// Spin: each empty Poll drives the device's receive path.
			if n = cb.Poll(wcs); n == 0 {
				if ctx.Err() != nil {
					t.Fatalf("after %d completions: %v", next, ctx.Err())
				}
				continue
			}
			inline += n
		} else {
			var err error
			if n, err = cb.Wait(ctx, wcs); err != nil {
				t.Fatalf("after %d completions: %v", next, err)
			}
		}
		for _, wc := range wcs[:n] {
			if wc.Status != 0 || wc.ImmData != uint32(next) || wc.WRID != uint64(next%depth) {
				t.Fatalf("completion %d: status %v imm %d wr_id %d, want success, imm %d, wr_id %d", next, wc.Status, wc.ImmData, wc.WRID, next, next%depth)
			}
			if err := qb.PostRecv(&RecvWR{ID: uint64(next % depth)}); err != nil {
				t.Fatal(err)
			}
			next++
		}
	}
	wg.Wait()
	select {
	case err := <-sendErr:
		t.Fatal(err)
	default:
	}
	// Nothing more than the stream arrived.
	time.Sleep(10 * time.Millisecond)
	if n := cb.Poll(wcs); n != 0 {
		t.Fatalf("%d completions beyond the %d sent: %+v", n, total, wcs[0])
	}
	if inline == 0 {
		t.Fatal("no completion was polled while spinning")
	}
	if st := b.drv.Stats(); st.Inline == 0 {
		t.Fatal("no packet was received on the polling goroutine")
	} else {
		t.Logf("%d packets received inline", st.Inline)
	}
}

type wcError struct{ wc cq.WC }

func (e *wcError) Error() string { return "send completed with " + e.wc.Status.String() }

// TestBusyPollRoundTripAllocs: a WRITE ping-pong from the busy-polling
// device, completed by a Poll loop that receives the ACK on its own
// goroutine, allocates nothing.
func TestBusyPollRoundTripAllocs(t *testing.T) {
	qa, qb, _, cb, b := busyPair(t, 8)
	w := write64(t, qa, qb)
	wcs := make([]cq.WC, 1)
	round := func() {
		if err := qb.PostSend(w); err != nil {
			t.Fatal(err)
		}
		for cb.Poll(wcs) == 0 {
			runtime.Gosched() // the peer device runs in this process
		}
		if wcs[0].Status != 0 {
			t.Fatalf("write completed with %v", wcs[0].Status)
		}
	}
	roundTripAllocs(t, b, round, "the polling goroutine")
}

// TestBusyPollWakesWaitersOnOtherCQs: while a consumer spins on an empty
// CQ of a busy-polling device (its polls receiving the packets), a waiter
// blocked on another CQ of the device gets each of its completions; after
// the consumer stops polling the receive goroutine takes over, and the
// waiter gets the next ones too.
func TestBusyPollWakesWaitersOnOtherCQs(t *testing.T) {
	const depth, each = 32, 200
	qa, qb, ca, cb, b := busyPair(t, depth)
	spin, _ := b.CreateCQ(4) // nothing ever completes here
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := 0; i < depth; i++ {
		if err := qb.PostRecv(&RecvWR{ID: uint64(i)}); err != nil {
			t.Fatal(err)
		}
	}
	// send sends messages from..from+each-1 one at a time; the waiter
	// receives each before the next leaves.
	send := func(from int) {
		t.Helper()
		wcs := make([]cq.WC, 1)
		for i := from; i < from+each; i++ {
			if err := qa.PostSend(&SendWR{ID: uint64(i), Opcode: WRSendWithImm, Flags: SendSignaled, Imm: uint32(i)}); err != nil {
				t.Fatal(err)
			}
			if _, err := cb.Wait(ctx, wcs); err != nil {
				t.Fatalf("receive %d: %v", i, err)
			}
			if wcs[0].Status != 0 || wcs[0].ImmData != uint32(i) {
				t.Fatalf("receive %d: status %v imm %d", i, wcs[0].Status, wcs[0].ImmData)
			}
			if err := qb.PostRecv(&RecvWR{ID: uint64(i)}); err != nil {
				t.Fatal(err)
			}
			if _, err := ca.Wait(ctx, wcs); err != nil || wcs[0].Status != 0 {
				t.Fatalf("send %d: %v %v", i, err, wcs[0].Status)
			}
		}
	}
	stop := make(chan struct{})
	spun := make(chan struct{})
	go func() {
		defer close(spun)
		wcs := make([]cq.WC, 1)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if spin.Poll(wcs) != 0 {
				t.Error("a completion on the CQ nothing completes on")
			}
		}
	}()
	time.Sleep(5 * time.Millisecond) // the receive goroutine backs off
	before := b.drv.Stats().Inline
	send(0)
	close(stop)
	<-spun
	inline := b.drv.Stats().Inline - before
	if inline == 0 {
		t.Fatal("the spinning consumer received none of the packets")
	}
	after := b.drv.Stats().Inline
	send(each)
	if n := b.drv.Stats().Inline; n != after {
		t.Fatalf("%d packets received inline with no consumer polling", n-after)
	}
	t.Logf("%d of %d packets received by the spinning consumer", inline, 2*each)
}
