package main

import (
	"strconv"
	"strings"
	"testing"
)

// TestPerftestCommandUC runs `softroce perftest write|send -c UC` as
// server and client over 127.0.0.1: both finish, and the passive side's
// data check passes.
func TestPerftestCommandUC(t *testing.T) {
	for i, test := range []string{"write", "send"} {
		t.Run(test, func(t *testing.T) {
			port := 48030 + 3*i
			// 50 x 3000 B: 150 packets (165 KB), less than the receive
			// socket holds even where net.core.rmem_max is Linux's
			// default 208 KiB. UC has no retransmission, so a burst that
			// overflowed it while the receiver was descheduled would fail
			// the data check.
			common := []string{"-c", "UC", "--bind", "127.0.0.1", "-p", strconv.Itoa(port + 2), "-n", "50", "-s", "3000", "-m", "1024", "--timeout", "20s"}
			out, srv, cli := runPair(t, runPerftest,
				append([]string{test, "--udp-port", strconv.Itoa(port), "--peer-udp-port", strconv.Itoa(port + 1)}, common...),
				append([]string{test, "--udp-port", strconv.Itoa(port + 1), "--peer-udp-port", strconv.Itoa(port), "127.0.0.1"}, common...))
			if srv != 0 || cli != 0 || strings.Count(out, "#bytes") != 2 || !strings.Contains(out, "data check:") {
				t.Fatalf("exit codes: server %d, client %d\n%s", srv, cli, out)
			}
			// UC: nothing is acknowledged, so the receiver sends nothing
			// and the sender receives nothing.
			if !strings.Contains(out, " 0 received, 0 retransmitted") || !strings.Contains(out, "softroce QP: 0 packets sent") {
				t.Fatalf("a UC side received or retransmitted packets:\n%s", out)
			}
			// The drop counters: none on either side, and the link saw
			// the 150 packets arrive at the receiver.
			if strings.Count(out, "softroce drops: QP 0 duplicate requests, 0 out of sequence, 0 dropped") != 2 ||
				!strings.Contains(out, "link 150 received, 0 sent, 0 ICRC bad, 0 malformed, 0 truncated, 0 send errors") {
				t.Fatalf("drop counters missing or moved:\n%s", out)
			}
		})
	}
}
