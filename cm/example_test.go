package cm_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/softroce/softroce/cm"
	"github.com/softroce/softroce/nic/pipe"
	"github.com/softroce/softroce/verbs"
)

// peer is one side of the example: a device, its CM, and an RC QP with a
// registered buffer.
type peer struct {
	dev *verbs.Device
	cm  *cm.CM
	cq  *verbs.CQ
	mr  *verbs.MR
	qp  *verbs.QP
	buf []byte
}

func newPeer(dev *verbs.Device) *peer {
	p := &peer{dev: dev, buf: make([]byte, 64)}
	var err error
	if p.cm, err = cm.Open(dev, nil); err != nil { // the CM runs on dev's QP1
		panic(err)
	}
	pd, _ := dev.AllocPD()
	p.cq, _ = dev.CreateCQ(16)
	p.mr, _ = pd.RegMR(p.buf, verbs.AccessLocalWrite)
	p.qp, _ = pd.CreateQP(verbs.QPInitAttr{SendCQ: p.cq, RecvCQ: p.cq})
	return p
}

// An rdma_cm server and client: the server listens on port 7471 of
// RDMA_PS_TCP and accepts, the client dials with private data, a SEND
// crosses the connection the CM set up, and the client disconnects.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	la, lb := pipe.New(pipe.Config{}) // or udp.Open on two hosts
	da, _ := verbs.Open(la, nil)
	db, _ := verbs.Open(lb, nil)
	defer da.Close()
	defer db.Close()
	client, server := newPeer(da), newPeer(db)
	defer client.cm.Close()
	defer server.cm.Close()

	l, err := server.cm.Listen(cm.PortSpaceTCP, 7471)
	if err != nil {
		panic(err)
	}
	// The server's QP takes a receive before it is connected (INIT).
	server.qp.Init(verbs.AccessLocalWrite)
	server.qp.PostRecv(&verbs.RecvWR{ID: 1, SGL: []verbs.SGE{{Addr: server.mr.Addr(), Length: 64, LKey: server.mr.LKey()}}})
	accepted := make(chan *cm.Conn)
	go func() {
		req, err := l.Next(ctx)
		if err != nil {
			panic(err)
		}
		fmt.Printf("server: request from %v: %q\n", req.Remote, req.PrivateData[:5])
		conn, err := req.Accept(ctx, server.qp, nil) // QP to RTS, REP, then the RTU
		if err != nil {
			panic(err)
		}
		accepted <- conn
	}()

	conn, err := client.cm.Dial(ctx, server.cm.Local(), cm.PortSpaceTCP, 7471, client.qp,
		&cm.ConnParam{ResponderResources: 1, InitiatorDepth: 1, RetryCount: 7, RNRRetryCount: 7, PrivateData: []byte("hello")})
	if err != nil {
		panic(err)
	}
	sconn := <-accepted
	fmt.Println("client: connected, QP state", client.qp.State())

	copy(client.buf, "ping")
	client.qp.PostSend(&verbs.SendWR{ID: 2, Opcode: verbs.WRSend, Flags: verbs.SendSignaled,
		SGL: []verbs.SGE{{Addr: client.mr.Addr(), Length: 4, LKey: client.mr.LKey()}}})
	wc := make([]verbs.WC, 1)
	server.cq.Wait(ctx, wc)
	fmt.Printf("server: received %q\n", server.buf[:wc[0].ByteLen])

	conn.Disconnect(ctx) // DREQ, answered by a DREP
	<-sconn.Done()
	fmt.Println("server:", sconn.Err())

	// Nobody listens on port 1: the peer's CM answers REJ 8.
	_, err = client.cm.Dial(ctx, server.cm.Local(), cm.PortSpaceTCP, 1, client.newQP(), nil)
	fmt.Println("client:", errors.Is(err, cm.ErrNoListener))

	// Output:
	// server: request from 10.0.0.1: "hello"
	// client: connected, QP state RTS
	// server: received "ping"
	// server: cm: disconnected
	// client: true
}

func (p *peer) newQP() *verbs.QP {
	pd, _ := p.dev.AllocPD()
	qp, _ := pd.CreateQP(verbs.QPInitAttr{SendCQ: p.cq, RecvCQ: p.cq})
	return qp
}
