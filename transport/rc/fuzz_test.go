package rc

import (
	"bytes"
	"net/netip"
	"testing"
	"time"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/memreg"
	"github.com/softroce/softroce/nic"
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
		s := newSim(t, 1, impairment{})
		qps := s.connect(qpOpts{pmtu: 256, psn: [2]uint32{0, 100}, timeout: 14, retry: 7, rnrRetry: 7})
		backing := make([]byte, 3*4096)
		for i := range backing {
			backing[i] = 0xA5
		}
		region := backing[4096 : 2*4096]
		mr, err := s.ep[1].mrs.RegMR(s.ep[1].pd, region, memreg.AccessLocalWrite|memreg.AccessRemoteWrite|memreg.AccessRemoteRead|memreg.AccessRemoteAtomic)
		if err != nil {
			t.Fatal(err)
		}
		qps[1].PostRecv(&RecvWR{ID: 1, SGL: []SGE{{Addr: mr.Addr(), Length: 512, LKey: mr.LKey()}}})
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
			s.ep[1].e.Receive(s.now, []nic.Packet{{Buf: p, N: len(p), Remote: netip.AddrPortFrom(s.ep[0].addr, 4791)}})
			s.now = s.now.Add(time.Millisecond)
			out, _ := s.ep[1].e.Progress(s.now)
			for i := range out {
				var pk bth.Packet
				if err := bth.Parse(&pk, out[i].Bytes()); err != nil {
					t.Fatalf("responder sent a malformed packet: %v", err)
				}
			}
			s.ep[1].e.Release(out)
		}
		if !bytes.Equal(backing[:4096], bytes.Repeat([]byte{0xA5}, 4096)) || !bytes.Equal(backing[2*4096:], bytes.Repeat([]byte{0xA5}, 4096)) {
			t.Fatal("memory outside the registered region changed")
		}
	})
}
