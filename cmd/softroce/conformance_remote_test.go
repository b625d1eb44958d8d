package main

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/softroce/softroce/conformance/agent"
)

func TestConformanceAgentSource(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "src")
	var code int
	quiet(t, func() { code = runConformance([]string{"agent-source", dir}) })
	if code != 0 {
		t.Fatalf("agent-source: exit %d", code)
	}
	src, err := os.ReadFile(filepath.Join(dir, "agent.c"))
	if err != nil || !bytes.Equal(src, agent.Source) {
		t.Fatalf("agent.c not the agent's source (%v)", err)
	}
	if mk, err := os.ReadFile(filepath.Join(dir, "Makefile")); err != nil || !bytes.Contains(mk, []byte("-libverbs")) {
		t.Fatalf("Makefile: %v\n%s", err, mk)
	}
	quiet(t, func() { code = runConformance([]string{"agent-source"}) })
	if code != 2 {
		t.Errorf("agent-source without DIR: exit %d, want 2", code)
	}
	// The written source builds with the documented command.
	if _, err := exec.LookPath("gcc"); err == nil {
		cmd := exec.Command("sh", "-c", agent.BuildCommand)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Logf("documented build command failed here (libibverbs-dev missing?): %v: %s", err, out)
		} else if _, err := os.Stat(filepath.Join(dir, "softroce-agent")); err != nil {
			t.Error(err)
		}
	}
}

// TestConformanceRemoteRefusals runs `conformance remote` against a
// standalone agent on this host's loopback: a wrong token and a host with
// no RDMA device both end the run with an error, before any case.
func TestConformanceRemoteRefusals(t *testing.T) {
	bin, err := agent.Build(t.Context(), t.TempDir())
	if err != nil {
		t.Skipf("cannot build the agent here: %v", err)
	}
	cmd := exec.Command(bin, "--listen", "127.0.0.1:0")
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	r := bufio.NewReader(out)
	l1, _ := r.ReadString('\n')
	l2, _ := r.ReadString('\n')
	m := regexp.MustCompile(`listening on (\S+),`).FindStringSubmatch(l1)
	tm := regexp.MustCompile(`token (\S+)`).FindStringSubmatch(l2)
	if m == nil || tm == nil {
		t.Fatalf("agent output %q %q", l1, l2)
	}
	var code int
	quiet(t, func() { code = runConformance([]string{"remote", m[1], "--token", "0000000000000000"}) })
	if code != 1 {
		t.Errorf("wrong token: exit %d, want 1", code)
	}
	quiet(t, func() { code = runConformance([]string{"remote", m[1]}) })
	if code != 2 {
		t.Errorf("no token: exit %d, want 2", code)
	}
	if _, err := os.Stat("/sys/class/infiniband"); err != nil {
		quiet(t, func() { code = runConformance([]string{"remote", m[1], "--token", tm[1], "--out", t.TempDir()}) })
		if code != 1 {
			t.Errorf("no RDMA device on the agent's host: exit %d, want 1", code)
		}
	}
}

// TestConformanceRemotePeerFlag: an unknown --peer is a usage error, given
// before anything is dialled.
func TestConformanceRemotePeerFlag(t *testing.T) {
	var code int
	quiet(t, func() { code = runConformance([]string{"remote", "192.0.2.1", "--token", "x", "--peer", "afxdp"}) })
	if code != 2 {
		t.Errorf("--peer afxdp: exit %d, want 2", code)
	}
}
