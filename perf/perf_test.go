package perf

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/netnstest"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/nic/afxdp"
	"github.com/softroce/softroce/nic/udp"
)

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func saneBW(t *testing.T, r BWResult, iters int64) {
	t.Helper()
	if r.Iterations != iters || r.AvgMBps <= 0 || r.PeakMBps < r.AvgMBps || r.MsgRateMpps <= 0 || r.Elapsed <= 0 {
		t.Errorf("implausible result %+v (want %d iterations)", r, iters)
	}
	// MB/s and Mpps must agree: avg = rate * size.
	if want := r.MsgRateMpps * 1e6 * float64(r.Bytes) / (1 << 20); r.Test != Atomic && (r.AvgMBps < want*0.99 || r.AvgMBps > want*1.01) {
		t.Errorf("average %.2f MB/s disagrees with %.6f Mpps x %d bytes", r.AvgMBps, r.MsgRateMpps, r.Bytes)
	}
}

func saneLat(t *testing.T, r LatResult, iters int64) {
	t.Helper()
	if r.Iterations != iters || !(r.Min > 0 && r.Min <= r.Typical && r.Typical <= r.P99 && r.P99 <= r.P999 && r.P999 <= r.Max) || r.Avg < r.Min || r.Avg > r.Max {
		t.Errorf("implausible latency %+v", r)
	}
}

// TestPatternHasNoPeriod: the test data must not repeat at a packet, page
// or 64 KiB distance, or misplaced bytes would pass for the right ones.
func TestPatternHasNoPeriod(t *testing.T) {
	b := make([]byte, 1<<18+64)
	pattern(b)
	for _, d := range []int{256, 1024, 4096, 1 << 16, 1 << 17} {
		if bytes.Equal(b[:64], b[d:d+64]) {
			t.Errorf("pattern repeats after %d bytes", d)
		}
	}
}

// pattern fills the client's buffer with a PRNG stream: nothing repeats,
// so bytes landing at a wrong offset never pass for the right ones.
func pattern(b []byte) {
	r := rand.New(rand.NewPCG(3, uint64(len(b))))
	var w [8]byte
	for i := 0; i < len(b); i += 8 {
		binary.LittleEndian.PutUint64(w[:], r.Uint64())
		copy(b[i:], w[:])
	}
}

func TestPipeBW(t *testing.T) {
	for _, test := range []Test{Write, Read, Send, Atomic} {
		t.Run(string(test), func(t *testing.T) {
			c := Config{Test: test, Sizes: []int{4096}, Iters: 2000, QPs: 2}
			l, err := RunLocal(ctx(t), c, false, nil, [2]uint16{}, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			if len(l.Report.BW) != 1 {
				t.Fatalf("report %+v", l.Report)
			}
			saneBW(t, l.Report.BW[0], 2000)
			if test == Atomic {
				// Every fetch-and-add added 1 to the server's word.
				if got := binary.NativeEndian.Uint64(l.Server.Buf()); got != 2000 {
					t.Errorf("server counter %d after 2000 fetch-and-adds", got)
				}
			}
		})
	}
}

// TestPipeData checks that the bytes arrive intact: the client's pattern
// ends up in the server's memory (write, send) and the server's in the
// client's (read).
func TestPipeData(t *testing.T) {
	for _, test := range []Test{Write, Read, Send} {
		t.Run(string(test), func(t *testing.T) {
			c := Config{Test: test, Sizes: []int{3000}, Iters: 1}
			l, err := RunLocal(ctx(t), Config{Test: test, Sizes: []int{3000}, Iters: 1}, false, nil, [2]uint16{}, nil)
			if err != nil {
				t.Fatal(err)
			}
			// Second run with patterns in place.
			src, dst := l.Client.Buf(), l.Server.Buf()
			if test == Read {
				src, dst = dst, src
			}
			pattern(src)
			c.fill(false)
			if _, err := runSizes(ctx(t), l.Client, &c, l.Server.Info(0), false, nil); err != nil {
				t.Fatal(err)
			}
			if test == Send {
				// The server's receive loop has stopped: poll by hand.
				deadline := time.Now().Add(5 * time.Second)
				for !bytes.Equal(src[:3000], dst[:3000]) && time.Now().Before(deadline) {
					time.Sleep(time.Millisecond)
				}
			}
			if !bytes.Equal(src[:3000], dst[:3000]) {
				t.Errorf("%s: data differs", test)
			}
			l.Close()
		})
	}
}

func TestPipeLat(t *testing.T) {
	for _, test := range []Test{Write, Read, Send, Atomic} {
		t.Run(string(test), func(t *testing.T) {
			l, err := RunLocal(ctx(t), Config{Test: test, Iters: 300}, true, nil, [2]uint16{}, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			saneLat(t, l.Report.Lat[0], 300)
		})
	}
}

func TestSweepAndDuration(t *testing.T) {
	var rows int
	l, err := RunLocal(ctx(t), Config{Test: Write, Sizes: []int{2, 64, 1024}, Iters: 200}, false, nil, [2]uint16{}, func(any) { rows++ })
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	if rows != 3 || len(l.Report.BW) != 3 || l.Report.BW[2].Bytes != 1024 {
		t.Errorf("sweep gave %d rows: %+v", rows, l.Report.BW)
	}
	// A run for a duration lasts at least that long and reports what it
	// did consistently; how much it does in that time is a benchmark's
	// business, not a test's.
	start := time.Now()
	l, err = RunLocal(ctx(t), Config{Test: Write, Sizes: []int{512}, Duration: 300 * time.Millisecond}, false, nil, [2]uint16{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	r := l.Report.BW[0]
	if el := time.Since(start); el < 300*time.Millisecond || r.Elapsed < 300*time.Millisecond || r.Elapsed > el || r.Iterations < 1 {
		t.Errorf("a 300ms run returned after %v, reports %v elapsed and %d operations", el, r.Elapsed, r.Iterations)
	}
	saneBW(t, r, r.Iterations)
}

func TestConfigErrors(t *testing.T) {
	for _, c := range []Config{{Test: "flush"}, {Test: Write, QPs: 1000}, {Test: Write, MTU: 1500}, {Test: Write, Sizes: []int{0}}} {
		if _, err := RunLocal(ctx(t), c, false, nil, [2]uint16{}, nil); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}

func TestReport(t *testing.T) {
	var b bytes.Buffer
	c := Config{Test: Write}
	c.fill(false)
	WriteBWHeader(&b, Title(Write, false), &c)
	WriteBWRow(&b, &BWResult{Bytes: 65536, Iterations: 5000, PeakMBps: 1234.5, AvgMBps: 1200.25, MsgRateMpps: 0.0192})
	WriteFooter(&b)
	out := b.String()
	for _, want := range []string{"RDMA_Write BW Test", "#bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]", " 65536      5000             1234.50            1200.25              0.019200"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
	b.Reset()
	WriteLatHeader(&b, Title(Read, true), &c)
	if !strings.Contains(b.String(), "99% percentile[usec]   99.9% percentile[usec]") {
		t.Errorf("latency header: %s", b.String())
	}
	r := LatResult{}
	fillLat(&r, []float64{5, 1, 3, 2, 4})
	if r.Min != 1 || r.Max != 5 || r.Typical != 3 || r.Avg != 3 || r.P99 != 5 {
		t.Errorf("stats %+v", r)
	}
}

// openUDP opens a nic/udp link on 127.0.0.1 on a free UDP port (4791
// may be taken by another test on this host).
func openUDP(netip.Addr) (nic.Link, uint16, error) {
	for try := 0; ; try++ {
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			return nil, 0, err
		}
		port := c.LocalAddr().(*net.UDPAddr).Port
		c.Close()
		l, err := udp.Open(udp.Config{Addr: netip.MustParseAddr("127.0.0.1"), Port: port, MTU: 1500})
		if err != nil && try < 5 {
			continue // someone took it in between
		}
		if err != nil {
			return nil, 0, err
		}
		return l, l.LocalAddrPort().Port(), nil
	}
}

// TestUDPLoopback runs client and server in this process over nic/udp on
// 127.0.0.1 with different UDP ports, through the TCP exchange.
func TestUDPLoopback(t *testing.T) {
	for _, tc := range []struct {
		test Test
		lat  bool
	}{{Write, false}, {Read, false}, {Send, false}, {Atomic, false}, {Write, true}, {Send, true}} {
		name := string(tc.test)
		if tc.lat {
			name += "-lat"
		}
		t.Run(name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			peer := netip.MustParseAddrPort(ln.Addr().String())
			type out struct {
				rep *Report
				err error
			}
			srv := make(chan out, 1)
			go func() {
				rep, err := Serve(ctx(t), ln, ServerConfig{Backend: "udp", Open: openUDP})
				srv <- out{rep, err}
			}()
			iters := 1000
			if tc.lat {
				iters = 200
			}
			rep, err := Run(ctx(t), ClientConfig{Peer: peer, Backend: "udp", Open: func(local netip.Addr) (nic.Link, uint16, error) {
				if local != netip.MustParseAddr("127.0.0.1") {
					t.Errorf("client local address %v", local)
				}
				return openUDP(local)
			}}, Config{Test: tc.test, Sizes: []int{1024}, Iters: iters}, tc.lat, nil)
			if err != nil {
				t.Fatal(err)
			}
			s := <-srv
			if s.err != nil {
				t.Fatalf("server: %v", s.err)
			}
			if tc.lat {
				saneLat(t, rep.Lat[0], int64(iters))
				if len(s.rep.Lat) != 1 {
					t.Errorf("server got report %+v", s.rep)
				}
			} else {
				saneBW(t, rep.BW[0], int64(iters))
				if len(s.rep.BW) != 1 || s.rep.BW[0].Iterations != int64(iters) {
					t.Errorf("server got report %+v", s.rep)
				}
			}
		})
	}
}

func TestNoAnswer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	peer := netip.MustParseAddrPort(ln.Addr().String())
	ln.Close() // nobody listens there now
	start := time.Now()
	_, err = Run(ctx(t), ClientConfig{Peer: peer, Wait: 500 * time.Millisecond, Open: func(netip.Addr) (nic.Link, uint16, error) {
		t.Error("opened a link without a server")
		return nil, 0, errors.New("no")
	}}, Config{Test: Write}, false, nil)
	if !errors.Is(err, ErrNoAnswer) || !strings.Contains(err.Error(), "within 500ms") || !strings.Contains(err.Error(), "softroce bw --server") {
		t.Errorf("error %v", err)
	}
	// It waited (about) the 500 ms asked for before giving up.
	if el := time.Since(start); el < 400*time.Millisecond {
		t.Errorf("gave up after %v", el)
	}
}

// TestAFXDP runs bandwidth and latency over AF_XDP links on the two ends
// of a veth pair between two namespaces (root only).
func TestAFXDP(t *testing.T) {
	netnstest.Require(t)
	v := netnstest.Pair(t, netnstest.VethConfig{MTU: 1500})
	open := func(e *netnstest.End) nic.Link {
		var l *afxdp.Link
		e.NS.Run(t, func() (err error) {
			l, err = afxdp.Open(afxdp.Config{Interface: e.Name, ResolveWait: 2 * time.Second})
			return err
		})
		return l
	}
	for _, lat := range []bool{false, true} {
		links := [2]nic.Link{open(v.A), open(v.B)}
		c := Config{Test: Write, Sizes: []int{4096}, Iters: 1000}
		if lat {
			c = Config{Test: Read, Sizes: []int{64}, Iters: 200}
		}
		l, err := RunLocal(ctx(t), c, lat, &links, [2]uint16{}, nil)
		if err != nil {
			links[0].Close()
			links[1].Close()
			t.Fatalf("lat=%v: %v", lat, err)
		}
		if lat {
			saneLat(t, l.Report.Lat[0], 200)
			t.Logf("AF_XDP read latency, 64 bytes: typical %.1f us, p99 %.1f us", l.Report.Lat[0].Typical, l.Report.Lat[0].P99)
		} else {
			saneBW(t, l.Report.BW[0], 1000)
			t.Logf("AF_XDP write bandwidth, 4096 bytes: %.1f MB/s average, %d retransmits", l.Report.BW[0].AvgMBps, l.Report.BW[0].Retransmits)
		}
		l.Close()
	}
}

// TestServeHostileClient checks that the server refuses garbage, a wrong
// protocol version and absurd parameters with an error, without opening
// a link.
func TestServeHostileClient(t *testing.T) {
	for _, msg := range []string{
		"this is not json\n",
		`{"proto":"softroce-perf/999","kind":"bw","test":"write","max_size":64,"qps":1}` + "\n",
		`{"proto":"softroce-perf/1","kind":"bw","test":"write","max_size":1000000000,"qps":1}` + "\n",
		`{"proto":"softroce-perf/1","kind":"bw","test":"write","max_size":64,"qps":100000}` + "\n",
		`{"proto":"softroce-perf/1","kind":"bw","test":"rm -rf","max_size":64,"qps":1}` + "\n",
	} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		errc := make(chan error, 1)
		go func() {
			_, err := Serve(ctx(t), ln, ServerConfig{Open: func(netip.Addr) (nic.Link, uint16, error) {
				t.Error("server opened a link for a bad client")
				return nil, 0, errors.New("no")
			}})
			errc <- err
		}()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		c.Write([]byte(msg))
		if err := <-errc; err == nil {
			t.Errorf("%q accepted", msg)
		}
		c.Close()
		ln.Close()
	}
}
