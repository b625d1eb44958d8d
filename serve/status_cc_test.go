package serve

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/softroce/softroce/nic/pipe"
	"github.com/softroce/softroce/verbs"
)

// A daemon whose device runs DCQCN (softroce serve --cc dcqcn) shows its
// counters per device and the rate of each RC QP in the status, and the
// counters among the port's (softroce rdma statistic); one without shows
// none of them.
func TestStatusCC(t *testing.T) {
	for _, on := range []bool{true, false} {
		a, b := pipe.New(pipe.Config{})
		b.Close()
		opts := &verbs.Options{}
		if on {
			p := verbs.CCDefaults()
			opts.CC = &p
		}
		d, err := verbs.Open(a, opts)
		if err != nil {
			t.Fatal(err)
		}
		s := serveOn(t, []*verbs.Device{d}, Config{Socket: filepath.Join(t.TempDir(), "s.sock")})
		h := dial(t, s)
		h.open()
		pd := h.handle(opAllocPD, nil)
		cq := h.handle(opCreateCQ, u32s(16, 0))
		e, _, fds := h.call(opCreateQP, u32s(pd, cq, cq, ibvQPTRC, 4, 4, 1, 1, 0, 0))
		closeAll(fds)
		if e != 0 {
			t.Fatalf("CREATE_QP: %v", e)
		}
		st := s.Status()
		if len(st.Devices) != 1 || len(st.Clients) != 1 || len(st.Clients[0].QPs) != 1 {
			t.Fatalf("status %+v", st)
		}
		dc, qc := st.Devices[0].CC, st.Clients[0].QPs[0].CC
		if on != (dc != nil) || on != (qc != nil) {
			t.Errorf("cc on %v: device counters %v, QP %v", on, dc, qc)
		}
		if on && (qc.RateBPS != verbs.CCDefaults().LineRate || !qc.Enabled) {
			t.Errorf("QP %+v: want DCQCN at line rate", qc)
		}
		var named bool
		for _, c := range s.devs[0].linkCounters() {
			named = named || c.Name == "np_cnp_sent"
		}
		if on != named {
			t.Errorf("cc on %v: the port counters (softroce rdma statistic) name np_cnp_sent: %v", on, named)
		}
		js, _ := json.Marshal(st)
		if on != strings.Contains(string(js), `"np_cnp_sent"`) {
			t.Errorf("cc on %v: status JSON %s", on, js)
		}
	}
}
