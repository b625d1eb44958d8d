package netnstest

import (
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
)

func TestPairPingUDP(t *testing.T) {
	var names []string
	t.Run("topology", func(t *testing.T) {
		v := Pair(t, VethConfig{MTU: 9000, Queues: 2})
		names = []string{v.A.NS.Name, v.B.NS.Name}
		if v.A.Addr().String() == v.B.Addr().String() || !v.A.Prefix.Contains(v.B.Addr()) {
			t.Fatalf("addresses %v %v", v.A.Prefix, v.B.Prefix)
		}
		if err := Ping(v.A.NS, v.B.Addr(), 3*time.Second); err != nil {
			t.Fatal(err)
		}
		if err := Ping(v.B.NS, v.A.Addr(), 3*time.Second); err != nil {
			t.Fatal(err)
		}
		v.A.NS.Run(t, func() error {
			on, err := TxChecksum(v.A.Name)
			if err != nil {
				return err
			}
			if on {
				t.Errorf("TX checksum offload still on for %s", v.A.Name)
			}
			l, err := netlink.LinkByName(v.A.Name)
			if err != nil {
				return err
			}
			if l.Attrs().MTU != 9000 || l.Attrs().NumRxQueues != 2 {
				t.Errorf("MTU %d, %d RX queues", l.Attrs().MTU, l.Attrs().NumRxQueues)
			}
			return nil
		})
		// A UDP socket opened inside B stays in B when used from outside.
		var conn *net.UDPConn
		v.B.NS.Run(t, func() (err error) {
			conn, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(v.B.Addr(), 9999)))
			return err
		})
		defer conn.Close()
		v.A.NS.Run(t, func() error {
			c, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(v.B.Addr(), 9999)))
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = c.Write([]byte("hello"))
			return err
		})
		conn.SetReadDeadline(time.Now().Add(3 * time.Second))
		buf := make([]byte, 100)
		n, from, err := conn.ReadFromUDP(buf)
		if err != nil || string(buf[:n]) != "hello" || from.AddrPort().Addr().Unmap() != v.A.Addr() {
			t.Fatalf("read %q from %v: %v", buf[:n], from, err)
		}
	})
	for _, n := range names {
		if _, err := os.Stat(filepath.Join("/var/run/netns", n)); !os.IsNotExist(err) {
			t.Errorf("namespace %s left behind (%v)", n, err)
		}
	}
}

func TestBareLine(t *testing.T) {
	a, m, b := NewNS(t), NewNS(t), NewNS(t)
	p := netip.MustParsePrefix("10.77.200.1/24")
	left := Connect(t, a, m, VethConfig{AddrA: p, Bare: false, AddrB: netip.MustParsePrefix("10.77.201.1/24")})
	right := Connect(t, m, b, VethConfig{Bare: true})
	if left.A.Prefix != p || right.A.Prefix.IsValid() || right.B.Prefix.IsValid() {
		t.Errorf("prefixes %v %v %v", left.A.Prefix, right.A.Prefix, right.B.Prefix)
	}
	if err := Ping(a, netip.MustParseAddr("10.77.201.1"), time.Second); err == nil {
		t.Error("ping to another subnet without a route succeeded")
	}
}
