package cases

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/softroce/softroce/inspect"
)

// TestReportAndPcaps runs a few cases through RunAll with --pcap and
// checks the report files and that `softroce inspect` decodes the pcaps
// packet for packet, ICRC included.
func TestReportAndPcaps(t *testing.T) {
	tgt, err := NewSoftroceTarget()
	if err != nil {
		t.Fatal(err)
	}
	defer tgt.Close()
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var log bytes.Buffer
	rep, err := RunAll(ctx, []Target{tgt}, All, Options{Only: regexp.MustCompile(`^(read-response-segmentation|rnr-nak)$`),
		PcapDir: filepath.Join(dir, "pcap"), Log: &log})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Cases) != 2 || rep.Counts("softroce")[VerdictPass] != 2 {
		t.Fatalf("report has %d cases, counts %v; log:\n%s", len(rep.Cases), rep.Counts("softroce"), log.String())
	}
	if err := rep.WriteFiles(dir); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, "conformance-report.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| case | spec expectation (section) | softroce |", "| `rnr-nak` (RS-21) |", `0x20\|min_rnr_timer`} {
		if !strings.Contains(string(md), want) {
			t.Errorf("Markdown report lacks %q:\n%s", want, md)
		}
	}
	var back Report
	js, err := os.ReadFile(filepath.Join(dir, "conformance-report.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(js, &back); err != nil {
		t.Fatalf("JSON report does not parse: %v", err)
	}
	if r := back.Result("rnr-nak", "softroce"); r == nil || r.Verdict != VerdictPass || len(r.Trace) == 0 {
		t.Fatalf("JSON result for rnr-nak: %+v", r)
	}
	recs, err := inspect.Records(filepath.Join(dir, "pcap", "read-response-segmentation.softroce.pcap"))
	if err != nil {
		t.Fatal(err)
	}
	// READ request, 4 responses, the WRITE and its ACK.
	if len(recs) != 7 {
		t.Fatalf("pcap has %d records, want 7", len(recs))
	}
	for i := range recs {
		if recs[i].Bad() {
			t.Errorf("record %d decodes as bad: %s", i, inspect.Line(&recs[i]))
		}
	}
	if l := inspect.Line(&recs[4]); !strings.Contains(l, "RDMA_READ_RESPONSE_LAST") {
		t.Errorf("record 5 is %q, want the READ_RESPONSE_LAST", l)
	}
}

// TestPatternHasNoPeriod: case data must not repeat at a packet, page or
// 64 KiB distance, or data misplaced by that much would pass.
func TestPatternHasNoPeriod(t *testing.T) {
	b := pattern(1<<18+64, 7)
	for _, d := range []int{256, 1024, 4096, 1 << 16, 1 << 17} {
		if bytes.Equal(b[:64], b[d:d+64]) {
			t.Errorf("pattern repeats after %d bytes", d)
		}
	}
	if bytes.Equal(pattern(64, 1), pattern(64, 2)) {
		t.Error("seeds 1 and 2 give the same data")
	}
}

// TestCatalogueCoverage keeps the cases' catalogue references, the
// entries docs/conformance-catalogue.md lists as implemented (A.1 to A.4)
// and those it lists as not implemented (A.5, catalogueNotCovered) in
// step: every referenced entry is listed as implemented, every listed
// entry is referenced, and the A.5 table is the map, reasons included.
func TestCatalogueCoverage(t *testing.T) {
	doc, err := os.ReadFile("../../docs/conformance-catalogue.md")
	if err != nil {
		t.Skipf("catalogue not found: %v", err)
	}
	s := string(doc)
	a, a5, c := strings.Index(s, "## A. Cases"), strings.Index(s, "### A.5"), strings.Index(s, "## C.")
	if a < 0 || a5 < a || c < a5 {
		t.Fatal("docs/conformance-catalogue.md lacks sections A, A.5 or C in that order")
	}
	row := regexp.MustCompile(`(?m)^\| ([A-Z]{2}-\d\d) \| (.*) \|$`)
	listed := map[string]bool{}
	for _, m := range row.FindAllStringSubmatch(s[a:a5], -1) {
		listed[m[1]] = true
	}
	refd := map[string]bool{}
	for _, c := range All {
		if c.Ref == "" {
			continue
		}
		for _, id := range strings.Split(c.Ref, ", ") {
			refd[id] = true
			if !listed[id] {
				t.Errorf("case %s refers to %s, which sections A.1-A.4 do not list", c.ID, id)
			}
		}
	}
	for id := range listed {
		if !refd[id] {
			t.Errorf("%s is listed as implemented, but no case refers to it", id)
		}
	}
	seen := map[string]bool{}
	for _, m := range row.FindAllStringSubmatch(s[a5:c], -1) {
		id := m[1]
		seen[id] = true
		cols := strings.Split(m[2], " | ")
		if why := cols[len(cols)-1]; catalogueNotCovered[id] != why {
			t.Errorf("A.5 says %s is not covered because %q; catalogueNotCovered says %q", id, why, catalogueNotCovered[id])
		}
		if refd[id] {
			t.Errorf("%s is in A.5 but a case implements it", id)
		}
	}
	for id := range catalogueNotCovered {
		if !seen[id] {
			t.Errorf("catalogueNotCovered has %s, which A.5 does not list", id)
		}
	}
}
