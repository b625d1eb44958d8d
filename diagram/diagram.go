// Package diagram draws ladder (sequence) diagrams of RoCE conversations:
// for each requester QP talking to a responder QP, two columns (requester
// on the left, responder on the right) and one arrow per packet, labelled
// with opcode and PSN, time flowing down the page.
//
// What RC does to recover from trouble is highlighted: retransmissions (a
// request PSN sent again: go-back-N, IBTA 9.7.5), NAKs, RNR NAKs, packets
// whose ICRC failed, and packets the caller marks as lost. The output is
// self-contained: plain SVG, or one HTML page with the SVG, its CSS and a
// small inline script (hover details), fetching nothing from the network.
//
// The input is []inspect.Record, so the same picture comes from a capture
// file (softroce inspect) and from a run of softroce demo.
package diagram

import (
	"errors"
	"fmt"
	"html"
	"io"
	"net/netip"
	"sort"
	"strings"
	"time"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/inspect"
)

// Options tune Write.
type Options struct {
	// Format is "html" (default) or "svg".
	Format string
	// Title heads the page.
	Title string
	// Lost[i] marks recs[i] as sent but lost before reaching its peer
	// (softroce demo knows this; a capture does not).
	Lost []bool
	// MaxArrows bounds the packets drawn per conversation (default
	// DefaultMaxArrows): a long capture would make a page no browser
	// can scroll. The rest are counted in the conversation's title.
	MaxArrows int
}

// Render writes the ladder diagram of recs in format "html" or "svg".
func Render(w io.Writer, recs []inspect.Record, format string) error {
	return Write(w, recs, Options{Format: format})
}

// Kinds of arrows, also the CSS classes.
const (
	kindRequest    = "req"
	kindResponse   = "resp"
	kindRetransmit = "retx"
	kindNAK        = "nak"
	kindRNR        = "rnr"
	kindBadICRC    = "bad"
	kindLost       = "lost"
	kindMalformed  = "bad"
	kindCNP        = "cnp" // a congestion notification (RoCEv2 annex A17.9)
)

// arrow is one packet to draw.
type arrow struct {
	rec      *inspect.Record
	leftToRt bool
	kind     string
	label    string
	detail   string
	t        time.Duration // since the conversation's first packet
}

// conversation is one QP's requests to its peer and the answers: the
// requester on the left, the responder on the right.
type conversation struct {
	left, right netip.Addr
	leftQPs     map[uint32]bool // QPNs addressed on each side
	rightQPs    map[uint32]bool
	arrows      []arrow
	start       time.Time
	omitted     int  // packets beyond Options.MaxArrows, not drawn
	datagram    bool // UD traffic: no requester/responder, a sender and a receiver
	cm          bool // connection management MADs between two hosts' QP1s
	// cmSeen are the CM messages seen, to mark retransmissions (the CM
	// resends a message with its transaction ID on a new UD PSN).
	cmSeen map[cmKey]bool
	// psns are the request PSNs seen, to attach responses (which name
	// the requester's QP, not the responder's) to the conversation.
	psns map[uint32]bool
	// readMax is the highest READ response PSN seen (readSeen): the PSNs
	// up to it were taken by READs, so a request there is a retry.
	readMax  uint32
	readSeen bool
}

// DefaultMaxArrows is the default Options.MaxArrows.
const DefaultMaxArrows = 2000

// reqKey names a conversation: requester, responder and the responder's
// QP (the destination QP of the requests).
type reqKey struct {
	req, resp netip.Addr
	qp        uint32
}

// respKey names a response flow: responder, requester and the
// requester's QP (the destination QP of the responses).
type respKey struct {
	resp, req netip.Addr
	qp        uint32
}

// grouper sorts packets into conversations. RC packets carry only the
// destination QP, so requests and their answers name different QPs; an
// answer is tied to its requests by PSN (IBTA 9.7.5: an ACK or response
// carries the PSN of the request it answers), and the tie is remembered
// for the rest of that flow.
type grouper struct {
	byCM   map[[2]netip.Addr]*conversation
	byReq  map[reqKey]*conversation
	byResp map[respKey]*conversation
	convs  []*conversation
}

func (g *grouper) newConv(left, right netip.Addr, start time.Time) *conversation {
	c := &conversation{left: left, right: right, leftQPs: map[uint32]bool{}, rightQPs: map[uint32]bool{}, start: start, psns: map[uint32]bool{}}
	g.convs = append(g.convs, c)
	return c
}

func (g *grouper) find(r *inspect.Record, request bool) *conversation {
	if request {
		k := reqKey{r.Src, r.Dst, r.DestQP}
		c := g.byReq[k]
		if c == nil {
			c = g.newConv(r.Src, r.Dst, r.Time)
			g.byReq[k] = c
		}
		return c
	}
	k := respKey{r.Src, r.Dst, r.DestQP}
	if c := g.byResp[k]; c != nil {
		return c
	}
	// A new answer flow: the conversation whose requests went the other
	// way and include this PSN; failing that, the only one between these
	// two addresses; failing that, a conversation of its own.
	var match, only *conversation
	n := 0
	for _, c := range g.convs {
		if c.left != r.Dst || c.right != r.Src {
			continue
		}
		n++
		only = c
		if match == nil && c.psns[r.PSN] {
			match = c
		}
	}
	if match == nil && n == 1 {
		match = only
	}
	if match == nil {
		match = g.newConv(r.Dst, r.Src, r.Time)
	}
	g.byResp[k] = match
	return match
}

// cmKey names one CM message: its attribute, transaction ID and comm ID.
type cmKey struct {
	message string
	tid     uint64
	id      uint32
}

// findCM returns the CM conversation between r's two hosts, both
// directions in one: the REQ's sender on the left.
func (g *grouper) findCM(r *inspect.Record) *conversation {
	k := [2]netip.Addr{r.Src, r.Dst}
	if r.Dst.Less(r.Src) {
		k = [2]netip.Addr{r.Dst, r.Src}
	}
	c := g.byCM[k]
	if c == nil {
		c = g.newConv(r.Src, r.Dst, r.Time)
		c.cm, c.datagram, c.cmSeen = true, true, map[cmKey]bool{}
		g.byCM[k] = c
	}
	return c
}

// cmArrow labels a CM MAD's arrow: "REQ svc 0x106:7174 qpn 0x11 psn 0x...",
// a retransmission (same message, TID and comm ID as one already seen) in
// the retransmission colour, a REJ as a NAK.
func cmArrow(c *conversation, a *arrow, m *inspect.CM) {
	a.label = m.Label()
	a.kind = kindRequest
	if !a.leftToRt {
		a.kind = kindResponse
	}
	var id uint32
	switch {
	case m.LocalCommID != nil:
		id = *m.LocalCommID
	case m.RequestID != nil:
		id = *m.RequestID
	}
	k := cmKey{m.Message, m.TID, id}
	if c.cmSeen[k] {
		a.kind = kindRetransmit
		a.label += " (retransmit)"
	}
	c.cmSeen[k] = true
	if m.Message == "REJ" || m.Error != "" {
		a.kind = kindNAK
	}
}

// build groups records into conversations, in order of first appearance.
func build(recs []inspect.Record, lost []bool, maxArrows int) []*conversation {
	g := &grouper{byCM: map[[2]netip.Addr]*conversation{}, byReq: map[reqKey]*conversation{}, byResp: map[respKey]*conversation{}}
	for i := range recs {
		r := &recs[i]
		if !r.RoCE || !r.Src.IsValid() || !r.Dst.IsValid() {
			continue
		}
		info := bth.Opcode(r.Opcode).Info()
		request := info.Valid && info.Request
		if r.Malformed != "" && !info.Valid {
			request = true // undecodable: draw it from its sender
		}
		var c *conversation
		if r.CM != nil {
			c = g.findCM(r)
		} else {
			c = g.find(r, request)
			if len(c.arrows) == 0 {
				c.datagram = strings.HasPrefix(r.OpcodeName, "UD ")
			}
		}
		if len(c.arrows) >= maxArrows {
			c.omitted++
			continue
		}
		a := arrow{rec: r, leftToRt: r.Src == c.left, t: r.Time.Sub(c.start)}
		if a.leftToRt {
			c.rightQPs[r.DestQP] = true
		} else {
			c.leftQPs[r.DestQP] = true
		}
		name := strings.TrimPrefix(r.OpcodeName, "RC ")
		a.label = fmt.Sprintf("%s psn %d", name, r.PSN)
		a.kind = kindResponse
		if request && a.leftToRt {
			a.kind = kindRequest
			// A request PSN sent again is a retransmission (go-back-N), and
			// so is a request at a PSN a READ took: the READ asked again
			// from its first missing response (IBTA 9.7.5.1).
			if c.psns[r.PSN] || (!c.cm && c.readSeen && bth.PSNDiff(r.PSN, c.readMax) <= 0) {
				a.kind = kindRetransmit
				a.label += " (retransmit)"
			}
			c.psns[r.PSN] = true
		}
		if !a.leftToRt && info.Valid && info.Op == bth.OpReadResponse && !c.cm {
			if c.readSeen && bth.PSNDiff(r.PSN, c.readMax) <= 0 {
				// A READ response PSN sent again: answering a retried READ.
				a.kind = kindRetransmit
				a.label += " (retransmit)"
			} else {
				c.readMax, c.readSeen = r.PSN, true
			}
		}
		if r.CM != nil {
			cmArrow(c, &a, r.CM)
		}
		if info.Valid && info.Op == bth.OpCNP {
			a.kind = kindCNP
			a.label = fmt.Sprintf("CNP: slow down qp 0x%06x", r.DestQP)
		}
		if r.ECN == 3 {
			// Marked Congestion Experienced on the way: what a CNP answers.
			a.label += " [CE]"
		}
		if h := r.AETH; h != nil {
			switch h.Kind {
			case "NAK":
				a.kind = kindNAK
				a.label = fmt.Sprintf("NAK %s psn %d", h.NAKName, r.PSN)
			case "RNR_NAK":
				a.kind = kindRNR
				a.label = fmt.Sprintf("RNR NAK psn %d", r.PSN)
			}
		}
		switch {
		case r.Malformed != "":
			a.kind = kindMalformed
			a.label = "MALFORMED " + a.label
		case r.ICRC == "bad":
			a.kind = kindBadICRC
			a.label += " ICRC BAD"
		}
		if i < len(lost) && lost[i] {
			a.kind = kindLost
			a.label += " LOST"
		}
		a.detail = inspect.Line(r)
		c.arrows = append(c.arrows, a)
	}
	return g.convs
}

// Layout constants (SVG user units).
const (
	width    = 900
	leftX    = 250
	rightX   = 750
	rowH     = 28
	headH    = 78
	slant    = 12
	gapBreak = 50 * time.Millisecond // a pause this long gets a break mark
)

// Write writes the diagram of recs to w.
func Write(w io.Writer, recs []inspect.Record, o Options) error {
	format := strings.ToLower(o.Format)
	if format == "" {
		format = "html"
	}
	if format != "html" && format != "svg" {
		return fmt.Errorf("diagram: unknown format %q (want html or svg)", o.Format)
	}
	maxArrows := o.MaxArrows
	if maxArrows <= 0 {
		maxArrows = DefaultMaxArrows
	}
	convs := build(recs, o.Lost, maxArrows)
	if len(convs) == 0 {
		return errors.New("diagram: no RoCE packets to draw")
	}
	title := o.Title
	if title == "" {
		title = "RoCE ladder diagram"
	}
	var b strings.Builder
	if format == "html" {
		b.WriteString("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>")
		b.WriteString(html.EscapeString(title))
		b.WriteString("</title>\n<style>\n")
		b.WriteString(pageCSS)
		b.WriteString(svgCSS)
		b.WriteString("</style></head>\n<body>\n<h1>")
		b.WriteString(html.EscapeString(title))
		b.WriteString("</h1>\n")
		b.WriteString(legendHTML)
		b.WriteString("<div id=\"detail\">Point at an arrow to see the packet decoded.</div>\n")
		for i, c := range convs {
			writeSVG(&b, c, i, false)
		}
		b.WriteString("<script>\n")
		b.WriteString(pageJS)
		b.WriteString("</script>\n</body></html>\n")
	} else {
		// One SVG holds all conversations, stacked.
		h := 0
		for _, c := range convs {
			h += height(c)
		}
		fmt.Fprintf(&b, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" font-family=\"sans-serif\">\n", width, h, width, h)
		fmt.Fprintf(&b, "<title>%s</title>\n<style>%s</style>\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n", esc(title), svgCSS)
		y := 0
		for i, c := range convs {
			fmt.Fprintf(&b, "<g transform=\"translate(0,%d)\">\n", y)
			writeSVG(&b, c, i, true)
			b.WriteString("</g>\n")
			y += height(c)
		}
		b.WriteString("</svg>\n")
	}
	_, err := io.WriteString(w, b.String())
	if err != nil {
		return fmt.Errorf("diagram: write: %w", err)
	}
	return nil
}

func height(c *conversation) int {
	breaks := 0
	for i := 1; i < len(c.arrows); i++ {
		if c.arrows[i].t-c.arrows[i-1].t >= gapBreak {
			breaks++
		}
	}
	return headH + (len(c.arrows)+breaks)*rowH + 40
}

func esc(s string) string { return html.EscapeString(s) }

func qpList(m map[uint32]bool) string {
	var qs []uint32
	for q := range m {
		qs = append(qs, q)
	}
	sort.Slice(qs, func(i, j int) bool { return qs[i] < qs[j] })
	var parts []string
	for _, q := range qs {
		parts = append(parts, fmt.Sprintf("0x%06x", q))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}

// writeSVG draws one conversation. nested: inside an outer <svg>.
func writeSVG(b *strings.Builder, c *conversation, idx int, nested bool) {
	h := height(c)
	if !nested {
		fmt.Fprintf(b, "<svg class=\"ladder\" xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\">\n", width, h, width, h)
	}
	fmt.Fprintf(b, "<defs><marker id=\"ah%d\" viewBox=\"0 0 10 10\" refX=\"9\" refY=\"5\" markerWidth=\"7\" markerHeight=\"7\" orient=\"auto-start-reverse\"><path d=\"M0,0 L10,5 L0,10 z\" fill=\"context-stroke\"/></marker></defs>\n", idx)
	title := fmt.Sprintf("conversation %d: %s", idx+1, inspect.Plural(len(c.arrows), "packet"))
	if c.cm {
		title = fmt.Sprintf("conversation %d: connection management (QP1), %s", idx+1, inspect.Plural(len(c.arrows), "MAD"))
	}
	if c.omitted > 0 {
		title += fmt.Sprintf(" (and %d more not drawn)", c.omitted)
	}
	fmt.Fprintf(b, "<text class=\"conv\" x=\"%d\" y=\"18\">%s</text>\n", 10, esc(title))
	for _, col := range []struct {
		x    int
		addr netip.Addr
		qps  map[uint32]bool
		role string
	}{{leftX, c.left, c.leftQPs, "requester"}, {rightX, c.right, c.rightQPs, "responder"}} {
		switch {
		case c.cm:
			col.role = "CM"
		case c.datagram:
			col.role = map[string]string{"requester": "sender", "responder": "receiver"}[col.role]
		}
		fmt.Fprintf(b, "<rect class=\"head\" x=\"%d\" y=\"26\" width=\"220\" height=\"40\" rx=\"5\"/>\n", col.x-110)
		fmt.Fprintf(b, "<text class=\"hname\" x=\"%d\" y=\"43\" text-anchor=\"middle\">%s (%s)</text>\n", col.x, esc(col.addr.String()), col.role)
		fmt.Fprintf(b, "<text class=\"hqp\" x=\"%d\" y=\"59\" text-anchor=\"middle\">qp %s</text>\n", col.x, esc(qpList(col.qps)))
		fmt.Fprintf(b, "<line class=\"life\" x1=\"%d\" y1=\"66\" x2=\"%d\" y2=\"%d\"/>\n", col.x, col.x, h-10)
	}
	y := headH
	for i, a := range c.arrows {
		if i > 0 && a.t-c.arrows[i-1].t >= gapBreak {
			fmt.Fprintf(b, "<text class=\"gap\" x=\"%d\" y=\"%d\" text-anchor=\"middle\">&#8942; %s pass &#8942;</text>\n",
				(leftX+rightX)/2, y+rowH/2+4, esc(fmtDur(a.t-c.arrows[i-1].t)))
			y += rowH
		}
		x1, x2 := leftX, rightX
		if !a.leftToRt {
			x1, x2 = rightX, leftX
		}
		// The label sits above its arrow, which slopes down by slant.
		y1, y2 := y+13, y+13+slant
		if a.kind == kindLost {
			// A lost packet stops halfway, with a cross where it died.
			x2 = (x1 + x2) / 2
			y2 = y1 + slant/2
		}
		fmt.Fprintf(b, "<g class=\"pkt %s\" data-detail=\"%s\">\n", a.kind, esc(a.detail))
		fmt.Fprintf(b, "<title>%s</title>\n", esc(a.detail))
		fmt.Fprintf(b, "<text class=\"time\" x=\"8\" y=\"%d\">+%s</text>\n", y1+4, esc(fmtDur(a.t)))
		if a.kind == kindLost {
			fmt.Fprintf(b, "<line class=\"arrow\" x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\"/>\n", x1, y1, x2, y2)
			fmt.Fprintf(b, "<path class=\"cross\" d=\"M%d,%d l10,10 m0,-10 l-10,10\"/>\n", x2-5, y2-5)
		} else {
			fmt.Fprintf(b, "<line class=\"arrow\" x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" marker-end=\"url(#ah%d)\"/>\n", x1, y1, x2, y2, idx)
		}
		fmt.Fprintf(b, "<text class=\"label\" x=\"%d\" y=\"%d\" text-anchor=\"middle\">%s</text>\n", (leftX+rightX)/2, y+10, esc(a.label))
		b.WriteString("</g>\n")
		y += rowH
	}
	if !nested {
		b.WriteString("</svg>\n")
	}
}

func fmtDur(d time.Duration) string {
	switch {
	case d < time.Millisecond:
		return fmt.Sprintf("%dus", d.Microseconds())
	case d < time.Second:
		return fmt.Sprintf("%.3fms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.3fs", d.Seconds())
}

const svgCSS = `
.conv { font: bold 14px sans-serif; fill: #222; }
.head { fill: #eef3fb; stroke: #5b7db1; }
.hname { font: bold 12px sans-serif; fill: #1d3557; }
.hqp { font: 11px monospace; fill: #1d3557; }
.life { stroke: #9aa9bd; stroke-width: 2; stroke-dasharray: 4 3; }
.time { font: 10px monospace; fill: #777; }
.gap { font: italic 11px sans-serif; fill: #888; }
.label { font: 11px monospace; fill: #222; paint-order: stroke; stroke: white; stroke-width: 3px; }
.arrow { stroke-width: 1.6; }
.req .arrow { stroke: #1f6feb; }
.resp .arrow { stroke: #2da44e; }
.retx .arrow { stroke: #d97706; stroke-width: 2.4; stroke-dasharray: 7 3; }
.retx .label { fill: #b45309; font-weight: bold; }
.nak .arrow { stroke: #cf222e; stroke-width: 2.4; }
.nak .label { fill: #cf222e; font-weight: bold; }
.rnr .arrow { stroke: #8250df; stroke-width: 2.4; }
.rnr .label { fill: #8250df; font-weight: bold; }
.bad .arrow { stroke: #cf222e; stroke-dasharray: 2 3; stroke-width: 2.4; }
.bad .label { fill: #cf222e; font-weight: bold; }
.cnp .arrow { stroke: #0e7490; stroke-width: 2.4; stroke-dasharray: 1 3; }
.cnp .label { fill: #0e7490; font-weight: bold; }
.lost .arrow { stroke: #999; stroke-dasharray: 3 3; }
.lost .label { fill: #888; font-style: italic; }
.cross { stroke: #cf222e; stroke-width: 2.5; fill: none; }
.pkt:hover .label, .pkt.sel .label { font-weight: bold; }
.pkt:hover .arrow, .pkt.sel .arrow { stroke-width: 3.5; }
`

const pageCSS = `
body { font: 14px sans-serif; margin: 16px; color: #222; background: #fff; }
h1 { font-size: 18px; margin: 0 0 8px; }
.legend span { display: inline-block; margin-right: 14px; font-size: 12px; }
.legend i { display: inline-block; width: 22px; height: 0; border-top: 3px solid; vertical-align: middle; margin-right: 4px; }
#detail { font: 12px monospace; background: #f6f8fa; border: 1px solid #d0d7de; padding: 6px; margin: 8px 0; min-height: 16px; white-space: pre-wrap; }
svg.ladder { display: block; margin-bottom: 12px; }
`

const legendHTML = `<div class="legend">
<span><i style="border-color:#1f6feb"></i>request</span>
<span><i style="border-color:#2da44e"></i>response / ACK</span>
<span><i style="border-color:#d97706;border-top-style:dashed"></i>retransmission</span>
<span><i style="border-color:#cf222e"></i>NAK</span>
<span><i style="border-color:#8250df"></i>RNR NAK</span>
<span><i style="border-color:#0e7490;border-top-style:dotted"></i>CNP ([CE]: marked Congestion Experienced)</span>
<span><i style="border-color:#cf222e;border-top-style:dotted"></i>ICRC bad / malformed</span>
<span><i style="border-color:#999;border-top-style:dashed"></i>lost</span>
</div>
`

// pageJS shows a packet's decoded line on hover or click, and marks the
// page as rendered (tests look for data-rendered on <body>).
const pageJS = `(function () {
  var detail = document.getElementById("detail");
  var pkts = document.querySelectorAll("g.pkt");
  var sel = null;
  pkts.forEach(function (g) {
    g.addEventListener("mouseenter", function () { detail.textContent = g.getAttribute("data-detail"); });
    g.addEventListener("click", function () {
      if (sel) { sel.classList.remove("sel"); }
      sel = g; g.classList.add("sel");
      detail.textContent = g.getAttribute("data-detail");
    });
  });
  document.body.setAttribute("data-rendered", String(pkts.length));
})();
`
