package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"regexp"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/softroce/softroce/conformance/cases"
)

func init() {
	register("conformance", "packet-level conformance cases against kernel rdma_rxe and softroce; writes a report", runConformance)
}

// conformanceFlags defines conformance's flags (rxe and self).
func conformanceFlags() (fs *flag.FlagSet, out, pcapDir, only *string, timeout *time.Duration, list *bool) {
	fs = flag.NewFlagSet("conformance", flag.ContinueOnError)
	out = fs.String("out", ".", "directory for conformance-report.md and conformance-report.json")
	pcapDir = fs.String("pcap", "", "directory for one pcap per case and target (read them with 'softroce inspect')")
	only = fs.String("only", "", "run only the cases whose ID matches this regular expression")
	timeout = fs.Duration("timeout", 20*time.Minute, "give up after this long")
	list = fs.Bool("list", false, "list the cases and exit")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `Usage: softroce conformance rxe  [flags]   boot a kernel rdma_rxe VM (root) and run every case against rxe and softroce
       softroce conformance self [flags]   run every case against softroce only (no root, no VM)
       softroce conformance replay CAPTURE replay a real NIC capture into softroce's responder (-h for its flags)
       softroce conformance remote HOST[:PORT] --token T [--local-addr IP] [--iface NAME] [--peer udp|raw] [--with-rxe]
                                           run every case against the RNIC of a softroce-agent host (docs/remote.md);
                                           --with-rxe adds the rdma_rxe VM: columns rxe, softroce, remote
       softroce conformance agent-source DIR   write the agent's C source to build on an RNIC host

Each case crafts exact RoCEv2 packets from a fake peer to a QP of the target
and judges the answers against the IBTA specification.

Flags:
`)
		fs.PrintDefaults()
	}
	return
}

func runConformance(args []string) int {
	if len(args) > 0 && (args[0] == "remote" || args[0] == "agent-source") {
		return runConformanceRemoteMode(args[0], args[1:])
	}
	fs, out, pcapDir, only, timeout, list := conformanceFlags()
	var mode string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		mode, args = args[0], args[1:]
	}
	if mode == "replay" {
		return runReplay(args)
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if mode == "" && fs.NArg() > 0 {
		mode = fs.Arg(0)
	}
	if *list {
		for _, c := range cases.All {
			fmt.Printf("%-40s %s\n", c.ID, c.Spec)
		}
		return 0
	}
	if mode != "rxe" && mode != "self" {
		fs.Usage()
		return 2
	}
	var re *regexp.Regexp
	if *only != "" {
		var err error
		if re, err = regexp.Compile(*only); err != nil {
			fmt.Fprintf(os.Stderr, "softroce conformance: --only: %v\n", err)
			return 2
		}
	}
	if mode == "rxe" && os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "softroce conformance rxe: needs root to create the VM's network namespace and tap device (run 'softroce conformance self' for softroce alone)")
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	env := map[string]string{}
	if rev := buildRevision(); rev != "" {
		env["softroce build"] = rev
	}
	var targets []cases.Target
	if mode == "rxe" {
		vm, err := cases.BootRxeVM(ctx, os.Stderr)
		if err != nil {
			fmt.Fprintf(os.Stderr, "softroce conformance: %v\n", err)
			return 1
		}
		defer vm.Close()
		rxe, err := cases.NewRxeTarget(ctx, vm)
		if err != nil {
			fmt.Fprintf(os.Stderr, "softroce conformance: %v\n", err)
			return 1
		}
		defer rxe.Close()
		env["rxe"] = "Linux " + rxe.KernelRelease(ctx) + " rdma_rxe in a qemu (TCG) guest, driven through libibverbs; fake peer on nic/udp (IPv4)"
		targets = append(targets, rxe)
	}
	soft, err := cases.NewSoftroceTarget()
	if err != nil {
		fmt.Fprintf(os.Stderr, "softroce conformance: %v\n", err)
		return 1
	}
	defer soft.Close()
	env["softroce"] = "transport/engine with transport/rc, transport/uc and transport/ud (RC, UC and UD QPs) and package cm on the device's QP1, through the verbs API on an in-process nic/pipe; fake peer on the pipe's other end"
	targets = append(targets, soft)

	rep, err := cases.RunAll(ctx, targets, cases.All, cases.Options{Only: re, PcapDir: *pcapDir, Log: os.Stdout, Environment: env})
	if err != nil {
		fmt.Fprintf(os.Stderr, "softroce conformance: %v\n", err)
		if rep == nil {
			return 1
		}
	}
	if err := rep.WriteFiles(*out); err != nil {
		fmt.Fprintf(os.Stderr, "softroce conformance: %v\n", err)
		return 1
	}
	for _, t := range rep.Targets {
		m := rep.Counts(t)
		fmt.Printf("%s: %d pass, %d documented deviation, %d fail, %d harness error\n", t, m[cases.VerdictPass], m[cases.VerdictDeviation], m[cases.VerdictFail], m[cases.VerdictError])
	}
	// Failures recorded as known bugs are in the report but do not fail
	// the run; anything else does.
	bad := rep.Unexpected()
	fmt.Printf("wrote %s/conformance-report.md and .json\n", strings.TrimRight(*out, "/"))
	if bad > 0 || err != nil {
		return 1
	}
	return 0
}

// buildRevision is the VCS revision the binary was built from, marked
// "+modified" when the working tree had uncommitted changes, so a report
// says exactly which softroce it judged.
func buildRevision() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	var rev, mod string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				mod = " +modified (uncommitted changes in the working tree)"
			}
		}
	}
	if rev == "" {
		return ""
	}
	return "commit " + rev + mod
}
