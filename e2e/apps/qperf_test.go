package apps

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// qperfFigure matches a figure line of qperf's output: "    bw  =  203 MB/sec".
var qperfFigure = regexp.MustCompile(`(?m)^\s+(\w+)\s+=\s+([0-9.]+) (\S+)$`)

// qperfRC are qperf's RC tests, which RoCE runs with -cm1.
var qperfRC = []string{"rc_bw", "rc_lat", "rc_rdma_write_bw", "rc_rdma_write_lat", "rc_rdma_read_bw", "rc_rdma_read_lat",
	"rc_compare_swap_mr", "rc_fetch_add_mr"}

// qperfCheck fails the test unless out is test's one positive figure in
// its unit, and logs the figure (tagged with who ran what where).
func qperfCheck(t *testing.T, tag, test, out string, err error) {
	t.Helper()
	m := qperfFigure.FindAllStringSubmatch(out, -1)
	if err != nil || len(m) != 1 || !strings.HasPrefix(out, test+":\n") {
		t.Errorf("%sqperf -cm1 %s: %v, want one figure:\n%s", tag, test, err, out)
		return
	}
	v, _ := strconv.ParseFloat(m[0][2], 64)
	// qperf scales its units: bytes/sec, KB/sec, MB/sec, GB/sec; ns, us,
	// ms, sec; /sec, K/sec, M/sec (a loaded host's atomics can fall below
	// 1000 a second).
	units := map[string][]string{"bw": {"bytes/sec", "KB/sec", "MB/sec", "GB/sec"}, "latency": {"ns", "us", "ms", "sec"},
		"msg_rate": {"/sec", "K/sec", "M/sec", "G/sec"}}
	if u := units[m[0][1]]; u == nil || v <= 0 || !slices.Contains(u, m[0][3]) {
		t.Errorf("%sqperf -cm1 %s: figure %q, want a positive %s in one of %q", tag, test, m[0][0], m[0][1], u)
	}
	t.Logf("%sqperf -cm1 %s: %s = %s %s", tag, test, m[0][1], m[0][2], m[0][3])
}

// qperfListenRace is what qperf 0.4.11's client prints when its REQ
// reached the server before the server's rdma_listen: that version's
// server sends its rdma_cm port over TCP before it listens (fixed upstream
// after 0.4.11, "Fix rdmacm race"), and a CM with nobody listening on the
// port rejects the REQ (REJ 8, invalid service ID), the kernel's as
// softroce's.
const qperfListenRace = "unexpected event from RDMA CM: Event rejected"

// qperfRetryRace runs a qperf client until its run is not lost to that
// race, three tries at most; a failure of another kind returns at once.
func qperfRetryRace(t *testing.T, run func() (string, error)) (string, error) {
	t.Helper()
	for try := 1; ; try++ {
		out, err := run()
		if err == nil || !strings.Contains(out, qperfListenRace) || try == 3 {
			return out, err
		}
		t.Logf("qperf's REQ came before its server listened (qperf 0.4.11's own race); again:\n%s", out)
	}
}

// qperf: the server on host A, the client on host B, one test a run
// (-t 1: a second each). RC tests with -cm1 exchange addresses by
// rdma_cm and must print their figure. Without -cm1 qperf (0.4.11)
// addresses the peer by LID alone (ah_attr.is_global 0): the kernel's
// core refuses such an address on every RoCE device (rxe's included)
// before the driver sees it, with EINVAL at ibv_modify_qp to RTR and at
// ibv_create_ah; softroce refuses it the same way, and its daemon log
// says why. UC and UD tests ignore -cm1 (qperf uses rdma_cm for RC only),
// so they never run on RoCE.
func TestQperf(t *testing.T) {
	Need(t, "qperf", "qperf")
	hs := NewTwoHosts(t)
	port := hs.A.FreeTCPPort(t)
	srv := hs.A.Start(t, nil, "qperf", "--listen_port", strconv.Itoa(port))
	srv.WaitListen(t, port, time.Minute)
	client := func(t *testing.T, args ...string) (string, error) {
		return hs.B.Run(t, time.Minute, nil, "qperf", append([]string{hs.A.Addr().String(), "--listen_port", strconv.Itoa(port), "-t", "1"}, args...)...)
	}
	rc := qperfRC
	t.Run("cm1", func(t *testing.T) {
		for _, test := range rc {
			out, err := qperfRetryRace(t, func() (string, error) { return client(t, "-cm1", test) })
			qperfCheck(t, "", test, out, err)
		}
	})
	// Without an address exchange: refused as the kernel refuses it.
	t.Run("lid-only", func(t *testing.T) {
		for _, c := range []struct {
			tests  []string
			cm1    bool
			errmsg string
		}{
			{rc, false, "failed to modify QP to RTR"},
			{[]string{"uc_bw", "uc_lat", "uc_rdma_write_bw", "uc_rdma_write_lat"}, false, "failed to modify QP to RTR"},
			{[]string{"uc_bw", "uc_lat", "uc_rdma_write_bw", "uc_rdma_write_lat"}, true, "failed to modify QP to RTR"},
			{[]string{"ud_bw", "ud_lat"}, false, "failed to create address handle: Invalid argument"},
			{[]string{"ud_bw", "ud_lat"}, true, "failed to create address handle: Invalid argument"},
		} {
			for _, test := range c.tests {
				args := []string{test}
				if c.cm1 {
					args = []string{"-cm1", test}
				}
				out, err := client(t, args...)
				// Both sides fail: the client prints its own error or,
				// when the server's comes first, "server: ...".
				if err == nil || !strings.Contains(out, c.errmsg) && !strings.Contains(out, "server: ") || qperfFigure.MatchString(out) {
					t.Errorf("qperf %s: %v, want it to fail with %q:\n%s", strings.Join(args, " "), err, c.errmsg, out)
				}
				if c.cm1 && !strings.Contains(out, "-cm1 set but not used") {
					t.Errorf("qperf -cm1 %s used rdma_cm:\n%s", test, out)
				}
			}
		}
		for _, h := range []*Host{hs.A, hs.B} {
			if l := h.DaemonLog(); !strings.Contains(l, "RoCE needs a GRH (is_global)") {
				t.Errorf("host %s: the daemon does not say why it refused the addresses:\n%s", h.Name, l)
			}
		}
	})
	if srv.Exited() {
		t.Errorf("the qperf server ended:\n%s", srv.Output())
	}
}

// TestQperfAgainstRxe runs qperf's RC tests between softroce and kernel
// rxe, in both roles, and shows that rxe refuses a LID-only address as
// softroce does (TestQperf).
func TestQperfAgainstRxe(t *testing.T) {
	Need(t, "qperf", "qperf")
	r := NewRxePeer(t)
	t.Run("rxe-server", func(t *testing.T) {
		port := r.Soft.FreeTCPPort(t) // free on the host side; the guest's is its own
		srv := r.GuestStart(t, "qperf --listen_port "+strconv.Itoa(port))
		if err := r.VM.WaitListening(context.Background(), port); err != nil {
			t.Fatalf("guest qperf server: %v", err)
		}
		for _, test := range qperfRC {
			out, err := qperfRetryRace(t, func() (string, error) {
				return r.Soft.Run(t, time.Minute, nil, "qperf", r.GuestAddr().String(), "--listen_port", strconv.Itoa(port), "-t", "1", "-cm1", test)
			})
			qperfCheck(t, "softroce client, rxe server: ", test, out, err)
		}
		out, err := r.Soft.Run(t, time.Minute, nil, "qperf", r.GuestAddr().String(), "--listen_port", strconv.Itoa(port), "-t", "1", "rc_bw")
		if err == nil || qperfFigure.MatchString(out) {
			t.Errorf("qperf rc_bw without -cm1 against rxe: %v, want a refusal:\n%s", err, out)
		}
		select {
		case <-srv.Done():
			t.Errorf("the guest's qperf server ended")
		default:
		}
	})
	t.Run("softroce-server", func(t *testing.T) {
		port := r.Soft.FreeTCPPort(t)
		srv := r.Soft.Start(t, nil, "qperf", "--listen_port", strconv.Itoa(port))
		srv.WaitListen(t, port, time.Minute)
		for _, test := range qperfRC {
			out, err := qperfRetryRace(t, func() (string, error) {
				return r.GuestRun(t, 2*time.Minute, fmt.Sprintf("qperf %s --listen_port %d -t 1 -cm1 %s", r.Soft.Addr(), port, test))
			})
			qperfCheck(t, "rxe client, softroce server: ", test, out, err)
		}
		// The kernel refuses the LID-only address itself.
		out, err := r.GuestRun(t, 2*time.Minute, fmt.Sprintf("qperf %s --listen_port %d -t 1 rc_bw", r.Soft.Addr(), port))
		if err == nil || !strings.Contains(out, "failed to modify QP to RTR") && !strings.Contains(out, "server: ") {
			t.Errorf("rxe's qperf rc_bw without -cm1: %v, want it refused:\n%s", err, out)
		}
		if srv.Exited() {
			t.Errorf("the qperf server ended:\n%s", srv.Output())
		}
	})
}
