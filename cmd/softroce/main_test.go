package main

import (
	"runtime/debug"
	"strings"
	"testing"
)

// TestHelpExitsZero: every command's -h and --help print its usage and
// exit 0; a flag it does not know is a usage error, exit 2 (rping keeps
// rdmacm-utils' rping's codes).
func TestHelpExitsZero(t *testing.T) {
	for name := range commands {
		for _, h := range []string{"-h", "--help"} {
			var code int
			out, errOut := runOut(t, func() { code = run([]string{name, h}) })
			if code != 0 || !strings.Contains(out+errOut, "sage") {
				t.Errorf("softroce %s %s: exit %d, want 0 and the usage:\n%s%s", name, h, code, out, errOut)
			}
		}
		if name == "rping" {
			continue
		}
		var code int
		runOut(t, func() { code = run([]string{name, "--no-such-flag"}) })
		if code != 2 {
			t.Errorf("softroce %s --no-such-flag: exit %d, want 2", name, code)
		}
	}
	// Help asked for after other flags, or after perftest's test word.
	for _, args := range [][]string{{"demo", "--mtu", "512", "-h"}, {"perftest", "write", "-h"}, {"bw", "--backend", "pipe", "--help"}, {"inspect", "--json", "-h"}, {"serve", "--bind", "127.0.0.1", "-h"}, {"status", "--json", "-h"}, {"run", "--dev-nodes=false", "-h"}} {
		var code int
		runOut(t, func() { code = run(args) })
		if code != 0 {
			t.Errorf("softroce %s: exit %d, want 0", strings.Join(args, " "), code)
		}
	}
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"help", "inspect"}, 0, "Usage: softroce inspect [-v] [--json] [--strict] [--no-summary] [--jobs N]"},
		{[]string{"help", "demo"}, 0, "Usage: softroce demo [--impair SPEC]"},
		{[]string{"help"}, 0, "Run 'softroce COMMAND -h'"},
		{[]string{"--help"}, 0, "Commands:"},
		{[]string{"help", "nonsense"}, 2, `unknown command "nonsense"`},
		{[]string{"nonsense"}, 2, `unknown command "nonsense"`},
		{nil, 2, "Commands:"},
	} {
		var code int
		out, errOut := runOut(t, func() { code = run(c.args) })
		if code != c.code || !strings.Contains(out+errOut, c.want) {
			t.Errorf("softroce %s: exit %d, want %d and %q:\n%s%s", strings.Join(c.args, " "), code, c.code, c.want, out, errOut)
		}
	}
}

func TestVersion(t *testing.T) {
	for _, arg := range []string{"--version", "version"} {
		var code int
		out, _ := runOut(t, func() { code = run([]string{arg}) })
		if code != 0 || !strings.HasPrefix(out, "softroce ") {
			t.Errorf("softroce %s: exit %d, %q", arg, code, out)
		}
	}
	bi := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/softroce/softroce", Version: "(devel)"},
		Settings: []debug.BuildSetting{{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: "4f12bb0abc"},
			{Key: "vcs.time", Value: "2026-12-02T01:00:00Z"}, {Key: "vcs.modified", Value: "true"}}}
	if got, want := version(bi, true), "softroce github.com/softroce/softroce (devel) commit 4f12bb0abc (2026-12-02T01:00:00Z) with uncommitted changes, go1.26.8"; got != want {
		t.Errorf("checkout build:\n got %q\nwant %q", got, want)
	}
	bi.Settings[3].Value = "false"
	if got := version(bi, true); strings.Contains(got, "uncommitted") || !strings.Contains(got, "commit 4f12bb0abc") {
		t.Errorf("clean checkout: %q", got)
	}
	bi = &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/softroce/softroce", Version: "v0.3.0"}}
	if got, want := version(bi, true), "softroce github.com/softroce/softroce v0.3.0, go1.26.8"; got != want {
		t.Errorf("module build: %q, want %q", got, want)
	}
}
