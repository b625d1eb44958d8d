package serve

import (
	"bufio"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/netnstest"
)

// Receives a program posts before rdma_accept are the QP's before the REP
// goes, as on a RNIC, even when the daemon's poller has not reached the
// ring yet: the client sends at once on ESTABLISHED with rnr_retry 0, so
// a receive still in the ring would fail its QP with RNR_RETRY_EXC_ERR
// (Ceph's rdma_cm messenger connects so, and failed so under load). The
// test holds the accepting daemon's poller while the server posts and
// accepts (testdata/cm_rnr.c).
func TestCMAcceptTakesPostedRecvs(t *testing.T) {
	netnstest.Require(t)
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("ip (iproute2) is not installed")
	}
	bin, lib := buildCM(t, "cm_rnr.c")
	v := netnstest.Pair(t, netnstest.VethConfig{})
	sa, sb := startInNS(t, v.A), startInNS(t, v.B)
	addr, port := v.A.Addr().String(), strconv.Itoa(7484)

	srv := exec.Command("ip", "netns", "exec", v.A.NS.Name, bin, "server", addr, port)
	srv.Env = env(sa, lib)
	in, err := srv.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := srv.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	srv.Stderr = &stderr
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Process.Kill(); srv.Wait() })
	lines := make(chan string, 4)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	expect := func(want string) {
		t.Helper()
		select {
		case l := <-lines:
			if l != want {
				t.Fatalf("server said %q, want %q\n%s", l, want, stderr.String())
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("server did not say %q\n%s", want, stderr.String())
		}
	}
	expect("listening")
	cli := nsTool(t, v.B.NS, sb, lib, bin, "client", addr, port)
	expect("ready")

	d := sa.devs[0]
	d.mu.Lock() // the poller stops here: the receives stay in the ring
	in.Write([]byte("go\n"))
	// Long enough for the client to connect and send, had the accept not
	// waited for the receives.
	select {
	case err := <-cli.done:
		cli.done <- err
	case <-time.After(2 * time.Second):
	}
	d.mu.Unlock()
	if co := waitTool(t, cli, "client"); strings.TrimSpace(co) != "ok" {
		t.Errorf("client: %s", co)
	}
	expect("ok")
}
