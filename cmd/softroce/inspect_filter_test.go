package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestInspectFilter: -Y lists the matching packets of committed captures,
// the summary still counts every packet and says how many matched, and
// several files get a total.
func TestInspectFilter(t *testing.T) {
	const synth, loss = "../../inspect/testdata/synthetic.pcapng", "../../inspect/testdata/demo-read-loss.pcap"
	var code int
	out, errOut := runOut(t, func() { code = run([]string{"inspect", "-Y", "qp == 0x11 && (nak || rnr_nak)", synth}) })
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var listed []string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, " RoCEv") && !strings.HasPrefix(l, " ") || strings.HasPrefix(l, "    ") && strings.Contains(l, "icrc") {
			listed = append(listed, strings.Fields(l)[0])
		}
	}
	if strings.Join(listed, ",") != "6,7" {
		t.Errorf("listed frames %v, want 6,7:\n%s", listed, out)
	}
	for _, want := range []string{"13 frames, 12 RoCE", "filter qp == 0x11 && (nak || rnr_nak): matched 2 of 12 RoCE packets", "NAKs: remote access error=1"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}

	// Retransmissions as the analysis marks them, over two files, in JSON.
	out, errOut = runOut(t, func() { code = run([]string{"inspect", "--json", "--filter", "retransmission", synth, loss}) })
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var frames []int
	var total struct {
		Total *struct {
			Files, Frames, RoCE, Retransmissions int
			Matched                              *int
		} `json:"total"`
	}
	summaries := 0
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var v map[string]any
		if err := json.Unmarshal([]byte(l), &v); err != nil {
			t.Fatalf("%q: %v", l, err)
		}
		switch {
		case v["summary"] != nil:
			summaries++
		case v["total"] != nil:
			json.Unmarshal([]byte(l), &total)
		default:
			frames = append(frames, int(v["frame"].(float64)))
			if v["file"] != loss {
				t.Errorf("frame from %v, want %s", v["file"], loss)
			}
		}
	}
	if len(frames) != 3 || frames[0] != 10 || frames[2] != 12 {
		t.Errorf("frames %v, want 10 11 12", frames)
	}
	if summaries != 2 || total.Total == nil || total.Total.Files != 2 || total.Total.Frames != 29 || total.Total.RoCE != 28 ||
		total.Total.Retransmissions != 3 || total.Total.Matched == nil || *total.Total.Matched != 3 {
		t.Errorf("summaries %d, total %+v:\n%s", summaries, total.Total, out)
	}

	// Text totals.
	out, _ = runOut(t, func() { code = run([]string{"inspect", synth, loss}) })
	if code != 0 || !strings.Contains(out, "== total over 2 files: 29 frames, 28 RoCE") || !strings.Contains(out, "5 connections; gaps 1 (1 PSN missing); retransmissions 3") {
		t.Errorf("exit %d, no total:\n%s", code, out)
	}

	out, _ = runOut(t, func() { code = run([]string{"inspect", "--no-summary", "-Y", "gap", synth, loss}) })
	if code != 0 || strings.Contains(out, "total") || strings.Contains(out, "matched") || strings.Count(out, "RoCEv2") != 1 || !strings.Contains(out, "RDMA_READ_RESPONSE_LAST qp 0x612942 psn 106") {
		t.Errorf("--no-summary -Y gap: exit %d:\n%s", code, out)
	}

	// --diagram draws the matching packets only.
	arrows := func(args ...string) int {
		svg := filepath.Join(t.TempDir(), "d.svg")
		var code int
		runOut(t, func() { code = run(append([]string{"inspect", "--no-summary", "--diagram", svg}, args...)) })
		b, err := os.ReadFile(svg)
		if code != 0 || err != nil {
			t.Fatalf("inspect --diagram %v: exit %d, %v", args, code, err)
		}
		return strings.Count(string(b), "<line")
	}
	if all, some := arrows(synth), arrows("-Y", "qp == 0x11", synth); some == 0 || some >= all {
		t.Errorf("diagram: %d lines with -Y 'qp == 0x11', %d without", some, all)
	}

	// A bad expression: exit 2, the column and a caret.
	out, errOut = runOut(t, func() { code = run([]string{"inspect", "-Y", "psn >= 100 &&", synth}) })
	if code != 2 || out != "" || !strings.Contains(errOut, "column 14: expected a field, ( or !, found the end of the expression") ||
		!strings.Contains(errOut, "\n  psn >= 100 &&\n"+strings.Repeat(" ", 2+13)+"^\n") {
		t.Errorf("exit %d, stdout %q, stderr:\n%s", code, out, errOut)
	}
}
