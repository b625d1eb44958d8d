package capture_test

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/gopacket/gopacket"

	"github.com/softroce/softroce/inspect"
	"github.com/softroce/softroce/nic/capture"
	"github.com/softroce/softroce/nic/pipe"
	"github.com/softroce/softroce/verbs"
)

// TestWriteCaptured runs an RDMA WRITE over a captured pipe and checks
// that every packet is reported once per direction, decodes as RoCEv2 with
// a good ICRC, and that the pcap file reads back through package inspect.
func TestWriteCaptured(t *testing.T) {
	la, lb := pipe.New(pipe.Config{})
	path := filepath.Join(t.TempDir(), "w.pcap")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	pw, err := capture.NewPcapWriter(f)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var recs []inspect.Record
	var rx int
	onPkt := func(ev *capture.Event) {
		mu.Lock()
		defer mu.Unlock()
		if ev.Dir == capture.Rx {
			rx++
			return
		}
		r := inspect.Decode(bytes.Clone(ev.Frame), gopacket.CaptureInfo{Timestamp: ev.Time, Length: len(ev.Frame), CaptureLength: len(ev.Frame)})
		recs = append(recs, r)
	}
	ca := capture.Wrap(la, capture.Options{OnPacket: onPkt, Pcap: pw})
	cb := capture.Wrap(lb, capture.Options{OnPacket: onPkt, Pcap: pw, Dirs: capture.Tx})
	da, err := verbs.Open(ca, nil)
	if err != nil {
		t.Fatal(err)
	}
	db, err := verbs.Open(cb, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer da.Close()
	defer db.Close()

	mk := func(d *verbs.Device) (*verbs.QP, *verbs.MR, *verbs.CQ, []byte) {
		pd, _ := d.AllocPD()
		buf := make([]byte, 4096)
		mr, err := pd.RegMR(buf, verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
		if err != nil {
			t.Fatal(err)
		}
		c, _ := d.CreateCQ(16)
		qp, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: c, RecvCQ: c})
		if err != nil {
			t.Fatal(err)
		}
		return qp, mr, c, buf
	}
	qa, mra, cqa, bufa := mk(da)
	qb, mrb, _, bufb := mk(db)
	ga, _ := da.QueryGID(0)
	gb, _ := db.QueryGID(0)
	if err := qa.Connect(verbs.RemoteInfo{QPN: qb.Num(), PSN: 100, GID: gb}, &verbs.ConnectOptions{SQPSN: 7}); err != nil {
		t.Fatal(err)
	}
	if err := qb.Connect(verbs.RemoteInfo{QPN: qa.Num(), PSN: 7, GID: ga}, &verbs.ConnectOptions{SQPSN: 100}); err != nil {
		t.Fatal(err)
	}
	copy(bufa, bytes.Repeat([]byte("capture!"), 300)) // 2400 bytes: 3 packets at PMTU 1024
	if err := qa.PostSend(&verbs.SendWR{ID: 1, Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled,
		SGL: []verbs.SGE{{Addr: mra.Addr(), Length: 2400, LKey: mra.LKey()}}, RemoteAddr: mrb.Addr(), RKey: mrb.RKey()}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	wc := make([]verbs.WC, 1)
	if _, err := cqa.Wait(ctx, wc); err != nil || wc[0].Status.String() != "success" {
		t.Fatalf("completion %+v, %v", wc[0], err)
	}
	if !bytes.Equal(bufb[:2400], bufa[:2400]) {
		t.Fatal("remote memory differs")
	}
	da.Close()
	db.Close()
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}

	mu.Lock()
	defer mu.Unlock()
	// A sends WRITE_FIRST, MIDDLE, LAST; B sends one ACK.
	var names []string
	for _, r := range recs {
		if !r.RoCE || r.ICRC != "ok" || r.Malformed != "" {
			t.Errorf("record %+v: want RoCE with a good ICRC", r)
		}
		names = append(names, r.OpcodeName)
	}
	want := []string{"RC RDMA_WRITE_FIRST", "RC RDMA_WRITE_MIDDLE", "RC RDMA_WRITE_LAST", "RC ACKNOWLEDGE"}
	if len(names) != len(want) {
		t.Fatalf("captured %q, want %q", names, want)
	}
	for i := range want {
		if names[i] != want[i] {
			t.Errorf("packet %d: %q, want %q", i, names[i], want[i])
		}
	}
	if recs[0].Src != netip.MustParseAddr("10.0.0.1") || recs[0].PSN != 7 || recs[0].RETH == nil || recs[0].RETH.DMALen != 2400 {
		t.Errorf("first packet %+v", recs[0])
	}
	if rx != 1 {
		t.Errorf("A received %d packets, want the 1 ACK", rx)
	}
	// The pcap has what both sides sent, plus the ACK again as A
	// received it (A captures both directions), and inspect verifies it.
	got, err := inspect.Records(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 5 || pw.Packets() != 5 {
		t.Fatalf("pcap has %d records (%d written), want 5", len(got), pw.Packets())
	}
	for _, r := range got {
		if r.ICRC != "ok" {
			t.Errorf("pcap frame %d: ICRC %s", r.Frame, r.ICRC)
		}
	}
}

// TestAppendFrameFamilies checks that mixed address families are refused
// and that an IPv6 frame decodes.
func TestAppendFrameFamilies(t *testing.T) {
	roce := make([]byte, 12+4)
	roce[0] = 0x11 // RC ACK needs an AETH: this is deliberately short
	if _, err := capture.AppendFrame(nil, netip.MustParseAddrPort("10.0.0.1:1"), netip.MustParseAddrPort("[fe80::1]:4791"), roce); err == nil {
		t.Error("mixed families accepted")
	}
	fr, err := capture.AppendFrame(nil, netip.MustParseAddrPort("[fd00::1]:49152"), netip.MustParseAddrPort("[fd00::2]:4791"), roce)
	if err != nil {
		t.Fatal(err)
	}
	if len(fr) != 14+40+8+len(roce) {
		t.Errorf("IPv6 frame is %d bytes", len(fr))
	}
	r := inspect.Decode(fr, gopacket.CaptureInfo{Length: len(fr), CaptureLength: len(fr)})
	if !r.RoCE || r.Dst != netip.MustParseAddr("fd00::2") {
		t.Errorf("IPv6 frame decodes as %+v", r)
	}
}

// TestAppendFrameMACs: each endpoint has its own MAC, derived from its IP
// address, so the two directions of a conversation swap them (a capture's
// Ethernet conversations then match its IP ones).
func TestAppendFrameMACs(t *testing.T) {
	roce := make([]byte, 16)
	for _, c := range []struct{ a, b, macA, macB string }{
		{"10.0.0.1:49152", "10.0.0.2:4791", "02:00:0a:00:00:01", "02:00:0a:00:00:02"},
		{"[fd00::1]:49152", "[fd00::2:3]:4791", "02:00:00:00:00:01", "02:00:00:02:00:03"},
	} {
		a, b := netip.MustParseAddrPort(c.a), netip.MustParseAddrPort(c.b)
		ab, err := capture.AppendFrame(nil, a, b, roce)
		if err != nil {
			t.Fatal(err)
		}
		ba, err := capture.AppendFrame(nil, b, a, roce)
		if err != nil {
			t.Fatal(err)
		}
		mac := func(b []byte) string { return net.HardwareAddr(b).String() }
		if mac(ab[6:12]) != c.macA || mac(ab[0:6]) != c.macB || mac(ba[6:12]) != c.macB || mac(ba[0:6]) != c.macA {
			t.Errorf("%s > %s: dst %s src %s; back: dst %s src %s; want %s for %s and %s for %s",
				c.a, c.b, mac(ab[0:6]), mac(ab[6:12]), mac(ba[0:6]), mac(ba[6:12]), c.macA, c.a, c.macB, c.b)
		}
		if ab[0]&1 != 0 || ab[0]&2 == 0 {
			t.Errorf("MAC %s is not a locally administered unicast one", mac(ab[0:6]))
		}
	}
}
