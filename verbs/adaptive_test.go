package verbs

import "testing"

// TestConnectAdaptiveTimeout: the option reaches the transport's path, is
// off by default, and SetAdaptiveTimeout turns it off again.
func TestConnectAdaptiveTimeout(t *testing.T) {
	a, b := openPair(t)
	gb, _ := b.QueryGID(0)
	for _, on := range []bool{false, true} {
		_, _, qp := newQP(t, a)
		if err := qp.Connect(RemoteInfo{QPN: 0x77, PSN: 1, GID: gb}, &ConnectOptions{AdaptiveTimeout: on}); err != nil {
			t.Fatal(err)
		}
		if p := qp.rc.Path(); p.AdaptiveTimeout != on || p.Timeout != 14 {
			t.Fatalf("AdaptiveTimeout %v: path %+v", on, p)
		}
		qp.SetAdaptiveTimeout(false)
		if qp.rc.Path().AdaptiveTimeout {
			t.Fatal("SetAdaptiveTimeout(false) left it on")
		}
	}
}
