package apps

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/softroce/softroce/conformance/rxevm"
)

// TestRxeToRxeControl runs, between two kernel rxe guests and no softroce
// at all, the application runs that fail between softroce and rxe and
// that docs/apps.md puts down to rxe:
//
//   - UCX's ud_verbs (UCP tag_lat under UCX_TLS=ud_verbs, UCT am_bw over
//     ud_verbs): rxe leaves wc.sl 0 for UD receives, and UCX 1.13's
//     UCX_UD_VERBS_ETH_DGID_CHECK then reads an IPv4 packet's header as a
//     GRH and drops the datagram; both ends hit UCX's UD timeout.
//   - fi_pingpong -p 'verbs;ofi_rxm' -e rdm: rxm asks for a CQ larger
//     than rxe's max_cqe (32767), and fi_enable fails with EINVAL.
//
// If rxe is to blame they fail rxe to rxe as they do against softroce,
// and they do: the test asserts those failures. Two runs show the guests
// themselves work: fi_pingpong over MSG endpoints and UCT put_bw over
// rc_verbs. Two more show the causes: tag_lat over ud_verbs runs with
// UCX_UD_VERBS_ETH_DGID_CHECK=n, and ofi_rxm with FI_UNIVERSE_SIZE=64,
// which makes rxm's CQ smaller. (Interposing ibv_create_cq on rxe shows
// the CQ's size: 65536 entries at libfabric's default universe size of
// 256, 16384 at 64.)
func TestRxeToRxeControl(t *testing.T) {
	if os.Getenv("SOFTROCE_RXE") != "1" {
		t.Skip("no rdma_rxe guests: set SOFTROCE_RXE=1 and run as root (.ci/run does)")
	}
	Need(t, "ucx-utils", "ucx_perftest")
	Need(t, "libfabric-bin", "fi_pingpong")
	wall := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	img, err := rxevm.Build(ctx, rxevm.Config{Log: os.Stderr})
	if err != nil {
		t.Fatalf("build the rxe guest: %v", err)
	}
	pair, err := rxevm.BootPair(ctx, img, rxevm.Options{HostPrograms: true, MemoryMB: 1024, Log: os.Stderr})
	if err != nil {
		t.Fatalf("boot two rxe guests: %v", err)
	}
	t.Cleanup(func() { pair.Close() })
	t.Logf("two rxe guests up after %v", time.Since(wall).Round(time.Second))

	a, b := (&RxePeer{VM: pair.A}).guestEnd(), (&RxePeer{VM: pair.B}).guestEnd()
	a.name, b.name = "rxe A", "rxe B"
	var mu sync.Mutex
	next := 18515
	port := func(testing.TB) int {
		mu.Lock()
		defer mu.Unlock()
		next++
		return next
	}
	ab := role{name: "A serves B", server: a, client: b, port: port}
	ba := role{name: "B serves A", server: b, client: a, port: port}

	// The guests work: RC through rdma_cm (libfabric) and through UCX.
	msg := fiCase{"msg", "verbs", "msg", []int{64}}
	co, so, cerr, serr := fiPingpong(t, ab, msg, 64, 10)
	fiPingpongCheck(t, ab, msg, 64, 10, co, so, cerr, serr)
	put := ucxCase{test: "put_bw", tls: "rc_verbs,ud_verbs,self", tl: "rc_verbs", layout: "zcopy", size: 65536, iters: 50}
	co, so, cerr, serr = ucxPerfRun(t, ab, put, "rxe0", 2*time.Minute)
	ucxPerfCheck(t, ab, put, co, so, cerr, serr)
	t.Logf("positive controls done after %v", time.Since(wall).Round(time.Second))

	// ud_verbs, both ways at once, under UCX's UD timeout (30 s); and
	// with the GRH check off.
	type udRun struct {
		ro    role
		c     ucxCase
		works bool // UCX_UD_VERBS_ETH_DGID_CHECK=n
	}
	tagLat := ucxCase{test: "tag_lat", tls: "ud_verbs", size: 8, iters: 100}
	amBw := ucxCase{test: "am_bw", tls: "ud_verbs", tl: "ud_verbs", layout: "bcopy", size: 512, iters: 200}
	uds := []udRun{{ab, tagLat, false}, {ba, tagLat, false}, {ab, amBw, false}, {ba, amBw, false}, {ab, tagLat, true}}
	runs := make([]*ucxRun, len(uds))
	for i, u := range uds {
		ro := u.ro
		if u.works {
			ro.server, ro.client = withEnv(ro.server, "UCX_UD_VERBS_ETH_DGID_CHECK=n"), withEnv(ro.client, "UCX_UD_VERBS_ETH_DGID_CHECK=n")
		}
		runs[i] = ucxPerfStart(t, ro, u.c, "rxe0")
	}
	type result struct {
		co, so     string
		cerr, serr error
	}
	res := make([]result, len(runs))
	var wg sync.WaitGroup
	for i, r := range runs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var x result
			x.co, x.so, x.cerr, x.serr = r.wait(90 * time.Second)
			res[i] = x
		}()
	}
	wg.Wait()
	for i, x := range res {
		u := uds[i]
		if u.works {
			t.Logf("UCX_UD_VERBS_ETH_DGID_CHECK=n:")
			ucxPerfCheck(t, u.ro, u.c, x.co, x.so, x.cerr, x.serr)
			continue
		}
		cl, sl := firstLine(x.co, ucxUDTimeout), firstLine(x.so, ucxUDTimeout)
		if x.cerr == nil || strings.Contains(x.co, "Final:") || cl == "" {
			t.Errorf("ucx_perftest %v (%s): client %v, server %v; want %q as against softroce:\nclient:\n%s\nserver:\n%s",
				u.c, u.ro.name, x.cerr, x.serr, ucxUDTimeout, x.co, x.so)
			continue
		}
		t.Logf("ucx_perftest %v (%s): fails as against softroce: client %v: %q; server %v: %q", u.c, u.ro.name, x.cerr, cl, x.serr, sl)
	}
	t.Logf("ud_verbs runs done after %v", time.Since(wall).Round(time.Second))

	// ofi_rxm: the server's fi_enable fails (its CQ has more entries than
	// rxe's max_cqe) and the client, waiting for it, finds the
	// control connection closed. libfabric's warnings say which call
	// failed. With FI_UNIVERSE_SIZE=64 the CQ is smaller and the same run
	// completes.
	out, err := pair.A.Run(ctx, "ibv_devinfo -v -d rxe0 | grep -w max_cqe")
	if err != nil || !strings.Contains(out, "32767") {
		t.Errorf("rxe0's max_cqe: %v, %q; want 32767", err, out)
	}
	t.Logf("rxe0: %s", strings.TrimSpace(out))
	const (
		refusal = "fi_enable(): util/pingpong.c:1551, ret=-22 (Invalid argument)"
		noCQ    = "Unable to create verbs CQ"
		closed  = "ctrl/read: no data or remote connection closed"
	)
	rxm := fiCase{"rdm-rxm", "verbs;ofi_rxm", "rdm", []int{64}}
	for _, ro := range []role{ab, ba} {
		ro.server, ro.client = withEnv(ro.server, "FI_LOG_LEVEL=warn"), withEnv(ro.client, "FI_LOG_LEVEL=warn")
		co, so, cerr, serr := fiPingpong(t, ro, rxm, 64, 10)
		cRows, _ := parsePingpong(co)
		sRows, _ := parsePingpong(so)
		if cerr == nil || serr == nil || len(cRows) > 0 || len(sRows) > 0 ||
			!strings.Contains(so, refusal) || !strings.Contains(so, noCQ) || !strings.Contains(co, closed) {
			t.Errorf("fi_pingpong -p '%s' -e %s (%s): client %v, server %v; want the server to fail with %q and %q, the client with %q:\nclient:\n%s\nserver:\n%s",
				rxm.prov, rxm.ep, ro.name, cerr, serr, noCQ, refusal, closed, co, so)
			continue
		}
		t.Logf("fi_pingpong -p '%s' -e %s (%s): fails as against softroce: server %v: %q, %q; client %v: %q",
			rxm.prov, rxm.ep, ro.name, serr, firstLine(so, noCQ), firstLine(so, refusal), cerr, firstLine(co, closed))
	}
	small := ab
	small.server, small.client = withEnv(ab.server, "FI_UNIVERSE_SIZE=64"), withEnv(ab.client, "FI_UNIVERSE_SIZE=64")
	t.Logf("FI_UNIVERSE_SIZE=64:")
	co, so, cerr, serr = fiPingpong(t, small, rxm, 64, 10)
	fiPingpongCheck(t, small, rxm, 64, 10, co, so, cerr, serr)
	t.Logf("done after %v", time.Since(wall).Round(time.Second))
}

// withEnv is e with env added to every program it starts.
func withEnv(e end, env ...string) end {
	start := e.start
	e.start = func(t *testing.T, more []string, argv ...string) endProc {
		return start(t, append(append([]string(nil), env...), more...), argv...)
	}
	return e
}
