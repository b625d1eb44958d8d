package netnstest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/nic/congest"
	"github.com/softroce/softroce/nic/impair"
)

// RelayConfig says how a Relay mistreats RoCE frames.
type RelayConfig struct {
	// Impair applies loss, duplication, reordering, delay and jitter (see
	// nic/impair) to frames carrying UDP to Port. Its Corrupt is applied
	// by the relay itself, to bytes after the UDP header only, so that a
	// corrupted frame still reaches the receiver and its ICRC check (or
	// its kernel's UDP checksum) is what rejects it.
	Impair impair.Config
	// Port is the UDP destination port of the frames impaired (0: 4791).
	// All other frames (ARP, NDP, ICMP) pass untouched.
	Port int
	// Congest, if set, puts a bottleneck (nic/congest, on the wall clock)
	// on each direction's RoCE frames instead of Impair: a queue of that
	// rate that marks ECN-capable frames CE between Kmin and Kmax and
	// drops what does not fit. Marks are written into the frame's IPv4
	// TOS (header checksum updated) or IPv6 traffic class.
	Congest *congest.Config
}

// Relay forwards Ethernet frames between two interfaces of a middle
// namespace through AF_PACKET sockets, impairing RoCE frames on the way:
// a <-> m <-> b with a and b in one subnet. The kernel has no netem here
// (docs/platform.md, No netem), and nftables cannot delay, reorder or touch AF_XDP
// transmissions, hence this relay.
type Relay struct {
	ab, ba *relayDir
	stop   atomic.Bool
	wg     sync.WaitGroup
}

type relayDir struct {
	in, out   int // AF_PACKET sockets
	w         *impair.Link
	cg        *congest.Link // nil without RelayConfig.Congest
	raw       *frameLink
	rng       *rand.Rand
	corrupt   float64
	port      uint16
	forwarded atomic.Uint64
	corrupted atomic.Uint64
}

// RelayCounters say what one direction of a Relay did.
type RelayCounters struct {
	Forwarded uint64 // frames read and handed on (before impairment)
	Corrupted uint64
	Impair    impair.Counters
	Congest   congest.Counters // zero without RelayConfig.Congest
}

// Line builds a <-> m <-> b: namespaces a and b joined through a middle
// namespace m by two veth pairs, with a and b on one subnet (10.77.K.1/24
// and 10.77.K.2/24) and m's ends bare, and starts a Relay in m. It returns
// a's end, b's end and the relay.
func Line(t testing.TB, mtu int, cfg RelayConfig) (a, b *End, r *Relay) {
	t.Helper()
	na, m, nb := NewNS(t), NewNS(t), NewNS(t)
	sub := byte(counter.Add(1) % 250)
	left := Connect(t, na, m, VethConfig{MTU: mtu, BareB: true,
		AddrA: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 77, sub, 1}), 24)})
	right := Connect(t, m, nb, VethConfig{MTU: mtu, BareA: true,
		AddrB: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 77, sub, 2}), 24)})
	r = StartRelay(t, left.B, right.A, cfg)
	return left.A, right.B, r
}

// StartRelay relays frames between ends x and y, which must be in the
// same namespace. It stops at cleanup.
func StartRelay(t testing.TB, x, y *End, cfg RelayConfig) *Relay {
	t.Helper()
	if x.NS != y.NS {
		t.Fatalf("netnstest: relay ends %s and %s are in different namespaces", x.Name, y.Name)
	}
	var fx, fy int
	x.NS.Run(t, func() (err error) {
		if fx, err = packetSocket(x.Index); err != nil {
			return fmt.Errorf("relay on %s: %w", x.Name, err)
		}
		if fy, err = packetSocket(y.Index); err != nil {
			unix.Close(fx)
			return fmt.Errorf("relay on %s: %w", y.Name, err)
		}
		return nil
	})
	port := uint16(cfg.Port)
	if port == 0 {
		port = nic.RoCEv2Port
	}
	seed := cfg.Impair.Seed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano()) | 1
	}
	// Frames are at most the MTU plus an Ethernet header and a VLAN tag.
	mtu := max(x.MTU, y.MTU) + 14 + 4
	mk := func(in, out, ifindex, mtu int, seed uint64) *relayDir {
		ic := cfg.Impair
		ic.Seed, ic.Corrupt = seed, 0
		fl := &frameLink{fd: out, ifindex: ifindex, mtu: mtu}
		d := &relayDir{in: in, out: out, w: impair.Wrap(fl, ic), raw: fl, port: port,
			corrupt: cfg.Impair.Corrupt, rng: rand.New(rand.NewPCG(seed, 7))}
		if cfg.Congest != nil {
			cc := *cfg.Congest
			if cc.Seed == 0 {
				cc.Seed = seed
			}
			var err error
			if d.cg, err = congest.Wrap(fl, cc); err != nil {
				t.Fatalf("netnstest: relay: %v", err)
			}
		}
		return d
	}
	r := &Relay{ab: mk(fx, fy, y.Index, mtu, seed), ba: mk(fy, fx, x.Index, mtu, seed+1)}
	for _, d := range []*relayDir{r.ab, r.ba} {
		r.wg.Add(1)
		go r.run(d)
	}
	t.Cleanup(func() {
		r.stop.Store(true)
		r.wg.Wait()
		for _, d := range []*relayDir{r.ab, r.ba} {
			if d.cg != nil {
				d.cg.Close() // stops its pump; closes the frame link too
			}
			d.w.Close() // closes the frame links
		}
		unix.Close(fx)
		unix.Close(fy)
	})
	return r
}

// Counters returns what each direction did: x to y, then y to x.
func (r *Relay) Counters() (xy, yx RelayCounters) {
	c := func(d *relayDir) RelayCounters {
		rc := RelayCounters{Forwarded: d.forwarded.Load(), Corrupted: d.corrupted.Load(), Impair: d.w.Counters()}
		if d.cg != nil {
			rc.Congest = d.cg.Counters()
		}
		return rc
	}
	return c(r.ab), c(r.ba)
}

// QueueLen returns the bottleneck's queue in bytes in each direction, x
// to y then y to x; zeros without RelayConfig.Congest.
func (r *Relay) QueueLen() (xy, yx int) {
	if r.ab.cg != nil {
		xy, yx = r.ab.cg.QueueLen(), r.ba.cg.QueueLen()
	}
	return xy, yx
}

// packetSocket opens an AF_PACKET socket bound to one interface that does
// not see its own transmissions and wakes every 50ms to check for stop.
func packetSocket(ifindex int) (int, error) {
	proto := htons(unix.ETH_P_ALL)
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(proto))
	if err != nil {
		return -1, fmt.Errorf("AF_PACKET socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: proto, Ifindex: ifindex}); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("bind AF_PACKET: %w", err)
	}
	unix.SetsockoptInt(fd, unix.SOL_PACKET, unix.PACKET_IGNORE_OUTGOING, 1)
	unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 50000})
	// Forced past net.core.rmem_max (we are root): bursts must queue here
	// rather than be lost outside the relay's accounting.
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20) != nil {
		unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 8<<20)
	}
	return fd, nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

func (r *Relay) run(d *relayDir) {
	defer r.wg.Done()
	buf := make([]byte, 65536)
	pkt := make([]nic.Packet, 1)
	for !r.stop.Load() {
		n, from, err := unix.Recvfrom(d.in, buf, 0)
		if err != nil {
			continue // timeout (stop check) or a transient error
		}
		if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
			continue
		}
		d.forwarded.Add(1)
		frame := buf[:n]
		pkt[0] = nic.Packet{Buf: frame, N: n}
		off, ok := roceOffset(frame, d.port)
		if !ok {
			d.raw.Send(pkt)
			continue
		}
		if d.cg != nil {
			pkt[0].TClass = frameTClass(frame)
			d.cg.Send(pkt)
			continue
		}
		if d.corrupt > 0 && d.rng.Float64() < d.corrupt && n > off {
			// Flip one byte of BTH..ICRC, skipping the BTH's resv8a byte,
			// which the ICRC masks (IBTA A17.3.3).
			pos := off + d.rng.IntN(n-off)
			if pos == off+4 {
				pos++
			}
			if pos < n {
				frame[pos] ^= byte(1 + d.rng.IntN(255))
				d.corrupted.Add(1)
			}
		}
		d.w.Send(pkt)
	}
}

// roceOffset returns where the UDP payload of a frame to port starts.
func roceOffset(f []byte, port uint16) (int, bool) {
	if len(f) < 14 {
		return 0, false
	}
	switch binary.BigEndian.Uint16(f[12:]) {
	case unix.ETH_P_IP:
		if len(f) < 14+20 {
			return 0, false
		}
		ihl := int(f[14]&0x0f) * 4
		if f[14+9] != unix.IPPROTO_UDP || len(f) < 14+ihl+8 || binary.BigEndian.Uint16(f[14+ihl+2:]) != port {
			return 0, false
		}
		return 14 + ihl + 8, true
	case unix.ETH_P_IPV6:
		if len(f) < 14+40+8 || f[14+6] != unix.IPPROTO_UDP || binary.BigEndian.Uint16(f[14+40+2:]) != port {
			return 0, false
		}
		return 14 + 40 + 8, true
	}
	return 0, false
}

// frameTClass reads an IP frame's IPv4 TOS or IPv6 traffic class.
func frameTClass(f []byte) uint8 {
	if binary.BigEndian.Uint16(f[12:]) == unix.ETH_P_IP {
		return f[15]
	}
	return f[14]<<4 | f[15]>>4
}

// setFrameECN writes the ECN bits of tclass into an IP frame, keeping
// the IPv4 header checksum right (RFC 1624 incremental update).
func setFrameECN(f []byte, tclass uint8) {
	if len(f) < 14+20 {
		return
	}
	ecn := tclass & congest.ECNMask
	if binary.BigEndian.Uint16(f[12:]) == unix.ETH_P_IP {
		old := binary.BigEndian.Uint16(f[14:])
		f[15] = f[15]&^congest.ECNMask | ecn
		nw := binary.BigEndian.Uint16(f[14:])
		if old == nw {
			return
		}
		sum := uint32(^binary.BigEndian.Uint16(f[14+10:])) + uint32(^old) + uint32(nw)
		sum = sum&0xffff + sum>>16
		sum = sum&0xffff + sum>>16
		binary.BigEndian.PutUint16(f[14+10:], ^uint16(sum))
		return
	}
	f[15] = f[15]&^(congest.ECNMask<<4) | ecn<<4
}

// frameLink is a nic.Link that transmits whole Ethernet frames on an
// AF_PACKET socket, so that nic/impair can delay, reorder, drop and
// duplicate them. It only sends.
type frameLink struct {
	fd, ifindex, mtu int
	closed           atomic.Bool
	txErrors         atomic.Uint64
}

func (f *frameLink) Send(pkts []nic.Packet) (int, error) {
	if f.closed.Load() {
		return 0, errors.New("relay stopped")
	}
	sa := &unix.SockaddrLinklayer{Ifindex: f.ifindex}
	for i := range pkts {
		if pkts[i].TClass&congest.CE == congest.CE {
			// Only a bottleneck sets TClass here: it marked this frame.
			setFrameECN(pkts[i].Buf[:pkts[i].N], pkts[i].TClass)
		}
		if err := unix.Sendto(f.fd, pkts[i].Buf[:pkts[i].N], 0, sa); err != nil {
			f.txErrors.Add(1)
		}
	}
	return len(pkts), nil
}

func (f *frameLink) SendRaw(pkts []nic.Packet) (int, error) { return f.Send(pkts) }
func (f *frameLink) PutICRC(*nic.Packet) error              { return nil }
func (f *frameLink) Recv([]nic.Packet) (int, error) {
	return 0, errors.New("netnstest: the relay's frame link only sends")
}
func (f *frameLink) BatchSize() int      { return 1 }
func (f *frameLink) MTU() int            { return f.mtu }
func (f *frameLink) Addrs() []netip.Addr { return nil }
func (f *frameLink) Stats() nic.Stats    { return nic.Stats{TxErrors: f.txErrors.Load()} }
func (f *frameLink) Close() error        { f.closed.Store(true); return nil }
