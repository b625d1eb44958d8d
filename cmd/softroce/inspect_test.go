package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket/layers"

	"github.com/softroce/softroce/inspect"
)

// quiet silences stdout and stderr while f runs.
func quiet(t *testing.T, f func()) {
	t.Helper()
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	stdout, stderr := os.Stdout, os.Stderr
	os.Stdout, os.Stderr = null, null
	defer func() { os.Stdout, os.Stderr = stdout, stderr }()
	f()
}

// sharedCaptureDir is where the real captures are kept outside the
// repository; SOFTROCE_SHARED_CAPTURES names another place.
func sharedCaptureDir() string {
	if d := os.Getenv("SOFTROCE_SHARED_CAPTURES"); d != "" {
		return d
	}
	return "../../../shared/captures"
}

func TestInspectExitCodes(t *testing.T) {
	hw := sharedCaptureDir() + "/hardware/"
	good, bad := hw+"connectx-rdmacm-read.pcap", hw+"connectx-sniffer-bad-icrc.pcap"
	junk := filepath.Join(t.TempDir(), "junk.pcap")
	os.WriteFile(junk, []byte("not a capture"), 0o644)
	cases := []struct {
		name   string
		args   []string
		want   int
		shared bool
	}{
		{"no files", nil, 2, false},
		{"bad flag", []string{"--nope", "x"}, 2, false},
		{"no jobs", []string{"--jobs", "0", "x"}, 2, false},
		{"missing file", []string{filepath.Join(t.TempDir(), "none.pcap")}, 1, false},
		{"junk file", []string{junk}, 1, false},
		{"good", []string{good}, 0, true},
		{"good verbose", []string{"-v", good}, 0, true},
		{"good json strict", []string{"--json", "--strict", good}, 0, true},
		{"bad icrc", []string{bad}, 0, true},
		{"bad icrc strict", []string{"--strict", bad}, 1, true},
		{"bad icrc strict json", []string{"--strict", "--json", good, bad}, 1, true},
		{"one unreadable of two", []string{good, junk}, 1, true},
	}
	for _, c := range cases {
		if c.shared {
			if _, err := os.Stat(good); err != nil {
				t.Logf("%s: shared captures not available, skipped", c.name)
				continue
			}
		}
		var got int
		quiet(t, func() { got = runInspect(c.args) })
		if got != c.want {
			t.Errorf("%s: exit %d, want %d", c.name, got, c.want)
		}
	}
}

// inspectOutput runs `softroce inspect args...` and returns its stdout.
func inspectOutput(t *testing.T, args ...string) []byte {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "out")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	stdout := os.Stdout
	os.Stdout = f
	code := runInspect(args)
	os.Stdout = stdout
	if code != 0 {
		t.Fatalf("inspect %v: exit %d", args, code)
	}
	out, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestInspectParallelOutput: decoding on several goroutines prints the
// bytes decoding on one does, in JSON and as text, on a capture of many
// batches made of real frames.
func TestInspectParallelOutput(t *testing.T) {
	pcap := filepath.Join(t.TempDir(), "repeated.pcap")
	n, err := writeRepeatedCapture(pcap, 6000)
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range [][]string{{"--json"}, {"-v"}, {"--json", pcap}} {
		serial := inspectOutput(t, append(append([]string{"--jobs", "1"}, mode...), pcap)...)
		if len(serial) < 6000*100 {
			t.Fatalf("%v: %d bytes of output for 6000 frames", mode, len(serial))
		}
		for _, jobs := range []string{"2", "7"} {
			if got := inspectOutput(t, append(append([]string{"--jobs", jobs}, mode...), pcap)...); !bytes.Equal(got, serial) {
				t.Errorf("%v: --jobs %s output differs from --jobs 1 (%d and %d bytes)", mode, jobs, len(got), len(serial))
			}
		}
	}
	t.Logf("6000 frames repeated from %d", n)
}

// TestInspectSpeedVsTshark times `softroce inspect --json` (the built
// binary) against `tshark -T fields` with six fields on a capture of
// SOFTROCE_INSPECT_BENCH_FRAMES frames (default 1,000,000) made by
// repeating the frames of the real captures, output to /dev/null, rounds
// interleaved. It only reports figures (no speed is asserted) and runs when
// SOFTROCE_INSPECT_BENCH=1:
//
//	SOFTROCE_INSPECT_BENCH=1 go test -count=1 -v -run TestInspectSpeedVsTshark ./cmd/softroce
//
// SOFTROCE_INSPECT_BENCH_PCAP keeps the capture at that path (reused when
// present); SOFTROCE_INSPECT_BENCH_ROUNDS sets the rounds (default 3);
// SOFTROCE_INSPECT_BENCH_BASE names another softroce binary (an older
// build) to time in the same rounds.
func TestInspectSpeedVsTshark(t *testing.T) {
	if os.Getenv("SOFTROCE_INSPECT_BENCH") != "1" {
		t.Skip("set SOFTROCE_INSPECT_BENCH=1 to time inspect --json against tshark")
	}
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		t.Skip("tshark not installed")
	}
	frames := envInt(t, "SOFTROCE_INSPECT_BENCH_FRAMES", 1_000_000)
	rounds := envInt(t, "SOFTROCE_INSPECT_BENCH_ROUNDS", 3)
	dir := t.TempDir()
	pcap := os.Getenv("SOFTROCE_INSPECT_BENCH_PCAP")
	if pcap == "" {
		pcap = filepath.Join(dir, "repeated.pcap")
	}
	if _, err := os.Stat(pcap); err != nil {
		n, err := writeRepeatedCapture(pcap, frames)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s: %d frames from %d distinct real frames", pcap, frames, n)
	}
	bin := filepath.Join(dir, "softroce")
	if out, err := exec.Command(goTool(), "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cmds := []struct {
		name string
		argv []string
	}{
		{"tshark", []string{tshark, "-r", pcap, "-T", "fields", "-e", "frame.number", "-e", "infiniband.bth.opcode",
			"-e", "infiniband.bth.destqp", "-e", "infiniband.bth.psn", "-e", "infiniband.reth.va", "-e", "infiniband.aeth.syndrome"}},
		{"inspect --json", []string{bin, "inspect", "--json", pcap}},
		{"inspect --json --jobs 1", []string{bin, "inspect", "--json", "--jobs", "1", pcap}},
	}
	if base := os.Getenv("SOFTROCE_INSPECT_BENCH_BASE"); base != "" {
		// Another build (an older commit) timed in the same rounds.
		cmds = append(cmds, struct {
			name string
			argv []string
		}{"base inspect --json", []string{base, "inspect", "--json", pcap}})
	}
	secs := make([][]float64, len(cmds)) // wall clock
	cpus := make([][]float64, len(cmds)) // user + system
	for round := 0; round < rounds; round++ {
		for i, c := range cmds {
			null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(c.argv[0], c.argv[1:]...)
			cmd.Stdout, cmd.Stderr = null, null
			start := time.Now()
			err = cmd.Run()
			d := time.Since(start)
			null.Close()
			if err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			cpu := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
			secs[i] = append(secs[i], d.Seconds())
			cpus[i] = append(cpus[i], cpu.Seconds())
			t.Logf("round %d %-24s %6.2fs %9.0f packets/s; CPU %6.2fs %9.0f packets per CPU second", round+1, c.name,
				d.Seconds(), float64(frames)/d.Seconds(), cpu.Seconds(), float64(frames)/cpu.Seconds())
		}
	}
	for i, c := range cmds[1:] {
		t.Logf("%s vs tshark, same round: wall clock %s, CPU time %s (GOMAXPROCS %d)", c.name,
			ratioRange(secs[0], secs[i+1]), ratioRange(cpus[0], cpus[i+1]), runtime.GOMAXPROCS(0))
	}
}

// ratioRange gives the range of ref[r]/x[r] over the rounds: "4.1-5.3x".
func ratioRange(ref, x []float64) string {
	var lo, hi float64
	for r := range ref {
		ratio := ref[r] / x[r]
		if r == 0 || ratio < lo {
			lo = ratio
		}
		if r == 0 || ratio > hi {
			hi = ratio
		}
	}
	return fmt.Sprintf("%.1f-%.1fx", lo, hi)
}

func envInt(t testing.TB, name string, def int) int {
	t.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive number", name, s)
	}
	return n
}

func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}

// benchSources are the captures whose Ethernet frames are repeated: the
// shared real captures, or the project's own recorded ones when absent.
func benchSources() []string {
	dir := sharedCaptureDir()
	if files, _ := filepath.Glob(dir + "/*/*.pcap"); len(files) > 0 {
		return files
	}
	files, _ := filepath.Glob("../../inspect/testdata/*/*.pcap")
	rxe, _ := filepath.Glob("../../icrc/testdata/rxe/*.pcap")
	return append(files, rxe...)
}

// writeRepeatedCapture writes a pcap of n Ethernet frames, the frames of
// benchSources in turn, over and over, 1 µs apart. It returns how many
// distinct frames were repeated.
func writeRepeatedCapture(path string, n int) (int, error) {
	var src [][]byte
	var wire []int
	for _, p := range benchSources() {
		err := inspect.Walk(p, func(r *inspect.Record) error {
			if r.LinkType == layers.LinkTypeEthernet {
				src = append(src, bytes.Clone(r.Data))
				wire = append(wire, r.WireLen)
			}
			return nil
		})
		if err != nil {
			return 0, err
		}
	}
	if len(src) == 0 {
		return 0, errors.New("no capture to repeat")
	}
	f, err := os.Create(path)
	if err != nil {
		return 0, err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	hdr := make([]byte, 24)
	binary.LittleEndian.PutUint32(hdr[0:], 0xa1b2c3d4)
	binary.LittleEndian.PutUint16(hdr[4:], 2)
	binary.LittleEndian.PutUint16(hdr[6:], 4)
	binary.LittleEndian.PutUint32(hdr[16:], 65535)
	binary.LittleEndian.PutUint32(hdr[20:], uint32(layers.LinkTypeEthernet))
	w.Write(hdr)
	rec := make([]byte, 16)
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range n {
		fr := src[i%len(src)]
		ts := start.Add(time.Duration(i) * time.Microsecond)
		binary.LittleEndian.PutUint32(rec[0:], uint32(ts.Unix()))
		binary.LittleEndian.PutUint32(rec[4:], uint32(ts.Nanosecond()/1000))
		binary.LittleEndian.PutUint32(rec[8:], uint32(len(fr)))
		binary.LittleEndian.PutUint32(rec[12:], uint32(wire[i%len(src)]))
		w.Write(rec)
		w.Write(fr)
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return 0, err
	}
	return len(src), f.Close()
}

// TestInspectSnifferHint: a capture with the signature of ConnectX's
// offloaded sniffer (source port 4791 everywhere, no ICRC verifies) gets
// the hint in the summary, in the JSON summary, and on stderr when the
// summary is left out.
func TestInspectSnifferHint(t *testing.T) {
	const capture = "../../inspect/testdata/sniffer-signature.pcap"
	const hint = "hint: every packet's ICRC fails and every UDP source port is 4791: this looks like a capture by ConnectX's offloaded RDMA sniffer"
	for _, c := range []struct {
		args           []string
		stdout, stderr string
	}{
		{[]string{capture}, hint, ""},
		{[]string{"--json", capture}, `"hints":["every packet's ICRC fails`, ""},
		{[]string{"--no-summary", capture}, "", "softroce inspect: " + capture + ": " + hint},
	} {
		var code int
		out, errOut := runOut(t, func() { code = runInspect(c.args) })
		if code != 0 || !strings.Contains(out, c.stdout) || !strings.Contains(errOut, c.stderr) {
			t.Errorf("%q: exit %d\nstdout %s\nstderr %s", c.args, code, out, errOut)
		}
	}
	var code int
	out, errOut := runOut(t, func() { code = runInspect([]string{"../../inspect/testdata/demo-read-loss.pcap"}) })
	if code != 0 || strings.Contains(out+errOut, "hint:") {
		t.Errorf("a good capture got a hint: exit %d\n%s%s", code, out, errOut)
	}
}
