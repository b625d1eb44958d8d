package main

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"

	"github.com/softroce/softroce/nic/udp"
	"github.com/softroce/softroce/tools/rping"
	"github.com/softroce/softroce/verbs"
)

func init() {
	register("rping", "RDMA READ/WRITE ping over an rdma_cm connection, compatible with rdmacm-utils' rping", runRping)
}

// rpingFlags describes rping's options as a flag set, for the man page and
// the completions: rping.Parse reads them the way getopt does, and
// TestRpingFlagsMatchUsage keeps the two in step.
func rpingFlags() *flag.FlagSet {
	fs := flag.NewFlagSet("rping", flag.ContinueOnError)
	fs.Bool("s", false, "server side (-a: the address to listen on; default the host's first IPv4 address)")
	fs.Bool("c", false, "client side")
	fs.String("a", "", "the server's `ADDR` (client), the address to listen on (server)")
	fs.String("I", "", "source `ADDR` to bind to for the client")
	fs.Int("p", rping.DefaultPort, "`PORT` of the rdma_cm connection")
	fs.Int("C", 0, "ping `COUNT` times (0: until interrupted)")
	fs.Int("S", rping.DefaultSize, "ping data `SIZE` (26 to 65535)")
	fs.Bool("v", false, "display ping data to stdout")
	fs.Bool("V", false, "validate ping data")
	fs.Bool("d", false, "debug printfs")
	fs.Bool("P", false, "persistent server mode allowing multiple connections")
	fs.Bool("q", false, "accept with rping's own connection parameters (self-created, self-modified QP)")
	fs.String("backend", "udp", "packet backend: udp or afxdp")
	fs.Int("udp-port", 4791, "local UDP port")
	fs.Usage = func() { rping.Usage(fs.Output()) }
	return fs
}

func runRping(args []string) int {
	cfg, err := rping.Parse(args)
	if err != nil {
		fmt.Fprintf(os.Stderr, "softroce rping: %v\n\n", err)
		rping.Usage(os.Stderr)
		return rping.ExitCode(err)
	}
	if cfg.Help {
		rping.Usage(os.Stdout)
		return 0
	}
	// A server binds to its -a address; a client to -I, or to the
	// address that routes to the server.
	lf := linkFlags{backend: cfg.Backend, udpPort: cfg.UDPPort}
	peer := ""
	if cfg.Server {
		if cfg.Addr.IsValid() {
			lf.bind = cfg.Addr.String()
		}
	} else {
		if cfg.Source.IsValid() {
			lf.bind = cfg.Source.String()
		}
		peer = cfg.Addr.String()
	}
	// openLink's advice names --bind, which rping spells -a (server) or
	// -I (client): check the address here first.
	if lf.bind != "" {
		if _, err := udp.InterfaceOf(netip.MustParseAddr(lf.bind)); err != nil {
			flag := "-I"
			if cfg.Server {
				flag = "-a"
			}
			fmt.Fprintf(os.Stderr, "softroce rping: %s %s: no local interface has this address\n", flag, lf.bind)
			return rping.ExitFailed
		}
	} else if cfg.Server {
		a, err := localAddr("", "")
		if err != nil {
			fmt.Fprintln(os.Stderr, "softroce rping: no local IPv4 address found: give the one to listen on with -a ADDR")
			return rping.ExitFailed
		}
		lf.bind = a.String()
	}
	link, err := openLink(lf, peer)
	if err != nil {
		fmt.Fprintln(os.Stderr, "softroce rping:", err)
		return rping.ExitFailed
	}
	dev, err := verbs.Open(link, nil)
	if err != nil {
		link.Close()
		fmt.Fprintln(os.Stderr, "softroce rping:", err)
		return rping.ExitFailed
	}
	defer dev.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	return rping.ExitCode(rping.Run(ctx, dev, nil, cfg, os.Stdout, os.Stderr))
}
