package verbs_test

import (
	"fmt"

	"github.com/softroce/softroce/nic/pipe"
	"github.com/softroce/softroce/verbs"
)

// A shared receive queue: two RC QPs on b take their receives from one
// SRQ, in the order they were posted, whichever QP a SEND arrives on.
// When fewer WQEs than the armed limit remain, the device raises
// IBV_EVENT_SRQ_LIMIT_REACHED once (the limit disarms) so the application
// can post more.
func Example_srq() {
	la, lb := pipe.New(pipe.Config{})
	da, _ := verbs.Open(la, nil)
	db, _ := verbs.Open(lb, nil)
	defer da.Close()
	defer db.Close()

	a := newEndpoint(da)
	pdb, _ := db.AllocPD()
	bbuf := make([]byte, 4096)
	mrb, _ := pdb.RegMR(bbuf, verbs.AccessLocalWrite)
	cqb, _ := db.CreateCQ(16)
	srq, err := pdb.CreateSRQ(verbs.SRQInitAttr{MaxWR: 8, Limit: 2})
	if err != nil {
		panic(err)
	}
	for i := range 4 {
		srq.PostRecv(&verbs.RecvWR{ID: uint64(100 + i),
			SGL: []verbs.SGE{{Addr: mrb.Addr() + uint64(i*64), Length: 64, LKey: mrb.LKey()}}})
	}

	// Two connections from a to b; b's QPs are created on the SRQ.
	ga, _ := da.QueryGID(0)
	gb, _ := db.QueryGID(0)
	var qa [2]*verbs.QP
	for i := range qa {
		qa[i], _ = a.pd.CreateQP(verbs.QPInitAttr{SendCQ: a.cq, RecvCQ: a.cq})
		qb, _ := pdb.CreateQP(verbs.QPInitAttr{SendCQ: cqb, RecvCQ: cqb, SRQ: srq})
		if err := qa[i].Connect(verbs.RemoteInfo{QPN: qb.Num(), PSN: 1, GID: gb}, &verbs.ConnectOptions{SQPSN: 1}); err != nil {
			panic(err)
		}
		if err := qb.Connect(verbs.RemoteInfo{QPN: qa[i].Num(), PSN: 1, GID: ga}, &verbs.ConnectOptions{SQPSN: 1}); err != nil {
			panic(err)
		}
	}

	// Three SENDs, alternating between the two connections, one at a time.
	b := &endpoint{cq: cqb}
	for i := range 3 {
		copy(a.buf, fmt.Sprintf("message %d", i))
		if err := qa[i%2].PostSend(&verbs.SendWR{ID: uint64(i), Opcode: verbs.WRSend, Flags: verbs.SendSignaled,
			SGL: []verbs.SGE{{Addr: a.mr.Addr(), Length: 9, LKey: a.mr.LKey()}}}); err != nil {
			panic(err)
		}
		a.wait()
		wc := b.wait()
		fmt.Printf("wr_id %d: %s\n", wc.WRID, bbuf[(wc.WRID-100)*64:][:wc.ByteLen])
	}
	// One WQE is left: below the limit of 2.
	ev := <-db.AsyncEvents()
	fmt.Println(ev.Type, ev.SRQ == srq)
	// Output:
	// wr_id 100: message 0
	// wr_id 101: message 1
	// wr_id 102: message 2
	// SRQ limit reached true
}
