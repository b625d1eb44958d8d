package main

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
)

// A small module whose tests pass, fail, skip with and without a listed
// reason, and skip inside a subtest: run through the real `go test -json`
// so the parser is checked against what the toolchain emits.
var fixture = map[string]string{
	"go.mod": "module example.com/fx\n\ngo 1.22\n",
	"a/a_test.go": `package a

import "testing"

func TestPass(t *testing.T) {}

func TestFail(t *testing.T) {
	t.Log("context line")
	t.Error("boom: the answer was 41")
}

func TestSkipListed(t *testing.T) {
	t.Log("an earlier log line is not the message")
	t.Skip("shared captures absent: ../shared/captures")
}

func TestSkipOther(t *testing.T) { t.Skip("needs a unicorn") }

func TestParent(t *testing.T) {
	t.Run("child", func(t *testing.T) { t.Skipf("needs a unicorn") })
	t.Run("ok", func(t *testing.T) {})
}
`,
	"b/b_test.go": `package b

import "testing"

func TestSkipMultiline(t *testing.T) { t.Skip("first line\nsecond line") }
`,
	"c/c.go": "package c\n",
}

const fixtureList = `# captures are not in the repository
.*  TestSkip.*  ^shared captures absent:
# never matches
nic/none  TestX  nothing
`

func runFixture(t *testing.T) []byte {
	t.Helper()
	if testing.Short() {
		t.Skip("builds a module with go test")
	}
	dir := t.TempDir()
	for name, text := range fixture {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
	cmd := exec.Command(goBin, "test", "-count=1", "-json", "./...")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=", "GOWORK=off")
	out, err := cmd.Output()
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatalf("go test: %v", err)
	}
	return out
}

func summarize(t *testing.T, in []byte, strict bool) (string, bool, *Summary) {
	t.Helper()
	exp, err := ParseExpected("list", fixtureList)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	s := &Summary{Out: &out, Expected: exp, Strict: strict, Module: "example.com/fx"}
	if err := s.Read(bytes.NewReader(in)); err != nil {
		t.Fatal(err)
	}
	ok := s.Report()
	return out.String(), ok, s
}

func TestRealGoTestJSON(t *testing.T) {
	in := runFixture(t)
	out, ok, s := summarize(t, in, false)
	t.Logf("summary:\n%s", out)
	if ok {
		t.Error("a run with a failing test reported success")
	}
	for _, want := range []string{
		"--- FAIL: a TestFail",
		"boom: the answer was 41",
		"context line",
		"FAIL  a ",
		"ok    b ",
		"== summary: 3 passed, 1 failed, 4 skipped (1 expected, 3 not expected), counting subtests, in 2 packages (and 1 without tests to run)\n",
		"skipped as expected (1): captures are not in the repository",
		"  a TestSkipListed: shared captures absent: ../shared/captures",
		"skipped, not in the expected list (3):",
		"  needs a unicorn\n    a TestSkipOther\n    a TestParent/child\n",
		"  first line\n    | second line\n    b TestSkipMultiline\n",
		// TestParent passes: a skipped subtest is not a failure.
		"failed (1):\n  a TestFail\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q", want)
		}
	}
	// A passing test's output and the framework's lines are not shown.
	for _, not := range []string{"=== RUN", "--- PASS", "--- FAIL: TestFail", "an earlier log line"} {
		if strings.Contains(out, not) {
			t.Errorf("summary shows %q", not)
		}
	}
	if len(s.Unexpected()) != 3 {
		t.Errorf("%d unexpected skips, want 3", len(s.Unexpected()))
	}
}

// events builds a go test -json stream from lines "Action Package Test Output".
func events(lines ...string) []byte {
	var b bytes.Buffer
	for _, l := range lines {
		b.WriteString(l)
		b.WriteByte('\n')
	}
	return b.Bytes()
}

const (
	evPassPkg = `{"Action":"pass","Package":"example.com/fx/p","Elapsed":0.1}`
	evRun     = `{"Action":"run","Package":"example.com/fx/p","Test":"TestS"}`
	evOut     = `{"Action":"output","Package":"example.com/fx/p","Test":"TestS","Output":"    p_test.go:9: needs a unicorn\n"}`
	evSkip    = `{"Action":"skip","Package":"example.com/fx/p","Test":"TestS"}`
	evRunP    = `{"Action":"run","Package":"example.com/fx/p","Test":"TestP"}`
	evPass    = `{"Action":"pass","Package":"example.com/fx/p","Test":"TestP"}`
)

func TestStrictFailsOnUnexpectedSkip(t *testing.T) {
	in := events(evRunP, evPass, evRun, evOut, evSkip, evPassPkg)
	out, ok, _ := summarize(t, in, false)
	if !ok {
		t.Errorf("non-strict run with an unexpected skip failed:\n%s", out)
	}
	out, ok, _ = summarize(t, in, true)
	if ok {
		t.Errorf("strict run with an unexpected skip passed:\n%s", out)
	}
	for _, want := range []string{"skipped UNEXPECTEDLY", "1 unexpected skip(s)", "expected skips that did not occur", "line 2: .*  TestSkip.*"} {
		if !strings.Contains(out, want) {
			t.Errorf("strict summary lacks %q:\n%s", want, out)
		}
	}
	// The same skip, listed: strict passes.
	listed := strings.Replace(string(in), "needs a unicorn", "shared captures absent: x", 1)
	listed = strings.ReplaceAll(listed, `"TestS"`, `"TestSkipX"`)
	if out, ok, _ := summarize(t, []byte(listed), true); !ok {
		t.Errorf("strict run with only expected skips failed:\n%s", out)
	}
}

func TestUnfinishedAndBuildFailure(t *testing.T) {
	// A test that started and never ended (go test's timeout panics the
	// binary) fails the run and shows its output; so does a build failure.
	in := events(evRun, `{"Action":"output","Package":"example.com/fx/p","Test":"TestS","Output":"    p_test.go:3: waiting\n"}`,
		`{"Action":"output","Package":"example.com/fx/p","Output":"panic: test timed out after 1s\n"}`,
		`{"Action":"fail","Package":"example.com/fx/p","Elapsed":1}`,
		`{"ImportPath":"example.com/fx/q","Action":"build-output","Output":"q.go:1: syntax error\n"}`,
		`{"ImportPath":"example.com/fx/q","Action":"build-fail"}`,
		`{"Action":"fail","Package":"example.com/fx/q","FailedBuild":"example.com/fx/q"}`)
	out, ok, _ := summarize(t, in, false)
	if ok {
		t.Errorf("run with an unfinished test and a build failure passed:\n%s", out)
	}
	for _, want := range []string{"--- DID NOT FINISH: p TestS", "waiting", "panic: test timed out", "BUILD FAILED q", "q.go:1: syntax error", "p TestS (did not finish)"} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s", want, out)
		}
	}
}

func TestTruncatedStreamFails(t *testing.T) {
	// The stream ends inside a package: go test was killed.
	out, ok, _ := summarize(t, events(evRunP, evPass), false)
	if ok || !strings.Contains(out, "p (no result)") {
		t.Errorf("truncated stream passed:\n%s", out)
	}
	out, ok, _ = summarize(t, nil, false)
	if ok || !strings.Contains(out, "no test events") {
		t.Errorf("empty input passed:\n%s", out)
	}
}

func TestSkipMessage(t *testing.T) {
	for _, c := range []struct {
		out  []string
		want string
	}{
		{[]string{"=== RUN   TestX\n", "    x_test.go:12: msg here\n", "--- SKIP: TestX (0.00s)\n"}, "msg here"},
		{[]string{"=== RUN   TestX/sub\n", "        x_test.go:4: a\n", "        x_test.go:5: b: c\n", "            more\n", "    --- SKIP: TestX/sub (0.00s)\n"}, "b: c\nmore"},
		{[]string{"=== RUN   TestX\n", "--- SKIP: TestX (0.00s)\n"}, ""},
	} {
		if got := SkipMessage(c.out); got != c.want {
			t.Errorf("SkipMessage(%q) = %q, want %q", c.out, got, c.want)
		}
	}
}

func TestParseExpected(t *testing.T) {
	if _, err := ParseExpected("l", "nic/udp TestX msg\n"); err == nil || !strings.Contains(err.Error(), "comment line") {
		t.Errorf("entry without a reason accepted: %v", err)
	}
	if _, err := ParseExpected("l", "# why\nnic/udp TestX\n"); err == nil {
		t.Error("entry without a message accepted")
	}
	if _, err := ParseExpected("l", "# why\nnic/udp Test( msg\n"); err == nil {
		t.Error("bad regular expression accepted")
	}
	e, err := ParseExpected("l", "# why\nnic/udp  TestNoAllocs   ^allocation counts are  not\n")
	if err != nil || len(e) != 1 {
		t.Fatal(err)
	}
	if !e[0].Pkg.MatchString("nic/udp") || e[0].Pkg.MatchString("nic/udp2") || e[0].Pkg.MatchString("x/nic/udp") {
		t.Error("package pattern is not matched whole")
	}
	if !e[0].Test.MatchString("TestNoAllocs") || e[0].Test.MatchString("TestNoAllocsX") {
		t.Error("test pattern is not matched whole")
	}
	if !e[0].Msg.MatchString("allocation counts are  not meaningful") || e[0].Why != "why" {
		t.Errorf("message pattern %q, reason %q", e[0].Msg, e[0].Why)
	}
	// Equal fields: the message starts after the second one.
	e, err = ParseExpected("l", "# why\n.*  .*\t ^shared captures absent: x\n")
	if err != nil || e[0].Msg.String() != "^shared captures absent: x" || !e[0].Msg.MatchString("shared captures absent: x y") {
		t.Errorf("message pattern %q, %v", e[0].Msg, err)
	}
}

// TestRepositoryList: the list CI uses parses, and every entry says why.
func TestRepositoryList(t *testing.T) {
	exp, err := ReadExpected("../../../.ci/expected-skips")
	if err != nil {
		t.Fatal(err)
	}
	if len(exp) == 0 {
		t.Fatal("empty list")
	}
	for _, e := range exp {
		t.Logf("line %d: %s  (%s)", e.Line, e.Text, e.Why)
	}
}

// TestCIRunsTheREADMECommand: .ci/run runs the README's test command with
// -json into this program (strict, with the expected list), under
// pipefail so that a failing go test fails CI whatever the summary says,
// and runs the allocation tests without -race.
func TestCIRunsTheREADMECommand(t *testing.T) {
	readme, err := os.ReadFile("../../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	ci, err := os.ReadFile("../../../.ci/run")
	if err != nil {
		t.Fatal(err)
	}
	var cmd string
	for _, l := range strings.Split(string(readme), "\n") {
		if strings.HasPrefix(l, "SOFTROCE_RXE=1 go test ") {
			cmd, _, _ = strings.Cut(l, "#")
			cmd = strings.TrimSpace(cmd)
			break
		}
	}
	if !strings.HasSuffix(cmd, " ./...") {
		t.Fatalf("README has no `SOFTROCE_RXE=1 go test ... ./...` line (found %q)", cmd)
	}
	want := strings.TrimSuffix(cmd, " ./...") + " -json ./... \\\n  | go run ./internal/ci/testsummary -strict -expected .ci/expected-skips"
	script := string(ci)
	if !strings.Contains(script, want) {
		t.Errorf(".ci/run does not run the README's command as\n%s", want)
	}
	if i, j := strings.Index(script, "set -euo pipefail"), strings.Index(script, want); i < 0 || i > j {
		t.Error(".ci/run does not set pipefail before the test command")
	}
	if !strings.Contains(script, "go test -count=1 -run 'NoAlloc|Allocs$' -json ./... \\\n  | go run ./internal/ci/testsummary -strict") {
		t.Error(".ci/run does not run the allocation tests without -race")
	}
}

// TestAllocationTestPattern: every test of the repository that calls
// testing.AllocsPerRun matches the -run pattern .ci/run uses for its run
// without -race, and the pattern matches no other test.
func TestAllocationTestPattern(t *testing.T) {
	ci, err := os.ReadFile("../../../.ci/run")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`go test -count=1 -run '([^']+)' -json`).FindSubmatch(ci)
	if m == nil {
		t.Fatal(".ci/run has no allocation test step")
	}
	pat := regexp.MustCompile(string(m[1]))
	// Two passes: helpers (test-file functions that are not tests) that call
	// AllocsPerRun, per package directory; then the tests, which measure
	// allocations when they call AllocsPerRun or such a helper.
	type fileFuncs struct {
		dir   string
		path  string
		funcs []*ast.FuncDecl
	}
	var files []fileFuncs
	err = filepath.WalkDir("../../..", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
		if err != nil {
			return err
		}
		ff := fileFuncs{dir: filepath.Dir(path), path: path}
		for _, decl := range f.Decls {
			if fn, ok := decl.(*ast.FuncDecl); ok && fn.Recv == nil && fn.Body != nil {
				ff.funcs = append(ff.funcs, fn)
			}
		}
		files = append(files, ff)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	callsAllocs := func(body ast.Node, helpers map[string]bool) bool {
		found := false
		ast.Inspect(body, func(n ast.Node) bool {
			switch x := n.(type) {
			case *ast.SelectorExpr:
				// AllocsPerRun, or a count of MemStats.Mallocs (a test
				// that needs GOMAXPROCS above 1, which AllocsPerRun
				// sets to 1).
				found = found || x.Sel.Name == "AllocsPerRun" || x.Sel.Name == "Mallocs"
			case *ast.CallExpr:
				if id, ok := x.Fun.(*ast.Ident); ok && helpers[id.Name] {
					found = true
				}
			}
			return true
		})
		return found
	}
	helpers := map[string]map[string]bool{} // directory -> helper names
	for _, ff := range files {
		for _, fn := range ff.funcs {
			if !strings.HasPrefix(fn.Name.Name, "Test") && callsAllocs(fn.Body, nil) {
				if helpers[ff.dir] == nil {
					helpers[ff.dir] = map[string]bool{}
				}
				helpers[ff.dir][fn.Name.Name] = true
			}
		}
	}
	var allocTests []string
	for _, ff := range files {
		for _, fn := range ff.funcs {
			if !strings.HasPrefix(fn.Name.Name, "Test") {
				continue
			}
			allocs := callsAllocs(fn.Body, helpers[ff.dir])
			path, name := ff.path, fn.Name.Name
			switch {
			case allocs && !pat.MatchString(name):
				t.Errorf("%s: %s measures allocations but does not match .ci/run's -run %q: rename it", path, name, pat)
			case !allocs && pat.MatchString(name):
				t.Errorf("%s: %s matches .ci/run's -run %q but measures no allocations", path, name, pat)
			case allocs:
				allocTests = append(allocTests, path+": "+name)
			}
		}
	}
	if len(allocTests) < 5 {
		t.Errorf("only %d allocation tests found: %v", len(allocTests), allocTests)
	}
	t.Logf("allocation tests: %s", strings.Join(allocTests, ", "))
}
