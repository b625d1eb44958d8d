package inspect

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// Total adds up the summaries of several captures: their counts, not
// their connections (a connection belongs to one capture).
type Total struct {
	Files           int            `json:"files"`
	Frames          int            `json:"frames"`
	RoCE            int            `json:"roce"`
	NonRoCE         int            `json:"non_roce"`
	Bytes           int            `json:"roce_bytes"`
	ICRCOK          int            `json:"icrc_ok"`
	ICRCBad         int            `json:"icrc_bad"`
	ICRCTruncated   int            `json:"icrc_truncated"`
	Malformed       int            `json:"malformed"`
	CNPs            int            `json:"cnps"`
	NAKs            map[string]int `json:"naks,omitempty"`
	RNRNAKs         int            `json:"rnr_naks"`
	Opcodes         map[string]int `json:"opcodes"`
	Connections     int            `json:"connections"`
	PSNGaps         int            `json:"psn_gaps"`
	MissingPSNs     int            `json:"missing_psns"`
	Retransmissions int            `json:"retransmissions"`
	// Filter and Matched are set when a filter selected the packets
	// listed: how many RoCE packets it matched.
	Filter  string `json:"filter,omitempty"`
	Matched *int   `json:"matched,omitempty"`
}

// Add adds one capture's summary.
func (t *Total) Add(s *Summary) {
	t.Files++
	t.Frames += s.Frames
	t.RoCE += s.RoCE
	t.NonRoCE += s.NonRoCE
	t.Bytes += s.Bytes
	t.ICRCOK += s.ICRCOK
	t.ICRCBad += s.ICRCBad
	t.ICRCTruncated += s.ICRCTruncated
	t.Malformed += s.Malformed
	t.CNPs += s.CNPs
	t.RNRNAKs += s.RNRNAKs
	t.NAKs = addCounts(t.NAKs, s.NAKs)
	t.Opcodes = addCounts(t.Opcodes, s.Opcodes)
	if t.Opcodes == nil {
		t.Opcodes = map[string]int{}
	}
	t.Connections += len(s.Connections)
	for _, c := range s.Connections {
		for _, f := range []*Flow{c.AtoB, c.BtoA} {
			if f != nil {
				t.PSNGaps += f.PSNGaps
				t.MissingPSNs += f.MissingPSNs
				t.Retransmissions += f.Retransmissions
			}
		}
	}
	if s.Matched != nil {
		if t.Matched == nil {
			t.Matched = new(int)
		}
		*t.Matched += *s.Matched
		t.Filter = s.Filter
	}
}

func addCounts(dst, src map[string]int) map[string]int {
	for k, v := range src {
		if dst == nil {
			dst = map[string]int{}
		}
		dst[k] += v
	}
	return dst
}

// MatchedLine is the summary line of a filter: "filter EXPR: matched N
// of M RoCE packets".
func MatchedLine(filter string, matched, roce int) string {
	return fmt.Sprintf("filter %s: matched %d of %s", filter, matched, Plural(roce, "RoCE packet"))
}

// WriteTotal writes the total for people.
func WriteTotal(w io.Writer, t *Total) error {
	var b strings.Builder
	fmt.Fprintf(&b, "\n== total over %s: %s, %d RoCE (%d bytes), %d other\n", Plural(t.Files, "file"), Plural(t.Frames, "frame"), t.RoCE, t.Bytes, t.NonRoCE)
	fmt.Fprintf(&b, "   ICRC: %d ok, %d bad, %d truncated; %d malformed; %d CNPs; %d RNR NAKs; NAKs: %s\n",
		t.ICRCOK, t.ICRCBad, t.ICRCTruncated, t.Malformed, t.CNPs, t.RNRNAKs, counts(t.NAKs))
	fmt.Fprintf(&b, "   %s; gaps %d (%s missing); retransmissions %d\n", Plural(t.Connections, "connection"), t.PSNGaps, Plural(t.MissingPSNs, "PSN"), t.Retransmissions)
	fmt.Fprintf(&b, "   opcodes: %s\n", counts(t.Opcodes))
	if t.Matched != nil {
		fmt.Fprintf(&b, "   %s\n", MatchedLine(t.Filter, *t.Matched, t.RoCE))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteJSONTotal writes {"total": t} as one JSON line.
func WriteJSONTotal(w io.Writer, t *Total) error {
	b, err := json.Marshal(struct {
		Total *Total `json:"total"`
	}{t})
	if err != nil {
		return fmt.Errorf("encode total: %w", err)
	}
	b = append(b, '\n')
	_, err = w.Write(b)
	return err
}
