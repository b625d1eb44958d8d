package demo

import (
	"bytes"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/pcapgo"

	"github.com/softroce/softroce/inspect"
)

func mustRun(t *testing.T, opts Options) (string, *Result) {
	t.Helper()
	var out bytes.Buffer
	res, err := Run(&out, opts)
	if err != nil {
		t.Fatalf("demo failed: %v\n%s", err, out.String())
	}
	return out.String(), res
}

// TestDemo runs the plain demo and checks that each operation completed,
// the memory views show the right bytes and every packet was decoded with
// a good ICRC, in the order the protocol dictates.
func TestDemo(t *testing.T) {
	out, res := mustRun(t, Options{})
	if len(res.Steps) != 5 {
		t.Fatalf("steps %v, want 5", res.Steps)
	}
	for _, want := range []string{
		"completion on A: wr_id 1 SEND success",
		"completion on B: wr_id 10 RECV success, 25 bytes",
		"|hello from A ove|",
		"completion on B: wr_id 11 RECV_RDMA_WITH_IMM success, 600 bytes imm 0x1234abcd",
		"|RDMA WRITE puts |",
		"completion on A: wr_id 3 RDMA_READ success, 600 bytes",
		"|abcdefghijklmnop|",
		"original value returned to A: 41; B's counter is now 42",
		"original value returned to A: 42; B's counter is now 1042",
		"all good: 5 operations completed",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if strings.Contains(out, "\x1b[") {
		t.Error("color escapes without Options.Color")
	}
	// The exact conversation: SEND, ACK; WRITE x3, ACK; READ, 3 responses;
	// CAS, atomic ACK; FAA, atomic ACK. A host slowed down past the 67 ms
	// retransmission timeout (the race detector on a busy machine) may
	// add retransmissions: those are set aside.
	var recs []int
	for i := range res.Records {
		if !res.Repeat[i] {
			recs = append(recs, i)
		}
	}
	want := []struct {
		op  string
		psn uint32
	}{
		{"SEND_ONLY", 100}, {"ACKNOWLEDGE", 100},
		{"RDMA_WRITE_FIRST", 101}, {"RDMA_WRITE_MIDDLE", 102}, {"RDMA_WRITE_LAST_WITH_IMMEDIATE", 103}, {"ACKNOWLEDGE", 103},
		{"RDMA_READ_REQUEST", 104}, {"RDMA_READ_RESPONSE_FIRST", 104}, {"RDMA_READ_RESPONSE_MIDDLE", 105}, {"RDMA_READ_RESPONSE_LAST", 106},
		{"COMPARE_SWAP", 107}, {"ATOMIC_ACKNOWLEDGE", 107}, {"FETCH_ADD", 108}, {"ATOMIC_ACKNOWLEDGE", 108},
	}
	if len(recs) != len(want) {
		t.Fatalf("%d packets, want %d:\n%s", len(recs), len(want), out)
	}
	for i, w := range want {
		r := res.Records[recs[i]]
		if r.OpcodeName != "RC "+w.op || r.PSN != w.psn || r.ICRC != "ok" || res.Lost[recs[i]] {
			t.Errorf("packet %d: %s psn %d icrc %s lost %v, want %s psn %d icrc ok", i, r.OpcodeName, r.PSN, r.ICRC, res.Lost[recs[i]], w.op, w.psn)
		}
	}
	if r := res.Records[recs[2]]; r.RETH == nil || r.RETH.DMALen != 600 {
		t.Errorf("WRITE_FIRST RETH %+v, want dmalen 600", r.RETH)
	}
	if r := res.Records[recs[5]]; r.AETH == nil || r.AETH.MSN != 2 {
		t.Errorf("WRITE's ACK: %+v, want MSN 2", r.AETH)
	}
	if r := res.Records[recs[11]]; r.AtomicAck == nil || r.AtomicAck.Orig != 41 {
		t.Errorf("CAS answer %+v, want orig 41", r.AtomicAck)
	}
	if !strings.Contains(out, "A -> B  SEND_ONLY") || !strings.Contains(out, "icrc ok") {
		t.Errorf("packet lines missing:\n%s", out)
	}
}

// TestDemoLoss runs with 15% loss and a fixed seed: the run must still
// succeed, and the printout must show lost packets and retransmissions.
func TestDemoLoss(t *testing.T) {
	out, res := mustRun(t, Options{Impair: "loss=15%,seed=1"})
	if len(res.Steps) != 5 {
		t.Fatalf("steps %v", res.Steps)
	}
	if res.LostPackets == 0 || res.Retransmits == 0 {
		t.Fatalf("lost %d, retransmits %d: want both > 0\n%s", res.LostPackets, res.Retransmits, out)
	}
	for _, want := range []string{"LOST on the wire", "RETRANSMIT (go-back-N)", " -x ", "seed=1", "B's counter is now 1042"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	lost := 0
	for _, l := range res.Lost {
		if l {
			lost++
		}
	}
	if lost != res.LostPackets {
		t.Errorf("Lost marks %d, counter %d", lost, res.LostPackets)
	}
}

// TestDemoCorrupt checks that a corrupted packet is shown with a bad
// ICRC and recovered from.
func TestDemoCorrupt(t *testing.T) {
	out, res := mustRun(t, Options{Impair: "corrupt=20%,seed=4"})
	if res.Corrupted == 0 {
		t.Fatalf("no corrupted packet shown:\n%s", out)
	}
	if !strings.Contains(out, "CORRUPTED: ICRC BAD") {
		t.Error("corruption not marked")
	}
	bad := 0
	for _, r := range res.Records {
		if r.ICRC == "bad" {
			bad++
		}
	}
	if bad == 0 {
		t.Error("no record with a bad ICRC")
	}
}

func TestDemoRefusesReorder(t *testing.T) {
	var out bytes.Buffer
	if _, err := Run(&out, Options{Impair: "reorder=10%"}); err == nil || !strings.Contains(err.Error(), "reorder") {
		t.Errorf("reorder accepted: %v", err)
	}
	if _, err := Run(&out, Options{Impair: "lose=10%"}); err == nil {
		t.Error("bad impairment accepted")
	}
}

// TestDemoDuplicates checks that packets the wire duplicates are marked
// and that the duplicates change nothing (atomics still add once).
func TestDemoDuplicates(t *testing.T) {
	out, res := mustRun(t, Options{Impair: "dup=30%,seed=5"})
	if res.Duplicated == 0 || !strings.Contains(out, "DUPLICATED by the wire") {
		t.Fatalf("no duplicate shown:\n%s", out)
	}
	if !strings.Contains(out, "B's counter is now 1042") {
		t.Error("a duplicated atomic executed twice")
	}
}

// TestDemoPcapMACs: in the demo's pcap each endpoint has its own MAC, and
// the frames of the two directions swap them, as on a real wire.
func TestDemoPcapMACs(t *testing.T) {
	var pcap bytes.Buffer
	mustRun(t, Options{Pcap: &pcap})
	rd, err := pcapgo.NewReader(&pcap)
	if err != nil {
		t.Fatal(err)
	}
	macs := map[netip.Addr]string{} // IP -> its MAC, from the frames it sent
	frames := 0
	for {
		data, _, err := rd.ReadPacketData()
		if err != nil {
			break
		}
		frames++
		r := inspect.Decode(data, gopacket.CaptureInfo{Length: len(data), CaptureLength: len(data)})
		src, dst := net.HardwareAddr(data[6:12]).String(), net.HardwareAddr(data[0:6]).String()
		if src == dst {
			t.Fatalf("frame %d (%v > %v): source and destination MAC are both %s", frames, r.Src, r.Dst, src)
		}
		for ip, mac := range map[netip.Addr]string{r.Src: src, r.Dst: dst} {
			if m, ok := macs[ip]; ok && m != mac {
				t.Fatalf("frame %d: %v has MAC %s, earlier %s", frames, ip, mac, m)
			}
			macs[ip] = mac
		}
	}
	if frames < 14 || len(macs) != 2 {
		t.Errorf("%d frames, MACs %v; want 14 or more frames between two endpoints", frames, macs)
	}
}
