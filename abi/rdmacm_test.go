package abi

import (
	"os"
	"path/filepath"
	"testing"
)

func rdmacm(t *testing.T) string {
	t.Helper()
	if _, err := os.Stat(RDMACMHeader); err != nil {
		t.Skip("librdmacm-dev is not installed")
	}
	lib := filepath.Join(filepath.Dir(build(t)), "librdmacm.so.1")
	if _, err := os.Stat(lib); err != nil {
		t.Fatalf("Build made no librdmacm.so.1: %v", err)
	}
	return lib
}

// The built librdmacm.so.1 exports exactly the recorded table.
func TestRDMACMExportsMatchRecordedTable(t *testing.T) {
	lib := rdmacm(t)
	b, err := src.ReadFile("c/librdmacm_exports.txt")
	if err != nil {
		t.Fatal(err)
	}
	rec := splitLines(string(b))
	if len(rec) != 72 {
		t.Errorf("librdmacm_exports.txt has %d entries, want 72", len(rec))
	}
	if a, b := diff(rec, exports(t, lib)); len(a)+len(b) > 0 {
		t.Errorf("export table differs from the record: missing %v, extra %v", a, b)
	}
}

// ... and the installed distribution library's.
func TestRDMACMExportsMatchSystemLibrary(t *testing.T) {
	sys := "/usr/lib/x86_64-linux-gnu/librdmacm.so.1"
	if _, err := os.Stat(sys); err != nil {
		t.Skip("the distribution's librdmacm.so.1 is not installed (Debian: librdmacm1)")
	}
	lib := rdmacm(t)
	if a, b := diff(exports(t, sys), exports(t, lib)); len(a)+len(b) > 0 {
		t.Errorf("export table differs from %s: missing %v, extra %v", sys, a, b)
	}
}

func splitLines(s string) []string {
	var out []string
	start := 0
	for i := 0; i < len(s); i++ {
		if s[i] == '\n' {
			if i > start {
				out = append(out, s[start:i])
			}
			start = i + 1
		}
	}
	return out
}
