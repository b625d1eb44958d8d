package serve

import (
	"testing"
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
