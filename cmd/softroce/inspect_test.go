package main

import (
	"os"
	"path/filepath"
	"testing"
)

// quiet silences stdout and stderr while f runs.
func quiet(t *testing.T, f func()) {
	t.Helper()
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	stdout, stderr := os.Stdout, os.Stderr
	os.Stdout, os.Stderr = null, null
	defer func() { os.Stdout, os.Stderr = stdout, stderr }()
	f()
}

func TestInspectExitCodes(t *testing.T) {
	const hw = "../../../shared/captures/hardware/"
	good, bad := hw+"connectx-rdmacm-read.pcap", hw+"connectx-sniffer-bad-icrc.pcap"
	junk := filepath.Join(t.TempDir(), "junk.pcap")
	os.WriteFile(junk, []byte("not a capture"), 0o644)
	cases := []struct {
		name   string
		args   []string
		want   int
		shared bool
	}{
		{"no files", nil, 2, false},
		{"bad flag", []string{"--nope", "x"}, 2, false},
		{"missing file", []string{filepath.Join(t.TempDir(), "none.pcap")}, 1, false},
		{"junk file", []string{junk}, 1, false},
		{"good", []string{good}, 0, true},
		{"good verbose", []string{"-v", good}, 0, true},
		{"good json strict", []string{"--json", "--strict", good}, 0, true},
		{"bad icrc", []string{bad}, 0, true},
		{"bad icrc strict", []string{"--strict", bad}, 1, true},
		{"bad icrc strict json", []string{"--strict", "--json", good, bad}, 1, true},
		{"one unreadable of two", []string{good, junk}, 1, true},
	}
	for _, c := range cases {
		if c.shared {
			if _, err := os.Stat(good); err != nil {
				t.Logf("%s: shared captures not available, skipped", c.name)
				continue
			}
		}
		var got int
		quiet(t, func() { got = runInspect(c.args) })
		if got != c.want {
			t.Errorf("%s: exit %d, want %d", c.name, got, c.want)
		}
	}
}
