package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/softroce/softroce/conformance/agent"
	"github.com/softroce/softroce/conformance/cases"
)

// runConformanceRemoteMode runs the remote and agent-source modes of
// `softroce conformance`.
func runConformanceRemoteMode(mode string, args []string) int {
	if mode == "agent-source" {
		return runConformanceAgentSource(args)
	}
	return runConformanceRemote(args)
}

// runConformanceAgentSource is `softroce conformance agent-source DIR`: it
// writes the agent's C source and a Makefile, to build on an RNIC host.
func runConformanceAgentSource(args []string) int {
	if len(args) != 1 || strings.HasPrefix(args[0], "-") {
		fmt.Fprintf(os.Stderr, "Usage: softroce conformance agent-source DIR\n\n"+
			"Writes DIR/agent.c and DIR/Makefile: copy them to a Linux host with an RDMA device and build there\n"+
			"with '%s' (or make); docs/remote.md says how to run it.\n", agent.BuildCommand)
		return 2
	}
	if err := agent.WriteSource(args[0]); err != nil {
		fmt.Fprintf(os.Stderr, "softroce conformance agent-source: %v\n", err)
		return 1
	}
	fmt.Printf("wrote %s/agent.c and %s/Makefile; build with: cd %s && %s\n", args[0], args[0], args[0], agent.BuildCommand)
	return 0
}

// conformanceRemoteFlags defines the flags of conformance remote.
func conformanceRemoteFlags() (fs *flag.FlagSet, token, tokenFile, local, iface, driver, out, pcapDir, only *string, timeout *time.Duration, self, withRxe *bool, peerKind *string) {
	fs = flag.NewFlagSet("conformance remote", flag.ContinueOnError)
	token = fs.String("token", "", "the agent's token (the line it printed at start); or set SOFTROCE_AGENT_TOKEN")
	tokenFile = fs.String("token-file", "", "read the token from this file's first line")
	local = fs.String("local-addr", "", "this host's address the fake peer sends from (default: the route's source toward the remote NIC)")
	iface = fs.String("iface", "", "take the fake peer's address from this interface")
	driver = fs.String("driver", "", "the device's driver for documented deviations (default: what the agent reports)")
	out = fs.String("out", ".", "directory for conformance-report.md and conformance-report.json")
	pcapDir = fs.String("pcap", "", "directory for one pcap per case and target (read them with 'softroce inspect')")
	only = fs.String("only", "", "run only the cases whose ID matches this regular expression")
	timeout = fs.Duration("timeout", 20*time.Minute, "give up after this long")
	self = fs.Bool("softroce", true, "also run the cases against softroce, as a column of the report")
	withRxe = fs.Bool("with-rxe", false, "also boot the kernel rdma_rxe VM (root) and run the cases against it: columns rxe, softroce, remote")
	peerKind = fs.String("peer", cases.PeerUDP, "how the fake peer sends: udp (a UDP socket; the kernel writes the IP header) or raw (a raw IPv4 socket: the harness writes ID, TTL and DSCP/ECN; root or CAP_NET_RAW)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `Usage: softroce conformance remote HOST[:PORT] --token T [--local-addr IP] [--iface NAME] [--peer udp|raw] [--with-rxe] [flags]

Runs every case against the RDMA device of a softroce-agent on HOST (port
%d unless given): the agent creates the QPs and memory regions there, and
this host crafts the packets toward the device's RoCEv2 address over the
network (UDP 4791; this host must not run RoCE on its own address).
docs/remote.md says how to build and start the agent. The control channel
is authenticated by the token but not encrypted: use a lab network.

Flags:
`, agent.DefaultPort)
		fs.PrintDefaults()
	}
	return
}

// runConformanceRemote is `softroce conformance remote HOST[:PORT]`: the
// cases against the device of a softroce-agent on another host, and
// against softroce, in one report.
func runConformanceRemote(args []string) int {
	fs, token, tokenFile, local, iface, driver, out, pcapDir, only, timeout, self, withRxe, peerKind := conformanceRemoteFlags()
	var host string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		host, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if host == "" && fs.NArg() > 0 {
		host = fs.Arg(0)
	}
	if host == "" {
		fs.Usage()
		return 2
	}
	tok := *token
	if tok == "" && *tokenFile != "" {
		b, err := os.ReadFile(*tokenFile)
		if err != nil {
			fmt.Fprintf(os.Stderr, "softroce conformance remote: %v\n", err)
			return 1
		}
		tok, _, _ = strings.Cut(strings.TrimSpace(string(b)), "\n")
		tok = strings.TrimSpace(tok)
	}
	if tok == "" {
		tok = os.Getenv("SOFTROCE_AGENT_TOKEN")
	}
	if tok == "" {
		fmt.Fprintln(os.Stderr, "softroce conformance remote: the agent's token is needed: --token, --token-file or SOFTROCE_AGENT_TOKEN")
		return 2
	}
	if *peerKind != cases.PeerUDP && *peerKind != cases.PeerRaw {
		fmt.Fprintf(os.Stderr, "softroce conformance remote: --peer %q: want udp or raw\n", *peerKind)
		return 2
	}
	if *withRxe && os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "softroce conformance remote: --with-rxe needs root to create the VM's network namespace and tap device")
		return 1
	}
	cfg := cases.RemoteConfig{Agent: host, Token: tok, Iface: *iface, Driver: *driver, Peer: *peerKind}
	if *local != "" {
		a, err := netip.ParseAddr(*local)
		if err != nil {
			fmt.Fprintf(os.Stderr, "softroce conformance remote: --local-addr: %v\n", err)
			return 2
		}
		cfg.LocalAddr = a
	}
	var re *regexp.Regexp
	if *only != "" {
		var err error
		if re, err = regexp.Compile(*only); err != nil {
			fmt.Fprintf(os.Stderr, "softroce conformance: --only: %v\n", err)
			return 2
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	rt, err := cases.NewRemoteTarget(ctx, cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "softroce conformance remote: %v\n", err)
		return 1
	}
	defer rt.Close()
	d, info := rt.Device(), rt.Info()
	env := map[string]string{}
	if rev := buildRevision(); rev != "" {
		env["softroce build"] = rev
	}
	peerDesc := "nic/udp (the kernel writes the IPv4 header)"
	if rt.PeerKind() == cases.PeerRaw {
		peerDesc = "a raw IPv4 socket (the harness writes the IPv4 header; answers on nic/udp)"
	}
	env["remote"] = fmt.Sprintf("%s on %s through softroce-agent (vendor 0x%x, part 0x%x, GID index %d = %s); fake peer on %s from %s",
		d, host, info.VendorID, info.PartID, info.GIDIndex, rt.Addr(), peerDesc, rt.Peer().Addr())
	// Columns: rxe, softroce, remote.
	var targets []cases.Target
	if *withRxe {
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
	if *self {
		soft, err := cases.NewSoftroceTarget()
		if err != nil {
			fmt.Fprintf(os.Stderr, "softroce conformance: %v\n", err)
			return 1
		}
		defer soft.Close()
		env["softroce"] = "transport/engine with transport/rc, transport/uc and transport/ud (RC, UC and UD QPs) and package cm on the device's QP1, through the verbs API on an in-process nic/pipe; fake peer on the pipe's other end"
		targets = append(targets, soft)
	}
	targets = append(targets, rt)
	fmt.Printf("remote: %s at %s, %s peer\n", d, rt.Addr(), rt.PeerKind())
	rep, err := cases.RunAll(ctx, targets, cases.All, cases.Options{Only: re, PcapDir: *pcapDir, Log: os.Stdout, Environment: env})
	if err != nil {
		fmt.Fprintf(os.Stderr, "softroce conformance: %v\n", err)
		if rep == nil {
			return 1
		}
	}
	if werr := rep.WriteFiles(*out); werr != nil {
		fmt.Fprintf(os.Stderr, "softroce conformance: %v\n", werr)
		return 1
	}
	for _, t := range rep.Targets {
		m := rep.Counts(t)
		fmt.Printf("%s: %d pass, %d documented deviation, %d fail, %d harness error\n", t, m[cases.VerdictPass], m[cases.VerdictDeviation], m[cases.VerdictFail], m[cases.VerdictError])
	}
	fmt.Printf("wrote %s/conformance-report.md and .json\n", strings.TrimRight(*out, "/"))
	if rep.Unexpected() > 0 || err != nil {
		return 1
	}
	return 0
}
