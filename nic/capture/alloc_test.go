package capture_test

import (
	"net/netip"
	"testing"

	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/nic/capture"
)

var nullAddrs = []netip.Addr{netip.MustParseAddr("10.0.0.1")}

// nullLink is a RawSender that sends nowhere.
type nullLink struct{}

func (nullLink) Recv([]nic.Packet) (int, error)      { select {} }
func (nullLink) Send(p []nic.Packet) (int, error)    { return len(p), nil }
func (nullLink) SendRaw(p []nic.Packet) (int, error) { return len(p), nil }
func (nullLink) PutICRC(*nic.Packet) error           { return nil }
func (nullLink) BatchSize() int                      { return 32 }
func (nullLink) MTU() int                            { return 1500 }
func (nullLink) Addrs() []netip.Addr                 { return nullAddrs }
func (nullLink) Stats() nic.Stats                    { return nic.Stats{} }
func (nullLink) Close() error                        { return nil }

func batch() []nic.Packet {
	pkts := make([]nic.Packet, 32)
	for i := range pkts {
		pkts[i] = nic.Packet{Buf: make([]byte, 1100), N: 1100, Remote: netip.MustParseAddrPort("10.0.0.2:4791"), SrcPort: 0xc001}
	}
	return pkts
}

// TestNoAllocation checks that capturing allocates nothing per packet
// once warmed up: frames are built in one reused buffer.
func TestNoAllocation(t *testing.T) {
	var n int
	c := capture.Wrap(nullLink{}, capture.Options{OnPacket: func(ev *capture.Event) { n += len(ev.Frame) }})
	pkts := batch()
	c.Send(pkts)
	if a := testing.AllocsPerRun(100, func() { c.Send(pkts) }); a != 0 {
		t.Errorf("%.1f allocations per batch of 32", a)
	}
	if n == 0 {
		t.Error("callback saw nothing")
	}
}

func BenchmarkCaptureSend(b *testing.B) {
	c := capture.Wrap(nullLink{}, capture.Options{OnPacket: func(*capture.Event) {}})
	pkts := batch()
	b.SetBytes(int64(len(pkts) * 1100))
	b.ReportAllocs()
	for b.Loop() {
		c.Send(pkts)
	}
}
