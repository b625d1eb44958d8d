package congest_test

import (
	"fmt"
	"time"

	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/nic/congest"
	"github.com/softroce/softroce/nic/pipe"
)

// A 1 Gb/s bottleneck around one end of a pipe, on a clock the example
// moves by hand: ten ECN-capable 1000-byte packets sent at once queue up,
// the later ones are marked CE (from the 6th on surely, the 4th and 5th
// by chance), and each reaches the pipe only once it has left the
// bottleneck (8 us per packet at 1 Gb/s).
func Example() {
	cfg, err := congest.Parse("rate=1G,queue=64KB,kmin=2KB,kmax=5KB,pmax=100%,seed=7")
	if err != nil {
		panic(err)
	}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a, b := pipe.New(pipe.Config{})
	l, err := congest.WrapClock(a, cfg, func() time.Time { return now })
	if err != nil {
		panic(err)
	}
	defer l.Close()
	defer b.Close()

	out := make([]nic.Packet, 10)
	for i := range out {
		out[i] = nic.Packet{Buf: make([]byte, 1000), N: 1000, TClass: congest.ECT0}
	}
	l.Send(out)
	now = now.Add(20 * time.Microsecond)
	next, _ := l.Pump()
	c := l.Counters()
	fmt.Println(cfg)
	fmt.Println("sent by 20us:", a.Stats().TxPackets, "next leaves at", next.Sub(now)+20*time.Microsecond)
	fmt.Println("enqueued", c.Enqueued, "marked", c.Marked, "dropped", c.Dropped, "max queue", c.MaxQueue)
	// Output:
	// rate=1e+09,queue=64000,kmin=2000,kmax=5000,pmax=1,seed=7
	// sent by 20us: 2 next leaves at 24µs
	// enqueued 10 marked 6 dropped 0 max queue 10000
}
