package main

import (
	"strings"
	"testing"
)

// TestPerftestCommandBadCombinations: perftest's own refusals. (-R and
// -c UD themselves run in tools/perftest's loopback tests, on an
// in-memory link: both reach their peer on UDP port 4791 only, which two
// commands on one host cannot share.)
func TestPerftestCommandBadCombinations(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"write", "-c", "UD"}, "UD connection only possible in SEND verb"},
		{[]string{"read", "-c", "UD"}, "UD connection only possible in SEND verb"},
		{[]string{"write", "-c", "UC", "-R"}, "UC is not supported in librdmacm"},
		{[]string{"send", "-c", "XRC"}, "RC, UC and UD"},
		{[]string{"atomic", "-a"}, "Message size cannot be changed for Atomic tests"},
		{[]string{"write", "-a", "-D", "2"}, "Duration mode currently doesn't support running on all sizes."},
		{[]string{"send", "-D", "-1"}, "-D must be a positive number of seconds"},
	} {
		var code int
		out := perftestCapture(t, func() { code = runPerftest(tc.args) })
		if code != 2 || !strings.Contains(out, tc.want) {
			t.Errorf("%v: exit %d\n%s", tc.args, code, out)
		}
	}
}
