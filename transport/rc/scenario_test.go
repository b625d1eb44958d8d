package rc

import (
	"encoding/binary"
	"testing"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/qpstate"
	"github.com/softroce/softroce/transport/internal/enginetest"
	"github.com/softroce/softroce/wr"
)

// TestResponderExactPackets drives softroce's responder with crafted
// packets and checks the exact answers (IBTA §9.7.5.2, rxe behaviour).
func TestResponderExactPackets(t *testing.T) {
	s := enginetest.NewSim(t, 1, enginetest.Impairment{})
	qps := s.Connect(enginetest.QPOpts{PMTU: 256, PSN: [2]uint32{0xfffffe, 0}, MinRNR: 12})
	qp := qps[1]
	rmr, mem := s.Reg(1, 4096)
	w := func(op bth.Opcode, psn uint32, ack bool) bth.Fields {
		return bth.Fields{BTH: bth.BTHFields{Opcode: op, PSN: psn, AckReq: ack}, VA: rmr.Addr(), RKey: rmr.RKey(), DMALen: 16}
	}
	// PSN wraparound: 0xfffffe, 0xffffff, 0, 1 all accepted.
	for _, psn := range []uint32{0xfffffe, 0xffffff, 0} {
		enginetest.ExpectLines(t, "write across the wrap", s.Inject(qp, w(bth.RCWriteOnly, psn, false), make([]byte, 16)))
	}
	enginetest.ExpectLines(t, "AckReq at PSN 1", s.Inject(qp, w(bth.RCWriteOnly, 1, true), make([]byte, 16)),
		"ACKNOWLEDGE psn=1 ACK (credits unlimited) msn=4")
	// A gap: exactly one PSN sequence error NAK carrying the expected PSN.
	enginetest.ExpectLines(t, "first packet after a gap", s.Inject(qp, w(bth.RCWriteOnly, 5, true), make([]byte, 16)),
		"ACKNOWLEDGE psn=2 NAK PSN sequence error msn=4")
	enginetest.ExpectLines(t, "second packet of the gap", s.Inject(qp, w(bth.RCWriteOnly, 6, true), make([]byte, 16)))
	// A duplicate WRITE is re-ACKed with the last executed PSN, not executed.
	mem[0] = 0x55
	enginetest.ExpectLines(t, "duplicate WRITE", s.Inject(qp, w(bth.RCWriteOnly, 0, false), make([]byte, 16)),
		"ACKNOWLEDGE psn=1 ACK (credits unlimited) msn=4")
	if mem[0] != 0x55 {
		t.Fatal("duplicate WRITE executed again")
	}
	// READ of 3*MTU+5 bytes: FIRST, MIDDLE, MIDDLE, LAST; AETH on FIRST/LAST.
	rd := bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCReadRequest, PSN: 2, AckReq: true}, VA: rmr.Addr(), RKey: rmr.RKey(), DMALen: 3*256 + 5}
	want := []string{
		"RDMA_READ_RESPONSE_FIRST psn=2 ACK (credits unlimited) msn=5 len=256",
		"RDMA_READ_RESPONSE_MIDDLE psn=3 len=256",
		"RDMA_READ_RESPONSE_MIDDLE psn=4 len=256",
		"RDMA_READ_RESPONSE_LAST psn=5 ACK (credits unlimited) msn=5 len=5",
	}
	enginetest.ExpectLines(t, "READ segmented at the MTU", s.Inject(qp, rd, nil), want...)
	// A duplicate READ from its second PSN is re-executed from there.
	rd2 := rd
	rd2.BTH.PSN, rd2.VA, rd2.DMALen = 3, rmr.Addr()+256, 2*256+5
	enginetest.ExpectLines(t, "duplicate READ", s.Inject(qp, rd2, nil), want[1:]...)
	// Fetch-and-add, then its duplicate: same original, applied once.
	binary.LittleEndian.PutUint64(mem[64:], 7)
	fa := bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCFetchAdd, PSN: 6, AckReq: true}, VA: rmr.Addr() + 64, RKey: rmr.RKey(), SwapAdd: 3}
	enginetest.ExpectLines(t, "fetch-and-add", s.Inject(qp, fa, nil), "ATOMIC_ACKNOWLEDGE psn=6 ACK (credits unlimited) msn=6 orig=7")
	enginetest.ExpectLines(t, "duplicate fetch-and-add", s.Inject(qp, fa, nil), "ATOMIC_ACKNOWLEDGE psn=6 ACK (credits unlimited) msn=6 orig=7")
	if v := binary.LittleEndian.Uint64(mem[64:]); v != 10 {
		t.Fatalf("counter = %d after an atomic and its duplicate, want 10", v)
	}
	// SEND with no receive posted: RNR NAK with min_rnr_timer, QP stays up.
	send := bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCSendOnly, PSN: 7, AckReq: true}}
	enginetest.ExpectLines(t, "SEND without a receive", s.Inject(qp, send, []byte("hi")), "ACKNOWLEDGE psn=7 RNR NAK (timer 12 = 640µs) msn=6")
	if err := qp.PostRecv(&wr.RecvWR{ID: 1, SGL: []wr.SGE{{Addr: rmr.Addr() + 1024, Length: 64, LKey: rmr.LKey()}}}); err != nil {
		t.Fatal(err)
	}
	enginetest.ExpectLines(t, "SEND after posting", s.Inject(qp, send, []byte("hi")), "ACKNOWLEDGE psn=7 ACK (credits unlimited) msn=7")
	// Bad opcode sequence: WRITE_MIDDLE with no WRITE open -> NAK invalid
	// request at that PSN, and the QP goes to ERR.
	enginetest.ExpectLines(t, "WRITE_MIDDLE without FIRST", s.Inject(qp, w(bth.RCWriteMiddle, 8, false), make([]byte, 256)),
		"ACKNOWLEDGE psn=8 NAK invalid request msn=7")
	if qp.State() != qpstate.Err {
		t.Fatalf("state %v after invalid request, want ERR", qp.State())
	}
}

// TestResponderAccessErrors: each access failure gets NAK 0x62 at the
// offending PSN (IBTA §9.7.5.2.5; C9-88 zero-length exemption).
func TestResponderAccessErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    func(va uint64, rkey uint32) bth.Fields
		want string
	}{
		{"bad rkey", func(va uint64, rkey uint32) bth.Fields {
			return bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCWriteOnly, AckReq: true}, VA: va, RKey: rkey + 1, DMALen: 4}
		}, "ACKNOWLEDGE psn=0 NAK remote access error msn=0"},
		{"out of bounds", func(va uint64, rkey uint32) bth.Fields {
			return bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCReadRequest, AckReq: true}, VA: va + 4093, RKey: rkey, DMALen: 4}
		}, "ACKNOWLEDGE psn=0 NAK remote access error msn=0"},
		{"va+len overflow", func(va uint64, rkey uint32) bth.Fields {
			return bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCReadRequest, AckReq: true}, VA: ^uint64(0) - 1, RKey: rkey, DMALen: 4}
		}, "ACKNOWLEDGE psn=0 NAK remote access error msn=0"},
		{"zero-length READ with a garbage rkey", func(va uint64, rkey uint32) bth.Fields {
			return bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCReadRequest, AckReq: true}, VA: 1, RKey: 0xdead, DMALen: 0}
		}, "RDMA_READ_RESPONSE_ONLY psn=0 ACK (credits unlimited) msn=1"},
		{"misaligned atomic", func(va uint64, rkey uint32) bth.Fields {
			return bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCCompareSwap, AckReq: true}, VA: va + 4, RKey: rkey}
		}, "ACKNOWLEDGE psn=0 NAK invalid request msn=0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := enginetest.NewSim(t, 1, enginetest.Impairment{})
			qps := s.Connect(enginetest.QPOpts{PMTU: 1024})
			rmr, _ := s.Reg(1, 4096)
			f := tc.f(rmr.Addr(), rmr.RKey())
			var payload []byte
			if f.BTH.Opcode == bth.RCWriteOnly {
				payload = make([]byte, f.DMALen)
			}
			enginetest.ExpectLines(t, tc.name, s.Inject(qps[1], f, payload), tc.want)
		})
	}
}

// TestDuplicateAckSkipsReadPSN: a duplicate WRITE after a READ is re-ACKed
// with the WRITE's PSN, never with a PSN that belongs to READ responses.
func TestDuplicateAckSkipsReadPSN(t *testing.T) {
	s := enginetest.NewSim(t, 1, enginetest.Impairment{})
	qps := s.Connect(enginetest.QPOpts{PMTU: 256, PSN: [2]uint32{30, 0}})
	rmr, _ := s.Reg(1, 4096)
	swr := bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCWriteOnly, PSN: 30, AckReq: true}, VA: rmr.Addr(), RKey: rmr.RKey(), DMALen: 8}
	enginetest.ExpectLines(t, "WRITE", s.Inject(qps[1], swr, make([]byte, 8)), "ACKNOWLEDGE psn=30 ACK (credits unlimited) msn=1")
	rd := bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCReadRequest, PSN: 31, AckReq: true}, VA: rmr.Addr(), RKey: rmr.RKey(), DMALen: 8}
	enginetest.ExpectLines(t, "READ", s.Inject(qps[1], rd, nil), "RDMA_READ_RESPONSE_ONLY psn=31 ACK (credits unlimited) msn=2 len=8")
	enginetest.ExpectLines(t, "duplicate WRITE", s.Inject(qps[1], swr, make([]byte, 8)), "ACKNOWLEDGE psn=30 ACK (credits unlimited) msn=2")
}
