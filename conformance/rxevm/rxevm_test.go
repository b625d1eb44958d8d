package rxevm

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// testVM is shared by every test in the package: TCG boots are slow, so
// TestMain boots once when SOFTROCE_RXE=1.
var (
	testVM      *VM
	testVMError error
	skipReason  string
)

func TestMain(m *testing.M) {
	code := func() int {
		switch {
		case os.Getenv("SOFTROCE_RXE") != "1":
			skipReason = "set SOFTROCE_RXE=1 to build and boot the kernel rdma_rxe VM"
		case os.Geteuid() != 0:
			skipReason = "the rxe VM needs root (network namespace, tap)"
		default:
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			img, err := Build(ctx, Config{Log: os.Stderr})
			if err == nil {
				testVM, err = Boot(ctx, img, Options{Log: os.Stderr})
			}
			testVMError = err
			if testVM != nil {
				defer testVM.Close()
			}
		}
		return m.Run()
	}()
	os.Exit(code)
}

func needVM(t *testing.T) *VM {
	t.Helper()
	if skipReason != "" {
		t.Skip(skipReason)
	}
	if testVMError != nil {
		t.Fatalf("VM: %v", testVMError)
	}
	return testVM
}

func TestGuestRun(t *testing.T) {
	vm := needVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := vm.Run(ctx, "echo hello; echo to-stderr >&2")
	if err != nil || out != "hello\n" {
		t.Fatalf("Run echo = %q, %v; want \"hello\\n\"", out, err)
	}
	_, err = vm.Run(ctx, "echo oops >&2; exit 3")
	ee, ok := err.(*ExitError)
	if !ok || ee.Code != 3 || strings.TrimSpace(ee.Stderr) != "oops" {
		t.Fatalf("Run exit 3 = %v; want *ExitError code 3 with stderr oops", err)
	}
	// Quoting survives the trip.
	out, err = vm.Run(ctx, `printf '%s|' "a b" 'c'"'"'d'`)
	if err != nil || out != "a b|c'd|" {
		t.Fatalf("quoting: got %q, %v", out, err)
	}
}

func TestGuestStartKill(t *testing.T) {
	vm := needVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := vm.Start(ctx, "sleep 1000 | cat")
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Wait(ctx); err == nil {
		t.Fatal("killed command reported success")
	}
	out, err := vm.Run(ctx, "ps | grep -c '[s]leep 1000' || true")
	if err != nil || strings.TrimSpace(out) != "0" {
		t.Fatalf("sleep survived Kill: %q %v", out, err)
	}
	// A Run whose context ends is killed.
	sctx, scancel := context.WithTimeout(ctx, 2*time.Second)
	defer scancel()
	if _, err := vm.Run(sctx, "sleep 999"); err == nil {
		t.Fatal("Run past its deadline returned no error")
	}
	out, _ = vm.Run(ctx, "ps | grep -c '[s]leep 999' || true")
	if strings.TrimSpace(out) != "0" {
		t.Fatalf("sleep survived its Run's deadline: %q", out)
	}
}

func TestRdmaLinkActive(t *testing.T) {
	vm := needVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := vm.Run(ctx, "rdma link show")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "rxe0/1") || !strings.Contains(out, "state ACTIVE") || !strings.Contains(out, "netdev eth0") {
		t.Fatalf("rdma link show: %q; want rxe0/1 ACTIVE on eth0", out)
	}
}

func TestIbvDevinfo(t *testing.T) {
	vm := needVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := vm.Run(ctx, "ibv_devinfo -d rxe0 -v")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"hca_id:\trxe0", "PORT_ACTIVE", "link_layer:\t\tEthernet", "GID[  1]:\t\t::ffff:10.88.0.2, RoCE v2"} {
		if !strings.Contains(out, want) {
			t.Errorf("ibv_devinfo output lacks %q:\n%s", want, out)
		}
	}
}

func TestWriteBWLoopback(t *testing.T) {
	vm := needVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const args = "-d rxe0 -x 1 -s 65536 -n 200 -F"
	srv, err := vm.Start(ctx, "ib_write_bw "+args)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Kill() })
	// The server needs a moment to listen on its TCP port.
	var out string
	for i := 0; ; i++ {
		out, err = vm.Run(ctx, fmt.Sprintf("ib_write_bw %s %s", args, vm.GuestAddr()))
		if err == nil || i == 10 || !strings.Contains(err.Error(), "Couldn't connect") {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("ib_write_bw client: %v", err)
	}
	res, err := ParseBW(out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if res[0].Bytes != 65536 || res[0].Iterations != 200 || res[0].AvgBW <= 0 {
		t.Fatalf("unexpected result %+v from\n%s", res[0], out)
	}
	t.Logf("rxe<->rxe ib_write_bw 64 KiB: average %.2f %s, %.4f Mpps", res[0].AvgBW, res[0].Unit, res[0].MsgRate)
	if _, err := srv.Wait(ctx); err != nil {
		t.Fatalf("ib_write_bw server: %v", err)
	}
}
