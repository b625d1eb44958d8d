package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/softroce/softroce/conformance/replay"
)

// replayFlags defines the flags of conformance replay.
func replayFlags() (fs *flag.FlagSet, asJSON, verbose *bool, diag *string) {
	fs = flag.NewFlagSet("conformance replay", flag.ContinueOnError)
	asJSON = fs.Bool("json", false, "write the report as JSON")
	verbose = fs.Bool("v", false, "show every exchange's packets, not only those that differ")
	diag = fs.String("diagram", "", "also write the real and the softroce ladder diagrams side by side to `FILE` (.html)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `Usage: softroce conformance replay [--json] [-v] [--diagram out.html] CAPTURE

Replays the requests of a real RC requester in CAPTURE (pcap or pcapng) into
softroce's responder, set up to match (QP numbers, PSNs, MRs from the RETHs,
memory from the READ responses), and compares softroce's answers with the
real responder's.

Flags:
`)
		fs.PrintDefaults()
	}
	return
}

// runReplay is `softroce conformance replay CAPTURE`. Exit codes: 0 when
// every exchange agrees or differs only as the spec allows, 1 when one
// differs or the capture cannot be read, 2 on usage errors.
func runReplay(args []string) int {
	fs, asJSON, verbose, diag := replayFlags()
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return 2
	}
	if *diag != "" {
		if format, ok := diagramFormat("conformance replay", *diag); !ok {
			return 2
		} else if format != "html" {
			fmt.Fprintln(os.Stderr, "softroce conformance replay: --diagram draws two ladders side by side: name the file .html")
			return 2
		}
	}
	rep, err := replay.File(fs.Arg(0))
	if err != nil {
		fmt.Fprintf(os.Stderr, "softroce conformance replay: %v\n", err)
		return 1
	}
	out := bufio.NewWriter(os.Stdout)
	if *asJSON {
		err = rep.WriteJSON(out)
	} else {
		err = rep.WriteText(out, *verbose)
	}
	if ferr := out.Flush(); err == nil {
		err = ferr
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "softroce conformance replay: %v\n", err)
		return 1
	}
	if *diag != "" {
		f, err := os.Create(*diag)
		if err == nil {
			err = rep.WriteDiagram(f)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "softroce conformance replay: --diagram: %v\n", err)
			return 1
		}
	}
	if rep.DifferN > 0 || rep.ReqDiffer > 0 || rep.CMDiffer > 0 {
		return 1
	}
	return 0
}
