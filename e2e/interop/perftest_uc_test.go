package interop

import (
	"context"
	"testing"
	"time"

	"github.com/softroce/softroce/tools/perftest"
	"github.com/softroce/softroce/verbs"
)

// perftestUCCases are the UC runs: ib_write_bw and ib_send_bw -c UC.
var perftestUCCases = []perftestCase{
	{perftest.Write, 0, 4096, 1024, 200, 1, false},
	{perftest.Write, 0, 65536, 4096, 100, 1, false},
	{perftest.Write, 0, 2048, 1024, 100, 2, false},
	{perftest.Send, 0, 4096, 1024, 200, 1, false},
	{perftest.Send, 0, 65536, 4096, 50, 1, false},
	{perftest.Send, 0, 1000, 1024, 300, 2, false},
}

// TestPerftestUCAgainstRxe runs ib_write_bw -c UC and ib_send_bw -c UC on
// the rxe guest against `softroce perftest -c UC`'s engine, softroce as
// the active client and as the passive server. Both ends must finish,
// perftest must print its result row, softroce's passive data checks
// must pass, and no side may have answered a UC packet.
func TestPerftestUCAgainstRxe(t *testing.T) {
	needVM(t)
	port := 18800
	for _, role := range []string{"softroce-client", "softroce-server"} {
		for _, tc := range perftestUCCases {
			port++
			t.Run(role+"/"+tc.String(), func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
				defer cancel()
				dev := perftestDevice(t)
				qps := max(tc.qps, 1)
				cfg := perftest.Config{Test: tc.test, Conn: verbs.QPTypeUC, Port: port, Size: tc.size, MTU: tc.mtu,
					Iters: tc.iters, QPs: qps, Timeout: 120 * time.Second, Dial: vm.DialContext, Listen: vm.Listen}
				gcmd := tc.guestCommand(port) + " -c UC"
				res, out, gout, row := perftestPair(t, ctx, cancel, dev, cfg, role, gcmd, " -c UC", true)
				if row.Bytes != tc.size || row.Iterations != tc.iters*qps {
					t.Fatalf("%s reported %+v, want %d bytes x %d iterations\n%s", tc.test.Tool(), row, tc.size, tc.iters*qps, gout)
				}
				if res.MTU != tc.mtu || res.Report.Iters != uint64(tc.iters*qps) || len(res.LocalQPs) != qps {
					t.Fatalf("softroce: MTU %d, report %+v", res.MTU, res.Report)
				}
				if role == "softroce-server" && res.Checked == "" {
					t.Fatalf("softroce ran no data check\n%s", out)
				}
				// A UC requester receives nothing; a UC responder sends nothing.
				if st := res.Stats; role == "softroce-client" && st.RxPackets != 0 || role == "softroce-server" && st.TxPackets != 0 || st.Retransmits != 0 {
					t.Fatalf("UC packets answered: %+v", st)
				}
				t.Logf("perftest: %.2f %s; softroce check: %q; stats %+v", row.AvgBW, row.Unit, res.Checked, res.Stats)
			})
		}
	}
}
