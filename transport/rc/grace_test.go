package rc

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/transport/engine"
	"github.com/softroce/softroce/transport/internal/enginetest"
	"github.com/softroce/softroce/wr"
)

// handLink is a requester's link whose wire is the test: Send hands out
// copies of the packets, Recv returns what the test puts in.
type handLink struct {
	sent   chan []byte
	in     chan []byte
	closed chan struct{}
	peer   netip.Addr
}

func newHandLink(peer netip.Addr) *handLink {
	return &handLink{sent: make(chan []byte, 64), in: make(chan []byte, 64), closed: make(chan struct{}), peer: peer}
}

func (l *handLink) Send(pkts []nic.Packet) (int, error) {
	for i := range pkts {
		l.sent <- append([]byte(nil), pkts[i].Bytes()...)
	}
	return len(pkts), nil
}

func (l *handLink) Recv(pkts []nic.Packet) (int, error) {
	select {
	case b := <-l.in:
		pkts[0].N = copy(pkts[0].Buf, b)
		pkts[0].Remote = engine.Remote(l.peer)
		pkts[0].Local = netip.MustParseAddr("10.0.0.1")
		pkts[0].ICRC = nic.ICRCVerified
		return 1, nil
	case <-l.closed:
		return 0, net.ErrClosed
	}
}

func (l *handLink) BatchSize() int      { return 4 }
func (l *handLink) MTU() int            { return 1500 }
func (l *handLink) Addrs() []netip.Addr { return []netip.Addr{netip.MustParseAddr("10.0.0.1")} }
func (l *handLink) Stats() nic.Stats    { return nic.Stats{} }
func (l *handLink) Close() error        { close(l.closed); return nil }

func (l *handLink) next(t *testing.T, what string) []byte {
	t.Helper()
	select {
	case b := <-l.sent:
		return b
	case <-time.After(time.Minute):
		t.Fatalf("no %s was sent", what)
		return nil
	}
}

// TestDueTimerLetsArrivedACKIn: the ACK for a request is already waiting
// on the link when the local ACK timeout comes due (the process was not
// scheduled in between, as in a loaded VM): the driver lets the receive
// side take it before the engine acts on the deadline, so the request
// completes without a timeout or a retransmission. With nothing arriving
// the timeout still fires after the grace.
func TestDueTimerLetsArrivedACKIn(t *testing.T) {
	s := enginetest.NewSim(t, 1, enginetest.Impairment{})
	// Timeout 10: 4.2 ms.
	qps := s.Connect(enginetest.QPOpts{Timeout: 10, Retry: 7, RNRRetry: 7})
	link := newHandLink(s.EP[1].Addr)
	// A grace far longer than the test: while the timer goroutine holds
	// back, only the receive side can have acted.
	d := engine.NewDriverWith(s.EP[0].E, link, engine.DriverConfig{TimerGrace: time.Hour})
	defer d.Close()
	if err := qps[1].PostRecv(&wr.RecvWR{ID: 9}); err != nil {
		t.Fatal(err)
	}
	enginetest.MustPost(t, qps[0], &wr.SendWR{ID: 1, Opcode: wr.Send, Flags: wr.Signaled})
	d.Kick()
	req := link.next(t, "SEND")
	// The responder answers at once; the ACK reaches the link only after
	// the deadline has passed.
	s.EP[1].E.Receive(time.Now(), []nic.Packet{{Buf: req, N: len(req), Remote: engine.Remote(s.EP[0].Addr), Local: s.EP[1].Addr, ICRC: nic.ICRCVerified}})
	out, _ := s.EP[1].E.Progress(time.Now())
	if len(out) != 1 {
		t.Fatalf("responder sent %d packets, want one ACK", len(out))
	}
	ack := append([]byte(nil), out[0].Bytes()...)
	s.EP[1].E.Release(out)
	time.Sleep(50 * time.Millisecond) // > 4.2 ms: the deadline is due
	link.in <- ack
	wcs := make([]cq.WC, 1)
	for s.EP[0].SCQ.Poll(wcs) == 0 {
		time.Sleep(time.Millisecond)
	}
	if wcs[0].WRID != 1 || wcs[0].Status != cq.Success {
		t.Fatalf("completion %+v", wcs[0])
	}
	if st := qps[0].Stats(); st.Timeouts != 0 || st.Retransmits != 0 {
		t.Fatalf("an ACK that had arrived was timed out: %+v", st)
	}
	select {
	case b := <-link.sent:
		t.Fatalf("sent %d more bytes after the request", len(b))
	default:
	}

	// No ACK at all: after the (default) grace the timeout fires and the
	// request goes out again.
	s2 := enginetest.NewSim(t, 2, enginetest.Impairment{})
	qps2 := s2.Connect(enginetest.QPOpts{Timeout: 10, Retry: 7, RNRRetry: 7})
	link2 := newHandLink(s2.EP[1].Addr)
	d2 := engine.NewDriverWith(s2.EP[0].E, link2, engine.DriverConfig{})
	defer d2.Close()
	enginetest.MustPost(t, qps2[0], &wr.SendWR{ID: 1, Opcode: wr.Send, Flags: wr.Signaled})
	d2.Kick()
	first := link2.next(t, "SEND")
	again := link2.next(t, "retransmission")
	if string(first) != string(again) {
		t.Fatal("the retransmission differs from the request")
	}
	if st := qps2[0].Stats(); st.Timeouts == 0 || st.Retransmits == 0 {
		t.Fatalf("no timeout counted: %+v", st)
	}
}
