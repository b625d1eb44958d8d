package apps

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/softroce/softroce/conformance/rxevm"
)

// The kernel rxe peer: one guest per test binary, booted by the first test
// that asks for it (NewRxePeer) and closed by Main. The guest runs the
// host's own application packages from a read-only share
// (rxevm.Options.HostPrograms), so both sides run the same Debian builds:
// the guest with Debian's libibverbs and rxe provider, the host side
// through softroce.
var (
	rxeOnce sync.Once
	rxeVM   *rxevm.VM
	rxeErr  error
	// rxeMu makes tests against the guest take turns: the softroce host
	// beside it binds the tap's one address.
	rxeMu sync.Mutex
)

// rxeMemoryMB holds two MPI runtimes' worth of processes in the guest.
const rxeMemoryMB = 2048

// RxePeer is kernel rdma_rxe in the guest and, beside it on the guest's
// tap, a softroce host with its own daemon (Soft) whose programs run as
// User through `softroce run`, as on TwoHosts.
type RxePeer struct {
	Soft *Host
	VM   *rxevm.VM
}

// NewRxePeer boots the guest on first use and starts a softroce daemon
// beside it for this test; the test skips unless SOFTROCE_RXE=1 and root
// (.ci/run sets both). Tests using it take turns.
func NewRxePeer(t testing.TB) *RxePeer {
	t.Helper()
	if os.Getenv("SOFTROCE_RXE") != "1" {
		t.Skip("no rdma_rxe guest: set SOFTROCE_RXE=1 and run as root (.ci/run does)")
	}
	Need(t, "")
	build(t)
	rxeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		img, err := rxevm.Build(ctx, rxevm.Config{Log: os.Stderr})
		if err != nil {
			rxeErr = err
			return
		}
		rxeVM, rxeErr = rxevm.Boot(ctx, img, rxevm.Options{HostPrograms: true, MemoryMB: rxeMemoryMB, Log: os.Stderr})
	})
	if rxeErr != nil {
		t.Fatalf("rdma_rxe guest: %v", rxeErr)
	}
	rxeMu.Lock()
	t.Cleanup(rxeMu.Unlock)
	// Cleanups run last-in first-out: the daemon stops before the lock is
	// released, and the guest's programs are killed before both.
	h := newHost(t, "softroce", rxeVM.HostAddr(), rxeVM.Do)
	t.Cleanup(func() { h.stopDaemon(t) })
	t.Cleanup(func() { rxeVM.KillAll() })
	return &RxePeer{Soft: h, VM: rxeVM}
}

// GuestAddr is the guest's address, rxe0's IPv4 GID.
func (r *RxePeer) GuestAddr() netip.Addr { return r.VM.GuestAddr() }

// GuestRun runs a shell command in the guest among the host's programs
// (rxevm.InHostRoot), as root, with stderr joined to stdout, and returns
// that output; a non-zero exit or the timeout is an error.
func (r *RxePeer) GuestRun(t testing.TB, timeout time.Duration, cmd string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, err := r.VM.Run(ctx, rxevm.InHostRoot("exec 2>&1; "+cmd))
	if ee, ok := err.(*rxevm.ExitError); ok {
		return ee.Stdout, fmt.Errorf("guest: %q exited with status %d", cmd, ee.Code)
	}
	return out, err
}

// GuestStart starts a long-running shell command in the guest as GuestRun
// does; it is killed at the test's end if still running.
func (r *RxePeer) GuestStart(t testing.TB, cmd string) *rxevm.GuestProc {
	t.Helper()
	p, err := r.VM.Start(context.Background(), rxevm.InHostRoot("exec 2>&1; "+cmd))
	if err != nil {
		t.Fatalf("guest: start %q: %v", cmd, err)
	}
	t.Cleanup(func() { p.Kill() })
	return p
}

// closeRxe ends the guest, if one was booted.
func closeRxe() {
	if rxeVM != nil {
		rxeVM.Close()
	}
}
