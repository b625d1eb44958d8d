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

// waitWC takes one completion from softroce's cq within 20 seconds,
// failing t with what and dev's counters when none comes.
func waitWC(t *testing.T, ctx context.Context, dev *verbs.Device, cq *verbs.CQ, what string) verbs.WC {
	t.Helper()
	wcs := make([]verbs.WC, 1)
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if _, err := cq.Wait(wctx, wcs); err != nil {
		t.Fatalf("%s: %v (transport %+v, link %+v)", what, err, dev.Stats(), dev.Link().Stats())
	}
	return wcs[0]
}

// rxeRC is an RC QP of the guest's verbs agent, with the agent's MR the
// operations it posts read and write, and its GID 1.
type rxeRC struct {
	ag  *agent.Client
	mr  agent.MR
	cq  agent.CQ
	qp  agent.QP
	gid [16]byte
	id  uint64 // the last work request's
}

// newRxeRC starts the guest's verbs agent (rxeSide) with an RC QP in
// INIT taking every access right.
func newRxeRC(t *testing.T, ctx context.Context) *rxeRC {
	t.Helper()
	must := mustOf(t)
	ag, pd, mr, cq := rxeSide(t, ctx)
	qp, err := ag.CreateQP(ctx, pd, cq, cq, agent.QPCap{SendWR: 16, RecvWR: 16})
	must(err)
	must(ag.ModifyToInit(ctx, qp, agent.AccessAll))
	gid, err := ag.GID(ctx, 1)
	must(err)
	return &rxeRC{ag: ag, mr: mr, cq: cq, qp: qp, gid: gid}
}

// op posts op from (or, for a READ, to) length bytes at off of the MR to
// raddr under rkey and returns its completion's status.
func (r *rxeRC) op(t *testing.T, ctx context.Context, op agent.Op, off, length int, raddr uint64, rkey uint32) agent.WCStatus {
	t.Helper()
	r.id++
	if err := r.ag.PostSend(ctx, r.qp, agent.SendWR{WRID: r.id, Op: op, MR: r.mr, Off: off, Len: length, RemoteAddr: raddr, RKey: rkey}); err != nil {
		t.Fatal(err)
	}
	wc, err := r.ag.Poll(ctx, r.cq, 20*time.Second)
	if err != nil || wc.WRID != r.id {
		t.Fatalf("rxe %s: %+v (%v)", op, wc, err)
	}
	return wc.Status
}

// agentToRTS moves an agent's RC QP qp (in INIT) to RTS facing QP qpn at
// gid with path MTU 1024, receiving from rpsn and sending from spsn,
// retrying 7 times (RNR too), 16 reads each way.
func agentToRTS(ctx context.Context, ag *agent.Client, qp agent.QP, qpn uint32, gid [16]byte, rpsn, spsn uint32) error {
	if err := ag.ModifyToRTR(ctx, qp, agent.RTRAttr{DestQPN: qpn, RecvPSN: rpsn, DestGID: gid, MTU: 1024, MaxDestRdAtom: 16}); err != nil {
		return err
	}
	return ag.ModifyToRTS(ctx, qp, agent.RTSAttr{SendPSN: spsn, Timeout: 14, Retry: 7, RNRRetry: 7, MaxRdAtom: 16})
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
