package main

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// qpLine finds the " softroce QP:" lines pingpong and perftest print and
// returns the retransmissions and timeouts of each.
var qpLine = regexp.MustCompile(` softroce QP: \d+ packets sent, \d+ received, (\d+) retransmitted, (\d+) timeouts`)

// impairLine finds the " softroce impair:" lines: packets offered, dropped.
var impairLine = regexp.MustCompile(` softroce impair: (\d+) packets sent, (\d+) dropped`)

// sumMatches adds up group g of every match of re in out, and counts them.
func sumMatches(t *testing.T, re *regexp.Regexp, out string, g int) (sum, n int) {
	t.Helper()
	for _, m := range re.FindAllStringSubmatch(out, -1) {
		v, err := strconv.Atoi(m[g])
		if err != nil {
			t.Fatal(err)
		}
		sum += v
		n++
	}
	return sum, n
}

// checkImpaired asserts both sides of a pair said their sends were
// impaired, dropped packets, and that RC recovered by retransmitting.
func checkImpaired(t *testing.T, cmd, out string) {
	t.Helper()
	if n := strings.Count(out, "softroce "+cmd+": impaired sends: loss=10%,seed="); n != 2 {
		t.Errorf("%d sides say their sends are impaired, want 2", n)
	}
	dropped, n := sumMatches(t, impairLine, out, 2)
	if n != 2 || dropped == 0 {
		t.Fatalf("impair lines: %d, %d packets dropped; want 2 and some:\n%s", n, dropped, out)
	}
	retx, n := sumMatches(t, qpLine, out, 1)
	if n != 2 || retx == 0 {
		t.Fatalf("QP lines: %d, %d retransmitted; want 2 and some:\n%s", n, retx, out)
	}
	t.Logf("softroce %s --impair loss=10%%: %d packets dropped, %d retransmitted", cmd, dropped, retx)
}

// pingpong --impair loss=10% over 127.0.0.1: every exchange completes,
// and both sides report the drops and the retransmissions.
func TestImpairPingpong(t *testing.T) {
	for _, typ := range []string{"rc", "srq"} {
		t.Run(typ, func(t *testing.T) {
			a, b, tcp := freePort("udp"), freePort("udp"), freePort("tcp")
			common := []string{"--type", typ, "--bind", "127.0.0.1", "-p", strconv.Itoa(tcp), "--timeout", "60s", "-s", "3000", "-n", "100"}
			if typ == "srq" {
				common = append(common, "-q", "2", "-r", "20")
			} else {
				common = append(common, "-c")
			}
			out, srv, cli := runPair(t, runPingpong,
				append([]string{"--udp-port", strconv.Itoa(a), "--peer-udp-port", strconv.Itoa(b), "--impair", "loss=10%,seed=3"}, common...),
				append(append([]string{"--udp-port", strconv.Itoa(b), "--peer-udp-port", strconv.Itoa(a), "--impair", "loss=10%,seed=4"}, common...), "127.0.0.1"))
			if srv != 0 || cli != 0 || strings.Count(out, " iters in ") != 2 {
				t.Fatalf("exit %d and %d:\n%s", srv, cli, out)
			}
			checkImpaired(t, "pingpong", out)
		})
	}
}

// perftest --impair loss=10% over 127.0.0.1: write and send complete,
// and the QP line both sides print counts the retransmissions.
func TestImpairPerftest(t *testing.T) {
	for _, test := range []string{"write", "send"} {
		t.Run(test, func(t *testing.T) {
			a, b, tcp := freePort("udp"), freePort("udp"), freePort("tcp")
			common := []string{"--bind", "127.0.0.1", "-p", strconv.Itoa(tcp), "-n", "200", "-s", "3000", "-t", "16", "--timeout", "60s"}
			out, srv, cli := runPair(t, runPerftest,
				append([]string{test, "--udp-port", strconv.Itoa(a), "--peer-udp-port", strconv.Itoa(b), "--impair", "loss=10%,seed=5"}, common...),
				append([]string{test, "--udp-port", strconv.Itoa(b), "--peer-udp-port", strconv.Itoa(a), "--impair", "loss=10%,seed=6", "127.0.0.1"}, common...))
			if srv != 0 || cli != 0 || strings.Count(out, "#bytes") != 2 {
				t.Fatalf("exit %d and %d:\n%s", srv, cli, out)
			}
			checkImpaired(t, "perftest", out)
		})
	}
}

// A bad spec is a usage error with the advice bw gives.
func TestImpairBadSpec(t *testing.T) {
	for _, c := range []struct {
		cmd  string
		args []string
	}{
		{"pingpong", []string{"pingpong", "--impair", "loss=10"}},
		{"perftest", []string{"perftest", "write", "--impair", "loss=10"}},
		{"serve", []string{"serve", "--socket", "/nonexistent/s.sock", "--impair", "loss=10"}},
	} {
		var code int
		_, errOut := runOut(t, func() { code = run(c.args) })
		want := "softroce " + c.cmd + ": --impair loss=10: impair: loss=10: a probability is a percentage or a fraction: write 10% or 0.1"
		if code != 2 || !strings.Contains(errOut, want) {
			t.Errorf("%v: exit %d, %q; want 2 and %q", c.args, code, errOut, want)
		}
	}
	for _, cmd := range []string{"pingpong", "perftest", "serve"} {
		if !commandFlags(t, cmd)["impair"] {
			t.Errorf("softroce %s -h lists no --impair", cmd)
		}
	}
}
