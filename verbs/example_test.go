package verbs_test

import (
	"context"
	"fmt"
	"time"

	"github.com/softroce/softroce/nic/pipe"
	"github.com/softroce/softroce/verbs"
)

// endpoint is one side of the examples: a device with a PD, a CQ, an
// RC QP and a registered 4 KiB buffer.
type endpoint struct {
	dev *verbs.Device
	pd  *verbs.PD
	cq  *verbs.CQ
	qp  *verbs.QP
	mr  *verbs.MR
	buf []byte
}

func newEndpoint(dev *verbs.Device) *endpoint {
	ep := &endpoint{dev: dev, buf: make([]byte, 4096)}
	ep.pd, _ = dev.AllocPD()
	ep.mr, _ = ep.pd.RegMR(ep.buf, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead|verbs.AccessRemoteAtomic)
	ep.cq, _ = dev.CreateCQ(64)
	ep.qp, _ = ep.pd.CreateQP(verbs.QPInitAttr{SendCQ: ep.cq, RecvCQ: ep.cq, Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16}})
	return ep
}

// info is what the side tells its peer out of band.
func (ep *endpoint) info() verbs.RemoteInfo {
	gid, _ := ep.dev.QueryGID(0)
	return verbs.RemoteInfo{QPN: ep.qp.Num(), PSN: 0x1000, GID: gid}
}

// pair opens two devices on an in-process pipe and connects their QPs.
func pair() (a, b *endpoint) {
	la, lb := pipe.New(pipe.Config{})
	da, _ := verbs.Open(la, nil)
	db, _ := verbs.Open(lb, nil)
	a, b = newEndpoint(da), newEndpoint(db)
	opts := &verbs.ConnectOptions{SQPSN: 0x1000}
	if err := a.qp.Connect(b.info(), opts); err != nil {
		panic(err)
	}
	if err := b.qp.Connect(a.info(), opts); err != nil {
		panic(err)
	}
	return a, b
}

func (ep *endpoint) wait() verbs.WC {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	wc := make([]verbs.WC, 1)
	if _, err := ep.cq.Wait(ctx, wc); err != nil {
		panic(err)
	}
	return wc[0]
}

// An RDMA WRITE puts local bytes into the peer's registered memory
// without involving the peer's CPU.
func Example_write() {
	a, b := pair()
	defer a.dev.Close()
	defer b.dev.Close()

	copy(a.buf, "hello, RDMA")
	err := a.qp.PostSend(&verbs.SendWR{
		ID: 1, Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled,
		SGL:        []verbs.SGE{{Addr: a.mr.Addr(), Length: 11, LKey: a.mr.LKey()}},
		RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey(),
	})
	if err != nil {
		panic(err)
	}
	wc := a.wait()
	fmt.Println(wc.Opcode, wc.Status)
	fmt.Printf("%s\n", b.buf[:11])
	// Output:
	// RDMA_WRITE success
	// hello, RDMA
}

// An RDMA READ fetches bytes from the peer's registered memory.
func Example_read() {
	a, b := pair()
	defer a.dev.Close()
	defer b.dev.Close()

	copy(b.buf[100:], "remote bytes")
	err := a.qp.PostSend(&verbs.SendWR{
		ID: 2, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
		SGL:        []verbs.SGE{{Addr: a.mr.Addr(), Length: 12, LKey: a.mr.LKey()}},
		RemoteAddr: b.mr.Addr() + 100, RKey: b.mr.RKey(),
	})
	if err != nil {
		panic(err)
	}
	wc := a.wait()
	fmt.Println(wc.Opcode, wc.Status, wc.ByteLen)
	fmt.Printf("%s\n", a.buf[:12])
	// Output:
	// RDMA_READ success 12
	// remote bytes
}
