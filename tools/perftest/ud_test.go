package perftest

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/softroce/softroce/nic/pipe"
	"github.com/softroce/softroce/verbs"
)

// TestConfigUD: -c UD is for send only; a receiver left at the default
// depth posts a receive per message.
func TestConfigUD(t *testing.T) {
	for _, test := range []Test{Write, Read, Atomic} {
		c := Config{Test: test, Conn: verbs.QPTypeUD}
		if err := c.defaults(); err == nil || !strings.Contains(err.Error(), "UD connection only possible in SEND verb") {
			t.Errorf("%v over UD: %v", test, err)
		}
	}
	c := Config{Test: Send, Conn: verbs.QPTypeUD, Iters: 3000}
	if err := c.defaults(); err != nil || c.RxDepth != 3000 || c.sizeGiven {
		t.Fatalf("UD send: rx depth %d, size given %v, %v", c.RxDepth, c.sizeGiven, err)
	}
}

// udPair is two devices on an in-memory link (UD reaches its peer on
// UDP port 4791 only, so two softroce on one address cannot talk UD).
func udPair(t *testing.T, pc pipe.Config) [2]*verbs.Device {
	t.Helper()
	la, lb := pipe.New(pc)
	return openDevs(t, la, lb)
}

// TestLoopbackUD runs ib_send_bw -c UD's flow between two softroce
// devices: the TCP exchange, UD QPs with perftest's Q_Key, address
// handles from the peer's GID, receives with room for the GRH.
func TestLoopbackUD(t *testing.T) {
	devs := udPair(t, pipe.Config{Block: true})
	for _, tc := range []struct {
		size, mtu, iters, qps int
	}{
		{1024, 1024, 500, 1},
		{4096, 4096, 200, 1},
		{1, 1024, 300, 1},
		{2000, 2048, 300, 2},
		{0, 2048, 100, 1}, // no -s: the MTU
	} {
		t.Run(fmt.Sprintf("size%d/mtu%d/q%d", tc.size, tc.mtu, tc.qps), func(t *testing.T) {
			base := Config{Test: Send, Conn: verbs.QPTypeUD, Port: freeTCPPort(t), Size: tc.size, MTU: tc.mtu, Iters: tc.iters,
				QPs: tc.qps, Timeout: 20 * time.Second}
			sres, cres, sout, _ := runPair(t, devs, base, func(side int, c *Config) {
				if side == 1 {
					c.Server = "127.0.0.1"
				}
			})
			size := tc.size
			if size == 0 {
				size = tc.mtu
				if !strings.Contains(sout, "Max msg size in UD is MTU") {
					t.Errorf("no size notice:\n%s", sout)
				}
			}
			total := uint64(tc.iters * tc.qps)
			if sres.Report.Iters != total || cres.Report.Iters != total || sres.Report.Size != uint64(size) || sres.Lost != 0 {
				t.Fatalf("reports: server %+v lost %d, client %+v", sres.Report, sres.Lost, cres.Report)
			}
			if !strings.Contains(sres.Checked, fmt.Sprintf("%d receives of %d bytes", total, size)) {
				t.Fatalf("server check %q", sres.Checked)
			}
			// Nothing is acknowledged on UD.
			if sres.Stats.TxPackets != 0 || cres.Stats.RxPackets != 0 {
				t.Fatalf("UD packets answered: server %+v, client %+v", sres.Stats, cres.Stats)
			}
		})
	}
}

// TestUDSizeAboveMTU: a -s above the MTU is perftest's error on the side
// that was given it.
func TestUDSizeAboveMTU(t *testing.T) {
	devs := udPair(t, pipe.Config{Block: true})
	var outs [2]bytes.Buffer
	errs := make(chan error, 2)
	port := freeTCPPort(t)
	for side := range 2 {
		go func() {
			c := Config{Test: Send, Conn: verbs.QPTypeUD, Port: port, Size: 2048, MTU: 1024, Iters: 10, Timeout: 3 * time.Second}
			if side == 1 {
				c.Server = "127.0.0.1"
			}
			_, err := Run(context.Background(), devs[side], c, &outs[side])
			errs <- err
		}()
	}
	for range 2 {
		if err := <-errs; err == nil || !strings.Contains(err.Error(), "Max message size in UD cannot be greater than MTU") {
			t.Errorf("err %v", err)
		}
	}
}

// TestUDLossReported: datagrams the link drops are never resent; the
// receiver stops waiting after RecvIdle and reports what arrived.
func TestUDLossReported(t *testing.T) {
	// A 16-packet queue that drops when full loses most of a burst.
	devs := udPair(t, pipe.Config{Depth: 16})
	base := Config{Test: Send, Conn: verbs.QPTypeUD, Port: freeTCPPort(t), Size: 1024, MTU: 1024, Iters: 2000, TxDepth: 512,
		RecvIdle: 300 * time.Millisecond, Timeout: 20 * time.Second}
	sres, cres, sout, _ := runPair(t, devs, base, func(side int, c *Config) {
		if side == 1 {
			c.Server = "127.0.0.1"
		}
	})
	if cres.Report.Iters != 2000 || sres.Lost == 0 || sres.Report.Iters+uint64(sres.Lost) != 2000 || sres.Report.Iters == 0 {
		t.Fatalf("client %+v; server %+v, lost %d", cres.Report, sres.Report, sres.Lost)
	}
	if !strings.Contains(sout, "messages lost") || !strings.Contains(sres.Checked, fmt.Sprintf("%d receives", sres.Report.Iters)) {
		t.Fatalf("server output:\n%s\ncheck %q", sout, sres.Checked)
	}
}
