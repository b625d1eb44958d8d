package serve

import (
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/softroce/softroce/nic/udp"
	"github.com/softroce/softroce/verbs"
)

// ahFlowLabel is the flow label of the client's AH h, the one AH of that
// handle among the server's clients.
func ahFlowLabel(t *testing.T, s *Server, h uint32) uint32 {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.clients {
		if c.dev == nil {
			continue
		}
		c.dev.mu.Lock()
		o := c.ahs[h]
		c.dev.mu.Unlock()
		if o != nil {
			return o.ah.AV().FlowLabel
		}
	}
	t.Fatalf("no AH %d", h)
	return 0
}

// UCX fills ibv_ah_attr.grh.flow_label with ~0 (~(path factor * path
// index)) for RoCE. The kernel takes any value — uverbs and rxe store it
// as given, mlx5 uses its low 20 bits — so CREATE_AH keeps the 20 bits
// the GRH holds, as MODIFY_QP does, rather than refusing it.
func TestCreateAHFlowLabelAboveTwentyBits(t *testing.T) {
	s := startPipe(t)
	h := dial(t, s)
	h.open()
	gid := h.gid0()
	pd := h.handle(opAllocPD, nil)
	for _, c := range []struct{ given, kept uint32 }{
		{0xffffffff, 0xfffff},
		{1 << 20, 0},
		{0xabc12345, 0x12345},
		{1, 1},
	} {
		ah := h.handle(opCreateAH, ahBody(pd, 1, 0, c.given, 64, 0, 0, 1, gid))
		if got := ahFlowLabel(t, s, ah); got != c.kept {
			t.Errorf("CREATE_AH with flow label %#x: the AH's is %#x, want %#x", c.given, got, c.kept)
		}
	}
}

// Every field of a UD receive completion and the GRH before the datagram,
// as rxe delivers them (serve/testdata/udwc.c says where each comes from),
// but for sl, which carries the RoCE packet type as mlx5 reports it: UCX's
// ud_verbs reads it to find the destination address in the GRH and drops
// every datagram without it (IPv4: 2, with bit 3 for the UDP header of
// RoCEv2; IPv6: 1).
func TestCProgramUDCompletionFields(t *testing.T) {
	t.Run("IPv4", func(t *testing.T) { runC(t, "udwc.c", "10") })
	t.Run("IPv6", func(t *testing.T) {
		_, lib := tool(t, "ibv_devinfo")
		port := freeUDPPort(t)
		l, err := udp.Open(udp.Config{Addr: netip.MustParseAddr("::1"), Port: port})
		if err != nil {
			t.Skipf("open ::1: %v", err)
		}
		d, err := verbs.Open(l, nil)
		if err != nil {
			t.Fatal(err)
		}
		s := serveOn(t, []*verbs.Device{d}, Config{Socket: filepath.Join(t.TempDir(), "s.sock"), RemotePort: uint16(port)})
		bin := filepath.Join(t.TempDir(), "prog")
		if out, err := exec.Command("gcc", "-O1", "-o", bin, filepath.Join("testdata", "udwc.c"), "-L"+lib, "-l:libibverbs.so.1").CombinedOutput(); err != nil {
			t.Fatalf("gcc: %v\n%s", err, out)
		}
		cmd := exec.Command(bin, "9")
		cmd.Env = env(s, lib)
		out, err := cmd.CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "ok" {
			t.Fatalf("%v\n%s", err, out)
		}
	})
}
