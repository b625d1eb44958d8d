package pipe

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/softroce/softroce/icrc"
	"github.com/softroce/softroce/nic"
)

// roce fills b with a SEND_ONLY-looking packet of n bytes (BTH, payload,
// room for the ICRC) carrying seq in its PSN and payload.
func roce(b []byte, n int, seq uint32) []byte {
	b = b[:n]
	clear(b)
	b[0] = 0x04 // RC SEND_ONLY
	binary.BigEndian.PutUint16(b[2:], 0xffff)
	binary.BigEndian.PutUint32(b[8:], seq&0xffffff)
	for i := 12; i < n-icrc.Len; i++ {
		b[i] = byte(int(seq) + i)
	}
	return b
}

func batch(n, size int) []nic.Packet {
	pkts := make([]nic.Packet, n)
	for i := range pkts {
		pkts[i].Buf = make([]byte, size)
	}
	return pkts
}

// ipv4Header builds the header a Linux UDP socket with IP_PMTUDISC_DO
// would put in front of a RoCE packet: ID 0, DF, TTL 64, real checksum.
func ipv4Header(src, dst netip.Addr, sport, dport uint16, roceLen int) (ip, udp []byte) {
	ip = make([]byte, 20)
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(20+8+roceLen))
	ip[6] = 0x40
	ip[8], ip[9] = 64, 17
	s, d := src.As4(), dst.As4()
	copy(ip[12:], s[:])
	copy(ip[16:], d[:])
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(ip[i:]))
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	binary.BigEndian.PutUint16(ip[10:], ^uint16(sum))
	udp = make([]byte, 8)
	binary.BigEndian.PutUint16(udp[0:], sport)
	binary.BigEndian.PutUint16(udp[2:], dport)
	binary.BigEndian.PutUint16(udp[4:], uint16(8+roceLen))
	return ip, udp
}

func TestExchange(t *testing.T) {
	a, b := New(Config{})
	defer a.Close()
	defer b.Close()
	addrA, addrB := a.Addrs()[0], b.Addrs()[0]
	if addrA != netip.MustParseAddr("10.0.0.1") || addrB != netip.MustParseAddr("10.0.0.2") {
		t.Fatalf("default addresses %v %v", addrA, addrB)
	}
	if a.MTU() != DefaultMTU || nic.IBMTU(a.MTU()) != 4096 {
		t.Fatalf("MTU %d, IB MTU %d", a.MTU(), nic.IBMTU(a.MTU()))
	}
	out := batch(8, 4200)
	for i := range out {
		out[i].N = len(roce(out[i].Buf, 16+i*500, uint32(i)))
		out[i].Remote = netip.AddrPortFrom(addrB, nic.RoCEv2Port)
		out[i].SrcPort = uint16(50000 + i)
	}
	if n, err := a.Send(out); n != len(out) || err != nil {
		t.Fatalf("Send = %d, %v", n, err)
	}
	in := batch(16, 4200)
	n, err := b.Recv(in)
	if err != nil || n != len(out) {
		t.Fatalf("Recv = %d, %v; want %d", n, err, len(out))
	}
	for i := 0; i < n; i++ {
		p, o := &in[i], &out[i]
		if string(p.Bytes()) != string(o.Bytes()) {
			t.Errorf("packet %d differs", i)
		}
		if p.Remote != netip.AddrPortFrom(addrA, o.SrcPort) || p.Local != addrB || p.ICRC != nic.ICRCVerified {
			t.Errorf("packet %d: remote %v local %v icrc %v", i, p.Remote, p.Local, p.ICRC)
		}
		// The ICRC Send wrote is the one a peer computes over the real
		// IPv4 header of a kernel UDP socket with IP_PMTUDISC_DO.
		ip, udp := ipv4Header(addrA, addrB, o.SrcPort, nic.RoCEv2Port, o.N)
		want, err := icrc.IPv4(ip, append(udp, o.Bytes()...))
		if err != nil || icrc.Wire(p.Bytes()) != want {
			t.Errorf("packet %d: ICRC %08x, real-header ICRC %08x (%v)", i, icrc.Wire(p.Bytes()), want, err)
		}
	}
	st := b.Stats()
	if st.RxPackets != 8 || st.RxICRCBad != 0 || a.Stats().TxPackets != 8 || a.Stats().TxBytes != st.RxBytes {
		t.Errorf("stats a %+v b %+v", a.Stats(), st)
	}
	// And back.
	out[0].Remote = netip.AddrPort{}
	out[0].SrcPort = 0
	if _, err := b.Send(out[:1]); err != nil {
		t.Fatal(err)
	}
	if n, err := a.Recv(in); n != 1 || err != nil || in[0].Remote != netip.AddrPortFrom(addrB, DefaultSrcPort) {
		t.Fatalf("back: %d %v %v", n, err, in[0].Remote)
	}
}

func TestIPv6(t *testing.T) {
	a, b := New(Config{AddrA: netip.MustParseAddr("fd00::1"), AddrB: netip.MustParseAddr("fd00::2"), MTU: 1500})
	defer a.Close()
	defer b.Close()
	out := batch(2, 1500)
	out[0].N = len(roce(out[0].Buf, 1500-48, 1))
	out[1].N = len(roce(out[1].Buf, 1500-47, 2)) // one byte too many for the MTU
	a.Send(out)
	in := batch(4, 1500)
	if n, err := b.Recv(in); n != 1 || err != nil || in[0].N != 1452 || in[0].Remote.Addr() != netip.MustParseAddr("fd00::1") {
		t.Fatalf("Recv = %d, %v, %+v", n, err, in[0].Remote)
	}
	if a.Stats().TxErrors != 1 {
		t.Errorf("oversize packet not counted: %+v", a.Stats())
	}
}

func TestBadICRCDropped(t *testing.T) {
	a, b := New(Config{})
	defer a.Close()
	defer b.Close()
	raw := a.(nic.RawSender)
	out := batch(3, 256)
	for i := range out {
		out[i].N = len(roce(out[i].Buf, 100, uint32(i)))
		if err := raw.PutICRC(&out[i]); err != nil {
			t.Fatal(err)
		}
	}
	out[0].Buf[20] ^= 0x01 // payload bit flipped after the ICRC: caught
	out[1].Buf[4] ^= 0x01  // resv8a is masked out of the ICRC: not caught
	if _, err := raw.SendRaw(out); err != nil {
		t.Fatal(err)
	}
	in := batch(4, 256)
	n, err := b.Recv(in)
	if err != nil || n != 2 {
		t.Fatalf("Recv = %d, %v; want 2", n, err)
	}
	if binary.BigEndian.Uint32(in[0].Buf[8:]) != 1 || binary.BigEndian.Uint32(in[1].Buf[8:]) != 2 {
		t.Errorf("wrong packets delivered")
	}
	if st := b.Stats(); st.RxICRCBad != 1 || st.RxPackets != 2 {
		t.Errorf("stats %+v", st)
	}
}

func TestRejects(t *testing.T) {
	a, b := New(Config{})
	defer a.Close()
	defer b.Close()
	out := batch(4, 64)
	for i := range out {
		out[i].N = 64
	}
	out[0].N = 15                                                             // shorter than BTH+ICRC
	out[1].Remote = netip.AddrPortFrom(netip.MustParseAddr("10.0.0.9"), 4791) // not the peer
	out[2].Local = netip.MustParseAddr("10.0.0.2")                            // not ours
	if err := a.(nic.RawSender).PutICRC(&out[1]); err == nil {
		t.Error("PutICRC to a stranger succeeded")
	}
	a.Send(out)
	if st := a.Stats(); st.TxErrors != 3 || st.TxPackets != 1 {
		t.Errorf("stats %+v", st)
	}
	in := batch(4, 64)
	if n, _ := b.Recv(in); n != 1 {
		t.Errorf("Recv %d", n)
	}
}

func TestTruncated(t *testing.T) {
	a, b := New(Config{})
	defer a.Close()
	defer b.Close()
	out := batch(2, 512)
	out[0].N = len(roce(out[0].Buf, 512, 1))
	out[1].N = len(roce(out[1].Buf, 100, 2))
	a.Send(out)
	in := batch(2, 256)
	if n, err := b.Recv(in); n != 1 || err != nil || in[0].N != 100 {
		t.Fatalf("Recv = %d %v", n, err)
	}
	if b.Stats().RxTruncated != 1 {
		t.Errorf("stats %+v", b.Stats())
	}
}

func TestQueueFullDrops(t *testing.T) {
	a, b := New(Config{Depth: 4})
	defer a.Close()
	defer b.Close()
	out := batch(10, 64)
	for i := range out {
		out[i].N = len(roce(out[i].Buf, 64, uint32(i)))
	}
	if n, err := a.Send(out); n != 10 || err != nil {
		t.Fatalf("Send = %d, %v", n, err)
	}
	if st := a.Stats(); st.TxErrors != 6 || st.TxPackets != 4 {
		t.Errorf("stats %+v", st)
	}
	in := batch(10, 64)
	if n, _ := b.Recv(in); n != 4 || binary.BigEndian.Uint32(in[3].Buf[8:]) != 3 {
		t.Errorf("Recv %d", n)
	}
}

func TestCloseUnblocks(t *testing.T) {
	a, b := New(Config{})
	errc := make(chan error, 1)
	go func() {
		_, err := b.Recv(batch(1, 64))
		errc <- err
	}()
	time.Sleep(10 * time.Millisecond)
	b.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Recv after Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Recv still blocked after Close")
	}
	if _, err := b.Send(batch(1, 64)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Send after Close: %v", err)
	}
	// The peer's sends to a closed side vanish, counted.
	out := batch(1, 64)
	out[0].N = 64
	if _, err := a.Send(out); err != nil || a.Stats().TxErrors != 1 {
		t.Errorf("send to closed peer: %v %+v", err, a.Stats())
	}
	a.Close()
	a.Close() // idempotent
}

// TestConcurrentBlocking streams packets through a small blocking queue
// from one goroutine while another receives: order and content survive,
// nothing is dropped (run with -race).
func TestConcurrentBlocking(t *testing.T) {
	a, b := New(Config{Depth: 8, Block: true})
	defer b.Close()
	const total = 5000
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		out := batch(7, 1024)
		for seq := 0; seq < total; {
			k := min(len(out), total-seq)
			for i := 0; i < k; i++ {
				out[i].N = len(roce(out[i].Buf, 16+(seq+i)%1000, uint32(seq+i)))
			}
			if _, err := a.Send(out[:k]); err != nil {
				t.Error(err)
				return
			}
			seq += k
		}
	}()
	in := batch(5, 1024)
	want := make([]byte, 1024)
	for seq := 0; seq < total; {
		n, err := b.Recv(in)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < n; i++ {
			w := roce(want, 16+seq%1000, uint32(seq))
			if string(in[i].Buf[:in[i].N-icrc.Len]) != string(w[:len(w)-icrc.Len]) {
				t.Fatalf("packet %d differs", seq)
			}
			seq++
		}
	}
	wg.Wait()
	a.Close()
	if st := a.Stats(); st.TxPackets != total || st.TxErrors != 0 {
		t.Errorf("stats %+v", st)
	}
}

func TestNoAllocs(t *testing.T) {
	a, b := New(Config{})
	defer a.Close()
	defer b.Close()
	out, in := batch(32, 4200), batch(32, 4200)
	for i := range out {
		out[i].N = len(roce(out[i].Buf, 4096+28, uint32(i)))
	}
	allocs := testing.AllocsPerRun(100, func() {
		a.Send(out)
		for got := 0; got < len(out); {
			n, err := b.Recv(in)
			if err != nil {
				t.Fatal(err)
			}
			got += n
		}
	})
	// Whatever icrc.Synth itself allocates is the icrc package's business
	// (and tested there); the pipe must add nothing on top of it.
	var h icrc.Header
	h.Src, h.Dst = make([]byte, 4), make([]byte, 4)
	perICRC := testing.AllocsPerRun(100, func() { icrc.Synth(&h, out[0].Bytes()) })
	if limit := perICRC * float64(2*len(out)); allocs > limit {
		t.Errorf("%v allocations per batch of %d, icrc.Synth accounts for %v", allocs, len(out), limit)
	}
}

func BenchmarkSendRecv4K(b *testing.B) {
	x, y := New(Config{})
	defer x.Close()
	defer y.Close()
	out, in := batch(32, 4200), batch(32, 4200)
	for i := range out {
		out[i].N = len(roce(out[i].Buf, 4096+28, uint32(i)))
	}
	b.SetBytes(int64(len(out) * out[0].N))
	b.ReportAllocs()
	for b.Loop() {
		x.Send(out)
		for got := 0; got < len(out); {
			n, _ := y.Recv(in)
			got += n
		}
	}
}

func TestBadConfigPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("mixed families did not panic")
		}
	}()
	New(Config{AddrA: netip.MustParseAddr("10.0.0.1"), AddrB: netip.MustParseAddr("fd00::2")})
}

// TestTClass: the traffic class (DSCP and ECN bits) a packet is sent with
// is the one it is received with, so CE marks made on the way arrive; a
// received packet never keeps the TClass its buffer had before.
func TestTClass(t *testing.T) {
	tests := []struct {
		name string
		tc   uint8
	}{
		{"not ECT", 0x00},
		{"ECT(0)", 0x02},
		{"ECT(1)", 0x01},
		{"CE", 0x03},
		{"DSCP 26, ECT(0)", 26<<2 | 0x02},
		{"DSCP 46, CE", 46<<2 | 0x03},
	}
	for _, v6 := range []bool{false, true} {
		cfg := Config{}
		if v6 {
			cfg.AddrA, cfg.AddrB = netip.MustParseAddr("fd00::1"), netip.MustParseAddr("fd00::2")
		}
		a, b := New(cfg)
		out, in := batch(len(tests), 256), batch(len(tests), 256)
		for i, tt := range tests {
			out[i].N = len(roce(out[i].Buf, 64, uint32(i)))
			out[i].TClass = tt.tc
			in[i].TClass = 0xff // stale: must be overwritten
		}
		if _, err := a.Send(out); err != nil {
			t.Fatal(err)
		}
		for got := 0; got < len(tests); {
			n, err := b.Recv(in[got:])
			if err != nil {
				t.Fatal(err)
			}
			got += n
		}
		for i, tt := range tests {
			if in[i].TClass != tt.tc || in[i].ICRC != nic.ICRCVerified {
				t.Errorf("v6 %v, %s: received TClass %#02x (ICRC %v), sent %#02x", v6, tt.name, in[i].TClass, in[i].ICRC, tt.tc)
			}
		}
		a.Close()
		b.Close()
	}
}
