package serve

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// Two unmodified ibv_ud_pingpong, ibv_uc_pingpong and ibv_srq_pingpong
// processes on one daemon, polling and on completion channels (-e): UD
// QPs with address handles and the GRH at the head of each receive, UC
// QPs, and 16 RC QPs sharing one SRQ per side.
func TestIbvUDUCSRQPingpong(t *testing.T) {
	for _, c := range []struct {
		tool  string
		size  int
		extra []string
	}{
		{"ibv_ud_pingpong", 1024, nil},
		{"ibv_ud_pingpong", 2048, []string{"-e"}},
		{"ibv_uc_pingpong", 4096, nil},
		{"ibv_uc_pingpong", 4096, []string{"-e"}},
		{"ibv_srq_pingpong", 4096, nil},
		{"ibv_srq_pingpong", 4096, []string{"-e", "-q", "4"}},
	} {
		t.Run(fmt.Sprintf("%s/%d%s", c.tool, c.size, strings.Join(c.extra, "")), func(t *testing.T) {
			p, lib := tool(t, c.tool)
			s := startUDP(t)
			const iters = 500
			srv, cli := runPair(t, s, lib, p, iters, append([]string{"-s", fmt.Sprint(c.size)}, c.extra...)...)
			cli.wait(t, c.tool+" client")
			srv.wait(t, c.tool+" server")
			want := fmt.Sprintf("%d bytes in", 2*iters*c.size)
			for _, pp := range []*pingpong{srv, cli} {
				o := pp.output()
				if !strings.Contains(o, want) || !strings.Contains(o, fmt.Sprintf("%d iters in", iters)) {
					t.Errorf("no %q line:\n%s", want, o)
				}
				t.Logf("%s", lastLines(o, 2))
			}
			for s.Stats().Clients != 0 {
				time.Sleep(time.Millisecond)
			}
			if n := s.QPs(); n != 0 {
				t.Errorf("%d QPs left after both programs exited", n)
			}
			if st := s.Stats(); st.BadWQEs != 0 || st.BadRequests != 0 {
				t.Errorf("daemon refused something: %+v", st)
			}
		})
	}
}

// SRQ (limit event through ibv_get_async_event, no ibv_post_recv on a QP
// on it, no destroy under a QP) and UD (the GRH at the head of the
// receive, src_qp, ibv_create_ah_from_wc) from a C program.
func TestCProgramUDSRQ(t *testing.T) { runC(t, "udsrq.c") }
