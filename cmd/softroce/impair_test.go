package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/abitest"
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

// checkImpaired asserts that the impaired sides of a pair said so and
// dropped packets, and that RC recovered by retransmitting (their QP
// lines count the retransmissions).
func checkImpaired(t *testing.T, cmd, out string, impaired int) {
	t.Helper()
	if n := strings.Count(out, "softroce "+cmd+": impaired sends: loss=10%,seed="); n != impaired {
		t.Errorf("%d sides say their sends are impaired, want %d", n, impaired)
	}
	dropped, n := sumMatches(t, impairLine, out, 2)
	if n != impaired || dropped == 0 {
		t.Fatalf("impair lines: %d, %d packets dropped; want %d and some:\n%s", n, dropped, impaired, out)
	}
	retx, n := sumMatches(t, qpLine, out, 1)
	if n != impaired || retx == 0 {
		t.Fatalf("QP lines: %d, %d retransmitted; want %d and some:\n%s", n, retx, impaired, out)
	}
	t.Logf("softroce %s --impair loss=10%% on %d side(s): %d packets dropped, %d retransmitted", cmd, impaired, dropped, retx)
}

// pingpong --impair loss=10% over 127.0.0.1: every exchange completes,
// and the impaired side counts its retransmissions. Only the server's sends are
// impaired: the client exits as soon as the last message has arrived, so
// a loss of its ACK for it could not be made up (the server would
// retransmit to a closed QP until its retry count ran out), with
// ibv_rc_pingpong as with this one. (With --type srq either side may
// finish first, its peer's last send on another QP unacknowledged, so
// neither side's sends can be impaired safely.) Messages of one packet: one that must
// get through with its ACK within the tools' seven retries would fail
// now and then with several packets, each lost one time in ten.
func TestImpairPingpong(t *testing.T) {
	for _, mode := range []string{"poll", "events"} {
		t.Run(mode, func(t *testing.T) {
			a, b, tcp := freePort("udp"), freePort("udp"), freePort("tcp")
			common := []string{"--type", "rc", "--bind", "127.0.0.1", "-p", strconv.Itoa(tcp), "--timeout", "60s", "-s", "1000", "-n", "100", "-c"}
			if mode == "events" {
				common = append(common, "-e")
			}
			out, srv, cli := runPair(t, runPingpong,
				append([]string{"--udp-port", strconv.Itoa(a), "--peer-udp-port", strconv.Itoa(b), "--impair", "loss=10%,seed=3"}, common...),
				append(append([]string{"--udp-port", strconv.Itoa(b), "--peer-udp-port", strconv.Itoa(a)}, common...), "127.0.0.1"))
			if srv != 0 || cli != 0 || strings.Count(out, " iters in ") != 2 {
				t.Fatalf("exit %d and %d:\n%s", srv, cli, out)
			}
			checkImpaired(t, "pingpong", out, 1)
		})
	}
}

// perftest --impair loss=10% over 127.0.0.1, both sides' sends: write
// and send complete (the closing TCP exchange waits for every completion,
// so no ACK is left unanswered), and the QP line both sides print counts
// the retransmissions.
func TestImpairPerftest(t *testing.T) {
	for _, test := range []string{"write", "send"} {
		t.Run(test, func(t *testing.T) {
			a, b, tcp := freePort("udp"), freePort("udp"), freePort("tcp")
			common := []string{"--bind", "127.0.0.1", "-p", strconv.Itoa(tcp), "-n", "200", "-s", "1000", "-t", "16", "--timeout", "60s"}
			out, srv, cli := runPair(t, runPerftest,
				append([]string{test, "--udp-port", strconv.Itoa(a), "--peer-udp-port", strconv.Itoa(b), "--impair", "loss=10%,seed=5"}, common...),
				append([]string{test, "--udp-port", strconv.Itoa(b), "--peer-udp-port", strconv.Itoa(a), "--impair", "loss=10%,seed=6", "127.0.0.1"}, common...))
			if srv != 0 || cli != 0 || strings.Count(out, "#bytes") != 2 {
				t.Fatalf("exit %d and %d:\n%s", srv, cli, out)
			}
			checkImpaired(t, "perftest", out, 2)
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

// serve --impair loss=5%: two daemons on 127.0.0.1, and the
// distribution's ibv_rc_pingpong between them through softroce run; the
// server's daemon impairs its sends (only it, and one-packet messages,
// for the reasons TestImpairPingpong gives). The programs, unmodified,
// complete; the daemons' counters (softroce rdma statistic) show the
// retransmissions that made up for the loss.
func TestImpairServe(t *testing.T) {
	_, lib := abitest.Tool(t, "ibv_rc_pingpong", "ibverbs-utils")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), "SOFTROCE_TEST_AS_MAIN=1", "SOFTROCE_ABI_DIR="+filepath.Dir(lib))
	x, y := freePort("udp"), freePort("udp")
	daemon := func(port, peer int, imp ...string) (sock, log string) {
		dir := t.TempDir()
		sock, log = filepath.Join(dir, "s.sock"), filepath.Join(dir, "log")
		args := []string{"serve", "--addr", "127.0.0.1", "--udp-port", strconv.Itoa(port), "--peer-udp-port", strconv.Itoa(peer), "--socket", sock}
		cmd := exec.Command(self, append(args, imp...)...)
		cmd.Env = env
		f, err := os.Create(log)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		cmd.Stdout, cmd.Stderr = f, f
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Signal(syscall.SIGTERM); cmd.Wait() })
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			if _, err := os.Stat(sock); err == nil {
				return sock, log
			}
			if time.Now().After(deadline) {
				b, _ := os.ReadFile(log)
				t.Fatalf("softroce serve did not listen:\n%s", b)
			}
		}
	}
	s1, log1 := daemon(x, y, "--impair", "loss=5%,seed=11")
	s2, _ := daemon(y, x)
	port := strconv.Itoa(freePort("tcp"))
	pp := func(sock string, args ...string) (*exec.Cmd, *bytes.Buffer) {
		cmd := exec.Command(self, append([]string{"run", "--socket", sock, "--", "ibv_rc_pingpong", "-g", "0", "-p", port, "-s", "1000", "-n", "300"}, args...)...)
		cmd.Env = env
		out := new(bytes.Buffer)
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd, out
	}
	srv, srvOut := pp(s1)
	for deadline := time.Now().Add(time.Minute); !listening(port); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			srv.Process.Kill()
			srv.Wait()
			t.Fatalf("ibv_rc_pingpong server did not listen:\n%s", srvOut)
		}
	}
	cli, cliOut := pp(s2, "127.0.0.1")
	done := make(chan struct{})
	go func() {
		select {
		case <-done:
		case <-time.After(2 * time.Minute):
			srv.Process.Kill()
			cli.Process.Kill()
		}
	}()
	srvErr, cliErr := srv.Wait(), cli.Wait()
	close(done)
	if srvErr != nil || cliErr != nil || !strings.Contains(srvOut.String(), "300 iters in") || !strings.Contains(cliOut.String(), "300 iters in") {
		t.Fatalf("ibv_rc_pingpong: server %v, client %v:\n%s\n%s", srvErr, cliErr, srvOut, cliOut)
	}
	// The link's counters sum its QPs', destroyed ones included. Each
	// daemon resends what was lost: the impaired one its own requests,
	// the other the requests whose ACKs were lost.
	var total uint64
	for _, sock := range []string{s1, s2} {
		var code int
		out, errOut := runOut(t, func() { code = run([]string{"rdma", "--socket", sock, "-j", "statistic"}) })
		var st []map[string]any
		if err := json.Unmarshal([]byte(out), &st); code != 0 || err != nil || len(st) != 1 {
			t.Fatalf("softroce rdma -j statistic: exit %d, %v: %s%s", code, err, out, errOut)
		}
		n, _ := st[0]["retransmitted_pkts"].(float64)
		t.Logf("%s: %d retransmitted, %v local ACK timeouts, %v sequence NAKs received", sock, uint64(n), st[0]["local_ack_timeout_err"], st[0]["packet_seq_err"])
		if n == 0 {
			t.Errorf("%s: no retransmissions counted", sock)
		}
		total += uint64(n)
	}
	if b, _ := os.ReadFile(log1); !strings.Contains(string(b), "(udp, sends impaired: loss=5%") {
		t.Errorf("the daemon does not say its sends are impaired:\n%s", b)
	}
	t.Logf("serve --impair loss=5%% (server side), ibv_rc_pingpong -n 300: %d retransmissions on the two daemons", total)
}
