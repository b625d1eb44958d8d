package main

import (
	"bytes"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/softroce/softroce/tools/rping"
)

// TestFlagSetsCoverCommands: the man pages and completions know every
// command, and each flag set they see is the one the command parses (its
// -h lists the same flags).
func TestFlagSetsCoverCommands(t *testing.T) {
	for _, n := range commandNames() {
		f := flagSets[n]
		if f == nil {
			t.Errorf("command %s has no entry in flagSets: add its flag set function", n)
			continue
		}
		if n == "rping" { // getopt-style: TestRpingFlagsMatchUsage
			continue
		}
		var got []string
		f()[0].VisitAll(func(fl *flag.Flag) { got = append(got, fl.Name) })
		if len(got) == 0 {
			continue // completion: nothing to compare
		}
		var want []string
		for name := range commandFlags(t, n) {
			if name != "h" && name != "help" {
				want = append(want, name)
			}
		}
		sort.Strings(want)
		sort.Strings(got)
		if !slices.Equal(got, want) {
			t.Errorf("%s: flag set has %v, -h lists %v", n, got, want)
		}
	}
	for n := range flagSets {
		if _, ok := commands[n]; !ok {
			t.Errorf("flagSets has %s, which is no command", n)
		}
	}
}

// TestRpingFlagsMatchUsage: rping's flag set, which only describes
// rping.Parse's options, names each option rping's usage names.
func TestRpingFlagsMatchUsage(t *testing.T) {
	var b bytes.Buffer
	rping.Usage(&b)
	var inUsage []string
	for _, l := range strings.Split(b.String(), "\n") {
		if f := strings.Fields(l); len(f) > 0 && strings.HasPrefix(l, "  -") {
			inUsage = append(inUsage, strings.TrimLeft(f[0], "-"))
		}
	}
	var got []string
	rpingFlags().VisitAll(func(fl *flag.Flag) { got = append(got, fl.Name) })
	sort.Strings(inUsage)
	sort.Strings(got)
	if len(inUsage) < 10 || !slices.Equal(got, inUsage) {
		t.Errorf("rpingFlags has %v, rping's usage lists %v", got, inUsage)
	}
}

// TestManPages: every command has a page naming each of its flags, with
// the flag's usage; softroce(1) lists every command.
func TestManPages(t *testing.T) {
	var top bytes.Buffer
	if err := writeManPage(&top, ""); err != nil {
		t.Fatal(err)
	}
	for _, n := range commandNames() {
		if !strings.Contains(top.String(), ".B "+roff(n)+"\n") || !strings.Contains(top.String(), ".BR softroce-"+roff(n)+" (1)") {
			t.Errorf("softroce(1) does not list %s", n)
		}
		var b bytes.Buffer
		if err := writeManPage(&b, n); err != nil {
			t.Fatal(err)
		}
		page := b.String()
		if !strings.HasPrefix(page, ".TH SOFTROCE-"+strings.ToUpper(n)+" 1 ") || !strings.Contains(page, ".SH NAME\nsoftroce-"+n+` \- `) {
			t.Errorf("%s: page header:\n%.200s", n, page)
		}
		for _, fs := range flagSets[n]() {
			fs.VisitAll(func(f *flag.Flag) {
				_, usage := flag.UnquoteUsage(f)
				first, _, _ := strings.Cut(usage, "\n")
				if !strings.Contains(page, ".B "+roff(flagName(f.Name))) || !strings.Contains(page, roff(first)) {
					t.Errorf("%s: page lacks %s (%q)", n, flagName(f.Name), first)
				}
			})
		}
	}
	// The inspect page carries its synopsis and description.
	var b bytes.Buffer
	writeManPage(&b, "inspect")
	for _, want := range []string{".SH SYNOPSIS\n.nf\nsoftroce inspect [\\-v]", ".SH DESCRIPTION\n.nf\nDecodes RoCEv2", ".B \\-Y \\fIEXPR\\fR"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("inspect page lacks %q:\n%s", want, b.String())
		}
	}
	// --dir writes them all; groff, when installed, reads them cleanly.
	dir := t.TempDir()
	var code int
	_, errOut := runOut(t, func() { code = run([]string{"man", "--dir", dir}) })
	pages, _ := filepath.Glob(filepath.Join(dir, "*.1"))
	if code != 0 || len(pages) != len(commands)+1 {
		t.Fatalf("man --dir: exit %d, %d pages, want %d: %s", code, len(pages), len(commands)+1, errOut)
	}
	if groff, err := exec.LookPath("groff"); err == nil {
		for _, p := range pages {
			out, err := exec.Command(groff, "-man", "-Tutf8", "-ww", "-z", p).CombinedOutput()
			if err != nil || len(out) > 0 {
				t.Errorf("groff %s: %v %s", filepath.Base(p), err, out)
			}
		}
	} else {
		t.Log("groff not installed: the pages' roff is not checked")
	}
}

// TestCompletion: the bash script completes every command and, in that
// command's branch, each of its flags, and bash -n accepts it; likewise
// the zsh script with zsh -n when zsh is installed.
func TestCompletion(t *testing.T) {
	scripts := map[string]string{}
	for _, sh := range []string{"bash", "zsh"} {
		var code int
		out, errOut := runOut(t, func() { code = run([]string{"completion", sh}) })
		if code != 0 {
			t.Fatalf("completion %s: exit %d: %s", sh, code, errOut)
		}
		scripts[sh] = out
	}
	bash := scripts["bash"]
	for _, n := range commandNames() {
		i := strings.Index(bash, "\n\t"+n+")\n")
		if i < 0 {
			t.Errorf("bash: no branch for %s", n)
			continue
		}
		branch, _, _ := strings.Cut(bash[i+1:], ";;\n")
		for _, f := range commandFlagList(n) {
			if !strings.Contains(branch, " "+flagName(f.Name)+" ") && !strings.Contains(branch, "\""+flagName(f.Name)+" ") && !strings.Contains(branch, " "+flagName(f.Name)+"\"") && !strings.Contains(branch, "\""+flagName(f.Name)+"\"") {
				t.Errorf("bash: %s branch lacks %s:\n%s", n, flagName(f.Name), branch)
			}
		}
		if !strings.Contains(scripts["zsh"], "\n\t"+n+")\n") {
			t.Errorf("zsh: no branch for %s", n)
		}
		for _, f := range commandFlagList(n) {
			if !strings.Contains(scripts["zsh"], "'"+flagName(f.Name)+"[") {
				t.Errorf("zsh: lacks %s of %s", flagName(f.Name), n)
			}
		}
	}
	for _, sh := range []string{"bash", "zsh"} {
		t.Run(sh+" -n", func(t *testing.T) {
			path, err := exec.LookPath(sh)
			if err != nil {
				t.Skipf("%s is not installed: its completion script's syntax is not checked", sh)
			}
			f := filepath.Join(t.TempDir(), "softroce."+sh)
			if err := os.WriteFile(f, []byte(scripts[sh]), 0o644); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command(path, "-n", f).CombinedOutput(); err != nil {
				t.Errorf("%s -n: %v\n%s", sh, err, out)
			}
			if sh != "zsh" {
				return
			}
			// The completion system's functions stubbed to print what they
			// are given: the script hands _arguments inspect's flags.
			probe := `_arguments() { print -rl -- "$@" }; _describe() { print -r -- describe "$2" }; _values() { print -r -- values }
words=(softroce inspect -); CURRENT=3; source ` + f + `
words=(softroce i); CURRENT=2; source ` + f
			out, err := exec.Command(path, "-f", "-c", probe).CombinedOutput()
			for _, want := range []string{"\n-Y[list only the packets the display filter EXPR matches", "]:EXPR: \n", "]:FILE:_files\n", "\n--json[write JSON Lines", "\n*:file:_files\n", "describe cmds\n"} {
				if err != nil || !strings.Contains("\n"+string(out), want) {
					t.Errorf("zsh completion probe (%v) lacks %q:\n%s", err, want, out)
				}
			}
		})
	}
	// The bash script completes: a command's flags, and files after a
	// flag that takes a value (an empty reply, bash's default).
	if _, err := exec.LookPath("bash"); err == nil {
		probe := bash + `
COMP_WORDS=(softroce inspect --no); COMP_CWORD=2; _softroce; echo "${COMPREPLY[*]}"
COMP_WORDS=(softroce ins); COMP_CWORD=1; _softroce; echo "${COMPREPLY[*]}"
COMP_WORDS=(softroce perftest w); COMP_CWORD=2; _softroce; echo "${COMPREPLY[*]}"
COMP_WORDS=(softroce inspect --diagram ""); COMP_CWORD=3; _softroce; echo "[${COMPREPLY[*]}]"
`
		out, err := exec.Command("bash", "-c", probe).CombinedOutput()
		if want := "--no-summary\ninspect\nwrite\n[]\n"; err != nil || string(out) != want {
			t.Errorf("bash completion gave %q (%v), want %q", out, err, want)
		}
	}
}
