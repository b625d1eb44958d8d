package verbs_test

import (
	"fmt"

	"github.com/softroce/softroce/nic/pipe"
	"github.com/softroce/softroce/verbs"
)

// A UC (unreliable connection) QP carries SEND and RDMA WRITE like RC but
// is never acknowledged: a send completes as soon as its last packet has
// left, and a message that loses a packet is dropped by the receiver
// without a word. UC has no RDMA READ or atomics.
func Example_uc() {
	la, lb := pipe.New(pipe.Config{})
	da, _ := verbs.Open(la, nil)
	db, _ := verbs.Open(lb, nil)
	defer da.Close()
	defer db.Close()

	type side struct {
		qp  *verbs.QP
		cq  *verbs.CQ
		mr  *verbs.MR
		buf []byte
	}
	mk := func(d *verbs.Device) side {
		s := side{buf: make([]byte, 4096)}
		pd, _ := d.AllocPD()
		s.cq, _ = d.CreateCQ(16)
		s.mr, _ = pd.RegMR(s.buf, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
		s.qp, _ = pd.CreateQP(verbs.QPInitAttr{Type: verbs.QPTypeUC, SendCQ: s.cq, RecvCQ: s.cq})
		return s
	}
	a, b := mk(da), mk(db)
	ga, _ := da.QueryGID(0)
	gb, _ := db.QueryGID(0)
	// The same out-of-band facts as RC; Connect sets only UC's attributes.
	if err := a.qp.Connect(verbs.RemoteInfo{QPN: b.qp.Num(), PSN: 7, GID: gb}, &verbs.ConnectOptions{SQPSN: 3}); err != nil {
		panic(err)
	}
	if err := b.qp.Connect(verbs.RemoteInfo{QPN: a.qp.Num(), PSN: 3, GID: ga}, &verbs.ConnectOptions{SQPSN: 7}); err != nil {
		panic(err)
	}

	// A WRITE with immediate: the data lands in b's memory and consumes
	// one of b's receives to tell it so.
	b.qp.PostRecv(&verbs.RecvWR{ID: 100})
	copy(a.buf, "unacknowledged")
	err := a.qp.PostSend(&verbs.SendWR{
		ID: 1, Opcode: verbs.WRRDMAWriteWithImm, Flags: verbs.SendSignaled, Imm: 42,
		SGL:        []verbs.SGE{{Addr: a.mr.Addr(), Length: 14, LKey: a.mr.LKey()}},
		RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey(),
	})
	if err != nil {
		panic(err)
	}
	wc := (&endpoint{cq: a.cq}).wait()
	fmt.Println("sender:", wc.Opcode, wc.Status)
	wc = (&endpoint{cq: b.cq}).wait()
	fmt.Println("receiver:", wc.Opcode, wc.Status, wc.ImmData)
	fmt.Printf("%s\n", b.buf[:14])

	// RDMA READ does not exist on UC.
	err = a.qp.PostSend(&verbs.SendWR{Opcode: verbs.WRRDMARead,
		SGL: []verbs.SGE{{Addr: a.mr.Addr(), Length: 8, LKey: a.mr.LKey()}}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()})
	fmt.Println(err != nil)
	// Output:
	// sender: RDMA_WRITE success
	// receiver: RECV_RDMA_WITH_IMM success 42
	// unacknowledged
	// true
}
