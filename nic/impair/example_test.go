package impair_test

import (
	"fmt"

	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/nic/impair"
	"github.com/softroce/softroce/nic/pipe"
)

// A lossy link: impairment parsed from the string a command-line flag
// would carry, wrapped around one end of a pipe. The seed makes the
// decisions repeatable.
func Example() {
	cfg, err := impair.Parse("loss=50%,seed=7")
	if err != nil {
		panic(err)
	}
	a, b := pipe.New(pipe.Config{})
	lossy := impair.Wrap(a, cfg)
	defer lossy.Close()
	defer b.Close()

	out := make([]nic.Packet, 100)
	for i := range out {
		out[i] = nic.Packet{Buf: make([]byte, 16), N: 16}
	}
	lossy.Send(out)
	c := lossy.Counters()
	fmt.Println(cfg, c.Packets, c.Dropped, b.Stats().TxPackets == 0)
	fmt.Println(c.Packets-c.Dropped == a.Stats().TxPackets)
	// Output:
	// loss=50%,seed=7 100 53 true
	// true
}
