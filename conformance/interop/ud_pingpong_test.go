package interop

import (
	"fmt"
	"testing"

	"github.com/softroce/softroce/conformance/pingpong"
)

// TestUDPingpongAgainstRxe runs ibv_ud_pingpong on the rxe guest against
// softroce pingpong --type ud on the host, both roles: UD QPs with Q_Key
// 0x11111111, address handles from the exchanged GIDs, the 40-byte GRH at
// the head of every receive, sizes up to the port's MTU (rxe's is 4096 on
// the VM's 9000-byte link), and the tools' defaults (1024 bytes, 1000
// iterations, 500 receives).
func TestUDPingpongAgainstRxe(t *testing.T) {
	needVM(t)
	cases := []struct {
		size, iters, rx int
		events          bool // softroce's -e too
	}{
		{1, 100, 50, false},
		{4096, 200, 50, true},
		{1000, 300, 10, false},
		{}, // the defaults
	}
	for _, role := range []string{"softroce-client", "softroce-server"} {
		for _, tc := range cases {
			name := fmt.Sprintf("%s/size%d", role, tc.size)
			flags := fmt.Sprintf("-s %d -n %d -r %d", tc.size, tc.iters, tc.rx)
			if tc.size == 0 {
				name, flags = role+"/defaults", ""
			}
			t.Run(name, func(t *testing.T) {
				cfg := pingpong.Config{Type: pingpong.UD, Size: tc.size, Iters: tc.iters, RxDepth: tc.rx, Events: tc.events}
				pingpongAgainstRxe(t, role == "softroce-client", cfg, flags)
			})
		}
	}
}
