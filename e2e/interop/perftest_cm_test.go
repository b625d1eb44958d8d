package interop

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/softroce/softroce/tools/perftest"
	"github.com/softroce/softroce/verbs"
)

// perftestCMCases are the -R runs: ib_write_bw, ib_read_bw and
// ib_send_bw connected with rdma_cm (the exchange over an rdma_cm QP, the
// test QPs connected by the CM). The -m given is perftest's MTU exchange;
// the QPs take the CM's path MTU (both ports' active MTU).
var perftestCMCases = []perftestCase{
	{perftest.Write, 0, 4096, 1024, 200, 1, false},
	{perftest.Write, 0, 65536, 4096, 50, 1, false},
	{perftest.Read, 0, 4096, 1024, 100, 1, false},
	{perftest.Read, 0, 65536, 4096, 30, 1, false},
	{perftest.Send, 0, 4096, 1024, 200, 1, false},
	{perftest.Send, 0, 65536, 4096, 50, 1, false},
	{perftest.Write, 0, 8192, 4096, 50, 2, false},
	{perftest.Atomic, perftest.FetchAndAdd, 8, 1024, 200, 1, false},
}

// perftestUDCases are the ib_send_bw -c UD runs; size 0 gives no -s to
// either side, so both adopt the MTU.
var perftestUDCases = []perftestCase{
	{perftest.Send, 0, 1024, 1024, 200, 1, false},
	{perftest.Send, 0, 4096, 4096, 100, 1, false},
	{perftest.Send, 0, 100, 1024, 300, 1, false},
	{perftest.Send, 0, 2000, 2048, 100, 2, false},
	{perftest.Send, 0, 0, 2048, 100, 1, false},
}

// TestPerftestRDMACMAgainstRxe runs ib_write_bw -R, ib_read_bw -R,
// ib_send_bw -R and ib_atomic_bw -R on the rxe guest against softroce with RDMACM, softroce
// as the client and as the server. Both ends must finish, perftest must
// print its result row, softroce's data checks must pass.
func TestPerftestRDMACMAgainstRxe(t *testing.T) {
	needVM(t)
	runPerftestXCases(t, perftestCMCases, 19100, " -R", func(c *perftest.Config) { c.RDMACM = true })
}

// TestPerftestUDAgainstRxe runs ib_send_bw -c UD on the rxe guest against
// softroce with -c UD, in both roles: UD QPs with perftest's Q_Key,
// address handles from the exchanged GIDs, receives with the GRH's room,
// every datagram delivered (the receiver reports losses otherwise).
func TestPerftestUDAgainstRxe(t *testing.T) {
	needVM(t)
	runPerftestXCases(t, perftestUDCases, 19200, " -c UD", func(c *perftest.Config) { c.Conn = verbs.QPTypeUD })
}

// TestPerftestRDMACMUDAgainstRxe runs ib_send_bw -R -c UD, where the
// test's UD QPs are resolved by SIDR (RDMA_PS_UDP) and take rdma_cm's
// Q_Key, in both roles.
func TestPerftestRDMACMUDAgainstRxe(t *testing.T) {
	needVM(t)
	runPerftestXCases(t, perftestUDCases, 19300, " -R -c UD", func(c *perftest.Config) { c.RDMACM, c.Conn = true, verbs.QPTypeUD })
}

func runPerftestXCases(t *testing.T, cases []perftestCase, port int, flag string, set func(*perftest.Config)) {
	for _, role := range []string{"softroce-client", "softroce-server"} {
		for _, tc := range cases {
			port++
			t.Run(role+"/"+tc.String(), func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
				defer cancel()
				dev := perftestDevice(t)
				qps := max(tc.qps, 1)
				cfg := perftest.Config{Test: tc.test, Atomic: tc.atomic, Port: port, Size: tc.size, MTU: tc.mtu, Iters: tc.iters, QPs: qps,
					Timeout: 120 * time.Second, Dial: vm.DialContext, Listen: vm.Listen}
				set(&cfg)
				gcmd := strings.Replace(tc.guestCommand(port), " -s 0", "", 1) + flag
				res, out, gout, row := perftestPair(t, ctx, cancel, dev, cfg, role, gcmd, flag, false)
				size := tc.size
				if size == 0 {
					size = tc.mtu
				}
				if row.Bytes != size || row.Iterations != tc.iters*qps {
					t.Fatalf("%s reported %+v, want %d bytes x %d iterations\n%s", tc.test.Tool(), row, size, tc.iters*qps, gout)
				}
				if res.Report.Iters != uint64(tc.iters*qps) || res.Report.Size != uint64(size) || len(res.LocalQPs) != qps || res.Lost != 0 {
					t.Fatalf("softroce: report %+v, lost %d\n%s", res.Report, res.Lost, out)
				}
				if cfg.RDMACM && !strings.Contains(gout, "Data ex. method : rdma_cm") {
					t.Fatalf("%s did not use rdma_cm:\n%s", tc.test.Tool(), gout)
				}
				if cfg.RDMACM && cfg.Conn == verbs.QPTypeRC && res.MTU != 4096 {
					// The CM's path MTU: rxe on the guest's 9000-byte link
					// and softroce on the tap both have 4096.
					t.Fatalf("softroce: path MTU %d, want the CM's 4096", res.MTU)
				}
				if (!cfg.RDMACM || cfg.Conn == verbs.QPTypeUD) && res.MTU != tc.mtu {
					t.Fatalf("softroce: MTU %d, want %d", res.MTU, tc.mtu)
				}
				if (role == "softroce-server" || tc.test == perftest.Read || tc.test == perftest.Atomic) && res.Checked == "" {
					t.Fatalf("softroce ran no data check\n%s", out)
				}
				if cfg.Conn == verbs.QPTypeUD && (res.Stats.Retransmits != 0 || role == "softroce-server" && res.Stats.TxPackets != 0) {
					t.Fatalf("UD packets answered or resent: %+v", res.Stats)
				}
				t.Logf("perftest: %d x %d B, %.2f %s; softroce: %.2f MB/s, check %q; stats %+v",
					row.Iterations, row.Bytes, row.AvgBW, row.Unit, res.Report.AvgBW, res.Checked, res.Stats)
			})
		}
	}
}
