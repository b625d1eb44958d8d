package interop

import (
	"fmt"
	"testing"

	"github.com/softroce/softroce/conformance/pingpong"
)

// TestSRQPingpongAgainstRxe runs ibv_srq_pingpong on the rxe guest
// against softroce pingpong --type srq on the host, both roles: -q RC QPs
// on one SRQ each side, the 256-message exchange, several sizes, MTUs and
// QP counts, and both tools' defaults (16 QPs, 4096 bytes, 1000
// iterations, 500 receives) with no flags at all.
func TestSRQPingpongAgainstRxe(t *testing.T) {
	needVM(t)
	cases := []struct{ size, mtu, nqp, iters, rx int }{
		{4096, 1024, 16, 160, 100},
		{1, 256, 3, 60, 20},
		{20000, 4096, 2, 40, 20},
		{}, // the defaults
	}
	for _, role := range []string{"softroce-client", "softroce-server"} {
		for _, tc := range cases {
			name := fmt.Sprintf("%s/size%d/mtu%d/qp%d", role, tc.size, tc.mtu, tc.nqp)
			if tc.size == 0 {
				name = role + "/defaults"
			}
			t.Run(name, func(t *testing.T) {
				cfg := pingpong.Config{Type: pingpong.SRQ, Size: tc.size, MTU: tc.mtu, NumQP: tc.nqp, Iters: tc.iters, RxDepth: tc.rx}
				flags := fmt.Sprintf("-s %d -m %d -q %d -n %d -r %d", tc.size, tc.mtu, tc.nqp, tc.iters, tc.rx)
				if tc.size == 0 {
					flags = ""
				}
				pingpongAgainstRxe(t, role == "softroce-client", cfg, flags)
			})
		}
	}
}
