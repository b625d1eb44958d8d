package interop

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/softroce/softroce/nic/udp"
	"github.com/softroce/softroce/tools/pingpong"
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
// softroce pingpong on the host, both roles, several sizes and MTUs and
// the defaults.
func TestPingpongAgainstRxe(t *testing.T) {
	needVM(t)
	cases := []struct{ size, mtu int }{{1, 256}, {4096, 1024}, {65536, 1024}, {65536, 4096}, {3000, 2048}}
	for _, role := range []string{"softroce-client", "softroce-server"} {
		for _, tc := range cases {
			t.Run(fmt.Sprintf("%s/size%d/mtu%d", role, tc.size, tc.mtu), func(t *testing.T) {
				// softroce sleeps on its completion channel (-e) in one case.
				cfg := pingpong.Config{Type: pingpong.RC, Size: tc.size, MTU: tc.mtu, Iters: 50, RxDepth: 50, Events: tc.size == 3000}
				pingpongAgainstRxe(t, role == "softroce-client", cfg, fmt.Sprintf("-s %d -m %d -n 50 -r 50", tc.size, tc.mtu))
			})
		}
		// Both sides' defaults: 4096 bytes, MTU 1024, 1000 iterations, 500
		// receives.
		t.Run(role+"/defaults", func(t *testing.T) {
			pingpongAgainstRxe(t, role == "softroce-client", pingpong.Config{Type: pingpong.RC}, "")
		})
	}
}

// pingpongAgainstRxe runs cfg.Type's tool in the guest (with flags, plus
// -d rxe0 -g 1 -e) against softroce's pingpong with cfg on the host;
// softroce is the client when client is set. Both sides must finish and
// print their result lines, which the test log shows; softroce's result
// is returned.
func pingpongAgainstRxe(t *testing.T, client bool, cfg pingpong.Config, flags string) *pingpong.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Second)
	defer cancel()
	dev := hostDevice(t)
	if cfg.Timeout == 0 {
		cfg.Timeout = 90 * time.Second
	}
	cfg.Dial, cfg.Listen = vm.DialContext, vm.Listen
	// -g 1: rxe's IPv4-mapped GID; -e: event mode, so the guest does not
	// burn its only emulated CPU spinning.
	guestCmd := fmt.Sprintf("timeout 90 %s -d rxe0 -g 1 -e %s", cfg.Type.Tool(), flags)
	var out bytes.Buffer
	var res *pingpong.Result
	var gout string
	if client {
		proc, err := vm.Start(ctx, guestCmd)
		if err != nil {
			t.Fatal(err)
		}
		defer proc.Kill()
		if err := vm.WaitListening(ctx, 18515); err != nil {
			t.Fatalf("%s did not listen: %v", cfg.Type.Tool(), err)
		}
		cfg.Server = vm.GuestAddr().String()
		res, err = pingpong.Run(ctx, dev, cfg, &out)
		if err != nil {
			gout, _ := proc.Wait(ctx)
			t.Fatalf("softroce client: %v\n%s\nguest:\n%s", err, &out, gout)
		}
		gout, err = proc.Wait(ctx)
		if err != nil || !strings.Contains(gout, "iters in") {
			t.Fatalf("%s server: %v\n%s\nsoftroce client:\n%s", cfg.Type.Tool(), err, gout, &out)
		}
	} else {
		// softroce listens; the tool connects from the guest.
		errc := make(chan error, 1)
		go func() {
			var err error
			res, err = pingpong.Run(ctx, dev, cfg, &out)
			errc <- err
		}()
		time.Sleep(200 * time.Millisecond)
		var gerr error
		gout, gerr = vm.Run(ctx, guestCmd+" "+vm.HostAddr().String())
		if err := <-errc; err != nil || gerr != nil || !strings.Contains(gout, "iters in") {
			t.Fatalf("softroce server: %v\n%s\n%s client: %v\n%s", err, &out, cfg.Type.Tool(), gerr, gout)
		}
	}
	// The guest printed one remote address line per QP, naming ours.
	for _, d := range res.Local {
		if want := fmt.Sprintf("remote address: LID 0x0000, QPN 0x%06x, PSN 0x%06x, GID ::ffff:%v", d.QPN, d.PSN, vm.HostAddr()); !strings.Contains(gout, want) {
			t.Fatalf("the guest's output lacks %q:\n%s", want, gout)
		}
	}
	t.Logf("softroce: %s", lastLines(out.String(), 2))
	t.Logf("guest:    %s", lastLines(gout, 2))
	return res
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, " | ")
}
