package interop

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestDaemonRejectsAgainstRxe points the guest's rdma_cm tools at a
// softroce daemon that no host program has used, on a port nothing
// listens on. The daemon's QP1 answers from the start, as the kernel's
// ib_cm does on a host with an RNIC: rping and ucmatose report
// RDMA_CM_EVENT_REJECTED with status 8 (REJ "invalid service ID"), and
// udaddy RDMA_CM_EVENT_UNREACHABLE with status 1 (SIDR_REP "service not
// supported"), the rdma_cm event the kernel makes of that SIDR status.
// Without an answer each tool would instead wait out its CM retries
// (about 74 s for a REQ, 65 s for a SIDR_REQ) and be killed by the
// 60-second timeout with none of those lines, or report status -110.
func TestDaemonRejectsAgainstRxe(t *testing.T) {
	needVM(t)
	const port = 7479 // nobody listens on it, in any port space
	for _, tc := range []struct {
		tool, args string
		want       *regexp.Regexp
	}{
		{"rping", fmt.Sprintf("-c -C 1 -p %d -a HOST", port), regexp.MustCompile(`cma event RDMA_CM_EVENT_REJECTED, error 8\b`)},
		{"ucmatose", fmt.Sprintf("-p %d -s HOST", port), regexp.MustCompile(`RDMA_CM_EVENT_REJECTED, error: 8\b`)},
		// udaddy's port is fixed (7174); -p is its port space.
		{"udaddy", "-s HOST", regexp.MustCompile(`udaddy: event: RDMA_CM_EVENT_UNREACHABLE, error: 1\b`)},
	} {
		t.Run(tc.tool, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			s, _ := abiServe(t, "")
			args := strings.ReplaceAll(tc.args, "HOST", vm.HostAddr().String())
			start := time.Now()
			out, err := vm.Run(ctx, fmt.Sprintf("timeout 60 %s %s 2>&1; echo exit=$?", tc.tool, args))
			took := time.Since(start)
			if err != nil {
				t.Fatalf("guest %s %s: %v\n%s", tc.tool, args, err, out)
			}
			if !tc.want.MatchString(out) {
				t.Fatalf("guest %s %s (%v): want %q:\n%s", tc.tool, args, took.Round(time.Millisecond), tc.want, out)
			}
			if strings.Contains(out, "exit=124") || strings.Contains(out, "error: -110") || strings.Contains(out, "error -110") {
				t.Fatalf("guest %s timed out rather than being refused:\n%s", tc.tool, out)
			}
			if st := s.Stats(); st.Accepted != 0 {
				t.Errorf("a host program used the daemon: %+v", st)
			}
			t.Logf("guest %s refused in %v: %s", tc.tool, took.Round(time.Millisecond), lastLines(out, 3))
		})
	}
}
