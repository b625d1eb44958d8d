package pingpong

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/netip"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/nic/pipe"
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
	if got := gidString(d.GID); got != "::ffff:192.168.122.113" {
		t.Fatalf("GID printed as %q, not as inet_ntop prints it", got)
	}
	if got := gidString(verbs.GID{}); got != "::" {
		t.Fatalf("zero GID printed as %q", got)
	}
	// What follows the NUL is not the message (sscanf stops there).
	if back, err := ParseDest(append(d.Marshal()[:MsgLen-1], 0, 'x', 'y')); err != nil || back != d {
		t.Fatalf("bytes after the NUL: %+v %v", back, err)
	}
}

// TestParseDestHostile: anything but the exact format is an error that
// says what was wrong, never a panic or a half-filled Dest.
func TestParseDestHostile(t *testing.T) {
	good := "0000:000011:abcdef:00000000000000000000ffffc0a87a71"
	for _, c := range []struct{ in, want string }{
		{"", "want LID:QPN:PSN:GID"},
		{"garbage", "want LID:QPN:PSN:GID"},
		{"done", "want LID:QPN:PSN:GID"},
		{good[:40], "want LID:QPN:PSN:GID"},
		{"0000:000011:abcdef:00000000000000000000ffffc0a87a71:00", "want LID:QPN:PSN:GID"},
		{"000:0000011:abcdef:00000000000000000000ffffc0a87a71", "want LID:QPN:PSN:GID"},
		{"zzzz:000011:abcdef:00000000000000000000ffffc0a87a71", "LID \"zzzz\" is not hex"},
		{"0000:00001g:abcdef:00000000000000000000ffffc0a87a71", "QPN \"00001g\" is not hex"},
		{"0000:000011:-bcdef:00000000000000000000ffffc0a87a71", "PSN \"-bcdef\" is not hex"},
		{"0000:000011:abcdef:0000000000000000000xffffc0a87a71", "GID"},
		{"\xff\xfe:000011:abcdef:00000000000000000000ffffc0a87a71", "want LID:QPN:PSN:GID"},
	} {
		d, err := ParseDest([]byte(c.in))
		if err == nil || !strings.Contains(err.Error(), c.want) || d != (Dest{}) {
			t.Errorf("ParseDest(%q) = %+v, %v; want an error with %q", c.in, d, err, c.want)
		}
	}
}

func FuzzParseDest(f *testing.F) {
	f.Add([]byte("0000:000011:abcdef:00000000000000000000ffffc0a87a71\x00"))
	f.Add([]byte("done\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		d, err := ParseDest(b)
		if err == nil {
			if back, err := ParseDest(d.Marshal()); err != nil || back != d {
				t.Fatalf("%q parsed to %+v, which does not round-trip (%v)", b, d, err)
			}
		}
	})
}

// pipeConn is one end of an in-memory connection for exchangeOn.
type pipeConn struct {
	r *bytes.Reader
	w bytes.Buffer
}

func (p *pipeConn) Read(b []byte) (int, error)  { return p.r.Read(b) }
func (p *pipeConn) Write(b []byte) (int, error) { return p.w.Write(b) }

// TestExchangeHostilePeer: what a peer sends that is not the exchange of
// the same tool (short, garbled, other -q, no GID) fails with an error
// naming the problem, and nothing is connected.
func TestExchangeHostilePeer(t *testing.T) {
	gid := verbs.GIDFromAddr(netip.MustParseAddr("10.0.0.2"))
	msg := func(ds ...Dest) []byte {
		var b []byte
		for _, d := range ds {
			b = append(b, d.Marshal()...)
		}
		return b
	}
	qps := func(n int) []Dest {
		ds := make([]Dest, MaxQP)
		for i := range n {
			ds[i] = Dest{QPN: uint32(0x20 + i), PSN: 5, GID: gid}
		}
		return ds
	}
	one := Dest{QPN: 0x11, PSN: 1, GID: gid}
	for _, c := range []struct {
		name  string
		typ   Type
		nqp   int
		input []byte
		want  string
	}{
		{"empty", RC, 1, nil, "closed the connection after 0 of the 52 bytes of its address: is it ibv_rc_pingpong"},
		{"short", UC, 1, one.Marshal()[:30], "after 30 of the 52 bytes of its address: is it ibv_uc_pingpong"},
		{"garbled", RC, 1, bytes.Repeat([]byte{'A'}, 52), "malformed address message"},
		{"no GID", RC, 1, msg(Dest{QPN: 0x11, PSN: 1}), "no GID (all zeros), and RoCE needs one: run ibv_rc_pingpong with -g N, N the index of its device's GID for the address it uses: " +
			"-g 1 for an IPv4 address on kernel rdma_rxe and under `softroce run`"},
		{"QPN 0", RC, 1, msg(Dest{PSN: 1, GID: gid}), "announced QPN 0"},
		{"srq short list", SRQ, 4, msg(qps(4)[:10]...), "after 0 of the 52 bytes of address 11 of 256"},
		{"srq garbled entry", SRQ, 4, append(msg(qps(4)[:7]...), bytes.Repeat([]byte{'x'}, 52*249)...), "address 8 of 256: malformed"},
		{"srq fewer QPs", SRQ, 4, msg(qps(3)...), "announced 3 QPs and this side has 4: give both sides the same -q"},
		{"srq more QPs", SRQ, 4, msg(qps(16)...), "announced 16 QPs and this side has 4"},
		{"srq gap", SRQ, 2, msg(append(qps(2)[:3], qps(5)[3:]...)...), "have a gap"},
	} {
		for _, server := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/server=%v", c.name, server), func(t *testing.T) {
				cfg := Config{Type: c.typ, NumQP: c.nqp}
				if !server {
					cfg.Server = "peer"
				}
				if err := cfg.Defaults(); err != nil {
					t.Fatal(err)
				}
				connected := 0
				local := make([]Dest, 1)
				if c.typ == SRQ {
					local = make([]Dest, MaxQP)
				}
				conn := &pipeConn{r: bytes.NewReader(c.input)}
				_, err := exchangeOn(context.Background(), conn, &cfg, local, func(rem []Dest) error {
					if _, err := checkRemote(&cfg, rem); err != nil {
						return err
					}
					connected++
					return nil
				})
				if err == nil || !strings.Contains(err.Error(), c.want) || connected != 0 {
					t.Fatalf("err %v (connected %d); want %q", err, connected, c.want)
				}
				if server && conn.w.Len() != 0 {
					t.Fatalf("the server answered %d bytes to a bad client", conn.w.Len())
				}
			})
		}
	}
}

// TestExchangeOrder: the client sends its addresses before reading, the
// server reads and connects before answering, and srq carries MaxQP
// messages each way whatever -q is.
func TestExchangeOrder(t *testing.T) {
	gid := verbs.GIDFromAddr(netip.MustParseAddr("10.0.0.2"))
	for _, typ := range []Type{RC, SRQ} {
		n := 1
		if typ == SRQ {
			n = MaxQP
		}
		peer := make([]Dest, n)
		nqp := 1
		if typ == SRQ {
			nqp = 3
		}
		for i := range nqp {
			peer[i] = Dest{QPN: uint32(0x40 + i), PSN: uint32(i), GID: gid}
		}
		var in []byte
		for _, d := range peer {
			in = append(in, d.Marshal()...)
		}
		for _, server := range []bool{true, false} {
			cfg := Config{Type: typ, NumQP: nqp}
			if !server {
				cfg.Server = "peer"
			}
			if err := cfg.Defaults(); err != nil {
				t.Fatal(err)
			}
			input := in
			if server {
				input = append(append([]byte(nil), in...), "done\x00"...)
			}
			conn := &pipeConn{r: bytes.NewReader(input)}
			local := make([]Dest, n)
			local[0] = Dest{QPN: 0x99, GID: gid}
			written := -1
			rem, err := exchangeOn(context.Background(), conn, &cfg, local, func(rem []Dest) error {
				written = conn.w.Len()
				return nil
			})
			if err != nil {
				t.Fatalf("%s server=%v: %v", typ, server, err)
			}
			if len(rem) != n || rem[nqp-1] != peer[nqp-1] {
				t.Fatalf("%s: got %d addresses, last %+v", typ, len(rem), rem[nqp-1])
			}
			wantOut := n * MsgLen
			wantAtConnect := 0
			if !server {
				wantOut += 5 // "done"
				wantAtConnect = n * MsgLen
			}
			if conn.w.Len() != wantOut || written != wantAtConnect {
				t.Fatalf("%s server=%v: wrote %d bytes (%d when connecting), want %d (%d)", typ, server, conn.w.Len(), written, wantOut, wantAtConnect)
			}
			if !server && !bytes.HasSuffix(conn.w.Bytes(), []byte("done\x00")) {
				t.Fatalf("the client did not end with \"done\"")
			}
		}
	}
}

// TestExchangeNoDone: a client that sends its address and then closes
// without "done" (it failed to connect) makes the server fail, not start
// a ping-pong nobody answers.
func TestExchangeNoDone(t *testing.T) {
	cfg := Config{}
	if err := cfg.Defaults(); err != nil {
		t.Fatal(err)
	}
	peer := Dest{QPN: 0x42, GID: verbs.GIDFromAddr(netip.MustParseAddr("10.0.0.2"))}
	conn := &pipeConn{r: bytes.NewReader(peer.Marshal())}
	_, err := exchangeOn(context.Background(), conn, &cfg, make([]Dest, 1), func([]Dest) error { return nil })
	if err == nil || !strings.Contains(err.Error(), `closed the connection without sending "done"`) {
		t.Fatalf("%v", err)
	}
}

func TestConfigErrors(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Type: "xrc"}, "want rc, uc, ud or srq"},
		{Config{Type: RC, NumQP: 4}, "-q is srq_pingpong's (use --type srq)"},
		{Config{Type: SRQ, NumQP: 300}, "at most 256 (lower -q)"},
		{Config{Type: SRQ, NumQP: 20, RxDepth: 10}, "rx_depth 10 is too small for 20 QPs -- must have at least one receive per QP (raise -r or lower -q)"},
		{Config{Type: UD, Check: true}, "ibv_ud_pingpong has no buffer validation"},
		{Config{Type: SRQ, Check: true}, "ibv_srq_pingpong has no buffer validation"},
		{Config{MTU: 1500}, "-m takes 256, 512, 1024, 2048 or 4096"},
		{Config{Port: 70000}, "out of range"},
	} {
		cfg := c.cfg
		if err := cfg.Defaults(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.cfg, err, c.want)
		}
	}
	d := Config{Type: UD}
	if err := d.Defaults(); err != nil || d.Size != 1024 || d.NumQP != 1 || d.RxDepth != 500 || d.Iters != 1000 || d.Port != 18515 {
		t.Fatalf("UD defaults %+v %v", d, err)
	}
	d = Config{Type: SRQ}
	if err := d.Defaults(); err != nil || d.Size != 4096 || d.NumQP != 16 || d.MTU != 1024 {
		t.Fatalf("SRQ defaults %+v %v", d, err)
	}
}

// TestLoopback runs softroce's pingpong against itself over kernel UDP
// sockets on loopback, for each type softroce's verbs have, polling and
// with -e. RC and SRQ share 127.0.0.1 on two UDP ports; UD, whose address
// handles name no port, runs on an in-process pipe (10.0.0.1, 10.0.0.2),
// its TCP exchange on loopback.
func TestLoopback(t *testing.T) {
	open := func(t *testing.T, l nic.Link) *verbs.Device {
		d, err := verbs.Open(l, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		return d
	}
	openUDP := func(t *testing.T, port int) *verbs.Device {
		l, err := udp.Open(udp.Config{Addr: netip.MustParseAddr("127.0.0.1"), Port: port})
		if err != nil {
			t.Skipf("cannot open UDP port %d on loopback: %v", port, err)
		}
		return open(t, l)
	}
	for _, tc := range []struct {
		typ        Type
		size, mtu  int
		nqp, iters int
		events     bool
	}{
		{RC, 1, 256, 1, 200, false},
		{RC, 4096, 1024, 1, 200, true},
		{RC, 65536, 4096, 1, 100, false},
		{SRQ, 4096, 1024, 16, 400, false},
		{SRQ, 1, 256, 3, 90, true},
		{SRQ, 20000, 4096, 2, 50, false},
		{UC, 1, 256, 1, 200, false},
		{UC, 4096, 1024, 1, 200, true},
		{UC, 65536, 4096, 1, 100, false},
		{UD, 1, 0, 1, 200, false},
		{UD, 2048, 0, 1, 200, true},
		{UD, 4096, 0, 1, 100, false},
	} {
		t.Run(fmt.Sprintf("%s/size%d/qp%d/events=%v", tc.typ, tc.size, tc.nqp, tc.events), func(t *testing.T) {
			sport, cport := 47911, 47912
			var ds, dc *verbs.Device
			if tc.typ == UD {
				a, b := pipe.New(pipe.Config{})
				ds, dc = open(t, a), open(t, b)
			} else {
				ds, dc = openUDP(t, sport), openUDP(t, cport)
			}
			line := regexp.MustCompile(`(?m)^  (local|remote) address: +LID 0x0000, QPN 0x[0-9a-f]{6}, PSN 0x[0-9a-f]{6}[,:] GID ::ffff:(127\.0\.0\.1|10\.0\.0\.[12])$`)
			var wg sync.WaitGroup
			var sout, cout bytes.Buffer
			var sres, cres *Result
			var serr, cerr error
			wg.Add(2)
			base := Config{Type: tc.typ, Port: 47913, Size: tc.size, MTU: tc.mtu, Iters: tc.iters, RxDepth: 50, Events: tc.events}
			switch tc.typ {
			case SRQ:
				base.NumQP = tc.nqp
			case RC, UC:
				base.Check = true
			}
			go func() {
				defer wg.Done()
				c := base
				if tc.typ != UD {
					c.RemotePort = uint16(cport)
				}
				sres, serr = Run(context.Background(), ds, c, &sout)
			}()
			go func() {
				defer wg.Done()
				c := base
				c.Server = "127.0.0.1"
				if tc.typ != UD {
					c.RemotePort = uint16(sport)
				}
				cres, cerr = Run(context.Background(), dc, c, &cout)
			}()
			wg.Wait()
			ds.Close()
			dc.Close()
			if serr != nil || cerr != nil {
				t.Fatalf("server %v, client %v\nserver:\n%s\nclient:\n%s", serr, cerr, &sout, &cout)
			}
			for _, o := range []string{sout.String(), cout.String()} {
				if n := len(line.FindAllString(o, -1)); n != 2*tc.nqp {
					t.Fatalf("%d address lines, want %d:\n%s", n, 2*tc.nqp, o)
				}
				if ud := strings.Contains(o, ": GID"); ud != (tc.typ == UD) {
					t.Fatalf("local address line with \": GID\" is ud_pingpong's only:\n%s", o)
				}
				want := fmt.Sprintf("\n%d bytes in ", tc.size*tc.iters*2)
				if !strings.Contains(o, want) || !strings.Contains(o, fmt.Sprintf("\n%d iters in ", tc.iters)) || strings.Contains(o, "invalid data") {
					t.Fatalf("output:\n%s", o)
				}
			}
			for _, r := range []*Result{sres, cres} {
				if len(r.Remote) != tc.nqp || len(r.Local) != tc.nqp {
					t.Fatalf("result %+v", r)
				}
				if r.Mbps() <= 0 || r.Bytes != int64(tc.size*tc.iters*2) {
					t.Fatalf("result %+v: %.2f Mbit/s", r, r.Mbps())
				}
				if tc.events && r.CQEvents == 0 || !tc.events && r.CQEvents != 0 {
					t.Fatalf("events=%v but %d CQ events waited for", tc.events, r.CQEvents)
				}
			}
			if tc.typ == UD {
				// The last datagram's GRH: 20 zero bytes, then the IPv4
				// header from the other side.
				for r, src := range map[*Result]string{sres: "10.0.0.2", cres: "10.0.0.1"} {
					g := r.GRH
					if g[0] != 0 || g[19] != 0 || g[20] != 0x45 || netip.AddrFrom4([4]byte(g[32:36])).String() != src {
						t.Fatalf("GRH % x, want the IPv4 header from %s", g, src)
					}
				}
			}
			// Each side's remote addresses are the other's local ones.
			for i := range tc.nqp {
				if sres.Remote[i] != cres.Local[i] || cres.Remote[i] != sres.Local[i] {
					t.Fatalf("QP %d: server saw %+v, client has %+v", i, sres.Remote[i], cres.Local[i])
				}
			}
		})
	}
}

// TestUDSizeAboveMTU: ud_pingpong refuses a size above the port's active
// MTU, since a UD message is one packet.
func TestUDSizeAboveMTU(t *testing.T) {
	l, err := udp.Open(udp.Config{Addr: netip.MustParseAddr("127.0.0.1"), Port: 47914})
	if err != nil {
		t.Skip(err)
	}
	d, err := verbs.Open(l, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	mtu := d.QueryPort().ActiveMTU
	_, err = Run(context.Background(), d, Config{Type: UD, Size: mtu + 1}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("Requested size larger than port MTU (%d)", mtu)) || !strings.Contains(err.Error(), "lower -s") {
		t.Fatalf("size %d on a port of MTU %d: %v", mtu+1, mtu, err)
	}
}
