package apps

import (
	"strings"
	"testing"
	"time"
)

// fi_info -p verbs in the guest lists rxe0 as softroce's device is listed
// (TestFiInfo), on the fabric named after rxe's GID 0, the interface's
// IPv6 link-local address; through softroce beside it, softroce0, on the
// same fabric: its GID 0 is its interface's link-local address too.
func TestFiInfoAgainstRxe(t *testing.T) {
	Need(t, "libfabric-bin", "fi_info")
	r := NewRxePeer(t)
	out, err := r.GuestRun(t, 2*time.Minute, "fi_info -p verbs")
	if err != nil {
		t.Fatalf("guest fi_info -p verbs: %v\n%s", err, out)
	}
	fiInfoCheck(t, out, "rxe0", "IB-0xfe80000000000000")
	out, err = r.Soft.Run(t, time.Minute, nil, "fi_info", "-p", "verbs")
	if err != nil {
		t.Fatalf("fi_info -p verbs: %v\n%s", err, out)
	}
	fiInfoCheck(t, out, "softroce0", "IB-0xfe80000000000000")
}

// fiRxeRefusal is why an endpoint type does not run between softroce and
// rxe: what the side that fails prints (rxe: the rxe end; both: each end).
type fiRxeRefusal struct {
	rxe, both string
}

// fiRxe are fiCases against rxe, with fewer iterations (the guest is
// emulated) and, for the types that do not run, what each run ends with:
//
//   - ofi_rxm opens a CQ of 262144 entries; rxe's max_cqe is 32767, so
//     fi_enable fails on the rxe end with EINVAL ("Unable to create
//     verbs CQ") and its peer finds the control connection closed.
//
// DGRAM endpoints (and ofi_rxd on them) are named by GID index 0
// (FI_VERBS_GID_IDX): the interface's IPv6 link-local GID on both rxe and
// softroce, so they run over RoCEv2 on IPv6 link-local.
var fiRxe = []struct {
	fiCase
	refusal *fiRxeRefusal
}{
	{fiCase{"msg", "verbs", "msg", []int{64, 65536}}, nil},
	{fiCase{"rdm-rxm", "verbs;ofi_rxm", "rdm", []int{64}}, &fiRxeRefusal{rxe: "fi_enable(): util/pingpong.c:1551, ret=-22 (Invalid argument)"}},
	{fiCase{"rdm-rxd", "verbs;ofi_rxd", "rdm", []int{64, 4096}}, nil},
	{fiCase{"dgram", "verbs", "dgram", []int{64, 1024}}, nil},
}

// fi_pingpong between softroce and kernel rxe, in both roles, over each
// endpoint type of the verbs provider (-p and -e only, as TestFiPingpong):
// MSG, DGRAM and RDM over ofi_rxd run; RDM over ofi_rxm stops on rxe's
// CQ limit (fiRxe).
func TestFiPingpongAgainstRxe(t *testing.T) {
	Need(t, "libfabric-bin", "fi_pingpong")
	r := NewRxePeer(t)
	const iters = 50
	for _, ro := range r.roles() {
		t.Run(ro.name, func(t *testing.T) {
			for _, c := range fiRxe {
				for _, size := range c.sizes {
					co, so, cerr, serr := fiPingpong(t, ro, c.fiCase, size, iters)
					if c.refusal == nil {
						fiPingpongCheck(t, ro, c.fiCase, size, iters, co, so, cerr, serr)
						continue
					}
					rxeOut, softOut := so, co
					if ro.client.name == "rxe" {
						rxeOut, softOut = co, so
					}
					cRows, _ := parsePingpong(co)
					sRows, _ := parsePingpong(so)
					ok := cerr != nil && serr != nil && len(cRows) == 0 && len(sRows) == 0
					if c.refusal.rxe != "" && !strings.Contains(rxeOut, c.refusal.rxe) {
						ok = false
					}
					if c.refusal.both != "" && (!strings.Contains(rxeOut, c.refusal.both) || !strings.Contains(softOut, c.refusal.both)) {
						ok = false
					}
					if !ok {
						t.Errorf("fi_pingpong -p '%s' -e %s -S %d: client %v, server %v; want both to fail, %+v:\nclient:\n%s\nserver:\n%s",
							c.prov, c.ep, size, cerr, serr, *c.refusal, co, so)
						continue
					}
					t.Logf("fi_pingpong -p '%s' -e %s (%s): fails as expected: rxe: %s", c.prov, c.ep, ro.name, lastNonEmpty(rxeOut))
				}
			}
		})
	}
}

// lastNonEmpty is out's last line that is not blank.
func lastNonEmpty(out string) string {
	l := strings.Split(strings.TrimSpace(out), "\n")
	return l[len(l)-1]
}
