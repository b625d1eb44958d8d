package netns

import (
	"testing"
	"time"

	"github.com/softroce/softroce/internal/netnstest"
	"github.com/softroce/softroce/nic/impair"
	"github.com/softroce/softroce/verbs"
)

// TestImpairedAdaptive runs the impaired relay's exercise in real time with
// an IBTA local ACK timeout of 65.5 us (Timeout 4), shorter than the
// relay's round trip (100-200 us of delay each way), and the adaptive
// timeout on both QPs: WRITE, READ, SEND and atomics still complete
// byte-exact through loss, duplication, reordering and corruption. With
// the fixed timeout the same exercise ends in RETRY_EXC_ERR: every retry
// expires before its ACK can come back.
func TestImpairedAdaptive(t *testing.T) {
	netnstest.Require(t)
	cfg := netnstest.RelayConfig{Impair: impair.Config{Loss: 0.03, Dup: 0.02, Reorder: 0.05, Corrupt: 0.01,
		Delay: 100 * time.Microsecond, Jitter: 100 * time.Microsecond, Seed: 12}}
	ea, eb, _ := netnstest.Line(t, 9000, cfg)
	a, b := newEndpoint(t, udpBackend.open(t, ea)), newEndpoint(t, udpBackend.open(t, eb))
	oa := &verbs.ConnectOptions{PathMTU: 4096, SQPSN: 0x100, Timeout: 4, AdaptiveTimeout: true}
	ob := &verbs.ConnectOptions{PathMTU: 4096, SQPSN: 0x200, Timeout: 4, AdaptiveTimeout: true}
	if err := a.qp.Connect(b.info(0x200), oa); err != nil {
		t.Fatal(err)
	}
	if err := b.qp.Connect(a.info(0x100), ob); err != nil {
		t.Fatal(err)
	}
	exercise(t, a, b, 128<<10, 30*time.Second)
	exercise(t, b, a, 32<<10, 30*time.Second)
	t.Logf("QP a %+v", a.qp.Stats())
	t.Logf("QP b %+v", b.qp.Stats())
}
