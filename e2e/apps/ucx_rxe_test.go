package apps

import (
	"strings"
	"sync"
	"testing"
	"time"
)

// ucx_info -d in the guest lists rxe0 with UCX's two verbs transports, as
// softroce's device is listed through softroce run beside it.
func TestUCXInfoAgainstRxe(t *testing.T) {
	Need(t, "ucx-utils", "ucx_info")
	r := NewRxePeer(t)
	out, err := r.GuestRun(t, 2*time.Minute, "ucx_info -d")
	if err != nil {
		t.Fatalf("guest ucx_info -d: %v\n%s", err, out)
	}
	ucxInfoCheck(t, out, "rxe0")
	out, err = r.Soft.Run(t, time.Minute, nil, "ucx_info", "-d")
	if err != nil {
		t.Fatalf("ucx_info -d: %v\n%s", err, out)
	}
	ucxInfoCheck(t, out, "softroce0")
}

// renameGuestDevice renames rxe's device for the test (the kernel's
// RDMA_NLDEV_CMD_SET through iproute2's rdma), and back at its end.
func (r *RxePeer) renameGuestDevice(t *testing.T, from, to string) {
	t.Helper()
	if out, err := r.GuestRun(t, time.Minute, "rdma dev set "+from+" name "+to); err != nil {
		t.Fatalf("rename %s to %s: %v\n%s", from, to, err, out)
	}
	t.Cleanup(func() {
		if out, err := r.GuestRun(t, time.Minute, "rdma dev set "+to+" name "+from); err != nil {
			t.Errorf("rename %s back to %s: %v\n%s", to, from, err, out)
		}
	})
}

// ucxUDTimeout is how UCX 1.13's ud_verbs ends against rxe: its
// endpoints hear nothing from the peer (see TestUCXPerftestAgainstRxe).
const ucxUDTimeout = "unhandled timeout error"

// ucx_perftest between softroce and kernel rxe, both roles, UCX_TLS set
// and nothing else. UCT over rc_verbs runs: put_bw and am_bw. Everything
// that needs ud_verbs to receive on the rxe end does not: UCX's ud_verbs
// (UCX_UD_VERBS_ETH_DGID_CHECK, on by default) drops each datagram whose
// destination in the GRH is none of its GIDs, and reads where that
// destination is from wc.sl, where mlx5 (and softroce) report the RoCE
// packet type; rxe reports 0, so UCX takes an IPv4 packet's header for a
// GRH, finds no GID of its own there and drops the datagram. UD endpoints
// then time out on both ends ("UD endpoint ...: unhandled timeout error"):
// UCT am_bw over ud_verbs, and every UCP test, which wires its endpoints
// up over ud_verbs under either transport selection before its first
// message (with rc_verbs and self alone UCP has no wire-up transport).
// The test runs one of each under the UD timeout (30 s), at once.
//
// ucx_perftest's server takes the device name from its client, so UCT
// needs one name on both ends: the guest's rxe0 is renamed softroce0 for
// the test.
func TestUCXPerftestAgainstRxe(t *testing.T) {
	Need(t, "ucx-utils", "ucx_perftest")
	r := NewRxePeer(t)
	r.renameGuestDevice(t, "rxe0", "softroce0")
	fails := []ucxCase{
		ucxUCT[2],
		{test: "tag_lat", tls: "rc_verbs,ud_verbs,self", size: 8, iters: 100},
		{test: "ucp_put_bw", tls: "ud_verbs", size: 65536, iters: 100},
	}
	for _, ro := range r.roles() {
		t.Run(ro.name, func(t *testing.T) {
			for _, c := range ucxUCT[:2] {
				co, so, cerr, serr := ucxPerfRun(t, ro, c, "softroce0", 2*time.Minute)
				ucxPerfCheck(t, ro, c, co, so, cerr, serr)
			}
			runs := make([]*ucxRun, len(fails))
			for i, c := range fails {
				runs[i] = ucxPerfStart(t, ro, c, "softroce0")
			}
			type result struct {
				co, so     string
				cerr, serr error
			}
			res := make([]result, len(runs))
			var wg sync.WaitGroup
			for i, u := range runs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var x result
					x.co, x.so, x.cerr, x.serr = u.wait(2 * time.Minute)
					res[i] = x
				}()
			}
			wg.Wait()
			for i, x := range res {
				c := fails[i]
				if x.cerr == nil || strings.Contains(x.co, "Final:") || !strings.Contains(x.co+x.so, ucxUDTimeout) {
					t.Errorf("ucx_perftest %v (%s): client %v; want it to fail with %q:\nclient:\n%s\nserver:\n%s", c, ro.name, x.cerr, ucxUDTimeout, x.co, x.so)
					continue
				}
				t.Logf("ucx_perftest %v (%s): fails as expected: %s", c, ro.name, firstLine(x.co+x.so, ucxUDTimeout))
			}
		})
	}
}

// firstLine is the first line of out that contains s.
func firstLine(out, s string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, s) {
			return strings.TrimSpace(l)
		}
	}
	return ""
}
