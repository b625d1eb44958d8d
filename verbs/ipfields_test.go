package verbs

import (
	"sync"
	"testing"

	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/qpstate"
)

// The traffic class of an RC QP's address vector rides on every packet it
// sends (the IP TOS), as with rxe; its hop limit does not: Linux gives a
// connected QP the route's hop limit, so the packets ask for the link's
// default TTL (HopLimit 0).
func TestRCAddressVectorHopLimitTClass(t *testing.T) {
	a, b := openPair(t)
	pda, _ := a.AllocPD()
	pdb, _ := b.AllocPD()
	bufa, bufb := make([]byte, 4096), make([]byte, 4096)
	mra, _ := pda.RegMR(bufa, AccessLocalWrite)
	mrb, _ := pdb.RegMR(bufb, AccessLocalWrite|AccessRemoteWrite)
	ca, _ := a.CreateCQ(8)
	cb, _ := b.CreateCQ(8)
	qa, _ := pda.CreateQP(QPInitAttr{SendCQ: ca, RecvCQ: ca})
	qb, _ := pdb.CreateQP(QPInitAttr{SendCQ: cb, RecvCQ: cb})
	ga, _ := a.QueryGID(0)
	gb, _ := b.QueryGID(0)
	if err := qb.Connect(RemoteInfo{QPN: qa.Num(), PSN: 1, GID: ga}, &ConnectOptions{SQPSN: 1}); err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(qa.Init(AccessRemoteWrite))
	must(qa.Modify(&QPAttr{State: StateRTR, PathMTU: 1024, DestQPN: qb.Num(), RQPSN: 1, MaxDestRDAtomic: 1, MinRNRTimer: 12,
		AV: AddressVector{DGID: gb, HopLimit: 3, TrafficClass: 0x20}},
		qpstate.AttrState|qpstate.AttrAV|qpstate.AttrPathMTU|qpstate.AttrDestQPN|qpstate.AttrRQPSN|qpstate.AttrMaxDestRDAtomic|qpstate.AttrMinRNRTimer))
	must(qa.Modify(&QPAttr{State: StateRTS, SQPSN: 1, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRDAtomic: 1},
		qpstate.AttrState|qpstate.AttrSQPSN|qpstate.AttrTimeout|qpstate.AttrRetryCnt|qpstate.AttrRNRRetry|qpstate.AttrMaxQPRDAtomic))
	var mu sync.Mutex
	var sent []nic.Packet
	a.SetPacketTrace(func(dir byte, p *nic.Packet) {
		if dir == 'T' {
			mu.Lock()
			sent = append(sent, nic.Packet{HopLimit: p.HopLimit, TClass: p.TClass})
			mu.Unlock()
		}
	})
	must(qa.PostSend(&SendWR{ID: 1, Opcode: WRRDMAWrite, Flags: SendSignaled, RemoteAddr: mrb.Addr(), RKey: mrb.RKey(),
		SGL: []SGE{{Addr: mra.Addr(), Length: 3000, LKey: mra.LKey()}}}))
	if wc := waitOne(t, ca, "WRITE"); wc.Status != cq.Success {
		t.Fatalf("WRITE: %v", wc.Status)
	}
	a.SetPacketTrace(nil)
	mu.Lock()
	defer mu.Unlock()
	if len(sent) != 3 {
		t.Fatalf("%d packets, want 3", len(sent))
	}
	for i, p := range sent {
		if p.HopLimit != 0 || p.TClass != 0x20 {
			t.Errorf("packet %d: hop limit %d traffic class %#x", i, p.HopLimit, p.TClass)
		}
	}
}
