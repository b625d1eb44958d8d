package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestConformanceReplay: `softroce conformance replay` prints the verdicts
// and the summary, writes JSON and the side-by-side diagram, and refuses a
// diagram it cannot draw and a missing capture.
func TestConformanceReplay(t *testing.T) {
	capture := "../../icrc/testdata/rxe/rxe-ipv4.pcap"
	var code int
	out, _ := runOut(t, func() { code = runConformance([]string{"replay", capture}) })
	if code != 0 || !strings.Contains(out, "replayed 21 requests: 20 agree, 1 allowed differences, 0 differ") {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	out, _ = runOut(t, func() { code = runConformance([]string{"replay", "--json", capture}) })
	var v struct {
		Summary   string `json:"summary"`
		Exchanges []struct {
			Verdict string `json:"verdict"`
		} `json:"exchanges"`
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil || code != 0 || len(v.Exchanges) != 21 || !strings.HasPrefix(v.Summary, "replayed 21") {
		t.Fatalf("--json: exit %d, %v: %s", code, err, out)
	}
	page := filepath.Join(t.TempDir(), "replay.html")
	quiet(t, func() { code = runConformance([]string{"replay", "--diagram", page, capture}) })
	b, err := os.ReadFile(page)
	if code != 0 || err != nil || strings.Count(string(b), "<svg") != 2 {
		t.Fatalf("--diagram: exit %d, %v, %d SVGs", code, err, strings.Count(string(b), "<svg"))
	}
	quiet(t, func() { code = runConformance([]string{"replay", "--diagram", "x.svg", capture}) })
	if code != 2 {
		t.Errorf("--diagram x.svg: exit %d, want 2", code)
	}
	quiet(t, func() { code = runConformance([]string{"replay", "/nonexistent.pcap"}) })
	if code != 1 {
		t.Errorf("missing capture: exit %d, want 1", code)
	}
}
