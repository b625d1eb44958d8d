package cases

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/nic/pipe"
)

// nakTarget is a scripted responder on a pipe: it NAKs every request
// with remote access error at the request's PSN, and, when late is not
// zero, NAKs it a second time late after the first. It stands for a
// target whose duplicate answer a busy machine delays.
type nakTarget struct {
	link nic.Link
	peer *Peer
	late time.Duration
	done chan struct{}
	// peerQPN is the peer QP number of the session open now.
	peerQPN atomic.Uint32
}

const nakTargetQPN = 0x4242

func newNAKTarget(t *testing.T, late time.Duration) *nakTarget {
	a, b := pipe.New(pipe.Config{})
	peer, err := NewPeer(b.(nic.RawSender))
	if err != nil {
		t.Fatal(err)
	}
	nt := &nakTarget{link: a, peer: peer, late: late, done: make(chan struct{})}
	go nt.serve()
	t.Cleanup(func() { nt.Close() })
	return nt
}

func (nt *nakTarget) serve() {
	defer close(nt.done)
	pkts := make([]nic.Packet, nt.link.BatchSize())
	for i := range pkts {
		pkts[i].Buf = make([]byte, 9000)
	}
	for {
		n, err := nt.link.Recv(pkts)
		if err != nil {
			return
		}
		for _, k := range pkts[:n] {
			var p bth.Packet
			if bth.Parse(&p, k.Bytes()) != nil || !p.Info.Request {
				continue
			}
			// A request does not carry its sender's QP number: the
			// session's spec does.
			f := bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCAck, PSN: p.BTH.PSN(), DestQP: nt.peerQPN.Load(), PKey: 0xffff},
				Syndrome: bth.SyndromeRemoteAccessError}
			buf := make([]byte, 256)
			m, err := bth.Build(buf, &f, nil)
			if err != nil {
				continue
			}
			out := []nic.Packet{{Buf: buf, N: m, Remote: k.Remote, SrcPort: nic.RoCEv2Port}}
			nt.link.Send(out)
			if nt.late > 0 {
				again := append([]byte(nil), buf[:m]...)
				remote := k.Remote
				time.AfterFunc(nt.late, func() {
					nt.link.Send([]nic.Packet{{Buf: again, N: len(again), Remote: remote, SrcPort: nic.RoCEv2Port}})
				})
			}
		}
	}
}

func (nt *nakTarget) Name() string     { return "naktarget" }
func (nt *nakTarget) Peer() *Peer      { return nt.peer }
func (nt *nakTarget) Addr() netip.Addr { return nt.link.Addrs()[0] }
func (nt *nakTarget) Close() error {
	err := nt.link.Close()
	<-nt.done
	if perr := nt.peer.Close(); err == nil && !errors.Is(perr, net.ErrClosed) {
		err = perr
	}
	return err
}

func (nt *nakTarget) Open(ctx context.Context, spec QPSpec) (Session, error) {
	nt.peerQPN.Store(spec.PeerQPN)
	return nakSession{}, nil
}

// nakSession answers only what the class C cases use; the rest of
// Session (SRQs, windows, events) is left unimplemented.
type nakSession struct{ Session }

func (nakSession) QPN() uint32 { return nakTargetQPN }
func (nakSession) MR(i int) MR { return MR{Index: i, Addr: 0x10000, RKey: 0x1234, Len: 16384} }
func (nakSession) PostRecv(context.Context, uint64, int, int) error {
	return nil
}
func (nakSession) PostSend(context.Context, SendReq) error { return errors.New("not a requester") }
func (nakSession) Poll(context.Context, time.Duration) (*Completion, error) {
	return nil, nil
}
func (nakSession) ReadMem(_ context.Context, _, _, n int) ([]byte, error) {
	return make([]byte, n), nil
}
func (nakSession) WriteMem(context.Context, int, int, []byte) error { return nil }
func (nakSession) State(context.Context) (string, error)            { return "ERR", nil }
func (nakSession) OpenQP(context.Context, QPSpec) (Session, error) {
	return nil, errors.New("one QP only")
}
func (nakSession) Close() error { return nil }

// TestLateSecondNAK: a class C case wants exactly one NAK. A second NAK
// sent 800 ms after the first — past the 500 ms window the case listens
// in, past the next request's window too — fails the case; without it the
// case passes. Every negative check rests on the same mechanism
// (X.Never), which checks packets to the end of the case and through a
// final lateWait.
func TestLateSecondNAK(t *testing.T) {
	var c *Case
	for _, k := range All {
		if k.ID == "remote-access-bad-rkey" {
			c = k
		}
	}
	if c == nil {
		t.Fatal("no remote-access-bad-rkey case")
	}
	for _, tc := range []struct {
		late time.Duration
		want string
	}{{0, VerdictPass}, {800 * time.Millisecond, VerdictFail}} {
		t.Run(tc.late.String(), func(t *testing.T) {
			t.Parallel()
			tgt := newNAKTarget(t, tc.late)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			r := Run(ctx, tgt, c)
			t.Logf("%s: %s; failures: %s; notes: %s", r.Verdict, r.Observed, strings.Join(r.Failures, "; "), strings.Join(r.Notes, "; "))
			if r.Verdict != tc.want {
				t.Errorf("second NAK after %v: verdict %s, want %s\ntrace:\n  %s", tc.late, r.Verdict, tc.want, strings.Join(r.Trace, "\n  "))
			}
			if tc.late > 0 && !strings.Contains(strings.Join(r.Failures, "; "), "a second answer to the failed request") {
				t.Errorf("the failure does not name the late NAK: %q", r.Failures)
			}
		})
	}
}
