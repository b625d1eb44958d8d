package perf

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

const rule = "---------------------------------------------------------------------------------------"

// WriteBWHeader writes the title block and column header of a bandwidth
// report, in perftest's layout.
func WriteBWHeader(w io.Writer, title string, c *Config) error {
	_, err := fmt.Fprintf(w, "%s\n                    %s\n %s\n%s\n #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n",
		rule, title, describe(c), rule)
	return err
}

// WriteBWRow writes one result row.
func WriteBWRow(w io.Writer, r *BWResult) error {
	_, err := fmt.Fprintf(w, " %-10d %-10d       %-10.2f         %-10.2f           %.6f\n", r.Bytes, r.Iterations, r.PeakMBps, r.AvgMBps, r.MsgRateMpps)
	return err
}

// WriteLatHeader writes the title block and column header of a latency
// report, in perftest's layout.
func WriteLatHeader(w io.Writer, title string, c *Config) error {
	cc := *c
	cc.TxDepth = 0 // one operation at a time
	c = &cc
	_, err := fmt.Fprintf(w, "%s\n                    %s\n %s\n %s\n%s\n #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99%% percentile[usec]   99.9%% percentile[usec]\n",
		rule, title, describe(c), "t = post to completion of one operation at a time (a full round trip)", rule)
	return err
}

// WriteLatRow writes one result row.
func WriteLatRow(w io.Writer, r *LatResult) error {
	_, err := fmt.Fprintf(w, " %-7d %-10d     %-7.2f        %-7.2f      %-7.2f            %-7.2f        %-7.2f         %-7.2f                %-7.2f\n",
		r.Bytes, r.Iterations, r.Min, r.Max, r.Typical, r.Avg, r.Stdev, r.P99, r.P999)
	return err
}

// WriteFooter closes a report.
func WriteFooter(w io.Writer) error {
	_, err := fmt.Fprintln(w, rule)
	return err
}

func describe(c *Config) string {
	var b strings.Builder
	fmt.Fprintf(&b, "RC, %d QP(s), path MTU %d", c.QPs, c.MTU)
	if c.Duration > 0 {
		fmt.Fprintf(&b, ", %v per size", c.Duration)
	} else {
		fmt.Fprintf(&b, ", %d iterations per size", c.Iters)
	}
	if c.TxDepth > 0 {
		fmt.Fprintf(&b, ", tx depth %d", c.TxDepth)
	}
	return b.String()
}

// Title is the report title for a test: "RDMA_Write BW Test" and so on,
// after perftest's.
func Title(t Test, lat bool) string {
	name := map[Test]string{Write: "RDMA_Write", Read: "RDMA_Read", Send: "Send", Atomic: "Atomic FETCH_AND_ADD"}[t]
	if lat {
		return name + " Latency Test"
	}
	return name + " BW Test"
}

// Report is the JSON form of a run (--json).
type Report struct {
	Kind    string      `json:"kind"` // "bw" or "lat"
	Test    Test        `json:"test"`
	Backend string      `json:"backend"`
	QPs     int         `json:"qps"`
	MTU     int         `json:"mtu"`
	BW      []BWResult  `json:"bw,omitempty"`
	Lat     []LatResult `json:"lat,omitempty"`
}

// WriteJSON writes r as one indented JSON document.
func WriteJSON(w io.Writer, r *Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}
