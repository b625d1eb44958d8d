package main

import (
	"bytes"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// perftestCapture runs f with os.Stdout and os.Stderr going to a buffer.
func perftestCapture(t *testing.T, f func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	oldOut, oldErr := os.Stdout, os.Stderr
	os.Stdout, os.Stderr = w, w
	var buf bytes.Buffer
	done := make(chan struct{})
	go func() { io.Copy(&buf, r); close(done) }()
	func() {
		defer func() { os.Stdout, os.Stderr = oldOut, oldErr }()
		f()
	}()
	w.Close()
	<-done
	r.Close()
	return buf.String()
}

// runPair runs a server and a client command (run with srvArgs and
// cliArgs) at once under perftestCapture, and returns their output and
// exit codes.
func runPair(t *testing.T, run func([]string) int, srvArgs, cliArgs []string) (out string, srv, cli int) {
	t.Helper()
	var wg sync.WaitGroup
	out = perftestCapture(t, func() {
		wg.Add(2)
		go func() {
			defer wg.Done()
			srv = run(srvArgs)
		}()
		go func() {
			defer wg.Done()
			cli = run(cliArgs)
		}()
		wg.Wait()
	})
	return out, srv, cli
}

// TestPerftestCommandLoopback runs `softroce perftest` as server and
// client over 127.0.0.1 (two UDP ports) for each test.
func TestPerftestCommandLoopback(t *testing.T) {
	for i, test := range []string{"write", "read", "atomic", "send"} {
		t.Run(test, func(t *testing.T) {
			port := 47990 + 3*i
			common := []string{"--bind", "127.0.0.1", "-p", strconv.Itoa(port + 2), "-n", "50", "-m", "1024", "--timeout", "20s"}
			if test != "atomic" {
				common = append(common, "-s", "3000")
			}
			out, srv, cli := runPair(t, runPerftest,
				// Flags before the test word are accepted too.
				append(append(append([]string{}, common...), test), "--udp-port", strconv.Itoa(port), "--peer-udp-port", strconv.Itoa(port+1)),
				// Flags after the server name are accepted, as perftest does.
				append(append([]string{test, "--udp-port", strconv.Itoa(port + 1), "127.0.0.1"}, common...), "--peer-udp-port", strconv.Itoa(port)))
			if srv != 0 || cli != 0 || strings.Count(out, "#bytes") != 2 {
				t.Fatalf("exit codes: server %d, client %d\n%s", srv, cli, out)
			}
		})
	}
}

func TestPerftestCommandUsage(t *testing.T) {
	for _, args := range [][]string{
		nil,
		{"-s", "10"},
		{"latency"},
		{"atomic", "-A", "SWAP"},
		{"write", "-u", "0"},
		{"write", "a", "b"},
		{"write", "--no-such-flag"},
		{"read", "-c", "UC"},
		{"atomic", "-c", "uc"},
		{"write", "-c", "XRC"},
		{"write", "--backend", "afxdp", "--xdp-mode", "zerocopy"},
	} {
		var code int
		perftestCapture(t, func() { code = runPerftest(args) })
		if code != 2 {
			t.Errorf("softroce perftest %s: exit %d, want 2", strings.Join(args, " "), code)
		}
	}
	// A bad size is a run-time failure (1), reported before any network use.
	var code int
	perftestCapture(t, func() {
		code = runPerftest([]string{"atomic", "-s", "16", "--bind", "127.0.0.1", "--udp-port", "47989", "--timeout", "2s"})
	})
	if code != 1 {
		t.Errorf("atomic -s 16: exit %d, want 1", code)
	}
}
