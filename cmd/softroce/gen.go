package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/softroce/softroce/tools/perftest"
	"github.com/softroce/softroce/tools/pingpong"
)

func init() {
	register("man", "write the man pages: softroce man [COMMAND] (roff to stdout), softroce man --dir DIR (all of them)", runMan)
	register("completion", "print a shell completion script: softroce completion bash|zsh", runCompletion)
}

// flagSets returns each command's flag sets, as its run function defines
// them, without running it: the first is the command's own, the others
// its subcommands' (conformance remote, conformance replay). The man
// pages and completions are made from them; TestFlagSetsCoverCommands
// checks that every command has an entry.
var flagSets = map[string]func() []*flag.FlagSet{
	"abi":  func() []*flag.FlagSet { fs, _ := abiFlags(); return sets(fs) },
	"bw":   func() []*flag.FlagSet { return sets(perfFlagSet("bw", new(perfFlags))) },
	"lat":  func() []*flag.FlagSet { return sets(perfFlagSet("lat", new(perfFlags))) },
	"demo": func() []*flag.FlagSet { fs, _, _, _, _, _ := demoFlags(); return sets(fs) },
	"conformance": func() []*flag.FlagSet {
		fs, _, _, _, _, _ := conformanceFlags()
		remote, _, _, _, _, _, _, _, _, _, _, _, _ := conformanceRemoteFlags()
		replay, _, _, _ := replayFlags()
		return sets(fs, remote, replay)
	},
	"inspect": func() []*flag.FlagSet { fs, _ := inspectFlags(); return sets(fs) },
	"perftest": func() []*flag.FlagSet {
		fs, _, _, _, _, _, _, _, _, _ := perftestFlags(new(perftest.Config), new(linkFlags))
		return sets(fs)
	},
	"pingpong": func() []*flag.FlagSet {
		fs, _, _, _, _, _ := pingpongFlags(new(pingpong.Config), new(linkFlags))
		return sets(fs)
	},
	"rping": func() []*flag.FlagSet { return sets(rpingFlags()) },
	"run":   func() []*flag.FlagSet { fs, _, _, _, _, _, _ := runFlags(); return sets(fs) },
	"serve": func() []*flag.FlagSet {
		fs, _, _, _, _, _, _, _, _, _, _, _ := serveFlags(new(addrList))
		return sets(fs)
	},
	"status":     func() []*flag.FlagSet { fs, _, _ := statusFlags(); return sets(fs) },
	"rdma":       func() []*flag.FlagSet { fs, _, _, _ := rdmaFlags(); return sets(fs) },
	"man":        func() []*flag.FlagSet { fs, _ := manFlags(); return sets(fs) },
	"completion": func() []*flag.FlagSet { return sets(completionFlags()) },
}

func sets(fs ...*flag.FlagSet) []*flag.FlagSet { return fs }

// subwords are the words a command takes first (its modes), for the
// completions.
var subwords = map[string][]string{
	"abi":         {"build"},
	"completion":  {"bash", "zsh"},
	"conformance": {"rxe", "self", "replay", "remote", "agent-source"},
	"perftest":    {"write", "read", "atomic", "send"},
	"rdma":        {"dev", "link", "statistic", "resource"},
}

// flagName is how the docs spell a flag: -x for one letter, --name for
// longer names (package flag takes either dash count).
func flagName(name string) string {
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}

// otherSpelling is the flag with the dash count flagName does not use.
func otherSpelling(name string) string {
	if len(name) == 1 {
		return "--" + name
	}
	return "-" + name
}

// takesValue reports whether a flag takes a value (is not boolean).
func takesValue(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return !ok || !b.IsBoolFlag()
}

// usageText splits what fs.Usage prints into the synopsis (the lines up
// to the first blank line, "Usage:" taken off) and the description (the
// rest, before the flags).
func usageText(fs *flag.FlagSet) (synopsis, description []string) {
	var all, defaults bytes.Buffer
	out := fs.Output()
	defer fs.SetOutput(out)
	fs.SetOutput(&defaults)
	fs.PrintDefaults()
	fs.SetOutput(&all)
	if fs.Usage != nil {
		fs.Usage()
	}
	text := strings.TrimSuffix(all.String(), defaults.String())
	if strings.HasPrefix(text, "Usage of ") { // package flag's default usage
		text = ""
	}
	text = strings.TrimSpace(text)
	text = strings.TrimSpace(strings.TrimSuffix(text, "Flags:"))
	lines := strings.Split(text, "\n")
	i := 0
	for ; i < len(lines) && strings.TrimSpace(lines[i]) != ""; i++ {
		// "Usage: " and the indent that lines its continuations up
		// with it go; deeper indents stay.
		l := strings.TrimRight(lines[i], " \t")
		if i == 0 {
			l = strings.TrimSpace(strings.TrimPrefix(l, "Usage:"))
		} else {
			l = strings.TrimPrefix(l, "       ")
		}
		if l != "" {
			synopsis = append(synopsis, l)
		}
	}
	for ; i < len(lines); i++ {
		description = append(description, lines[i])
	}
	for len(description) > 0 && strings.TrimSpace(description[0]) == "" {
		description = description[1:]
	}
	return synopsis, description
}

// roff escapes text for a roff line: backslashes, and a leading dot or
// quote that roff would read as a request.
func roff(s string) string {
	s = strings.ReplaceAll(s, `\`, `\e`)
	s = strings.ReplaceAll(s, "-", `\-`)
	if strings.HasPrefix(s, ".") || strings.HasPrefix(s, "'") {
		s = `\&` + s
	}
	return s
}

// roffLines escapes each line of s.
func roffLines(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = roff(l)
	}
	return strings.Join(lines, "\n")
}

// pageName is the man page's name: softroce, softroce-inspect, ...
func pageName(cmd string) string {
	if cmd == "" {
		return "softroce"
	}
	return "softroce-" + cmd
}

// writeManPage writes the roff man page of a command ("" for softroce(1)
// itself).
func writeManPage(w io.Writer, cmd string) error {
	var b strings.Builder
	name := pageName(cmd)
	fmt.Fprintf(&b, ".TH %s 1 \"\" \"softroce\" \"softroce manual\"\n", strings.ToUpper(name))
	b.WriteString(".\\\" Generated by 'softroce man' from the commands' flag definitions.\n")
	if cmd == "" {
		b.WriteString(".SH NAME\nsoftroce \\- a userspace RoCEv2 stack\n.SH SYNOPSIS\n.B softroce\n.I COMMAND\n[flags] [args]\n.SH COMMANDS\n")
		for _, n := range commandNames() {
			fmt.Fprintf(&b, ".TP\n.B %s\n%s\n", roff(n), roff(commands[n].summary))
		}
		b.WriteString(".TP\n.B help \\fICOMMAND\\fR\na command's flags (as softroce COMMAND \\-h)\n.TP\n.B version\nthe module version and the commit it was built from (also \\-\\-version)\n")
		b.WriteString(".SH SEE ALSO\n")
		var see []string
		for _, n := range commandNames() {
			see = append(see, fmt.Sprintf(".BR %s (1)", pageName(n)))
		}
		b.WriteString(strings.Join(see, ",\n") + "\n")
		_, err := io.WriteString(w, b.String())
		return err
	}
	c, ok := commands[cmd]
	if !ok {
		return fmt.Errorf("unknown command %q", cmd)
	}
	fmt.Fprintf(&b, ".SH NAME\n%s \\- %s\n", name, roff(c.summary))
	var fss []*flag.FlagSet
	if f := flagSets[cmd]; f != nil {
		fss = f()
	}
	for i, fs := range fss {
		syn, desc := usageText(fs)
		// A subcommand's flag set gets a section of its own, with
		// subsections.
		sec := ".SH"
		if i > 0 {
			fmt.Fprintf(&b, ".SH %s\n", roff(strings.ToUpper(fs.Name())))
			sec = ".SS"
		}
		if len(syn) > 0 {
			fmt.Fprintf(&b, "%s SYNOPSIS\n.nf\n%s\n.fi\n", sec, roffLines(strings.Join(syn, "\n")))
		}
		if len(desc) > 0 {
			fmt.Fprintf(&b, "%s DESCRIPTION\n.nf\n%s\n.fi\n", sec, roffLines(strings.Join(desc, "\n")))
		}
		n := 0
		fs.VisitAll(func(*flag.Flag) { n++ })
		if n == 0 {
			continue
		}
		fmt.Fprintf(&b, "%s OPTIONS\n", sec)
		fs.VisitAll(func(f *flag.Flag) {
			arg, usage := flag.UnquoteUsage(f)
			fmt.Fprintf(&b, ".TP\n.B %s", roff(flagName(f.Name)))
			if arg != "" {
				fmt.Fprintf(&b, " \\fI%s\\fR", roff(arg))
			}
			b.WriteString("\n" + roffLines(usage))
			if d := f.DefValue; takesValue(f) && d != "" && d != "0" && d != "0s" || !takesValue(f) && d == "true" {
				fmt.Fprintf(&b, " (default %s)", roff(d))
			}
			b.WriteString("\n")
		})
	}
	b.WriteString(".SH SEE ALSO\n.BR softroce (1)\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// commandNames are the registered commands, sorted.
func commandNames() []string {
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// manFlags defines man's flags.
func manFlags() (fs *flag.FlagSet, dir *string) {
	fs = flag.NewFlagSet("man", flag.ContinueOnError)
	dir = fs.String("dir", "", "write every page to `DIR` (softroce.1, softroce-COMMAND.1, ...) instead of one page to stdout")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: softroce man [COMMAND]\n       softroce man --dir DIR\n\n"+
			"Writes the roff man page of softroce, or of COMMAND, made from the commands' flag definitions\n"+
			"(read one with 'softroce man inspect | man -l -').\n\n")
		fs.PrintDefaults()
	}
	return
}

func runMan(args []string) int {
	fs, dir := manFlags()
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	if *dir != "" {
		if fs.NArg() != 0 {
			fmt.Fprintln(os.Stderr, "softroce man: --dir writes every page: give no COMMAND")
			return 2
		}
		if err := os.MkdirAll(*dir, 0o755); err != nil {
			fmt.Fprintf(os.Stderr, "softroce man: %v\n", err)
			return 1
		}
		for _, cmd := range append([]string{""}, commandNames()...) {
			var b bytes.Buffer
			if err := writeManPage(&b, cmd); err != nil {
				fmt.Fprintf(os.Stderr, "softroce man: %v\n", err)
				return 1
			}
			if err := os.WriteFile(filepath.Join(*dir, pageName(cmd)+".1"), b.Bytes(), 0o644); err != nil {
				fmt.Fprintf(os.Stderr, "softroce man: %v\n", err)
				return 1
			}
		}
		fmt.Fprintf(os.Stderr, "softroce man: wrote %d pages to %s\n", len(commands)+1, *dir)
		return 0
	}
	cmd := ""
	switch fs.NArg() {
	case 0:
	case 1:
		cmd = fs.Arg(0)
		if _, ok := commands[cmd]; !ok {
			fmt.Fprintf(os.Stderr, "softroce man: unknown command %q\n", cmd)
			return 2
		}
	default:
		fmt.Fprintln(os.Stderr, "softroce man: one COMMAND at most")
		return 2
	}
	if err := writeManPage(os.Stdout, cmd); err != nil {
		fmt.Fprintf(os.Stderr, "softroce man: %v\n", err)
		return 1
	}
	return 0
}

// completionFlags defines completion's (no) flags.
func completionFlags() *flag.FlagSet {
	fs := flag.NewFlagSet("completion", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: softroce completion bash|zsh\n\n"+
			"Prints a completion script for every command and its flags, made from the flag definitions:\n"+
			"  source <(softroce completion bash)       # bash, or save it in /etc/bash_completion.d/softroce\n"+
			"  softroce completion zsh > \"${fpath[1]}/_softroce\"   # zsh\n\n")
		fs.PrintDefaults()
	}
	return fs
}

func runCompletion(args []string) int {
	fs := completionFlags()
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return 2
	}
	var err error
	switch fs.Arg(0) {
	case "bash":
		err = writeBashCompletion(os.Stdout)
	case "zsh":
		err = writeZshCompletion(os.Stdout)
	default:
		fmt.Fprintf(os.Stderr, "softroce completion: %q: want bash or zsh\n", fs.Arg(0))
		return 2
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "softroce completion: %v\n", err)
		return 1
	}
	return 0
}

// commandFlagList returns a command's flags (all its flag sets'), sorted
// and without repeats.
func commandFlagList(cmd string) []*flag.Flag {
	seen := map[string]bool{}
	var out []*flag.Flag
	if f := flagSets[cmd]; f != nil {
		for _, fs := range f() {
			fs.VisitAll(func(f *flag.Flag) {
				if !seen[f.Name] {
					seen[f.Name] = true
					out = append(out, f)
				}
			})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// shellWord reports whether s needs no quoting in a shell script; the
// names of commands, flags and modes all are such words.
func shellWord(s string) bool {
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return s != ""
}

func writeBashCompletion(w io.Writer) error {
	var b strings.Builder
	b.WriteString("# bash completion for softroce; generated by 'softroce completion bash' from the flag definitions.\n")
	b.WriteString("_softroce() {\n\tlocal cur prev cmd\n\tcur=\"${COMP_WORDS[COMP_CWORD]}\"\n\tprev=\"${COMP_WORDS[COMP_CWORD-1]}\"\n")
	names := commandNames()
	fmt.Fprintf(&b, "\tif [[ $COMP_CWORD -eq 1 ]]; then\n\t\tCOMPREPLY=( $(compgen -W %q -- \"$cur\") )\n\t\treturn\n\tfi\n",
		strings.Join(append(append([]string{}, names...), "help", "version", "--version", "--help"), " "))
	b.WriteString("\tcmd=\"${COMP_WORDS[1]}\"\n\tcase \"$cmd\" in\n")
	fmt.Fprintf(&b, "\thelp|man)\n\t\tCOMPREPLY=( $(compgen -W %q -- \"$cur\") ) ;;\n", strings.Join(names, " "))
	for _, n := range names {
		if !shellWord(n) {
			return fmt.Errorf("command name %q is not a shell word", n)
		}
		var flags, valued []string
		for _, f := range commandFlagList(n) {
			if !shellWord(f.Name) {
				return fmt.Errorf("%s: flag name %q is not a shell word", n, f.Name)
			}
			flags = append(flags, flagName(f.Name))
			if takesValue(f) {
				valued = append(valued, flagName(f.Name), otherSpelling(f.Name))
			}
		}
		fmt.Fprintf(&b, "\t%s)\n", n)
		if len(valued) > 0 {
			// After a flag that takes a value: files, bash's default.
			fmt.Fprintf(&b, "\t\tcase \"$prev\" in %s) COMPREPLY=(); return ;; esac\n", strings.Join(valued, "|"))
		}
		words := strings.Join(flags, " ")
		if sw := subwords[n]; len(sw) > 0 {
			fmt.Fprintf(&b, "\t\tif [[ $COMP_CWORD -eq 2 && \"$cur\" != -* ]]; then COMPREPLY=( $(compgen -W %q -- \"$cur\") ); return; fi\n", strings.Join(sw, " "))
		}
		fmt.Fprintf(&b, "\t\tif [[ \"$cur\" == -* ]]; then COMPREPLY=( $(compgen -W %q -- \"$cur\") ); fi ;;\n", words)
	}
	b.WriteString("\tesac\n}\ncomplete -o default -o bashdefault -F _softroce softroce\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// takesPath guesses whether a flag's value is a file or directory name,
// from its argument name and its own: zsh then offers file names.
func takesPath(name, arg string) bool {
	switch arg {
	case "FILE", "DIR", "PATH":
		return true
	}
	for _, w := range []string{"file", "dir", "pcap", "diagram", "socket", "out", "profile"} {
		if strings.Contains(name, w) {
			return true
		}
	}
	return false
}

// zshDesc makes a flag's usage into a zsh _arguments description: its
// first line, without the characters _arguments reads as syntax, short.
func zshDesc(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	s = strings.NewReplacer("[", "(", "]", ")", ":", " -", "'", "", `\`, "", "`", "", "$", "").Replace(s)
	if r := []rune(s); len(r) > 100 {
		s = string(r[:97]) + "..."
	}
	return s
}

func writeZshCompletion(w io.Writer) error {
	var b strings.Builder
	b.WriteString("#compdef softroce\n# zsh completion for softroce; generated by 'softroce completion zsh' from the flag definitions.\n")
	b.WriteString("_softroce() {\n\tlocal -a cmds\n\tcmds=(\n")
	names := commandNames()
	for _, n := range names {
		fmt.Fprintf(&b, "\t\t'%s:%s'\n", n, zshDesc(commands[n].summary))
	}
	b.WriteString("\t\t'help:the flags of a command'\n\t\t'version:the module version and commit'\n\t)\n")
	b.WriteString("\tif (( CURRENT == 2 )); then\n\t\t_describe 'command' cmds\n\t\treturn\n\tfi\n")
	b.WriteString("\tlocal cmd=$words[2]\n\tshift words\n\t(( CURRENT-- ))\n\tcase $cmd in\n")
	fmt.Fprintf(&b, "\thelp|man)\n\t\t_values 'command' %s ;;\n", strings.Join(names, " "))
	for _, n := range names {
		if !shellWord(n) {
			return fmt.Errorf("command name %q is not a shell word", n)
		}
		fmt.Fprintf(&b, "\t%s)\n\t\t_arguments", n)
		for _, f := range commandFlagList(n) {
			if !shellWord(f.Name) {
				return fmt.Errorf("%s: flag name %q is not a shell word", n, f.Name)
			}
			arg, usage := flag.UnquoteUsage(f)
			spec := fmt.Sprintf("%s[%s]", flagName(f.Name), zshDesc(usage))
			if takesValue(f) {
				if arg == "" {
					arg = "value"
				}
				action := " " // a value to type: nothing to offer
				if takesPath(f.Name, arg) {
					action = "_files"
				}
				spec += ":" + zshDesc(arg) + ":" + action
			}
			fmt.Fprintf(&b, " \\\n\t\t\t'%s'", spec)
		}
		if sw := subwords[n]; len(sw) > 0 {
			fmt.Fprintf(&b, " \\\n\t\t\t'1:mode:(%s)'", strings.Join(sw, " "))
		}
		b.WriteString(" \\\n\t\t\t'*:file:_files' ;;\n")
	}
	b.WriteString("\tesac\n}\n_softroce \"$@\"\n")
	_, err := io.WriteString(w, b.String())
	return err
}
