package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"net"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// flagToken finds flag names in a message: "-x" or "--name" at the start
// or after a space, a parenthesis or a quote (not inside a word such as
// go-back-N).
var flagToken = regexp.MustCompile("(?:^|[\\s(`'\"])--?([A-Za-z][A-Za-z0-9_-]*)")

func flagsIn(msg string) []string {
	var out []string
	for _, m := range flagToken.FindAllStringSubmatch(msg, -1) {
		out = append(out, strings.TrimRight(m[1], "-"))
	}
	return out
}

// commandFlags returns the flags `softroce CMD -h` lists.
func commandFlags(t *testing.T, cmd string) map[string]bool {
	t.Helper()
	c, ok := commands[cmd]
	if !ok {
		t.Fatalf("no command %q", cmd)
	}
	args := []string{"-h"}
	stdout, stderr := runOut(t, func() { c.run(args) })
	flags := map[string]bool{"h": true, "help": true}
	for _, line := range strings.Split(stdout+stderr, "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && strings.HasPrefix(line, "  -") {
			flags[strings.TrimPrefix(f[0], "-")] = true
		}
	}
	if len(flags) < 3 {
		t.Fatalf("softroce %s -h lists no flags:\n%s%s", cmd, stdout, stderr)
	}
	return flags
}

// adviceSources says which commands print each source's messages.
var adviceSources = map[string][]string{
	"bw.go":                            {"bw", "lat"},
	"bwplot.go":                        {"bw", "lat"},
	"latraw.go":                        {"lat"},
	"link.go":                          {"bw", "lat", "pingpong", "perftest", "serve"},
	"perftest.go":                      {"perftest"},
	"pingpong.go":                      {"pingpong"},
	"rping.go":                         {"rping"},
	"../../tools/rping/flags.go":       {"rping"},
	"../../tools/rping/rping.go":       {"rping"},
	"demo.go":                          {"demo"},
	"inspect.go":                       {"inspect", "demo"},
	"conformance.go":                   {"conformance"},
	"replay.go":                        nil, // conformance replay has its own flag set; replay_test.go tests its refusals
	"conformance_remote.go":            nil, // conformance remote has its own flag set; conformance_remote_test.go tests its refusals
	"main.go":                          nil,
	"gen.go":                           {"man"},   // completion's messages name no flag
	"serve.go":                         {"serve"}, // abi's and status's messages name no flag
	"run.go":                           {"run"},
	"rdma.go":                          {"rdma"},
	"run_devnode.go":                   {"run"},
	"../../tools/perftest/proto.go":    {"perftest"},
	"../../tools/perftest/run.go":      {"perftest"},
	"../../tools/perftest/traffic.go":  {"perftest"},
	"../../tools/perftest/rdmacm.go":   {"perftest"},
	"../../tools/pingpong/pingpong.go": {"pingpong"},
	"../../tools/pingpong/exchange.go": {"pingpong"},
	"../../tools/pingpong/dest.go":     {"pingpong"},
	"../../perf/link.go":               {"bw", "lat"},
	"../../perf/local.go":              {"bw", "lat"},
	"../../perf/oob.go":                {"bw", "lat"},
	"../../perf/perf.go":               {"bw", "lat"},
	"../../perf/report.go":             {"bw", "lat"},
	"../../perf/rawudp.go":             {"lat"},
}

// errorMessages returns the string literals of the error messages in a Go
// file: arguments of fmt.Errorf, errors.New, fail (bw's helper) and of
// fmt.Fprint* to os.Stderr.
func errorMessages(t *testing.T, path string) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var msgs []string
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		name := ""
		switch fn := call.Fun.(type) {
		case *ast.Ident:
			name = fn.Name
		case *ast.SelectorExpr:
			if x, ok := fn.X.(*ast.Ident); ok {
				name = x.Name + "." + fn.Sel.Name
			}
		}
		args := call.Args
		switch name {
		case "fmt.Errorf", "errors.New", "fail":
		case "fmt.Fprintf", "fmt.Fprintln", "fmt.Fprint":
			if len(args) == 0 {
				return true
			}
			if s, ok := args[0].(*ast.SelectorExpr); !ok || s.Sel.Name != "Stderr" {
				return true
			}
			args = args[1:]
		default:
			return true
		}
		for _, a := range args {
			ast.Inspect(a, func(n ast.Node) bool {
				if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
					if s, err := strconv.Unquote(lit.Value); err == nil {
						msgs = append(msgs, s)
					}
				}
				return true
			})
		}
		return true
	})
	return msgs
}

// TestErrorAdviceNamesRealFlags: every flag an error message of the
// command line (or of the packages it runs) tells the user to give is a
// flag of the command that prints it, as `softroce COMMAND -h` lists.
func TestErrorAdviceNamesRealFlags(t *testing.T) {
	// Every source file of the command is mapped, so a new one is checked.
	files, _ := filepath.Glob("*.go")
	for _, f := range files {
		if !strings.HasSuffix(f, "_test.go") {
			if _, ok := adviceSources[f]; !ok {
				t.Errorf("%s: say which commands print its messages (adviceSources)", f)
			}
		}
	}
	flags := map[string]map[string]bool{}
	checked := 0
	var paths []string
	for p := range adviceSources {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, path := range paths {
		for _, msg := range errorMessages(t, path) {
			for _, fl := range flagsIn(msg) {
				checked++
				for _, cmd := range adviceSources[path] {
					if flags[cmd] == nil {
						flags[cmd] = commandFlags(t, cmd)
					}
					if !flags[cmd][fl] {
						t.Errorf("%s: message %q names -%s, which `softroce %s` does not have", path, msg, fl, cmd)
					}
				}
			}
		}
	}
	if checked < 20 {
		t.Errorf("only %d flag names found in error messages: is the scan broken?", checked)
	}
	t.Logf("%d flag names in error messages checked", checked)
}

// TestBusyUDPPortAdvice: with the local UDP port taken, pingpong and
// perftest say so and name the flag that picks another (--udp-port; the
// backend's own message cannot know the command's flags).
func TestBusyUDPPortAdvice(t *testing.T) {
	busy, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Skipf("loopback UDP: %v", err)
	}
	defer busy.Close()
	port := strconv.Itoa(busy.LocalAddr().(*net.UDPAddr).Port)
	for _, c := range []struct {
		cmd  string
		args []string
	}{
		{"pingpong", []string{"--bind", "127.0.0.1", "--udp-port", port, "--timeout", "1s"}},
		{"perftest", []string{"write", "--bind", "127.0.0.1", "--udp-port", port, "--timeout", "1s"}},
	} {
		t.Run(c.cmd, func(t *testing.T) {
			var code int
			_, stderr := runOut(t, func() { code = commands[c.cmd].run(c.args) })
			if code != 1 || !strings.Contains(stderr, "UDP port "+port+" on 127.0.0.1 is in use") || !strings.Contains(stderr, "--udp-port") {
				t.Fatalf("exit %d, stderr:\n%s", code, stderr)
			}
			flags := commandFlags(t, c.cmd)
			for _, fl := range flagsIn(stderr) {
				if !flags[fl] {
					t.Errorf("the message names -%s, which `softroce %s` does not have:\n%s", fl, c.cmd, stderr)
				}
			}
		})
	}
}
