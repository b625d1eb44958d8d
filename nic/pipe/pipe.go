// Package pipe is an in-process pair of nic.Links for tests and the demo.
//
// Each side has an IP address (10.0.0.1 and 10.0.0.2 by default; they never
// touch a real network) and a fixed queue of pre-sized packet buffers.
// Send computes the ICRC over the IPv4 (or IPv6) and UDP header the packet
// would carry on a kernel UDP socket with IP_PMTUDISC_DO (IPv4 ID 0, DF
// set; see docs/platform.md) and copies the packet into the peer's queue;
// Recv copies it out and verifies the ICRC the same way, dropping and
// counting packets whose ICRC is wrong. That makes a pipe wrapped in
// impairment (nic/impair) exercise the same ICRC drop path a real link
// does.
//
// A packet's TClass (DSCP and ECN) arrives as it was sent, as the IP
// header's TOS byte would, so an ECN-marking relay (nic/congest) around a
// pipe delivers its CE marks. The ICRC does not cover it.
//
// Nothing is allocated per packet: both directions use rings of buffers
// allocated once by New.
package pipe

import (
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/softroce/softroce/icrc"
	"github.com/softroce/softroce/nic"
)

// Defaults used for zero Config fields.
const (
	DefaultMTU     = 4200 // room for a 4096-byte IB MTU packet (nic.IBMTU)
	DefaultDepth   = 512
	DefaultBatch   = 32
	DefaultSrcPort = 49152 // used when a packet's SrcPort is 0
)

// Config describes a pipe. The zero value is usable.
type Config struct {
	// AddrA and AddrB are the two sides' addresses; both IPv4 or both
	// IPv6. Defaults: 10.0.0.1 and 10.0.0.2.
	AddrA, AddrB netip.Addr
	// MTU is the IP MTU (default DefaultMTU): the largest RoCE packet is
	// MTU - nic.Overhead(ipv6).
	MTU int
	// Depth is the number of packets each direction can hold (default
	// DefaultDepth).
	Depth int
	// Batch is what BatchSize reports (default DefaultBatch).
	Batch int
	// Block makes Send wait for room when the peer's queue is full. By
	// default a full queue drops the packet, as a switch would, and counts
	// it in the sender's TxErrors: with Block two endpoints whose receive
	// loops also send (ACKs) can deadlock each other.
	Block bool
}

func (c *Config) fill() {
	if !c.AddrA.IsValid() {
		c.AddrA = netip.AddrFrom4([4]byte{10, 0, 0, 1})
	}
	if !c.AddrB.IsValid() {
		c.AddrB = netip.AddrFrom4([4]byte{10, 0, 0, 2})
	}
	if c.MTU == 0 {
		c.MTU = DefaultMTU
	}
	if c.Depth == 0 {
		c.Depth = DefaultDepth
	}
	if c.Batch == 0 {
		c.Batch = DefaultBatch
	}
}

// New returns the two ends of a pipe: what a sends, b receives, and back.
// It panics on an inconsistent Config (mixed address families, an MTU too
// small for a RoCE packet, negative sizes): configs are written by
// programmers, not read from the wire.
func New(cfg Config) (a, b nic.Link) {
	cfg.fill()
	a4, b4 := cfg.AddrA.Unmap(), cfg.AddrB.Unmap()
	if a4.Is4() != b4.Is4() {
		panic(fmt.Sprintf("pipe: addresses %v and %v are of different families", cfg.AddrA, cfg.AddrB))
	}
	v6 := !a4.Is4()
	maxPkt := cfg.MTU - nic.Overhead(v6)
	if maxPkt < 12+icrc.Len || cfg.Depth < 1 || cfg.Batch < 1 {
		panic(fmt.Sprintf("pipe: bad config: MTU %d, depth %d, batch %d", cfg.MTU, cfg.Depth, cfg.Batch))
	}
	qa, qb := newQueue(cfg.Depth, maxPkt), newQueue(cfg.Depth, maxPkt)
	la := &Link{cfg: &cfg, local: a4, peer: b4, maxPkt: maxPkt, rx: qa, tx: qb}
	lb := &Link{cfg: &cfg, local: b4, peer: a4, maxPkt: maxPkt, rx: qb, tx: qa}
	la.addrs, lb.addrs = []netip.Addr{a4}, []netip.Addr{b4}
	return la, lb
}

// Link is one end of a pipe.
type Link struct {
	cfg         *Config
	local, peer netip.Addr
	addrs       []netip.Addr
	maxPkt      int
	rx, tx      *queue
	closeOnce   sync.Once
	closed      atomic.Bool

	rxPackets, txPackets atomic.Uint64
	rxBytes, txBytes     atomic.Uint64
	rxBad, rxMalformed   atomic.Uint64
	rxTruncated          atomic.Uint64
	txErrors             atomic.Uint64
}

var _ nic.RawSender = (*Link)(nil)

// MaxPacket is the largest RoCE packet (BTH through ICRC) the pipe carries.
func (l *Link) MaxPacket() int { return l.maxPkt }

// BatchSize implements nic.Link.
func (l *Link) BatchSize() int { return l.cfg.Batch }

// MTU implements nic.Link.
func (l *Link) MTU() int { return l.cfg.MTU }

// Addrs implements nic.Link.
// The slice is shared: do not modify it.
func (l *Link) Addrs() []netip.Addr { return l.addrs }

// Stats implements nic.Link. Packets dropped because the peer's queue was
// full (or the peer closed) count as TxErrors.
func (l *Link) Stats() nic.Stats {
	return nic.Stats{
		RxPackets: l.rxPackets.Load(), TxPackets: l.txPackets.Load(),
		RxBytes: l.rxBytes.Load(), TxBytes: l.txBytes.Load(),
		RxICRCBad: l.rxBad.Load(), RxMalformed: l.rxMalformed.Load(),
		RxTruncated: l.rxTruncated.Load(), TxErrors: l.txErrors.Load(),
		// Every delivered packet had its whole ICRC checked.
		RxICRCVerified: l.rxPackets.Load(),
	}
}

// Close implements nic.Link: it unblocks Recv (which then returns
// net.ErrClosed) and makes the peer's sends to this side drop.
func (l *Link) Close() error {
	l.closed.Store(true)
	l.closeOnce.Do(l.rx.close)
	return nil
}

// synth computes the ICRC of roce as sent from src to dst. Linux sends ID 0
// and DF from an unconnected socket with IP_PMTUDISC_DO, the setting
// nic/udp uses (docs/platform.md); the pipe mimics that header. The
// address bytes stay in this frame so nothing escapes.
func synth(src, dst netip.Addr, sport, dport uint16, roce []byte) (uint32, error) {
	var s, d [16]byte
	h := icrc.Header{ID: 0, DF: true, SrcPort: sport, DstPort: dport}
	if src.Is4() {
		s4, d4 := src.As4(), dst.As4()
		copy(s[:], s4[:])
		copy(d[:], d4[:])
		h.Src, h.Dst = s[:4], d[:4]
	} else {
		s, d = src.As16(), dst.As16()
		h.Src, h.Dst = s[:], d[:]
	}
	return icrc.Synth(&h, roce)
}

// PutICRC implements nic.RawSender: it writes the ICRC of p as sent from
// this side to the peer.
func (l *Link) PutICRC(p *nic.Packet) error {
	if !sendable(p, l.local, l.peer, l.maxPkt) {
		return fmt.Errorf("pipe: cannot send a %d-byte packet from %v to %v (max %d bytes, peer %v)",
			p.N, p.Local, p.Remote, l.maxPkt, l.peer)
	}
	sport, dport := ports(p)
	crc, err := synth(l.local, l.peer, sport, dport, p.Buf[:p.N])
	if err != nil {
		return fmt.Errorf("pipe: compute ICRC: %w", err)
	}
	icrc.Put(p.Buf[:p.N], crc)
	return nil
}

// ports returns the UDP ports p goes out with.
func ports(p *nic.Packet) (sport, dport uint16) {
	sport, dport = p.SrcPort, p.Remote.Port()
	if sport == 0 {
		sport = DefaultSrcPort
	}
	if dport == 0 {
		dport = nic.RoCEv2Port
	}
	return sport, dport
}

// Send implements nic.Link. A packet whose Remote address is set and is not
// the peer, whose Local is set and is not this side, or whose size is
// outside [BTH+ICRC, MaxPacket] is not sent and counts as a TxError. Send
// returns len(pkts): packets dropped on a full queue count as sent, as a
// real link would have put them on the wire.
func (l *Link) Send(pkts []nic.Packet) (int, error) {
	if l.closed.Load() {
		return 0, net.ErrClosed
	}
	for i := range pkts {
		// A failing packet is skipped by SendRaw and counted there.
		_ = l.PutICRC(&pkts[i])
	}
	return l.SendRaw(pkts)
}

// SendRaw implements nic.RawSender.
func (l *Link) SendRaw(pkts []nic.Packet) (int, error) {
	if l.closed.Load() {
		return 0, net.ErrClosed
	}
	ok, bytes, dropped, rejected := l.tx.put(pkts, l.local, l.peer, l.maxPkt, l.cfg.Block)
	l.txErrors.Add(uint64(dropped + rejected))
	l.txPackets.Add(uint64(ok))
	l.txBytes.Add(uint64(bytes))
	return len(pkts), nil
}

// Recv implements nic.Link. It blocks until at least one packet with a good
// ICRC is available; packets with a bad ICRC are dropped and counted.
func (l *Link) Recv(pkts []nic.Packet) (int, error) {
	if len(pkts) == 0 {
		return 0, nil
	}
	for {
		n, err := l.rx.get(pkts)
		if err != nil {
			return 0, err
		}
		// Verify outside the queue lock: it is the expensive part.
		k := 0
		for i := 0; i < n; i++ {
			p := &pkts[i]
			if p.N < 0 {
				l.rxTruncated.Add(1)
				continue
			}
			crc, err := synth(p.Remote.Addr(), p.Local, p.Remote.Port(), dportOf(p), p.Buf[:p.N])
			if err != nil {
				l.rxMalformed.Add(1)
				continue
			}
			if crc != icrc.Wire(p.Buf[:p.N]) {
				l.rxBad.Add(1)
				continue
			}
			p.ICRC = nic.ICRCVerified
			l.rxBytes.Add(uint64(p.N))
			if k != i {
				// Swap rather than copy so every Packet keeps its own Buf.
				pkts[k], pkts[i] = pkts[i], pkts[k]
			}
			k++
		}
		// The received destination port rides in SrcPort's place until
		// here; restore the field meanings of a received packet.
		for i := 0; i < k; i++ {
			pkts[i].SrcPort = 0
		}
		l.rxPackets.Add(uint64(k))
		if k > 0 {
			return k, nil
		}
	}
}

// sendable reports whether Send accepts p: a RoCE packet that fits, sent
// from this side (or unspecified) to the peer (or unspecified).
func sendable(p *nic.Packet, local, peer netip.Addr, maxPkt int) bool {
	if p.N < 12+icrc.Len || p.N > maxPkt || p.N > len(p.Buf) {
		return false
	}
	if a := p.Remote.Addr(); a.IsValid() && a.Unmap() != peer {
		return false
	}
	return !p.Local.IsValid() || p.Local.Unmap() == local
}

// dportOf returns the UDP destination port a queued packet was sent to; the
// queue stores it in SrcPort (a received packet has no use for SrcPort).
func dportOf(p *nic.Packet) uint16 { return p.SrcPort }

// slot is one queued packet.
type slot struct {
	buf      []byte
	n        int
	src, dst netip.Addr
	sport    uint16
	dport    uint16
	tclass   uint8
}

// queue is a bounded ring of pre-sized buffers guarded by a mutex. A
// channel of buffers would need a second channel to return them; the ring
// keeps the copy-in/copy-out under one lock and lets Close wake everyone.
type queue struct {
	mu          sync.Mutex
	notEmpty    sync.Cond
	notFull     sync.Cond
	slots       []slot
	head, count int
	closed      bool
}

func newQueue(depth, maxPkt int) *queue {
	q := &queue{slots: make([]slot, depth)}
	mem := make([]byte, depth*maxPkt)
	for i := range q.slots {
		q.slots[i].buf = mem[i*maxPkt : (i+1)*maxPkt : (i+1)*maxPkt]
	}
	q.notEmpty.L = &q.mu
	q.notFull.L = &q.mu
	return q
}

func (q *queue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.notEmpty.Broadcast()
	q.notFull.Broadcast()
}

// put copies the valid packets of pkts in (those Send did not reject) and
// returns how many packets and bytes were queued, and how many packets were
// dropped for lack of room and rejected.
func (q *queue) put(pkts []nic.Packet, src, dst netip.Addr, maxPkt int, block bool) (ok, bytes, dropped, rejected int) {
	q.mu.Lock()
	for i := range pkts {
		p := &pkts[i]
		if !sendable(p, src, dst, maxPkt) {
			rejected++
			continue
		}
		for block && q.count == len(q.slots) && !q.closed {
			q.notFull.Wait()
		}
		if q.closed || q.count == len(q.slots) {
			dropped++
			continue
		}
		s := &q.slots[(q.head+q.count)%len(q.slots)]
		s.n = copy(s.buf, p.Buf[:p.N])
		s.src, s.dst = src, dst
		s.sport, s.dport = ports(p)
		s.tclass = p.TClass
		q.count++
		ok++
		bytes += s.n
	}
	q.mu.Unlock()
	if ok > 0 {
		q.notEmpty.Broadcast()
	}
	return ok, bytes, dropped, rejected
}

// get blocks until packets are queued, then copies up to len(pkts) out.
// A packet larger than the caller's buffer gets N = -1 (counted as
// truncated by Recv).
func (q *queue) get(pkts []nic.Packet) (int, error) {
	q.mu.Lock()
	for q.count == 0 && !q.closed {
		q.notEmpty.Wait()
	}
	if q.closed {
		q.mu.Unlock()
		return 0, net.ErrClosed
	}
	n := 0
	for n < len(pkts) && q.count > 0 {
		s := &q.slots[q.head]
		p := &pkts[n]
		if s.n > cap(p.Buf) {
			p.N = -1
		} else {
			p.Buf = p.Buf[:cap(p.Buf)]
			p.N = copy(p.Buf, s.buf[:s.n])
		}
		p.Remote = netip.AddrPortFrom(s.src, s.sport)
		p.Local = s.dst
		p.SrcPort = s.dport // see dportOf
		p.ICRC = 0
		p.TClass = s.tclass
		q.head = (q.head + 1) % len(q.slots)
		q.count--
		n++
	}
	q.mu.Unlock()
	q.notFull.Broadcast()
	return n, nil
}
