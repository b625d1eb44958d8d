package main

import (
	"cmp"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/softroce/softroce/abi"
	"github.com/softroce/softroce/nic/afxdp"
	"github.com/softroce/softroce/nic/impair"
	"github.com/softroce/softroce/serve"
	"github.com/softroce/softroce/verbs"
)

func init() {
	register("serve", "the daemon unmodified libibverbs programs use (through softroce run)", runServe)
	register("status", "what the daemon serves: devices, client processes, their QPs, counters", runStatus)
	register("abi", "build the libibverbs.so.1 that unmodified programs load: softroce abi build", runABI)
}

// addrList is a repeatable --addr flag.
type addrList []string

func (a *addrList) String() string     { return strings.Join(*a, ",") }
func (a *addrList) Set(s string) error { *a = append(*a, s); return nil }

// serveFlags defines serve's flags, the addresses into addrs.
func serveFlags(addrs *addrList) (fs *flag.FlagSet, backend, xdpMode, sock, group, ccMode, imp *string, port, peerPort *int, quiet, linkLocal *bool, lim *serve.Limits) {
	fs = flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.Var(addrs, "addr", "local IP address of a device (repeat for more devices; default: the host's first IPv4 address)")
	fs.Var(addrs, "bind", "the same as --addr")
	backend = fs.String("backend", "udp", "udp (portable, unprivileged) or afxdp (root)")
	xdpMode = fs.String("xdp-mode", "auto", "with --backend afxdp: auto (native, else generic), native or generic (skb)")
	sock = fs.String("socket", "", "Unix socket path (default $SOFTROCE_SOCKET, else per network namespace: /run/softroce/softroce-net<INODE>.sock\n"+
		"for root, $TMPDIR/softroce-<UID>/softroce-net<INODE>.sock for others, INODE that of /proc/self/ns/net);\n"+
		"its directory must be the daemon's user's and writable by nobody else")
	group = fs.String("group", "", "let this group use the daemon (socket mode 0770); default: only the daemon's user (0700).\n"+
		"Members of the group find and accept it with "+serve.DaemonUIDEnv+"=<the daemon's uid> (softroce run --daemon-uid UID)")
	port = fs.Int("udp-port", 0, "UDP port to listen on (default 4791)")
	peerPort = fs.Int("peer-udp-port", 0, "UDP port the peers listen on (default: --udp-port; change only against another softroce on the same address)")
	quiet = fs.Bool("q", false, "print nothing but errors")
	linkLocal = fs.Bool("link-local", true, "with --backend udp: also serve the interface's IPv6 link-local address as GID 0,\n"+
		"before the --addr address (GID 1), as kernel RoCE devices (rdma_rxe) order their GID table;\n"+
		"nothing changes on an interface without one (loopback, IPv6 off)")
	ccMode = fs.String("cc", "none", "congestion control of every RC QP: none, or dcqcn (ECN-capable packets, CNPs on CE marks, DCQCN pacing; counters in softroce status)")
	imp = fs.String("impair", "", impairUsage+";\n"+
		"every device's, so that the programs 'softroce run' starts see a lossy network")
	lim = limitFlags(fs)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: softroce serve [--addr IP]... [--backend udp|afxdp [--xdp-mode auto|native|generic]] [--link-local=false] [--socket PATH] [--group NAME] [--cc none|dcqcn] [--impair SPEC]\n\n"+
			"Owns one softroce device per address and serves the programs that 'softroce run' starts.\n"+
			"Programs use a daemon only if it runs as their user or root (or as "+serve.DaemonUIDEnv+" says) and serves\n"+
			"their network namespace: run one daemon per namespace; a second one in a namespace needs --socket.\n\n")
		fs.PrintDefaults()
	}
	return
}

func runServe(args []string) int {
	var addrs addrList
	fs, backend, xdpMode, sock, group, ccMode, imp, port, peerPort, quiet, linkLocal, lim := serveFlags(&addrs)
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	if len(addrs) == 0 {
		addrs = addrList{""}
	}
	mode, err := afxdp.ParseMode(*xdpMode)
	if err != nil {
		fmt.Fprintf(os.Stderr, "softroce serve: --xdp-mode: %v\n", err)
		return 2
	}
	cc, err := verbs.ParseCCMode(*ccMode)
	if err != nil || cc == verbs.CCDevice {
		fmt.Fprintf(os.Stderr, "softroce serve: --cc %q: want none or dcqcn\n", *ccMode)
		return 2
	}
	var icfg *impair.Config
	if *imp != "" {
		c, err := parseImpair("serve", *imp, *quiet)
		if err != nil {
			fmt.Fprintf(os.Stderr, "softroce serve: %v\n", err)
			return 2
		}
		icfg = &c
	}
	var devs []*verbs.Device
	for i, a := range addrs {
		var warn func(string, ...any)
		if !*quiet {
			warn = func(format string, args ...any) {
				fmt.Fprintf(os.Stderr, "softroce serve: "+format+"\n", args...)
			}
		}
		link, err := openLink(linkFlags{backend: *backend, bind: a, udpPort: *port, xdpMode: mode, linkLocal: *linkLocal, warn: warn}, "")
		if err != nil {
			fmt.Fprintf(os.Stderr, "softroce serve: %v\n", err)
			return 1
		}
		if icfg != nil {
			// Each device its own stream of decisions.
			c := *icfg
			c.Seed += uint64(i)
			link = impairLink(link, &c)
		}
		// The daemon's receive goroutine serves its clients' rings; the
		// only goroutine that waits on a CQ is the CM's, for MADs, and
		// while it handled one no one would receive: no inline waits.
		opts := &verbs.Options{Name: fmt.Sprintf("softroce%d", i), NoInlineWait: true}
		if cc == verbs.CCDCQCN {
			p := verbs.CCDefaults()
			opts.CC = &p
		}
		d, err := verbs.Open(link, opts)
		if err != nil {
			link.Close()
			fmt.Fprintf(os.Stderr, "softroce serve: %v\n", err)
			return 1
		}
		devs = append(devs, d)
	}
	var lg *log.Logger
	if !*quiet {
		lg = log.New(os.Stderr, "softroce serve: ", 0)
	}
	s, err := serve.New(devs, serve.Config{Socket: *sock, Group: *group, Log: lg, RemotePort: uint16(cmp.Or(*peerPort, *port)), Limits: *lim})
	if err != nil {
		fmt.Fprintf(os.Stderr, "softroce serve: %v\n", err)
		return 1
	}
	if err := s.Listen(); err != nil {
		s.Close()
		fmt.Fprintf(os.Stderr, "softroce serve: %v\n", err)
		return 1
	}
	if !*quiet {
		for _, d := range devs {
			what, l := *backend, d.Link()
			w, impaired := l.(*impair.Link)
			if impaired {
				l = w.Inner()
			}
			if x, ok := l.(*afxdp.Link); ok {
				what = fmt.Sprintf("afxdp on %s, %s XDP, %d queues", x.Interface(), x.Mode(), x.Queues())
			}
			if impaired {
				what += fmt.Sprintf(", sends impaired: %v", w.Config())
			}
			var gids []string
			for i, a := range d.Link().Addrs() {
				gids = append(gids, fmt.Sprintf("GID %d %v", i, a))
			}
			fmt.Fprintf(os.Stderr, "softroce serve: device %s on %s (%s)\n", d.Name(), strings.Join(gids, ", "), what)
		}
		fmt.Fprintf(os.Stderr, "softroce serve: listening on %s\n", s.Socket())
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	go func() { <-sig; s.Close() }()
	if err := s.Serve(); err != nil {
		fmt.Fprintf(os.Stderr, "softroce serve: %v\n", err)
		s.Close()
		return 1
	}
	return 0
}

// limitFlags defines the flags of serve.Limits; each help text states the
// default, which a zero value (or the flag's absence) keeps.
func limitFlags(fs *flag.FlagSet) *serve.Limits {
	var l serve.Limits
	d := serve.DefaultLimits()
	for _, f := range []struct {
		v    *int
		name string
		help string
	}{
		{&l.ConnsPerUser, "max-conns-per-user", fmt.Sprintf("connections one user (uid) may hold open; over it a connection gets EMFILE (default %d)", d.ConnsPerUser)},
		{&l.FDsPerUser, "max-fds-per-user", fmt.Sprintf("descriptors the daemon keeps for one user: 3 a connection, 1 a completion channel; over it EMFILE (default %d)", d.FDsPerUser)},
		{&l.FDReserve, "fd-reserve", fmt.Sprintf("descriptors kept for the daemon itself: clients together get RLIMIT_NOFILE less this, then ENFILE (default %d)", d.FDReserve)},
		{&l.Mappings, "max-mappings", fmt.Sprintf("memory mappings (MR extents, rings) the daemon makes for all clients; over it ENOMEM (default half of vm.max_map_count: %d here)", d.Mappings)},
		{&l.MappingsPerUser, "max-mappings-per-user", fmt.Sprintf("memory mappings for one user; over it ENOMEM (default a quarter of --max-mappings: %d here)", d.Mappings/4)},
		{&l.QueueSlotsPerUser, "max-queue-slots-per-user", fmt.Sprintf("send and receive queue slots (WRs rounded up to a power of two) of one user's QPs and SRQs on a device; over it ENOMEM (default %d, a quarter of the device's 131072)", d.QueueSlotsPerUser)},
		{&l.QPsPerConn, "max-qps-per-conn", fmt.Sprintf("QPs of one connection (ibv_context); over it ENOMEM (default %d)", d.QPsPerConn)},
		{&l.CQsPerConn, "max-cqs-per-conn", fmt.Sprintf("CQs of one connection; over it ENOMEM (default %d)", d.CQsPerConn)},
		{&l.MRsPerConn, "max-mrs-per-conn", fmt.Sprintf("MRs of one connection; over it ENOMEM (default %d)", d.MRsPerConn)},
		{&l.ChannelsPerConn, "max-channels-per-conn", fmt.Sprintf("completion channels of one connection; over it ENOMEM (default %d)", d.ChannelsPerConn)},
		{&l.CQSlotsPerConn, "max-cq-slots-per-conn", fmt.Sprintf("slots of all CQs of one connection, 64 bytes each of the daemon's memory; over it ENOMEM (default %d)", d.CQSlotsPerConn)},
		{&l.CQSlotsPerUser, "max-cq-slots-per-user", fmt.Sprintf("slots of all CQs of one user's connections; over it ENOMEM (default %d)", d.CQSlotsPerUser)},
		{&l.SRQsPerConn, "max-srqs-per-conn", fmt.Sprintf("SRQs of one connection; over it ENOMEM (default %d)", d.SRQsPerConn)},
		{&l.AHsPerConn, "max-ahs-per-conn", fmt.Sprintf("address handles of one connection; over it ENOMEM (default %d)", d.AHsPerConn)},
		{&l.MWsPerConn, "max-mws-per-conn", fmt.Sprintf("memory windows of one connection; over it ENOMEM (default %d)", d.MWsPerConn)},
		{&l.CMIDsPerConn, "max-cm-ids-per-conn", fmt.Sprintf("rdma_cm ids of one event channel; over it ENOMEM (default %d)", d.CMIDsPerConn)},
	} {
		fs.IntVar(f.v, f.name, 0, f.help)
	}
	return &l
}

// abiFlags defines the flags of abi build.
func abiFlags() (fs *flag.FlagSet, dir *string) {
	fs = flag.NewFlagSet("abi", flag.ContinueOnError)
	dir = fs.String("dir", "", "build directory (default $SOFTROCE_ABI_DIR or the user cache)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: softroce abi build [--dir DIR]\n\nBuilds libibverbs.so.1 (needs gcc and libibverbs-dev) and prints its directory.\n\n")
		fs.PrintDefaults()
	}
	return
}

func runABI(args []string) int {
	fs, dir := abiFlags()
	if len(args) == 0 || args[0] != "build" {
		fs.Usage()
		return 2
	}
	if code, ok := parseFlags(fs, args[1:]); !ok {
		return code
	}
	d := *dir
	if d == "" {
		d = abi.DefaultDir()
	}
	out, err := abi.Build(d)
	if err != nil {
		fmt.Fprintf(os.Stderr, "softroce abi: %v\n", err)
		return 1
	}
	fmt.Println(out)
	return 0
}

// statusFlags defines status's flags.
func statusFlags() (fs *flag.FlagSet, sock *string, asJSON *bool) {
	fs = flag.NewFlagSet("status", flag.ContinueOnError)
	sock = fs.String("socket", "", "the daemon's socket (default as softroce serve)")
	asJSON = fs.Bool("json", false, "print JSON")
	return
}

func runStatus(args []string) int {
	fs, sock, asJSON := statusFlags()
	if code, ok := parseFlags(fs, args); !ok {
		return code
	}
	p := *sock
	if p == "" {
		p = serve.DefaultSocket()
	}
	st, err := serve.QueryStatus(p)
	if err != nil {
		fmt.Fprintf(os.Stderr, "softroce status: %v\n", err)
		return 1
	}
	if *asJSON {
		b, _ := json.MarshalIndent(st, "", "  ")
		fmt.Println(string(b))
		return 0
	}
	for _, d := range st.Devices {
		fmt.Printf("device %s  %s  qps %d  rx %d tx %d packets\n", d.Name, strings.Join(d.Addrs, ","), d.QPs, d.RxPackets, d.TxPackets)
		if c := d.CC; c != nil {
			fmt.Printf("  dcqcn: np_ecn_marked_roce_packets %d  np_cnp_sent %d  rp_cnp_handled %d  rp_cnp_ignored %d\n",
				c.NPECNMarkedRoCEPackets, c.NPCNPSent, c.RPCNPHandled, c.RPCNPIgnored)
		}
	}
	fmt.Printf("clients %d (accepted %d)  bad requests %d  bad WQEs %d  CQ overruns %d\n",
		st.Stats.Clients, st.Stats.Accepted, st.Stats.BadRequests, st.Stats.BadWQEs, st.Stats.Overruns)
	if st.Stats.AcceptErrors > 0 {
		fmt.Printf("failed accepts %d (retried)\n", st.Stats.AcceptErrors)
	}
	if len(st.Stats.Refusals) > 0 {
		names := make([]string, 0, len(st.Stats.Refusals))
		for n := range st.Stats.Refusals {
			names = append(names, n)
		}
		sort.Strings(names)
		fmt.Print("refused by limit:")
		for _, n := range names {
			fmt.Printf("  --%s %d", n, st.Stats.Refusals[n])
		}
		fmt.Println()
	}
	for _, c := range st.Clients {
		fmt.Printf("  uid %d pid %d  %s  pds %d mrs %d cqs %d qps %d", c.UID, c.PID, c.Device, c.PDs, c.MRs, c.CQs, len(c.QPs))
		if c.SRQs+c.AHs > 0 {
			fmt.Printf(" srqs %d ahs %d", c.SRQs, c.AHs)
		}
		fmt.Println()
		for _, q := range c.QPs {
			fmt.Printf("    qp 0x%06x %s", q.QPN, q.State)
			if c := q.CC; c != nil {
				fmt.Printf("  dcqcn %.3f Gb/s, rate-limited %v, CNPs handled %d sent %d",
					c.RateBPS/1e9, time.Duration(c.RateLimitedNS).Round(time.Microsecond), c.CNPHandled, c.CNPSent)
			}
			fmt.Println()
		}
	}
	if st.OtherClients > 0 {
		fmt.Printf("  and %d clients of other users (only root sees them)\n", st.OtherClients)
	}
	return 0
}
