package main

import (
	"bytes"
	"context"
	"encoding/xml"
	"image"
	"image/png"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// plotElements parses a rateplot page as strict XML and counts its
// polylines by class.
func plotElements(t *testing.T, page []byte) map[string]int {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(page))
	d.Strict = true
	n := map[string]int{}
	for {
		tok, err := d.Token()
		if err == io.EOF {
			return n
		}
		if err != nil {
			t.Fatalf("plot is not well-formed: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "polyline" {
			for _, a := range se.Attr {
				if a.Name.Local == "class" {
					n[a.Value]++
				}
			}
		}
	}
}

// TestBWPlot: bw --cc dcqcn --plot draws one rate line per QP, and the
// queue of the --congest bottleneck, in a page that parses.
func TestBWPlot(t *testing.T) {
	dir := t.TempDir()
	for _, tt := range []struct {
		file       string
		qps, queue int
		congest    bool
	}{{"rates.html", 2, 1, true}, {"rates.svg", 3, 0, false}} {
		file := filepath.Join(dir, tt.file)
		args := []string{"--backend", "pipe", "--cc", "dcqcn", "-q", string(rune('0' + tt.qps)), "-D", "0.3",
			"-s", "65536", "--mtu", "4096", "-t", "4", "--plot", file}
		if tt.congest {
			args = append(args, "--congest", "rate=500M,queue=128KB,kmin=10KB,kmax=50KB,pmax=20%,seed=1")
		}
		var code int
		_, errOut := runOut(t, func() { code = runPerf("bw", args) })
		if code != 0 {
			t.Fatalf("bw %q: exit %d: %s", args, code, errOut)
		}
		page, err := os.ReadFile(file)
		if err != nil {
			t.Fatalf("--plot wrote nothing: %v", err)
		}
		n := plotElements(t, page)
		if n["flow"] != tt.qps || n["queue"] != tt.queue {
			t.Errorf("%s: %d rate lines and %d queue lines, want %d and %d", tt.file, n["flow"], n["queue"], tt.qps, tt.queue)
		}
		if !strings.Contains(errOut, "drawn in "+file) {
			t.Errorf("bw does not say where the plot went: %q", errOut)
		}
	}
	for _, args := range [][]string{
		{"--backend", "pipe", "--plot", filepath.Join(dir, "x.html")},                 // no --cc dcqcn
		{"--backend", "pipe", "--cc", "dcqcn", "--plot", filepath.Join(dir, "x.png")}, // unknown format
		{"--backend", "pipe", "--cc", "dcqcn", "--congest", "rate=0"},                 // bad bottleneck
		{"--server", "--cc", "dcqcn", "--plot", filepath.Join(dir, "x.svg")},          // server side
	} {
		var code int
		_, errOut := runOut(t, func() { code = runPerf("bw", args) })
		if code != 2 || !(strings.Contains(errOut, "--plot") || strings.Contains(errOut, "--congest")) {
			t.Errorf("%q: exit %d, %q", args, code, errOut)
		}
	}
}

// TestRatesPageChromium renders docs/congestion-rates.html in headless
// Chromium: the screenshot must not be blank and the DOM must hold the
// page's rate lines.
func TestRatesPageChromium(t *testing.T) {
	bin := ""
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			bin = p
			break
		}
	}
	if bin == "" {
		t.Skip("chromium not installed (Debian package chromium): skipping the browser rendering test")
	}
	page, err := filepath.Abs("../../docs/congestion-rates.html")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	want := plotElements(t, src)["flow"]
	if want == 0 {
		t.Fatal("docs/congestion-rates.html has no rate lines")
	}
	dir := t.TempDir()
	run := func(extra string) string {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
			"--disable-component-update", "--disable-sync", "--no-first-run", "--user-data-dir="+t.TempDir(),
			"--window-size=1000,800", extra, "file://"+page)
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		if err := cmd.Run(); err != nil {
			t.Fatalf("%s: %v\n%s", bin, err, e.String())
		}
		return o.String()
	}
	if dom := run("--dump-dom"); strings.Count(dom, `class="flow"`) != want {
		t.Errorf("the browser's DOM has %d rate lines, the page %d", strings.Count(dom, `class="flow"`), want)
	}
	shot := filepath.Join(dir, "shot.png")
	run("--screenshot=" + shot)
	f, err := os.Open(shot)
	if err != nil {
		t.Fatalf("no screenshot: %v", err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if c := colours(img); c < 5 {
		t.Errorf("screenshot has %d colours: blank page?", c)
	}
}

// colours counts the distinct colours of img (coarsely), up to 64.
func colours(img image.Image) int {
	seen := map[uint32]bool{}
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y += 2 {
		for x := b.Min.X; x < b.Max.X; x += 2 {
			r, g, bl, _ := img.At(x, y).RGBA()
			seen[r>>12<<8|g>>12<<4|bl>>12] = true
			if len(seen) >= 64 {
				return len(seen)
			}
		}
	}
	return len(seen)
}
