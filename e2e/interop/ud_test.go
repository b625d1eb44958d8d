package interop

import (
	"bytes"
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/softroce/softroce/conformance/agent"
	"github.com/softroce/softroce/internal/devsync"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/verbs"
)

// ibvWCGRH is IBV_WC_GRH, ibvWCWithImm IBV_WC_WITH_IMM.
const (
	ibvWCGRH     = 1
	ibvWCWithImm = 2
	udQKey       = 0x11111111
)

// checkIPv4GRH checks a UD receive buffer's 40-byte GRH as rxe and
// softroce write it for IPv4: 20 zero bytes, then the IPv4 header of a
// datagram of n payload bytes (opcode with ImmDt) from src to dst, with
// TTL ttl (0: not checked) and a valid checksum. It returns the header.
func checkIPv4GRH(t *testing.T, g []byte, src, dst [4]byte, roceLen int, ttl uint8) []byte {
	t.Helper()
	if !bytes.Equal(g[:20], make([]byte, 20)) {
		t.Fatalf("GRH does not start with 20 zero bytes: %x", g[:40])
	}
	ip := g[20:40]
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(ip[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	switch {
	case ip[0] != 0x45, ip[9] != 17, int(binary.BigEndian.Uint16(ip[2:])) != 20+8+roceLen,
		binary.BigEndian.Uint16(ip[6:]) != 0x4000, // DF, no fragment
		!bytes.Equal(ip[12:16], src[:]), !bytes.Equal(ip[16:20], dst[:]),
		ttl != 0 && ip[8] != ttl, sum != 0xffff:
		t.Fatalf("GRH IPv4 header %x (want %v -> %v, %d bytes of RoCE, TTL %d, valid checksum)", ip, src, dst, roceLen, ttl)
	}
	return ip
}

// readyUDQPs makes a UD QP on each side, rxe's on acq and softroce's on
// cq, with wr send and receive WQEs, ready with Q_Key udQKey (rxe's send
// PSN 0x123, softroce's 0x456).
func readyUDQPs(t *testing.T, ctx context.Context, ag *agent.Client, apd agent.PD, acq agent.CQ, pd *verbs.PD, cq *verbs.CQ, wr int) (agent.QP, *verbs.QP) {
	t.Helper()
	must := mustOf(t)
	aqp, err := ag.CreateQP(ctx, apd, acq, acq, agent.QPCap{SendWR: wr, RecvWR: wr, Type: agent.QPTypeUD})
	must(err)
	must(ag.ReadyUD(ctx, aqp, udQKey, 0x123))
	qp, err := pd.CreateQP(verbs.QPInitAttr{Type: verbs.QPTypeUD, SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: wr, MaxRecvWR: wr}})
	must(err)
	must(qp.ReadyUD(udQKey, 0x456))
	return aqp, qp
}

// TestUDAgainstRxe: UD SEND and SEND_WITH_IMM between a softroce UD QP and
// a kernel rxe UD QP, both directions, up to the port MTU. Each side's
// receive carries the 40-byte GRH (20 zero bytes and the IPv4 header) and
// the UD completion fields; a Q_Key mismatch and a datagram too long for
// the receive buffer are dropped (rxe 6.1 completes the receive in error
// instead), leaving the WQE for the next datagram; a work request Q_Key
// with the high bit set sends softroce's QP's own Q_Key, which rxe
// accepts, while rxe sends it as it is.
func TestUDAgainstRxe(t *testing.T) {
	needVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	must := mustOf(t)
	ag, apd, amr, acq := rxeSide(t, ctx)
	dev, pd, buf, mr, cq := hostSide(t, bufLen, 256)
	aqp, qp := readyUDQPs(t, ctx, ag, apd, acq, pd, cq, 64)
	if a, err := ag.Query(ctx, aqp); err != nil || a.QKey != udQKey || a.State != "RTS" {
		t.Fatalf("rxe UD QP: %+v %v", a, err)
	}
	ah, aah := udAHs(t, ctx, ag, apd, dev, pd)
	mtu := dev.QueryPort().ActiveMTU
	if mtu > 4096 || mtu < 1024 {
		t.Fatalf("port MTU %d", mtu)
	}
	hostIP, guestIP := vm.HostAddr().As4(), vm.GuestAddr().As4()

	// IPID and TTL of the packets the link saw from rxe.
	var lastID uint16
	var lastTTL uint8
	dev.SetPacketTrace(func(dir byte, p *nic.Packet) {
		if dir == 'R' {
			lastID, lastTTL = p.IPID, p.HopLimit
		}
	})
	wrID := uint64(0)

	t.Run("rxe-to-softroce", func(t *testing.T) {
		for _, n := range []int{0, 1, 1000, mtu} {
			for _, imm := range []bool{false, true} {
				data := pattern(n, byte(n+1))
				must(ag.WriteMem(ctx, amr, 8192, data))
				must(qp.PostRecv(&verbs.RecvWR{ID: 99, SGL: []verbs.SGE{{Addr: mr.Addr() + 8192, Length: uint32(verbs.GRHLen + n), LKey: mr.LKey()}}}))
				op, immv, roce := agent.OpSend, uint32(0), 12+8+n+(-n&3)+4
				if imm {
					op, immv, roce = agent.OpSendImm, 0x1234+uint32(n), roce+4
				}
				must(ag.PostSend(ctx, aqp, agent.SendWR{WRID: 5, Op: op, Imm: immv, MR: amr, Off: 8192, Len: n, AH: aah, RemoteQPN: qp.Num(), RemoteQKey: udQKey}))
				if wc, err := ag.Poll(ctx, acq, 20*time.Second); err != nil || wc == nil || wc.Status != agent.WCSuccess || wc.WRID != 5 {
					t.Fatalf("rxe send of %d bytes: %+v %v", n, wc, err)
				}
				wc := waitWC(t, ctx, dev, cq, "softroce receive")
				want := verbs.WC{WRID: 99, Opcode: 128, ByteLen: uint32(verbs.GRHLen + n), QPNum: qp.Num(), SrcQP: aqp.QPN, Flags: 1, IPVersion: 4}
				if imm {
					want.Flags, want.ImmData = 3, immv
				}
				if wc != want {
					t.Fatalf("softroce receive of %d bytes\n got %+v\nwant %+v", n, wc, want)
				}
				var got []byte
				devsync.Run(dev, func() { got = append(got, buf[8192:8192+verbs.GRHLen+n]...) })
				ip := checkIPv4GRH(t, got, guestIP, hostIP, roce, 64)
				if id := binary.BigEndian.Uint16(ip[4:]); id != lastID || lastTTL != 64 {
					t.Fatalf("GRH ID %#x TTL %d, the link saw ID %#x TTL %d", id, ip[8], lastID, lastTTL)
				}
				if !bytes.Equal(got[verbs.GRHLen:], data) {
					t.Fatalf("softroce received %d bytes that differ", n)
				}
			}
		}
		// Dropped by softroce and counted: a Q_Key mismatch, a datagram
		// too long for the WQE, and a work request Q_Key with the high bit
		// set, which rxe sends as it is (it substitutes the QP's Q_Key
		// only on QP1), then the WQE takes the next good datagram.
		must(qp.PostRecv(&verbs.RecvWR{ID: 100, SGL: []verbs.SGE{{Addr: mr.Addr() + 8192, Length: verbs.GRHLen + 100, LKey: mr.LKey()}}}))
		before := dev.Stats()
		for i, c := range []struct {
			qkey uint32
			n    int
		}{{udQKey + 1, 10}, {udQKey, 101}, {0x80000000, 100}, {udQKey, 100}} {
			rxeSend(t, ctx, ag, aqp, acq, agent.SendWR{WRID: uint64(10 + i), Op: agent.OpSend, MR: amr, Off: 8192, Len: c.n, AH: aah, RemoteQPN: qp.Num(), RemoteQKey: c.qkey})
		}
		wc := waitWC(t, ctx, dev, cq, "softroce receive")
		if wc.WRID != 100 || wc.ByteLen != verbs.GRHLen+100 {
			t.Fatalf("softroce receive after the drops: %+v", wc)
		}
		st := dev.Stats()
		if st.RxBadQKey != before.RxBadQKey+2 || st.RxUDTooLong != before.RxUDTooLong+1 {
			t.Fatalf("drops not counted: before %+v after %+v", before, st)
		}
	})
	t.Run("softroce-to-rxe", func(t *testing.T) {
		for _, n := range []int{0, 1, 1000, mtu} {
			for _, imm := range []bool{false, true} {
				data := pattern(n, byte(n))
				copy(buf, data)
				must(ag.PostRecv(ctx, aqp, 77, amr, 0, verbs.GRHLen+n))
				wrID++
				w := verbs.SendWR{ID: wrID, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, AH: ah.AV(), RemoteQPN: aqp.QPN, RemoteQKey: udQKey}
				if n > 0 {
					w.SGL = []verbs.SGE{{Addr: mr.Addr(), Length: uint32(n), LKey: mr.LKey()}}
				}
				roce := 12 + 8 + n + (-n & 3) + 4
				if imm {
					w.Opcode, w.Imm, roce = verbs.WRSendWithImm, 0xabcd0000+uint32(n), roce+4
				}
				must(qp.PostSend(&w))
				if wc := waitWC(t, ctx, dev, cq, "softroce send"); wc.Status != 0 || wc.WRID != wrID {
					t.Fatalf("softroce send completion %+v", wc)
				}
				wc, err := ag.Poll(ctx, acq, 20*time.Second)
				if err != nil || wc == nil {
					t.Fatalf("rxe receive of %d bytes: %+v %v", n, wc, err)
				}
				flags := uint32(ibvWCGRH)
				if imm {
					flags |= ibvWCWithImm
				}
				if wc.Status != agent.WCSuccess || wc.WRID != 77 || wc.Opcode != agent.WCRecv || int(wc.ByteLen) != verbs.GRHLen+n ||
					wc.SrcQP != qp.Num() || wc.Flags&(ibvWCGRH|ibvWCWithImm) != flags || imm && wc.Imm != w.Imm {
					t.Fatalf("rxe receive of %d bytes (imm %v): %+v", n, imm, wc)
				}
				got, err := ag.ReadMem(ctx, amr, 0, verbs.GRHLen+n)
				must(err)
				ip := checkIPv4GRH(t, got, hostIP, guestIP, roce, 64)
				// The UDP link sends with IPv4 ID 0 (the value its ICRC is computed with).
				if binary.BigEndian.Uint16(ip[4:]) != 0 {
					t.Fatalf("rxe's GRH has IPv4 ID %#x", binary.BigEndian.Uint16(ip[4:]))
				}
				if !bytes.Equal(got[verbs.GRHLen:], data) {
					t.Fatalf("rxe received %d bytes that differ", n)
				}
			}
		}
		// Dropped by rxe: a Q_Key mismatch leaves the WQE for the next
		// datagram, which sends the QP's own Q_Key (high bit).
		must(ag.PostRecv(ctx, aqp, 78, amr, 0, verbs.GRHLen+100))
		for i, qkey := range []uint32{udQKey + 1, 0x80000000} {
			wrID++
			must(qp.PostSend(&verbs.SendWR{ID: wrID, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, AH: ah.AV(), RemoteQPN: aqp.QPN, RemoteQKey: qkey,
				SGL: []verbs.SGE{{Addr: mr.Addr(), Length: 100, LKey: mr.LKey()}}}))
			waitWC(t, ctx, dev, cq, "softroce send")
			wc, err := ag.Poll(ctx, acq, 2*time.Second)
			must(err)
			if i == 0 && wc != nil {
				t.Fatalf("rxe accepted a datagram with Q_Key %#x: %+v", qkey, wc)
			}
			if i == 1 && (wc == nil || wc.Status != agent.WCSuccess || wc.WRID != 78 || wc.ByteLen != verbs.GRHLen+100) {
				t.Fatalf("rxe receive with the QP's own Q_Key: %+v", wc)
			}
		}
		// A datagram longer than rxe's buffer: newer kernels drop it
		// (class D, the WQE stays); Linux 6.1's rxe completes the WQE
		// with LOC_QP_OP_ERR and moves its QP to ERR. Either is taken,
		// and said.
		must(ag.PostRecv(ctx, aqp, 79, amr, 0, verbs.GRHLen+100))
		wrID++
		must(qp.PostSend(&verbs.SendWR{ID: wrID, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, AH: ah.AV(), RemoteQPN: aqp.QPN, RemoteQKey: udQKey,
			SGL: []verbs.SGE{{Addr: mr.Addr(), Length: 101, LKey: mr.LKey()}}}))
		waitWC(t, ctx, dev, cq, "softroce send")
		wc, err := ag.Poll(ctx, acq, 2*time.Second)
		must(err)
		switch {
		case wc == nil:
			t.Log("rxe dropped the datagram too long for its receive buffer")
		case wc.WRID == 79 && wc.Status == agent.WCLocQPOpErr:
			t.Log("rxe completed the receive too short for the datagram LOC_QP_OP_ERR (its QP is now in ERR)")
		default:
			t.Fatalf("rxe's answer to a datagram too long for its buffer: %+v", wc)
		}
	})

	t.Logf("UD against rxe: port MTU %d", mtu)
}

// TestGSIAgainstRxe: softroce's QP1 on the wire with rxe: a datagram from
// rxe's UD QP to QP1 is accepted with Q_Key 0x80010000 only, lands behind
// the GRH, and names rxe's QP as its source; QP1 sends with source QP 1
// and Q_Key 0x80010000.
// (The MADs themselves are the connection manager's business.)
func TestGSIAgainstRxe(t *testing.T) {
	needVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	must := mustOf(t)
	ag, apd, amr, acq := rxeSide(t, ctx)
	aqp, err := ag.CreateQP(ctx, apd, acq, acq, agent.QPCap{SendWR: 16, RecvWR: 16, Type: agent.QPTypeUD})
	must(err)
	must(ag.ReadyUD(ctx, aqp, udQKey, 0))
	dev, pd, buf, mr, cq := hostSide(t, 4096, 64)
	gsi, err := dev.CreateGSI(pd, cq, cq, verbs.QPCap{})
	must(err)
	ah, aah := udAHs(t, ctx, ag, apd, dev, pd)

	mad := pattern(256, 9)
	must(ag.WriteMem(ctx, amr, 0, mad))
	must(gsi.PostRecv(&verbs.RecvWR{ID: 1, SGL: []verbs.SGE{{Addr: mr.Addr(), Length: verbs.GRHLen + 256, LKey: mr.LKey()}}}))
	before := dev.Stats().RxBadQKey
	for i, qk := range []uint32{udQKey, verbs.GSIQKey} {
		rxeSend(t, ctx, ag, aqp, acq, agent.SendWR{WRID: uint64(i), Op: agent.OpSend, MR: amr, Len: 256, AH: aah, RemoteQPN: 1, RemoteQKey: qk})
	}
	wcs := make([]verbs.WC, 1)
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	defer wcancel()
	if _, err := cq.Wait(wctx, wcs); err != nil {
		t.Fatal(err)
	}
	if w := wcs[0]; w.WRID != 1 || w.QPNum != 1 || w.SrcQP != aqp.QPN || w.ByteLen != verbs.GRHLen+256 || w.Flags != 1 {
		t.Fatalf("QP1 receive %+v", w)
	}
	if got := dev.Stats().RxBadQKey; got != before+1 {
		t.Fatalf("the datagram with Q_Key %#x was not dropped and counted (%d -> %d)", udQKey, before, got)
	}
	var got []byte
	devsync.Run(dev, func() { got = append(got, buf[:verbs.GRHLen+256]...) })
	checkIPv4GRH(t, got, vm.GuestAddr().As4(), vm.HostAddr().As4(), 12+8+256+4, 64)
	if !bytes.Equal(got[verbs.GRHLen:], mad) {
		t.Fatal("QP1 received a different datagram")
	}

	// QP1 to rxe's UD QPs: source QP 1 and Q_Key 0x80010000 in the DETH
	// whatever the work request says, so rxe's QP with Q_Key udQKey drops
	// it and one with 0x80010000 takes it.
	gqp, err := ag.CreateQP(ctx, apd, acq, acq, agent.QPCap{SendWR: 16, RecvWR: 16, Type: agent.QPTypeUD})
	must(err)
	must(ag.ReadyUD(ctx, gqp, verbs.GSIQKey, 0))
	copy(buf, mad)
	for i, q := range []agent.QP{aqp, gqp} {
		must(ag.PostRecv(ctx, q, uint64(7+i), amr, 1024, verbs.GRHLen+256))
		must(gsi.PostSend(&verbs.SendWR{ID: 2, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, AH: ah.AV(), RemoteQPN: q.QPN, RemoteQKey: udQKey,
			SGL: []verbs.SGE{{Addr: mr.Addr(), Length: 256, LKey: mr.LKey()}}}))
		wc, err := ag.Poll(ctx, acq, 2*time.Second)
		must(err)
		if i == 0 && wc != nil {
			t.Fatalf("rxe's QP with Q_Key %#x took QP1's datagram: %+v", udQKey, wc)
		}
		if i == 1 && (wc == nil || wc.Status != agent.WCSuccess || wc.WRID != 8 || wc.SrcQP != 1 || wc.ByteLen != verbs.GRHLen+256) {
			t.Fatalf("rxe receive from QP1: %+v", wc)
		}
	}
}

// TestUDSRQAgainstRxe: UD QPs on an SRQ, on both sides. A datagram too
// long for the SRQ WQE it takes completes that WQE in error and the QP
// carries on: softroce completes it REM_INV_REQ_ERR (class E, as rxe's
// responder code says); what rxe does is checked and reported.
func TestUDSRQAgainstRxe(t *testing.T) {
	needVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	must := mustOf(t)
	ag, apd, amr, acq := rxeSide(t, ctx)
	asrq, _, err := ag.CreateSRQ(ctx, apd, 16, 0)
	must(err)
	aqp, err := ag.CreateQP(ctx, apd, acq, acq, agent.QPCap{SendWR: 16, Type: agent.QPTypeUD, SRQ: asrq})
	must(err)
	must(ag.ReadyUD(ctx, aqp, udQKey, 0))
	dev, pd, _, mr, cq := hostSide(t, 8192, 64)
	srq, err := pd.CreateSRQ(verbs.SRQInitAttr{MaxWR: 16})
	must(err)
	qp, err := pd.CreateQP(verbs.QPInitAttr{Type: verbs.QPTypeUD, SendCQ: cq, RecvCQ: cq, SRQ: srq})
	must(err)
	must(qp.ReadyUD(udQKey, 0))
	ah, aah := udAHs(t, ctx, ag, apd, dev, pd)

	// rxe to softroce: 101 bytes into a 40+100 WQE, then 100 bytes.
	for i := range 2 {
		must(srq.PostRecv(&verbs.RecvWR{ID: uint64(i), SGL: []verbs.SGE{{Addr: mr.Addr() + uint64(i)*1024, Length: verbs.GRHLen + 100, LKey: mr.LKey()}}}))
	}
	for i, n := range []int{101, 100} {
		rxeSend(t, ctx, ag, aqp, acq, agent.SendWR{WRID: uint64(i), Op: agent.OpSend, MR: amr, Len: n, AH: aah, RemoteQPN: qp.Num(), RemoteQKey: udQKey})
	}
	if w := waitWC(t, ctx, dev, cq, "too long"); w.WRID != 0 || w.Status != 9 /* REM_INV_REQ_ERR */ {
		t.Fatalf("softroce SRQ receive of a datagram too long: %+v", w)
	}
	if w := waitWC(t, ctx, dev, cq, "fits"); w.WRID != 1 || w.Status != 0 || w.ByteLen != verbs.GRHLen+100 || w.SrcQP != aqp.QPN {
		t.Fatalf("softroce SRQ receive: %+v", w)
	}
	if qp.State() != verbs.StateRTS {
		t.Fatalf("softroce QP in %v", qp.State())
	}

	// softroce to rxe: the same.
	for i := range 2 {
		must(ag.PostSRQRecv(ctx, asrq, uint64(10+i), amr, i*1024, verbs.GRHLen+100))
	}
	for i, n := range []int{101, 100} {
		must(qp.PostSend(&verbs.SendWR{ID: uint64(i), Opcode: verbs.WRSend, Flags: verbs.SendSignaled, AH: ah.AV(), RemoteQPN: aqp.QPN, RemoteQKey: udQKey,
			SGL: []verbs.SGE{{Addr: mr.Addr(), Length: uint32(n), LKey: mr.LKey()}}}))
		waitWC(t, ctx, dev, cq, "softroce send")
	}
	var got []*agent.WC
	for range 2 {
		wc, err := ag.Poll(ctx, acq, 3*time.Second)
		must(err)
		if wc == nil {
			break
		}
		got = append(got, wc)
	}
	switch {
	case len(got) == 2 && got[0].WRID == 10 && got[0].Status != agent.WCSuccess && got[1].WRID == 11 && got[1].Status == agent.WCSuccess:
		t.Logf("rxe completed the SRQ WQE too short for the datagram %q (%d) and received the next", got[0].StatusStr, got[0].Status)
	case len(got) == 1 && got[0].WRID == 10 && got[0].Status != agent.WCSuccess:
		t.Logf("rxe completed the SRQ WQE too short for the datagram %q (%d) and stopped its QP", got[0].StatusStr, got[0].Status)
	case len(got) == 1 && got[0].WRID == 10 && got[0].Status == agent.WCSuccess:
		t.Logf("rxe dropped the datagram too long for its SRQ WQE")
	default:
		for _, w := range got {
			t.Logf("rxe completion %+v", *w)
		}
		t.Fatal("unexpected rxe completions for a datagram too long for its SRQ WQE")
	}
}
