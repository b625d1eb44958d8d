package interop

import (
	"fmt"
	"testing"

	"github.com/softroce/softroce/tools/pingpong"
)

// TestUCPingpongAgainstRxe runs ibv_uc_pingpong on the rxe guest against
// softroce pingpong --type uc on the host, both roles: one UC QP each
// side (no ACKs; multi-packet messages checked only by PSN order),
// several sizes and MTUs, and the tools' defaults (4096 bytes, MTU 1024,
// 1000 iterations, 500 receives).
func TestUCPingpongAgainstRxe(t *testing.T) {
	needVM(t)
	cases := []struct {
		size, mtu, iters int
		events           bool // softroce's -e too
	}{
		{1, 256, 100, false},
		{4096, 1024, 200, true},
		{65536, 4096, 50, false},
		{3000, 2048, 100, false},
		{}, // the defaults
	}
	for _, role := range []string{"softroce-client", "softroce-server"} {
		for _, tc := range cases {
			name := fmt.Sprintf("%s/size%d/mtu%d", role, tc.size, tc.mtu)
			flags := fmt.Sprintf("-s %d -m %d -n %d -r 50", tc.size, tc.mtu, tc.iters)
			rx := 50
			if tc.size == 0 {
				name, flags, rx = role+"/defaults", "", 0
			}
			t.Run(name, func(t *testing.T) {
				cfg := pingpong.Config{Type: pingpong.UC, Size: tc.size, MTU: tc.mtu, Iters: tc.iters, RxDepth: rx, Events: tc.events}
				pingpongAgainstRxe(t, role == "softroce-client", cfg, flags)
			})
		}
	}
}
