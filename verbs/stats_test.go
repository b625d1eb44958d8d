package verbs

import (
	"bytes"
	"sync"
	"testing"

	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/internal/devsync"
	"github.com/softroce/softroce/nic"
)

// TestStatsAndPacketTrace: the device and QP counters and the packet trace
// see a 4-packet WRITE and its ACK; a nil trace stops tracing; a read of
// the target buffer through devsync is ordered after the responder's
// writes.
func TestStatsAndPacketTrace(t *testing.T) {
	a, b := openPair(t)
	var mu sync.Mutex
	dirs := map[byte]int{}
	a.SetPacketTrace(func(dir byte, p *nic.Packet) {
		mu.Lock()
		dirs[dir]++
		mu.Unlock()
	})
	pda, _ := a.AllocPD()
	pdb, _ := b.AllocPD()
	mra, _ := pda.RegMR(make([]byte, 4096), AccessLocalWrite)
	bufb := make([]byte, 4096)
	mrb, _ := pdb.RegMR(bufb, AccessLocalWrite|AccessRemoteWrite)
	p := connectPair(t, a, b, pda, pdb, &ConnectOptions{PathMTU: 1024})
	for i := range mra.Buf() {
		mra.Buf()[i] = byte(i*5 + 1)
	}
	write := func(id uint64) {
		t.Helper()
		if err := p.qa.PostSend(&SendWR{ID: id, Opcode: WRRDMAWrite, Flags: SendSignaled, RemoteAddr: mrb.Addr(), RKey: mrb.RKey(),
			SGL: []SGE{{Addr: mra.Addr(), Length: 4096, LKey: mra.LKey()}}}); err != nil {
			t.Fatal(err)
		}
		if wc := waitOne(t, p.ca, "WRITE completion"); wc.Status != cq.Success {
			t.Fatalf("WRITE: %v", wc.Status)
		}
	}
	write(1)
	var landed bool
	devsync.Run(b, func() { landed = bytes.Equal(bufb, mra.Buf()) })
	if !landed {
		t.Fatal("WRITE data did not land")
	}
	// The trace first: the engine counts a packet before it traces it, so
	// the counters read after cover at least what the trace saw.
	mu.Lock()
	tx, rx := dirs['T'], dirs['R']
	mu.Unlock()
	ds, qs := a.Stats(), p.qa.Stats()
	if ds.TxPackets < 4 || ds.RxPackets < 1 || qs.TxPackets < 4 || qs.RxPackets < 1 {
		t.Fatalf("requester counters after a 4-packet WRITE: device %+v, QP %+v", ds, qs)
	}
	if rs := b.Stats(); rs.RxPackets < 4 || rs.TxPackets < 1 {
		t.Fatalf("responder device counters %+v", rs)
	}
	if tx < 4 || rx < 1 || uint64(tx) > ds.TxPackets || uint64(rx) > ds.RxPackets {
		t.Fatalf("trace saw %d sent, %d received; counters say %d, %d", tx, rx, ds.TxPackets, ds.RxPackets)
	}
	a.SetPacketTrace(nil)
	write(2)
	mu.Lock()
	defer mu.Unlock()
	if dirs['T'] != tx || dirs['R'] != rx {
		t.Fatalf("trace still called after SetPacketTrace(nil): %v", dirs)
	}
	if a.Stats().TxPackets < ds.TxPackets+4 {
		t.Fatalf("device counters did not grow with the second WRITE: %+v then %+v", ds, a.Stats())
	}
}

// PSNs follows the requester's next PSN and the responder's expected one:
// a 4-packet WRITE moves both by 4 from the PSNs the QPs were given.
func TestPSNs(t *testing.T) {
	a, b := openPair(t)
	pda, _ := a.AllocPD()
	pdb, _ := b.AllocPD()
	mra, _ := pda.RegMR(make([]byte, 4096), AccessLocalWrite)
	mrb, _ := pdb.RegMR(make([]byte, 4096), AccessLocalWrite|AccessRemoteWrite)
	p := connectPair(t, a, b, pda, pdb, &ConnectOptions{PathMTU: 1024})
	if sq, _ := p.qa.PSNs(); sq != 100 {
		t.Fatalf("requester's sq PSN %d before sending, want 100 (its SQPSN)", sq)
	}
	if _, rq := p.qb.PSNs(); rq != 100 {
		t.Fatalf("responder's rq PSN %d before receiving, want 100", rq)
	}
	p.post(t, SendWR{Opcode: WRRDMAWrite, RemoteAddr: mrb.Addr(), RKey: mrb.RKey(), SGL: []SGE{{Addr: mra.Addr(), Length: 4096, LKey: mra.LKey()}}})
	if sq, _ := p.qa.PSNs(); sq != 104 {
		t.Errorf("requester's sq PSN %d after a 4-packet WRITE, want 104", sq)
	}
	if _, rq := p.qb.PSNs(); rq != 104 {
		t.Errorf("responder's rq PSN %d after a 4-packet WRITE, want 104", rq)
	}
}
