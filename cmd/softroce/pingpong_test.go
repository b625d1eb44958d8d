package main

import (
	"strconv"
	"strings"
	"testing"
)

// TestPingpongFlagErrors: a flag the chosen tool lacks, or a value it
// refuses, is a usage error (exit 2) that says what to do, before any
// device is opened.
func TestPingpongFlagErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--type", "xrc"}, `unknown --type "xrc": choose rc, uc, ud or srq`},
		{[]string{"--type", "ud", "-m", "2048"}, "ibv_ud_pingpong has no -m"},
		{[]string{"--type", "ud", "--peer-udp-port", "4792"}, "--peer-udp-port does not work with --type ud"},
		{[]string{"-q", "4"}, "ibv_rc_pingpong has no -q (it is a flag of --type [srq])"},
		{[]string{"--type", "uc", "-q", "4"}, "ibv_uc_pingpong has no -q"},
		{[]string{"--type", "srq", "-c"}, "ibv_srq_pingpong has no -c (it is a flag of --type [rc uc])"},
		{[]string{"--type", "srq", "-q", "20", "-r", "10"}, "rx_depth 10 is too small for 20 QPs -- must have at least one receive per QP (raise -r or lower -q)"},
		{[]string{"--type", "srq", "-q", "300", "-r", "1000"}, "at most 256 (lower -q)"},
		{[]string{"-m", "1500"}, "-m takes 256, 512, 1024, 2048 or 4096"},
		{[]string{"-i", "2"}, "-i 2: softroce's device has port 1 only"},
		{[]string{"-l", "16"}, "a service level is 0..15"},
		{[]string{"-s", "0"}, "at least 1 byte"},
		{[]string{"-n", "0"}, "-r, -n and -q take 1 or more"},
		{[]string{"a", "b"}, "one SERVER at most"},
	} {
		var code int
		_, stderr := runOut(t, func() { code = runPingpong(c.args) })
		if code != 2 || !strings.Contains(stderr, c.want) {
			t.Errorf("softroce pingpong %v: exit %d, stderr %q; want exit 2 and %q", c.args, code, stderr, c.want)
		}
	}
}

// TestPingpongCommandLoopback runs `softroce pingpong` as server and
// client over 127.0.0.1 for rc, uc and srq, one with -e. (UD needs two
// addresses: its address handles name no UDP port.)
func TestPingpongCommandLoopback(t *testing.T) {
	for i, args := range [][]string{
		{"--type", "rc", "-s", "3000", "-n", "40", "-c"},
		{"--type", "srq", "-q", "4", "-r", "20", "-n", "80", "-e"},
		{"--type", "uc", "-s", "5000", "-m", "2048", "-n", "40", "-c"},
	} {
		port := 47960 + 3*i
		common := append([]string{"--bind", "127.0.0.1", "-p", strconv.Itoa(port + 2), "--timeout", "20s"}, args...)
		out, srv, cli := runPair(t, runPingpong,
			append([]string{"--udp-port", strconv.Itoa(port), "--peer-udp-port", strconv.Itoa(port + 1)}, common...),
			append(append([]string{"--udp-port", strconv.Itoa(port + 1), "--peer-udp-port", strconv.Itoa(port)}, common...), "127.0.0.1"))
		nqp := 1
		if args[1] == "srq" {
			nqp = 4
		}
		if srv != 0 || cli != 0 || strings.Count(out, " iters in ") != 2 || strings.Count(out, "  remote address: LID 0x0000, QPN 0x") != 2*nqp {
			t.Fatalf("%v: exit %d and %d:\n%s", args, srv, cli, out)
		}
	}
}
