package interop

import (
	"context"
	"encoding/base64"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/softroce/softroce/conformance/rxevm"
)

// twoGuestPort is the UDP port both softroce ends use in the pair: rdma_rxe
// stays loaded (the rxe runs need it) and its kernel socket holds 4791 in
// each guest.
const twoGuestPort = 4792

// TestNumbersTwoGuests is the fair rxe/softroce comparison: two guests
// (1 vCPU each, qemu TCG, two queue pairs on the virtio-net NIC) on one
// bridge, netdev MTU 1500 so that the RoCE path MTU is 1024, and the same
// traffic across the bridge from A to B, once as ib_write_bw rxe0 -> rxe0
// and as `softroce perftest write` -> `softroce perftest write` with
// perftest's defaults (no -m, so the port's active MTU; no -u, so the
// default 67 ms ACK timeout), on the udp backend and on the AF_XDP
// backend in generic and in native XDP mode.
// rdma_rxe stays loaded, so softroce uses UDP port 4792 on both ends.
// Rounds alternate the runs so that host load hits all alike; a run that
// fails is retried once (see retryOnce). It logs each run's counters
// (rxe's port counters, softroce's QP and drop lines, what moved in both
// guests' and the host's loss counters, and how long each qemu ran and
// waited for a host CPU: see netSnapshot) and a Markdown table (MiB/s, range over rounds, ratio of the medians) and
// asserts only that every run completed with the requested bytes: speed
// is reported, not asserted.
//
// Knobs for investigating (all optional):
//
//	SOFTROCE_TWO_GUESTS_ROUNDS=n       rounds (default 2)
//	SOFTROCE_TWO_GUESTS_VARIANTS=a;b   softroce variants instead of the
//	                                   default three, each a list of words:
//	                                   VAR=value (GOGC=400) goes before the
//	                                   command, -flag words after it, and a
//	                                   first word "alt" runs the binary
//	                                   SOFTROCE_TWO_GUESTS_ALT_BIN names
//	SOFTROCE_TWO_GUESTS_PROFILE=dir    write the guests' CPU profiles there
//	                                   and log the guests' CPU use; boot
//	                                   the guests with profile=2 and log,
//	                                   for rxe and every variant, both
//	                                   guests' CPU per data packet split by
//	                                   /proc/stat and by the guest kernel's
//	                                   profile (guestcpu_test.go), and
//	                                   write the kernel samples by
//	                                   function there
func TestNumbersTwoGuests(t *testing.T) {
	needVM(t)
	wall := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 14*time.Minute)
	defer cancel()
	img, err := rxevm.Build(ctx, rxevm.Config{Log: os.Stderr})
	if err != nil {
		t.Fatalf("build the rxe guest: %v", err)
	}
	profDir := os.Getenv("SOFTROCE_TWO_GUESTS_PROFILE")
	// Two queue pairs on each guest's NIC: with one vCPU the guest uses
	// one, and native XDP takes the other for its transmissions.
	opts := rxevm.Options{MTU: 1500, NICQueues: 2, Log: os.Stderr}
	if profDir != "" {
		// The kernel's tick profile of its own text, /proc/profile,
		// one counter per 4 bytes; with the periodic tick also when
		// idle, so that interrupt work on an idle vCPU (rxe's receive
		// path) is sampled and counted in /proc/stat.
		opts.Env = map[string]string{"profile": "2", "nohz": "off"}
	}
	pair, err := rxevm.BootPair(ctx, img, opts)
	if err != nil {
		t.Fatalf("boot two guests: %v", err)
	}
	defer pair.Close()
	a, b := pair.A, pair.B
	bin := buildSoftroce(t, ctx)
	sr := shipSoftroceTo(t, ctx, bin, "/tmp/softroce", a, b)
	// perftest's defaults on the udp backend (kernel UDP socket and raw
	// IPv4 socket), and on the AF_XDP backend with the program attached
	// after the guest kernel built an skb (generic) and in virtio-net's
	// receive path (native).
	variants := []string{"", "--backend=afxdp --xdp-mode=generic", "--backend=afxdp --xdp-mode=native"}
	if v := os.Getenv("SOFTROCE_TWO_GUESTS_VARIANTS"); v != "" {
		variants = strings.Split(v, ";")
	}
	if alt := os.Getenv("SOFTROCE_TWO_GUESTS_ALT_BIN"); alt != "" {
		shipSoftroceTo(t, ctx, alt, sr+"-alt", a, b)
	}
	rounds := 2
	if n, err := strconv.Atoi(os.Getenv("SOFTROCE_TWO_GUESTS_ROUNDS")); err == nil && n > 0 {
		rounds = n
	}
	// The RoCE path MTU the defaults pick: rxe's active MTU on a
	// 1500-byte netdev.
	if out, err := a.Run(ctx, "cat /sys/class/infiniband/rxe0/ports/1/active_mtu 2>/dev/null || ibv_devinfo -v | grep active_mtu"); err == nil {
		t.Logf("guest A rxe0 active MTU: %s", strings.TrimSpace(out))
	}

	type size struct{ bytes, iters int }
	sizes := []size{{4096, 4000}, {65536, 800}}
	// results[size][column] = MiB/s per round; column 0 is rxe.
	results := make([][][]float64, len(sizes))
	// timeouts[size][column]: ACK timeouts summed over the rounds (rxe's
	// completer_retry_err, softroce's QP statistics on the client).
	timeouts := make([][]int64, len(sizes))
	for i := range results {
		results[i] = make([][]float64, 1+len(variants))
		timeouts[i] = make([]int64, 1+len(variants))
	}
	port := 18900
	server, client := b, a
	// costs[size][column][client, server]: guest CPU and packets of the
	// runs, with the kernel profile if kallsyms could be read (see
	// guestcpu_test.go).
	var costs [][][2]*guestCost
	var syms [2]*kernelSyms
	if profDir != "" {
		costs = make([][][2]*guestCost, len(sizes))
		for si := range costs {
			costs[si] = make([][2]*guestCost, 1+len(variants))
			for col := range costs[si] {
				costs[si][col] = [2]*guestCost{{}, {}}
			}
		}
		for i, g := range []*rxevm.VM{client, server} {
			k, err := fetchGzipped(ctx, g, "/proc/kallsyms")
			if err == nil {
				syms[i], err = parseKallsyms(string(k))
			}
			if err != nil {
				t.Logf("no kernel profile for %s: %v", g.GuestAddr(), err)
			}
		}
	}
	// markRun and countRun bracket a run for costs.
	markRun := func() [2]costMark {
		if profDir == "" {
			return [2]costMark{}
		}
		return [2]costMark{markCost(ctx, client, syms[0] != nil), markCost(ctx, server, syms[1] != nil)}
	}
	countRun := func(si, col int, before [2]costMark) {
		if profDir == "" {
			return
		}
		after := [2]costMark{markCost(ctx, client, false), markCost(ctx, server, false)}
		for i, g := range []*rxevm.VM{client, server} {
			var funcs map[string]int64
			if syms[i] != nil {
				var err error
				if funcs, err = readKernelProfile(ctx, g, syms[i]); err != nil {
					t.Logf("kernel profile of %s: %v", g.GuestAddr(), err)
				}
			}
			costs[si][col][i].add(before[i], after[i], funcs)
		}
	}
	for round := range rounds {
		for si, sz := range sizes {
			// Each round starts at another column, so that no run
			// always follows the same one.
			for k := range 1 + len(variants) {
				col := (k + round) % (1 + len(variants))
				if col == 0 {
					rxeBefore := [2]map[string]int64{guestRxeCounters(ctx, client), guestRxeCounters(ctx, server)}
					netBefore := takeNetSnapshot(ctx, client, server)
					costBefore := markRun()
					res, _, _, err := retryOnce(t, &port, sz.bytes, sz.iters, func(port int) (rxevm.BWResult, string, string, error) {
						args := fmt.Sprintf("-s %d -n %d -p %d", sz.bytes, sz.iters, port)
						return runAcross(ctx, server, client,
							"timeout 150 ib_write_bw -d rxe0 -x 1 -F "+args,
							"timeout 150 ib_write_bw -d rxe0 -x 1 -F "+args+" "+server.GuestAddr().String(), port)
					})
					if err != nil {
						t.Fatalf("round %d: rxe A -> rxe B, %d bytes: %v", round, sz.bytes, err)
					}
					countRun(si, 0, costBefore)
					checkRow(t, res, sz.bytes, sz.iters)
					results[si][0] = append(results[si][0], res.AvgBW)
					after := guestRxeCounters(ctx, client)
					timeouts[si][0] += after["completer_retry_err"] - rxeBefore[0]["completer_retry_err"]
					t.Logf("round %d, %d bytes, rxe: %.2f MiB/s; client rxe0: %s; server rxe0: %s", round, sz.bytes, res.AvgBW,
						counterDelta(rxeBefore[0], after), counterDelta(rxeBefore[1], guestRxeCounters(ctx, server)))
					netAfter := takeNetSnapshot(ctx, client, server)
					t.Logf("  %s; %s", netBefore.lossDelta(netAfter, [2]int64{}), netBefore.schedDelta(netAfter))
					continue
				}
				vi, variant := col-1, variants[col-1]
				prefix, exe, flags := variantCommand(variant, sr)
				netBefore := takeNetSnapshot(ctx, client, server)
				var before [2]cpuStat
				if profDir != "" {
					before = [2]cpuStat{readCPU(ctx, client), readCPU(ctx, server)}
				}
				costBefore := markRun()
				res, cout, sout, err := retryOnce(t, &port, sz.bytes, sz.iters, func(port int) (rxevm.BWResult, string, string, error) {
					args := fmt.Sprintf("-s %d -n %d -p %d", sz.bytes, sz.iters, port)
					sargs := fmt.Sprintf("%s --bind %s --udp-port %d --peer-udp-port %d --timeout 140s", args, server.GuestAddr(), twoGuestPort, twoGuestPort)
					cargs := fmt.Sprintf("%s --bind %s --udp-port %d --peer-udp-port %d --timeout 140s", args, client.GuestAddr(), twoGuestPort, twoGuestPort)
					prof := flags
					if profDir != "" {
						prof += " --cpuprofile /tmp/cpu.prof"
					}
					return runAcross(ctx, server, client,
						fmt.Sprintf("%s%s perftest write %s%s", prefix, exe, sargs, prof),
						fmt.Sprintf("%s%s perftest write %s%s %s", prefix, exe, cargs, prof, server.GuestAddr()), port)
				})
				if err != nil {
					t.Fatalf("round %d: softroce A -> softroce B %q, %d bytes: %v", round, variant, sz.bytes, err)
				}
				countRun(si, col, costBefore)
				checkRow(t, res, sz.bytes, sz.iters)
				results[si][1+vi] = append(results[si][1+vi], res.AvgBW)
				timeouts[si][1+vi] += qpTimeouts(cout)
				t.Logf("round %d, %d bytes, softroce %q: %.2f MiB/s; client: %s; server: %s", round, sz.bytes, variant, res.AvgBW, qpStats(cout), qpStats(sout))
				t.Logf("  client %s; server %s", dropStats(cout), dropStats(sout))
				netAfter := takeNetSnapshot(ctx, client, server)
				filtered := [2]int64{linkReceived(cout), linkReceived(sout)}
				if strings.Contains(variant, "afxdp") {
					filtered = [2]int64{} // no UDP socket sees the packets
				}
				t.Logf("  %s; %s", netBefore.lossDelta(netAfter, filtered), netBefore.schedDelta(netAfter))
				if profDir != "" {
					t.Logf("  guest CPU during the run (both processes' setup included): client %s; server %s",
						readCPU(ctx, client).since(before[0]), readCPU(ctx, server).since(before[1]))
					for _, g := range []struct {
						vm   *rxevm.VM
						role string
					}{{client, "client"}, {server, "server"}} {
						name := fmt.Sprintf("r%d-%d-%s-v%d.prof", round, sz.bytes, g.role, vi)
						if err := fetchGuestFile(ctx, g.vm, "/tmp/cpu.prof", filepath.Join(profDir, name)); err != nil {
							t.Errorf("fetch profile %s: %v", name, err)
						}
					}
				}
			}
		}
	}

	var table strings.Builder
	table.WriteString("| size | iterations | rxe A -> rxe B (MiB/s) [timeouts] |")
	for _, v := range variants {
		fmt.Fprintf(&table, " softroce A -> softroce B%s (MiB/s) [timeouts] | softroce / rxe |", variantLabel(v))
	}
	table.WriteString("\n|---|---|---|" + strings.Repeat("---|---|", len(variants)) + "\n")
	for si, sz := range sizes {
		rxe := results[si][0]
		fmt.Fprintf(&table, "| %d | %d | %s [%d] |", sz.bytes, sz.iters, spread(rxe), timeouts[si][0])
		for vi := range variants {
			soft := results[si][1+vi]
			fmt.Fprintf(&table, " %s [%d] | %.2f |", spread(soft), timeouts[si][1+vi], median(soft)/median(rxe))
		}
		table.WriteString("\n")
	}
	t.Logf("ib_write_bw defaults across two guests on one bridge (1 vCPU each, qemu TCG), netdev MTU 1500 (RoCE MTU 1024), softroce on UDP %d, %d round(s), wall time %s:\n%s",
		twoGuestPort, rounds, time.Since(wall).Round(time.Second), table.String())
	if profDir != "" {
		labels := []string{"rxe"}
		for _, v := range variants {
			labels = append(labels, "softroce"+variantLabel(v))
		}
		logCosts(t, profDir, labels, func(si int) string { return fmt.Sprintf("%d bytes x %d", sizes[si].bytes, sizes[si].iters) }, costs)
	}
}

// retryOnce runs fn on the next TCP port and, if it fails, once more on
// the one after: on a heavily loaded host a TCG guest can stall for longer
// than seven ACK timeouts, which ends rxe's and softroce's runs alike in
// a retry-exceeded completion. A run whose row is implausible (see
// plausibleRow) counts as failed too: perftest derives its figures from
// a CPU clock rate it samples at start, and in a descheduled TCG guest
// that sampling can fail, which zeroes every figure of the row. A second
// failure is returned.
func retryOnce(t *testing.T, port *int, bytes, iters int, fn func(port int) (rxevm.BWResult, string, string, error)) (rxevm.BWResult, string, string, error) {
	t.Helper()
	run := func() (rxevm.BWResult, string, string, error) {
		*port++
		res, cout, sout, err := fn(*port)
		if err == nil {
			if perr := plausibleRow(res, bytes, iters); perr != nil {
				err = fmt.Errorf("%w; client output:\n%s", perr, cout)
			}
		}
		return res, cout, sout, err
	}
	res, cout, sout, err := run()
	if err != nil {
		t.Logf("retrying once after: %v", err)
		res, cout, sout, err = run()
	}
	return res, cout, sout, err
}

// runAcross starts server on one guest, waits for its TCP port, runs
// client on the other, and returns the client's last result row with both
// outputs.
func runAcross(ctx context.Context, sv, cv *rxevm.VM, server, client string, port int) (rxevm.BWResult, string, string, error) {
	proc, err := sv.Start(ctx, server)
	if err != nil {
		return rxevm.BWResult{}, "", "", err
	}
	defer proc.Kill()
	// A server that fails at start never listens: stop waiting when it
	// exits.
	wctx, wcancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-proc.Done():
			wcancel()
		case <-wctx.Done():
		}
	}()
	err = sv.WaitListening(wctx, port)
	wcancel()
	if err != nil {
		so, se := proc.Output()
		return rxevm.BWResult{}, "", "", fmt.Errorf("%s did not listen: %w\nserver output:\n%s%s", server, err, so, se)
	}
	cout, err := cv.Run(ctx, client)
	if err != nil {
		so, se := proc.Output()
		return rxevm.BWResult{}, cout, so, fmt.Errorf("client %q: %w\nserver output:\n%s%s", client, err, so, se)
	}
	sout, err := proc.Wait(ctx)
	if err != nil {
		return rxevm.BWResult{}, cout, sout, fmt.Errorf("server %q: %w\n%s", server, err, sout)
	}
	rows, err := rxevm.ParseBW(cout)
	if err != nil {
		return rxevm.BWResult{}, cout, sout, fmt.Errorf("client %q: %w\n%s", client, err, cout)
	}
	return rows[len(rows)-1], cout, sout, nil
}

func checkRow(t *testing.T, r rxevm.BWResult, bytes, iters int) {
	t.Helper()
	if err := plausibleRow(r, bytes, iters); err != nil {
		t.Fatal(err)
	}
}

// plausibleRow says what is wrong with a result row, if anything.
func plausibleRow(r rxevm.BWResult, bytes, iters int) error {
	if r.Bytes != bytes || r.Iterations != iters || r.AvgBW <= 0 || r.Unit != "MB/sec" {
		return fmt.Errorf("implausible result row %+v for %d bytes x %d", r, bytes, iters)
	}
	return nil
}

// variantCommand turns "alt GOGC=400 --socket-buffer=262144" into the
// command prefix, the binary to run and extra flags.
func variantCommand(v, sr string) (prefix, exe, flags string) {
	exe = sr
	f := strings.Fields(v)
	if len(f) > 0 && f[0] == "alt" {
		exe, f = sr+"-alt", f[1:]
	}
	var env, fl []string
	for _, w := range f {
		if strings.HasPrefix(w, "-") {
			fl = append(fl, w)
		} else {
			env = append(env, w)
		}
	}
	if len(env) > 0 {
		prefix = "env " + strings.Join(env, " ") + " "
	}
	if len(fl) > 0 {
		flags = " " + strings.Join(fl, " ")
	}
	return prefix, exe, flags
}

func variantLabel(v string) string {
	if v == "" {
		return ""
	}
	return " [" + v + "]"
}

var qpStatsLine = regexp.MustCompile(`softroce QP: .*`)

func qpStats(out string) string {
	if m := qpStatsLine.FindString(out); m != "" {
		return strings.TrimPrefix(m, "softroce QP: ")
	}
	return "(no QP statistics)"
}

var dropStatsLine = regexp.MustCompile(`softroce drops: .*`)

// dropStats is softroce perftest's line of QP, engine, driver and link
// drop counters.
func dropStats(out string) string {
	if m := dropStatsLine.FindString(out); m != "" {
		return strings.TrimPrefix(m, "softroce ")
	}
	return "(no drop counters)"
}

var linkReceivedField = regexp.MustCompile(`softroce drops: .*; link (\d+) received`)

// linkReceived is the packets softroce's link received in a perftest run.
func linkReceived(out string) int64 {
	m := linkReceivedField.FindStringSubmatch(out)
	if m == nil {
		return 0
	}
	n, _ := strconv.ParseInt(m[1], 10, 64)
	return n
}

var timeoutsField = regexp.MustCompile(`softroce QP: .* (\d+) timeouts`)

// qpTimeouts is the ACK timeout count of a softroce perftest output.
func qpTimeouts(out string) int64 {
	m := timeoutsField.FindStringSubmatch(out)
	if m == nil {
		return 0
	}
	n, _ := strconv.ParseInt(m[1], 10, 64)
	return n
}

// fetchGuestFile copies a guest file to the host through the command
// channel (base64 on the guest's stdout).
func fetchGuestFile(ctx context.Context, g *rxevm.VM, src, dst string) error {
	out, err := g.Run(ctx, "base64 "+src)
	if err != nil {
		return err
	}
	data, err := base64.StdEncoding.DecodeString(strings.Join(strings.Fields(out), ""))
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	return os.WriteFile(dst, data, 0o644)
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// spread is "x" for one value and "min-max" for several.
func spread(v []float64) string {
	if len(v) == 1 {
		return fmt.Sprintf("%.2f", v[0])
	}
	return fmt.Sprintf("%.2f-%.2f", slices.Min(v), slices.Max(v))
}

// cpuStat is the guest's aggregate /proc/stat "cpu" line (jiffies).
type cpuStat struct{ user, sys, idle, irq, softirq, steal float64 }

func readCPU(ctx context.Context, g *rxevm.VM) cpuStat {
	out, err := g.Run(ctx, "head -1 /proc/stat")
	if err != nil {
		return cpuStat{}
	}
	c, _ := parseCPULine(out)
	return c
}

// parseCPULine parses /proc/stat's "cpu" line.
func parseCPULine(line string) (cpuStat, bool) {
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return cpuStat{}, false
	}
	v := func(i int) float64 { x, _ := strconv.ParseFloat(f[i], 64); return x }
	// user nice system idle iowait irq softirq steal
	return cpuStat{user: v(1) + v(2), sys: v(3), idle: v(4) + v(5), irq: v(6), softirq: v(7), steal: v(8)}, true
}

func (c cpuStat) since(b cpuStat) string {
	d := cpuStat{c.user - b.user, c.sys - b.sys, c.idle - b.idle, c.irq - b.irq, c.softirq - b.softirq, c.steal - b.steal}
	tot := d.user + d.sys + d.idle + d.irq + d.softirq + d.steal
	if tot <= 0 {
		return "(no /proc/stat)"
	}
	pc := func(x float64) float64 { return 100 * x / tot }
	return fmt.Sprintf("user %.0f%% sys %.0f%% softirq %.0f%% irq %.0f%% idle %.0f%%", pc(d.user), pc(d.sys), pc(d.softirq), pc(d.irq), pc(d.idle))
}

// guestRxeCounters reads rxe0's port counters (sent_pkts, completer_retry_err,
// duplicate_request, ...).
func guestRxeCounters(ctx context.Context, g *rxevm.VM) map[string]int64 {
	out, err := g.Run(ctx, "cd /sys/class/infiniband/rxe0/ports/1/hw_counters && grep . *")
	if err != nil {
		return nil
	}
	m := map[string]int64{}
	for _, line := range strings.Split(out, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if n, err := strconv.ParseInt(v, 10, 64); ok && err == nil {
			m[k] = n
		}
	}
	return m
}

// counterDelta lists the counters that moved, in name order.
func counterDelta(before, after map[string]int64) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(after)) {
		if d := after[k] - before[k]; d != 0 {
			parts = append(parts, fmt.Sprintf("%s %d", k, d))
		}
	}
	if len(parts) == 0 {
		return "(no counter moved)"
	}
	return strings.Join(parts, ", ")
}

// guestNetCounters reads where a guest's kernel drops packets: the Udp and
// Ip lines of /proc/net/snmp (InErrors, RcvbufErrors, SndbufErrors,
// InDiscards, ...), eth0's device statistics, softnet_stat's dropped and
// time_squeeze columns summed over CPUs, and the drops column of every UDP
// and raw socket (/proc/net/udp, /proc/net/raw: a full receive buffer).
func guestNetCounters(ctx context.Context, g *rxevm.VM) map[string]int64 {
	out, err := g.Run(ctx, "cat /proc/net/snmp; echo '#softnet'; cat /proc/net/softnet_stat; echo '#dev'; cd /sys/class/net/eth0/statistics && grep . *; echo '#udp'; cat /proc/net/udp; echo '#raw'; cat /proc/net/raw")
	if err != nil {
		return nil
	}
	return parseNetCounters(out)
}

// parseNetCounters parses guestNetCounters' output into "section.name"
// counters.
func parseNetCounters(out string) map[string]int64 {
	m := map[string]int64{}
	section := "snmp"
	var heads = map[string][]string{}
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "#") {
			section = line[1:]
			continue
		}
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		switch section {
		case "snmp":
			// Pairs of lines: "Udp: InDatagrams ..." then "Udp: 12 ...".
			proto := strings.TrimSuffix(f[0], ":")
			if proto != "Udp" && proto != "Ip" {
				continue
			}
			if _, err := strconv.ParseInt(f[1], 10, 64); err != nil {
				heads[proto] = f[1:]
				continue
			}
			for i, v := range f[1:] {
				if n, err := strconv.ParseInt(v, 10, 64); err == nil && i < len(heads[proto]) {
					m[proto+"."+heads[proto][i]] = n
				}
			}
		case "softnet":
			// Hex columns: processed, dropped, time_squeeze.
			if len(f) >= 3 {
				d, _ := strconv.ParseInt(f[1], 16, 64)
				s, _ := strconv.ParseInt(f[2], 16, 64)
				m["softnet.dropped"] += d
				m["softnet.time_squeeze"] += s
			}
		case "dev":
			if k, v, ok := strings.Cut(line, ":"); ok {
				if n, err := strconv.ParseInt(v, 10, 64); err == nil {
					m["eth0."+k] = n
				}
			}
		case "udp", "raw":
			// sl local rem st tx:rx tr:when retr uid timeout inode ref ptr drops
			if len(f) >= 13 && strings.HasSuffix(f[0], ":") {
				if n, err := strconv.ParseInt(f[len(f)-1], 10, 64); err == nil {
					m[section+".drops"] += n
				}
			}
		}
	}
	return m
}

// hostNetCounters reads the drop and error counters of the pair's bridge
// and taps (inside its namespace), and the drops of their queueing
// disciplines.
func hostNetCounters(ctx context.Context, g *rxevm.VM) map[string]int64 {
	out, err := g.HostCommand(ctx, "sh", "-c", "cd /sys/class/net && grep . */statistics/*drop* */statistics/*err* */statistics/*packets; tc -s qdisc 2>/dev/null").Output()
	if err != nil && len(out) == 0 {
		return nil
	}
	return parseHostCounters(string(out))
}

var qdiscLine = regexp.MustCompile(`^qdisc (\S+) \S+ (?:dev )?(\S+)`)
var qdiscDropped = regexp.MustCompile(`dropped (\d+), overlimits (\d+) requeues (\d+)`)

func parseHostCounters(out string) map[string]int64 {
	m := map[string]int64{}
	dev := ""
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		if q := qdiscLine.FindStringSubmatch(line); q != nil {
			dev = q[2] + ".qdisc"
			continue
		}
		if d := qdiscDropped.FindStringSubmatch(line); d != nil && dev != "" {
			n, _ := strconv.ParseInt(d[1], 10, 64)
			r, _ := strconv.ParseInt(d[3], 10, 64)
			m[dev+".dropped"] += n
			m[dev+".requeues"] += r
			continue
		}
		// br0/statistics/rx_dropped:0
		path, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		parts := strings.Split(path, "/")
		if n, err := strconv.ParseInt(v, 10, 64); err == nil && len(parts) == 3 {
			m[parts[0]+"."+parts[2]] = n
		}
	}
	return m
}

// qemuSched sums a qemu process's threads' schedstat: time on a host CPU
// and time runnable but waiting for one (ns). The wait is how long the
// host kept the guest's vCPU or I/O thread from running.
func qemuSched(g *rxevm.VM) (run, wait int64) {
	files, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", g.QemuPID()))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		r, w := parseSchedstat(string(b))
		run, wait = run+r, wait+w
	}
	return run, wait
}

// parseSchedstat parses "run_ns wait_ns timeslices".
func parseSchedstat(s string) (run, wait int64) {
	f := strings.Fields(s)
	if len(f) < 2 {
		return 0, 0
	}
	run, _ = strconv.ParseInt(f[0], 10, 64)
	wait, _ = strconv.ParseInt(f[1], 10, 64)
	return run, wait
}

// netSnapshot is both guests' and the host's counters at one moment, with
// both qemu processes' host scheduling times.
type netSnapshot struct {
	client, server, host map[string]int64
	sched                [2][2]int64 // [client, server][run, wait]
	at                   time.Time
}

func takeNetSnapshot(ctx context.Context, client, server *rxevm.VM) netSnapshot {
	s := netSnapshot{client: guestNetCounters(ctx, client), server: guestNetCounters(ctx, server), host: hostNetCounters(ctx, client)}
	s.sched[0][0], s.sched[0][1] = qemuSched(client)
	s.sched[1][0], s.sched[1][1] = qemuSched(server)
	s.at = time.Now()
	return s
}

// schedDelta says, per qemu, how much of the run it spent on a host CPU
// and waiting for one.
func (s netSnapshot) schedDelta(after netSnapshot) string {
	ms := func(ns int64) int64 { return ns / 1e6 }
	wall := after.at.Sub(s.at).Milliseconds()
	return fmt.Sprintf("host scheduling over %d ms: client qemu ran %d ms, waited %d ms for a CPU; server qemu ran %d ms, waited %d ms",
		wall, ms(after.sched[0][0]-s.sched[0][0]), ms(after.sched[0][1]-s.sched[0][1]),
		ms(after.sched[1][0]-s.sched[1][0]), ms(after.sched[1][1]-s.sched[1][1]))
}

// lossDelta lists what moved between two snapshots, leaving out the
// packet and byte counts that move on every run.
// filtered[0] and [1] are the packets the client's and server's softroce
// links received: softroce's UDP socket carries a filter that accepts
// nothing (the raw socket gets the packets), and the kernel counts each
// packet that filter drops in Udp.InErrors, so those are taken off.
func (s netSnapshot) lossDelta(after netSnapshot, filtered [2]int64) string {
	f := func(b, a map[string]int64, filtered int64) string {
		bb, aa := map[string]int64{}, map[string]int64{}
		if _, ok := a["Udp.InErrors"]; ok {
			b = maps.Clone(b)
			b["Udp.InErrors"] += filtered
		}
		for k, v := range a {
			if strings.HasSuffix(k, "packets") || strings.HasSuffix(k, "bytes") || strings.HasSuffix(k, "Datagrams") || strings.HasSuffix(k, "Receives") ||
				strings.HasSuffix(k, "Requests") || strings.HasSuffix(k, "Delivers") || k == "Ip.Forwarding" || k == "Ip.DefaultTTL" {
				continue
			}
			aa[k], bb[k] = v, b[k]
		}
		return counterDelta(bb, aa)
	}
	return fmt.Sprintf("losses: client %s; server %s; host %s", f(s.client, after.client, filtered[0]), f(s.server, after.server, filtered[1]), f(s.host, after.host, 0))
}

func TestParseNetCounters(t *testing.T) {
	guest := "Ip: Forwarding DefaultTTL InReceives InDiscards\nIp: 2 64 900 3\n" +
		"Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors\nUdp: 800 1 7 700 5 2\n" +
		"#softnet\n0000aaaa 00000010 00000002 0\n00000001 00000001 00000000 0\n" +
		"#dev\nrx_dropped:4\ntx_packets:99\n" +
		"#udp\n  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops\n" +
		" 1: 00000000:12B8 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 1 2 0000000000000000 6\n" +
		"#raw\n 2: 00000000:0011 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 1 2 0000000000000000 9\n"
	m := parseNetCounters(guest)
	want := map[string]int64{"Ip.InDiscards": 3, "Udp.InErrors": 7, "Udp.RcvbufErrors": 5, "Udp.SndbufErrors": 2,
		"softnet.dropped": 17, "softnet.time_squeeze": 2, "eth0.rx_dropped": 4, "udp.drops": 6, "raw.drops": 9}
	for k, v := range want {
		if m[k] != v {
			t.Errorf("%s = %d, want %d (all: %v)", k, m[k], v, m)
		}
	}
	before := netSnapshot{client: map[string]int64{"Udp.InErrors": 10}, server: map[string]int64{"Udp.InErrors": 0}}
	after := netSnapshot{client: map[string]int64{"Udp.InErrors": 15}, server: map[string]int64{"Udp.InErrors": 100, "raw.drops": 1}}
	out := "softroce drops: QP 0 duplicate requests; driver 0 refused sends; link 99 received, 5 sent, 0 ICRC bad"
	if got, want := before.lossDelta(after, [2]int64{5, linkReceived(out)}), "losses: client (no counter moved); server Udp.InErrors 1, raw.drops 1; host (no counter moved)"; got != want {
		t.Errorf("lossDelta = %q, want %q", got, want)
	}
	if r, w := parseSchedstat("307561 1026130 2\n"); r != 307561 || w != 1026130 {
		t.Errorf("parseSchedstat = %d, %d", r, w)
	}
	host := "tap0/statistics/tx_dropped:12\nbr0/statistics/rx_errors:0\n" +
		"qdisc fq_codel 0: dev tap1 root refcnt 2 limit 10240p\n Sent 1 bytes 2 pkt (dropped 8, overlimits 0 requeues 3)\n"
	h := parseHostCounters(host)
	for k, v := range map[string]int64{"tap0.tx_dropped": 12, "tap1.qdisc.dropped": 8, "tap1.qdisc.requeues": 3} {
		if h[k] != v {
			t.Errorf("%s = %d, want %d (all: %v)", k, h[k], v, h)
		}
	}
}
