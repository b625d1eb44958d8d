package icrc_test

import (
	"fmt"
	"net/netip"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/icrc"
	"github.com/softroce/softroce/inspect"
)

// Check a frame: a CNP, then the same frame with one bit flipped and with
// its ECN bits set (which the ICRC does not cover).
func ExampleCheckFrame() {
	frame, err := inspect.BuildFrame(&inspect.FrameSpec{
		Src: netip.MustParseAddr("10.0.17.1"), Dst: netip.MustParseAddr("10.0.18.1"),
		Fields:  bth.Fields{BTH: bth.BTHFields{Opcode: bth.CNP, PKey: 0xffff, DestQP: 0x118, BECN: true}},
		Payload: make([]byte, bth.CNPPayloadLen),
	})
	if err != nil {
		panic(err)
	}
	r, err := icrc.CheckFrame(frame)
	if err != nil {
		panic(err)
	}
	fmt.Printf("%v, BTH at %d, packet ends at %d, ICRC %s\n", r.Kind, r.BTH, r.End, r.Status)
	frame[60] ^= 1 // a bit of the CNP's reserved payload
	r, _ = icrc.CheckFrame(frame)
	fmt.Println("after a bit flip:", r.Status)
	frame[60] ^= 1
	frame[15] |= 3 // ECN CE, set by a switch
	r, _ = icrc.CheckFrame(frame)
	fmt.Println("after CE marking:", r.Status)
	// Output:
	// RoCEv2, BTH at 42, packet ends at 74, ICRC ok
	// after a bit flip: bad
	// after CE marking: ok
}
