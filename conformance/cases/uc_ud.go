package cases

import (
	"bytes"
	"encoding/binary"
	"net/netip"

	"github.com/softroce/softroce/bth"
)

// docs/conformance-catalogue.md has no entries for UC and UD: IBTA vol. 1
// §9.8 (unreliable services), §10.2.4 (Q_Keys) and annex A17 (RoCEv2, the
// GRH).

// Unreliable services: UC's gap rule, UD's Q_Key, length and GRH rules.
// Neither answers: the peer judges by the target's receive completions
// and memory, and asserts the target sends nothing at all.
var datagramCases = []*Case{
	{
		ID: "uc-gap-drops-message",
		Spec: "UC: a SEND FIRST, then (its MIDDLE withheld) the SEND LAST: the broken message completes no receive; a " +
			"SEND ONLY after it lands and completes successfully with its own bytes; likewise a WRITE FIRST, (MIDDLE " +
			"withheld), WRITE LAST: the LAST's bytes do not land, and a WRITE ONLY after it does; nothing is ever sent " +
			"back (no ACK or NAK on UC) (IBTA vol. 1 §9.8.3: a PSN error in a UC message drops the rest of it, the " +
			"next FIRST or ONLY resynchronises)",
		Known: map[string]string{"rxe": "docs/rxe-behaviour.md §1.2: when a UC message loses a MIDDLE, rxe also " +
			"drops the next FIRST or ONLY (an opcode sequence error against the broken message) and more after it"},
		Run: runUCGap,
	},
	{
		ID: "ud-qkey-mismatch-dropped",
		Spec: "UD: a SEND whose DETH Q_Key differs from the QP's is dropped silently (no completion, the receive WQE " +
			"stays posted); the same SEND with the right Q_Key then completes in that WQE, byte count = payload + 40 " +
			"(the GRH), source QP = the DETH's (IBTA vol. 1 §10.2.4 Q_Keys, §9.6.3 header checks on UD)",
		Run: runUDQKey,
	},
	{
		ID: "ud-longer-than-receive-dropped",
		Spec: "UD: a SEND longer than the posted receive buffer (payload + 40-byte GRH above its length) is not " +
			"delivered: no successful completion carries it, nothing is sent back; the QP goes on: a SEND that fits " +
			"then completes successfully (IBTA vol. 1 §9.8.4 UD receives; softroce and rxe drop the datagram, leaving " +
			"the WQE posted; a local length error completion is noted if it comes)",
		Known: map[string]string{"rxe": "docs/rxe-behaviour.md §4.5: rxe completes the receive WQE LOC_QP_OP_ERR and " +
			"moves the UD QP to error (its other WQEs flush)"},
		Run: runUDOversize,
	},
	{
		ID: "ud-grh-contents",
		Spec: "UD over RoCEv2/IPv4: the 40 bytes at the head of the receive buffer hold the packet's IPv4 header in " +
			"their last 20 (version 4, IHL 5, total length of the IP packet, protocol UDP, source = the sender's " +
			"address, destination = the target's, a valid header checksum); the first 20 are zero as rxe writes them " +
			"(noted otherwise); the completion flags IBV_WC_GRH and its byte count includes the 40 bytes (IBTA annex " +
			"A17 RoCEv2: the GRH area of a UD receive for IPv4)",
		Run: runUDGRH,
	},
}

// UC opcodes are RC's with transport bits 001.
func ucOp(rc bth.Opcode) bth.Opcode { return rc | 0x20 }

// silent asserts the target sends the peer nothing for the rest of the case.
func (x *X) silent(what string) {
	x.Never(what, func(*Pkt) bool { return true })
}

func runUCGap(x *X) {
	const mtu = 1024
	n := randPSN()
	x.Open(QPSpec{Type: "uc", RecvPSN: n, MTU: mtu})
	x.silent("a packet from a UC QP (UC sends no ACK or NAK)")
	mem := pattern(16384, 0xd0)
	x.setMem(0, 0, mem)
	x.Must(x.S.PostRecv(x.Ctx, 81, 0, 4096), "post receive")
	x.Must(x.S.PostRecv(x.Ctx, 82, 4096, 4096), "post receive")
	mr := x.S.MR(0)

	// A control: a WRITE ONLY on the fresh QP lands.
	const cOff = 14336
	ctl := pattern(128, 0xcf)
	x.Send(bth.Fields{BTH: bth.BTHFields{Opcode: ucOp(bth.RCWriteOnly), PSN: n}, VA: mr.Addr + cOff, RKey: mr.RKey, DMALen: 128}, ctl)
	x.C.Collect(quietWait, nil)
	if !x.Check(bytes.Equal(x.mem(0, cOff, 128), ctl), "a WRITE ONLY on the fresh UC QP did not land") {
		x.Observe("control WRITE ONLY -> did not land")
		return
	}
	copy(mem[cOff:], ctl)
	n = bth.PSNAdd(n, 1)

	x.Send(bth.Fields{BTH: bth.BTHFields{Opcode: ucOp(bth.RCSendFirst), PSN: n}}, pattern(mtu, 0xd1))
	x.Send(bth.Fields{BTH: bth.BTHFields{Opcode: ucOp(bth.RCSendLast), PSN: bth.PSNAdd(n, 2)}}, pattern(500, 0xd2))
	wc, err := x.S.Poll(x.Ctx, quietWait)
	x.Must(err, "poll")
	if wc != nil {
		x.Failf("the broken SEND completed: wr %d %s %d bytes", wc.WRID, wcStatusName(wc.Status), wc.ByteLen)
	}
	only := pattern(300, 0xd3)
	x.Send(bth.Fields{BTH: bth.BTHFields{Opcode: ucOp(bth.RCSendOnly), PSN: bth.PSNAdd(n, 3)}}, only)
	wc, err = x.S.Poll(x.Ctx, answerWait)
	x.Must(err, "poll")
	switch {
	case wc == nil:
		x.Observe("SEND FIRST, (MIDDLE withheld), LAST; then SEND ONLY -> no completion")
		x.Failf("the SEND ONLY after the broken message did not complete")
		// Whether the target recovers one message later.
		x.Send(bth.Fields{BTH: bth.BTHFields{Opcode: ucOp(bth.RCSendOnly), PSN: bth.PSNAdd(n, 4)}}, only)
		if wc, err := x.S.Poll(x.Ctx, answerWait); err == nil && wc != nil {
			x.Observe("a second SEND ONLY -> wr %d %s %d bytes", wc.WRID, wcStatusName(wc.Status), wc.ByteLen)
		} else {
			x.Observe("a second SEND ONLY -> no completion")
		}
	default:
		x.Observe("SEND FIRST, (MIDDLE withheld), LAST; then SEND ONLY -> wr %d %s %d bytes", wc.WRID, wcStatusName(wc.Status), wc.ByteLen)
		x.Check(wc.Status == 0 && wc.ByteLen == uint32(len(only)) && (wc.WRID == 81 || wc.WRID == 82),
			"the SEND ONLY completed wr %d %s %d bytes, want SUCCESS with %d bytes", wc.WRID, wcStatusName(wc.Status), wc.ByteLen, len(only))
		off := 0
		if wc.WRID == 82 {
			off = 4096
			x.Notef("the SEND ONLY took the second WQE: the broken message consumed the first without completing it")
		} else {
			x.Notef("the SEND ONLY took the first WQE: the broken message's WQE was reused")
		}
		x.Check(bytes.Equal(x.mem(0, off, len(only)), only), "the SEND ONLY's bytes are not at the head of its WQE's buffer")
	}
	if wc, err := x.S.Poll(x.Ctx, quietWait); err == nil && wc != nil {
		x.Failf("a further completion: wr %d %s %d bytes", wc.WRID, wcStatusName(wc.Status), wc.ByteLen)
	}

	const wOff, oOff = 8192, 12288
	p := bth.PSNAdd(n, 5)
	x.Send(bth.Fields{BTH: bth.BTHFields{Opcode: ucOp(bth.RCWriteFirst), PSN: p}, VA: mr.Addr + wOff, RKey: mr.RKey, DMALen: 3 * mtu}, pattern(mtu, 0xd4))
	last := pattern(mtu, 0xd5)
	x.Send(bth.Fields{BTH: bth.BTHFields{Opcode: ucOp(bth.RCWriteLast), PSN: bth.PSNAdd(p, 2)}}, last)
	wonly := pattern(256, 0xd6)
	x.Send(bth.Fields{BTH: bth.BTHFields{Opcode: ucOp(bth.RCWriteOnly), PSN: bth.PSNAdd(p, 3)}, VA: mr.Addr + oOff, RKey: mr.RKey, DMALen: 256}, wonly)
	x.C.Collect(quietWait, nil)
	got := x.mem(0, 0, 16384)
	x.Check(bytes.Equal(got[wOff+2*mtu:wOff+3*mtu], mem[wOff+2*mtu:wOff+3*mtu]), "the broken WRITE's LAST landed")
	landed := bytes.Equal(got[oOff:oOff+256], wonly)
	x.Check(landed, "the WRITE ONLY after the broken WRITE did not land")
	x.Observe("WRITE FIRST, (MIDDLE withheld), LAST; then WRITE ONLY -> LAST dropped: %v, ONLY landed: %v",
		bytes.Equal(got[wOff+2*mtu:wOff+3*mtu], mem[wOff+2*mtu:wOff+3*mtu]), landed)
	if !landed {
		x.Send(bth.Fields{BTH: bth.BTHFields{Opcode: ucOp(bth.RCWriteOnly), PSN: bth.PSNAdd(p, 4)}, VA: mr.Addr + oOff, RKey: mr.RKey, DMALen: 256}, wonly)
		x.C.Collect(quietWait, nil)
		x.Observe("a second WRITE ONLY -> landed: %v", bytes.Equal(x.mem(0, oOff, 256), wonly))
		x.Must(x.S.PostRecv(x.Ctx, 83, 0, 4096), "post receive")
		x.Send(bth.Fields{BTH: bth.BTHFields{Opcode: ucOp(bth.RCSendOnly), PSN: bth.PSNAdd(p, 5)}}, only)
		if wc, err := x.S.Poll(x.Ctx, answerWait); err == nil && wc != nil {
			x.Observe("then a SEND ONLY -> wr %d %s %d bytes", wc.WRID, wcStatusName(wc.Status), wc.ByteLen)
		} else {
			x.Observe("then a SEND ONLY -> no completion")
		}
	}
	if !bytes.Equal(got[wOff:wOff+mtu], mem[wOff:wOff+mtu]) {
		x.Notef("the broken WRITE's FIRST landed (IBTA leaves its bytes undefined)")
	}
}

// udSend is a UD SEND ONLY from the peer's QP (the conversation's peer
// QPN) with Q_Key qkey.
func (x *X) udSend(qkey uint32, data []byte) {
	x.Send(bth.Fields{BTH: bth.BTHFields{Opcode: bth.UDSendOnly, PSN: randPSN()}, QKey: qkey, SrcQP: x.C.PeerQPN}, data)
}

const grhLen = 40

func runUDQKey(x *X) {
	const qkey = 0x1f2e3d4c
	x.Open(QPSpec{Type: "ud", QKey: qkey})
	x.silent("a packet from a UD QP that only receives")
	x.Must(x.S.PostRecv(x.Ctx, 91, 0, grhLen+256), "post receive")
	x.udSend(qkey^0x10, pattern(64, 0xd7))
	wc, err := x.S.Poll(x.Ctx, quietWait)
	x.Must(err, "poll")
	if wc != nil {
		x.Failf("the SEND with the wrong Q_Key completed: wr %d %s %d bytes", wc.WRID, wcStatusName(wc.Status), wc.ByteLen)
	}
	data := pattern(64, 0xd8)
	x.udSend(qkey, data)
	wc, err = x.S.Poll(x.Ctx, answerWait)
	x.Must(err, "poll")
	if wc == nil {
		x.Observe("Q_Key 0x%08x (QP's 0x%08x) -> no completion; right Q_Key -> no completion", uint32(qkey^0x10), uint32(qkey))
		x.Failf("the SEND with the right Q_Key did not complete")
		return
	}
	x.Observe("Q_Key 0x%08x (QP's 0x%08x) -> no completion; right Q_Key -> wr %d %s %d bytes from QP 0x%x", uint32(qkey^0x10), uint32(qkey),
		wc.WRID, wcStatusName(wc.Status), wc.ByteLen, wc.SrcQP)
	x.Check(wc.WRID == 91 && wc.Status == 0 && wc.ByteLen == grhLen+64, "completion wr %d %s %d bytes, want wr 91 SUCCESS %d bytes",
		wc.WRID, wcStatusName(wc.Status), wc.ByteLen, grhLen+64)
	x.Check(wc.SrcQP == x.C.PeerQPN, "completion source QP 0x%x, want the DETH's 0x%x", wc.SrcQP, x.C.PeerQPN)
	x.Check(bytes.Equal(x.mem(0, grhLen, 64), data), "the data is not right after the 40-byte GRH")
}

func runUDOversize(x *X) {
	const qkey = 0x2a3b4c5d
	x.Open(QPSpec{Type: "ud", QKey: qkey})
	x.silent("a packet from a UD QP that only receives")
	mem := pattern(4096, 0xd9)
	x.setMem(0, 0, mem)
	x.Must(x.S.PostRecv(x.Ctx, 92, 0, grhLen+100), "post receive")
	x.Must(x.S.PostRecv(x.Ctx, 93, 1024, grhLen+256), "post receive")
	x.udSend(qkey, pattern(200, 0xda))
	wc, err := x.S.Poll(x.Ctx, quietWait)
	x.Must(err, "poll")
	switch {
	case wc == nil:
		x.Observe("200 B into a 140 B receive -> no completion")
	case wc.Status == 0:
		x.Observe("200 B into a 140 B receive -> wr %d SUCCESS %d bytes", wc.WRID, wc.ByteLen)
		x.Failf("the oversize SEND completed successfully (wr %d, %d bytes)", wc.WRID, wc.ByteLen)
	default:
		x.Observe("200 B into a 140 B receive -> wr %d %s", wc.WRID, wcStatusName(wc.Status))
		x.Notef("the oversize SEND completed wr %d in error (%s) rather than being dropped", wc.WRID, wcStatusName(wc.Status))
	}
	x.Check(bytes.Equal(x.mem(0, 100+grhLen, 1024-100-grhLen), mem[100+grhLen:1024]), "the oversize SEND wrote past the receive buffer")
	data := pattern(64, 0xdb)
	x.udSend(qkey, data)
	wc, err = x.S.Poll(x.Ctx, answerWait)
	x.Must(err, "poll")
	if wc == nil {
		x.Failf("the SEND that fits did not complete")
		return
	}
	x.Observe("then 64 B -> wr %d %s %d bytes", wc.WRID, wcStatusName(wc.Status), wc.ByteLen)
	x.Check(wc.Status == 0 && wc.ByteLen == grhLen+64, "the SEND that fits completed %s %d bytes", wcStatusName(wc.Status), wc.ByteLen)
	off := 0
	if wc.WRID == 93 {
		off = 1024
	}
	x.Check(bytes.Equal(x.mem(0, off+grhLen, 64), data), "the fitting SEND's data is not after its buffer's GRH")
}

func runUDGRH(x *X) {
	const qkey = 0x3c4d5e6f
	const n = 128
	x.Open(QPSpec{Type: "ud", QKey: qkey})
	x.silent("a packet from a UD QP that only receives")
	x.Must(x.S.PostRecv(x.Ctx, 94, 0, grhLen+n), "post receive")
	x.udSend(qkey, pattern(n, 0xdc))
	wc, err := x.S.Poll(x.Ctx, answerWait)
	x.Must(err, "poll")
	if wc == nil {
		x.Failf("the SEND did not complete")
		return
	}
	x.Check(wc.Status == 0 && wc.ByteLen == grhLen+n, "completion %s %d bytes, want SUCCESS %d", wcStatusName(wc.Status), wc.ByteLen, grhLen+n)
	x.Check(wc.Flags&1 != 0, "the completion does not flag IBV_WC_GRH (wc_flags 0x%x)", wc.Flags)
	g := x.mem(0, 0, grhLen)
	ip := g[20:]
	x.Observe("GRH area: % x | % x", g[:20], ip)
	if !bytes.Equal(g[:20], make([]byte, 20)) {
		x.Notef("the first 20 bytes are not zero: % x", g[:20])
	}
	want := 20 + 8 + bth.BTHLen + bth.DETHLen + n + bth.ICRCLen
	x.Check(ip[0] == 0x45, "IPv4 version/IHL byte 0x%02x, want 0x45", ip[0])
	x.Check(int(binary.BigEndian.Uint16(ip[2:])) == want, "IPv4 total length %d, want %d", binary.BigEndian.Uint16(ip[2:]), want)
	x.Check(ip[9] == 17, "IPv4 protocol %d, want 17 (UDP)", ip[9])
	src, dst := netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
	x.Check(src == x.Target.Peer().Addr().Unmap(), "IPv4 source %v, want the sender's %v", src, x.Target.Peer().Addr())
	x.Check(dst == x.Target.Addr().Unmap(), "IPv4 destination %v, want the target's %v", dst, x.Target.Addr())
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(ip[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	x.Check(sum == 0xffff, "the IPv4 header checksum does not verify (sum 0x%04x)", sum)
	x.Notef("TTL %d, TOS 0x%02x, ID 0x%04x, flags/fragment 0x%04x", ip[8], ip[1], binary.BigEndian.Uint16(ip[4:]), binary.BigEndian.Uint16(ip[6:]))
}
