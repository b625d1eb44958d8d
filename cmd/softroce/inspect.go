package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/softroce/softroce/diagram"
	"github.com/softroce/softroce/inspect"
)

func init() {
	register("inspect", "decode a pcap/pcapng capture and verify every RoCE packet's ICRC", runInspect)
}

// inspectOpts are inspect's flags.
type inspectOpts struct {
	verbose, asJSON, strict, noSummary *bool
	diag, filter                       *string
	jobs                               *int
}

// inspectFlags defines inspect's flags.
func inspectFlags() (*flag.FlagSet, *inspectOpts) {
	fs := flag.NewFlagSet("inspect", flag.ContinueOnError)
	var o inspectOpts
	o.verbose = fs.Bool("v", false, "print every field with its byte offsets in the frame")
	o.asJSON = fs.Bool("json", false, "write JSON Lines: one object per RoCE packet, then {\"summary\": ...} (and {\"total\": ...} for several files)")
	o.strict = fs.Bool("strict", false, "exit non-zero on any ICRC failure or malformed RoCE packet")
	o.noSummary = fs.Bool("no-summary", false, "omit the per-connection summary and the total (text output)")
	o.diag = fs.String("diagram", "", "also write a ladder diagram of every QP conversation to `FILE` (.html or .svg)")
	o.jobs = fs.Int("jobs", runtime.GOMAXPROCS(0), "decode on `N` goroutines (1: on one; the output order is the capture's either way)")
	o.filter = fs.String("Y", "", "list only the packets the display filter `EXPR` matches, e.g. 'qp == 0x11 && (nak || retransmission)' (docs/cli.md); the summary counts every packet")
	fs.StringVar(o.filter, "filter", "", "the display filter `EXPR`: same as -Y")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: softroce inspect [-v] [--json] [--strict] [--no-summary] [--jobs N] [-Y EXPR] [--diagram out.html|out.svg] FILE...\n\n"+
			"Decodes RoCEv2 (UDP 4791, IPv4/IPv6, VLAN) and RoCEv1 (EtherType 0x8915) packets in pcap\n"+
			"and pcapng files, verifies each ICRC, and summarises every connection; with several files,\n"+
			"also their total. -Y lists only the packets a display filter matches.\n\n")
		fs.PrintDefaults()
	}
	return fs, &o
}

// runInspect is a thin flag parser over package inspect. Exit codes: 0 on
// success, 1 when a file cannot be read (or, with --strict, when any ICRC
// fails or a RoCE packet is malformed), 2 on usage errors (a filter that
// does not compile included).
func runInspect(args []string) int {
	fs, o := inspectFlags()
	verbose, asJSON, strict, noSummary, diag, jobs := o.verbose, o.asJSON, o.strict, o.noSummary, o.diag, o.jobs
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return 2
	}
	if *jobs < 1 {
		fmt.Fprintf(os.Stderr, "softroce inspect: %d jobs: want at least 1\n", *jobs)
		return 2
	}
	format, ok := diagramFormat("inspect", *diag)
	if !ok {
		return 2
	}
	var filt *inspect.Filter
	if *o.filter != "" {
		var err error
		if filt, err = inspect.ParseFilter(*o.filter); err != nil {
			fmt.Fprintf(os.Stderr, "softroce inspect: %v\n", err)
			var fe *inspect.FilterError
			if errors.As(err, &fe) {
				fmt.Fprintf(os.Stderr, "%s\n", indent(fe.Caret(), "  "))
			}
			return 2
		}
	}
	var total inspect.Total
	render := inspect.RenderText(*verbose)
	if *asJSON {
		render = inspect.RenderJSON
	}
	var all []inspect.Record
	// A large buffer: a million packets print hundreds of megabytes.
	out := bufio.NewWriterSize(os.Stdout, 1<<20)
	defer out.Flush()
	code := 0
	several := fs.NArg() > 1
	for _, path := range fs.Args() {
		z := inspect.NewSummarizer(path)
		bad, matched := 0, 0
		if several && !*asJSON {
			fmt.Fprintf(out, "# %s\n", path)
		}
		o := inspect.ProcessOptions{Jobs: *jobs, Render: render}
		if several {
			o.File = path
		}
		err := inspect.Process(path, o, func(r *inspect.Record, line []byte, rerr error) error {
			// The analysis sees every packet, so that what a filter
			// leaves out still counts (a retransmission is one by what
			// came before it); the filter selects what is listed.
			m := z.AddMark(r)
			if r.Bad() {
				bad++
			}
			if filt != nil {
				if !filt.Match(r, m) {
					return nil
				}
				matched++
			}
			if format != "" {
				all = append(all, r.Clone())
			}
			if rerr != nil {
				return rerr
			}
			_, err := out.Write(line)
			return err
		})
		s := z.Summary()
		if filt != nil {
			s.Filter, s.Matched = filt.String(), &matched
		}
		total.Add(&s)
		switch {
		case err != nil && s.Frames == 0:
			// Nothing was read: the error alone says it.
		case *asJSON:
			if werr := inspect.WriteJSONSummary(out, &s); werr != nil && err == nil {
				err = werr
			}
		case !*noSummary:
			if werr := inspect.WriteSummary(out, &s); werr != nil && err == nil {
				err = werr
			}
		default:
			// Without the summary, its hints still matter.
			for _, h := range s.Hints {
				out.Flush()
				fmt.Fprintf(os.Stderr, "softroce inspect: %s: hint: %s\n", path, h)
			}
		}
		if err != nil {
			out.Flush()
			fmt.Fprintf(os.Stderr, "softroce inspect: %v\n", err)
			code = 1
			continue
		}
		if *strict && bad > 0 {
			out.Flush()
			fmt.Fprintf(os.Stderr, "softroce inspect: %s: %s with a bad ICRC or malformed headers\n", path, inspect.Plural(bad, "RoCE packet"))
			code = 1
		}
	}
	if several && total.Files > 1 && !*noSummary {
		var err error
		if *asJSON {
			err = inspect.WriteJSONTotal(out, &total)
		} else {
			err = inspect.WriteTotal(out, &total)
		}
		if err != nil {
			out.Flush()
			fmt.Fprintf(os.Stderr, "softroce inspect: %v\n", err)
			code = 1
		}
	}
	if format != "" {
		if err := writeDiagram(*diag, all, diagram.Options{Format: format}); err != nil {
			fmt.Fprintf(os.Stderr, "softroce inspect: --diagram: %v\n", err)
			return 1
		}
		fmt.Fprintf(os.Stderr, "softroce inspect: wrote %s\n", *diag)
	}
	return code
}

// indent puts prefix before every line of s.
func indent(s, prefix string) string {
	return prefix + strings.ReplaceAll(s, "\n", "\n"+prefix)
}

// diagramFormat picks the diagram format from the file name given to
// --diagram ("" when none was given); it reports a bad name itself.
func diagramFormat(cmd, path string) (string, bool) {
	if path == "" {
		return "", true
	}
	switch strings.ToLower(filepath.Ext(path)) {
	case ".html", ".htm":
		return "html", true
	case ".svg":
		return "svg", true
	}
	fmt.Fprintf(os.Stderr, "softroce %s: --diagram %s: name the file .html or .svg\n", cmd, path)
	return "", false
}

// writeDiagram writes a ladder diagram of recs to path.
func writeDiagram(path string, recs []inspect.Record, o diagram.Options) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := diagram.Write(f, recs, o); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
