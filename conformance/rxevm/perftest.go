package rxevm

import (
	"fmt"
	"strconv"
	"strings"
)

// BWResult is one result row of a perftest bandwidth tool (ib_write_bw,
// ib_read_bw, ib_send_bw, ib_atomic_bw).
type BWResult struct {
	Bytes      int     // message size
	Iterations int     // iterations
	PeakBW     float64 // in Unit
	AvgBW      float64 // in Unit
	MsgRate    float64 // million messages per second
	Unit       string  // "MB/sec" (MiB/s, perftest's default) or "Gb/sec" (--report_gbits)
}

// ParseBW extracts the result rows from a perftest bandwidth tool's output:
// the lines after the " #bytes #iterations BW peak[...] BW average[...]
// MsgRate[Mpps]" header (perftest 4.5 format).
func ParseBW(out string) ([]BWResult, error) {
	lines := strings.Split(out, "\n")
	var res []BWResult
	unit := ""
	for _, line := range lines {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if f[0] == "#bytes" {
			if i := strings.Index(line, "BW average["); i >= 0 {
				rest := line[i+len("BW average["):]
				if j := strings.IndexByte(rest, ']'); j >= 0 {
					unit = rest[:j]
				}
			}
			continue
		}
		if unit == "" || len(f) < 5 {
			continue
		}
		var r BWResult
		var err error
		if r.Bytes, err = strconv.Atoi(f[0]); err != nil {
			continue
		}
		if r.Iterations, err = strconv.Atoi(f[1]); err != nil {
			continue
		}
		if r.PeakBW, err = strconv.ParseFloat(f[2], 64); err != nil {
			return nil, fmt.Errorf("parse perftest row %q: peak: %w", line, err)
		}
		if r.AvgBW, err = strconv.ParseFloat(f[3], 64); err != nil {
			return nil, fmt.Errorf("parse perftest row %q: average: %w", line, err)
		}
		if r.MsgRate, err = strconv.ParseFloat(f[4], 64); err != nil {
			return nil, fmt.Errorf("parse perftest row %q: message rate: %w", line, err)
		}
		r.Unit = unit
		res = append(res, r)
	}
	if len(res) == 0 {
		return nil, fmt.Errorf("parse perftest output: no result rows")
	}
	return res, nil
}
