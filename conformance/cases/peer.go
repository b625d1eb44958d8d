package cases

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/nic/capture"
)

// Pkt is one packet of a case's conversation, sent by the fake peer (Dir
// 'T') or received from the target (Dir 'R').
type Pkt struct {
	Time time.Time
	Dir  byte
	// Raw is the RoCE packet, BTH through ICRC (a private copy).
	Raw []byte
	// P is Raw parsed; ParseErr is set when Raw did not parse.
	P        bth.Packet
	ParseErr error
	// Src and Dst are the UDP endpoints.
	Src, Dst netip.AddrPort
	// BadICRC marks a packet the peer sent with a deliberately wrong ICRC.
	BadICRC bool
	// TClass is the IP traffic class (TOS) it was sent or received with,
	// as far as the link tells: its low two bits are the ECN field.
	TClass uint8
}

// Opcode is the packet's BTH opcode.
func (p *Pkt) Opcode() bth.Opcode { return p.P.BTH.Opcode() }

// PSN is the packet's BTH PSN.
func (p *Pkt) PSN() uint32 { return p.P.BTH.PSN() }

// Syndrome is the AETH syndrome, or 0xff when the packet has no AETH.
func (p *Pkt) Syndrome() bth.Syndrome {
	if p.P.AETH == nil {
		return 0xff
	}
	return p.P.AETH.Syndrome()
}

// String is a one-line description for traces and reports.
func (p *Pkt) String() string {
	arrow := "peer->target"
	if p.Dir == 'R' {
		arrow = "target->peer"
	}
	if p.ParseErr != nil {
		return fmt.Sprintf("%s %d bytes, unparsable: %v", arrow, len(p.Raw), p.ParseErr)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s psn=0x%06x qp=0x%06x", arrow, p.Opcode(), p.PSN(), p.P.BTH.DestQP())
	if p.P.BTH.AckReq() {
		b.WriteString(" ackreq")
	}
	if p.P.RETH != nil {
		fmt.Fprintf(&b, " va=0x%x rkey=0x%x len=%d", p.P.RETH.VA(), p.P.RETH.RKey(), p.P.RETH.DMALen())
	}
	if p.P.AtomicETH != nil {
		fmt.Fprintf(&b, " va=0x%x rkey=0x%x swap/add=%d cmp=%d", p.P.AtomicETH.VA(), p.P.AtomicETH.RKey(), p.P.AtomicETH.SwapAdd(), p.P.AtomicETH.Compare())
	}
	if p.P.AETH != nil {
		fmt.Fprintf(&b, " aeth=0x%02x (%v) msn=%d", uint8(p.P.AETH.Syndrome()), p.P.AETH.Syndrome(), p.P.AETH.MSN())
	}
	if p.P.AtomicAckETH != nil {
		fmt.Fprintf(&b, " orig=%d", p.P.AtomicAckETH.Orig())
	}
	if n := len(p.P.Payload); n > 0 || p.P.Info != nil && p.P.Info.Payload != bth.PayloadNone {
		fmt.Fprintf(&b, " payload=%d pad=%d", n, p.P.BTH.PadCnt())
	}
	if p.BadICRC {
		b.WriteString(" (ICRC deliberately wrong)")
	}
	return b.String()
}

// Peer is the fake RC peer: it owns QP numbers no QP stands behind,
// crafts exact packets to a target QP over a Link and collects what comes
// back. It never answers on its own; each case scripts it.
type Peer struct {
	link  nic.RawSender
	local netip.Addr
	rx    chan *Pkt
	done  chan struct{}
	mu    sync.Mutex
	err   error
	buf   []byte
	batch []nic.Packet
}

// NewPeer starts a peer on link, whose first address is the peer's. The
// peer owns the link: Close closes it.
func NewPeer(link nic.RawSender) (*Peer, error) {
	addrs := link.Addrs()
	if len(addrs) == 0 {
		return nil, errors.New("cases: peer link has no address")
	}
	p := &Peer{link: link, local: addrs[0], rx: make(chan *Pkt, 1024), done: make(chan struct{}),
		buf: make([]byte, 8192), batch: make([]nic.Packet, 1)}
	go p.recvLoop()
	return p, nil
}

// Addr is the peer's IP address (its GID is the IPv4-mapped form).
func (p *Peer) Addr() netip.Addr { return p.local }

// GID is the peer's RoCEv2 GID.
func (p *Peer) GID() [16]byte { return netip.AddrFrom16(p.local.As16()).As16() }

// Err is the error that stopped the peer's receive loop, if any.
func (p *Peer) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Close stops the peer and closes its link.
func (p *Peer) Close() error {
	err := p.link.Close()
	<-p.done
	return err
}

func (p *Peer) recvLoop() {
	defer close(p.done)
	bs := p.link.BatchSize()
	pkts := make([]nic.Packet, bs)
	for i := range pkts {
		pkts[i].Buf = make([]byte, 9000)
	}
	for {
		n, err := p.link.Recv(pkts)
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				p.mu.Lock()
				p.err = err
				p.mu.Unlock()
			}
			return
		}
		now := time.Now()
		for i := range pkts[:n] {
			k := &pkts[i]
			// The harness is not a data path: one copy per packet keeps
			// the conversation readable after the buffer is reused.
			q := &Pkt{Time: now, Dir: 'R', Raw: append([]byte(nil), k.Bytes()...),
				Src: k.Remote, Dst: netip.AddrPortFrom(p.local, nic.RoCEv2Port), TClass: k.TClass}
			q.ParseErr = bth.Parse(&q.P, q.Raw)
			select {
			case p.rx <- q:
			default: // a flood nobody reads: drop, the case will notice
			}
		}
	}
}

// Conv is one case's conversation between the fake peer and one target
// QP: what the peer sent, what came back, in order.
type Conv struct {
	ctx     context.Context
	peer    *Peer
	dst     netip.AddrPort
	PeerQPN uint32
	QPN     uint32 // the target QP
	Pkts    []*Pkt
	// TClass is the traffic class the peer's packets leave with (0: not
	// ECN-capable; 3 marks them Congestion Experienced, as a congested
	// switch would).
	TClass uint8
	// Stray counts received packets addressed to other QPs (leftovers).
	Stray int
	// former are the peer QPNs of QPs the conversation moved away from
	// (X.OpenQP): their packets join Pkts but Collect does not return them.
	former map[uint32]bool
}

// retarget moves the conversation to a new pair of QPs.
func (c *Conv) retarget(peerQPN, qpn uint32) {
	if c.former == nil {
		c.former = map[uint32]bool{}
	}
	c.former[c.PeerQPN] = true
	c.PeerQPN, c.QPN = peerQPN, qpn
}

// NewConv starts a conversation from peerQPN to the target QP qpn at
// addr, discarding anything the peer received before.
func (p *Peer) NewConv(ctx context.Context, addr netip.Addr, peerQPN, qpn uint32) *Conv {
	for {
		select {
		case <-p.rx:
			continue
		default:
		}
		break
	}
	return &Conv{ctx: ctx, peer: p, dst: netip.AddrPortFrom(addr, nic.RoCEv2Port), PeerQPN: peerQPN, QPN: qpn}
}

// Send builds f with payload (DestQP, P_Key filled in) and sends it with
// a correct ICRC.
func (c *Conv) Send(f bth.Fields, payload []byte) (*Pkt, error) { return c.send(f, payload, false) }

// SendBadICRC is Send with the ICRC's bits inverted after it was computed.
func (c *Conv) SendBadICRC(f bth.Fields, payload []byte) (*Pkt, error) {
	return c.send(f, payload, true)
}

func (c *Conv) send(f bth.Fields, payload []byte, bad bool) (*Pkt, error) {
	f.BTH.DestQP = c.QPN
	if f.BTH.PKey == 0 {
		f.BTH.PKey = 0xffff
	}
	p := c.peer
	p.mu.Lock()
	n, err := bth.Build(p.buf, &f, payload)
	p.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return c.SendBytes(p.buf[:n], bad)
}

// SendBytes sends b, a packet from the BTH through a 4-byte ICRC slot
// that the link fills (inverted when bad). The caller builds the headers,
// which lets a case send what bth.Build refuses to (reserved opcodes).
func (c *Conv) SendBytes(b []byte, bad bool) (*Pkt, error) {
	p := c.peer
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(b) < bth.BTHLen+bth.ICRCLen || len(b) > len(p.buf) {
		return nil, fmt.Errorf("peer: %d-byte packet", len(b))
	}
	n := copy(p.buf, b)
	k := &p.batch[0]
	*k = nic.Packet{Buf: p.buf, N: n, Remote: c.dst, SrcPort: nic.RoCEv2Port, TClass: c.TClass}
	if err := p.link.PutICRC(k); err != nil {
		return nil, fmt.Errorf("compute ICRC: %w", err)
	}
	if bad {
		for i := n - 4; i < n; i++ {
			p.buf[i] ^= 0xff
		}
	}
	q := &Pkt{Time: time.Now(), Dir: 'T', Raw: append([]byte(nil), p.buf[:n]...), BadICRC: bad,
		Src: netip.AddrPortFrom(p.local, nic.RoCEv2Port), Dst: c.dst, TClass: c.TClass}
	q.ParseErr = bth.Parse(&q.P, q.Raw)
	if _, err := p.link.SendRaw(p.batch); err != nil {
		return nil, fmt.Errorf("send %s: %w", bth.Opcode(b[0]), err)
	}
	c.Pkts = append(c.Pkts, q)
	return q, nil
}

// Collect gathers the target's packets to the peer's QP for up to d. It
// returns early, after the packet for which stop returns true, when stop
// is not nil.
func (c *Conv) Collect(d time.Duration, stop func(*Pkt) bool) []*Pkt {
	var got []*Pkt
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case q := <-c.peer.rx:
			if q.ParseErr == nil && q.P.BTH.DestQP() != c.PeerQPN {
				if c.former[q.P.BTH.DestQP()] {
					c.Pkts = append(c.Pkts, q)
				} else {
					c.Stray++
				}
				continue
			}
			c.Pkts = append(c.Pkts, q)
			got = append(got, q)
			if stop != nil && stop(q) {
				return got
			}
		case <-t.C:
			return got
		case <-c.ctx.Done():
			return got
		}
	}
}

// Expect collects until n packets came or d passed.
func (c *Conv) Expect(d time.Duration, n int) []*Pkt {
	k := 0
	return c.Collect(d, func(*Pkt) bool { k++; return k >= n })
}

// WritePcap writes the conversation as a pcap file that `softroce inspect`
// reads. Frames get synthesised IP/UDP headers (nic/capture): the ICRC of a
// packet received over IPv4 by a UDP socket was computed by the sender over
// an IPv4 ID the socket cannot see, so it may show as wrong.
func (c *Conv) WritePcap(w *capture.PcapWriter) error {
	var frame []byte
	for _, q := range c.Pkts {
		var err error
		frame, err = capture.AppendFrame(frame[:0], q.Src, q.Dst, q.Raw)
		if err != nil {
			return err
		}
		if err := w.WriteFrame(q.Time, frame); err != nil {
			return err
		}
	}
	return w.Err()
}

// Trace is the conversation, one packet a line, with times relative to
// the first packet.
func (c *Conv) Trace() []string {
	var out []string
	for _, q := range c.Pkts {
		out = append(out, fmt.Sprintf("+%6.1fms %s", float64(q.Time.Sub(c.Pkts[0].Time).Microseconds())/1000, q))
	}
	return out
}
