package interop

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/softroce/softroce/tools/pingpong"
)

// TestSRQPingpongAgainstRxe runs ibv_srq_pingpong on the rxe guest
// against softroce pingpong --type srq on the host, both roles: -q RC QPs
// on one SRQ each side, the 256-message exchange, several sizes, MTUs and
// QP counts, and both tools' defaults (16 QPs, 4096 bytes, 1000
// iterations, 500 receives) with no flags at all.
func TestSRQPingpongAgainstRxe(t *testing.T) {
	needVM(t)
	cases := []struct {
		size, mtu, nqp, iters, rx int
		events                    bool // softroce's -e too
	}{
		{4096, 1024, 16, 160, 100, false},
		{1, 256, 3, 60, 20, true},
		{20000, 4096, 2, 40, 20, false},
		{}, // the defaults
	}
	for _, role := range []string{"softroce-client", "softroce-server"} {
		for _, tc := range cases {
			name := fmt.Sprintf("%s/size%d/mtu%d/qp%d", role, tc.size, tc.mtu, tc.nqp)
			if tc.size == 0 {
				name = role + "/defaults"
			}
			t.Run(name, func(t *testing.T) {
				cfg := pingpong.Config{Type: pingpong.SRQ, Size: tc.size, MTU: tc.mtu, NumQP: tc.nqp, Iters: tc.iters, RxDepth: tc.rx, Events: tc.events}
				flags := fmt.Sprintf("-s %d -m %d -q %d -n %d -r %d", tc.size, tc.mtu, tc.nqp, tc.iters, tc.rx)
				if tc.size == 0 {
					flags = ""
				}
				pingpongAgainstRxe(t, role == "softroce-client", cfg, flags)
			})
		}
	}
}

// TestSRQPingpongMismatchedQPs: ibv_srq_pingpong with another -q than
// softroce's is refused by softroce in either role with advice to use the
// same -q, not paired with QPN 0.
func TestSRQPingpongMismatchedQPs(t *testing.T) {
	needVM(t)
	for _, role := range []string{"softroce-client", "softroce-server"} {
		t.Run(role, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			dev := hostDevice(t)
			cfg := pingpong.Config{Type: pingpong.SRQ, NumQP: 4, RxDepth: 20, Iters: 20, Timeout: 50 * time.Second,
				Dial: vm.DialContext, Listen: vm.Listen}
			guestCmd := "timeout 50 ibv_srq_pingpong -d rxe0 -g 1 -e -q 3 -r 20 -n 20"
			var out bytes.Buffer
			var err error
			if role == "softroce-client" {
				proc, perr := vm.Start(ctx, guestCmd)
				if perr != nil {
					t.Fatal(perr)
				}
				defer proc.Kill()
				if err := vm.WaitListening(ctx, 18515); err != nil {
					t.Fatalf("ibv_srq_pingpong did not listen: %v", err)
				}
				cfg.Server = vm.GuestAddr().String()
				_, err = pingpong.Run(ctx, dev, cfg, &out)
				proc.Wait(ctx)
			} else {
				errc := make(chan error, 1)
				go func() {
					_, err := pingpong.Run(ctx, dev, cfg, &out)
					errc <- err
				}()
				time.Sleep(200 * time.Millisecond)
				// ibv_srq_pingpong's client loops on a closed connection
				// (read returning 0), so it is cut short here.
				vm.Run(ctx, strings.Replace(guestCmd, "timeout 50", "timeout 5", 1)+" "+vm.HostAddr().String())
				err = <-errc
			}
			if err == nil || !strings.Contains(err.Error(), "the peer announced 3 QPs and this side has 4: give both sides the same -q") {
				t.Fatalf("softroce: %v\n%s", err, &out)
			}
			t.Logf("softroce: %v", err)
		})
	}
}
