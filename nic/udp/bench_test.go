package udp

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/net/ipv4"

	"github.com/softroce/softroce/internal/netnstest"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/nic/internal/linktest"
)

// RoCE packet of an RDMA WRITE carrying 4096 bytes: BTH + RETH + payload + ICRC.
const (
	payload4K = 4096
	size4K    = 12 + 16 + payload4K + 4
)

func vethPair(b *testing.B) *netnstest.Veth {
	netnstest.Require(b)
	return netnstest.Pair(b, netnstest.VethConfig{MTU: 9000})
}

func openIn(b *testing.B, e *netnstest.End) *Link {
	return openCheckIn(b, e, IPv4CheckAuto)
}

func openCheckIn(b *testing.B, e *netnstest.End, check IPv4Check) *Link {
	var l *Link
	e.NS.Run(b, func() (err error) {
		l, err = Open(Config{Addr: e.Addr(), SocketBuffer: 4 << 20, IPv4Check: check})
		return err
	})
	b.Cleanup(func() { l.Close() })
	return l
}

// BenchmarkLink4K: nic/udp Send -> Recv over a veth pair at MTU 9000,
// 4096-byte RDMA payloads, batches of 32.
func BenchmarkLink4K(b *testing.B) {
	v := vethPair(b)
	tx, rx := openIn(b, v.A), openIn(b, v.B)
	linktest.Stream(b, tx, rx, rx.LocalAddrPort(), size4K, payload4K, 32)
}

// BenchmarkIPv4Check: the receive throughput of each IPv4 check (none,
// the ID solver, the raw-socket verifier) over a veth pair, for
// ACK-sized packets (per-packet costs) and 4 KiB WRITEs.
func BenchmarkIPv4Check(b *testing.B) {
	for _, size := range []struct {
		name          string
		size, payload int
	}{{"ack", 12 + 4 + 4, 0}, {"4K", size4K, payload4K}} {
		for _, check := range []IPv4Check{IPv4CheckNone, IPv4CheckSolve, IPv4CheckRaw} {
			b.Run(size.name+"/"+check.String(), func(b *testing.B) {
				v := vethPair(b)
				tx, rx := openCheckIn(b, v.A, IPv4CheckSolve), openCheckIn(b, v.B, check)
				linktest.Stream(b, tx, rx, rx.LocalAddrPort(), size.size, size.payload, 32)
				st := rx.Stats()
				if st.RxICRCBad != 0 || st.RxPackets != st.RxICRCVerified+st.RxICRCPartial+st.RxICRCUnverified {
					b.Fatalf("receiver stats %+v", st)
				}
			})
		}
	}
}

// BenchmarkRawBatch4K is the reference: plain x/net ipv4 WriteBatch and
// ReadBatch on two UDP sockets, no ICRC, same sizes and batch.
func BenchmarkRawBatch4K(b *testing.B) {
	v := vethPair(b)
	var tx, rx *rawLink
	v.A.NS.Run(b, func() (err error) { tx, err = openRaw(v.A.Addr()); return err })
	v.B.NS.Run(b, func() (err error) { rx, err = openRaw(v.B.Addr()); return err })
	b.Cleanup(func() { tx.Close(); rx.Close() })
	linktest.Stream(b, tx, rx, netip.AddrPortFrom(v.B.Addr(), nic.RoCEv2Port), size4K, payload4K, 32)
}

// rawLink is just enough nic.Link over a bare batched UDP socket for the
// benchmark driver.
type rawLink struct {
	c     *net.UDPConn
	pc    *ipv4.PacketConn
	ms    []ipv4.Message
	bufs  [][1][]byte
	addrs map[netip.AddrPort]*net.UDPAddr
}

func openRaw(a netip.Addr) (*rawLink, error) {
	c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(a, nic.RoCEv2Port)))
	if err != nil {
		return nil, err
	}
	c.SetReadBuffer(4 << 20)
	c.SetWriteBuffer(4 << 20)
	r := &rawLink{c: c, pc: ipv4.NewPacketConn(c), ms: make([]ipv4.Message, 64), bufs: make([][1][]byte, 64),
		addrs: map[netip.AddrPort]*net.UDPAddr{}}
	for i := range r.ms {
		r.ms[i].Buffers = r.bufs[i][:]
	}
	return r, nil
}

func (r *rawLink) Send(pkts []nic.Packet) (int, error) {
	for i := range pkts {
		a, ok := r.addrs[pkts[i].Remote]
		if !ok {
			a = net.UDPAddrFromAddrPort(pkts[i].Remote)
			r.addrs[pkts[i].Remote] = a
		}
		r.ms[i].Buffers[0], r.ms[i].Addr = pkts[i].Buf[:pkts[i].N], a
	}
	return r.pc.WriteBatch(r.ms[:len(pkts)], 0)
}

func (r *rawLink) Recv(pkts []nic.Packet) (int, error) {
	for i := range pkts {
		r.ms[i].Buffers[0] = pkts[i].Buf
	}
	n, err := r.pc.ReadBatch(r.ms[:len(pkts)], 0)
	for i := 0; i < n; i++ {
		pkts[i].N = r.ms[i].N
	}
	return n, err
}

func (r *rawLink) BatchSize() int      { return 64 }
func (r *rawLink) MTU() int            { return 9000 }
func (r *rawLink) Addrs() []netip.Addr { return nil }
func (r *rawLink) Stats() nic.Stats    { return nic.Stats{} }
func (r *rawLink) Close() error        { return r.c.Close() }

// BenchmarkMulti4K is BenchmarkLink4K between two Multis (each on its
// veth end's link-local and IPv4 addresses), to either address: the cost
// of the second socket next to BenchmarkLink4K's one.
func BenchmarkMulti4K(b *testing.B) {
	for i, name := range []string{"link-local", "ipv4"} {
		b.Run(name, func(b *testing.B) {
			netnstest.Require(b)
			v := netnstest.Pair(b, netnstest.VethConfig{MTU: 9000, NoDAD: true})
			open := func(e *netnstest.End) (m *Multi) {
				e.NS.Run(b, func() error {
					ll, err := LinkLocalOf(e.Addr(), 5*time.Second)
					if err != nil {
						return err
					}
					m, err = OpenMulti(Config{SocketBuffer: 4 << 20}, ll, e.Addr())
					return err
				})
				b.Cleanup(func() { m.Close() })
				return m
			}
			tx, rx := open(v.A), open(v.B)
			linktest.Stream(b, tx, rx, netip.AddrPortFrom(rx.Addrs()[i], 4791), size4K, payload4K, 32)
		})
	}
}
