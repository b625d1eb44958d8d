package rcpingpong

import (
	"bytes"
	"context"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/softroce/softroce/nic/udp"
	"github.com/softroce/softroce/verbs"
)

func TestDestMarshal(t *testing.T) {
	d := Dest{QPN: 0x11, PSN: 0xabcdef, GID: verbs.GIDFromAddr(netip.MustParseAddr("192.168.122.113"))}
	b := d.Marshal()
	if len(b) != MsgLen || b[MsgLen-1] != 0 {
		t.Fatalf("message is %d bytes %q", len(b), b)
	}
	if want := "0000:000011:abcdef:00000000000000000000ffffc0a87a71"; string(b[:MsgLen-1]) != want {
		t.Fatalf("got %q want %q", b, want)
	}
	back, err := ParseDest(b)
	if err != nil || back != d {
		t.Fatalf("round trip: %+v %v", back, err)
	}
	if _, err := ParseDest([]byte("garbage")); err == nil {
		t.Fatal("garbage parsed")
	}
}

// TestLoopback runs softroce's ibv_rc_pingpong against itself over kernel
// UDP sockets on 127.0.0.1 (two UDP ports, since both share the address).
func TestLoopback(t *testing.T) {
	addr := netip.MustParseAddr("127.0.0.1")
	open := func(port int) *verbs.Device {
		l, err := udp.Open(udp.Config{Addr: addr, Port: port})
		if err != nil {
			t.Skipf("cannot open UDP port %d on loopback: %v", port, err)
		}
		d, err := verbs.Open(l, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		return d
	}
	for _, tc := range []struct{ size, mtu int }{{1, 256}, {4096, 1024}, {65536, 4096}} {
		ds, dc := open(47911), open(47912)
		var wg sync.WaitGroup
		var sout, cout bytes.Buffer
		var serr, cerr error
		wg.Add(2)
		base := Config{Port: 47913, Size: tc.size, MTU: tc.mtu, Iters: 200, RxDepth: 50, Check: true}
		go func() {
			defer wg.Done()
			c := base
			c.RemotePort = 47912
			_, serr = Run(context.Background(), ds, c, &sout)
		}()
		go func() {
			defer wg.Done()
			c := base
			c.Server, c.RemotePort = "127.0.0.1", 47911
			_, cerr = Run(context.Background(), dc, c, &cout)
		}()
		wg.Wait()
		if serr != nil || cerr != nil {
			t.Fatalf("size %d mtu %d: server %v, client %v\nserver:\n%s\nclient:\n%s", tc.size, tc.mtu, serr, cerr, &sout, &cout)
		}
		for _, o := range []string{sout.String(), cout.String()} {
			if !strings.Contains(o, "iters in") || strings.Contains(o, "invalid data") {
				t.Fatalf("output:\n%s", o)
			}
		}
		ds.Close()
		dc.Close()
	}
}
