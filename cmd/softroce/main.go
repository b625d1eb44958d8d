// Command softroce is the command line of the softroce RoCEv2 stack: a
// demo, a capture inspector, perftest- and ibv_rc_pingpong-compatible
// tools, and the conformance harness.
//
// Each subcommand lives in its own file and registers itself in init.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"sort"
)

// command is one subcommand: run gets the arguments after its name and
// returns the process exit code.
type command struct {
	summary string
	run     func(args []string) int
}

var commands = map[string]command{}

// hidden are commands softroce runs itself, left out of the usage.
var hidden = map[string]func(args []string) int{}

func register(name, summary string, run func(args []string) int) {
	commands[name] = command{summary: summary, run: run}
}

func usage(w io.Writer) {
	fmt.Fprintf(w, "softroce: a userspace RoCEv2 stack\n\nUsage: softroce COMMAND [flags] [args]\n\nCommands:\n")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-12s %s\n", n, commands[n].summary)
	}
	fmt.Fprintf(w, "  %-12s %s\n", "help", "help COMMAND: a command's flags (as softroce COMMAND -h)")
	fmt.Fprintf(w, "  %-12s %s\n", "version", "the module version and the commit it was built from (also --version)")
	fmt.Fprintf(w, "\nRun 'softroce COMMAND -h' for a command's flags.\n")
}

// isHelp reports whether arg asks for help, as package flag reads it.
func isHelp(arg string) bool {
	return arg == "-h" || arg == "--h" || arg == "-help" || arg == "--help"
}

// parseFlags parses args into fs. Exit codes when !ok: 0 when help was
// asked for (fs printed its usage), 2 on a usage error (fs printed it).
func parseFlags(fs *flag.FlagSet, args []string) (code int, ok bool) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0, false
		}
		return 2, false
	}
	return 0, true
}

// version describes the build: the module version ("(devel)" when built
// from a checkout) and, when the build recorded them, the commit, its
// time and whether the tree had uncommitted changes.
func version(bi *debug.BuildInfo, ok bool) string {
	if !ok || bi == nil {
		return "softroce: no build information in this binary"
	}
	v := bi.Main.Version
	if v == "" {
		v = "(devel)"
	}
	path := bi.Main.Path
	if path == "" {
		path = "github.com/softroce/softroce"
	}
	s := fmt.Sprintf("softroce %s %s", path, v)
	set := map[string]string{}
	for _, kv := range bi.Settings {
		set[kv.Key] = kv.Value
	}
	if rev := set["vcs.revision"]; rev != "" {
		s += " commit " + rev
		if t := set["vcs.time"]; t != "" {
			s += " (" + t + ")"
		}
		if set["vcs.modified"] == "true" {
			s += " with uncommitted changes"
		}
	} else if v == "(devel)" {
		s += " (no commit recorded: build with -buildvcs=true from a git checkout)"
	}
	if bi.GoVersion != "" {
		s += ", " + bi.GoVersion
	}
	return s
}

// run is main without the exit: the code softroce exits with.
func run(args []string) int {
	if len(args) == 0 {
		usage(os.Stderr)
		return 2
	}
	name, rest := args[0], args[1:]
	switch {
	case isHelp(name):
		usage(os.Stdout)
		return 0
	case name == "help":
		if len(rest) == 0 {
			usage(os.Stdout)
			return 0
		}
		c, ok := commands[rest[0]]
		if !ok {
			fmt.Fprintf(os.Stderr, "softroce help: unknown command %q\n\n", rest[0])
			usage(os.Stderr)
			return 2
		}
		c.run([]string{"-h"})
		return 0
	case name == "version" || name == "--version" || name == "-version":
		fmt.Println(version(debug.ReadBuildInfo()))
		return 0
	}
	if h, ok := hidden[name]; ok {
		return h(rest)
	}
	c, ok := commands[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "softroce: unknown command %q\n\n", name)
		usage(os.Stderr)
		return 2
	}
	// Every command's help exits 0, whatever its own parser returns.
	if len(rest) > 0 && isHelp(rest[0]) {
		c.run(rest[:1])
		return 0
	}
	return c.run(rest)
}

func main() {
	os.Exit(run(os.Args[1:]))
}
