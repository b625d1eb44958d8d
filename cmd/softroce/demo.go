package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/demo"
	"github.com/softroce/softroce/diagram"
)

func init() {
	register("demo", "run SEND, WRITE, READ and atomics between two in-process endpoints, showing every packet", runDemo)
}

// isTerminal reports whether f is a terminal (for color and progress bars).
func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// demoFlags defines demo's flags.
func demoFlags() (fs *flag.FlagSet, imp, diag, pcap *string, mtu *int, color *string) {
	fs = flag.NewFlagSet("demo", flag.ContinueOnError)
	imp = fs.String("impair", "", "impair the wire, e.g. loss=10%,dup=5%,corrupt=2%,seed=7 (shows retransmissions and NAKs)")
	diag = fs.String("diagram", "", "write a ladder diagram of the run to `FILE` (.html or .svg)")
	pcap = fs.String("pcap", "", "write every packet on the wire to `FILE` (pcap; read it with softroce inspect)")
	mtu = fs.Int("mtu", 256, "IB path MTU in bytes (256, 512, 1024, 2048 or 4096)")
	color = fs.String("color", "auto", "color output: auto (when stdout is a terminal), always or never")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: softroce demo [--impair SPEC] [--diagram FILE] [--pcap FILE] [--mtu N] [--color auto|always|never]\n\n"+
			"Two RoCEv2 endpoints in this process, joined by an in-process wire: no root, no setup.\n"+
			"Prints each verbs call, every packet on the wire, the completions and the memory.\n\n")
		fs.PrintDefaults()
	}
	return
}

// runDemo is a thin flag parser over package demo. Exit codes: 0 when every
// step succeeded, 1 when one failed or an output file could not be
// written, 2 on usage errors (a bad --impair among them).
func runDemo(args []string) int {
	fs, imp, diag, pcap, mtu, color := demoFlags()
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	if fs.NArg() != 0 {
		fmt.Fprintf(os.Stderr, "softroce demo: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	switch *mtu {
	case 256, 512, 1024, 2048, 4096:
	default:
		fmt.Fprintf(os.Stderr, "softroce demo: --mtu %d: an IB MTU is 256, 512, 1024, 2048 or 4096\n", *mtu)
		return 2
	}
	format, ok := diagramFormat("demo", *diag)
	if !ok {
		return 2
	}
	if *imp != "" {
		if _, err := demo.ParseImpair(*imp); err != nil {
			fmt.Fprintf(os.Stderr, "softroce demo: %v\n", err)
			return 2
		}
	}
	opts := demo.Options{Impair: *imp, PathMTU: *mtu}
	switch *color {
	case "auto":
		opts.Color = isTerminal(os.Stdout) && os.Getenv("NO_COLOR") == ""
	case "always":
		opts.Color = true
	case "never":
	default:
		fmt.Fprintf(os.Stderr, "softroce demo: --color %q: want auto, always or never\n", *color)
		return 2
	}
	var pf *os.File
	if *pcap != "" {
		f, err := os.Create(*pcap)
		if err != nil {
			fmt.Fprintf(os.Stderr, "softroce demo: --pcap: %v\n", err)
			return 1
		}
		pf = f
		opts.Pcap = bufio.NewWriter(f)
	}
	out := bufio.NewWriter(os.Stdout)
	res, err := demo.Run(lineFlusher{out}, opts)
	out.Flush()
	code := 0
	if err != nil {
		fmt.Fprintf(os.Stderr, "softroce demo: %v\n", err)
		code = 1
	}
	if pf != nil {
		if ferr := opts.Pcap.(*bufio.Writer).Flush(); ferr != nil {
			fmt.Fprintf(os.Stderr, "softroce demo: write %s: %v\n", *pcap, ferr)
			code = 1
		}
		if cerr := pf.Close(); cerr != nil {
			fmt.Fprintf(os.Stderr, "softroce demo: write %s: %v\n", *pcap, cerr)
			code = 1
		} else if code == 0 {
			fmt.Printf("  wrote %s: read it with `softroce inspect %s`\n", *pcap, *pcap)
		}
	}
	if format != "" && res != nil {
		err := writeDiagram(*diag, res.Records, diagram.Options{Format: format, Title: "softroce demo", Lost: res.Lost})
		if err != nil {
			fmt.Fprintf(os.Stderr, "softroce demo: --diagram: %v\n", err)
			return 1
		}
		fmt.Printf("  wrote %s: a ladder diagram of the run\n", *diag)
	}
	return code
}

// lineFlusher flushes after every write, so the demo prints as it goes.
type lineFlusher struct{ w *bufio.Writer }

func (l lineFlusher) Write(p []byte) (int, error) {
	n, err := l.w.Write(p)
	if err == nil {
		err = l.w.Flush()
	}
	return n, err
}
