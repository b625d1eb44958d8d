package interop

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/softroce/softroce/conformance/agent"
	"github.com/softroce/softroce/internal/devsync"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/qpstate"
	"github.com/softroce/softroce/verbs"
)

// TestUDHopLimitTClassAgainstRxe: an address handle's hop limit and
// traffic class travel as the IPv4 TTL and TOS. rxe's GRH of a UD SEND
// from softroce shows the values of softroce's AH. The other way,
// softroce's GRH shows what rxe sent: its AH's traffic class (also in the
// AH ibv_init_ah_from_wc makes of it) but TTL 64 whatever the AH's hop
// limit, because Linux replaces a user AH's hop limit with the route's
// when it resolves the destination's MAC (ib_resolve_eth_dmac).
func TestUDHopLimitTClassAgainstRxe(t *testing.T) {
	needVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	must := mustOf(t)
	ag, apd, amr, acq := rxeSide(t, ctx)
	dev, pd, buf, mr, cq := hostSide(t, bufLen, 64)
	aqp, qp := readyUDQPs(t, ctx, ag, apd, acq, pd, cq, 16)
	agid, err := ag.GID(ctx, 1)
	must(err)
	sgid, err := dev.QueryGID(0)
	must(err)
	hostIP, guestIP := vm.HostAddr().As4(), vm.GuestAddr().As4()
	const n = 100
	roce := 12 + 8 + n + 4
	for i, c := range []struct{ hop, tc uint8 }{{7, 46<<2 | 1}, {64, 0}, {1, 0x03}, {200, 0xb8}} {
		t.Run(fmt.Sprintf("hop%d-tc%#x", c.hop, c.tc), func(t *testing.T) {
			must := mustOf(t)
			ah, err := pd.CreateAH(verbs.AHAttr{DGID: verbs.GID(agid), HopLimit: c.hop, TrafficClass: c.tc})
			must(err)
			defer ah.Destroy()
			must(ag.PostRecv(ctx, aqp, 77, amr, 0, verbs.GRHLen+n))
			must(qp.PostSend(&verbs.SendWR{ID: uint64(i), Opcode: verbs.WRSend, Flags: verbs.SendSignaled, AH: ah.AV(), RemoteQPN: aqp.QPN,
				RemoteQKey: udQKey, SGL: []verbs.SGE{{Addr: mr.Addr(), Length: n, LKey: mr.LKey()}}}))
			if wc := waitWC(t, ctx, dev, cq, "softroce send"); wc.Status != 0 {
				t.Fatalf("softroce send: %+v", wc)
			}
			if wc, err := ag.Poll(ctx, acq, 20*time.Second); err != nil || wc == nil || wc.Status != agent.WCSuccess || wc.WRID != 77 {
				t.Fatalf("rxe receive: %+v %v", wc, err)
			}
			got, err := ag.ReadMem(ctx, amr, 0, verbs.GRHLen+n)
			must(err)
			ip := checkIPv4GRH(t, got, hostIP, guestIP, roce, c.hop)
			if ip[1] != c.tc {
				t.Errorf("rxe's GRH: TOS %#x, softroce's AH has traffic class %#x", ip[1], c.tc)
			}
			t.Logf("softroce to rxe: rxe's GRH has TTL %d TOS %#x", ip[8], ip[1])

			aah, err := ag.CreateAH(ctx, apd, agent.AHAttr{DestGID: sgid, HopLimit: int(c.hop), TrafficClass: int(c.tc)})
			must(err)
			must(qp.PostRecv(&verbs.RecvWR{ID: 99, SGL: []verbs.SGE{{Addr: mr.Addr() + 8192, Length: verbs.GRHLen + n, LKey: mr.LKey()}}}))
			rxeSend(t, ctx, ag, aqp, acq, agent.SendWR{WRID: 5, Op: agent.OpSend, MR: amr, Off: 8192, Len: n, AH: aah, RemoteQPN: qp.Num(), RemoteQKey: udQKey})
			wc := waitWC(t, ctx, dev, cq, "softroce receive")
			if wc.Status != 0 || wc.WRID != 99 || wc.ByteLen != verbs.GRHLen+n {
				t.Fatalf("softroce receive: %+v", wc)
			}
			var grh []byte
			devsync.Run(dev, func() { grh = append(grh, buf[8192:8192+verbs.GRHLen]...) })
			ip = checkIPv4GRH(t, grh, guestIP, hostIP, roce, 64)
			if ip[1] != c.tc {
				t.Errorf("softroce's GRH: TOS %#x, rxe's AH has traffic class %#x", ip[1], c.tc)
			}
			back, err := dev.AHAttrFromWC(&wc, grh)
			if err != nil || back.TrafficClass != c.tc || back.HopLimit != 0xff {
				t.Errorf("AH from the WC: %+v %v", back, err)
			}
			t.Logf("rxe to softroce: softroce's GRH has TTL %d TOS %#x", ip[8], ip[1])
		})
	}
}

// TestRCHopLimitTClassAgainstRxe: on a connected QP rxe sends its address
// vector's traffic class as the TOS but TTL 64 whatever its hop limit
// (Linux gives a connected QP the route's hop limit when it resolves the
// destination's MAC), and softroce does the same: every packet of its QP,
// WRITEs and ACKs, asks for its address vector's traffic class and the
// link's default TTL.
func TestRCHopLimitTClassAgainstRxe(t *testing.T) {
	needVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	must := mustOf(t)
	ag, apd, amr, acq := rxeSide(t, ctx)
	aqp, err := ag.CreateQP(ctx, apd, acq, acq, agent.QPCap{SendWR: 16, RecvWR: 16})
	must(err)
	must(ag.ModifyToInit(ctx, aqp, agent.AccessAll))
	dev, pd, _, _, cq := hostSide(t, bufLen, 64)
	mr, err := pd.RegMR(make([]byte, 8192), verbs.AccessLocalWrite|verbs.AccessRemoteWrite)
	must(err)
	qp, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16}})
	must(err)
	agid, err := ag.GID(ctx, 1)
	must(err)
	sgid, err := dev.QueryGID(0)
	must(err)
	must(ag.ModifyToRTR(ctx, aqp, agent.RTRAttr{DestQPN: qp.Num(), RecvPSN: 1, DestGID: sgid, HopLimit: 7, TrafficClass: 0x48}))
	must(ag.ModifyToRTS(ctx, aqp, agent.RTSAttr{SendPSN: 1, Timeout: 14, Retry: 7, RNRRetry: 7, MaxRdAtom: 1}))
	must(qp.Init(verbs.AccessRemoteWrite))
	must(qp.Modify(&verbs.QPAttr{State: verbs.StateRTR, PathMTU: 1024, DestQPN: aqp.QPN, RQPSN: 1, MaxDestRDAtomic: 1, MinRNRTimer: 12,
		AV: verbs.AddressVector{DGID: agid, HopLimit: 9, TrafficClass: 0x28}},
		qpstate.AttrState|qpstate.AttrAV|qpstate.AttrPathMTU|qpstate.AttrDestQPN|qpstate.AttrRQPSN|qpstate.AttrMaxDestRDAtomic|qpstate.AttrMinRNRTimer))
	must(qp.Modify(&verbs.QPAttr{State: verbs.StateRTS, SQPSN: 1, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRDAtomic: 1},
		qpstate.AttrState|qpstate.AttrSQPSN|qpstate.AttrTimeout|qpstate.AttrRetryCnt|qpstate.AttrRNRRetry|qpstate.AttrMaxQPRDAtomic))

	var mu sync.Mutex
	var rx, tx []nic.Packet
	dev.SetPacketTrace(func(dir byte, p *nic.Packet) {
		mu.Lock()
		defer mu.Unlock()
		f := nic.Packet{IPKnown: p.IPKnown, HopLimit: p.HopLimit, TClass: p.TClass}
		if dir == 'R' {
			rx = append(rx, f)
		} else {
			tx = append(tx, f)
		}
	})
	rxeSend(t, ctx, ag, aqp, acq, agent.SendWR{WRID: 1, Op: agent.OpWrite, MR: amr, Off: 0, Len: 3000, RemoteAddr: mr.Addr(), RKey: mr.RKey()})
	must(qp.PostSend(&verbs.SendWR{ID: 2, Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled, RemoteAddr: amr.Addr, RKey: amr.RKey,
		SGL: []verbs.SGE{{Addr: mr.Addr(), Length: 3000, LKey: mr.LKey()}}}))
	if wc := waitWC(t, ctx, dev, cq, "softroce WRITE"); wc.Status != 0 {
		t.Fatalf("softroce WRITE: %+v", wc)
	}
	dev.SetPacketTrace(nil)
	mu.Lock()
	defer mu.Unlock()
	if len(rx) == 0 || len(tx) == 0 {
		t.Fatalf("%d packets received, %d sent", len(rx), len(tx))
	}
	for i, p := range rx {
		if p.IPKnown && (p.HopLimit != 64 || p.TClass != 0x48) {
			t.Errorf("rxe's packet %d: TTL %d TOS %#x, want 64 and its AV's 0x48", i, p.HopLimit, p.TClass)
		}
	}
	for i, p := range tx {
		if p.HopLimit != 0 || p.TClass != 0x28 {
			t.Errorf("softroce's packet %d: hop limit %d traffic class %#x, want 0 (the link's) and 0x28", i, p.HopLimit, p.TClass)
		}
	}
	t.Logf("rxe's RC packets (AV hop limit 7, traffic class 0x48): %+v", rx[0])
}
