// Package golden reads the decoder known-answer files recorded beside the
// rxe captures (icrc/testdata/rxe/*.tshark): tshark's fields for every
// frame, so the decoders are checked on a clone that has no tshark.
package golden

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strings"
)

// Read returns the field names and the rows of a golden file: comment
// lines (the first names tshark's version; "# fields: a|b|..." names the
// columns), then one '|'-separated row per frame. Every row must have one
// column per field, the first being frame.number.
func Read(path string) (fields []string, rows [][]string, err error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("golden fields missing from the repository: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := sc.Text()
		if f, ok := strings.CutPrefix(line, "# fields: "); ok {
			fields = strings.Split(f, "|")
		} else if line != "" && !strings.HasPrefix(line, "#") {
			rows = append(rows, strings.Split(line, "|"))
		}
	}
	if len(fields) < 2 || fields[0] != "frame.number" || len(rows) == 0 {
		return nil, nil, fmt.Errorf("%s: malformed golden file (no fields line, or no rows)", path)
	}
	for i, r := range rows {
		if len(r) != len(fields) {
			return nil, nil, fmt.Errorf("%s row %d: %d columns, want %d", path, i+1, len(r), len(fields))
		}
	}
	return fields, rows, nil
}
