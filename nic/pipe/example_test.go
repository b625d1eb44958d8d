package pipe_test

import (
	"fmt"

	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/nic/pipe"
)

// Two ends of a pipe exchange a RoCE packet; the ICRC is filled on send
// and verified on receive.
func Example() {
	a, b := pipe.New(pipe.Config{})
	defer a.Close()
	defer b.Close()

	pkt := make([]byte, 12+5+3+4) // BTH, payload, pad, ICRC
	pkt[0] = 0x04                 // RC SEND_ONLY
	pkt[1] = 3 << 4               // PadCnt 3
	copy(pkt[12:], "hello")
	out := []nic.Packet{{Buf: pkt, N: len(pkt)}}
	a.Send(out)

	in := []nic.Packet{{Buf: make([]byte, 4096)}}
	n, _ := b.Recv(in)
	fmt.Println(n, in[0].N, string(in[0].Buf[12:17]), in[0].Remote.Addr(), in[0].ICRC)
	// Output: 1 24 hello 10.0.0.1 verified
}
