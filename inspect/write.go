package inspect

import (
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"sort"
	"strings"
	"time"
)

// Line renders a RoCE record as one line: frame, time, addresses,
// transport, opcode, destination QP, PSN, key header fields, payload length
// and the ICRC verdict.
func Line(r *Record) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%5d %s ", r.Frame, r.Time.UTC().Format("15:04:05.000000"))
	if !r.Located() { // a malformed or cut header
		if r.Malformed != "" {
			fmt.Fprintf(&b, "%s MALFORMED: %s", r.Transport, r.Malformed)
		} else {
			fmt.Fprintf(&b, "%s (headers not captured) icrc %s", r.Transport, r.ICRC)
		}
		return b.String()
	}
	b.WriteString(endpoint(r.Src, r.SrcPort))
	b.WriteString(" > ")
	b.WriteString(endpoint(r.Dst, r.DstPort))
	for _, v := range r.VLAN {
		fmt.Fprintf(&b, " vlan %d", v)
	}
	if r.OpcodeName == "" {
		fmt.Fprintf(&b, " %s (BTH not captured) len %d icrc %s", r.Transport, r.PayloadLen, r.ICRC)
		return b.String()
	}
	fmt.Fprintf(&b, " %s %s qp 0x%06x psn %d", r.Transport, r.OpcodeName, r.DestQP, r.PSN)
	if r.AckReq {
		b.WriteString(" A")
	}
	if r.SE {
		b.WriteString(" SE")
	}
	if r.FECN {
		b.WriteString(" FECN")
	}
	if r.BECN {
		b.WriteString(" BECN")
	}
	if r.PKey != 0xffff {
		fmt.Fprintf(&b, " pkey 0x%04x", r.PKey)
	}
	writeKeys(&b, r)
	if r.CM != nil {
		b.WriteString(" ")
		b.WriteString(r.CM.Text())
	}
	fmt.Fprintf(&b, " len %d", r.PayloadLen)
	switch r.ICRC {
	case "ok":
		b.WriteString(" icrc ok")
	case "bad":
		fmt.Fprintf(&b, " icrc BAD (wire 0x%08x, computed 0x%08x)", r.ICRCWire, r.ICRCComputed)
	default:
		b.WriteString(" icrc truncated")
	}
	if r.Malformed != "" {
		fmt.Fprintf(&b, " MALFORMED: %s", r.Malformed)
	}
	return b.String()
}

func endpoint(a netip.Addr, port uint16) string {
	if port == 0 {
		return a.String()
	}
	return netip.AddrPortFrom(a, port).String()
}

func writeKeys(b *strings.Builder, r *Record) {
	if h := r.RDETH; h != nil {
		fmt.Fprintf(b, " eec 0x%06x", h.EEContext)
	}
	if h := r.DETH; h != nil {
		fmt.Fprintf(b, " qkey 0x%08x srcqp 0x%06x", h.QKey, h.SrcQP)
	}
	if h := r.XRCETH; h != nil {
		fmt.Fprintf(b, " xrcsrq 0x%06x", h.XRCSRQ)
	}
	if h := r.FETH; h != nil {
		fmt.Fprintf(b, " placement %d selectivity %d", h.Placement, h.Selectivity)
	}
	if h := r.RETH; h != nil {
		fmt.Fprintf(b, " va 0x%x rkey 0x%08x dmalen %d", h.VA, h.RKey, h.DMALen)
	}
	if h := r.AtomicETH; h != nil {
		// The AtomicETH's second field is the swap data of a compare and
		// swap, the add data of a fetch and add (which ignores the compare
		// data).
		if strings.HasSuffix(r.OpcodeName, "FETCH_ADD") {
			fmt.Fprintf(b, " va 0x%x rkey 0x%08x add 0x%x", h.VA, h.RKey, h.SwapAdd)
		} else {
			fmt.Fprintf(b, " va 0x%x rkey 0x%08x compare 0x%x swap 0x%x", h.VA, h.RKey, h.Compare, h.SwapAdd)
		}
	}
	if h := r.AETH; h != nil {
		switch h.Kind {
		case "ACK":
			if *h.Credits < 0 {
				b.WriteString(" ACK")
			} else {
				fmt.Fprintf(b, " ACK credits %d", *h.Credits)
			}
		case "RNR_NAK":
			fmt.Fprintf(b, " RNR NAK timer %d (%v)", *h.RNRTimer, time.Duration(*h.RNRTimerUS)*time.Microsecond)
		case "NAK":
			fmt.Fprintf(b, " NAK %s", h.NAKName)
		default:
			fmt.Fprintf(b, " AETH reserved syndrome 0x%02x", h.Syndrome)
		}
		fmt.Fprintf(b, " msn %d", h.MSN)
	}
	if h := r.AtomicAck; h != nil {
		fmt.Fprintf(b, " orig 0x%x", h.Orig)
	}
	if r.Imm != nil {
		fmt.Fprintf(b, " ImmDt 0x%08x", *r.Imm)
	}
	if h := r.IETH; h != nil {
		fmt.Fprintf(b, " inv rkey 0x%08x", h.RKey)
	}
}

// WriteText writes a RoCE record as one line and, when verbose, its field
// tree indented below it. Non-RoCE records are skipped.
func WriteText(w io.Writer, r *Record, verbose bool) error {
	if !r.RoCE {
		return nil
	}
	if _, err := fmt.Fprintln(w, Line(r)); err != nil {
		return err
	}
	if !verbose {
		return nil
	}
	for _, f := range Fields(r) {
		if _, err := fmt.Fprintf(w, "      %s\n", f); err != nil {
			return err
		}
	}
	return nil
}

// WriteJSON writes a RoCE record as one JSON line. Non-RoCE records are
// skipped: they are counted in the summary.
func WriteJSON(w io.Writer, r *Record) error {
	if !r.RoCE {
		return nil
	}
	b, err := AppendJSON(make([]byte, 0, 512), r)
	if err != nil {
		return err
	}
	b = append(b, '\n')
	_, err = w.Write(b)
	return err
}

// WriteJSONSummary writes {"summary": s} as one JSON line.
func WriteJSONSummary(w io.Writer, s *Summary) error {
	b, err := json.Marshal(struct {
		Summary *Summary `json:"summary"`
	}{s})
	if err != nil {
		return fmt.Errorf("encode summary: %w", err)
	}
	b = append(b, '\n')
	_, err = w.Write(b)
	return err
}

// Plural is "1 packet", "2 packets": n and the noun, in the plural unless
// n is 1.
func Plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// WriteSummary writes the summary for people.
func WriteSummary(w io.Writer, s *Summary) error {
	var b strings.Builder
	name := s.File
	if name == "" {
		name = "capture"
	}
	fmt.Fprintf(&b, "\n== %s: %s, %d RoCE (%d bytes), %d other\n", name, Plural(s.Frames, "frame"), s.RoCE, s.Bytes, s.NonRoCE)
	fmt.Fprintf(&b, "   ICRC: %d ok, %d bad, %d truncated; %d malformed; %d CNPs; %d RNR NAKs; NAKs: %s\n",
		s.ICRCOK, s.ICRCBad, s.ICRCTruncated, s.Malformed, s.CNPs, s.RNRNAKs, counts(s.NAKs))
	if s.CEMarked > 0 {
		fmt.Fprintf(&b, "   congestion experienced (IP ECN 11): %s\n", Plural(s.CEMarked, "packet"))
	}
	fmt.Fprintf(&b, "   opcodes: %s\n", counts(s.Opcodes))
	if len(s.CM) > 0 {
		fmt.Fprintf(&b, "   CM MADs: %s\n", counts(s.CM))
	}
	for _, h := range s.Hints {
		fmt.Fprintf(&b, "   hint: %s\n", h)
	}
	if s.Matched != nil {
		fmt.Fprintf(&b, "   %s\n", MatchedLine(s.Filter, *s.Matched, s.RoCE))
	}
	writeCMConns(&b, s)
	for i, c := range s.Connections {
		qpa := "?"
		if c.QPA != nil {
			qpa = fmt.Sprintf("0x%06x", *c.QPA)
		}
		cm := ""
		if c.QPB == 1 && c.QPA != nil && *c.QPA == 1 {
			cm = ": connection management (QP1)"
		}
		fmt.Fprintf(&b, "   connection %d (%s): %s qp %s <-> %s qp 0x%06x%s\n", i+1, c.Transport, c.A, qpa, c.B, c.QPB, cm)
		writeFlow(&b, "A->B", c.AtoB)
		if c.BtoA != nil {
			writeFlow(&b, "B->A", c.BtoA)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func writeFlow(b *strings.Builder, dir string, f *Flow) {
	fmt.Fprintf(b, "     %s %s > %s qp 0x%06x: %s, %d bytes (%d payload); gaps %d (%s missing); retransmissions %d\n",
		dir, f.Src, f.Dst, f.DestQP, Plural(f.Packets, "packet"), f.Bytes, f.Payload, f.PSNGaps, Plural(f.MissingPSNs, "PSN"), f.Retransmissions)
	for _, p := range []struct {
		name string
		r    *PSNRange
	}{{"requests", f.Requests}, {"responses", f.Responses}, {"other", f.Other}} {
		if p.r != nil {
			fmt.Fprintf(b, "          %s: %d, psn %d..%d (first %d, last %d)\n", p.name, p.r.Packets, p.r.Min, p.r.Max, p.r.First, p.r.Last)
		}
	}
	fmt.Fprintf(b, "          acks %d, NAKs %s, RNR NAKs %d, CNPs %d, ECN-marked %d, ICRC bad %d, truncated %d, malformed %d\n",
		f.ACKs, counts(f.NAKs), f.RNRNAKs, f.CNPs, f.ECNMarked, f.ICRCBad, f.ICRCTruncated, f.Malformed)
	if f.CEMarked > 0 {
		fmt.Fprintf(b, "          congestion experienced (IP ECN 11): %s\n", Plural(f.CEMarked, "packet"))
	}
	fmt.Fprintf(b, "          opcodes: %s\n", counts(f.Opcodes))
}

// counts renders a count map sorted by name: "RC ACKNOWLEDGE=3 RC SEND_ONLY=2".
func counts(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, m[k])
	}
	return strings.Join(parts, ", ")
}
