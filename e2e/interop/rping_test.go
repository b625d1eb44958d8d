package interop

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/softroce/softroce/bth/mad"
	"github.com/softroce/softroce/cm"
	"github.com/softroce/softroce/tools/rping"
	"github.com/softroce/softroce/verbs"
)

// lockedBuf collects one run's output while its goroutine writes it.
type lockedBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *lockedBuf) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}
func (b *lockedBuf) String() string { b.mu.Lock(); defer b.mu.Unlock(); return b.b.String() }

// rpingLines are the -v lines of count pings of size bytes, prefixed
// ("server " on the server side).
func rpingLines(prefix string, count, size int) string {
	var s strings.Builder
	for i := range count {
		fmt.Fprintf(&s, "%s%s\n", prefix, rping.Line(i, size))
	}
	return s.String()
}

// TestRpingAgainstRxe runs rdmacm-utils' rping in the rxe guest against
// softroce rping (package tools/rping, on one host device's CM) in
// both roles, with several sizes and counts. Both sides print every
// ping's data (-v), which must be rping's pattern, and both exit 0. The
// two roles of each case run at once, on two ports.
func TestRpingAgainstRxe(t *testing.T) {
	needVM(t)
	dev := hostDevice(t)
	c, err := cm.Open(dev, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	cases := []struct{ size, count int }{{64, 1}, {64, 10}, {4096, 10}, {4096, 100}, {65535, 10}, {rping.MinSize, 100}}
	port := uint16(7200)
	for _, tc := range cases {
		t.Run(fmt.Sprintf("size%d/count%d", tc.size, tc.count), func(t *testing.T) {
			t.Run("softroce-client", func(t *testing.T) {
				t.Parallel()
				rpingClientAgainstRxe(t, dev, c, port, tc.size, tc.count)
			})
			t.Run("softroce-server", func(t *testing.T) {
				t.Parallel()
				rpingServerAgainstRxe(t, dev, c, port+1, tc.size, tc.count)
			})
		})
		port += 2
	}
}

// rpingClientAgainstRxe: guest rping -s, softroce rping -c.
func rpingClientAgainstRxe(t *testing.T, dev *verbs.Device, c *cm.CM, port uint16, size, count int) {
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Second)
	defer cancel()
	proc, err := vm.Start(ctx, fmt.Sprintf("timeout 180 rping -s -a %s -p %d -S %d -C %d -v", vm.GuestAddr(), port, size, count))
	if err != nil {
		t.Fatal(err)
	}
	defer proc.Kill()
	cfg := rping.Config{Addr: vm.GuestAddr(), Port: port, Size: size, Count: count, Verbose: true, Validate: true}
	var out, errOut *lockedBuf
	for {
		// Until the guest's rping listens its CM answers REJ 8: retry on
		// that alone.
		out, errOut = &lockedBuf{}, &lockedBuf{}
		err = rping.Run(ctx, dev, c, cfg, out, errOut)
		if err == nil || !strings.Contains(errOut.String(), "RDMA_CM_EVENT_REJECTED, error 8") || ctx.Err() != nil {
			break
		}
		select {
		case <-proc.Done():
			gout, gerr := proc.Output()
			t.Fatalf("guest rping server exited:\n%s\n%s", gout, gerr)
		case <-time.After(200 * time.Millisecond):
		}
	}
	if err != nil {
		gout, _ := proc.Wait(ctx)
		t.Fatalf("softroce rping client: %v\n%s%s\nguest:\n%s", err, out, errOut, gout)
	}
	if want := rpingLines("", count, size); out.String() != want {
		t.Fatalf("softroce client's ping data:\n%s\nwant:\n%s", out, want)
	}
	gout, err := proc.Wait(ctx)
	_, gerr := proc.Output()
	if err != nil {
		t.Fatalf("guest rping server: %v\n%s\n%s", err, gout, gerr)
	}
	if want := rpingLines("server ", count, size); gout != want {
		t.Fatalf("guest server's ping data:\n%s\nwant:\n%s\nstderr: %s", gout, want, gerr)
	}
	t.Logf("guest server: %d lines, exit 0, stderr %q; softroce client: %q", count, strings.TrimSpace(gerr), strings.TrimSpace(errOut.String()))
}

// rpingServerAgainstRxe: softroce rping -s, guest rping -c.
func rpingServerAgainstRxe(t *testing.T, dev *verbs.Device, c *cm.CM, port uint16, size, count int) {
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Second)
	defer cancel()
	out, errOut := &lockedBuf{}, &lockedBuf{}
	done := make(chan error, 1)
	go func() {
		done <- rping.Run(ctx, dev, c, rping.Config{Server: true, Port: port, Size: size, Verbose: true}, out, errOut)
	}()
	// Run listens before it waits; a moment for the goroutine to start.
	time.Sleep(100 * time.Millisecond)
	gout, err := vm.Run(ctx, fmt.Sprintf("timeout 180 rping -c -a %s -p %d -S %d -C %d -v -V", vm.HostAddr(), port, size, count))
	if err != nil {
		t.Fatalf("guest rping client: %v\n%s\nsoftroce server:\n%s%s", err, gout, out, errOut)
	}
	if want := rpingLines("", count, size); gout != want {
		t.Fatalf("guest client's ping data:\n%s\nwant:\n%s", gout, want)
	}
	select {
	case err = <-done:
	case <-ctx.Done():
		t.Fatalf("softroce server did not end after the client left:\n%s%s", out, errOut)
	}
	if err != nil {
		t.Fatalf("softroce rping server: %v\n%s", err, errOut)
	}
	if want := rpingLines("server ", count, size); out.String() != want {
		t.Fatalf("softroce server's ping data:\n%s\nwant:\n%s", out, want)
	}
	t.Logf("guest client: %d lines, exit 0; softroce server: stderr %q", count, strings.TrimSpace(errOut.String()))
}

// TestRpingPersistentAgainstRxe: a persistent softroce server (-P)
// serves two guest rping clients at once, then a third after them.
func TestRpingPersistentAgainstRxe(t *testing.T) {
	needVM(t)
	dev := hostDevice(t)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Second)
	defer cancel()
	const port, count, size = 7300, 20, 1000
	out, errOut := &lockedBuf{}, &lockedBuf{}
	sctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- rping.Run(sctx, dev, nil, rping.Config{Server: true, Persistent: true, Port: port, Size: size}, out, errOut)
	}()
	time.Sleep(100 * time.Millisecond)
	cli := fmt.Sprintf("timeout 120 rping -c -a %s -p %d -S %d -C %d -v -V", vm.HostAddr(), port, size, count)
	gout, err := vm.Run(ctx, fmt.Sprintf("(%[1]s >/tmp/rp1; echo rc1 $? >>/tmp/rp1) & (%[1]s >/tmp/rp2; echo rc2 $? >>/tmp/rp2) & wait; cat /tmp/rp1 /tmp/rp2; %[1]s; echo rc3 $?", cli))
	if err != nil {
		t.Fatalf("guest clients: %v\n%s\nsoftroce server:\n%s", err, gout, errOut)
	}
	lines := rpingLines("", count, size)
	if want := lines + "rc1 0\n" + lines + "rc2 0\n" + lines + "rc3 0\n"; gout != want {
		t.Fatalf("guest clients' output:\n%s\nwant:\n%s\nsoftroce server:\n%s", gout, want, errOut)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("softroce server: %v\n%s", err, errOut)
	}
	if n := strings.Count(errOut.String(), "server DISCONNECT EVENT..."); n != 3 {
		t.Fatalf("%d disconnects, want 3:\n%s", n, errOut)
	}
}

// TestRpingSizeMismatchAgainstRxe: a client whose -S is larger than the
// server's. rping's server cannot READ it into its buffer and drops the
// connection; the client, disconnected, ends with status 0 as rping's
// does. Both roles, so softroce's client and server are seen to behave
// as rping's.
func TestRpingSizeMismatchAgainstRxe(t *testing.T) {
	needVM(t)
	dev := hostDevice(t)
	c, err := cm.Open(dev, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	t.Run("softroce-client", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Second)
		defer cancel()
		proc, err := vm.Start(ctx, fmt.Sprintf("timeout 60 rping -s -a %s -p 7310 -S 64 -v", vm.GuestAddr()))
		if err != nil {
			t.Fatal(err)
		}
		defer proc.Kill()
		var out, errOut *lockedBuf
		for {
			out, errOut = &lockedBuf{}, &lockedBuf{}
			err = rping.Run(ctx, dev, c, rping.Config{Addr: vm.GuestAddr(), Port: 7310, Size: 4096, Count: 5, Verbose: true}, out, errOut)
			if !strings.Contains(errOut.String(), "RDMA_CM_EVENT_REJECTED, error 8") || ctx.Err() != nil {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		gout, gerr := proc.Wait(ctx)
		_, gstderr := proc.Output()
		t.Logf("softroce client: %v; stdout %q; stderr %q", err, out, errOut)
		t.Logf("guest server: %v; stdout %q; stderr %q", gerr, gout, gstderr)
		if gerr == nil || out.String() != "" {
			t.Fatalf("the guest server should fail and nothing be echoed")
		}
		if err != nil || !strings.Contains(errOut.String(), "wait for RDMA_WRITE_ADV state 10") {
			t.Fatalf("softroce client: %v, want rping's end on a disconnect", err)
		}
	})
	t.Run("softroce-server", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Second)
		defer cancel()
		out, errOut := &lockedBuf{}, &lockedBuf{}
		done := make(chan error, 1)
		go func() {
			done <- rping.Run(ctx, dev, c, rping.Config{Server: true, Port: 7311, Size: 64, Verbose: true}, out, errOut)
		}()
		time.Sleep(100 * time.Millisecond)
		gout, gerr := vm.Run(ctx, fmt.Sprintf("timeout 60 rping -c -a %s -p 7311 -S 4096 -C 5 -v; echo rc $?", vm.HostAddr()))
		err := <-done
		t.Logf("softroce server: %v; stdout %q; stderr %q", err, out, errOut)
		t.Logf("guest client: %v; output %q", gerr, gout)
		if e := errOut.String(); rping.ExitCode(err) != rping.ExitFailed || !strings.Contains(e, "the client's buffer is 4096 bytes, more than this server's 64") ||
			!strings.Contains(e, "cq completion failed status 4\n") || !strings.Contains(e, "wait for RDMA_READ_COMPLETE state 11\n") {
			t.Fatalf("softroce server: %v, want it to refuse the READ", err)
		}
		if gerr != nil || !strings.HasSuffix(gout, "rc 0\n") || strings.Contains(gout, "ping data") {
			t.Fatalf("guest client should end with 0 and no data")
		}
	})
}

// loseIncoming drops the first MAD of one attribute that the host's QP1
// receives.
type loseIncoming struct {
	*cm.QP1
	attr mad.AttrID
	lost atomic.Bool
}

func (l *loseIncoming) RecvMAD(buf []byte) (int, cm.Peer, error) {
	for {
		n, from, err := l.QP1.RecvMAD(buf)
		if err == nil && mad.MAD(buf[:n]).AttrID() == l.attr && l.lost.CompareAndSwap(false, true) {
			continue
		}
		return n, from, err
	}
}

// TestRpingLostRTUAgainstRxe: the kernel's RTU to a softroce rping server
// is lost. The guest rping client's first SEND establishes the
// connection on the server (COMM_EST) instead of the REP's retransmission
// 4 s later: every ping goes through and the REP is never sent again.
func TestRpingLostRTUAgainstRxe(t *testing.T) {
	needVM(t)
	dev := hostDevice(t)
	q, err := cm.OpenQP1(dev, 0)
	if err != nil {
		t.Fatal(err)
	}
	lossy := &loseIncoming{QP1: q, attr: mad.AttrRTU}
	c, err := cm.New(dev, lossy, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Second)
	defer cancel()
	const port, count, size = 7320, 10, 64
	out, errOut := &lockedBuf{}, &lockedBuf{}
	done := make(chan error, 1)
	go func() {
		done <- rping.Run(ctx, dev, c, rping.Config{Server: true, Port: port, Size: size, Verbose: true}, out, errOut)
	}()
	time.Sleep(100 * time.Millisecond)
	gout, err := vm.Run(ctx, fmt.Sprintf("timeout 60 rping -c -a %s -p %d -S %d -C %d -v -V", vm.HostAddr(), port, size, count))
	if err != nil {
		t.Fatalf("guest rping client: %v\n%s\nsoftroce server:\n%s", err, gout, errOut)
	}
	if err := <-done; err != nil {
		t.Fatalf("softroce server: %v\n%s", err, errOut)
	}
	if want := rpingLines("", count, size); gout != want {
		t.Fatalf("guest client's ping data:\n%s\nwant:\n%s", gout, want)
	}
	if want := rpingLines("server ", count, size); out.String() != want {
		t.Fatalf("softroce server's ping data:\n%s\nwant:\n%s", out, want)
	}
	s := c.Stats()
	if !lossy.lost.Load() || s.Retransmitted != 0 {
		t.Fatalf("RTU lost %v, REP retransmitted %d times (want: lost, never): %+v", lossy.lost.Load(), s.Retransmitted, s)
	}
	t.Logf("CM %+v", s)
}
