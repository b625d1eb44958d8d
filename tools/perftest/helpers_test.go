package perftest

import (
	"bytes"
	"context"
	"net/netip"
	"sync"
	"testing"

	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/nic/udp"
	"github.com/softroce/softroce/verbs"
)

// openDevs opens a device on each link, closed when the test ends.
func openDevs(t *testing.T, a, b nic.Link) [2]*verbs.Device {
	t.Helper()
	var devs [2]*verbs.Device
	for i, link := range []nic.Link{a, b} {
		d, err := verbs.Open(link, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		devs[i] = d
	}
	return devs
}

// loopbackDevs opens two devices on kernel UDP sockets, 127.0.0.1 ports
// port and port+1, skipping the test when a port cannot be had.
func loopbackDevs(t *testing.T, port int) [2]*verbs.Device {
	t.Helper()
	var links [2]nic.Link
	for i := range links {
		l, err := udp.Open(udp.Config{Addr: netip.MustParseAddr("127.0.0.1"), Port: port + i, SocketBuffer: 4 << 20})
		if err != nil {
			t.Skipf("cannot open UDP port %d on loopback: %v", port+i, err)
		}
		links[i] = l
	}
	return openDevs(t, links[0], links[1])
}

// overUDP is runPair's set for loopbackDevs(port): each side reaches the
// other's UDP port, the active one dials 127.0.0.1.
func overUDP(port int) func(side int, c *Config) {
	return func(side int, c *Config) {
		c.RemotePort = uint16(port + 1 - side)
		if side == 1 {
			c.Server = "127.0.0.1"
		}
	}
}

// runSides runs the passive side on devs[0] and the active side on
// devs[1] at once, set adjusting each side's copy of base, and returns
// what each returned and printed.
func runSides(devs [2]*verbs.Device, base Config, set func(side int, c *Config)) (res [2]*Result, errs [2]error, outs [2]string) {
	var wg sync.WaitGroup
	for side := range 2 {
		wg.Go(func() {
			c := base
			set(side, &c)
			var out bytes.Buffer
			res[side], errs[side] = Run(context.Background(), devs[side], c, &out)
			outs[side] = out.String()
		})
	}
	wg.Wait()
	return res, errs, outs
}

// runPair is runSides for runs that must both succeed.
func runPair(t *testing.T, devs [2]*verbs.Device, base Config, set func(side int, c *Config)) (sres, cres *Result, sout, cout string) {
	t.Helper()
	res, errs, outs := runSides(devs, base, set)
	if errs[0] != nil || errs[1] != nil {
		t.Fatalf("server: %v\n%s\nclient: %v\n%s", errs[0], outs[0], errs[1], outs[1])
	}
	return res[0], res[1], outs[0], outs[1]
}
