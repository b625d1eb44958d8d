package cq_test

import (
	"context"
	"fmt"
	"time"

	"github.com/softroce/softroce/cq"
)

// The event-driven pattern of ibv_rc_pingpong -e: arm, sleep on the
// completion channel, re-arm, then poll until empty.
func Example() {
	c, _ := cq.New(16)
	c.ReqNotify(false)
	go func() {
		c.Push(cq.WC{WRID: 7, Status: cq.Success, Opcode: cq.OpRDMAWrite})
		c.Push(cq.WC{WRID: 8, Status: cq.RemAccessErr, Opcode: cq.OpRDMARead})
	}()
	<-c.Notify()
	c.ReqNotify(false)
	wcs := make([]cq.WC, 4)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for seen := 0; seen < 2; {
		n, err := c.Wait(ctx, wcs)
		if err != nil {
			fmt.Println(err)
			return
		}
		for _, wc := range wcs[:n] {
			fmt.Printf("wr_id %d %v: %v\n", wc.WRID, wc.Opcode, wc.Status)
		}
		seen += n
	}
	// Output:
	// wr_id 7 RDMA_WRITE: success
	// wr_id 8 RDMA_READ: remote access error
}
