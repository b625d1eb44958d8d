// Package interop proves softroce against the Linux kernel's rdma_rxe in a
// qemu VM: the standard tools (ibv_rc_pingpong, perftest) and the verbs
// agent on the guest talk to softroce on the host. The tests run when
// SOFTROCE_RXE=1 and the process is root; .ci/run sets both.
//
// It sits in e2e/ beside the other whole-system tests (network namespaces,
// soak): it runs the whole project against rxe, softroce's tool front ends
// (tools/) and the distribution's unmodified programs through softroce's
// libraries alike. The VM is package conformance/rxevm, shared with the
// conformance harness.
package interop

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/softroce/softroce/conformance/agent"
	"github.com/softroce/softroce/conformance/rxevm"
)

var vm *rxevm.VM

func TestMain(m *testing.M) {
	code := run(m)
	if abiRoot != "" {
		os.RemoveAll(abiRoot)
	}
	os.Exit(code)
}

func run(m *testing.M) int {
	if os.Getenv("SOFTROCE_RXE") != "1" || os.Geteuid() != 0 {
		fmt.Println("interop: skipping the rdma_rxe VM tests (set SOFTROCE_RXE=1 and run as root; .ci/run does)")
		return m.Run()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	img, err := rxevm.Build(ctx, rxevm.Config{Log: os.Stderr})
	if err != nil {
		fmt.Fprintln(os.Stderr, "interop: build the rxe guest:", err)
		return 1
	}
	dir, err := os.MkdirTemp("", "softroce-agent-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "interop:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	bin, err := agent.Build(ctx, dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "interop: build the verbs agent:", err)
		return 1
	}
	vm, err = rxevm.Boot(ctx, img, rxevm.Options{MTU: 9000, Log: os.Stderr, Files: []rxevm.File{agent.GuestFile(bin)}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "interop: boot the rxe guest:", err)
		return 1
	}
	stop := vm.CloseOnSignal()
	defer stop()
	defer vm.Close()
	return m.Run()
}

func needVM(t *testing.T) {
	t.Helper()
	if vm == nil {
		t.Skip("no rdma_rxe VM: set SOFTROCE_RXE=1 and run as root")
	}
}
