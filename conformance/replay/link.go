package replay

import (
	"net"
	"net/netip"
	"sync"

	"github.com/softroce/softroce/nic"
)

// tapLink is the link a replayed softroce device runs on: the replayer
// injects one batch at a time and records what the device sends. The
// device's receive loop calls Recv again only after it has handed the
// engine the previous batch and flushed every packet that produced, so the
// next Recv call is the moment the device's answer to a request is
// complete; Inject waits for it instead of for a timeout.
type tapLink struct {
	local []netip.Addr
	in    chan []nic.Packet
	ready chan struct{} // one token per Recv call
	done  chan struct{}
	once  sync.Once
	idle  bool // the device is known to sit in Recv (replayer's side only)

	mu   sync.Mutex
	out  []sent
	mark int // out[:mark] were returned by Inject already
}

// sent is a packet the device handed the link.
type sent struct {
	roce   []byte
	remote netip.AddrPort
}

func newTapLink(local netip.Addr) *tapLink {
	return &tapLink{local: []netip.Addr{local}, in: make(chan []nic.Packet), ready: make(chan struct{}, 1), done: make(chan struct{})}
}

func (l *tapLink) Recv(pkts []nic.Packet) (int, error) {
	select {
	case l.ready <- struct{}{}:
	case <-l.done:
		return 0, net.ErrClosed
	}
	select {
	case b := <-l.in:
		n := 0
		for i := range b {
			if n == len(pkts) {
				break
			}
			if len(pkts[n].Buf) < len(b[i].Buf) {
				continue // larger than the device's buffers: it would be truncated
			}
			k := copy(pkts[n].Buf, b[i].Buf)
			pkts[n].N, pkts[n].Remote, pkts[n].Local, pkts[n].ICRC = k, b[i].Remote, l.local[0], nic.ICRCVerified
			n++
		}
		return n, nil
	case <-l.done:
		return 0, net.ErrClosed
	}
}

func (l *tapLink) Send(pkts []nic.Packet) (int, error) {
	select {
	case <-l.done:
		return 0, net.ErrClosed
	default:
	}
	l.mu.Lock()
	for i := range pkts {
		l.out = append(l.out, sent{roce: append([]byte(nil), pkts[i].Bytes()...), remote: pkts[i].Remote})
	}
	l.mu.Unlock()
	return len(pkts), nil
}

// Inject delivers one packet to the device and returns every packet the
// device sent until it was done with it.
func (l *tapLink) Inject(roce []byte, from netip.AddrPort) []sent {
	if !l.idle {
		<-l.ready
		l.idle = true
	}
	l.take()
	l.in <- []nic.Packet{{Buf: roce, N: len(roce), Remote: from}}
	<-l.ready
	return l.take()
}

// take returns what the device sent since the last take.
func (l *tapLink) take() []sent {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := l.out[l.mark:]
	l.mark = len(l.out)
	return out
}

// all returns everything the device sent.
func (l *tapLink) all() []sent {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.out[:len(l.out):len(l.out)]
}

func (l *tapLink) BatchSize() int      { return 1 }
func (l *tapLink) MTU() int            { return 9000 }
func (l *tapLink) Addrs() []netip.Addr { return l.local }
func (l *tapLink) Stats() nic.Stats    { return nic.Stats{} }
func (l *tapLink) Close() error        { l.once.Do(func() { close(l.done) }); return nil }
func (l *tapLink) MaxPacket() int      { return 9000 - 48 }
