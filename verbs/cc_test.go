package verbs

import (
	"sync/atomic"
	"testing"

	"github.com/softroce/softroce/cc/dcqcn"
	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/nic/congest"
	"github.com/softroce/softroce/nic/pipe"
)

// TestCCOptions: Options.CC turns DCQCN on for a device's RC QPs,
// ConnectOptions.CC overrides it per QP, and a QP with it on sends
// ECN-capable packets while one without sends the address vector's class.
func TestCCOptions(t *testing.T) {
	la, lb := pipe.New(pipe.Config{MTU: 1500})
	prm := dcqcn.Default(10e9)
	a, err := Open(la, &Options{CC: &prm})
	if err != nil {
		t.Fatal(err)
	}
	b, err := Open(lb, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	bad := prm
	bad.G = 0
	if _, err := Open(la, &Options{CC: &bad}); err == nil {
		t.Error("Open accepted DCQCN parameters with g = 0")
	}
	var tc [4]atomic.Uint64 // packets a sent, by ECN codepoint
	a.SetPacketTrace(func(dir byte, p *nic.Packet) {
		if dir == 'T' {
			tc[p.TClass&3].Add(1)
		}
	})
	pda, _ := a.AllocPD()
	pdb, _ := b.AllocPD()
	mra, _ := pda.RegMR(make([]byte, 4096), AccessLocalWrite)
	mrb, _ := pdb.RegMR(make([]byte, 4096), AccessLocalWrite|AccessRemoteWrite)
	write := func(p rcPair) {
		t.Helper()
		if err := p.qa.PostSend(&SendWR{ID: 1, Opcode: WRRDMAWrite, Flags: SendSignaled, RemoteAddr: mrb.Addr(), RKey: mrb.RKey(),
			SGL: []SGE{{Addr: mra.Addr(), Length: 4096, LKey: mra.LKey()}}}); err != nil {
			t.Fatal(err)
		}
		if wc := waitOne(t, p.ca, "WRITE completion"); wc.Status != cq.Success {
			t.Fatalf("WRITE: %v", wc.Status)
		}
	}
	for _, c := range []struct {
		mode   CCMode
		aOn    bool // the device's setting or the mode's
		bOn    bool
		wantTC uint8
	}{
		{CCDevice, true, false, 0b10},
		{CCNone, false, false, 0b00},
		{CCDCQCN, true, true, 0b10},
	} {
		for i := range tc {
			tc[i].Store(0)
		}
		p := connectPair(t, a, b, pda, pdb, &ConnectOptions{PathMTU: 1024, CC: c.mode})
		if ea, eb := p.qa.Stats().CC.Enabled, p.qb.Stats().CC.Enabled; ea != c.aOn || eb != c.bOn {
			t.Errorf("CC %v: enabled on a %v, on b %v; want %v, %v", c.mode, ea, eb, c.aOn, c.bOn)
		}
		write(p)
		if n := tc[c.wantTC].Load(); n < 4 || tc[0].Load()+tc[1].Load()+tc[2].Load()+tc[3].Load() != n {
			t.Errorf("CC %v: packets by ECN codepoint %d %d %d %d, want every one %02b", c.mode, tc[0].Load(), tc[1].Load(), tc[2].Load(), tc[3].Load(), c.wantTC)
		}
		if r := p.qa.Stats().CC.RateBPS; c.aOn && r != prm.LineRate {
			t.Errorf("CC %v: rate %g without congestion, want the line rate", c.mode, r)
		}
	}
	if m, err := ParseCCMode("dcqcn"); err != nil || m != CCDCQCN {
		t.Errorf("ParseCCMode(dcqcn) = %v, %v", m, err)
	}
	if _, err := ParseCCMode("reno"); err == nil {
		t.Error("ParseCCMode accepted reno")
	}
}

// TestCCBottleneck: a device with DCQCN sending through a 100 Mb/s
// ECN-marking bottleneck on the wall clock: the receiver answers marks
// with CNPs, the sender cuts its rate, nothing is dropped, every WRITE
// completes. The queue holds one requester window (512 KiB at path MTU
// 1024): the QP's first window reaches the queue whole before any CNP
// can come back through it (the queue peaks at the window's size).
func TestCCBottleneck(t *testing.T) {
	la, lb := pipe.New(pipe.Config{MTU: 1500, Depth: 4096})
	neck, err := congest.Wrap(la, congest.Config{Rate: 100e6, Queue: 1 << 20, Kmin: 8 << 10, Kmax: 64 << 10, Pmax: 1, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	prm := dcqcn.Default(1e9)
	prm.MinRate = 10e6
	a, err := Open(neck, &Options{CC: &prm})
	if err != nil {
		t.Fatal(err)
	}
	b, err := Open(lb, &Options{CC: &prm})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	pda, _ := a.AllocPD()
	pdb, _ := b.AllocPD()
	const size, n = 64 << 10, 16 // 1 MiB: about 85 ms at 100 Mb/s
	mra, _ := pda.RegMR(make([]byte, size), AccessLocalWrite)
	mrb, _ := pdb.RegMR(make([]byte, size), AccessLocalWrite|AccessRemoteWrite)
	p := connectPair(t, a, b, pda, pdb, &ConnectOptions{PathMTU: 1024})
	for i := 0; i < n; i++ {
		if err := p.qa.PostSend(&SendWR{ID: uint64(i), Opcode: WRRDMAWrite, Flags: SendSignaled, RemoteAddr: mrb.Addr(), RKey: mrb.RKey(),
			SGL: []SGE{{Addr: mra.Addr(), Length: size, LKey: mra.LKey()}}}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < n; i++ {
		if wc := waitOne(t, p.ca, "WRITE completion"); wc.Status != cq.Success {
			t.Fatalf("WRITE %d: %v", i, wc.Status)
		}
	}
	nc, as, bs, qs := neck.Counters(), a.Stats().CC, b.Stats().CC, p.qa.Stats().CC
	t.Logf("bottleneck %+v; sender %+v; receiver %+v; QP %+v", nc, as, bs, qs)
	if nc.Dropped != 0 {
		t.Errorf("bottleneck dropped %d packets", nc.Dropped)
	}
	if nc.Marked == 0 || bs.NPECNMarkedRoCEPackets == 0 || bs.NPCNPSent == 0 || as.RPCNPHandled == 0 {
		t.Errorf("marks %d; receiver %+v; sender %+v: want marks, CNPs sent and handled", nc.Marked, bs, as)
	}
	// The rate itself is back near line rate by now (DCQCN recovers in
	// milliseconds once the CNPs stop): what stays is the time held.
	if qs.RateLimitedNS == 0 || qs.CNPHandled != as.RPCNPHandled {
		t.Errorf("sender QP %+v: want time rate-limited and its CNPs", qs)
	}
}
