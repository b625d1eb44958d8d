package abi

import (
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// exports lists a library's defined dynamic symbols as exports.sh does.
func exports(t *testing.T, lib string) []string {
	t.Helper()
	out, err := exec.Command("objdump", "-T", lib).Output()
	if err != nil {
		t.Fatalf("objdump -T %s: %v", lib, err)
	}
	var s []string
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		if len(f) < 4 || f[1] != "g" || strings.Contains(l, "*UND*") {
			continue
		}
		s = append(s, f[len(f)-2]+" "+f[len(f)-1])
	}
	sort.Strings(s)
	return s
}

// softrocePrivate is what the built library exports beyond the
// distribution's table: the node of librdmacm's way to a QP's token.
var softrocePrivate = []string{"SOFTROCE_PRIVATE_1 SOFTROCE_PRIVATE_1", "SOFTROCE_PRIVATE_1 softroce_qp_token"}

// distExports is exports of the built library less softrocePrivate,
// which it must have.
func distExports(t *testing.T, lib string) []string {
	t.Helper()
	var s, priv []string
	for _, e := range exports(t, lib) {
		if strings.HasPrefix(e, "SOFTROCE_PRIVATE_1 ") {
			priv = append(priv, e)
		} else {
			s = append(s, e)
		}
	}
	if a, b := diff(softrocePrivate, priv); len(a)+len(b) > 0 {
		t.Errorf("softroce's private node differs: missing %v, extra %v", a, b)
	}
	return s
}

func build(t *testing.T) string {
	t.Helper()
	if m := Missing(); m != "" {
		t.Skip("cannot build libibverbs.so.1: " + m)
	}
	if _, err := exec.LookPath("objdump"); err != nil {
		t.Skip("objdump is not installed (Debian: binutils)")
	}
	dir, err := Build(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "libibverbs.so.1")
}

func diff(a, b []string) (onlyA, onlyB []string) {
	m := map[string]int{}
	for _, x := range a {
		m[x] |= 1
	}
	for _, x := range b {
		m[x] |= 2
	}
	for x, v := range m {
		switch v {
		case 1:
			onlyA = append(onlyA, x)
		case 2:
			onlyB = append(onlyB, x)
		}
	}
	sort.Strings(onlyA)
	sort.Strings(onlyB)
	return
}

// The built library exports exactly the versioned symbols the project
// recorded from the distribution's libibverbs.so.1.
func TestExportsMatchRecordedTable(t *testing.T) {
	lib := build(t)
	got := distExports(t, lib)
	b, err := os.ReadFile("c/libibverbs_exports.txt")
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		want = append(want, l)
	}
	sort.Strings(want)
	if len(want) != 193 {
		t.Errorf("recorded table has %d symbols, want the 193 of libibverbs 44", len(want))
	}
	if a, b := diff(want, got); len(a)+len(b) > 0 {
		t.Errorf("export table differs: missing %v, extra %v", a, b)
	}
	if out, err := exec.Command("readelf", "-d", lib).Output(); err == nil && !strings.Contains(string(out), "[libibverbs.so.1]") {
		t.Errorf("soname is not libibverbs.so.1:\n%s", out)
	}
}

// When the distribution's library is installed, ours exports the same table.
func TestExportsMatchSystemLibrary(t *testing.T) {
	sys := "/usr/lib/x86_64-linux-gnu/libibverbs.so.1"
	if _, err := os.Stat(sys); err != nil {
		t.Skip("the distribution's libibverbs.so.1 is not installed (Debian: libibverbs1)")
	}
	lib := build(t)
	if a, b := diff(exports(t, sys), distExports(t, lib)); len(a)+len(b) > 0 {
		t.Errorf("export table differs from %s: missing %v, extra %v", sys, a, b)
	}
}

// make -C abi (the checkout's way) builds a library with the same table.
func TestMakefileBuild(t *testing.T) {
	lib := build(t)
	if _, err := exec.LookPath("make"); err != nil {
		// Not a skip: CI installs no make, and softroce abi build needs none.
		t.Log("make is not installed: nothing to compare")
		return
	}
	out := t.TempDir()
	if b, err := exec.Command("make", "-C", "c", "B="+out).CombinedOutput(); err != nil {
		t.Fatalf("make: %v\n%s", err, b)
	}
	if a, b := diff(exports(t, lib), exports(t, filepath.Join(out, "libibverbs.so.1"))); len(a)+len(b) > 0 {
		t.Errorf("make's library differs: missing %v, extra %v", a, b)
	}
}
