package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestConformanceCommand(t *testing.T) {
	out := t.TempDir()
	pcaps := filepath.Join(out, "pcap")
	for _, c := range []struct {
		name string
		args []string
		want int
	}{
		{"no mode", nil, 2},
		{"unknown mode", []string{"vm"}, 2},
		{"bad regexp", []string{"self", "--only", "("}, 2},
		{"list", []string{"--list"}, 0},
		{"self, two cases", []string{"self", "--out", out, "--pcap", pcaps, "--only", "^(psn-wraparound|rnr-nak)$"}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			var got int
			quiet(t, func() { got = runConformance(c.args) })
			if got != c.want {
				t.Fatalf("exit %d, want %d", got, c.want)
			}
		})
	}
	md, err := os.ReadFile(filepath.Join(out, "conformance-report.md"))
	if err != nil || !strings.Contains(string(md), "| `psn-wraparound` |") || strings.Contains(string(md), "`duplicate-read`") {
		t.Fatalf("report (err %v) lacks the selected case or has others:\n%s", err, md)
	}
	for _, f := range []string{"psn-wraparound.softroce.pcap", "rnr-nak.softroce.pcap"} {
		if _, err := os.Stat(filepath.Join(pcaps, f)); err != nil {
			t.Error(err)
		}
		var code int
		quiet(t, func() { code = runInspect([]string{"--strict", filepath.Join(pcaps, f)}) })
		if code != 0 {
			t.Errorf("softroce inspect --strict %s: exit %d", f, code)
		}
	}
	if os.Geteuid() != 0 {
		var code int
		quiet(t, func() { code = runConformance([]string{"rxe", "--out", out}) })
		if code != 1 {
			t.Errorf("rxe as non-root: exit %d, want 1", code)
		}
	}
}
