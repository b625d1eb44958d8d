package interop

import (
	"context"
	"testing"
	"time"

	"github.com/softroce/softroce/conformance/agent"

	"github.com/softroce/softroce/verbs"
)

// mustOf returns a check that fails t on a non-nil error.
func mustOf(t *testing.T) func(error) {
	return func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
}

// hostSide opens softroce's device with a PD, a buffer of n bytes
// registered for local writes, and a CQ of depth entries.
func hostSide(t *testing.T, n, depth int) (*verbs.Device, *verbs.PD, []byte, *verbs.MR, *verbs.CQ) {
	t.Helper()
	must := mustOf(t)
	dev := hostDevice(t)
	pd, err := dev.AllocPD()
	must(err)
	buf := make([]byte, n)
	mr, err := pd.RegMR(buf, verbs.AccessLocalWrite)
	must(err)
	cq, err := dev.CreateCQ(depth)
	must(err)
	return dev, pd, buf, mr, cq
}

// connectRC moves rxe's RC QP aqp (in INIT) and softroce's qp to RTS
// facing each other at path MTU mtu, rxe sending from apsn and softroce
// from spsn, rxe retrying 7 times (RNR too) and both taking 16 reads.
// rxeMinRNR (0: rxe's default) and opts add to that.
func connectRC(ctx context.Context, ag *agent.Client, aqp agent.QP, agid [16]byte, qp *verbs.QP, sgid verbs.GID, mtu int, apsn, spsn uint32, rxeMinRNR int, opts verbs.ConnectOptions) error {
	if err := ag.ModifyToRTR(ctx, aqp, agent.RTRAttr{DestQPN: qp.Num(), RecvPSN: spsn, DestGID: sgid, MTU: mtu, MaxDestRdAtom: 16, MinRNRTimer: rxeMinRNR}); err != nil {
		return err
	}
	if err := ag.ModifyToRTS(ctx, aqp, agent.RTSAttr{SendPSN: apsn, Timeout: 14, Retry: 7, RNRRetry: 7, MaxRdAtom: 16}); err != nil {
		return err
	}
	opts.PathMTU, opts.SQPSN = mtu, spsn
	return qp.Connect(verbs.RemoteInfo{QPN: aqp.QPN, PSN: apsn, GID: agid}, &opts)
}

// rxeSend posts wr on rxe's QP qp and waits for its completion on cq,
// which must be a success.
func rxeSend(t *testing.T, ctx context.Context, ag *agent.Client, qp agent.QP, cq agent.CQ, wr agent.SendWR) {
	t.Helper()
	if err := ag.PostSend(ctx, qp, wr); err != nil {
		t.Fatal(err)
	}
	if wc, err := ag.Poll(ctx, cq, 20*time.Second); err != nil || wc == nil || wc.Status != agent.WCSuccess {
		t.Fatalf("rxe %s (WR %d, %d bytes): %+v %v", wr.Op, wr.WRID, wr.Len, wc, err)
	}
}

// udAHs returns address handles between softroce's GID 0 and rxe's GID 1,
// hop limit 64: softroce's to rxe and rxe's (on apd) to softroce.
func udAHs(t *testing.T, ctx context.Context, ag *agent.Client, apd agent.PD, dev *verbs.Device, pd *verbs.PD) (*verbs.AH, agent.AH) {
	t.Helper()
	must := mustOf(t)
	agid, err := ag.GID(ctx, 1)
	must(err)
	sgid, err := dev.QueryGID(0)
	must(err)
	ah, err := pd.CreateAH(verbs.AHAttr{DGID: verbs.GID(agid), HopLimit: 64})
	must(err)
	aah, err := ag.CreateAH(ctx, apd, agent.AHAttr{DestGID: sgid, HopLimit: 64})
	must(err)
	return ah, aah
}
