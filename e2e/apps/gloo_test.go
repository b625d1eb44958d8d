package apps

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/softroce/softroce/conformance/rxevm"
)

// glooDevice is the device a program sees through `softroce run`: its
// daemon's one device.
const glooDevice = "softroce0"

// glooHeader is libgloo-dev's header for the ibverbs transport.
const glooHeader = "/usr/include/gloo/transport/ibverbs/device.h"

// glooNeed skips the test unless gloocheck can be built and run.
func glooNeed(t *testing.T) {
	t.Helper()
	Need(t, "g++", "g++")
	if _, err := os.Stat(glooHeader); err != nil {
		t.Skipf("Gloo's ibverbs transport is not installed (%s: %v; Debian: apt-get install libgloo-dev)", glooHeader, err)
	}
}

// glooCompile builds testdata/gloocheck.cc into dir. It links
// libibverbs.so.1 by its soname, as libgloo.so.0 does, so that
// `softroce run`'s library path gives both softroce's library.
func glooCompile(t *testing.T, dir string) string {
	t.Helper()
	src, err := filepath.Abs(filepath.Join("testdata", "gloocheck.cc"))
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "gloocheck")
	if b, err := exec.Command("g++", "-std=c++17", "-O2", "-Wall", "-o", out, src, "-lgloo", "-libverbs", "-pthread").CombinedOutput(); err != nil {
		t.Fatalf("g++ gloocheck.cc: %v\n%s", err, b)
	}
	b, err := exec.Command("readelf", "-d", out).Output()
	if err == nil && !strings.Contains(string(b), "[libibverbs.so.1]") {
		t.Fatalf("gloocheck does not link libibverbs.so.1 by soname:\n%s", b)
	}
	return out
}

var (
	glooDeviceLine = regexp.MustCompile(`(?m)^rank ([01]) of 2: ibverbs, .*dev=(\S+), port=1, index=(\d+)$`)
	glooOpLine     = regexp.MustCompile(`(?m)^(allreduce|broadcast) 1048576 floats ok in [0-9.]+ ms .*$`)
)

// Gloo's ibverbs transport (libgloo-dev), through the project's program
// (testdata/gloocheck.cc): rank 0 on host A, rank 1 on host B, meeting
// through Gloo's FileStore in a directory both hosts' programs share (Gloo
// 0.5 has no TCP store; its Redis store needs a server). Each rank opens
// softroce0, port 1, at the GID index of its host's IPv4 address, and
// checks every element of AllreduceRing (sum) and BroadcastOneToAll of
// 1 Mi floats, three runs each. Gloo takes its device on the command line:
// the ranks get no environment of the test's.
func TestGlooIbverbs(t *testing.T) {
	glooNeed(t)
	dir := t.TempDir()
	// t.TempDir's parent is made 0700; nobody runs the program here.
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	prog := glooCompile(t, dir)
	store := filepath.Join(dir, "store")
	if err := os.Mkdir(store, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(store, User, User); err != nil {
		t.Fatal(err)
	}
	hs := NewTwoHosts(t)
	var ranks []glooRank
	for r, h := range []*Host{hs.A, hs.B} {
		p := h.Start(t, nil, prog, "-r", strconv.Itoa(r), "-s", "2", "-f", store,
			"-d", glooDevice, "-a", h.Addr().String(), "-t", "60")
		ranks = append(ranks, glooRank{"host " + h.Name + " (" + h.Addr().String() + ")", glooDevice, p.WaitTimeout, p.Output})
	}
	glooCheck(t, ranks)
}

// glooRank is one running gloocheck: where it runs, the device it must
// name, and how to wait for it and read its output.
type glooRank struct {
	where, device string
	wait          func(time.Duration) error
	output        func() string
}

// glooCheck waits for the ranks (rank i is ranks[i]) and fails the test
// unless each exited 0 after checking every element of both operations
// on its device.
func glooCheck(t *testing.T, ranks []glooRank) {
	t.Helper()
	errs := make([]error, len(ranks))
	for r, p := range ranks {
		errs[r] = p.wait(3 * time.Minute)
	}
	report := func() string {
		var b strings.Builder
		for r, p := range ranks {
			b.WriteString("rank " + strconv.Itoa(r) + " (" + p.where + "):\n" + p.output())
		}
		return b.String()
	}
	for r, p := range ranks {
		out := p.output()
		if errs[r] != nil {
			t.Errorf("rank %d on %s: %v", r, p.where, errs[r])
		}
		if !regexp.MustCompile(`(?m)^gloocheck: ok$`).MatchString(out) {
			t.Errorf("rank %d: no \"gloocheck: ok\"", r)
		}
		if ops := glooOpLine.FindAllStringSubmatch(out, -1); len(ops) != 2 || ops[0][1] != "allreduce" || ops[1][1] != "broadcast" {
			t.Errorf("rank %d: want an allreduce and a broadcast line, got %q", r, ops)
		}
		m := glooDeviceLine.FindStringSubmatch(out)
		if m == nil || m[1] != strconv.Itoa(r) || m[2] != p.device {
			t.Errorf("rank %d: no device line for %s port 1, got %q", r, p.device, m)
		} else {
			t.Logf("rank %d on %s: %s port 1 GID index %s", r, p.where, m[2], m[3])
		}
		if strings.Contains(out, "softroce run:") {
			t.Errorf("rank %d: softroce run complained", r)
		}
	}
	if t.Failed() {
		t.Fatalf("gloocheck's output:\n%s", report())
	}
	for r, p := range ranks {
		t.Logf("rank %d's figures (%s):\n%s", r, p.where, strings.Join(glooOpLine.FindAllString(p.output(), -1), "\n"))
	}
}

// TestGlooIbverbsAgainstRxe runs gloocheck between softroce and kernel
// rxe, each side once as rank 0 (the broadcast's root): the guest runs the
// same build from the directory it shares with the host, on rxe0 at the
// GID index of its IPv4 address (1 on rxe), and the FileStore lives there
// too.
func TestGlooIbverbsAgainstRxe(t *testing.T) {
	glooNeed(t)
	r := NewRxePeer(t)
	share := r.VM.SharedDir()
	prog := glooCompile(t, share)
	for first, name := range []string{"softroce-rank0", "rxe-rank0"} {
		t.Run(name, func(t *testing.T) {
			store := filepath.Join(share, "store-"+name)
			if err := os.Mkdir(store, 0o777); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(store, 0o777); err != nil {
				t.Fatal(err)
			}
			guestStore := rxevm.GuestShareDir + "/" + filepath.Base(store)
			guestProg := rxevm.GuestShareDir + "/" + filepath.Base(prog)
			ranks := make([]glooRank, 2)
			soft, guest := first, 1-first
			p := r.Soft.Start(t, nil, prog, "-r", strconv.Itoa(soft), "-s", "2", "-f", store,
				"-d", glooDevice, "-a", r.Soft.Addr().String(), "-t", "120")
			ranks[soft] = glooRank{"softroce (" + r.Soft.Addr().String() + ")", glooDevice, p.WaitTimeout, p.Output}
			g := r.GuestStart(t, fmt.Sprintf("%s -r %d -s 2 -f %s -d rxe0 -a %s -t 120", guestProg, guest, guestStore, r.GuestAddr()))
			var gout string
			ranks[guest] = glooRank{"rxe (" + r.GuestAddr().String() + ")", "rxe0",
				func(d time.Duration) error {
					ctx, cancel := context.WithTimeout(context.Background(), d)
					defer cancel()
					out, err := g.Wait(ctx)
					if ee, ok := err.(*rxevm.ExitError); ok {
						out = ee.Stdout
					}
					gout = out
					return err
				},
				func() string { return gout }}
			glooCheck(t, ranks)
		})
	}
}
