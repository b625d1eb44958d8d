package main

import (
	"encoding/json"
	"net"
	"strconv"
	"strings"
	"testing"

	"github.com/softroce/softroce/perf"
)

func TestBWCommandPipe(t *testing.T) {
	var code int
	out, errOut := runOut(t, func() { code = runPerf("bw", []string{"--backend", "pipe", "-s", "4096", "-n", "500", "-q", "2"}) })
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"RDMA_Write BW Test", "RC, 2 QP(s)", "#bytes     #iterations    BW peak[MB/sec]", " 4096       500 "} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	out, errOut = runOut(t, func() {
		code = runPerf("lat", []string{"--backend", "pipe", "--test", "atomic", "-n", "100", "--json"})
	})
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var rep perf.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("--json output: %v\n%s", err, out)
	}
	if rep.Kind != "lat" || rep.Backend != "pipe" || len(rep.Lat) != 1 || rep.Lat[0].Iterations != 100 || rep.Lat[0].Bytes != 8 {
		t.Errorf("report %+v", rep)
	}
}

func TestBWCommandErrors(t *testing.T) {
	// A TCP port nobody listens on.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	cases := []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"--test", "flush"}, 2, `unknown test "flush"`},
		{[]string{"--bind", "192.0.2.77", "--server"}, 2, "--bind 192.0.2.77: no local interface has this address"},
		{[]string{"--bind", "nonsense"}, 2, "not an IP address"},
		{[]string{"--backend", "xdp"}, 2, `--backend "xdp"`},
		{[]string{"--backend", "pipe", "127.0.0.1"}, 2, "both sides in this process"},
		{[]string{"--server", "--port", port}, 1, "--port " + port + ": TCP port already in use"},
		{[]string{}, 2, "give the server's address"},
	}
	for _, c := range cases {
		var code int
		_, errOut := runOut(t, func() { code = runPerf("bw", c.args) })
		if code != c.code || !strings.Contains(errOut, c.msg) {
			t.Errorf("%q: exit %d, stderr %q; want %d and %q", c.args, code, errOut, c.code, c.msg)
		}
	}
	ln.Close()
	var code int
	_, errOut := runOut(t, func() { code = runPerf("lat", []string{"127.0.0.1", "--port", port, "--wait", "300ms"}) })
	if code != 1 || !strings.Contains(errOut, "no answer from 127.0.0.1:"+port+" within 300ms: is `softroce lat --server` running there?") {
		t.Errorf("silent peer: exit %d, %q", code, errOut)
	}
}

// TestLatRawUDP: `lat --raw-udp` as server and client over loopback prints
// the raw reference in lat's columns, and the server stops when the
// client is done.
func TestLatRawUDP(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(pc.LocalAddr().(*net.UDPAddr).Port)
	pc.Close()
	var code, scode int
	out, errOut := runOut(t, func() {
		sdone := make(chan struct{})
		go func() {
			defer close(sdone)
			scode = runPerf("lat", []string{"--server", "--raw-udp", "--bind", "127.0.0.1", "--udp-port", port})
		}()
		code = runPerf("lat", []string{"--raw-udp", "--bind", "127.0.0.1", "--udp-port", port, "-n", "200", "-s", "64", "--wait", "2s", "127.0.0.1"})
		<-sdone
	})
	if code != 0 || scode != 0 {
		t.Fatalf("exit %d (server %d): %s", code, scode, errOut)
	}
	for _, want := range []string{perf.RawTitle, "blocking reads", "t_typical[usec]", " 64      200 "} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(errOut, "answered 200 datagrams") {
		t.Errorf("server did not report its datagrams: %s", errOut)
	}
	_, errOut = runOut(t, func() { code = runPerf("lat", []string{"--raw-udp", "--backend", "pipe"}) })
	if code != 2 || !strings.Contains(errOut, "--raw-udp measures kernel UDP sockets") {
		t.Errorf("--raw-udp --backend pipe: exit %d, %q", code, errOut)
	}
}
