package interop

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/softroce/softroce/conformance/rcpingpong"
	"github.com/softroce/softroce/nic/udp"
	"github.com/softroce/softroce/verbs"
)

// hostDevice opens a softroce device on the host end of the VM's tap, over
// the kernel UDP backend (the socket is created inside the VM's namespace).
func hostDevice(t *testing.T) *verbs.Device {
	t.Helper()
	var link *udp.Link
	err := vm.Do(func() error {
		var err error
		link, err = udp.Open(udp.Config{Addr: vm.HostAddr()})
		return err
	})
	if err != nil {
		t.Fatalf("open UDP link in the VM namespace: %v", err)
	}
	dev, err := verbs.Open(link, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	return dev
}

// TestPingpongAgainstRxe runs ibv_rc_pingpong on the rxe guest against
// softroce pingpong on the host, both roles, several sizes and MTUs.
func TestPingpongAgainstRxe(t *testing.T) {
	needVM(t)
	cases := []struct{ size, mtu int }{{1, 256}, {4096, 1024}, {65536, 1024}, {65536, 4096}, {3000, 2048}}
	for _, role := range []string{"softroce-client", "softroce-server"} {
		for _, tc := range cases {
			t.Run(fmt.Sprintf("%s/size%d/mtu%d", role, tc.size, tc.mtu), func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
				defer cancel()
				dev := hostDevice(t)
				iters := 50
				cfg := rcpingpong.Config{Size: tc.size, MTU: tc.mtu, Iters: iters, RxDepth: 50, Timeout: 80 * time.Second,
					Dial: vm.DialContext, Listen: vm.Listen}
				// -g 1: rxe's IPv4-mapped GID; -e: event mode, so the guest
				// does not burn its only emulated CPU spinning.
				guestCmd := fmt.Sprintf("timeout 80 ibv_rc_pingpong -d rxe0 -g 1 -e -s %d -m %d -n %d -r 50", tc.size, tc.mtu, iters)
				if role == "softroce-client" {
					proc, err := vm.Start(ctx, guestCmd)
					if err != nil {
						t.Fatal(err)
					}
					defer proc.Kill()
					if err := vm.WaitListening(ctx, 18515); err != nil {
						t.Fatalf("ibv_rc_pingpong did not listen: %v", err)
					}
					cfg.Server = vm.GuestAddr().String()
					var out bytes.Buffer
					if _, err := rcpingpong.Run(ctx, dev, cfg, &out); err != nil {
						gout, _ := proc.Wait(ctx)
						t.Fatalf("softroce client: %v\n%s\nguest:\n%s", err, &out, gout)
					}
					gout, err := proc.Wait(ctx)
					if err != nil || !strings.Contains(gout, "iters in") {
						t.Fatalf("ibv_rc_pingpong server: %v\n%s", err, gout)
					}
					t.Logf("guest: %s", lastLines(gout, 2))
					return
				}
				// softroce listens; ibv_rc_pingpong connects from the guest.
				errc := make(chan error, 1)
				var out bytes.Buffer
				go func() {
					_, err := rcpingpong.Run(ctx, dev, cfg, &out)
					errc <- err
				}()
				time.Sleep(200 * time.Millisecond)
				gout, gerr := vm.Run(ctx, guestCmd+" "+vm.HostAddr().String())
				if err := <-errc; err != nil || gerr != nil || !strings.Contains(gout, "iters in") {
					t.Fatalf("softroce server: %v\n%s\nibv_rc_pingpong client: %v\n%s", err, &out, gerr, gout)
				}
				t.Logf("guest: %s", lastLines(gout, 2))
			})
		}
	}
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, " | ")
}
