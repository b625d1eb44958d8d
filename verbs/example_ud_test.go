package verbs_test

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/softroce/softroce/nic/pipe"
	"github.com/softroce/softroce/verbs"
)

// udEndpoint is one side of the UD example: a device with a UD QP in RTS
// and a registered buffer.
type udEndpoint struct {
	dev *verbs.Device
	pd  *verbs.PD
	cq  *verbs.CQ
	qp  *verbs.QP
	mr  *verbs.MR
	buf []byte
}

const exampleQKey = 0x11111111

func newUDEndpoint(dev *verbs.Device) *udEndpoint {
	ep := &udEndpoint{dev: dev, buf: make([]byte, 4096)}
	ep.pd, _ = dev.AllocPD()
	ep.mr, _ = ep.pd.RegMR(ep.buf, verbs.AccessLocalWrite)
	ep.cq, _ = dev.CreateCQ(16)
	var err error
	ep.qp, err = ep.pd.CreateQP(verbs.QPInitAttr{Type: verbs.QPTypeUD, SendCQ: ep.cq, RecvCQ: ep.cq})
	if err != nil {
		panic(err)
	}
	// RESET -> INIT (Q_Key) -> RTR -> RTS (send PSN): no peer to name.
	if err := ep.qp.ReadyUD(exampleQKey, 0); err != nil {
		panic(err)
	}
	return ep
}

func (ep *udEndpoint) wait() verbs.WC {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	wc := make([]verbs.WC, 1)
	if _, err := ep.cq.Wait(ctx, wc); err != nil {
		panic(err)
	}
	return wc[0]
}

// A UD SEND is one datagram to an address handle, a QP number and a
// Q_Key. The receive buffer starts with the 40-byte GRH (for IPv4, 20 zero
// bytes and the IPv4 header), which names the sender's address; the
// completion names the sender's QP, so the receiver can answer.
func Example_ud() {
	la, lb := pipe.New(pipe.Config{})
	da, _ := verbs.Open(la, nil)
	db, _ := verbs.Open(lb, nil)
	defer da.Close()
	defer db.Close()
	a, b := newUDEndpoint(da), newUDEndpoint(db)

	// The receiver leaves room for the GRH.
	if err := b.qp.PostRecv(&verbs.RecvWR{ID: 7, SGL: []verbs.SGE{{Addr: b.mr.Addr(), Length: verbs.GRHLen + 1024, LKey: b.mr.LKey()}}}); err != nil {
		panic(err)
	}
	// The sender names the receiver by GID (an address handle), QP number
	// and Q_Key.
	gid, _ := db.QueryGID(0)
	ah, err := a.pd.CreateAH(verbs.AHAttr{DGID: gid, HopLimit: 64})
	if err != nil {
		panic(err)
	}
	defer ah.Destroy()
	copy(a.buf, "hello, UD")
	err = a.qp.PostSend(&verbs.SendWR{
		ID: 1, Opcode: verbs.WRSend, Flags: verbs.SendSignaled,
		SGL: []verbs.SGE{{Addr: a.mr.Addr(), Length: 9, LKey: a.mr.LKey()}},
		AH:  ah.AV(), RemoteQPN: b.qp.Num(), RemoteQKey: exampleQKey,
	})
	if err != nil {
		panic(err)
	}
	fmt.Println("sent:", a.wait().Status)
	wc := b.wait()
	from := netip.AddrFrom4([4]byte(b.buf[32:36])) // the IPv4 source in the GRH
	fmt.Println(wc.Opcode, wc.Status, wc.ByteLen, "bytes, GRH:", wc.Flags&verbs.WCFlagGRH != 0)
	fmt.Println("from QP", wc.SrcQP == a.qp.Num(), "at", from == la.Addrs()[0])
	fmt.Printf("%s\n", b.buf[verbs.GRHLen:verbs.GRHLen+9])
	// Output:
	// sent: success
	// RECV success 49 bytes, GRH: true
	// from QP true at true
	// hello, UD
}
