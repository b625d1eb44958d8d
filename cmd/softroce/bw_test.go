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

// perftest's flag names work on lat and bw: -a sweeps the sizes (-p is in
// TestBWCommandErrors).
func TestBWPerftestFlagNames(t *testing.T) {
	var code int
	out, errOut := runOut(t, func() {
		code = runPerf("lat", []string{"--backend", "pipe", "-a", "-n", "5", "-t", "4", "--json"})
	})
	if code != 0 {
		t.Fatalf("lat -a -t 4: exit %d: %s", code, errOut)
	}
	var rep perf.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("--json output: %v\n%s", err, out)
	}
	if len(rep.Lat) != 16 || rep.Lat[0].Bytes != 2 || rep.Lat[15].Bytes != 65536 {
		t.Errorf("lat -a: %d sizes, want the 16 powers of two from 2 to 65536: %+v", len(rep.Lat), rep.Lat)
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
		{[]string{"--server", "-p", port}, 1, "--port " + port + ": TCP port already in use"},
		{[]string{}, 2, "give the server's address"},
		{[]string{"--backend", "pipe", "--cc", "reno"}, 2, `--cc "reno": want none or dcqcn`},
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

// TestPerfImpair: --impair damages the wire bw and lat run over, and RC's
// recovery shows in the retransmission counts (JSON and the stderr note),
// in one process and between two over UDP.
func TestPerfImpair(t *testing.T) {
	var code int
	out, errOut := runOut(t, func() {
		code = runPerf("bw", []string{"--backend", "pipe", "--impair", "loss=10%,seed=3", "-s", "1024", "-n", "100", "--tx-depth", "8", "--json"})
	})
	if code != 0 {
		t.Fatalf("bw exit %d: %s", code, errOut)
	}
	var rep perf.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("--json output: %v\n%s", err, out)
	}
	if len(rep.BW) != 1 || rep.BW[0].Iterations != 100 || rep.BW[0].Retransmits == 0 {
		t.Errorf("bw with 10%% loss: %+v, want retransmissions", rep.BW)
	}
	if !strings.Contains(errOut, "impaired sends: loss=10%,seed=3") {
		t.Errorf("bw does not say the wire is impaired: %q", errOut)
	}
	out, errOut = runOut(t, func() {
		code = runPerf("lat", []string{"--backend", "pipe", "--impair", "loss=10%,seed=3", "-n", "40"})
	})
	if code != 0 || !strings.Contains(out, " 2       40 ") || !strings.Contains(errOut, "packets retransmitted (the path dropped packets; RC recovered)") {
		t.Errorf("lat with 10%% loss: exit %d\n%s\n%s", code, out, errOut)
	}

	// Client and server over UDP on loopback, the client's sends impaired.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	// Two UDP ports the kernel had free, held together so they differ.
	var udp [2]string
	var pcs [2]net.PacketConn
	for i := range pcs {
		if pcs[i], err = net.ListenPacket("udp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		udp[i] = strconv.Itoa(pcs[i].LocalAddr().(*net.UDPAddr).Port)
	}
	pcs[0].Close()
	pcs[1].Close()
	var scode int
	out, errOut = runOut(t, func() {
		sdone := make(chan struct{})
		go func() {
			defer close(sdone)
			scode = runPerf("bw", []string{"--server", "--bind", "127.0.0.1", "--port", port, "--udp-port", udp[0]})
		}()
		code = runPerf("bw", []string{"--bind", "127.0.0.1", "--port", port, "--udp-port", udp[1], "--impair", "loss=10%,seed=5",
			"-s", "1024", "-n", "100", "--tx-depth", "8", "--json", "127.0.0.1"})
		<-sdone
	})
	if code != 0 || scode != 0 {
		t.Fatalf("udp: exit %d (server %d): %s", code, scode, errOut)
	}
	i := strings.Index(out, "{")
	if i < 0 {
		t.Fatalf("no JSON in %q", out)
	}
	dec := json.NewDecoder(strings.NewReader(out[i:]))
	var reps []perf.Report
	for dec.More() {
		var r perf.Report
		if err := dec.Decode(&r); err != nil {
			break
		}
		reps = append(reps, r)
	}
	retx := false
	for _, r := range reps {
		for _, b := range r.BW {
			retx = retx || b.Retransmits > 0
		}
	}
	if !retx {
		t.Errorf("udp with 10%% loss: no retransmissions in %s", out)
	}

	for _, args := range [][]string{{"--backend", "pipe", "--impair", "loss=10"}, {"--backend", "pipe", "--impair", "nope=1"}, {"--raw-udp", "--impair", "loss=1%"}} {
		_, errOut = runOut(t, func() { code = runPerf("lat", args) })
		if code != 2 || !strings.Contains(errOut, "--impair") {
			t.Errorf("%q: exit %d, %q", args, code, errOut)
		}
	}
}

// TestBWCC: `bw --cc dcqcn` reports congestion control in --json, per QP,
// and `--cc none` leaves it out.
func TestBWCC(t *testing.T) {
	for _, mode := range []string{"dcqcn", "none"} {
		var code int
		out, errOut := runOut(t, func() {
			code = runPerf("bw", []string{"--backend", "pipe", "--cc", mode, "-s", "4096", "-n", "200", "-q", "2", "--json"})
		})
		if code != 0 {
			t.Fatalf("--cc %s: exit %d: %s", mode, code, errOut)
		}
		var rep perf.Report
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("--json output: %v\n%s", err, out)
		}
		if len(rep.BW) != 1 {
			t.Fatalf("--cc %s: report %+v", mode, rep)
		}
		c := rep.BW[0].CC
		switch {
		case mode == "none" && c != nil:
			t.Errorf("--cc none: congestion control reported: %+v", c)
		case mode == "dcqcn" && (c == nil || len(c.QPs) != 2 || !c.QPs[0].Enabled || c.QPs[1].RateBPS <= 0):
			t.Errorf("--cc dcqcn: %+v", c)
		}
		if mode == "dcqcn" && !strings.Contains(out, `"rp_cnp_handled"`) {
			t.Errorf("--cc dcqcn: JSON lacks the ConnectX counter names:\n%s", out)
		}
	}
}
