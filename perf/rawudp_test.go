package perf

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"
)

func rawPair(t *testing.T) (srv, cli *net.UDPConn, peer netip.AddrPort) {
	t.Helper()
	lo := netip.MustParseAddrPort("127.0.0.1:0")
	srv, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(lo))
	if err != nil {
		t.Fatal(err)
	}
	cli, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(lo))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close(); cli.Close() })
	return srv, cli, srv.LocalAddr().(*net.UDPAddr).AddrPort()
}

// TestRawUDPPingPong runs the raw reference over loopback, blocking and
// busy-polling: every size gets its round trips, the statistics are
// ordered, and the server answered each datagram and stopped when told.
func TestRawUDPPingPong(t *testing.T) {
	for _, busy := range []time.Duration{0, 200 * time.Microsecond} {
		t.Run(map[bool]string{false: "blocking", true: "busy-poll"}[busy > 0], func(t *testing.T) {
			srv, cli, peer := rawPair(t)
			rc := RawConfig{BusyPoll: busy}
			served := make(chan int64, 1)
			errc := make(chan error, 1)
			go func() {
				n, err := RawUDPServe(ctx(t), srv, rc)
				served <- n
				errc <- err
			}()
			var rows int
			rep, err := RawUDPPing(ctx(t), cli, peer, Config{Sizes: []int{1, 2, 64, 4096}, Iters: 300}, rc, func(any) { rows++ })
			if err != nil {
				t.Fatal(err)
			}
			if n, err := <-served, <-errc; err != nil || n < 4*300 {
				t.Errorf("server answered %d datagrams (%v), want at least %d", n, err, 4*300)
			}
			if rows != 4 || len(rep.Lat) != 4 || rep.Kind != "lat" || rep.Test != RawTest {
				t.Fatalf("report %+v, %d rows", rep, rows)
			}
			for i, r := range rep.Lat {
				if r.Bytes != []int{1, 2, 64, 4096}[i] {
					t.Errorf("row %d is for %d bytes", i, r.Bytes)
				}
				saneLat(t, r, 300)
			}
		})
	}
}

// TestRawUDPStaleAnswers: a server that answers every datagram twice
// leaves a stale answer in the socket before each round; the client must
// match answers to rounds, not count the stale one as this round's.
func TestRawUDPStaleAnswers(t *testing.T) {
	srv, cli, peer := rawPair(t)
	go func() {
		buf := make([]byte, 128)
		for {
			n, from, err := srv.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			srv.WriteToUDPAddrPort(buf[:n], from)
			srv.WriteToUDPAddrPort(buf[:n], from)
		}
	}()
	rep, err := RawUDPPing(ctx(t), cli, peer, Config{Sizes: []int{2}, Iters: 200}, RawConfig{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	saneLat(t, rep.Lat[0], 200)
}

// TestRawUDPNoServer: nobody answers; the client gives up after Wait,
// naming the command to start on the other side, and ends when its
// context does.
func TestRawUDPNoServer(t *testing.T) {
	_, cli, peer := rawPair(t)
	_, err := RawUDPPing(ctx(t), cli, peer, Config{Iters: 10}, RawConfig{Wait: 300 * time.Millisecond}, nil)
	if !errors.Is(err, ErrNoAnswer) || !strings.Contains(err.Error(), "softroce lat --server --raw-udp") {
		t.Fatalf("no server: %v", err)
	}
	c, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := RawUDPPing(c, cli, peer, Config{Iters: 10}, RawConfig{Wait: time.Hour}, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("context ended: %v", err)
	}
}

// TestRawUDPLateServer: the server starts after the client; the client
// waits for it, and no sample includes that wait.
func TestRawUDPLateServer(t *testing.T) {
	srv, cli, peer := rawPair(t)
	// Nobody reads the server's socket for a while: datagrams sent now wait.
	go func() {
		time.Sleep(400 * time.Millisecond)
		RawUDPServe(ctx(t), srv, RawConfig{})
	}()
	rep, err := RawUDPPing(ctx(t), cli, peer, Config{Iters: 50}, RawConfig{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r := rep.Lat[0]; r.Iterations != 50 || r.Max >= 400e3 {
		t.Fatalf("row %+v: a sample holds the wait for the server", r)
	}
}

// TestRawUDPServeEnds: the server stops when its context ends.
func TestRawUDPServeEnds(t *testing.T) {
	srv, _, _ := rawPair(t)
	c, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { _, err := RawUDPServe(c, srv, RawConfig{}); errc <- err }()
	cancel()
	if err := <-errc; err == nil {
		t.Error("server ended without an error after its context was cancelled")
	}
}

// TestRawLatHeader: the header names the raw reference and keeps the
// latency columns.
func TestRawLatHeader(t *testing.T) {
	var b strings.Builder
	WriteRawLatHeader(&b, &Config{Iters: 5, BusyPoll: time.Millisecond})
	for _, want := range []string{RawTitle, "t_typical[usec]", "99.9% percentile", "poll the socket for 1ms"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("header lacks %q:\n%s", want, b.String())
		}
	}
}
