package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"time"

	"github.com/softroce/softroce/nic/impair"
	"github.com/softroce/softroce/tools/pingpong"
	"github.com/softroce/softroce/verbs"
)

func init() {
	register("pingpong", "SEND ping-pong over RC, UC, UD or an SRQ, compatible with ibv_rc/uc/ud/srq_pingpong", runPingpong)
}

// pingpongOnly are the tool flags that not every pingpong tool has: the
// types whose tool has each.
var pingpongOnly = map[string][]pingpong.Type{
	"m": {pingpong.RC, pingpong.UC, pingpong.SRQ},
	"q": {pingpong.SRQ},
	"c": {pingpong.RC, pingpong.UC},
	// softroce's own: an address handle has no UDP port.
	"peer-udp-port": {pingpong.RC, pingpong.UC, pingpong.SRQ},
}

// pingpongFlags defines pingpong's flags, into cfg and lf where they go.
func pingpongFlags(cfg *pingpong.Config, lf *linkFlags) (fs *flag.FlagSet, typ *string, sl, ibPort *int, timeout *time.Duration, peerPort *int) {
	fs = flag.NewFlagSet("pingpong", flag.ContinueOnError)
	typ = fs.String("type", "rc", "transport, as the tool of that name: rc (ibv_rc_pingpong), uc, ud or srq (RC QPs on one SRQ)")
	fs.IntVar(&cfg.Port, "p", 18515, "TCP port of the out-of-band exchange")
	fs.IntVar(&cfg.Size, "s", 0, "size of message to exchange (default 4096; ud: 1024, at most the port's MTU)")
	fs.IntVar(&cfg.MTU, "m", 1024, "path MTU: 256, 512, 1024, 2048 or 4096 (rc, uc, srq)")
	fs.IntVar(&cfg.RxDepth, "r", 500, "number of receives to post at a time")
	fs.IntVar(&cfg.Iters, "n", 1000, "number of exchanges (srq: in total, over all QPs)")
	fs.IntVar(&cfg.NumQP, "q", 16, "number of QPs on the SRQ (srq)")
	fs.IntVar(&cfg.GIDIndex, "g", 0, "local GID index (the address given by --bind is index 0)")
	fs.BoolVar(&cfg.Events, "e", false, "sleep on CQ events (a completion channel) instead of polling")
	fs.BoolVar(&cfg.Check, "c", false, "validate received buffer (rc, uc)")
	sl = fs.Int("l", 0, "service level (0..15; carried in the address vector, no effect on the RoCEv2 wire)")
	_ = fs.String("d", "", "IB device (accepted for compatibility; the device is the --bind address)")
	ibPort = fs.Int("i", 1, "port of IB device (softroce has port 1 only)")
	timeout = fs.Duration("timeout", 60*time.Second, "give up after this long")
	fs.StringVar(&lf.bind, "bind", "", "local IP address to use (default: the one that routes to the server)")
	fs.StringVar(&lf.backend, "backend", "udp", "packet backend: udp or afxdp")
	fs.IntVar(&lf.udpPort, "udp-port", 4791, "local UDP port")
	peerPort = fs.Int("peer-udp-port", 4791, "the peer's UDP port (change only against another softroce on the same address)")
	fs.StringVar(&lf.impair, "impair", "", impairUsage)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: softroce pingpong [--type rc|uc|ud|srq] [flags]            start a server and wait for a connection\n       softroce pingpong [--type rc|uc|ud|srq] [flags] SERVER     connect to SERVER\n\n")
		fs.PrintDefaults()
	}
	return
}

func runPingpong(args []string) int {
	var cfg pingpong.Config
	var lf linkFlags
	fs, typ, sl, ibPort, timeout, peerPort := pingpongFlags(&cfg, &lf)
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	usage := func(format string, a ...any) int {
		fmt.Fprintf(os.Stderr, "softroce pingpong: "+format+"\n", a...)
		return 2
	}
	if fs.NArg() > 1 {
		return usage("one SERVER at most, got %q (flags go before it)", fs.Args())
	}
	cfg.Type = pingpong.Type(*typ)
	if !slices.Contains(pingpong.Types, cfg.Type) {
		return usage("unknown --type %q: choose rc, uc, ud or srq", *typ)
	}
	var bad error
	sizeSet := false
	fs.Visit(func(f *flag.Flag) {
		sizeSet = sizeSet || f.Name == "s"
		if types, ok := pingpongOnly[f.Name]; ok && !slices.Contains(types, cfg.Type) && bad == nil {
			bad = fmt.Errorf("%s has no -%s (it is a flag of --type %v)", cfg.Type.Tool(), f.Name, types)
			switch {
			case f.Name == "m" && cfg.Type == pingpong.UD:
				bad = fmt.Errorf("ibv_ud_pingpong has no -m: a UD message is one packet, so -s is bounded by the port's MTU instead")
			case f.Name == "peer-udp-port":
				bad = fmt.Errorf("--peer-udp-port does not work with --type ud: its address handles name an address, and UD datagrams go to UDP port 4791")
			}
		}
	})
	if bad != nil {
		return usage("%v", bad)
	}
	if cfg.Type != pingpong.SRQ {
		cfg.NumQP = 1
	}
	if *ibPort != 1 {
		return usage("-i %d: softroce's device has port 1 only", *ibPort)
	}
	if *sl < 0 || *sl > 15 {
		return usage("-l %d: a service level is 0..15", *sl)
	}
	if sizeSet && cfg.Size < 1 {
		return usage("-s %d: the message size is at least 1 byte", cfg.Size)
	}
	if cfg.RxDepth < 1 || cfg.Iters < 1 || cfg.NumQP < 1 || cfg.Port < 1 || cfg.Port > 65535 {
		return usage("-r, -n and -q take 1 or more and -p 1..65535 (got -r %d -n %d -q %d -p %d)", cfg.RxDepth, cfg.Iters, cfg.NumQP, cfg.Port)
	}
	cfg.SL = uint8(*sl)
	cfg.Server = fs.Arg(0)
	cfg.RemotePort = uint16(*peerPort)
	cfg.Timeout = *timeout
	if err := cfg.Defaults(); err != nil {
		return usage("%v", err)
	}
	var icfg *impair.Config
	if lf.impair != "" {
		c, err := parseImpair("pingpong", lf.impair, false)
		if err != nil {
			return usage("%v", err)
		}
		icfg = &c
	}
	link, err := openLink(lf, cfg.Server)
	if err != nil {
		fmt.Fprintln(os.Stderr, "softroce pingpong:", err)
		return 1
	}
	link = impairLink(link, icfg)
	dev, err := verbs.Open(link, nil)
	if err != nil {
		link.Close()
		fmt.Fprintln(os.Stderr, "softroce pingpong:", err)
		return 1
	}
	defer dev.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	res, err := pingpong.Run(ctx, dev, cfg, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "softroce pingpong:", err)
		return 1
	}
	if w, ok := link.(*impair.Link); ok {
		// What the impairment did and what it cost, after the tool's
		// own lines (which stay as ibv_*_pingpong prints them).
		st := res.Stats
		printImpairCounters(os.Stdout, w)
		fmt.Printf(" softroce QP: %d packets sent, %d received, %d retransmitted, %d timeouts, %d sequence NAKs sent, %d received\n",
			st.TxPackets, st.RxPackets, st.Retransmits, st.Timeouts, st.SeqNAKsSent, st.SeqNAKsRecv)
	}
	return 0
}
