package cases

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"
)

// rxeTarget is kernel rdma_rxe in a VM, booted once by TestMain when
// SOFTROCE_RXE=1 and the test runs as root (.ci/run provides both).
var rxeTarget *RxeTarget

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	if os.Getenv("SOFTROCE_RXE") != "1" || os.Geteuid() != 0 {
		fmt.Println("cases: skipping the rdma_rxe target (set SOFTROCE_RXE=1 and run as root; .ci/run does)")
		return m.Run()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	vm, err := BootRxeVM(ctx, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "cases:", err)
		return 1
	}
	stop := vm.CloseOnSignal()
	defer stop()
	defer vm.Close()
	rxeTarget, err = NewRxeTarget(ctx, vm)
	if err != nil {
		fmt.Fprintln(os.Stderr, "cases:", err)
		return 1
	}
	defer rxeTarget.Close()
	return m.Run()
}
