package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/nic/afxdp"
	"github.com/softroce/softroce/nic/impair"
	"github.com/softroce/softroce/nic/udp"
	"github.com/softroce/softroce/tools/perftest"
	"github.com/softroce/softroce/verbs"
)

func init() {
	register("perftest", "WRITE/READ/atomic/SEND bandwidth or latency, protocol-compatible with ib_write_bw, ib_read_bw, ib_atomic_bw, ib_send_bw and their _lat twins", runPerftest)
}

// perftestFlags defines perftest's flags, into cfg and lf where they go.
func perftestFlags(cfg *perftest.Config, lf *linkFlags) (fs *flag.FlagSet, qpTimeout *uint, atomicOp *string, duration *int, connType *string, timeout *time.Duration, xdpMode *string, peerPort *int, cpuProfile *string, sockBuf *int) {
	fs = flag.NewFlagSet("perftest", flag.ContinueOnError)
	fs.IntVar(&cfg.Port, "p", perftest.DefaultPort, "TCP port of the out-of-band exchange")
	fs.IntVar(&cfg.Size, "s", 0, "message size (default 65536, --lat 2; atomics are 8)")
	fs.IntVar(&cfg.Iters, "n", 0, "iterations (default 5000 for write, 1000 for the others and with --lat)")
	fs.BoolVar(&cfg.Latency, "lat", false, "latency test, against ib_write_lat, ib_read_lat, ib_atomic_lat or ib_send_lat (one RC QP; also selected by the test word write_lat, ...)")
	fs.IntVar(&cfg.MTU, "m", 0, "path MTU: 256, 512, 1024, 2048 or 4096 (default: the port's active MTU; the smaller side wins)")
	fs.IntVar(&cfg.GIDIndex, "x", 0, "local GID index (the --bind address is index 0)")
	fs.IntVar(&cfg.TxDepth, "t", 128, "outstanding work requests")
	fs.IntVar(&cfg.RxDepth, "r", 512, "receives kept posted (send, receiving side)")
	fs.IntVar(&cfg.CQMod, "Q", 100, "signal one work request in this many")
	fs.IntVar(&cfg.OutReads, "o", 16, "outstanding READ/atomic requests (announced to the peer)")
	qpTimeout = fs.Uint("u", 14, "QP timeout exponent: the local ACK timeout is 4.096 us << u")
	fs.BoolVar(&cfg.AdaptiveTimeout, "adaptive-timeout", false, "RC: let the local ACK timeout follow the measured round trip, never below -u's (for unevenly scheduled hosts, e.g. emulated guests)")
	atomicOp = fs.String("A", "FETCH_AND_ADD", "atomic operation: FETCH_AND_ADD or CMP_AND_SWAP")
	fs.BoolVar(&cfg.Gbits, "report_gbits", false, "report Gbit/s instead of MB/s")
	fs.IntVar(&cfg.QPs, "q", 1, "number of QPs; -n iterations on each")
	fs.BoolVar(&cfg.Duplex, "b", false, "bidirectional: both sides post traffic (write, read, atomic)")
	fs.BoolVar(&cfg.All, "a", false, "run every size from 2 bytes to 8 MiB (UD: to the MTU), -n iterations each, a row per size; give it to both sides (not atomic)")
	fs.BoolVar(&cfg.All, "all", false, "same as -a")
	duration = fs.Int("D", 0, "post for this many seconds instead of -n iterations and report the middle of the run (a quarter left out at either end); send: give it to both sides")
	fs.IntVar(duration, "duration", 0, "same as -D")
	fs.BoolVar(&cfg.Infinite, "run_infinitely", false, "post until interrupted (Ctrl-C), printing a row every -D seconds (default 5); give it to both sides")
	_ = fs.String("d", "", "IB device (accepted; the device is the --bind address)")
	_ = fs.Int("i", 1, "port of the IB device (accepted; softroce has port 1)")
	_ = fs.Bool("F", false, "do not fail on CPU frequency warnings (accepted)")
	_ = fs.Bool("e", false, "sleep on CQ events (accepted; softroce always waits without spinning)")
	connType = fs.String("c", "RC", "connection type: RC, UC for write and send, UD for send (as perftest, give both sides the same)")
	fs.BoolVar(&cfg.RDMACM, "R", false, "connect with rdma_cm on port -p (RDMA_PS_TCP; UD QPs by SIDR on RDMA_PS_UDP) instead of the TCP exchange; SERVER is then the peer's RoCE IP address")
	fs.BoolVar(&cfg.RDMACM, "rdma_cm", false, "same as -R")
	timeout = fs.Duration("timeout", 120*time.Second, "give up after this long, waiting for the peer included; 0: never (as perftest); -D adds to it, --run_infinitely has none")
	fs.StringVar(&lf.bind, "bind", "", "local IP address to use (default: the one that routes to the server)")
	fs.StringVar(&lf.backend, "backend", "udp", "packet backend: udp or afxdp")
	xdpMode = fs.String("xdp-mode", "auto", "with --backend afxdp: auto (native, else generic), native or generic (skb)")
	fs.IntVar(&lf.udpPort, "udp-port", 4791, "local UDP port")
	peerPort = fs.Int("peer-udp-port", 4791, "the peer's UDP port (change only against another softroce on the same address)")
	cpuProfile = fs.String("cpuprofile", "", "write a CPU profile of the run to this file")
	sockBuf = fs.Int("socket-buffer", 4<<20, "udp backend: SO_RCVBUF/SO_SNDBUF bytes (capped by net.core.rmem_max); a full receive buffer drops packets and costs go-back-N retransmissions")
	fs.StringVar(&lf.impair, "impair", "", impairUsage)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: softroce perftest write|read|atomic|send [flags]          wait for a client (passive side)\n"+
			"       softroce perftest write|read|atomic|send [flags] SERVER   connect and post the traffic (active side)\n"+
			"       softroce perftest write|read|atomic|send --lat [flags] [SERVER]   latency (or write_lat, ...)\n\n"+
			"Talks to ib_write_bw, ib_read_bw, ib_atomic_bw and ib_send_bw (Debian's perftest 4.5, which announces\nversion 6.06; TCP exchange or rdma_cm\nwith -R; RC, UC with -c UC for write and send, UD with -c UD for send) in either role.\n"+
			"-a runs every size (a row each), -D SECONDS a timed run, --run_infinitely a row every -D seconds until Ctrl-C.\n"+
			"--lat speaks ib_write_lat, ib_read_lat, ib_atomic_lat and ib_send_lat (RC, TCP exchange, -n iterations of one size):\n"+
			"write and send ping-pong and both sides print the table; for read and atomic only the client posts and prints.\n\n")
		fs.PrintDefaults()
	}
	return
}

func runPerftest(args []string) int {
	var cfg perftest.Config
	var lf linkFlags
	fs, qpTimeout, atomicOp, duration, connType, timeout, xdpMode, peerPort, cpuProfile, sockBuf := perftestFlags(&cfg, &lf)
	// Flags may come before the test word too, as in scripts written for
	// ib_write_bw ("perftest -s 4096 write").
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return 2
	}
	word := fs.Arg(0)
	if w, ok := strings.CutSuffix(word, "_lat"); ok {
		// ib_write_lat, write_lat: the latency test.
		word, cfg.Latency = w, true
	}
	test, err := perftest.ParseTest(word)
	if err != nil {
		fmt.Fprintln(os.Stderr, "softroce perftest:", err)
		return 2
	}
	if code, ok := parseFlags(fs, fs.Args()[1:]); !ok {
		return code
	}
	// Flags after the server name, as perftest allows.
	var rest []string
	for fs.NArg() > 0 {
		rest = append(rest, fs.Arg(0))
		if code, ok := parseFlags(fs, fs.Args()[1:]); !ok {
			return code
		}
	}
	if len(rest) > 1 {
		fs.Usage()
		return 2
	}
	if lf.xdpMode, err = afxdp.ParseMode(*xdpMode); err != nil {
		fmt.Fprintln(os.Stderr, "softroce perftest: --xdp-mode:", err)
		return 2
	}
	switch strings.ToUpper(*connType) {
	case "RC":
	case "UC":
		if test != perftest.Write && test != perftest.Send {
			fmt.Fprintf(os.Stderr, "softroce perftest: -c UC: UC connection not possible with %s (UC has no READ or atomics)\n", test)
			return 2
		}
		cfg.Conn = verbs.QPTypeUC
		if cfg.RDMACM {
			fmt.Fprintln(os.Stderr, "softroce perftest: -c UC: UC is not supported in librdmacm (drop -R)")
			return 2
		}
	case "UD":
		if test != perftest.Send {
			fmt.Fprintf(os.Stderr, "softroce perftest: -c UD: UD connection only possible in SEND verb (use softroce perftest send -c UD)\n")
			return 2
		}
		cfg.Conn = verbs.QPTypeUD
	default:
		fmt.Fprintf(os.Stderr, "softroce perftest: -c %s: RC, UC and UD are implemented\n", *connType)
		return 2
	}
	cfg.Test = test
	if *qpTimeout < 1 || *qpTimeout > 31 {
		fmt.Fprintln(os.Stderr, "softroce perftest: -u must be 1..31")
		return 2
	}
	cfg.QPTimeout = uint8(*qpTimeout)
	if *duration < 0 {
		fmt.Fprintln(os.Stderr, "softroce perftest: -D must be a positive number of seconds")
		return 2
	}
	cfg.Duration = time.Duration(*duration) * time.Second
	if cfg.All && cfg.Duration > 0 && !cfg.Infinite {
		fmt.Fprintln(os.Stderr, "softroce perftest: Duration mode currently doesn't support running on all sizes.")
		return 2
	}
	if cfg.All && test == perftest.Atomic && !cfg.Infinite {
		fmt.Fprintln(os.Stderr, "softroce perftest: Message size cannot be changed for Atomic tests (-a)")
		return 2
	}
	switch strings.ToUpper(*atomicOp) {
	case "FETCH_AND_ADD":
		cfg.Atomic = perftest.FetchAndAdd
	case "CMP_AND_SWAP":
		cfg.Atomic = perftest.CmpAndSwap
	default:
		fmt.Fprintf(os.Stderr, "softroce perftest: -A %q: want FETCH_AND_ADD or CMP_AND_SWAP\n", *atomicOp)
		return 2
	}
	if len(rest) == 1 {
		cfg.Server = rest[0]
	}
	cfg.RemotePort = uint16(*peerPort)
	cfg.Timeout = *timeout
	if cfg.Timeout <= 0 {
		cfg.Timeout = 100 * 365 * 24 * time.Hour
	}
	var icfg *impair.Config
	if lf.impair != "" {
		c, err := parseImpair("perftest", lf.impair, false)
		if err != nil {
			fmt.Fprintln(os.Stderr, "softroce perftest:", err)
			return 2
		}
		icfg = &c
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "softroce perftest: --cpuprofile:", err)
			return 1
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, "softroce perftest: start CPU profile:", err)
			return 1
		}
		defer pprof.StopCPUProfile()
	}
	link, err := openPerftestLink(lf, cfg.Server, *sockBuf)
	if err != nil {
		fmt.Fprintln(os.Stderr, "softroce perftest:", err)
		return 1
	}
	link = impairLink(link, icfg)
	dev, err := verbs.Open(link, nil)
	if err != nil {
		link.Close()
		fmt.Fprintln(os.Stderr, "softroce perftest:", err)
		return 1
	}
	defer dev.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if cfg.Infinite {
		// The first Ctrl-C ends the endless run the way the exchange
		// allows; a second one gives up at once.
		stopRun := make(chan struct{})
		cfg.Stop = stopRun
		sigs := make(chan os.Signal, 2)
		signal.Notify(sigs, os.Interrupt)
		defer signal.Stop(sigs)
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(context.Background())
		defer cancel()
		go func() {
			<-sigs
			close(stopRun)
			<-sigs
			cancel()
		}()
	}
	kind := "BW"
	if cfg.Latency {
		kind = "Latency"
	}
	fmt.Printf("%s\n                    %s %s Test (softroce, perftest protocol %s)\n", strings.Repeat("-", 87), testTitle(test, cfg.Atomic), kind, perftest.Version)
	switch {
	case cfg.Server == "" && cfg.RDMACM:
		fmt.Printf(" Waiting for client rdma_cm QP to connect on port %d...\n", cfg.Port)
	case cfg.Server == "":
		fmt.Printf(" Waiting for client to connect on TCP port %d...\n", cfg.Port)
	}
	res, err := perftest.Run(ctx, dev, cfg, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "softroce perftest:", err)
		return 1
	}
	st := res.Stats
	fmt.Printf(" softroce QP: %d packets sent, %d received, %d retransmitted, %d timeouts, %d sequence NAKs sent, %d received\n",
		st.TxPackets, st.RxPackets, st.Retransmits, st.Timeouts, st.SeqNAKsSent, st.SeqNAKsRecv)
	// Where packets went missing, when they did: the QPs' drops, the
	// packets the link refused to send and the ones it dropped on receive.
	ls, es, ds := link.Stats(), dev.Stats(), dev.DriverStats()
	fmt.Printf(" softroce drops: QP %d duplicate requests, %d out of sequence, %d dropped, %d RNR NAKs sent, %d received; engine %d malformed, %d unknown QP, %d bad header; driver %d refused sends; link %d received, %d sent, %d ICRC bad, %d malformed, %d truncated, %d send errors\n",
		st.DupRequests, st.OutOfSeqRequests, st.Dropped, st.RNRNAKsSent, st.RNRNAKsRecv,
		es.RxMalformed, es.RxUnknownQP, es.RxBadHeader, ds.TxDropped,
		ls.RxPackets, ls.TxPackets, ls.RxICRCBad, ls.RxMalformed, ls.RxTruncated, ls.TxErrors)
	if w, ok := link.(*impair.Link); ok {
		printImpairCounters(os.Stdout, w)
	}
	if e := res.Engine; e != nil {
		// The figures above come from this run of the traffic engine;
		// its packet rates are counted by the QPs, not derived from bytes.
		fmt.Printf(" softroce traffic: %d messages in %v, %.0f packets/s sent, %.0f received\n",
			e.Messages, e.Elapsed.Round(time.Microsecond), e.TxPktRate, e.RxPktRate)
	}
	return 0
}

// openPerftestLink opens the backend like openLink, but gives the udp
// backend bigger socket buffers: a bandwidth test keeps up to -t messages
// in flight, far more than the default receive buffer holds.
func openPerftestLink(lf linkFlags, peer string, sockBuf int) (nic.Link, error) {
	if lf.backend != "" && lf.backend != "udp" {
		return openLink(lf, peer)
	}
	addr, err := localAddr(lf.bind, peer)
	if err != nil {
		return nil, err
	}
	l, err := udp.Open(udp.Config{Addr: addr, Port: lf.udpPort, SocketBuffer: sockBuf})
	if err != nil {
		return nil, udpOpenError(err, addr, lf.udpPort)
	}
	return l, nil
}

func testTitle(t perftest.Test, op perftest.AtomicOp) string {
	switch t {
	case perftest.Read:
		return "RDMA_Read"
	case perftest.Send:
		return "Send"
	case perftest.Atomic:
		if op == perftest.CmpAndSwap {
			return "Atomic CMP_AND_SWAP"
		}
		return "Atomic FETCH_AND_ADD"
	}
	return "RDMA_Write"
}
