package agent

import (
	"context"
	"testing"
)

// TestCreateQPType: a QP type other than RC travels as type=, RC as
// nothing (the agent's default).
func TestCreateQPType(t *testing.T) {
	c, reqs := fakeAgent(t, map[string]string{"qp": "ok qp=2 qpn=0x12"})
	if _, err := c.CreateQP(context.Background(), 1, 1, 1, QPCap{Type: QPTypeUC}); err != nil {
		t.Fatal(err)
	}
	if got := <-reqs; got != "qp pd=1 scq=1 rcq=1 type=uc" {
		t.Errorf("request %q", got)
	}
	if _, err := c.CreateQP(context.Background(), 1, 1, 1, QPCap{}); err != nil {
		t.Fatal(err)
	}
	if got := <-reqs; got != "qp pd=1 scq=1 rcq=1" {
		t.Errorf("request %q", got)
	}
}
