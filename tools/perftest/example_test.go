package perftest_test

import (
	"context"
	"fmt"
	"io"
	"net/netip"

	"github.com/softroce/softroce/nic/udp"
	"github.com/softroce/softroce/tools/perftest"
	"github.com/softroce/softroce/verbs"
)

// Both roles of an ib_write_bw session in one process, over kernel UDP
// sockets on 127.0.0.1. Against real perftest, one side is ib_write_bw:
// `ib_write_bw -d rxe0 -x 1` as server with softroce as client, or the
// other way round.
func ExampleRun() {
	open := func(port int) *verbs.Device {
		l, err := udp.Open(udp.Config{Addr: netip.MustParseAddr("127.0.0.1"), Port: port})
		if err != nil {
			panic(err)
		}
		d, err := verbs.Open(l, nil)
		if err != nil {
			panic(err)
		}
		return d
	}
	server, client := open(47881), open(47882)
	defer server.Close()
	defer client.Close()

	cfg := perftest.Config{Test: perftest.Write, Port: 47883, Size: 4096, Iters: 100, MTU: 1024}
	done := make(chan *perftest.Result)
	go func() {
		c := cfg
		c.RemotePort = 47882 // the client's UDP port (both share 127.0.0.1)
		res, err := perftest.Run(context.Background(), server, c, io.Discard)
		if err != nil {
			panic(err)
		}
		done <- res
	}()
	c := cfg
	c.Server, c.RemotePort = "127.0.0.1", 47881
	res, err := perftest.Run(context.Background(), client, c, io.Discard)
	if err != nil {
		panic(err)
	}
	sres := <-done
	fmt.Println("peer version:", res.PeerVersion, "MTU:", res.MTU)
	fmt.Println("client sent:", res.Report.Iters, "x", res.Report.Size, "bytes")
	fmt.Println("server saw the client's report:", sres.Report == res.Report)
	fmt.Println("server check:", sres.Checked)
	// Output:
	// peer version: 6.06 MTU: 1024
	// client sent: 100 x 4096 bytes
	// server saw the client's report: true
	// server check: 1 write slots written, no byte outside them changed
}
