package rxevm

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
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
			dir, err := os.MkdirTemp("", "rxevm-test-")
			if err != nil {
				testVMError = err
				break
			}
			defer os.RemoveAll(dir)
			static, err := buildStatic(ctx, dir)
			var img *Image
			if err == nil {
				img, err = Build(ctx, Config{Log: os.Stderr})
			}
			if err == nil {
				// MTU 9000 so that rxe's active MTU is 4096; an extra
				// static binary, a data file that is a boot hook, and
				// an environment word for it.
				testVM, err = Boot(ctx, img, Options{
					Log: os.Stderr,
					MTU: 9000,
					Files: []File{
						{Path: "/usr/bin/static-hello", Src: static},
						{Path: "/etc/softroce/init.d/50-test", Data: []byte(hookScript), Mode: 0o755},
					},
					Env: map[string]string{"sr_test_word": "from-cmdline"},
				})
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

const hookScript = `#!/bin/sh
echo "hook saw ${sr_test_word} and $(cat /sys/class/infiniband/rxe0/ports/1/state)" > /tmp/hook.out
`

// buildStatic compiles a static Go program (CGO_ENABLED=0), the kind of
// binary the harness ships into the guest (e.g. softroce itself).
func buildStatic(ctx context.Context, dir string) (string, error) {
	src := filepath.Join(dir, "hello")
	if err := os.MkdirAll(src, 0o755); err != nil {
		return "", err
	}
	prog := "package main\n\nimport (\"fmt\"; \"os\"; \"runtime\")\n\nfunc main() { fmt.Println(\"static hello\", runtime.GOOS, len(os.Args)) }\n"
	if err := os.WriteFile(filepath.Join(src, "main.go"), []byte(prog), 0o644); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(src, "go.mod"), []byte("module hello\n\ngo 1.21\n"), 0o644); err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "static-hello")
	return bin, BuildStaticGo(ctx, src, ".", bin)
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
	p, err := vm.Start(ctx, "echo early; echo warn >&2; sleep 1000 | cat")
	if err != nil {
		t.Fatal(err)
	}
	var so, se string
	for i := 0; i < 50 && so == ""; i++ {
		if so, se, err = p.Peek(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if so != "early\n" || se != "warn\n" {
		t.Fatalf("Peek = %q, %q; want the output written so far", so, se)
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
	// KillAll ends whatever is still running.
	for range 2 {
		if _, err := vm.Start(ctx, "sleep 1001"); err != nil {
			t.Fatal(err)
		}
	}
	if err := vm.KillAll(); err != nil {
		t.Fatal(err)
	}
	out, err = vm.Run(ctx, "ps | grep -c '[s]leep 1001' || true")
	if err != nil || strings.TrimSpace(out) != "0" {
		t.Fatalf("sleep survived KillAll: %q %v", out, err)
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
	for _, want := range []string{"hca_id:\trxe0", "PORT_ACTIVE", "link_layer:\t\tEthernet",
		"GID[  1]:\t\t::ffff:10.88.0.2, RoCE v2",
		"active_mtu:\t\t4096 (5)"} { // rxe follows eth0's MTU of 9000
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
	// The server needs a moment to listen on its TCP port (18515).
	if err := vm.WaitListening(ctx, 18515); err != nil {
		t.Fatal(err)
	}
	out, err := vm.Run(ctx, fmt.Sprintf("ib_write_bw %s %s", args, vm.GuestAddr()))
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

func TestExtraFilesEnvAndHook(t *testing.T) {
	vm := needVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := vm.Run(ctx, "static-hello a b")
	if err != nil || out != "static hello linux 3\n" {
		t.Fatalf("static binary from the extra archive: %q, %v", out, err)
	}
	out, err = vm.Run(ctx, "cat /tmp/hook.out")
	if err != nil || out != "hook saw from-cmdline and 4: ACTIVE\n" {
		t.Fatalf("boot hook: %q, %v", out, err)
	}
	// The base archive's files survive the appended one.
	if _, err := vm.Run(ctx, "test -x /usr/bin/ib_write_bw && test -L /lib"); err != nil {
		t.Fatal(err)
	}
}

func TestHostSide(t *testing.T) {
	vm := needVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The tap exists only in the VM's namespace, addressed and at the
	// requested MTU, as is the guest's eth0.
	out, err := vm.HostCommand(ctx, "ip", "-o", "addr", "show", "dev", TapName).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "inet "+hostPrefix.String()) {
		t.Fatalf("ip addr in the namespace: %v\n%s", err, out)
	}
	out, err = vm.HostCommand(ctx, "cat", "/sys/class/net/"+TapName+"/mtu").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "9000" {
		t.Fatalf("tap MTU: %q, %v", out, err)
	}
	if gout, err := vm.Run(ctx, "cat /sys/class/net/eth0/mtu; ping -c 1 -W 5 -s 8972 "+vm.HostAddr().String()); err != nil || !strings.HasPrefix(gout, "9000\n") {
		t.Fatalf("guest eth0 MTU / ping host: %q, %v", gout, err)
	}
	if _, err := os.Stat("/sys/class/net/" + TapName); err == nil {
		t.Logf("note: a %s exists outside the VM namespace (not ours)", TapName)
	}
	// A host listener in the namespace is reachable from the guest.
	l, err := vm.Listen("tcp", vm.HostAddr().String()+":0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	got := make(chan string, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			got <- err.Error()
			return
		}
		defer c.Close()
		b, _ := io.ReadAll(c)
		got <- string(b)
	}()
	if _, err := vm.Run(ctx, fmt.Sprintf("echo from-guest | nc %s %d", vm.HostAddr(), port)); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-got:
		if s != "from-guest\n" {
			t.Fatalf("host listener got %q", s)
		}
	case <-ctx.Done():
		t.Fatal("guest never connected to the host listener")
	}
	if vm.MTU() != 9000 || !vm.Alive() {
		t.Fatalf("MTU %d alive %v", vm.MTU(), vm.Alive())
	}
	if !strings.Contains(vm.ConsoleLog(), "softroce-guest: ready") {
		t.Errorf("console log lacks the ready line:\n%s", vm.ConsoleLog())
	}
}

func TestRCPingpongLoopback(t *testing.T) {
	vm := needVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// ibv_rc_pingpong in event mode (busy polling would starve the one
	// emulated CPU), GID index 1 (mandatory on RoCE), 4 KiB at MTU 4096.
	const args = "-d rxe0 -g 1 -e -n 20 -s 4096 -m 4096"
	srv, err := vm.Start(ctx, "ibv_rc_pingpong "+args)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Kill() })
	if err := vm.WaitListening(ctx, 18515); err != nil {
		t.Fatal(err)
	}
	out, err := vm.Run(ctx, "ibv_rc_pingpong "+args+" "+vm.GuestAddr().String())
	if err != nil {
		t.Fatalf("ibv_rc_pingpong client: %v", err)
	}
	if !strings.Contains(out, "163840 bytes in") || !strings.Contains(out, "20 iters in") {
		t.Fatalf("client output: %q", out)
	}
	if _, err := srv.Wait(ctx); err != nil {
		t.Fatalf("ibv_rc_pingpong server: %v", err)
	}
}

func TestCaptureTap(t *testing.T) {
	vm := needVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var buf bytes.Buffer
	c, err := vm.CaptureTap(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := vm.Run(ctx, "ping -c 3 -s 1000 "+vm.HostAddr().String()); err != nil {
		c.Stop()
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	n, err := c.Stop()
	if err != nil {
		t.Fatal(err)
	}
	r, err := pcapgo.NewReader(&buf)
	if err != nil {
		t.Fatal(err)
	}
	echo := map[layers.ICMPv4TypeCode]int{}
	frames := 0
	for {
		data, _, err := r.ReadPacketData()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		frames++
		p := gopacket.NewPacket(data, layers.LayerTypeEthernet, gopacket.Default)
		if icmp, ok := p.Layer(layers.LayerTypeICMPv4).(*layers.ICMPv4); ok && len(icmp.Payload) == 1000 {
			echo[icmp.TypeCode]++
		}
	}
	if frames != n {
		t.Errorf("Stop reported %d frames, the pcap holds %d", n, frames)
	}
	req := layers.CreateICMPv4TypeCode(layers.ICMPv4TypeEchoRequest, 0)
	rep := layers.CreateICMPv4TypeCode(layers.ICMPv4TypeEchoReply, 0)
	if echo[req] != 3 || echo[rep] != 3 {
		t.Fatalf("captured echo requests/replies %d/%d, want 3/3 (both directions)", echo[req], echo[rep])
	}
}

// The guest outlives threads the runtime throws away: qemu's parent-death
// signal follows the thread that forked it, and goroutines that end
// locked (after a namespace switch, as netnstest's do) end their thread.
func TestGuestSurvivesDiscardedThreads(t *testing.T) {
	vm := needVM(t)
	var wg sync.WaitGroup
	for range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread() // never unlocked: the thread ends
		}()
		wg.Wait()
	}
	time.Sleep(200 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if out, err := vm.Run(ctx, "echo alive"); err != nil || out != "alive\n" {
		t.Fatalf("guest after 200 discarded threads: %q, %v", out, err)
	}
}
