package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/softroce/softroce/inspect"
)

// runOut runs f with stdout and stderr sent to files and returns what
// each received.
func runOut(t *testing.T, f func()) (stdout, stderr string) {
	t.Helper()
	dir := t.TempDir()
	o, err := os.Create(filepath.Join(dir, "stdout"))
	if err != nil {
		t.Fatal(err)
	}
	e, err := os.Create(filepath.Join(dir, "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	so, se := os.Stdout, os.Stderr
	os.Stdout, os.Stderr = o, e
	defer func() { os.Stdout, os.Stderr = so, se }()
	f()
	o.Close()
	e.Close()
	ob, _ := os.ReadFile(o.Name())
	eb, _ := os.ReadFile(e.Name())
	return string(ob), string(eb)
}

// TestDemoCommand runs `softroce demo` with a pcap and a diagram and
// checks the exit code, the files and that inspect verifies the capture.
func TestDemoCommand(t *testing.T) {
	dir := t.TempDir()
	pcap, svg, html := filepath.Join(dir, "d.pcap"), filepath.Join(dir, "d.svg"), filepath.Join(dir, "d.html")
	var code int
	out, _ := runOut(t, func() {
		code = runDemo([]string{"--impair", "loss=10%,seed=3", "--pcap", pcap, "--diagram", svg, "--color", "never"})
	})
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	if !strings.Contains(out, "all good: 5 operations completed") || !strings.Contains(out, "wrote "+pcap) || strings.Contains(out, "\x1b[") {
		t.Errorf("output:\n%s", out)
	}
	recs, err := inspect.Records(pcap)
	if err != nil || len(recs) < 14 {
		t.Fatalf("pcap: %d records, %v", len(recs), err)
	}
	for _, r := range recs {
		if r.ICRC != "ok" {
			t.Errorf("frame %d: ICRC %s", r.Frame, r.ICRC)
		}
	}
	if b, err := os.ReadFile(svg); err != nil || !strings.HasPrefix(string(b), "<svg") {
		t.Errorf("diagram: %v", err)
	}
	runOut(t, func() { code = runDemo([]string{"--diagram", html}) })
	if b, err := os.ReadFile(html); code != 0 || err != nil || !strings.Contains(string(b), "<!DOCTYPE html>") {
		t.Errorf("html diagram: exit %d, %v", code, err)
	}
}

func TestDemoCommandUsage(t *testing.T) {
	for _, args := range [][]string{
		{"--diagram", "x.png"},
		{"--mtu", "1500"},
		{"--color", "sometimes"},
		{"extra"},
		{"--nope"},
	} {
		var code int
		_, errOut := runOut(t, func() { code = runDemo(args) })
		if code != 2 {
			t.Errorf("%q: exit %d, want 2 (%s)", args, code, errOut)
		}
	}
	var code int
	_, errOut := runOut(t, func() { code = runDemo([]string{"--impair", "loss=200%"}) })
	if code != 2 || !strings.Contains(errOut, "loss=200%") {
		t.Errorf("bad impairment: exit %d, %q", code, errOut)
	}
	_, errOut = runOut(t, func() { code = runDemo([]string{"--impair", "loss=10"}) })
	if code != 2 || !strings.Contains(errOut, "loss=10: a probability is a percentage or a fraction: write 10% or 0.1") {
		t.Errorf("loss=10: exit %d, %q", code, errOut)
	}
	// What the demo refuses, it names where it is taken (and bw takes it).
	_, errOut = runOut(t, func() { code = runDemo([]string{"--impair", "delay=1ms"}) })
	if code != 2 || !strings.Contains(errOut, "`softroce bw --impair` and `softroce lat --impair` take them") {
		t.Errorf("delay: exit %d, %q", code, errOut)
	}
	_, errOut = runOut(t, func() { code = runPerf("bw", []string{"--help"}) })
	if !strings.Contains(errOut, "-impair") {
		t.Errorf("bw's help does not list --impair:\n%s", errOut)
	}
}

// TestDemoInspectSameNames: demo and inspect print the same packets with
// the same names: the opcode table's, ImmDt, dmalen, compare/swap and add.
func TestDemoInspectSameNames(t *testing.T) {
	pcap := filepath.Join(t.TempDir(), "d.pcap")
	var code int
	demoOut, _ := runOut(t, func() { code = runDemo([]string{"--pcap", pcap, "--color", "never"}) })
	if code != 0 {
		t.Fatalf("demo: exit %d\n%s", code, demoOut)
	}
	inspectOut, _ := runOut(t, func() { code = runInspect([]string{"--no-summary", pcap}) })
	if code != 0 {
		t.Fatalf("inspect: exit %d\n%s", code, inspectOut)
	}
	for _, want := range []string{"RDMA_WRITE_LAST_WITH_IMMEDIATE", "ImmDt 0x1234abcd", "dmalen 600", "compare ", " swap ", " add ", "ATOMIC_ACKNOWLEDGE", "orig "} {
		for name, out := range map[string]string{"demo": demoOut, "inspect": inspectOut} {
			if !strings.Contains(out, want) {
				t.Errorf("%s does not print %q", name, want)
			}
		}
	}
	// The packet lines (the verbs calls and completions keep the verbs'
	// own names: RDMA_WRITE_WITH_IMM, imm_data).
	packets := func(out string) string {
		var b strings.Builder
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, " psn ") || strings.Contains(l, "RETH ") {
				b.WriteString(l + "\n")
			}
		}
		return b.String()
	}
	for _, old := range []string{"_WITH_IMM ", " dlen ", "swap/add", " cmp ", " imm "} {
		for name, out := range map[string]string{"demo": packets(demoOut), "inspect": packets(inspectOut)} {
			if strings.Contains(out, old) {
				t.Errorf("%s prints %q", name, old)
			}
		}
	}
}
