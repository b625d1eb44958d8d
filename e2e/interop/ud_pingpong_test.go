package interop

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"

	"github.com/softroce/softroce/tools/pingpong"
	"github.com/softroce/softroce/transport/ud"
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
				res := pingpongAgainstRxe(t, role == "softroce-client", cfg, flags)
				// The GRH of rxe's last datagram, as softroce wrote it:
				// rxe's IPv4 header, guest to host, UDP length 8 + BTH,
				// DETH, payload padded to 4 bytes and ICRC.
				size := cfg.Size
				if size == 0 {
					size = 1024
				}
				src, err := ud.SourceOfGRH(res.GRH[:])
				g := res.GRH[20:]
				if err != nil || src != vm.GuestAddr() || netip.AddrFrom4([4]byte(g[16:20])) != vm.HostAddr() ||
					g[9] != 17 || int(binary.BigEndian.Uint16(g[2:4])) != 20+8+12+8+(size+3)&^3+4 {
					t.Fatalf("GRH % x (source %v, %v)", res.GRH, src, err)
				}
			})
		}
	}
}
