package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestInspectDiagram: --diagram writes a self-contained ladder diagram of
// the capture, and refuses a file name it cannot tell the format of. It
// draws a capture `softroce demo` makes, and, where the shared captures
// are present, one recorded from kernel rdma_rxe.
func TestInspectDiagram(t *testing.T) {
	dir := t.TempDir()
	demo := filepath.Join(dir, "demo.pcap")
	var code int
	runOut(t, func() { code = runDemo([]string{"--pcap", demo, "--color", "never"}) })
	if code != 0 {
		t.Fatalf("demo --pcap: exit %d", code)
	}
	t.Run("demo", func(t *testing.T) { checkDiagram(t, demo, "RDMA_READ_RESPONSE", "COMPARE_SWAP") })
	t.Run("rxe", func(t *testing.T) {
		capture := sharedCaptureDir() + "/hardware/rxe-rdmacm-write-read.pcap"
		if _, err := os.Stat(capture); err != nil {
			t.Skipf("shared captures absent: %v", err)
		}
		checkDiagram(t, capture, "RDMA_READ_RESPONSE_MIDDLE", "9209055")
	})
	quiet(t, func() { code = runInspect([]string{"--diagram", filepath.Join(dir, "x.png"), demo}) })
	if code != 2 {
		t.Fatalf("--diagram x.png: exit %d, want 2", code)
	}
}

func checkDiagram(t *testing.T, capture string, wants ...string) {
	t.Helper()
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
		for _, want := range append([]string{"<svg"}, wants...) {
			if !bytes.Contains(b, []byte(want)) {
				t.Errorf("%s lacks %q", name, want)
			}
		}
		if bytes.Contains(b, []byte("http://")) && !bytes.Contains(b, []byte("http://www.w3.org/2000/svg")) || bytes.Contains(b, []byte("https://")) {
			t.Errorf("%s refers to the network", name)
		}
	}
}
