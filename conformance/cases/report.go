package cases

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/softroce/softroce/nic/capture"
)

// Report is the outcome of a conformance run: every case on every target.
type Report struct {
	Generated time.Time `json:"generated"`
	// Targets are the target names, in column order.
	Targets []string `json:"targets"`
	// Environment describes what ran (Go version, rxe guest kernel, ...).
	Environment map[string]string `json:"environment"`
	Cases       []*CaseReport     `json:"cases"`
	// Devices describe the device behind a target, by target name, for
	// the targets that report one (a remote host's RNIC).
	Devices map[string]DeviceInfo `json:"devices,omitempty"`
	// NotCovered are the catalogue entries no case implements, with why
	// (docs/conformance-catalogue.md section A.5).
	NotCovered map[string]string `json:"catalogue_not_covered,omitempty"`
}

// CaseReport is one case's row.
type CaseReport struct {
	ID      string            `json:"id"`
	Ref     string            `json:"catalogue_ref,omitempty"`
	Spec    string            `json:"spec"`
	Known   map[string]string `json:"known_deviations,omitempty"`
	Bugs    map[string]string `json:"known_bugs,omitempty"`
	Results []*Result         `json:"results"`
}

// Options tune RunAll.
type Options struct {
	// Only, if set, selects the cases whose ID matches.
	Only *regexp.Regexp
	// PcapDir, if set, receives CASE.TARGET.pcap per case and target.
	PcapDir string
	// Log receives one line per finished case (nil: none).
	Log io.Writer
	// Environment entries to record in the report.
	Environment map[string]string
}

// RunAll runs cases against every target, one case at a time, and
// returns the report. Harness errors are recorded per case, not returned;
// the error is for the report's own failures (pcap directory).
func RunAll(ctx context.Context, targets []Target, cases []*Case, o Options) (*Report, error) {
	r := &Report{Generated: time.Now().UTC(), Environment: map[string]string{"go": runtime.Version()}, NotCovered: catalogueNotCovered}
	for k, v := range o.Environment {
		r.Environment[k] = v
	}
	for _, t := range targets {
		r.Targets = append(r.Targets, t.Name())
		if d, ok := t.(DeviceTarget); ok {
			if r.Devices == nil {
				r.Devices = map[string]DeviceInfo{}
			}
			r.Devices[t.Name()] = d.Device()
		}
	}
	if o.PcapDir != "" {
		if err := os.MkdirAll(o.PcapDir, 0o755); err != nil {
			return nil, fmt.Errorf("create pcap directory: %w", err)
		}
	}
	for _, c := range cases {
		if o.Only != nil && !o.Only.MatchString(c.ID) {
			continue
		}
		cr := &CaseReport{ID: c.ID, Ref: c.Ref, Spec: c.Spec, Known: c.Known, Bugs: c.Bugs}
		for _, t := range targets {
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			res := Run(cctx, t, c)
			cancel()
			cr.Results = append(cr.Results, res)
			if o.PcapDir != "" && res.conv != nil {
				if err := writePcap(filepath.Join(o.PcapDir, c.ID+"."+t.Name()+".pcap"), res.conv); err != nil {
					return nil, err
				}
			}
			if o.Log != nil {
				fmt.Fprintf(o.Log, "%-40s %-9s %-9s %s\n", c.ID, t.Name(), res.Verdict, res.Observed)
			}
		}
		r.Cases = append(r.Cases, cr)
		if ctx.Err() != nil {
			return r, ctx.Err()
		}
	}
	return r, nil
}

func writePcap(path string, c *Conv) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("create pcap: %w", err)
	}
	w, err := capture.NewPcapWriter(f)
	if err == nil {
		err = c.WritePcap(w)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// Result returns the result of case id on target, or nil.
func (r *Report) Result(id, target string) *Result {
	for _, c := range r.Cases {
		if c.ID != id {
			continue
		}
		for _, res := range c.Results {
			if res.Target == target {
				return res
			}
		}
	}
	return nil
}

// Unexpected counts the results that neither pass nor match a documented
// deviation or known bug: what a CI run should fail on.
func (r *Report) Unexpected() int {
	n := 0
	for _, c := range r.Cases {
		for _, res := range c.Results {
			switch {
			case res.Verdict == VerdictError:
				n++
			case res.Verdict == VerdictFail && c.Bugs[res.key()] == "":
				n++
			}
		}
	}
	return n
}

// Counts returns how many results of target have each verdict.
func (r *Report) Counts(target string) map[string]int {
	m := map[string]int{}
	for _, c := range r.Cases {
		for _, res := range c.Results {
			if res.Target == target {
				m[res.Verdict]++
			}
		}
	}
	return m
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// cell escapes text for a Markdown table cell.
func cell(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	return strings.ReplaceAll(s, "\n", " ")
}

var verdictLabel = map[string]string{VerdictPass: "✅ pass", VerdictFail: "❌ FAIL", VerdictDeviation: "⚠️ deviation (documented)", VerdictError: "⛔ harness error"}

// WriteMarkdown writes the report: a summary, the table (case | spec
// expectation | one column per target), then the details of every result
// that is not a pass, and the notes.
func (r *Report) WriteMarkdown(w io.Writer) error {
	var b strings.Builder
	b.WriteString("# softroce conformance report\n\n")
	fmt.Fprintf(&b, "Generated %s by `softroce conformance`. Each case crafts exact RoCEv2 packets from a fake peer to a QP of the target and judges the answers against the IBTA specification; the same case runs against every target.\n\n", r.Generated.Format(time.RFC3339))
	b.WriteString("Reproduce with `softroce conformance rxe --out DIR [--pcap PCAPDIR] [--only REGEX]` (root: it boots the " +
		"rdma_rxe VM), `softroce conformance remote HOST[:PORT] --token T [--peer udp|raw] [--with-rxe]` (a host with an RNIC running softroce-agent, docs/remote.md; `--with-rxe` adds the rxe column) " +
		"or `softroce conformance self` (softroce only, no privileges). With `--pcap`, each case's packets " +
		"are saved per target as CASE.TARGET.pcap for `softroce inspect`; frames are rebuilt with IPv4 ID 0, so packets " +
		"rxe sent (it picks non-zero IDs) show an ICRC mismatch there although rxe's ICRC was right on the wire.\n\n" +
		"Verdicts: pass = conforms to the expectation; deviation = does not, as documented for that target; " +
		"FAIL = does not, undocumented or a known bug; harness error = the case could not run. Bracketed IDs " +
		"after a case name are the entries of docs/conformance-catalogue.md (section A) it implements.\n\n")
	keys := make([]string, 0, len(r.Environment))
	for k := range r.Environment {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "- %s: %s\n", k, r.Environment[k])
	}
	b.WriteString("\n| target | pass | deviation (documented) | fail | harness error |\n|---|---|---|---|---|\n")
	for _, t := range r.Targets {
		m := r.Counts(t)
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d |\n", cell(r.targetLabel(t)), m[VerdictPass], m[VerdictDeviation], m[VerdictFail], m[VerdictError])
	}
	b.WriteString("\n| case | spec expectation (section) |")
	for _, t := range r.Targets {
		fmt.Fprintf(&b, " %s |", cell(r.targetLabel(t)))
	}
	b.WriteString("\n|---|---|")
	for range r.Targets {
		b.WriteString("---|")
	}
	b.WriteString("\n")
	for _, c := range r.Cases {
		ref := ""
		if c.Ref != "" {
			ref = " (" + c.Ref + ")"
		}
		fmt.Fprintf(&b, "| `%s`%s | %s |", c.ID, ref, cell(c.Spec))
		for _, t := range r.Targets {
			res := r.Result(c.ID, t)
			if res == nil {
				b.WriteString(" not run |")
				continue
			}
			obs := res.Observed
			if res.Error != "" {
				obs = res.Error
			}
			label := verdictLabel[res.Verdict]
			if res.Verdict == VerdictFail && c.Bugs[res.key()] != "" {
				label += " (known bug)"
			}
			fmt.Fprintf(&b, " **%s**: %s |", label, cell(obs))
		}
		b.WriteString("\n")
	}
	r.writeCoverage(&b)
	var details strings.Builder
	for _, c := range r.Cases {
		for _, res := range c.Results {
			if res.Verdict == VerdictPass && len(res.Notes) == 0 {
				continue
			}
			fmt.Fprintf(&details, "\n### `%s` on %s: %s\n\n", c.ID, res.Target, verdictLabel[res.Verdict])
			if k := c.Known[res.key()]; k != "" && res.Verdict != VerdictPass {
				fmt.Fprintf(&details, "Documented deviation: %s\n\n", k)
			}
			if k := c.Bugs[res.key()]; k != "" && res.Verdict == VerdictFail {
				fmt.Fprintf(&details, "Known bug: %s\n\n", k)
			}
			for _, f := range res.Failures {
				fmt.Fprintf(&details, "- differs from the spec: %s\n", f)
			}
			if res.Error != "" {
				fmt.Fprintf(&details, "- harness error: %s\n", res.Error)
			}
			for _, n := range res.Notes {
				fmt.Fprintf(&details, "- note: %s\n", n)
			}
			if res.Verdict != VerdictPass && len(res.Trace) > 0 {
				details.WriteString("\n```\n" + strings.Join(res.Trace, "\n") + "\n```\n")
			}
		}
	}
	if details.Len() > 0 {
		b.WriteString("\n## Deviations, failures and notes\n")
		b.WriteString(details.String())
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// targetLabel is a target's column heading: its name, and for a target
// with a device, the device's name, firmware and driver.
func (r *Report) targetLabel(t string) string {
	d, ok := r.Devices[t]
	if !ok {
		return t
	}
	return t + " (" + d.String() + ")"
}

// WriteFiles writes dir/conformance-report.md and dir/conformance-report.json.
func (r *Report) WriteFiles(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create report directory: %w", err)
	}
	for _, f := range []struct {
		name  string
		write func(io.Writer) error
	}{{"conformance-report.md", r.WriteMarkdown}, {"conformance-report.json", r.WriteJSON}} {
		path := filepath.Join(dir, f.name)
		out, err := os.Create(path)
		if err != nil {
			return fmt.Errorf("create %s: %w", path, err)
		}
		err = f.write(out)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
	}
	return nil
}

// writeCoverage lists the catalogue entries the report's cases implement,
// the cases with no entry, and the entries no case implements, with why.
func (r *Report) writeCoverage(b *strings.Builder) {
	covered := map[string]bool{}
	var none []string
	for _, c := range r.Cases {
		if c.Ref == "" {
			none = append(none, "`"+c.ID+"`")
			continue
		}
		for _, id := range strings.Split(c.Ref, ", ") {
			covered[id] = true
		}
	}
	ids := make([]string, 0, len(covered))
	for id := range covered {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	fmt.Fprintf(b, "\n## Catalogue coverage\n\n%d cases; they implement %d entries of docs/conformance-catalogue.md section A: %s.\n",
		len(r.Cases), len(ids), strings.Join(ids, ", "))
	if len(none) > 0 {
		fmt.Fprintf(b, "\nCases with no catalogue entry (the catalogue has none for shared receive queues, UC, UD and the "+
			"connection manager, nor for a few RC checks of the project's own): %s.\n", strings.Join(none, ", "))
	}
	var missing []string
	for id := range r.NotCovered {
		if !covered[id] {
			missing = append(missing, id)
		}
	}
	if len(missing) == 0 {
		return
	}
	sort.Strings(missing)
	b.WriteString("\n### Catalogue entries not covered, and why\n\n| id | why |\n|---|---|\n")
	for _, id := range missing {
		fmt.Fprintf(b, "| %s | %s |\n", id, cell(r.NotCovered[id]))
	}
}
