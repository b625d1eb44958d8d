package inspect_test

import (
	"fmt"
	"net/netip"
	"os"

	"github.com/gopacket/gopacket"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/inspect"
)

// Decode one synthetic frame and print its line.
func ExampleDecode() {
	frame, err := inspect.BuildFrame(&inspect.FrameSpec{
		Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"),
		Fields: bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCWriteOnly, PKey: 0xffff, DestQP: 0x11, PSN: 7, AckReq: true},
			VA: 0x1000, RKey: 0x42, DMALen: 5},
		Payload: []byte("hello"),
	})
	if err != nil {
		panic(err)
	}
	r := inspect.Decode(frame, gopacket.CaptureInfo{})
	r.Frame = 1
	fmt.Println(inspect.Line(&r))
	// Output:
	//     1 00:00:00.000000 10.0.0.1:49152 > 10.0.0.2:4791 RoCEv2 RC RDMA_WRITE_ONLY qp 0x000011 psn 7 A va 0x1000 rkey 0x00000042 dmalen 5 len 5 icrc ok
}

// Read a capture and summarise it.
func ExampleWalk() {
	z := inspect.NewSummarizer("")
	err := inspect.Walk("testdata/synthetic.pcapng", func(r *inspect.Record) error {
		z.Add(r)
		return nil
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return
	}
	s := z.Summary()
	fmt.Printf("%d frames, %d RoCE: %d ok, %d bad, %d truncated; %d connections\n",
		s.Frames, s.RoCE, s.ICRCOK, s.ICRCBad, s.ICRCTruncated, len(s.Connections))
	// Output:
	// 13 frames, 12 RoCE: 10 ok, 1 bad, 1 truncated; 4 connections
}
