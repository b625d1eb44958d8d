package rc

import (
	"bytes"
	"net/netip"
	"testing"
	"time"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/memreg"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/qpstate"
	"github.com/softroce/softroce/transport/internal/enginetest"
	"github.com/softroce/softroce/wr"
)

// FuzzResponder feeds arbitrary packets to a QP in RTS that has registered
// memory surrounded by canaries: nothing may panic, and nothing outside
// the registered region may change.
func FuzzResponder(f *testing.F) {
	seed := func(fl bth.Fields, payload []byte) {
		buf := make([]byte, bth.Len(fl.BTH.Opcode, len(payload)))
		n, _ := bth.Build(buf, &fl, payload)
		f.Add(buf[:n], buf[:n])
	}
	for _, op := range []bth.Opcode{bth.RCWriteOnly, bth.RCWriteFirst, bth.RCReadRequest, bth.RCCompareSwap, bth.RCFetchAdd, bth.RCSendOnly, bth.RCSendFirst, bth.RCAtomicWrite, bth.RCFlush} {
		seed(bth.Fields{BTH: bth.BTHFields{Opcode: op, PKey: 0xffff, PSN: 100}, VA: 0x1000, RKey: 1, DMALen: 64}, make([]byte, 64))
	}
	f.Fuzz(func(t *testing.T, p1, p2 []byte) {
		s := enginetest.NewSim(t, 1, enginetest.Impairment{})
		qps := s.Connect(enginetest.QPOpts{PMTU: 256, PSN: [2]uint32{0, 100}, Timeout: 14, Retry: 7, RNRRetry: 7})
		backing := make([]byte, 3*4096)
		for i := range backing {
			backing[i] = 0xA5
		}
		region := backing[4096 : 2*4096]
		mr, err := s.EP[1].MRs.RegMR(s.EP[1].PD, region, memreg.AccessLocalWrite|memreg.AccessRemoteWrite|memreg.AccessRemoteRead|memreg.AccessRemoteAtomic)
		if err != nil {
			t.Fatal(err)
		}
		qps[1].PostRecv(&wr.RecvWR{ID: 1, SGL: []wr.SGE{{Addr: mr.Addr(), Length: 512, LKey: mr.LKey()}}})
		for _, p := range [][]byte{p1, p2} {
			if len(p) >= bth.BTHLen {
				// Aim at the QP and at the registered memory often enough
				// for the fuzzer to get past the cheap checks.
				q := append([]byte(nil), p...)
				bth.BTH(q).SetDestQP(qps[1].Num())
				var pk bth.Packet
				if bth.Parse(&pk, q) == nil {
					if pk.RETH != nil && pk.RETH.VA()%3 == 0 {
						bth.RETH(pk.RETH).Encode(mr.Addr()+pk.RETH.VA()%4096, mr.RKey(), pk.RETH.DMALen())
					}
					if pk.AtomicETH != nil && pk.AtomicETH.VA()%3 == 0 {
						a := pk.AtomicETH
						bth.AtomicETH(a).Encode(mr.Addr()+a.VA()%4096, mr.RKey(), a.SwapAdd(), a.Compare())
					}
				}
				p = q
			}
			s.EP[1].E.Receive(s.Now, []nic.Packet{{Buf: p, N: len(p), Remote: netip.AddrPortFrom(s.EP[0].Addr, 4791)}})
			s.Now = s.Now.Add(time.Millisecond)
			out, _ := s.EP[1].E.Progress(s.Now)
			for i := range out {
				var pk bth.Packet
				if err := bth.Parse(&pk, out[i].Bytes()); err != nil {
					t.Fatalf("responder sent a malformed packet: %v", err)
				}
			}
			s.EP[1].E.Release(out)
		}
		if !bytes.Equal(backing[:4096], bytes.Repeat([]byte{0xA5}, 4096)) || !bytes.Equal(backing[2*4096:], bytes.Repeat([]byte{0xA5}, 4096)) {
			t.Fatal("memory outside the registered region changed")
		}
	})
}

// completerWQEs is the mix of outstanding work requests FuzzCompleter
// posts, at path MTU 256, and the PSNs they take from completerPSN:
// WRITE 600 (+0..2), READ 700 into two SGEs (+3..5), SEND 100 (+6),
// FETCH_ADD (+7), CMP_SWAP (+8), READ 256 (+9), ATOMIC_WRITE (+10),
// zero-length WRITE (+11), zero-length READ (+12).
const (
	completerPSN  = 0xfffffa // the PSNs wrap inside the window
	completerWQEs = 9
	// completerMaxInput bounds the bytes of input FuzzCompleter reads.
	completerMaxInput = 512
)

// completerLens are the payload lengths a fuzz record can pick.
var completerLens = [8]int{0, 1, 8, 188, 255, 256, 257, 700}

// completerOps are the response opcodes a fuzz record can pick.
var completerOps = [6]bth.Opcode{bth.RCAck, bth.RCReadResponseFirst, bth.RCReadResponseMiddle,
	bth.RCReadResponseLast, bth.RCReadResponseOnly, bth.RCAtomicAck}

// completerRecord encodes one response for FuzzCompleter's input: opcode
// index, PSN offset from completerPSN, AETH syndrome, payload length index,
// MSN.
func completerRecord(op int, off int8, syn bth.Syndrome, lenIdx int, msn byte) []byte {
	return []byte{byte(op), byte(off), byte(syn), byte(lenIdx), msn}
}

// FuzzCompleter feeds arbitrary responses (ACKs, NAKs of every syndrome,
// READ responses FIRST/MIDDLE/LAST/ONLY, atomic ACKs, at any PSN and
// length, raw packets, timer expiries) to a requester with a mix of
// outstanding SEND, WRITE, READ and atomic work requests, and checks:
// nothing panics; completions come strictly in posting order and never
// more than the WQEs posted; response data lands only inside the SGEs of
// READs and atomics; compPSN never moves backwards nor past nextPSN; a QP
// in ERR hands out no packet.
//
// The input is a sequence of records. Kinds 0-5 (5 bytes): a response of
// completerOps[kind] at completerPSN+int8(b1), syndrome b2, payload length
// completerLens[b3&7], MSN b4. Kind 6: advance time by b1 ms. Kind 7:
// nothing. Kind 8: a raw packet of b1 bytes (missing bytes are zero).
// Kind 9: a response of opcode completerOps[b1%6] at the absolute PSN
// b2..b4. Progress runs after every record.
func FuzzCompleter(f *testing.F) {
	ok := bth.SyndromeACKUnlimited
	var all []byte
	for _, r := range [][]byte{
		completerRecord(0, 2, ok, 0, 1), completerRecord(1, 3, ok, 5, 2), completerRecord(2, 4, ok, 5, 2),
		completerRecord(3, 5, ok, 3, 2), completerRecord(0, 6, ok, 0, 3), completerRecord(5, 7, ok, 0, 4),
		completerRecord(5, 8, ok, 0, 5), completerRecord(4, 9, ok, 5, 6), completerRecord(4, 10, ok, 0, 7),
		completerRecord(0, 11, ok, 0, 8), completerRecord(4, 12, ok, 0, 9),
	} {
		all = append(all, r...)
	}
	f.Add(all) // every WQE completes successfully
	f.Add(append(completerRecord(0, 1, ok, 0, 0), completerRecord(0, 1, bth.SyndromePSNSeqError, 0, 0)...))
	f.Add(append(completerRecord(0, 0, bth.RNRNAK(3), 0, 0), 6, 10, 7))
	f.Add(completerRecord(0, 4, bth.SyndromeRemoteAccessError, 0, 0))
	f.Add(append(completerRecord(0, 2, ok, 0, 1), completerRecord(2, 4, ok, 5, 1)...))             // READ gap
	f.Add(append(completerRecord(0, 2, ok, 0, 1), completerRecord(3, 3, ok, 5, 1)...))             // LAST first
	f.Add(append(completerRecord(0, 2, ok, 0, 1), completerRecord(1, 3, ok, 4, 1)...))             // short FIRST
	f.Add(append(completerRecord(0, 12, ok, 0, 1), completerRecord(0, 2, bth.RNRNAK(1), 0, 1)...)) // stale
	f.Add([]byte{6, 200, 6, 200, 6, 200, 6, 200, 6, 200})                                          // timeouts
	f.Add([]byte{9, 4, 0xff, 0xff, 0xfc, 0, 0x12, 0x7f})                                           // absolute PSN
	f.Fuzz(func(t *testing.T, data []byte) {
		// Small CQs and queues keep each execution cheap; 16 CQ entries
		// hold every completion.
		s := enginetest.NewSimCQ(t, 1, enginetest.Impairment{}, 16)
		qps := s.Connect(enginetest.QPOpts{PMTU: 256, PSN: [2]uint32{completerPSN, 0}, Timeout: 14, Retry: 3, RNRRetry: 3, MaxRD: 16, Depth: 16})
		qp := qps[0]
		backing := make([]byte, 4096+8192+4096)
		for i := range backing {
			backing[i] = byte(i*7 + i>>9)
		}
		region := backing[4096 : 4096+8192]
		mr, err := s.EP[0].MRs.RegMR(s.EP[0].PD, region, memreg.AccessLocalWrite)
		if err != nil {
			t.Fatal(err)
		}
		before := append([]byte(nil), backing...)
		a, k := mr.Addr(), mr.LKey()
		sge := func(off, n int) wr.SGE { return wr.SGE{Addr: a + uint64(off), Length: uint32(n), LKey: k} }
		// The only local bytes a response may change: READ and atomic SGEs.
		writable := [][2]int{{1000, 1300}, {2000, 2400}, {3000, 3016}, {4000, 4256}}
		wrs := []wr.SendWR{
			{Opcode: wr.RDMAWrite, SGL: []wr.SGE{sge(0, 600)}, RemoteAddr: 0x1000, RKey: 1},
			{Opcode: wr.RDMARead, SGL: []wr.SGE{sge(1000, 300), sge(2000, 400)}, RemoteAddr: 0x2000, RKey: 1},
			{Opcode: wr.Send, SGL: []wr.SGE{sge(0, 100)}},
			{Opcode: wr.AtomicFetchAndAdd, SGL: []wr.SGE{sge(3000, 8)}, RemoteAddr: 0x3000, RKey: 1, CompareAdd: 1},
			{Opcode: wr.AtomicCmpAndSwp, SGL: []wr.SGE{sge(3008, 8)}, RemoteAddr: 0x3008, RKey: 1, CompareAdd: 1, Swap: 2},
			{Opcode: wr.RDMARead, SGL: []wr.SGE{sge(4000, 256)}, RemoteAddr: 0x4000, RKey: 1},
			{Opcode: wr.AtomicWrite, RemoteAddr: 0x5000, RKey: 1},
			{Opcode: wr.RDMAWrite, RemoteAddr: 0x6000, RKey: 1},
			{Opcode: wr.RDMARead, RemoteAddr: 0x7000, RKey: 1},
		}
		for i := range wrs {
			wrs[i].ID, wrs[i].Flags = uint64(i+1), wr.Signaled
			if err := qp.PostSend(&wrs[i]); err != nil {
				t.Fatal(err)
			}
		}
		// About a hundred records reach every state; longer inputs only
		// make executions and minimization slow.
		data = data[:min(len(data), completerMaxInput)]
		var nextID uint64 = 1
		wcs := make([]cq.WC, 16)
		// progress drains the engine. A QP that was in ERR before the
		// record was fed must hand out nothing (a responder's fatal NAK,
		// built as it enters ERR, may still go out).
		progress := func(wasErr bool) {
			for {
				out, more := s.EP[0].E.Progress(s.Now)
				if wasErr && len(out) > 0 {
					t.Fatalf("QP in ERR handed out %d packets", len(out))
				}
				for i := range out {
					var pk bth.Packet
					if err := bth.Parse(&pk, out[i].Bytes()); err != nil {
						t.Fatalf("requester sent a malformed packet: %v", err)
					}
				}
				s.EP[0].E.Release(out)
				if !more {
					return
				}
			}
		}
		progress(false)
		if bth.PSNDiff(qp.NextPSN, completerPSN) != 13 {
			t.Fatalf("setup: nextPSN %#x", qp.NextPSN)
		}
		lastComp := rcOf(qp).compPSN
		feed := func(op bth.Opcode, psn uint32, syn bth.Syndrome, plen int, msn byte) {
			fl := bth.Fields{BTH: bth.BTHFields{Opcode: op, PSN: psn & bth.PSNMask}, Syndrome: syn, MSN: uint32(msn),
				Orig: uint64(psn) * 0x0101010101}
			payload := make([]byte, plen)
			for i := range payload {
				payload[i] = byte(psn) ^ byte(i)
			}
			s.Feed(0, qp, fl, payload)
		}
		for len(data) > 0 {
			wasErr := qp.State() == qpstate.Err
			kind := data[0] % 10
			data = data[1:]
			arg := func(n int) []byte {
				b := make([]byte, n)
				copy(b, data)
				data = data[min(n, len(data)):]
				return b
			}
			switch {
			case kind < 6:
				b := arg(4)
				feed(completerOps[kind], bth.PSNAdd(completerPSN, int(int8(b[0]))), bth.Syndrome(b[1]), completerLens[b[2]&7], b[3])
			case kind == 6:
				s.Now = s.Now.Add(time.Duration(arg(1)[0]) * time.Millisecond)
			case kind == 7:
				// Progress only (below).
			case kind == 8:
				n := int(arg(1)[0])
				p := arg(n)
				if len(p) >= bth.BTHLen {
					bth.BTH(p).SetDestQP(qp.Num())
				}
				s.EP[0].E.Receive(s.Now, []nic.Packet{{Buf: p, N: len(p), Remote: netip.AddrPortFrom(s.EP[1].Addr, 4791)}})
			case kind == 9:
				b := arg(4)
				psn := uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
				feed(completerOps[int(b[0])%6], psn, bth.SyndromeACKUnlimited, 256, 0)
			}
			progress(wasErr)
			// Invariants after every record.
			if d := bth.PSNDiff(rcOf(qp).compPSN, lastComp); d < 0 {
				t.Fatalf("compPSN moved backwards: %#x -> %#x", lastComp, rcOf(qp).compPSN)
			}
			if bth.PSNDiff(rcOf(qp).compPSN, qp.NextPSN) > 0 {
				t.Fatalf("compPSN %#x beyond nextPSN %#x", rcOf(qp).compPSN, qp.NextPSN)
			}
			lastComp = rcOf(qp).compPSN
			for n := s.EP[0].SCQ.Poll(wcs); n > 0; n = s.EP[0].SCQ.Poll(wcs) {
				for _, wc := range wcs[:n] {
					if wc.WRID != nextID {
						t.Fatalf("completion of WR %d (%v), want WR %d next", wc.WRID, wc.Status, nextID)
					}
					nextID++
				}
			}
			if nextID-1 > completerWQEs {
				t.Fatalf("%d completions for %d WQEs", nextID-1, completerWQEs)
			}
		}
		for i := range backing {
			off := i - 4096
			ok := false
			for _, w := range writable {
				ok = ok || off >= w[0] && off < w[1]
			}
			if !ok && backing[i] != before[i] {
				t.Fatalf("byte %d of the region (outside every READ/atomic SGE) changed", off)
			}
		}
	})
}
