package interop

import (
	"context"
	"encoding/base64"
	"fmt"
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
// (1 vCPU each, qemu TCG) on one bridge, netdev MTU 1500 so that the RoCE
// path MTU is 1024, and the same traffic across the bridge from A to B,
// once as ib_write_bw rxe0 -> rxe0 and once as `softroce perftest write`
// -> `softroce perftest write`, with perftest's defaults (no -m, so the
// port's active MTU; no -u, so the default ACK timeout). Rounds alternate
// the two so that host load hits both alike. It logs a Markdown table
// (MiB/s, range over rounds, ratio of the medians) and asserts only that
// every run completed with the requested bytes; speed is reported, not
// asserted.
//
// Knobs for investigating (all optional):
//
//	SOFTROCE_TWO_GUESTS_ROUNDS=n       rounds (default 2)
//	SOFTROCE_TWO_GUESTS_VARIANTS=a;b   softroce variants, each a prefix for
//	                                   the command line: VAR=value words
//	                                   (GOMAXPROCS=2 GOGC=400) and, as the
//	                                   first word, "alt" to run the binary
//	                                   SOFTROCE_TWO_GUESTS_ALT_BIN names
//	SOFTROCE_TWO_GUESTS_PROFILE=dir    write the guests' CPU profiles there
func TestNumbersTwoGuests(t *testing.T) {
	needVM(t)
	wall := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 14*time.Minute)
	defer cancel()
	img, err := rxevm.Build(ctx, rxevm.Config{Log: os.Stderr})
	if err != nil {
		t.Fatalf("build the rxe guest: %v", err)
	}
	pair, err := rxevm.BootPair(ctx, img, rxevm.Options{MTU: 1500, Log: os.Stderr})
	if err != nil {
		t.Fatalf("boot two guests: %v", err)
	}
	defer pair.Close()
	a, b := pair.A, pair.B
	bin := buildSoftroce(t, ctx)
	sr := shipSoftroceTo(t, ctx, bin, "/tmp/softroce", a, b)
	variants := []string{""}
	if v := os.Getenv("SOFTROCE_TWO_GUESTS_VARIANTS"); v != "" {
		variants = strings.Split(v, ";")
	}
	if alt := os.Getenv("SOFTROCE_TWO_GUESTS_ALT_BIN"); alt != "" {
		shipSoftroceTo(t, ctx, alt, sr+"-alt", a, b)
	}
	profDir := os.Getenv("SOFTROCE_TWO_GUESTS_PROFILE")
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
	for i := range results {
		results[i] = make([][]float64, 1+len(variants))
	}
	port := 18900
	server, client := b, a
	for round := range rounds {
		for si, sz := range sizes {
			port++
			args := fmt.Sprintf("-s %d -n %d -p %d", sz.bytes, sz.iters, port)
			res, _, _, err := runAcross(ctx, server, client,
				"timeout 150 ib_write_bw -d rxe0 -x 1 -F "+args,
				"timeout 150 ib_write_bw -d rxe0 -x 1 -F "+args+" "+server.GuestAddr().String(), port)
			if err != nil {
				t.Fatalf("round %d: rxe A -> rxe B, %d bytes: %v", round, sz.bytes, err)
			}
			checkRow(t, res, sz.bytes, sz.iters)
			results[si][0] = append(results[si][0], res.AvgBW)
			for vi, variant := range variants {
				port++
				args := fmt.Sprintf("-s %d -n %d -p %d", sz.bytes, sz.iters, port)
				prefix, exe := variantCommand(variant, sr)
				sargs := fmt.Sprintf("%s --bind %s --udp-port %d --peer-udp-port %d --timeout 140s", args, server.GuestAddr(), twoGuestPort, twoGuestPort)
				cargs := fmt.Sprintf("%s --bind %s --udp-port %d --peer-udp-port %d --timeout 140s", args, client.GuestAddr(), twoGuestPort, twoGuestPort)
				prof := ""
				if profDir != "" {
					prof = fmt.Sprintf(" --cpuprofile /tmp/cpu-%d.prof", port)
				}
				res, cout, sout, err := runAcross(ctx, server, client,
					fmt.Sprintf("%s%s perftest write %s%s", prefix, exe, sargs, prof),
					fmt.Sprintf("%s%s perftest write %s%s %s", prefix, exe, cargs, prof, server.GuestAddr()), port)
				if err != nil {
					t.Fatalf("round %d: softroce A -> softroce B %q, %d bytes: %v", round, variant, sz.bytes, err)
				}
				checkRow(t, res, sz.bytes, sz.iters)
				results[si][1+vi] = append(results[si][1+vi], res.AvgBW)
				t.Logf("round %d, %d bytes, softroce %q: %.2f MiB/s; client: %s; server: %s", round, sz.bytes, variant, res.AvgBW, qpStats(cout), qpStats(sout))
				if profDir != "" {
					for _, g := range []struct {
						vm   *rxevm.VM
						role string
					}{{client, "client"}, {server, "server"}} {
						name := fmt.Sprintf("r%d-%d-%s-v%d.prof", round, sz.bytes, g.role, vi)
						if err := fetchGuestFile(ctx, g.vm, fmt.Sprintf("/tmp/cpu-%d.prof", port), filepath.Join(profDir, name)); err != nil {
							t.Errorf("fetch profile %s: %v", name, err)
						}
					}
				}
			}
		}
	}

	var table strings.Builder
	table.WriteString("| size | iterations | rxe A -> rxe B (MiB/s) |")
	for _, v := range variants {
		fmt.Fprintf(&table, " softroce A -> softroce B%s (MiB/s) | softroce / rxe |", variantLabel(v))
	}
	table.WriteString("\n|---|---|---|" + strings.Repeat("---|---|", len(variants)) + "\n")
	for si, sz := range sizes {
		rxe := results[si][0]
		fmt.Fprintf(&table, "| %d | %d | %s |", sz.bytes, sz.iters, spread(rxe))
		for vi := range variants {
			soft := results[si][1+vi]
			fmt.Fprintf(&table, " %s | %.2f |", spread(soft), median(soft)/median(rxe))
		}
		table.WriteString("\n")
	}
	t.Logf("ib_write_bw defaults across two guests on one bridge (1 vCPU each, qemu TCG), netdev MTU 1500 (RoCE MTU 1024), softroce on UDP %d, %d round(s), wall time %s:\n%s",
		twoGuestPort, rounds, time.Since(wall).Round(time.Second), table.String())
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
	if r.Bytes != bytes || r.Iterations != iters || r.AvgBW <= 0 || r.Unit != "MB/sec" {
		t.Fatalf("implausible result row %+v for %d bytes x %d", r, bytes, iters)
	}
}

// variantCommand turns "alt GOGC=400" into the command prefix and the
// binary to run.
func variantCommand(v, sr string) (prefix, exe string) {
	exe = sr
	f := strings.Fields(v)
	if len(f) > 0 && f[0] == "alt" {
		exe, f = sr+"-alt", f[1:]
	}
	if len(f) > 0 {
		prefix = "env " + strings.Join(f, " ") + " "
	}
	return prefix, exe
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
