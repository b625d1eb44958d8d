package qpstate_test

import (
	"fmt"

	"github.com/softroce/softroce/qpstate"
)

// Bringing an RC QP from RESET to RTS the way ibv_rc_pingpong does, and the
// error for an RTR transition that forgot two attributes.
func Example() {
	attr := &qpstate.Attr{State: qpstate.Init, Port: 1, AccessFlags: 0x7}
	s, _ := qpstate.Modify(qpstate.RC, qpstate.Reset,
		qpstate.AttrState|qpstate.AttrPKeyIndex|qpstate.AttrPort|qpstate.AttrAccessFlags, attr)
	fmt.Println(s)

	attr = &qpstate.Attr{State: qpstate.RTR, PathMTU: 1024, DestQPN: 0x11, RQPSN: 0x123456,
		MaxDestRDAtomic: 1, MinRNRTimer: 12}
	_, err := qpstate.Modify(qpstate.RC, s,
		qpstate.AttrState|qpstate.AttrAV|qpstate.AttrDestQPN|qpstate.AttrMaxDestRDAtomic, attr)
	fmt.Println(err)
	// Output:
	// INIT
	// qpstate: RC INIT->RTR: missing required attribute(s) PATH_MTU|RQ_PSN|MIN_RNR_TIMER
}
