package perftest

import (
	"strings"
	"testing"

	"github.com/softroce/softroce/verbs"
)

// TestConfigUC: -c UC is for write and send only, and a UC receiver left
// at the default receive depth posts one receive per message (perftest's
// UC_MAX_RX rule).
func TestConfigUC(t *testing.T) {
	for _, test := range []Test{Read, Atomic} {
		c := Config{Test: test, Conn: verbs.QPTypeUC}
		if err := c.defaults(); err == nil || !strings.Contains(err.Error(), "UC") {
			t.Errorf("%v over UC: %v", test, err)
		}
	}
	if c := (Config{Test: Write, Conn: verbs.QPTypeUD}); c.defaults() == nil {
		t.Error("UD accepted for write")
	}
	c := Config{Test: Send, Conn: verbs.QPTypeUC, Iters: 3000}
	if err := c.defaults(); err != nil || c.RxDepth != 3000 {
		t.Fatalf("UC send: rx depth %d, %v", c.RxDepth, err)
	}
	c = Config{Test: Send, Conn: verbs.QPTypeUC, Iters: 20000}
	if err := c.defaults(); err != nil || c.RxDepth != ucMaxRx {
		t.Fatalf("UC send, 20000 iterations: rx depth %d, %v", c.RxDepth, err)
	}
	c = Config{Test: Send, Conn: verbs.QPTypeUC, Iters: 3000, RxDepth: 100}
	if err := c.defaults(); err != nil || c.RxDepth != 100 {
		t.Fatalf("UC send with -r 100: rx depth %d, %v", c.RxDepth, err)
	}
	c = Config{Test: Send, Iters: 3000}
	if err := c.defaults(); err != nil || c.RxDepth != 512 {
		t.Fatalf("RC send: rx depth %d, %v", c.RxDepth, err)
	}
}
