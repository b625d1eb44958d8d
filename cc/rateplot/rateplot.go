// Package rateplot draws what congestion control did: each flow's rate
// and the bottleneck's queue over time, as one self-contained SVG or HTML
// page (nothing fetched from the network), so a run of a scenario can be
// looked at rather than read as numbers.
//
// The output is well-formed XML in both formats (the HTML is written as
// XHTML-compatible markup), which keeps it checkable by a plain XML
// parser.
package rateplot

import (
	"errors"
	"fmt"
	"html"
	"io"
	"math"
	"strings"
	"time"
)

// Series is one flow's rate, in bits per second, one value per Plot.Step.
type Series struct {
	Name   string
	Values []float64
}

// Plot is what to draw.
type Plot struct {
	Title string
	// Step is the time between two samples; sample i is at i*Step.
	Step  time.Duration
	Flows []Series
	// Queue is the bottleneck's queue in bytes, one value per Step
	// (optional: nil draws the rates alone).
	Queue []float64
	// Kmin and Kmax, if set, are drawn across the queue panel.
	Kmin, Kmax float64
}

// Layout, in SVG user units.
const (
	width   = 900
	panelH  = 260
	marginL = 70
	marginR = 150 // legend
	marginT = 40
	gap     = 50
	marginB = 40
)

// palette cycles over flows; chosen to stay apart for eight flows.
var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"}

// Write draws p in format "svg" or "html" ("" is html).
func Write(w io.Writer, p *Plot, format string) error {
	if format == "" {
		format = "html"
	}
	if format != "svg" && format != "html" {
		return fmt.Errorf("rateplot: unknown format %q (want svg or html)", format)
	}
	if len(p.Flows) == 0 || p.Step <= 0 {
		return errors.New("rateplot: nothing to draw: need at least one flow and a positive step")
	}
	n := len(p.Queue)
	for _, f := range p.Flows {
		n = max(n, len(f.Values))
	}
	if n < 2 {
		return errors.New("rateplot: need at least two samples")
	}
	var b strings.Builder
	h := marginT + panelH + marginB
	if p.Queue != nil {
		h += gap + panelH
	}
	if format == "html" {
		b.WriteString("<!DOCTYPE html>\n<html xmlns=\"http://www.w3.org/1999/xhtml\" lang=\"en\"><head><meta charset=\"utf-8\"/>\n<title>")
		b.WriteString(html.EscapeString(p.Title))
		b.WriteString("</title>\n<style>body{font-family:sans-serif;margin:1em} svg text{font-size:12px}</style></head>\n<body>\n<h1>")
		b.WriteString(html.EscapeString(p.Title))
		b.WriteString("</h1>\n")
	}
	fmt.Fprintf(&b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\">\n", width, h, width, h)
	if format == "svg" && p.Title != "" {
		fmt.Fprintf(&b, "<text x=\"%d\" y=\"20\" font-size=\"15\">%s</text>\n", marginL, html.EscapeString(p.Title))
	}
	tmax := float64(n-1) * p.Step.Seconds()
	// Rates panel.
	rmax := 0.0
	for _, f := range p.Flows {
		for _, v := range f.Values {
			rmax = max(rmax, v)
		}
	}
	rmax = niceCeil(rmax / 1e9)
	top := float64(marginT)
	axes(&b, top, tmax, rmax, "rate (Gb/s)")
	for i, f := range p.Flows {
		color := palette[i%len(palette)]
		fmt.Fprintf(&b, "<polyline class=\"flow\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.2\" points=\"", color)
		points(&b, f.Values, p.Step.Seconds(), tmax, top, func(v float64) float64 { return v / 1e9 / rmax })
		b.WriteString("\"><title>")
		b.WriteString(html.EscapeString(f.Name))
		b.WriteString("</title></polyline>\n")
		y := top + 10 + float64(i)*18
		fmt.Fprintf(&b, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"3\"/><text x=\"%d\" y=\"%.1f\">%s</text>\n",
			width-marginR+15, y, width-marginR+35, y, color, width-marginR+40, y+4, html.EscapeString(f.Name))
	}
	if p.Queue != nil {
		top += panelH + gap
		qmax := 0.0
		for _, v := range p.Queue {
			qmax = max(qmax, v)
		}
		qmax = niceCeil(max(qmax, p.Kmax) / 1e3)
		axes(&b, top, tmax, qmax, "queue (KB)")
		for _, k := range []struct {
			name string
			v    float64
		}{{"Kmin", p.Kmin}, {"Kmax", p.Kmax}} {
			if k.v <= 0 {
				continue
			}
			y := top + panelH*(1-k.v/1e3/qmax)
			fmt.Fprintf(&b, "<line class=\"threshold\" x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#888\" stroke-dasharray=\"4 3\"/><text x=\"%d\" y=\"%.1f\" fill=\"#555\">%s</text>\n",
				marginL, y, width-marginR, y, width-marginR+5, y+4, k.name)
		}
		b.WriteString("<polyline class=\"queue\" fill=\"none\" stroke=\"#333\" stroke-width=\"1.2\" points=\"")
		points(&b, p.Queue, p.Step.Seconds(), tmax, top, func(v float64) float64 { return v / 1e3 / qmax })
		b.WriteString("\"><title>queue</title></polyline>\n")
	}
	b.WriteString("</svg>\n")
	if format == "html" {
		b.WriteString("</body></html>\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// axes draws a panel's frame, time ticks and value ticks (0..vmax).
func axes(b *strings.Builder, top, tmax, vmax float64, label string) {
	x0, x1, y1 := float64(marginL), float64(width-marginR), top+panelH
	fmt.Fprintf(b, "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%d\" fill=\"none\" stroke=\"#000\"/>\n", x0, top, x1-x0, panelH)
	fmt.Fprintf(b, "<text x=\"12\" y=\"%.0f\" transform=\"rotate(-90 12 %.0f)\" text-anchor=\"middle\">%s</text>\n", top+panelH/2, top+panelH/2, label)
	for i := 0; i <= 4; i++ {
		v := vmax * float64(i) / 4
		y := y1 - panelH*float64(i)/4
		fmt.Fprintf(b, "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" stroke=\"#eee\"/><text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n",
			x0, y, x1, y, x0-6, y+4, trim(v))
	}
	tstep := niceCeil(tmax / 8)
	for t := 0.0; t <= tmax*1.0001; t += tstep {
		x := x0 + (x1-x0)*t/tmax
		fmt.Fprintf(b, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#000\"/><text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n",
			x, y1, x, y1+5, x, y1+18, fmtTime(t))
	}
}

// points writes the polyline points of vs; scale maps a value to 0..1 of
// the panel height.
func points(b *strings.Builder, vs []float64, step, tmax, top float64, scale func(float64) float64) {
	x0, x1 := float64(marginL), float64(width-marginR)
	for i, v := range vs {
		if i > 0 {
			b.WriteByte(' ')
		}
		y := top + panelH*(1-min(1, max(0, scale(v))))
		fmt.Fprintf(b, "%.1f,%.1f", x0+(x1-x0)*float64(i)*step/tmax, y)
	}
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten (1 for v <= 0).
func niceCeil(v float64) float64 {
	if !(v > 0) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p*(1+1e-9) {
			return m * p
		}
	}
	return 10 * p
}

func trim(v float64) string { return strings.TrimSuffix(fmt.Sprintf("%.4g", v), ".0") }

func fmtTime(s float64) string {
	switch {
	case s == 0:
		return "0"
	case s < 1e-3:
		return trim(s*1e6) + "µs"
	case s < 1:
		return trim(s*1e3) + "ms"
	}
	return trim(s) + "s"
}
