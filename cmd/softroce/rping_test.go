package main

import (
	"strings"
	"testing"
)

// TestRpingFlagErrors: a refused command line exits 22 (rping's EINVAL)
// and says what to give; -h exits 0 with the flags.
func TestRpingFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"-c"}, 22, "the client needs the server's address: -a ADDR"},
		{[]string{"-s", "-S", "10"}, 22, "Invalid size 10 (valid range is 26 to 65535)"},
		{nil, 22, "-s (server) or -c (client)"},
		{[]string{"-s", "-a", "192.0.2.77"}, 255, "-a 192.0.2.77: no local interface has this address"},
		{[]string{"-h"}, 0, "--udp-port N"},
	} {
		var code int
		stdout, stderr := runOut(t, func() { code = runRping(tc.args) })
		if code != tc.code || !strings.Contains(stdout+stderr, tc.want) {
			t.Errorf("%q: exit %d, want %d; output lacks %q:\n%s%s", tc.args, code, tc.code, tc.want, stdout, stderr)
		}
	}
}
