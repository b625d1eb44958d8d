package interop

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/softroce/softroce/conformance/perftest"
	"github.com/softroce/softroce/conformance/rxevm"
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
				var out bytes.Buffer
				var res *perftest.Result
				var gout string
				if role == "softroce-client" {
					proc, err := vm.Start(ctx, gcmd)
					if err != nil {
						t.Fatal(err)
					}
					defer proc.Kill()
					if err := vm.WaitListening(ctx, port); err != nil {
						t.Fatalf("%s did not listen: %v", tc.test.Tool(), err)
					}
					cfg.Server = vm.GuestAddr().String()
					res, err = perftest.Run(ctx, dev, cfg, &out)
					if err != nil {
						proc.Kill()
						gout, gerr := proc.Output()
						t.Fatalf("softroce client: %v\n%s\nguest:\n%s\n%s", err, &out, gout, gerr)
					}
					if gout, err = proc.Wait(ctx); err != nil {
						t.Fatalf("%s -c UC server: %v\n%s", tc.test.Tool(), err, gout)
					}
				} else {
					ln, err := vm.Listen("tcp4", fmt.Sprintf(":%d", port))
					if err != nil {
						t.Fatal(err)
					}
					defer ln.Close()
					cfg.Listen = func(string, string) (net.Listener, error) { return ln, nil }
					type result struct {
						res *perftest.Result
						err error
					}
					done := make(chan result, 1)
					go func() {
						r, err := perftest.Run(ctx, dev, cfg, &out)
						done <- result{r, err}
					}()
					var gerr error
					gout, gerr = vm.Run(ctx, gcmd+" "+vm.HostAddr().String())
					r := <-done
					if r.err != nil || gerr != nil {
						t.Fatalf("softroce server: %v\n%s\n%s -c UC client: %v\n%s", r.err, &out, tc.test.Tool(), gerr, gout)
					}
					res = r.res
				}
				rows, err := rxevm.ParseBW(gout)
				if err != nil {
					t.Fatalf("%s output has no result row: %v\n%s", tc.test.Tool(), err, gout)
				}
				row := rows[len(rows)-1]
				if row.Bytes != tc.size || row.Iterations != tc.iters*qps {
					t.Fatalf("%s reported %+v, want %d bytes x %d iterations\n%s", tc.test.Tool(), row, tc.size, tc.iters*qps, gout)
				}
				if res.MTU != tc.mtu || res.Report.Iters != uint64(tc.iters*qps) || len(res.LocalQPs) != qps {
					t.Fatalf("softroce: MTU %d, report %+v", res.MTU, res.Report)
				}
				if role == "softroce-server" && res.Checked == "" {
					t.Fatalf("softroce ran no data check\n%s", &out)
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
