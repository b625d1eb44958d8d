package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestInspectDiagram: --diagram writes a self-contained ladder diagram of
// the capture, and refuses a file name it cannot tell the format of.
func TestInspectDiagram(t *testing.T) {
	capture := "../../../shared/captures/hardware/rxe-rdmacm-write-read.pcap"
	if _, err := os.Stat(capture); err != nil {
		t.Skipf("shared captures not available: %v", err)
	}
	dir := t.TempDir()
	for _, name := range []string{"ladder.html", "ladder.svg"} {
		out := filepath.Join(dir, name)
		var code int
		quiet(t, func() { code = runInspect([]string{"--diagram", out, capture}) })
		if code != 0 {
			t.Fatalf("%s: exit %d", name, code)
		}
		b, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"<svg", "RDMA_READ_RESPONSE_MIDDLE", "9209055"} {
			if !bytes.Contains(b, []byte(want)) {
				t.Errorf("%s lacks %q", name, want)
			}
		}
		if bytes.Contains(b, []byte("http://")) && !bytes.Contains(b, []byte("http://www.w3.org/2000/svg")) || bytes.Contains(b, []byte("https://")) {
			t.Errorf("%s refers to the network", name)
		}
	}
	var code int
	quiet(t, func() { code = runInspect([]string{"--diagram", filepath.Join(dir, "x.png"), capture}) })
	if code != 2 {
		t.Fatalf("--diagram x.png: exit %d, want 2", code)
	}
}
