// Package capture wraps any nic.Link so that every packet it sends and
// receives can be seen: as a callback per packet, and as a pcap file that
// `softroce inspect`, tcpdump and Wireshark read.
//
// A Link carries RoCE packets without their IP and UDP headers (the
// backend owns those, nic.Link). To make a capture that decodes and whose
// ICRC verifies, the wrapper rebuilds each packet's frame: an Ethernet
// header with locally administered MACs derived from the IP addresses
// (one per endpoint), the IPv4 (or IPv6) header a
// softroce backend sends (IPv4 ID 0 with DF, as nic/udp and nic/pipe do;
// docs/platform.md), and a UDP header with checksum 0 (as rxe sends). The
// RoCE bytes, ICRC included, go into the frame exactly as they were sent or
// received, so a packet corrupted on the way shows up with a bad ICRC.
//
// Sent packets get their ICRC before the callback sees them: when the
// wrapped link implements nic.RawSender, the wrapper asks it for the ICRC
// (PutICRC) and then sends with SendRaw, so what the callback shows is
// byte for byte what was handed to the link. Sent packets are reported
// just before they are handed over, so the callbacks of two captured peers
// see a conversation in order; Options.TxAfterSend reports them after the
// wrapped link's send returns instead, for watching what a wrapper below
// (nic/impair) did.
//
// Capturing costs one frame build per packet in a buffer owned by the
// wrapper (nothing is allocated per packet by the wrapper itself); it is a
// debugging aid, not something to leave on a hot path.
package capture

import (
	"encoding/binary"
	"fmt"
	"io"
	"net/netip"
	"sync"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"

	"github.com/softroce/softroce/nic"
)

// Dir is the direction of a captured packet.
type Dir uint8

// Directions.
const (
	Tx Dir = 1 << iota // sent by this side
	Rx                 // received by this side
)

func (d Dir) String() string {
	switch d {
	case Tx:
		return "tx"
	case Rx:
		return "rx"
	}
	return fmt.Sprintf("Dir(%d)", uint8(d))
}

// Event is one captured packet. Packet and Frame are only valid during the
// callback: copy what must be kept.
type Event struct {
	Dir  Dir
	Time time.Time
	// Seq counts the events of one Link, from 1.
	Seq uint64
	// Packet is the packet as the link carried it (RoCE bytes, ICRC last).
	Packet *nic.Packet
	// Frame is the packet inside synthesised Ethernet/IP/UDP headers.
	Frame []byte
	// Src and Dst are the IP endpoints the frame was built with.
	Src, Dst netip.AddrPort
}

// Options say what to do with captured packets.
type Options struct {
	// Dirs selects the directions to capture (0: Tx|Rx).
	Dirs Dir
	// OnPacket is called for every captured packet, on the goroutine that
	// sent or received it. It must not block for long.
	OnPacket func(ev *Event)
	// Pcap, if set, receives every captured packet.
	Pcap *PcapWriter
	// Port is the UDP port the wrapped link sends from and receives on,
	// for links that ignore Packet.SrcPort (nic/udp). 0: taken from the
	// link's LocalAddrPort method when it has one, else Packet.SrcPort on
	// send and the RoCEv2 port on receive.
	Port uint16
	// TxAfterSend reports sent packets after the wrapped link's send
	// returns instead of before. Use it above another wrapper (nic/impair)
	// to see what the packet became once that wrapper acted on it. The
	// default, reporting before the send, is what keeps a conversation in
	// order: the callback runs before the peer can possibly receive the
	// packet and answer it.
	TxAfterSend bool
}

// localPorter is implemented by links bound to one UDP port (nic/udp).
type localPorter interface{ LocalAddrPort() netip.AddrPort }

// Link is a nic.Link that reports every packet.
type Link struct {
	inner nic.Link
	raw   nic.RawSender
	opts  Options

	mu    sync.Mutex // guards frame, ev and seq (Send and Recv run concurrently)
	frame []byte
	ev    Event // reused: the callback gets a pointer, so a local would escape
	seq   uint64
}

var _ nic.RawSender = (*Link)(nil)

// Wrap returns l with capture. Close closes l.
func Wrap(l nic.Link, opts Options) *Link {
	if opts.Dirs == 0 {
		opts.Dirs = Tx | Rx
	}
	if opts.Port == 0 {
		if lp, ok := l.(localPorter); ok {
			opts.Port = lp.LocalAddrPort().Port()
		}
	}
	c := &Link{inner: l, opts: opts, frame: make([]byte, 0, l.MTU()+14+64)}
	c.raw, _ = l.(nic.RawSender)
	return c
}

// Inner returns the wrapped link.
func (c *Link) Inner() nic.Link { return c.inner }

// Recv implements nic.Link; received packets are reported after the
// wrapped link returns them (so only packets it accepted are seen).
func (c *Link) Recv(pkts []nic.Packet) (int, error) {
	n, err := c.inner.Recv(pkts)
	if c.opts.Dirs&Rx != 0 {
		for i := 0; i < n; i++ {
			c.report(Rx, &pkts[i])
		}
	}
	return n, err
}

// Send implements nic.Link. With a RawSender underneath, the ICRC is
// computed first so the capture shows the packet as sent.
func (c *Link) Send(pkts []nic.Packet) (int, error) {
	if c.raw != nil {
		for i := range pkts {
			// A packet the link refuses keeps a stale ICRC; SendRaw
			// rejects and counts it exactly as Send would.
			_ = c.raw.PutICRC(&pkts[i])
		}
		return c.SendRaw(pkts)
	}
	n, err := c.inner.Send(pkts)
	c.reportTx(pkts[:n])
	return n, err
}

// SendRaw implements nic.RawSender.
func (c *Link) SendRaw(pkts []nic.Packet) (int, error) {
	if c.raw == nil {
		return 0, fmt.Errorf("capture: wrapped %T cannot send pre-computed ICRCs", c.inner)
	}
	if !c.opts.TxAfterSend {
		c.reportTx(pkts)
		return c.raw.SendRaw(pkts)
	}
	// Links copy what they send (nic.Link: the caller keeps its
	// buffers), so the bytes are still the ones sent.
	n, err := c.raw.SendRaw(pkts)
	c.reportTx(pkts[:max(n, 0)])
	return n, err
}

// PutICRC implements nic.RawSender.
func (c *Link) PutICRC(p *nic.Packet) error {
	if c.raw == nil {
		return fmt.Errorf("capture: wrapped %T cannot compute ICRCs on request", c.inner)
	}
	return c.raw.PutICRC(p)
}

func (c *Link) reportTx(pkts []nic.Packet) {
	if c.opts.Dirs&Tx == 0 {
		return
	}
	for i := range pkts {
		c.report(Tx, &pkts[i])
	}
}

// BatchSize implements nic.Link.
func (c *Link) BatchSize() int { return c.inner.BatchSize() }

// MTU implements nic.Link.
func (c *Link) MTU() int { return c.inner.MTU() }

// Addrs implements nic.Link.
func (c *Link) Addrs() []netip.Addr { return c.inner.Addrs() }

// Stats implements nic.Link.
func (c *Link) Stats() nic.Stats { return c.inner.Stats() }

// Close implements nic.Link.
func (c *Link) Close() error { return c.inner.Close() }

// report builds the frame of p and hands it to the callback and the pcap.
func (c *Link) report(d Dir, p *nic.Packet) {
	if c.opts.OnPacket == nil && c.opts.Pcap == nil {
		return
	}
	if p.N <= 0 || p.N > len(p.Buf) {
		return
	}
	var src, dst netip.AddrPort
	if d == Tx {
		local := p.Local
		if !local.IsValid() && len(c.inner.Addrs()) > 0 {
			local = c.inner.Addrs()[0]
		}
		sport := c.opts.Port
		if sport == 0 {
			sport = p.SrcPort
		}
		if sport == 0 {
			sport = 49152 // what nic/pipe uses for an unset SrcPort
		}
		dport := p.Remote.Port()
		if dport == 0 {
			dport = nic.RoCEv2Port
		}
		src, dst = netip.AddrPortFrom(local, sport), netip.AddrPortFrom(p.Remote.Addr(), dport)
	} else {
		dport := c.opts.Port
		if dport == 0 {
			dport = nic.RoCEv2Port
		}
		local := p.Local
		if !local.IsValid() && len(c.inner.Addrs()) > 0 {
			local = c.inner.Addrs()[0]
		}
		src, dst = p.Remote, netip.AddrPortFrom(local, dport)
	}
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	frame, err := AppendFrame(c.frame[:0], src, dst, p.Buf[:p.N])
	if err != nil {
		return // addresses of mixed families: nothing sensible to show
	}
	c.frame = frame
	c.ev = Event{Dir: d, Time: now, Seq: c.seq, Packet: p, Frame: frame, Src: src, Dst: dst}
	if c.opts.Pcap != nil {
		_ = c.opts.Pcap.WriteFrame(now, frame)
	}
	if c.opts.OnPacket != nil {
		c.opts.OnPacket(&c.ev)
	}
}

// AppendFrame appends to b an Ethernet frame carrying roce (BTH through
// ICRC, unchanged) from src to dst over UDP, with the IP header a softroce
// backend sends: IPv4 with ID 0, DF and TTL 64, or IPv6 with hop limit 64.
// The UDP checksum is 0. Both addresses must be of the same family.
func AppendFrame(b []byte, src, dst netip.AddrPort, roce []byte) ([]byte, error) {
	s, d := src.Addr().Unmap(), dst.Addr().Unmap()
	if !s.IsValid() || !d.IsValid() || s.Is4() != d.Is4() {
		return b, fmt.Errorf("capture: cannot frame a packet from %v to %v", src, dst)
	}
	udpLen := 8 + len(roce)
	if udpLen > 0xffff {
		return b, fmt.Errorf("capture: %d-byte packet is too long for UDP", len(roce))
	}
	// Each endpoint its own MAC, so a capture's Ethernet conversations
	// match its IP ones: destination first, then source.
	b = appendMAC(b, d)
	b = appendMAC(b, s)
	if s.Is4() {
		b = binary.BigEndian.AppendUint16(b, 0x0800)
		h := len(b)
		b = append(b, 0x45, 0)
		b = binary.BigEndian.AppendUint16(b, uint16(20+udpLen))
		b = append(b, 0, 0, 0x40, 0, 64, 17, 0, 0) // ID 0, DF, TTL 64, UDP, checksum below
		s4, d4 := s.As4(), d.As4()
		b = append(b, s4[:]...)
		b = append(b, d4[:]...)
		binary.BigEndian.PutUint16(b[h+10:], ipv4Checksum(b[h:h+20]))
	} else {
		b = binary.BigEndian.AppendUint16(b, 0x86dd)
		b = append(b, 0x60, 0, 0, 0)
		b = binary.BigEndian.AppendUint16(b, uint16(udpLen))
		b = append(b, 17, 64)
		s16, d16 := s.As16(), d.As16()
		b = append(b, s16[:]...)
		b = append(b, d16[:]...)
	}
	b = binary.BigEndian.AppendUint16(b, src.Port())
	b = binary.BigEndian.AppendUint16(b, dst.Port())
	b = binary.BigEndian.AppendUint16(b, uint16(udpLen))
	b = append(b, 0, 0)
	return append(b, roce...), nil
}

// appendMAC appends the MAC a capture gives address a: locally
// administered and unicast (02:00 or 02:...), then the address's last four
// bytes (IPv4: 10.0.0.1 is 02:00:0a:00:00:01) or, for IPv6, its last five.
func appendMAC(b []byte, a netip.Addr) []byte {
	if a.Is4() {
		a4 := a.As4()
		return append(append(b, 0x02, 0), a4[:]...)
	}
	a16 := a.As16()
	return append(append(b, 0x02), a16[11:]...)
}

func ipv4Checksum(h []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(h); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}

// PcapWriter writes frames to a pcap file (Ethernet link type). It is safe
// for concurrent use, so the links of both ends of a conversation can share
// one.
type PcapWriter struct {
	mu  sync.Mutex
	w   *pcapgo.Writer
	err error
	n   int
}

// NewPcapWriter writes the pcap file header to w.
func NewPcapWriter(w io.Writer) (*PcapWriter, error) {
	pw := pcapgo.NewWriterNanos(w)
	if err := pw.WriteFileHeader(65535, layers.LinkTypeEthernet); err != nil {
		return nil, fmt.Errorf("capture: write pcap header: %w", err)
	}
	return &PcapWriter{w: pw}, nil
}

// WriteFrame appends one frame. After the first error every call returns
// it.
func (p *PcapWriter) WriteFrame(t time.Time, frame []byte) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil {
		return p.err
	}
	ci := gopacket.CaptureInfo{Timestamp: t, CaptureLength: len(frame), Length: len(frame)}
	if err := p.w.WritePacket(ci, frame); err != nil {
		p.err = fmt.Errorf("capture: write pcap packet: %w", err)
		return p.err
	}
	p.n++
	return nil
}

// Packets is how many frames were written.
func (p *PcapWriter) Packets() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

// Err returns the first write error.
func (p *PcapWriter) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}
