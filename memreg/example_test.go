package memreg_test

import (
	"errors"
	"fmt"

	"github.com/softroce/softroce/memreg"
)

// A responder executes an RDMA WRITE and then a READ against a region, and
// rejects a WRITE into a region registered for remote read only.
func Example() {
	tab := memreg.NewTable(memreg.Limits{})
	pd, _ := tab.AllocPD()
	buf := make([]byte, 16)
	mr, _ := tab.RegMR(pd, buf, memreg.AccessLocalWrite|memreg.AccessRemoteWrite|memreg.AccessRemoteRead)

	// What a WRITE packet carries in its RETH: rkey, VA; the payload follows.
	if err := tab.RemoteWrite(pd, mr.RKey(), mr.Addr()+4, []byte("RoCE")); err != nil {
		fmt.Println(err)
	}
	got := make([]byte, 4)
	_ = tab.RemoteRead(pd, mr.RKey(), mr.Addr()+4, got)
	fmt.Printf("%s\n", got)

	ro, _ := tab.RegMR(pd, make([]byte, 16), memreg.AccessRemoteRead)
	err := tab.RemoteWrite(pd, ro.RKey(), ro.Addr(), []byte("x"))
	var ae *memreg.AccessError
	if errors.As(err, &ae) {
		// Class decides the NAK: remote access error, syndrome 0x62.
		fmt.Println(ae.Class, "/", ae.Reason)
	}
	// Output:
	// RoCE
	// remote access error / missing permission REMOTE_WRITE
}
