package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"time"

	"github.com/softroce/softroce/conformance/rcpingpong"
	"github.com/softroce/softroce/verbs"
)

func init() {
	register("pingpong", "RC SEND ping-pong, wire- and protocol-compatible with ibv_rc_pingpong", runPingpong)
}

func runPingpong(args []string) int {
	fs := flag.NewFlagSet("pingpong", flag.ContinueOnError)
	var cfg rcpingpong.Config
	var lf linkFlags
	fs.IntVar(&cfg.Port, "p", 18515, "TCP port of the out-of-band exchange")
	fs.IntVar(&cfg.Size, "s", 4096, "size of message to exchange")
	fs.IntVar(&cfg.MTU, "m", 1024, "path MTU (256, 512, 1024, 2048, 4096)")
	fs.IntVar(&cfg.RxDepth, "r", 500, "number of receives to post at a time")
	fs.IntVar(&cfg.Iters, "n", 1000, "number of exchanges")
	fs.IntVar(&cfg.GIDIndex, "g", 0, "local GID index (the address given by --bind is index 0)")
	fs.BoolVar(&cfg.Events, "e", false, "sleep on CQ events (accepted; softroce always waits without spinning)")
	fs.BoolVar(&cfg.Check, "c", false, "validate received buffer")
	ib := fs.String("d", "", "IB device (accepted for compatibility; the device is the --bind address)")
	_ = fs.Int("i", 1, "port of IB device (accepted; softroce has port 1)")
	_ = fs.Int("l", 0, "service level (accepted; no effect on RoCEv2)")
	timeout := fs.Duration("timeout", 60*time.Second, "give up after this long")
	fs.StringVar(&lf.bind, "bind", "", "local IP address to use (default: the one that routes to the server)")
	fs.StringVar(&lf.backend, "backend", "udp", "packet backend: udp or afxdp")
	fs.IntVar(&lf.udpPort, "udp-port", 4791, "local UDP port")
	peerPort := fs.Int("peer-udp-port", 4791, "the peer's UDP port (change only against another softroce on the same address)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: softroce pingpong [flags]            start a server and wait for a connection\n       softroce pingpong [flags] SERVER     connect to SERVER\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	_ = ib
	if fs.NArg() > 1 {
		fs.Usage()
		return 2
	}
	cfg.Server = fs.Arg(0)
	cfg.RemotePort = uint16(*peerPort)
	cfg.Timeout = *timeout
	link, err := openLink(lf, cfg.Server)
	if err != nil {
		fmt.Fprintln(os.Stderr, "softroce pingpong:", err)
		return 1
	}
	dev, err := verbs.Open(link, nil)
	if err != nil {
		link.Close()
		fmt.Fprintln(os.Stderr, "softroce pingpong:", err)
		return 1
	}
	defer dev.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if _, err := rcpingpong.Run(ctx, dev, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "softroce pingpong:", err)
		return 1
	}
	return 0
}
