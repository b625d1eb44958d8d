package replay

import (
	"encoding/json"
	"fmt"
	"html"
	"io"
	"sort"
	"strings"

	"github.com/softroce/softroce/diagram"
	"github.com/softroce/softroce/inspect"
)

func sortedKeys(m map[uint32]*keyPlan) []*keyPlan {
	var ks []*keyPlan
	for _, k := range m {
		ks = append(ks, k)
	}
	sort.Slice(ks, func(i, j int) bool { return ks[i].rkey < ks[j].rkey })
	return ks
}

// WriteText writes the per-exchange verdicts and the summary line. With
// verbose, every exchange shows its packets; otherwise only those that
// differ do.
func (r *Report) WriteText(w io.Writer, verbose bool) error {
	var b strings.Builder
	fmt.Fprintf(&b, "replay of %s\n", r.File)
	for i, f := range r.Flows {
		rq := "?"
		if f.RequesterQPKnown {
			rq = fmt.Sprintf("0x%06x", f.RequesterQP)
		}
		fmt.Fprintf(&b, "flow %d: %v qp %s > %v qp 0x%06x, path MTU %d\n", i+1, f.Requester, rq, f.Responder, f.ResponderQP, f.PathMTU)
		for _, s := range f.Setup {
			fmt.Fprintf(&b, "  setup: %s\n", s)
		}
		if f.Error != "" {
			fmt.Fprintf(&b, "  NOT REPLAYED: %s\n", f.Error)
		}
		for _, k := range sortedReasons(f.NotReplayed) {
			fmt.Fprintf(&b, "  not replayed: %d request packets: %s\n", f.NotReplayed[k], k)
		}
		for _, e := range r.Exchanges {
			if e.Flow != i+1 {
				continue
			}
			fmt.Fprintf(&b, "  frame %d %s psn %d: %s\n", e.Frame, e.Opcode, e.PSN, e.Verdict)
			for _, a := range e.Allowed {
				fmt.Fprintf(&b, "      allowed: %s\n", a)
			}
			for _, a := range e.Failures {
				fmt.Fprintf(&b, "      DIFFERS: %s\n", a)
			}
			if verbose || e.Verdict == Differ {
				fmt.Fprintf(&b, "      request:  %s\n", e.Request)
				for _, l := range e.Real {
					fmt.Fprintf(&b, "      real:     %s\n", l)
				}
				if len(e.Real) == 0 {
					b.WriteString("      real:     (no answer)\n")
				}
				for _, l := range e.Softroce {
					fmt.Fprintf(&b, "      softroce: %s\n", l)
				}
				if len(e.Softroce) == 0 {
					b.WriteString("      softroce: (no answer)\n")
				}
			}
		}
	}
	for _, e := range r.CMExchanges {
		fmt.Fprintf(&b, "CM %s side: frame %d %s: %s\n", e.Side, e.Frame, e.Message, e.Verdict)
		if e.Setup != "" {
			fmt.Fprintf(&b, "      setup: %s\n", e.Setup)
		}
		for _, a := range e.Allowed {
			fmt.Fprintf(&b, "      allowed: %s\n", a)
		}
		for _, a := range e.Failures {
			fmt.Fprintf(&b, "      DIFFERS: %s\n", a)
		}
		if verbose || e.Verdict == Differ {
			fmt.Fprintf(&b, "      request:  %s\n", e.Request)
			for _, l := range e.Real {
				fmt.Fprintf(&b, "      real:     %s\n", l)
			}
			if len(e.Real) == 0 {
				b.WriteString("      real:     (no answer)\n")
			}
			for _, l := range e.Softroce {
				fmt.Fprintf(&b, "      softroce: %s\n", l)
			}
			if len(e.Softroce) == 0 {
				b.WriteString("      softroce: (no answer)\n")
			}
		}
	}
	if r.CMSkipped > 0 {
		fmt.Fprintf(&b, "skipped: %d CM MADs (not part of a replayed exchange, or retransmissions)\n", r.CMSkipped)
	}
	for _, k := range sortedReasons(r.Skipped) {
		fmt.Fprintf(&b, "skipped: %d %s\n", r.Skipped[k], k)
	}
	for _, rf := range r.RequesterFlows {
		fmt.Fprintf(&b, "requester side, flow %d: %d work requests derived from the captured requests", rf.Flow, rf.Messages)
		if rf.Segments > 1 {
			fmt.Fprintf(&b, ", on %d QPs", rf.Segments)
		}
		if rf.Note != "" {
			fmt.Fprintf(&b, " (%s)", rf.Note)
		}
		b.WriteByte('\n')
		for _, c := range r.Completions {
			if c.Flow != rf.Flow || c.Verdict == Agree && !verbose {
				continue
			}
			fmt.Fprintf(&b, "  frame %d %s psn %d, %d bytes: %s: real answers complete it %s, softroce %s", c.Frame, c.Op, c.PSN, c.Length, c.Verdict, c.Want, c.Got)
			if c.Detail != "" {
				fmt.Fprintf(&b, " (%s)", c.Detail)
			}
			b.WriteByte('\n')
		}
	}
	b.WriteString(r.Summary())
	b.WriteByte('\n')
	if r.CMReplayed > 0 {
		b.WriteString(r.CMSummary())
		b.WriteByte('\n')
	}
	if len(r.Completions) > 0 {
		b.WriteString(r.RequesterSummary())
		b.WriteByte('\n')
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteJSON writes the report as one JSON object with the summary line.
func (r *Report) WriteJSON(w io.Writer) error {
	type out struct {
		*Report
		Summary          string `json:"summary"`
		RequesterSummary string `json:"requester_summary"`
		CMSummary        string `json:"cm_summary"`
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out{r, r.Summary(), r.RequesterSummary(), r.CMSummary()})
}

// Sides returns the two conversations to draw: the capture's (every
// request, the lost ones marked, and the real answers) and the replay's
// (the replayed requests and softroce's answers).
func (r *Report) Sides() (real []inspect.Record, lost []bool, soft []inspect.Record) {
	for i := range r.recs {
		rec := &r.recs[i]
		if !rec.RoCE || rec.CM != nil {
			continue
		}
		real = append(real, *rec)
		lost = append(lost, r.lost[rec])
	}
	byFrame := map[int][]*Exchange{}
	for i := range r.Exchanges {
		e := &r.Exchanges[i]
		byFrame[e.Frame] = append(byFrame[e.Frame], e)
	}
	for i := range r.recs {
		rec := &r.recs[i]
		for _, e := range byFrame[rec.Frame] {
			soft = append(soft, *rec)
			for _, s := range e.soft {
				soft = append(soft, *s)
			}
		}
	}
	return real, lost, soft
}

// WriteDiagram writes an HTML page with the capture's ladder diagram and
// the replay's side by side, drawn by package diagram.
func (r *Report) WriteDiagram(w io.Writer) error {
	real, lost, soft := r.Sides()
	var left, right strings.Builder
	if len(real) > 0 {
		if err := diagram.Write(&left, real, diagram.Options{Format: "svg", Title: "real responder", Lost: lost}); err != nil {
			return err
		}
	}
	if len(soft) > 0 {
		if err := diagram.Write(&right, soft, diagram.Options{Format: "svg", Title: "softroce responder"}); err != nil {
			return err
		}
	}
	var b strings.Builder
	title := "replay of " + r.File
	b.WriteString("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>")
	b.WriteString(html.EscapeString(title))
	b.WriteString("</title>\n<style>body{font:14px sans-serif;margin:16px} td{vertical-align:top;padding:0 8px} .differ{color:#cf222e} .allowed{color:#8250df}</style></head>\n<body>\n<h1>")
	b.WriteString(html.EscapeString(title))
	fmt.Fprintf(&b, "</h1>\n<p>%s</p>\n<ul>\n", html.EscapeString(r.Summary()))
	for _, e := range r.Exchanges {
		if e.Verdict == Agree {
			continue
		}
		fmt.Fprintf(&b, "<li class=\"%s\">frame %d %s psn %d: %s: %s</li>\n", e.Verdict, e.Frame, html.EscapeString(e.Opcode), e.PSN, e.Verdict,
			html.EscapeString(strings.Join(append(append([]string(nil), e.Failures...), e.Allowed...), "; ")))
	}
	b.WriteString("</ul>\n<table><tr><th>capture: the real responder</th><th>replay: softroce's responder</th></tr>\n<tr><td>\n")
	b.WriteString(left.String())
	b.WriteString("</td><td>\n")
	b.WriteString(right.String())
	b.WriteString("</td></tr></table>\n</body></html>\n")
	_, err := io.WriteString(w, b.String())
	return err
}
