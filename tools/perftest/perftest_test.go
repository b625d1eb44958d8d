package perftest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/softroce/softroce/nic/udp"
	"github.com/softroce/softroce/verbs"
)

// The example KEYS message of docs/conformance-catalogue.md C.4, byte for byte.
func TestKeysMarshal(t *testing.T) {
	k := Keys{OutReads: 1, QPN: 0x11, PSN: 0xa1b2c3, RKey: 0x1234, VAddr: 0x7f0012345000,
		GID: verbs.GIDFromAddr(netip.MustParseAddr("192.168.122.113"))}
	b := k.Marshal()
	want := "0000:0001:000011:a1b2c3:00001234:00007f0012345000:00:00:00:00:00:00:00:00:00:00:ff:ff:c0:a8:7a:71:00000000:\x00"
	if len(b) != KeysLen || string(b) != want {
		t.Fatalf("got %d bytes %q\nwant %q", len(b), b, want)
	}
	back, err := ParseKeys(b)
	if err != nil || back != k {
		t.Fatalf("round trip: %+v, %v", back, err)
	}
	// Widest values still fit the fixed layout.
	k = Keys{LID: 0xffff, OutReads: 0xffff, QPN: 0xffffff, PSN: 0xffffff, RKey: 0xffffffff, VAddr: ^uint64(0), SRQN: 0xffffffff}
	for i := range k.GID {
		k.GID[i] = 0xff
	}
	if b := k.Marshal(); len(b) != KeysLen {
		t.Fatalf("max keys: %d bytes", len(b))
	}
}

func TestParseKeysMalformed(t *testing.T) {
	good := string(Keys{QPN: 1}.Marshal())
	for _, in := range []string{
		"",
		"garbage",
		strings.Replace(good, "000001", "zzzzzz", 1),          // not hex
		strings.Replace(good, ":000001:", ":1000001:", 1),     // QPN beyond 24 bits
		strings.Replace(good, ":00000000:\x00", ":\x00", 1),   // SRQN missing
		strings.Replace(good, ":00:00:00:", ":100:00:00:", 1), // GID byte > 0xff
		good[:50], // truncated
		strings.Replace(good, ":00000000:\x00", ":00000000:00:\x00", 1), // extra field
	} {
		if _, err := ParseKeys([]byte(in)); !errors.Is(err, ErrMalformed) {
			t.Errorf("ParseKeys(%q) = %v, want ErrMalformed", in, err)
		}
	}
}

func TestVersionAndMTU(t *testing.T) {
	v := MarshalVersion(Version)
	if len(v) != VersionLen || string(v[:4]) != "6.06" || !allByte(v[4:], 0) {
		t.Fatalf("version message %q", v)
	}
	if s, err := ParseVersion(v); err != nil || s != "6.06" {
		t.Fatalf("ParseVersion: %q %v", s, err)
	}
	if _, err := ParseVersion(MarshalVersion("5.60")); err == nil {
		t.Fatal("version 5.60 accepted; perftest refuses peers below 5.70")
	}
	if _, err := ParseVersion(make([]byte, VersionLen)); !errors.Is(err, ErrMalformed) {
		t.Fatalf("empty version: %v", err)
	}
	for mtu, want := range map[int]string{256: "1\x00", 1024: "3\x00", 4096: "5\x00"} {
		b, err := MarshalMTU(mtu)
		if err != nil || string(b) != want {
			t.Fatalf("MarshalMTU(%d) = %q, %v", mtu, b, err)
		}
		if ParseMTU(b) != mtu {
			t.Fatalf("ParseMTU(%q) = %d", b, ParseMTU(b))
		}
	}
	if _, err := MarshalMTU(1500); err == nil {
		t.Fatal("MTU 1500 accepted")
	}
	if ParseMTU([]byte("9\x00")) != 0 || ParseMTU(nil) != 0 {
		t.Fatal("invalid MTU enum parsed")
	}
}

func TestReportFields(t *testing.T) {
	r := Report{Size: 65536, Iters: 1000, PeakBW: 1234.5, AvgBW: 1000.25, MsgRate: 0.016}
	f := r.fields()
	// Big-endian on the wire: the size's high bytes come first.
	if !bytes.Equal(f[0][:], []byte{0, 0, 0, 0, 0, 1, 0, 0}) {
		t.Fatalf("size field % x", f[0])
	}
	if back := reportFromFields(f); back != r {
		t.Fatalf("round trip %+v", back)
	}
}

func TestParseTest(t *testing.T) {
	for in, want := range map[string]Test{"write": Write, "ib_read_bw": Read, "atomic": Atomic, "ib_send_bw": Send} {
		if got, err := ParseTest(in); err != nil || got != want {
			t.Errorf("ParseTest(%q) = %v, %v", in, got, err)
		}
	}
	if _, err := ParseTest("write_lat"); err == nil {
		t.Error("write_lat accepted")
	}
	if Write.Tool() != "ib_write_bw" {
		t.Error(Write.Tool())
	}
}

func TestConfigDefaults(t *testing.T) {
	c := Config{Test: Atomic}
	if err := c.defaults(); err != nil || c.Size != 8 || c.Iters != 1000 || c.OutReads != 16 {
		t.Fatalf("atomic defaults %+v %v", c, err)
	}
	c = Config{Test: Write, TxDepth: 10}
	if err := c.defaults(); err != nil || c.Size != 65536 || c.Iters != 5000 || c.OutReads != 1 || c.CQMod != 10 {
		t.Fatalf("write defaults %+v %v", c, err)
	}
	for _, bad := range []Config{{Test: Atomic, Size: 16}, {MTU: 1500}, {Size: -1}, {Test: 9}, {Iters: -1}} {
		if err := bad.defaults(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

// TestLoopback runs both roles of every test against each other over
// kernel UDP sockets on 127.0.0.1 (two UDP ports, one address), with the
// data checks of both sides.
func TestLoopback(t *testing.T) {
	devs := loopbackDevs(t, 47921)
	cases := []struct {
		test      Test
		atomic    AtomicOp
		size, mtu int
		iters     int
		qps       int
	}{
		{Write, 0, 2, 1024, 300, 1},
		{Write, 0, 65536, 4096, 100, 1},
		{Write, 0, 3000, 256, 50, 1},
		{Write, 0, 4096, 1024, 100, 3},
		{Read, 0, 100, 1024, 300, 1},
		{Read, 0, 65536, 1024, 50, 1},
		{Read, 0, 1000, 2048, 100, 4},
		{Atomic, FetchAndAdd, 8, 1024, 500, 1},
		{Atomic, CmpAndSwap, 8, 1024, 200, 1},
		{Atomic, FetchAndAdd, 8, 1024, 150, 3},
		{Send, 0, 1, 1024, 300, 1},
		{Send, 0, 65536, 4096, 100, 1},
		{Send, 0, 5000, 1024, 1200, 1}, // more messages than receives posted at once
		{Send, 0, 2048, 1024, 700, 2},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%v/%d/size%d/mtu%d/q%d", tc.test, tc.atomic, tc.size, tc.mtu, tc.qps), func(t *testing.T) {
			base := Config{Test: tc.test, Atomic: tc.atomic, Port: freeTCPPort(t), Size: tc.size, MTU: tc.mtu, Iters: tc.iters,
				QPs: tc.qps, Timeout: 20 * time.Second}
			sres, cres, _, cout := runPair(t, devs, base, overUDP(47921))
			if sres.MTU != tc.mtu || cres.MTU != tc.mtu {
				t.Fatalf("negotiated MTU %d/%d, want %d", sres.MTU, cres.MTU, tc.mtu)
			}
			// The passive side prints the active side's numbers (in a
			// send test each side its own).
			// Iterations count all QPs, as perftest's do.
			total := uint64(tc.iters * tc.qps)
			if (tc.test != Send && sres.Report != cres.Report) || sres.Report.Iters != total ||
				cres.Report.Iters != total || cres.Report.AvgBW <= 0 || sres.Report.AvgBW <= 0 {
				t.Fatalf("reports: server %+v, client %+v", sres.Report, cres.Report)
			}
			if sres.Checked == "" || (tc.test != Write && tc.test != Send && cres.Checked == "") {
				t.Fatalf("data checks did not run: server %q, client %q", sres.Checked, cres.Checked)
			}
			if len(sres.LocalQPs) != tc.qps || len(cres.RemoteQPs) != tc.qps {
				t.Fatalf("%d and %d QPs, want %d", len(sres.LocalQPs), len(cres.RemoteQPs), tc.qps)
			}
			for q := range tc.qps {
				if sres.LocalQPs[q] != cres.RemoteQPs[q] || sres.RemoteQPs[q] != cres.LocalQPs[q] {
					t.Fatalf("QP %d keys: server %+v / %+v, client %+v / %+v", q, sres.LocalQPs[q], sres.RemoteQPs[q], cres.LocalQPs[q], cres.RemoteQPs[q])
				}
			}
			t.Logf("%s\nclient %+v\nserver %+v", lastLines(cout, 3), cres.Stats, sres.Stats)
		})
	}
}

// TestMTUNegotiation: each side adopts the smaller of the two MTUs.
func TestMTUNegotiation(t *testing.T) {
	devs := loopbackDevs(t, 47941)
	sres, cres, _, _ := runPair(t, devs, Config{Test: Write, Port: freeTCPPort(t), Size: 4096, Iters: 20, Timeout: 20 * time.Second},
		func(side int, c *Config) {
			overUDP(47941)(side, c)
			c.MTU = []int{4096, 512}[side]
		})
	if sres.MTU != 512 || cres.MTU != 512 {
		t.Fatalf("MTUs %d %d, want 512", sres.MTU, cres.MTU)
	}
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

// TestPeerMisbehaves runs softroce's listener against scripted peers that
// break the protocol: each run must end with a clear error, not hang.
func TestPeerMisbehaves(t *testing.T) {
	l, err := udp.Open(udp.Config{Addr: netip.MustParseAddr("127.0.0.1"), Port: 47951})
	if err != nil {
		t.Skipf("loopback UDP: %v", err)
	}
	dev, err := verbs.Open(l, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	sysData := func(c net.Conn) {
		// version, cycle buffer, cache line, MTU: the connector writes first.
		c.Write(MarshalVersion("6.06"))
		io.ReadFull(c, make([]byte, VersionLen))
		c.Write([]byte{0, 0, 16, 0})
		io.ReadFull(c, make([]byte, 4))
		c.Write([]byte{0, 0, 0, 64})
		io.ReadFull(c, make([]byte, 4))
		c.Write([]byte("3\x00"))
		io.ReadFull(c, make([]byte, 2))
	}
	cases := []struct {
		name   string
		script func(net.Conn)
		want   string
	}{
		{"old version", func(c net.Conn) { c.Write(MarshalVersion("5.60")); io.ReadFull(c, make([]byte, VersionLen)) }, "older than"},
		{"garbage version", func(c net.Conn) { c.Write(make([]byte, VersionLen)) }, "malformed"},
		{"closes after version", func(c net.Conn) { c.Write(MarshalVersion("6.06")) }, "peer closed"},
		{"bad system data", func(c net.Conn) {
			c.Write(MarshalVersion("6.06"))
			io.ReadFull(c, make([]byte, VersionLen))
			c.Write([]byte{0x7f, 0xff, 0xff, 0xff}) // a 2 GiB "page"
			io.ReadFull(c, make([]byte, 4))
			c.Write([]byte{0, 0, 0, 64})
			io.ReadFull(c, make([]byte, 4))
		}, "system data"},
		{"garbage keys", func(c net.Conn) { sysData(c); c.Write(bytes.Repeat([]byte{'x'}, KeysLen)) }, "malformed"},
		{"IPv6 GID", func(c net.Conn) {
			sysData(c)
			c.Write(Keys{QPN: 5, GID: verbs.GIDFromAddr(netip.MustParseAddr("fe80::1"))}.Marshal())
			io.ReadFull(c, make([]byte, KeysLen))
		}, "GID type mismatch"},
		{"silent after keys", func(c net.Conn) {
			sysData(c)
			c.Write(Keys{QPN: 5, GID: verbs.GIDFromAddr(netip.MustParseAddr("127.0.0.1"))}.Marshal())
			io.ReadFull(c, make([]byte, KeysLen))
			time.Sleep(3 * time.Second)
		}, "timeout"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			port := 47960 + i
			done := make(chan struct{})
			go func() {
				defer close(done)
				var c net.Conn
				var err error
				for range 50 {
					if c, err = net.Dial("tcp4", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
						break
					}
					time.Sleep(20 * time.Millisecond)
				}
				if err != nil {
					return
				}
				defer c.Close()
				tc.script(c)
			}()
			// A peer that goes silent for 3 s must draw "timeout" from the
			// 2 s Timeout, not the end of the connection after 3 s.
			_, err := Run(context.Background(), dev, Config{Port: port, Size: 4096, Iters: 10, Timeout: 2 * time.Second}, io.Discard)
			<-done
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// TestLoopbackDuplex: -b, both sides post traffic at once, each checks
// its own target area and prints the sum of both reports.
func TestLoopbackDuplex(t *testing.T) {
	devs := loopbackDevs(t, 48111)
	for _, tc := range []struct {
		test        Test
		size, iters int
		qps         int
	}{{Write, 4096, 200, 1}, {Write, 100, 300, 2}, {Read, 65536, 40, 1}, {Atomic, 8, 300, 2}} {
		t.Run(fmt.Sprintf("%v/size%d/q%d", tc.test, tc.size, tc.qps), func(t *testing.T) {
			sres, cres, _, _ := runPair(t, devs, Config{Test: tc.test, Port: freeTCPPort(t), Size: tc.size, Iters: tc.iters, QPs: tc.qps,
				MTU: 1024, Duplex: true, Timeout: 20 * time.Second}, overUDP(48111))
			res := [2]*Result{sres, cres}
			total := uint64(tc.iters * tc.qps)
			for side, r := range res {
				other := res[1-side]
				if r.Report.Iters != total || r.PeerReport != other.Report || r.Report.AvgBW <= 0 {
					t.Fatalf("side %d: report %+v, peer report %+v, other side's own %+v", side, r.Report, r.PeerReport, other.Report)
				}
				// Both the local (active) and the target (passive) checks ran.
				if !strings.Contains(r.Checked, "; ") && tc.test != Write {
					t.Fatalf("side %d checked only %q", side, r.Checked)
				}
				if !strings.Contains(r.Checked, "written") && !strings.Contains(r.Checked, "unchanged") && !strings.Contains(r.Checked, "sum to") {
					t.Fatalf("side %d: no target check in %q", side, r.Checked)
				}
			}
		})
	}
}

// freeTCPPort is a TCP port the kernel had free on 127.0.0.1 a moment
// ago: a fixed port in the ephemeral range may be any connection's.
func freeTCPPort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
