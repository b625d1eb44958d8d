// Command testsummary reads `go test -json` on standard input and prints
// what a person needs from a long run: one line per package as it ends, the
// output of every failing test as it fails, then the counts of passed,
// failed and skipped tests and every skipped test with its skip message,
// grouped.
//
// Skips are matched against a list of expected ones (-expected FILE). With
// -strict, a skip the list does not expect fails the run: CI runs as root
// with the rdma_rxe VM enabled, where every test that depends only on the
// machine CI prepares must run.
//
// The list has one entry a line, each preceded by one comment line saying
// why the skip is legitimate:
//
//	# why this skip is expected
//	PACKAGE  TEST  MESSAGE
//
// PACKAGE and TEST are regular expressions that must match the whole
// package path (relative to the module, "nic/udp") and the whole test name
// ("TestNoAllocs", "TestX/sub"); MESSAGE is a regular expression searched
// for in the skip message and runs to the end of the line.
//
// The exit status is 1 when a test or package failed or did not finish,
// when a package did not build, or (with -strict) when a skip was not
// expected; 2 on bad usage or an unreadable list.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strings"
	"time"
)

func main() {
	expected := flag.String("expected", "", "`file` listing the skips that are expected")
	strict := flag.Bool("strict", false, "fail on a skip the list does not expect")
	list := flag.Bool("list", false, "also list every test that passed")
	module := flag.String("module", "github.com/softroce/softroce", "module path stripped from package names")
	flag.Parse()
	var exp []*Expect
	if *expected != "" {
		var err error
		if exp, err = ReadExpected(*expected); err != nil {
			fmt.Fprintln(os.Stderr, "testsummary:", err)
			os.Exit(2)
		}
	}
	s := &Summary{Out: os.Stdout, Expected: exp, Strict: *strict, ListPassed: *list, Module: *module}
	if err := s.Read(os.Stdin); err != nil {
		fmt.Fprintln(os.Stderr, "testsummary:", err)
		os.Exit(2)
	}
	if !s.Report() {
		os.Exit(1)
	}
}

// Expect is one entry of the expected-skip list.
type Expect struct {
	Why       string // the comment line above the entry
	Pkg, Test *regexp.Regexp
	Msg       *regexp.Regexp
	Line      int
	Text      string // the entry as written
	Matched   int
}

// ReadExpected parses an expected-skip list.
func ReadExpected(path string) ([]*Expect, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return ParseExpected(path, string(b))
}

// ParseExpected parses the text of an expected-skip list; name is used in
// errors.
func ParseExpected(name, text string) ([]*Expect, error) {
	var out []*Expect
	why := ""
	for i, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "":
			why = ""
			continue
		case strings.HasPrefix(line, "#"):
			why = strings.TrimSpace(strings.TrimPrefix(line, "#"))
			continue
		}
		f := strings.Fields(line)
		if len(f) < 3 {
			return nil, fmt.Errorf("%s:%d: want PACKAGE TEST MESSAGE, got %q", name, i+1, line)
		}
		if why == "" {
			return nil, fmt.Errorf("%s:%d: an expected skip needs a comment line above it saying why", name, i+1)
		}
		// MESSAGE is the rest of the line after the second field.
		rest := line
		for range 2 {
			rest = strings.TrimLeft(rest, " \t")
			rest = rest[strings.IndexAny(rest, " \t"):]
		}
		rest = strings.TrimSpace(rest)
		e := &Expect{Why: why, Line: i + 1, Text: line}
		for _, p := range []struct {
			dst  **regexp.Regexp
			expr string
		}{{&e.Pkg, "^(?:" + f[0] + ")$"}, {&e.Test, "^(?:" + f[1] + ")$"}, {&e.Msg, rest}} {
			re, err := regexp.Compile(p.expr)
			if err != nil {
				return nil, fmt.Errorf("%s:%d: %v", name, i+1, err)
			}
			*p.dst = re
		}
		out = append(out, e)
	}
	return out, nil
}

// Event is one line of `go test -json` (cmd/test2json), with the fields of
// build events (`go test -json` reports build output and failures too).
type Event struct {
	Time        time.Time
	Action      string
	Package     string
	ImportPath  string
	Test        string
	Elapsed     float64
	Output      string
	FailedBuild string
}

type testState struct {
	pkg, name string
	out       []string
	done      bool
}

type pkgState struct {
	name             string
	out              []string
	tests            map[string]*testState
	order            []string
	pass, fail, skip int
	done             bool
}

// Skip is one skipped test.
type Skip struct {
	Pkg, Test, Msg string
	Exp            *Expect
}

// Summary accumulates a run.
type Summary struct {
	Out        io.Writer
	Expected   []*Expect
	Strict     bool
	ListPassed bool
	Module     string

	pkgs       map[string]*pkgState
	pkgOrder   []string
	builds     map[string][]string
	buildFails []string
	pass, fail int
	skips      []Skip
	failed     []string // "pkg Test"
	passed     []string
	pkgFails   []string
	noTests    int
	events     int
	notJSON    int
}

func (s *Summary) short(pkg string) string {
	if pkg == s.Module {
		return "."
	}
	return strings.TrimPrefix(pkg, s.Module+"/")
}

func (s *Summary) pkg(name string) *pkgState {
	p := s.pkgs[name]
	if p == nil {
		p = &pkgState{name: name, tests: map[string]*testState{}}
		s.pkgs[name] = p
		s.pkgOrder = append(s.pkgOrder, name)
	}
	return p
}

// Read consumes the event stream, printing as packages end and tests fail.
func (s *Summary) Read(r io.Reader) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e Event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			// Not an event (go test prints some errors as plain text):
			// pass it on.
			s.notJSON++
			fmt.Fprintf(s.Out, "%s\n", line)
			continue
		}
		s.events++
		s.event(&e)
	}
	return sc.Err()
}

func (s *Summary) event(e *Event) {
	if s.pkgs == nil {
		s.pkgs = map[string]*pkgState{}
		s.builds = map[string][]string{}
	}
	switch e.Action {
	case "build-output":
		s.builds[e.ImportPath] = append(s.builds[e.ImportPath], e.Output)
		return
	case "build-fail":
		s.buildFails = append(s.buildFails, e.ImportPath)
		fmt.Fprintf(s.Out, "BUILD FAILED %s\n%s", s.short(e.ImportPath), strings.Join(s.builds[e.ImportPath], ""))
		return
	}
	if e.Package == "" {
		return
	}
	p := s.pkg(e.Package)
	if e.Test == "" {
		switch e.Action {
		case "output":
			p.out = append(p.out, e.Output)
		case "pass", "fail", "skip":
			s.endPackage(p, e)
		}
		return
	}
	t := p.tests[e.Test]
	if t == nil {
		t = &testState{pkg: e.Package, name: e.Test}
		p.tests[e.Test] = t
		p.order = append(p.order, e.Test)
	}
	switch e.Action {
	case "output":
		t.out = append(t.out, e.Output)
	case "pass":
		t.done = true
		p.pass++
		s.pass++
		s.passed = append(s.passed, s.short(e.Package)+" "+e.Test)
	case "skip":
		t.done = true
		p.skip++
		s.addSkip(e.Package, e.Test, SkipMessage(t.out))
	case "fail":
		t.done = true
		p.fail++
		s.fail++
		s.failed = append(s.failed, s.short(e.Package)+" "+e.Test)
		fmt.Fprintf(s.Out, "--- FAIL: %s %s (%.2fs)\n", s.short(e.Package), e.Test, e.Elapsed)
		for _, l := range t.out {
			if !isFrame(l) {
				fmt.Fprint(s.Out, l)
			}
		}
	}
}

// isFrame reports whether l is one of the test framework's own progress
// lines, which add nothing to a failure's output.
func isFrame(l string) bool {
	t := strings.TrimSpace(l)
	for _, p := range []string{"=== RUN", "=== PAUSE", "=== CONT", "=== NAME", "--- PASS", "--- SKIP", "--- FAIL"} {
		if strings.HasPrefix(t, p) {
			return true
		}
	}
	return false
}

func (s *Summary) endPackage(p *pkgState, e *Event) {
	p.done = true
	name := s.short(p.name)
	unfinished := 0
	for _, n := range p.order {
		if t := p.tests[n]; !t.done {
			unfinished++
			s.fail++
			s.failed = append(s.failed, name+" "+n+" (did not finish)")
			fmt.Fprintf(s.Out, "--- DID NOT FINISH: %s %s\n", name, n)
			for _, l := range t.out {
				if !isFrame(l) {
					fmt.Fprint(s.Out, l)
				}
			}
		}
	}
	counts := fmt.Sprintf("%d passed", p.pass)
	if p.fail+unfinished > 0 {
		counts += fmt.Sprintf(", %d failed", p.fail+unfinished)
	}
	if p.skip > 0 {
		counts += fmt.Sprintf(", %d skipped", p.skip)
	}
	switch {
	case e.Action == "skip" || e.Action == "pass" && len(p.order) == 0:
		// "[no test files]", or no test matched -run.
		s.noTests++
	case e.Action == "pass":
		fmt.Fprintf(s.Out, "ok    %-28s %7.1fs  %s\n", name, e.Elapsed, counts)
	default:
		s.pkgFails = append(s.pkgFails, name)
		fmt.Fprintf(s.Out, "FAIL  %-28s %7.1fs  %s\n", name, e.Elapsed, counts)
		if e.FailedBuild != "" {
			break
		}
		// The package's own output: TestMain's errors, a panic, a timeout.
		var own []string
		for _, l := range p.out {
			t := strings.TrimSpace(l)
			if t == "FAIL" || strings.HasPrefix(t, "FAIL\t") || strings.HasPrefix(t, "ok  \t") || t == "PASS" {
				continue
			}
			own = append(own, l)
		}
		if len(own) > 0 {
			fmt.Fprintf(s.Out, "    output of %s outside any test:\n", name)
			for _, l := range own {
				fmt.Fprint(s.Out, "    ", l)
			}
		}
	}
}

var logPrefix = regexp.MustCompile(`^\s*[^\s:]+\.go:\d+: `)

// SkipMessage extracts the skip message from a skipped test's output: the
// last log entry before "--- SKIP" (its first line carries the file:line
// prefix, which is dropped; continuation lines are kept, trimmed).
func SkipMessage(out []string) string {
	var entry []string
	for _, l := range out {
		if isFrame(l) {
			continue
		}
		l = strings.TrimRight(l, "\n")
		if m := logPrefix.FindString(l); m != "" {
			entry = []string{l[len(m):]}
			continue
		}
		if strings.TrimSpace(l) != "" {
			entry = append(entry, strings.TrimSpace(l))
		}
	}
	return strings.Join(entry, "\n")
}

func (s *Summary) addSkip(pkg, test, msg string) {
	sk := Skip{Pkg: s.short(pkg), Test: test, Msg: msg}
	for _, e := range s.Expected {
		if e.Pkg.MatchString(sk.Pkg) && e.Test.MatchString(test) && e.Msg.MatchString(msg) {
			sk.Exp = e
			e.Matched++
			break
		}
	}
	s.skips = append(s.skips, sk)
}

// Unexpected returns the skips the list does not expect.
func (s *Summary) Unexpected() []Skip {
	var u []Skip
	for _, k := range s.skips {
		if k.Exp == nil {
			u = append(u, k)
		}
	}
	return u
}

// Report prints the summary and reports whether the run is a success.
func (s *Summary) Report() bool {
	w := s.Out
	for _, n := range s.pkgOrder {
		if p := s.pkgs[n]; !p.done {
			// The stream ended inside the package (go test was killed).
			s.pkgFails = append(s.pkgFails, s.short(n)+" (no result)")
		}
	}
	unexp := s.Unexpected()
	fmt.Fprintf(w, "\n== summary: %d passed, %d failed, %d skipped (%d expected, %d not expected), counting subtests, in %d packages",
		s.pass, s.fail, len(s.skips), len(s.skips)-len(unexp), len(unexp), len(s.pkgOrder)-s.noTests)
	if s.noTests > 0 {
		fmt.Fprintf(w, " (and %d without tests to run)", s.noTests)
	}
	fmt.Fprintln(w)

	if s.ListPassed && len(s.passed) > 0 {
		fmt.Fprintln(w, "passed:")
		for _, t := range s.passed {
			fmt.Fprintf(w, "  %s\n", t)
		}
	}
	// Expected skips, grouped by list entry, in list order.
	for _, e := range s.Expected {
		if e.Matched == 0 {
			continue
		}
		fmt.Fprintf(w, "skipped as expected (%d): %s\n", e.Matched, e.Why)
		for _, k := range s.skips {
			if k.Exp == e {
				fmt.Fprintf(w, "  %s %s: %s\n", k.Pkg, k.Test, firstLine(k.Msg))
			}
		}
	}
	// Unexpected skips, grouped by message.
	if len(unexp) > 0 {
		label := "skipped, not in the expected list"
		if s.Strict {
			label = "skipped UNEXPECTEDLY (this run must not skip them)"
		}
		groups := map[string][]Skip{}
		var msgs []string
		for _, k := range unexp {
			if groups[k.Msg] == nil {
				msgs = append(msgs, k.Msg)
			}
			groups[k.Msg] = append(groups[k.Msg], k)
		}
		sort.SliceStable(msgs, func(i, j int) bool { return len(groups[msgs[i]]) > len(groups[msgs[j]]) })
		fmt.Fprintf(w, "%s (%d):\n", label, len(unexp))
		for _, m := range msgs {
			shown := m
			if shown == "" {
				shown = "(no message)"
			}
			fmt.Fprintf(w, "  %s\n", strings.ReplaceAll(shown, "\n", "\n    | "))
			for _, k := range groups[m] {
				fmt.Fprintf(w, "    %s %s\n", k.Pkg, k.Test)
			}
		}
	}
	if s.Strict {
		var stale []string
		for _, e := range s.Expected {
			if e.Matched == 0 {
				stale = append(stale, fmt.Sprintf("line %d: %s", e.Line, e.Text))
			}
		}
		if len(stale) > 0 {
			fmt.Fprintln(w, "expected skips that did not occur (fine where the condition does not hold here):")
			for _, t := range stale {
				fmt.Fprintf(w, "  %s\n", t)
			}
		}
	}
	ok := true
	var why []string
	if len(s.failed) > 0 {
		ok = false
		fmt.Fprintf(w, "failed (%d):\n", len(s.failed))
		for _, t := range s.failed {
			fmt.Fprintf(w, "  %s\n", t)
		}
		why = append(why, fmt.Sprintf("%d failed", len(s.failed)))
	}
	if len(s.buildFails) > 0 {
		ok = false
		why = append(why, fmt.Sprintf("%d did not build", len(s.buildFails)))
	}
	if len(s.pkgFails) > 0 {
		ok = false
		fmt.Fprintf(w, "packages failed: %s\n", strings.Join(s.pkgFails, ", "))
		why = append(why, fmt.Sprintf("%d package(s) failed", len(s.pkgFails)))
	}
	if s.Strict && len(unexp) > 0 {
		ok = false
		why = append(why, fmt.Sprintf("%d unexpected skip(s)", len(unexp)))
	}
	if s.events == 0 {
		ok = false
		why = append(why, "no test events on the input (was it `go test -json`?)")
	}
	if ok {
		fmt.Fprintln(w, "== PASS")
	} else {
		fmt.Fprintf(w, "== FAIL: %s\n", strings.Join(why, ", "))
	}
	return ok
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i] + " ..."
	}
	return s
}
