package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/schollz/progressbar/v3"

	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/nic/congest"
	"github.com/softroce/softroce/nic/impair"
	"github.com/softroce/softroce/nic/pipe"
	"github.com/softroce/softroce/perf"
	"github.com/softroce/softroce/verbs"
)

// ccRates describes the QPs' rates and time held back by their pacers.
func ccRates(qps []verbs.CCQPStats) string {
	s := "QP rates"
	for i, q := range qps {
		if i > 0 {
			s += ","
		}
		s += fmt.Sprintf(" %.2f Gb/s (held %v)", q.RateBPS/1e9, time.Duration(q.RateLimitedNS).Round(time.Microsecond))
	}
	return s
}

func init() {
	register("bw", "measure bandwidth like perftest's ib_*_bw (server/client, or both in one process)", func(args []string) int { return runPerf("bw", args) })
	register("lat", "measure latency like perftest's ib_*_lat (server/client, or both in one process)", func(args []string) int { return runPerf("lat", args) })
}

// perfFlags are the flags of bw and lat.
type perfFlags struct {
	server   bool
	bind     string
	port     int
	udpPort  int
	test     string
	size     int
	sweep    bool
	qps      int
	iters    int
	seconds  float64
	mtu      int
	depth    int
	backend  string
	json     bool
	wait     time.Duration
	busy     busyPollFlag
	noInline bool
	rawUDP   bool
	impair   string
	cc       string
	plot     string
	congest  string
}

// busyPollFlag is --busy-poll (defaultBusyPoll) or --busy-poll=DURATION.
type busyPollFlag time.Duration

// defaultBusyPoll is what a bare --busy-poll spins for.
const defaultBusyPoll = time.Millisecond

func (b *busyPollFlag) String() string   { return time.Duration(*b).String() }
func (b *busyPollFlag) IsBoolFlag() bool { return true }
func (b *busyPollFlag) Set(s string) error {
	switch s {
	case "true":
		*b = busyPollFlag(defaultBusyPoll)
		return nil
	case "false":
		*b = 0
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return fmt.Errorf("want a duration such as 200us, or no value")
	}
	*b = busyPollFlag(d)
	return nil
}

// perfFlagSet defines the flags of bw or lat (kind), into f.
func perfFlagSet(kind string, f *perfFlags) (fs *flag.FlagSet) {
	lat := kind == "lat"
	fs = flag.NewFlagSet(kind, flag.ContinueOnError)
	fs.BoolVar(&f.server, "server", false, "wait for a client (run this first on the other host)")
	fs.StringVar(&f.bind, "bind", "", "local IP `ADDR` for data and the TCP exchange (default: the address the peer is reached from)")
	fs.IntVar(&f.port, "port", perf.DefaultPort, "TCP port of the out-of-band exchange")
	fs.IntVar(&f.port, "p", perf.DefaultPort, "same as --port (perftest's name)")
	fs.IntVar(&f.udpPort, "udp-port", nic.RoCEv2Port, "UDP port the data link listens on (both sides tell each other theirs)")
	fs.StringVar(&f.test, "test", "write", "operation: write, read, send or atomic (fetch-and-add)")
	defSize := perf.DefaultBWSize
	if lat {
		defSize = perf.DefaultLatSize
	}
	fs.IntVar(&f.size, "s", defSize, "message size in bytes")
	fs.BoolVar(&f.sweep, "sweep", false, "run every power of two from 2 bytes to 64 KiB (like perftest -a, which goes on to 8 MiB)")
	fs.BoolVar(&f.sweep, "a", false, "same as --sweep (perftest's name)")
	fs.IntVar(&f.qps, "q", 1, "number of queue pairs")
	defIters := perf.DefaultBWIters
	if lat {
		defIters = perf.DefaultLatIter
	}
	fs.IntVar(&f.iters, "n", defIters, "iterations per size")
	fs.Float64Var(&f.seconds, "D", 0, "run each size for this many `SECONDS` instead of -n iterations")
	fs.IntVar(&f.mtu, "mtu", 1024, "IB path MTU: 256, 512, 1024, 2048 or 4096")
	fs.IntVar(&f.depth, "tx-depth", perf.DefaultTxDepth, "operations each QP keeps in flight (bw)")
	fs.IntVar(&f.depth, "t", perf.DefaultTxDepth, "same as --tx-depth (perftest's name)")
	fs.StringVar(&f.backend, "backend", "udp", "data path: udp (kernel sockets), afxdp (root), or pipe (both sides in this process, no network)")
	fs.BoolVar(&f.json, "json", false, "print the results as JSON")
	fs.DurationVar(&f.wait, "wait", 5*time.Second, "how long the client keeps trying to reach the server")
	fs.StringVar(&f.impair, "impair", "", impairUsage)
	fs.BoolVar(&f.noInline, "no-inline-wait", false, "a blocked wait leaves receiving to the device's receive goroutine, which hands each completion over (a second wake-up per hop): for comparison with the default, where the waiter receives")
	fs.StringVar(&f.cc, "cc", "none", "congestion control of both sides' QPs: none, or dcqcn (ECN-capable packets, CNPs on CE marks, DCQCN pacing; its counters in --json)")
	fs.Var(&f.busy, "busy-poll", "the device's receive loop polls the link for this long (bare: 1ms) before it sleeps: lower latency for a core's worth of CPU (udp backend)")
	fs.StringVar(&f.plot, "plot", "", "with --cc dcqcn: record each QP's DCQCN rate (and the --congest queue) every 2 ms and draw them in `FILE`.html or FILE.svg at the end (client side)")
	fs.StringVar(&f.congest, "congest", "", "put a bottleneck on this side's sends, e.g. rate=1G,queue=256KB,kmin=20KB,kmax=100KB,pmax=20% (nic/congest syntax: ECN marks for --cc dcqcn, drops when full)")
	if lat {
		fs.BoolVar(&f.rawUDP, "raw-udp", false, "measure the reference instead: a plain UDP ping-pong of the same sizes between the same two hosts (server echoes on --udp-port; no RC, no TCP exchange)")
	}
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage:\n  softroce %s --server [flags]        on one host\n  softroce %s [flags] SERVER-ADDR      on the other\n  softroce %s --backend pipe [flags]   both sides in this process\n\n", kind, kind, kind)
		if lat {
			fmt.Fprintf(fs.Output(), "Each sample is one operation from post to completion (a round trip).\n\n")
		}
		fs.PrintDefaults()
	}
	return
}

func runPerf(kind string, args []string) int {
	lat := kind == "lat"
	var f perfFlags
	fs := perfFlagSet(kind, &f)
	// Flags may come before or after the peer address.
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	var peer string
	if fs.NArg() > 0 {
		peer = fs.Arg(0)
		if code, ok := parseFlags(fs, fs.Args()[1:]); !ok {
			return code
		}
		if fs.NArg() > 0 {
			fmt.Fprintf(os.Stderr, "softroce %s: unexpected argument %q\n", kind, fs.Arg(0))
			return 2
		}
	}
	fail := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, "softroce %s: %s\n", kind, fmt.Sprintf(format, args...))
		return 2
	}
	test, err := perf.ParseTest(f.test)
	if err != nil {
		return fail("--test: %v", err)
	}
	c := perf.Config{Test: test, Sizes: []int{f.size}, Iters: f.iters, QPs: f.qps, MTU: f.mtu, TxDepth: f.depth,
		Duration: time.Duration(f.seconds * float64(time.Second)), BusyPoll: time.Duration(f.busy), NoInlineWait: f.noInline}
	if f.sweep {
		c.Sizes = perf.SweepSizes()
	}
	if c.CC, err = verbs.ParseCCMode(f.cc); err != nil || c.CC == verbs.CCDevice {
		return fail("--cc %q: want none or dcqcn", f.cc)
	}
	if f.port < 1 || f.port > 65535 {
		return fail("--port %d: want 1..65535", f.port)
	}
	if f.udpPort < 1 || f.udpPort > 65535 {
		return fail("--udp-port %d: want 1..65535", f.udpPort)
	}
	var bind netip.Addr
	if f.bind != "" {
		if bind, err = netip.ParseAddr(f.bind); err != nil {
			return fail("--bind %s: not an IP address", f.bind)
		}
		bind = bind.Unmap()
		if err := perf.CheckLocal(bind); err != nil {
			return fail("--bind %s: %v", f.bind, err)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	var icfg impair.Config
	if f.impair != "" {
		if f.rawUDP {
			return fail("the raw UDP reference measures the plain path: drop --impair")
		}
		if icfg, err = parseImpair(kind, f.impair, false); err != nil {
			return fail("%v", err)
		}
	}
	var ccfg *congest.Config
	if f.congest != "" {
		if f.rawUDP {
			return fail("the raw UDP reference measures the plain path: drop --congest")
		}
		cfg, err := congest.Parse(f.congest)
		if err != nil {
			return fail("--congest %s: %v", f.congest, err)
		}
		ccfg = &cfg
	}
	var rec *plotRecorder
	if f.plot != "" {
		format, ok := plotFormat(f.plot)
		switch {
		case !ok:
			return fail("--plot %s: want a FILE.html or FILE.svg", f.plot)
		case c.CC != verbs.CCDCQCN:
			return fail("--plot draws DCQCN's rates: give --cc dcqcn too")
		case f.server:
			return fail("--plot records the client's QPs: give it on the client")
		}
		rec = &plotRecorder{file: f.plot, format: format}
		c.Started = rec.start
	}
	// wrap puts the --congest bottleneck under this side's sends.
	wrap := func(l nic.Link) (nic.Link, error) {
		if ccfg == nil {
			return l, nil
		}
		w, err := congest.Wrap(l, *ccfg)
		if err != nil {
			return nil, err
		}
		if rec != nil {
			rec.link.Store(w)
		}
		return w, nil
	}
	if f.rawUDP {
		c.Test = perf.RawTest
	}
	pr := newPrinter(out, kind, lat, &c, f.json)
	if f.rawUDP {
		return runRawUDP(ctx, &f, c, bind, peer, pr, fail)
	}

	switch f.backend {
	case "pipe":
		if f.server || peer != "" {
			return fail("--backend pipe runs both sides in this process: give neither --server nor a peer")
		}
		c.Progress = pr.progress
		var links *[2]nic.Link
		if f.impair != "" || ccfg != nil {
			lc, ls := pipe.New(pipe.Config{Depth: 4096})
			// The bottleneck is on the client's sends, the data's way.
			if lc, err = wrap(lc); err != nil {
				return fail("--congest: %v", err)
			}
			if f.impair != "" {
				// Both directions impaired, each with its own stream.
				sc := icfg
				sc.Seed++
				lc, ls = impair.Wrap(lc, icfg), impair.Wrap(ls, sc)
			}
			links = &[2]nic.Link{lc, ls}
		}
		l, err := perf.RunLocal(ctx, c, lat, links, [2]uint16{}, pr.row)
		rec.stop()
		if err != nil {
			fmt.Fprintf(os.Stderr, "softroce %s: %v\n", kind, err)
			return 1
		}
		l.Close()
		l.Report.Backend = "pipe"
		if code := rec.write(kind); code != 0 {
			return code
		}
		return pr.finish(l.Report)
	case "udp", "afxdp":
	default:
		return fail("--backend %q: want udp, afxdp or pipe", f.backend)
	}
	open := perf.Opener(f.backend, bind, f.udpPort)
	if f.impair != "" || ccfg != nil {
		plain := open
		open = func(local netip.Addr) (nic.Link, uint16, error) {
			l, port, err := plain(local)
			if err != nil {
				return nil, 0, err
			}
			if l, err = wrap(l); err != nil {
				return nil, 0, err
			}
			if f.impair != "" {
				l = impair.Wrap(l, icfg)
			}
			return l, port, nil
		}
	}
	if f.server {
		if peer != "" {
			return fail("--server takes no peer address")
		}
		laddr := ":" + strconv.Itoa(f.port)
		if bind.IsValid() {
			laddr = netip.AddrPortFrom(bind, uint16(f.port)).String()
		}
		ln, err := net.Listen("tcp", laddr)
		if err != nil {
			if errors.Is(err, syscall.EADDRINUSE) {
				fmt.Fprintf(os.Stderr, "softroce %s: --port %d: TCP port already in use (is another `softroce %s --server` running?); pick another with --port\n", kind, f.port, kind)
			} else {
				fmt.Fprintf(os.Stderr, "softroce %s: listen on %s: %v\n", kind, laddr, err)
			}
			return 1
		}
		fmt.Fprintf(os.Stderr, "softroce %s: waiting for a client on TCP %v (data over %s, UDP port %d)\n", kind, ln.Addr(), f.backend, f.udpPort)
		rep, err := perf.Serve(ctx, ln, perf.ServerConfig{Open: open, Backend: f.backend, Log: os.Stderr, BusyPoll: time.Duration(f.busy), NoInlineWait: f.noInline})
		if err != nil {
			fmt.Fprintf(os.Stderr, "softroce %s: %v\n", kind, err)
			return 1
		}
		// Describe the run the client made, not this side's flags.
		c.Test, c.QPs, c.MTU, c.Duration, c.TxDepth = rep.Test, rep.QPs, rep.MTU, 0, 0
		if len(rep.BW) > 0 {
			c.Iters = int(rep.BW[0].Iterations)
		} else if len(rep.Lat) > 0 {
			c.Iters = int(rep.Lat[0].Iterations)
		}
		pr.header()
		for i := range rep.BW {
			pr.row(&rep.BW[i])
		}
		for i := range rep.Lat {
			pr.row(&rep.Lat[i])
		}
		return pr.finish(rep)
	}
	if peer == "" {
		return fail("give the server's address (or --server on the other side, or --backend pipe)")
	}
	pa, err := perf.ParsePeer(peer, f.port)
	if err != nil {
		return fail("%v", err)
	}
	c.Progress = pr.progress
	rep, err := perf.Run(ctx, perf.ClientConfig{Peer: pa, Wait: f.wait, Open: open, Backend: f.backend, Command: kind}, c, lat, pr.row)
	rec.stop()
	if err != nil {
		out.Flush()
		fmt.Fprintf(os.Stderr, "softroce %s: %v\n", kind, err)
		return 1
	}
	if code := rec.write(kind); code != 0 {
		return code
	}
	return pr.finish(rep)
}

// printer writes rows as they come, and the progress bar.
type printer struct {
	w         io.Writer
	kind      string
	lat, json bool
	c         *perf.Config
	headed    bool
	bar       *progressbar.ProgressBar
	started   time.Time
	terminal  bool
}

func newPrinter(w io.Writer, kind string, lat bool, c *perf.Config, asJSON bool) *printer {
	return &printer{w: w, kind: kind, lat: lat, json: asJSON, c: c, terminal: isTerminal(os.Stderr)}
}

func (p *printer) header() {
	if p.headed || p.json {
		return
	}
	p.headed = true
	cfg := *p.c
	if cfg.QPs == 0 {
		cfg.QPs = 1
	}
	if cfg.Test == perf.RawTest {
		perf.WriteRawLatHeader(p.w, &cfg)
	} else if p.lat {
		perf.WriteLatHeader(p.w, perf.Title(cfg.Test, true), &cfg)
	} else {
		perf.WriteBWHeader(p.w, perf.Title(cfg.Test, false), &cfg)
	}
	if f, ok := p.w.(*bufio.Writer); ok {
		f.Flush()
	}
}

// progress shows a bar on stderr once a size has run for a second, and
// only on a terminal. total 0 (a timed run) shows a spinner.
func (p *printer) progress(done, total int64) {
	// The first report means the run has started: show the header now
	// rather than after the first size.
	p.header()
	if !p.terminal {
		return
	}
	if p.started.IsZero() {
		p.started = time.Now()
	}
	if p.bar == nil {
		if time.Since(p.started) < time.Second || (total != 0 && done >= total) {
			return
		}
		max := total
		if max == 0 {
			max = -1
		}
		p.bar = progressbar.NewOptions64(max, progressbar.OptionSetWriter(os.Stderr), progressbar.OptionClearOnFinish(),
			progressbar.OptionSetDescription("softroce "+p.kind), progressbar.OptionShowCount(), progressbar.OptionThrottle(100*time.Millisecond))
	}
	_ = p.bar.Set64(done)
}

func (p *printer) row(r any) {
	if p.bar != nil {
		_ = p.bar.Finish()
		p.bar = nil
	}
	p.started = time.Time{}
	if p.json {
		return
	}
	p.header()
	var retx uint64
	var size int
	switch r := r.(type) {
	case *perf.BWResult:
		perf.WriteBWRow(p.w, r)
		retx, size = r.Retransmits, r.Bytes
		if c := r.CC; c != nil {
			fmt.Fprintf(os.Stderr, "softroce %s: %d bytes: dcqcn: %d CNPs handled, %d ignored; %s\n", p.kind, size,
				c.Device.RPCNPHandled, c.Device.RPCNPIgnored, ccRates(c.QPs))
		}
	case *perf.LatResult:
		perf.WriteLatRow(p.w, r)
		retx, size = r.Retransmits, r.Bytes
	}
	if retx > 0 {
		// On stderr, so the table stays in perftest's shape for scripts.
		fmt.Fprintf(os.Stderr, "softroce %s: %d bytes: %d packets retransmitted (the path dropped packets; RC recovered)\n", p.kind, size, retx)
	}
	if f, ok := p.w.(*bufio.Writer); ok {
		f.Flush()
	}
}

func (p *printer) finish(rep *perf.Report) int {
	if p.json {
		if err := perf.WriteJSON(p.w, rep); err != nil {
			fmt.Fprintf(os.Stderr, "softroce %s: %v\n", p.kind, err)
			return 1
		}
		return 0
	}
	if p.headed {
		perf.WriteFooter(p.w)
	}
	return 0
}
