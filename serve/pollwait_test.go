package serve

import (
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestPollerSleepsInNetworkPoller checks that an idle device poller parks
// in Go's network poller ("IO wait") rather than in a blocking system
// call, which would hold a P (see device.pollable), and that its backstop
// still ends such a sleep.
func TestPollerSleepsInNetworkPoller(t *testing.T) {
	s := startPipe(t)
	if s.devs[0].eprc == nil {
		t.Fatal("the doorbell epoll set is not in the network poller")
	}
	parked, last := false, ""
	for i := 0; i < 500 && (!parked || s.Stats().Backstops == 0); i++ {
		if !parked {
			buf := make([]byte, 1<<20)
			for g := range strings.SplitSeq(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
				if strings.Contains(g, "serve.(*device).wait(") {
					last = g
					head, _, _ := strings.Cut(g, "\n")
					parked = parked || strings.Contains(head, "[IO wait")
				}
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !parked {
		t.Fatalf("the idle poller is not parked in the network poller; last seen:\n%s", last)
	}
	if s.Stats().Backstops == 0 {
		t.Fatal("no sleep of the poller ended on its backstop")
	}
}
