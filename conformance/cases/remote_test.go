package cases

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/softroce/softroce/conformance/agent"
	"github.com/softroce/softroce/conformance/rxevm"
)

// The rxe VM plays the remote host: the agent runs in the guest as a
// standalone program listening on the guest's address, and the harness
// reaches it over TCP across the tap, with its fake peer on an address of
// its own on the host side of the tap (the rxe target's peer holds the
// first one).
var (
	remotePeerAddrs = []netip.Addr{netip.MustParseAddr("10.88.0.3"), netip.MustParseAddr("10.88.0.4")}
	remoteAddrsOnce sync.Once
	remoteAddrsErr  error
)

// addRemotePeerAddrs gives the host side of the tap the remote peers'
// addresses, once per VM.
func addRemotePeerAddrs(ctx context.Context, vm *rxevm.VM) error {
	remoteAddrsOnce.Do(func() {
		for _, a := range remotePeerAddrs {
			out, err := vm.HostCommand(ctx, "ip", "addr", "add", a.String()+"/24", "dev", rxevm.TapName).CombinedOutput()
			if err != nil && !strings.Contains(string(out), "exists") {
				remoteAddrsErr = fmt.Errorf("add %s to the tap: %v: %s", a, err, out)
				return
			}
		}
	})
	return remoteAddrsErr
}

// startGuestAgent starts softroce-agent in the guest as a user would on an
// RNIC host, and returns its control address and token.
func startGuestAgent(t *testing.T, ctx context.Context, vm *rxevm.VM) (string, string) {
	t.Helper()
	token, err := agent.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	port := 8000 + rand.IntN(900)
	addr := net.JoinHostPort(vm.GuestAddr().String(), strconv.Itoa(port))
	file := fmt.Sprintf("/tmp/remote-%d.token", port)
	p, err := vm.Start(ctx, fmt.Sprintf("umask 077 && printf '%%s\\n' %s >%s && exec %s --listen %s --device rxe0 --gid-index 1 --token-file %s",
		token, file, agent.GuestPath, addr, file))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Kill() })
	if err := vm.WaitListening(ctx, port); err != nil {
		t.Fatal(err)
	}
	return addr, token
}

// remoteSubset are the cases TestRemoteSameVerdicts runs when
// SOFTROCE_REMOTE_SUBSET=1 asks for a quick run (every case otherwise, a
// few minutes): RC responder and requester, UC, UD, memory windows, SRQ and
// CM.
var remoteSubset = []string{
	"psn-sequence-error", "duplicate-write", "duplicate-read", "rnr-nak", "remote-access-bad-rkey",
	"read-response-segmentation", "atomic-compare-swap", "icrc-corrupted-dropped",
	"requester-retransmit-after-timeout", "requester-go-back-after-nak", "ack-coalescing-msn",
	"uc-gap-drops-message", "ud-qkey-mismatch-dropped", "ud-grh-contents",
	"srq-limit-event", "srq-last-wqe-after-error",
	"mw-type1-access", "mw-type2-local-inv", "mw-send-invalidate-type2",
	"cm-rej-unknown-service", "cm-dreq-unknown-connection", "cm-req-retransmission",
}

// TestRemoteSameVerdicts runs the cases against rxe twice: as the rxe
// target (agent started by the harness, peer on the tap's first address)
// and as a remote host (standalone agent reached over TCP with a token,
// peer on another address), and asserts the same verdicts. The remote
// target's driver is rxe, so rxe's documented deviations apply to it.
// The run's report has a column per target: rxe, softroce and remote.
func TestRemoteSameVerdicts(t *testing.T) {
	remoteSameVerdicts(t, PeerUDP, os.Getenv("SOFTROCE_REMOTE_SUBSET") != "1")
}

// TestRemoteRawPeerSameVerdicts is TestRemoteSameVerdicts with the
// raw-socket peer (the harness writes the IPv4 header: its ID, TTL and
// DSCP/ECN), over the quick subset of cases.
func TestRemoteRawPeerSameVerdicts(t *testing.T) {
	remoteSameVerdicts(t, PeerRaw, false)
}

func remoteSameVerdicts(t *testing.T, kind string, all bool) {
	if rxeTarget == nil {
		t.Skip("no rdma_rxe VM: set SOFTROCE_RXE=1 and run as root")
	}
	vm := rxeTarget.vm
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	if err := addRemotePeerAddrs(ctx, vm); err != nil {
		t.Fatal(err)
	}
	addr, token := startGuestAgent(t, ctx, vm)
	rt, err := NewRemoteTarget(ctx, RemoteConfig{Agent: addr, Token: token, LocalAddr: remotePeerAddrs[0], Dial: vm.DialContext, Do: vm.Do, Peer: kind})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	soft, err := NewSoftroceTarget()
	if err != nil {
		t.Fatal(err)
	}
	defer soft.Close()
	info := rt.Info()
	t.Logf("remote device: %+v; driver key %q; peer %s", info, rt.Driver(), rt.PeerKind())
	if rt.Driver() != "rxe" || info.Name != "rxe0" || rt.Addr() != vm.GuestAddr() || rt.PeerKind() != kind {
		t.Fatalf("remote target: driver %q device %q address %s peer %s, want rxe, rxe0, %s, %s", rt.Driver(), info.Name, rt.Addr(), rt.PeerKind(), vm.GuestAddr(), kind)
	}
	if d := rt.Device(); d.Name != "rxe0" || d.Driver != "rxe" {
		t.Errorf("Device() = %+v", d)
	}
	var run []*Case
	for _, c := range All {
		if all || slices.Contains(remoteSubset, c.ID) {
			run = append(run, c)
		}
	}
	rep := &Report{Generated: time.Now().UTC(), Targets: []string{rxeTarget.Name(), soft.Name(), rt.Name()},
		Environment: map[string]string{"remote peer": kind}, Devices: map[string]DeviceInfo{rt.Name(): rt.Device()}}
	same, differ := 0, 0
	for _, c := range run {
		cr := &CaseReport{ID: c.ID, Ref: c.Ref, Spec: c.Spec, Known: c.Known, Bugs: c.Bugs}
		rep.Cases = append(rep.Cases, cr)
		t.Run(c.ID, func(t *testing.T) {
			cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			want := Run(cctx, rxeTarget, c)
			cancel()
			cctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
			sres := Run(cctx, soft, c)
			cancel()
			cctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
			got := Run(cctx, rt, c)
			cancel()
			cr.Results = append(cr.Results, want, sres, got)
			t.Logf("rxe %s (%s) | remote %s (%s)", want.Verdict, want.Observed, got.Verdict, got.Observed)
			if got.Driver != "rxe" {
				t.Errorf("remote result's driver %q, want rxe", got.Driver)
			}
			if got.Verdict == want.Verdict {
				same++
				return
			}
			differ++
			t.Errorf("%s: remote verdict %s, rxe verdict %s\nremote observed: %s\nremote failures: %s\nremote error: %s\nrxe observed: %s\nremote trace:\n  %s",
				c.ID, got.Verdict, want.Verdict, got.Observed, strings.Join(got.Failures, "; "), got.Error, want.Observed,
				strings.Join(got.Trace, "\n  "))
		})
	}
	t.Logf("remote (%s peer) vs rxe over %d cases: %d same verdict, %d different", kind, len(run), same, differ)
	checkThreeColumnReport(t, rep, run)
	// Nothing of the run is left on the agent's host.
	o, err := rt.Objects(ctx)
	if err != nil || o.Total() != 0 {
		t.Errorf("agent objects after the run: %+v, %v", o, err)
	}
}

// checkThreeColumnReport writes rep (rxe, softroce, remote) into a
// temporary directory and checks both files have the three columns, the
// remote one headed with the agent's device, and every case's results.
func checkThreeColumnReport(t *testing.T, rep *Report, run []*Case) {
	t.Helper()
	dir := t.TempDir()
	if err := rep.WriteFiles(dir); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, "conformance-report.md"))
	if err != nil {
		t.Fatal(err)
	}
	d := rep.Devices["remote"]
	head := "| case | spec expectation (section) | rxe | softroce | remote (" + d.String() + ") |"
	if !strings.Contains(string(md), head) || !strings.Contains(d.String(), "rxe0") || !strings.Contains(d.String(), "driver rxe") {
		t.Errorf("Markdown report lacks the heading %q", head)
	}
	js, err := os.ReadFile(filepath.Join(dir, "conformance-report.json"))
	if err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(js, &back); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(back.Targets, []string{"rxe", "softroce", "remote"}) || back.Devices["remote"].Name != "rxe0" {
		t.Errorf("JSON report targets %v devices %+v", back.Targets, back.Devices)
	}
	for _, c := range run {
		for _, tg := range back.Targets {
			if r := back.Result(c.ID, tg); r == nil || r.Verdict == "" {
				t.Errorf("JSON report has no %s result for %s", tg, c.ID)
			}
		}
	}
}

// TestRemoteKilledHarnessLeavesNothing starts a harness in a separate
// process (this test binary, inside the VM's network namespace), lets it
// open a case's QP, MR, CQ, a posted receive and an rdma_cm listener on
// the guest's standalone agent, kills it with SIGKILL, and checks through the agent's own object
// count, after reconnecting, that nothing is left.
func TestRemoteKilledHarnessLeavesNothing(t *testing.T) {
	if rxeTarget == nil {
		t.Skip("no rdma_rxe VM: set SOFTROCE_RXE=1 and run as root")
	}
	vm := rxeTarget.vm
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := addRemotePeerAddrs(ctx, vm); err != nil {
		t.Fatal(err)
	}
	addr, token := startGuestAgent(t, ctx, vm)
	cmd := vm.HostCommand(ctx, os.Args[0], "-test.run=^TestRemoteHarnessProcess$", "-test.v")
	cmd.Env = append(os.Environ(), "SOFTROCE_RXE=0", "SOFTROCE_REMOTE_HELPER="+addr+","+token+","+remotePeerAddrs[1].String())
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	sc := bufio.NewScanner(out)
	var ready string
	for sc.Scan() {
		if l := sc.Text(); strings.HasPrefix(l, "READY ") {
			ready = l
			break
		}
	}
	if ready == "" {
		cmd.Process.Kill()
		t.Fatal("the harness process did not get its case's objects up")
	}
	t.Logf("harness process: %s", ready)
	if !strings.Contains(ready, " qp=1 ") || !strings.Contains(ready, " mr=1 ") || !strings.Contains(ready, " cm=1 ") {
		t.Fatalf("the harness process's session holds %s, want a QP, an MR and an rdma_cm listener", ready)
	}
	// ip netns exec execs the test binary: the process is the harness.
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	go func() {
		for sc.Scan() {
		}
	}()
	// The agent serves one harness at a time: this connection is taken
	// once it has noticed the killed one's, and cleaned up after it.
	c, err := agent.Dial(ctx, vm.DialContext, addr, token)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	o, err := c.Objects(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if o.Total() != 0 || o.Ctx {
		t.Fatalf("after the harness was killed the agent still holds %+v", o)
	}
	// The device is usable again by the next harness.
	if err := c.Open(ctx, "rxe0"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.AllocPD(ctx); err != nil {
		t.Fatal(err)
	}
	if o, _ := c.Objects(ctx); o.PD != 1 || !o.Ctx {
		t.Fatalf("objects after a PD: %+v", o)
	}
}

// TestRemoteHarnessProcess is the harness TestRemoteKilledHarnessLeavesNothing
// kills: it opens a case's session on the remote agent, reports what the
// agent holds, and waits to be killed.
func TestRemoteHarnessProcess(t *testing.T) {
	env := os.Getenv("SOFTROCE_REMOTE_HELPER")
	if env == "" {
		t.Skip("helper process of TestRemoteKilledHarnessLeavesNothing")
	}
	f := strings.Split(env, ",")
	ctx := context.Background()
	rt, err := NewRemoteTarget(ctx, RemoteConfig{Agent: f[0], Token: f[1], LocalAddr: netip.MustParseAddr(f[2])})
	if err != nil {
		t.Fatal(err)
	}
	spec := QPSpec{PeerQPN: 0x1234}
	spec.fill()
	s, err := rt.Open(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.PostRecv(ctx, 1, 0, 64); err != nil {
		t.Fatal(err)
	}
	// An rdma_cm listener too: the agent's rping must go with the session.
	if _, err := rt.CMListen(ctx, uint16(20000+rand.IntN(10000))); err != nil {
		t.Fatal(err)
	}
	o, err := rt.Objects(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("READY qp=%d mr=%d cq=%d pd=%d cm=%d \n", o.QP, o.MR, o.CQ, o.PD, o.CM)
	os.Stdout.Sync()
	time.Sleep(10 * time.Minute)
}

// TestRemoteCommandLine runs `softroce conformance remote` itself, with
// the raw peer, from the VM's network namespace, against a standalone
// agent in the guest, and reads the report it writes.
func TestRemoteCommandLine(t *testing.T) {
	got, md := runRemoteCommandLine(t, "--peer", "raw")
	for _, want := range []string{"| remote (rxe0, fw ", "driver rxe) |", "| softroce |", "`send-longer-than-receive`"} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q", want)
		}
	}
	if !strings.Contains(got, "driver rxe at 10.88.0.2, raw peer") || !strings.Contains(md, "raw IPv4 socket") {
		t.Errorf("the run does not say its peer is the raw one")
	}
	// send-longer-than-receive is a documented rxe deviation: the
	// remote column, whose device is rxe, shows it as such.
	if !strings.Contains(got, "remote: 1 pass, 1 documented deviation, 0 fail, 0 harness error") {
		t.Errorf("summary lacks the rxe deviation on the remote target")
	}
}

// TestRemoteCommandLineWithRxe: `conformance remote --with-rxe` boots its
// own rdma_rxe VM and writes one report with the columns rxe, softroce and
// remote.
func TestRemoteCommandLineWithRxe(t *testing.T) {
	got, md := runRemoteCommandLine(t, "--with-rxe")
	if !strings.Contains(md, "| case | spec expectation (section) | rxe | softroce | remote (rxe0, fw ") {
		t.Errorf("report lacks the three columns")
	}
	for _, want := range []string{"rxe: 1 pass, 1 documented deviation", "softroce: 2 pass", "remote: 1 pass, 1 documented deviation"} {
		if !strings.Contains(got, want) {
			t.Errorf("summary lacks %q", want)
		}
	}
}

// runRemoteCommandLine builds softroce, starts an agent in the guest and
// runs `softroce conformance remote` on two cases with the extra flags; it
// returns the command's output and the Markdown report.
func runRemoteCommandLine(t *testing.T, extra ...string) (string, string) {
	t.Helper()
	if rxeTarget == nil {
		t.Skip("no rdma_rxe VM: set SOFTROCE_RXE=1 and run as root")
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool to build the command")
	}
	vm := rxeTarget.vm
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := addRemotePeerAddrs(ctx, vm); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "softroce")
	if out, err := exec.CommandContext(ctx, gobin, "build", "-o", bin, "github.com/softroce/softroce/cmd/softroce").CombinedOutput(); err != nil {
		t.Fatalf("build softroce: %v\n%s", err, out)
	}
	addr, token := startGuestAgent(t, ctx, vm)
	tf := filepath.Join(dir, "token")
	if err := os.WriteFile(tf, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "report")
	args := append([]string{"conformance", "remote", addr, "--token-file", tf, "--local-addr", remotePeerAddrs[1].String(),
		"--only", "^(psn-sequence-error|send-longer-than-receive)$", "--out", out}, extra...)
	cmd := vm.HostCommand(ctx, bin, args...)
	got, err := cmd.CombinedOutput()
	t.Logf("softroce %s:\n%s", strings.Join(args, " "), got)
	if err != nil {
		t.Fatalf("exit: %v", err)
	}
	md, err := os.ReadFile(filepath.Join(out, "conformance-report.md"))
	if err != nil {
		t.Fatal(err)
	}
	return string(got), string(md)
}
