package cases

import (
	"bytes"
	"fmt"

	"github.com/softroce/softroce/bth"
)

// docs/conformance-catalogue.md section A.3, GU-20 to GU-23.

// Memory windows: access through a window's R_Key, invalidation, and the
// rules of binding. MR 1 is the region the windows are bound over; the
// window covers [mwOff, mwOff+mwLen) of it, with distinct bytes on both
// sides so that any access outside the window shows.
var mwCases = []*Case{
	{
		ID: "mw-type1-access",
		Spec: "A type 1 window bound (ibv_bind_mw) over 4 KiB in the middle of an MR, with remote read and write: a WRITE " +
			"and a READ inside the window through its R_Key succeed, the bytes where they belong; a READ through it from " +
			"another QP of the PD succeeds too (a type 1 window is not tied to a QP); a WRITE running 8 bytes past the " +
			"window's end (still inside the MR) and a READ starting 1 byte before it are NAKed remote access error " +
			"(0x62), memory unchanged (IBTA §10.6.7 memory windows, §9.7.5 class C, §10.6 access checks)",
		Known: map[string]string{"rxe": "docs/rxe-behaviour.md §4.6: rxe checks an access through a memory window " +
			"against the bounds of the MR under it, not the window's"},
		Run: runMWType1Access,
	},
	{
		ID: "mw-type1-rights",
		Spec: "A type 1 window granting remote read only, over an MR that grants everything: a READ through the window " +
			"succeeds; a WRITE through it is NAKed remote access error (0x62), memory unchanged — the window's rights " +
			"rule, not the MR's; a WRITE through the MR's own R_Key (on a fresh QP) is still accepted (IBTA §10.6.7 " +
			"memory windows, §10.6 access rights)",
		Run: runMWType1Rights,
	},
	{
		ID: "mw-type1-unbind",
		Spec: "A type 1 window bound and read through, then unbound by a zero-length bind: the R_Key it had is no longer " +
			"valid, and a READ through it is NAKed remote access error (0x62) (IBTA §10.6.7.2 binding: a zero-length " +
			"bind of a type 1 window unbinds it, §9.7.5 class C)",
		Run: runMWType1Unbind,
	},
	{
		ID: "mw-type2-bounds",
		Spec: "A type 2 window bound over 4 KiB in the middle of an MR, with remote read and write: a READ inside it " +
			"succeeds; a READ starting 1 byte before the window, and (through a second window bound the same way on a " +
			"fresh QP) a WRITE running 8 bytes past its end, both still inside the MR, are NAKed remote access error " +
			"(0x62), memory unchanged (IBTA §10.6.7 memory windows, §9.7.5 class C, §10.6 access checks)",
		Known: map[string]string{"rxe": "docs/rxe-behaviour.md §4.6: rxe checks an access through a memory window " +
			"against the bounds of the MR under it, not the window's"},
		Run: runMWType2Bounds,
	},
	{
		ID: "mw-type2-local-inv",
		Spec: "A type 2 window bound by a BIND_MW work request on the QP: a WRITE through its R_Key succeeds; after a " +
			"LOCAL_INV of that R_Key (completing successfully) a WRITE through it is NAKed remote access error (0x62), " +
			"memory unchanged (IBTA §10.6.7 memory windows, §10.7.2 LOCAL_INV, §9.7.5 class C)",
		Run: runMWType2LocalInv,
	},
	{
		ID: "mw-type2-other-qp",
		Spec: "A type 2 window bound on QP A is usable through QP A only (type 2B): a READ through it on A succeeds, the " +
			"same READ on QP B of the same PD is NAKed remote access error (0x62), and the window still works on A " +
			"afterwards (IBTA §10.6.7 type 2B windows are associated with a QP, §9.7.5 class C)",
		Run: runMWType2OtherQP,
	},
	{
		ID: "mw-send-invalidate-type2",
		Spec: "A SEND_ONLY_WITH_INVALIDATE whose IETH names a type 2 window bound on the receiving QP: ACKed; the receive " +
			"completes successfully with the data, flagged IBV_WC_WITH_INV with the window's R_Key as invalidated_rkey; " +
			"the window is invalid afterwards: a WRITE through its R_Key is NAKed remote access error (0x62), memory " +
			"unchanged (IBTA §9.4.1.1 SEND with invalidate, §10.6.7 memory windows, §11.4.2.1 completion modifiers)",
		Known: map[string]string{"rxe": "docs/rxe-behaviour.md §9: rxe's receive completion of a SEND with invalidate " +
			"carries wc_flags 0x5 through libibverbs (the kernel's flag numbering), not IBV_WC_WITH_INV; the " +
			"invalidation itself works"},
		Run: runMWSendInvType2,
	},
	{
		ID: "mw-send-invalidate-other-qp",
		Spec: "A SEND_ONLY_WITH_INVALIDATE on QP B naming a type 2 window bound on QP A: the invalidation is not allowed " +
			"(the window is not bound to B): the receive does not complete successfully, and either no NAK (a class J " +
			"error: the receive completes in error and B moves to error) or a NAK invalid request (0x61) or remote " +
			"access error (0x62); the window stays valid: a WRITE through it on A succeeds (IBTA §9.4.1.1, §10.6.7, " +
			"§9.9.6.3 class J)",
		Known: map[string]string{"rxe": "docs/rxe-behaviour.md §4.6: rxe lets a SEND with invalidate on any QP of " +
			"the PD invalidate a type 2 window, whichever QP it is bound to"},
		Run: runMWSendInvOtherQP,
	},
	{
		ID: "mw-send-invalidate-type1",
		Spec: "A SEND_ONLY_WITH_INVALIDATE naming a type 1 window: only a type 2 window (or a fast-registered region) may " +
			"be invalidated remotely, so the receive does not complete successfully (class J: error completion, no NAK; " +
			"or a NAK 0x61/0x62) and the window survives: a READ through it on a fresh QP succeeds (IBTA §9.4.1.1, " +
			"§10.6.7.2: type 1 windows are not invalidated by a SEND with invalidate)",
		Run: runMWSendInvType1,
	},
	{
		ID: "mw-bind-needs-mw-bind-access",
		Spec: "Binding a type 1 window (ibv_bind_mw) or a type 2 window (BIND_MW) over an MR registered without " +
			"IBV_ACCESS_MW_BIND is refused (the verb fails or the bind completes MW_BIND_ERR); the key the bind would " +
			"have given grants nothing: a READ through it is NAKed remote access error (0x62) (IBTA C10-73, §10.6.7)",
		Run: runMWBindNeedsMWBind,
	},
	{
		ID: "mw-bind-write-needs-local-write",
		Spec: "Over an MR registered with remote read and MW_BIND but without local write: a window granting remote " +
			"write is refused, type 1 and type 2 alike (a window may not grant remote write or atomic over an MR " +
			"without local write); a type 1 window granting only remote read binds, and a READ through it succeeds " +
			"while a WRITE through it is NAKed remote access error (0x62), memory unchanged (IBTA C10-74, §10.6.7)",
		Run: runMWBindNeedsLocalWrite,
	},
}

const (
	mwOff  = 4096
	mwLen  = 4096
	mwSize = 16384
)

// openMW opens the case's QP with MR 0 (receives) and MR 1 (the windows'
// region, access acc), fills MR 1 with a pattern and returns it.
func (x *X) openMW(psn uint32, acc Access) []byte {
	x.Open(QPSpec{RecvPSN: psn, MRs: []MRSpec{{Len: 4096, Access: AccessAll}, {Len: mwSize, Access: acc}}})
	mem := pattern(mwSize, 0xc0)
	x.setMem(1, 0, mem)
	return mem
}

func (x *X) allocMW(s Session, typ int) *MW {
	mw, err := s.AllocMW(x.Ctx, typ)
	x.Must(err, fmt.Sprintf("allocate a type %d window", typ))
	return mw
}

// bindOK binds mw over the window range of MR 1 and ends the case (a
// failure) when the target refuses.
func (x *X) bindOK(s Session, wrID uint64, mw *MW, n int, acc Access) {
	refused, err := s.BindMW(x.Ctx, wrID, mw, 1, mwOff, n, acc)
	x.Must(err, "bind a window")
	if refused != "" {
		x.Failf("the bind of a type %d window over %d bytes was refused: %s", mw.Type, n, refused)
		x.Fatalf("no window to test: the bind was refused (%s)", refused)
	}
}

// useQP moves the conversation back to s, a QP the case opened earlier
// and connected to peerQPN.
func (x *X) useQP(s Session, peerQPN uint32) { x.C.retarget(peerQPN, s.QPN()) }

// winWrite sends a WRITE ONLY and returns the answer to it.
func (x *X) winWrite(psn uint32, va uint64, rkey uint32, data []byte) []*Pkt {
	x.Send(writeOnly(psn, va, rkey, len(data)), data)
	return x.C.Collect(answerWait, func(q *Pkt) bool { return answerAt(psn)(q) })
}

// winRead sends a READ of n bytes (at most one MTU) and returns the answer.
func (x *X) winRead(psn uint32, va uint64, rkey uint32, n int) []*Pkt {
	x.Send(readReq(psn, va, rkey, n), nil)
	return x.C.Collect(answerWait, func(q *Pkt) bool {
		return q.ParseErr == nil && q.PSN() == psn && (q.Opcode() == bth.RCAck || q.P.Info.Op == bth.OpReadResponse)
	})
}

// readData checks that got is one READ_RESPONSE_ONLY carrying want.
func (x *X) readData(what string, got []*Pkt, want []byte) bool {
	ok := len(got) == 1 && got[0].Opcode() == bth.RCReadResponseOnly && bytes.Equal(got[0].P.Payload, want)
	return x.Check(ok, "%s: want one READ_RESPONSE_ONLY with the window's %d bytes, got %s", what, len(want), DescribeAll(got))
}

// nakOnce checks got is exactly one NAK syn at psn, and that no second
// answer follows.
func (x *X) nakOnce(what string, got []*Pkt, syn bth.Syndrome, psn uint32) {
	x.Check(len(got) == 1 && isNAK(got[0], syn, psn), "%s: want exactly one NAK 0x%02x at PSN 0x%06x, got %s",
		what, uint8(syn), psn, DescribeAll(got))
	x.Never("a second answer to "+what, answerAt(psn))
}

func runMWType1Access(x *X) {
	n := randPSN()
	mem := x.openMW(n, AccessAll|AccessMWBind)
	mr := x.S.MR(1)
	mw := x.allocMW(x.S, 1)
	x.bindOK(x.S, 61, mw, mwLen, AccessRemoteWrite|AccessRemoteRead)
	va := mr.Addr + mwOff

	data := pattern(256, 0xc1)
	got := x.winWrite(n, va+100, mw.RKey, data)
	x.Observe("type 1 window 0x%08x: WRITE 256 B inside -> %s", mw.RKey, DescribeAll(got))
	x.Check(len(got) == 1 && isACK(got[0], n), "the WRITE inside the window was not ACKed")
	copy(mem[mwOff+100:], data)
	x.Check(bytes.Equal(x.mem(1, 0, mwSize), mem), "after the WRITE through the window the MR does not hold exactly its bytes with the WRITE's in place")

	got = x.winRead(bth.PSNAdd(n, 1), va+mwLen-512, mw.RKey, 512)
	x.Observe("READ the window's last 512 B -> %s", DescribeAll(got))
	x.readData("READ inside the window", got, mem[mwOff+mwLen-512:mwOff+mwLen])

	m := randPSN()
	x.OpenQP(QPSpec{RecvPSN: m})
	got = x.winRead(m, va, mw.RKey, 64)
	x.Observe("another QP: READ 64 B -> %s", DescribeAll(got))
	x.readData("READ through the type 1 window from another QP of the PD", got, mem[mwOff:mwOff+64])

	psn := bth.PSNAdd(m, 1)
	got = x.winWrite(psn, va+mwLen-8, mw.RKey, pattern(16, 0xc2))
	x.Observe("WRITE 16 B from 8 B before the window's end -> %s", DescribeAll(got))
	x.nakOnce("the WRITE past the window", got, bth.SyndromeRemoteAccessError, psn)
	x.Check(bytes.Equal(x.mem(1, 0, mwSize), mem), "the WRITE past the window's end changed memory")

	k := randPSN()
	x.OpenQP(QPSpec{RecvPSN: k})
	got = x.winRead(k, va-1, mw.RKey, 8)
	x.Observe("fresh QP: READ 8 B from 1 B before the window -> %s", DescribeAll(got))
	x.nakOnce("the READ before the window", got, bth.SyndromeRemoteAccessError, k)
}

func runMWType1Rights(x *X) {
	n := randPSN()
	mem := x.openMW(n, AccessAll|AccessMWBind)
	mr := x.S.MR(1)
	mw := x.allocMW(x.S, 1)
	x.bindOK(x.S, 61, mw, mwLen, AccessRemoteRead)
	va := mr.Addr + mwOff
	got := x.winRead(n, va+256, mw.RKey, 128)
	x.Observe("read-only type 1 window: READ -> %s", DescribeAll(got))
	x.readData("READ through the read-only window", got, mem[mwOff+256:mwOff+384])
	psn := bth.PSNAdd(n, 1)
	got = x.winWrite(psn, va+256, mw.RKey, pattern(64, 0xc3))
	x.Observe("WRITE through it -> %s", DescribeAll(got))
	x.nakOnce("the WRITE through a read-only window", got, bth.SyndromeRemoteAccessError, psn)
	x.Check(bytes.Equal(x.mem(1, 0, mwSize), mem), "the WRITE through the read-only window changed memory")

	m := randPSN()
	x.OpenQP(QPSpec{RecvPSN: m})
	data := pattern(64, 0xc4)
	got = x.winWrite(m, va+256, mr.RKey, data)
	x.Observe("fresh QP: WRITE through the MR's own rkey -> %s", DescribeAll(got))
	x.Check(len(got) == 1 && isACK(got[0], m), "the WRITE through the MR's own R_Key was not ACKed")
	copy(mem[mwOff+256:], data)
	x.Check(bytes.Equal(x.mem(1, 0, mwSize), mem), "the WRITE through the MR's R_Key did not land exactly")
}

func runMWType1Unbind(x *X) {
	n := randPSN()
	mem := x.openMW(n, AccessAll|AccessMWBind)
	mr := x.S.MR(1)
	mw := x.allocMW(x.S, 1)
	x.bindOK(x.S, 61, mw, mwLen, AccessRemoteRead|AccessRemoteWrite)
	va, key := mr.Addr+mwOff, mw.RKey
	got := x.winRead(n, va, key, 64)
	x.Observe("type 1 window 0x%08x: READ -> %s", key, DescribeAll(got))
	x.readData("READ through the bound window", got, mem[mwOff:mwOff+64])
	refused, err := x.S.BindMW(x.Ctx, 62, mw, 1, mwOff, 0, 0)
	x.Must(err, "unbind the window")
	if refused != "" {
		x.Failf("the zero-length bind (unbind) of the type 1 window was refused: %s", refused)
		return
	}
	x.Observe("zero-length bind -> window key 0x%08x", mw.RKey)
	psn := bth.PSNAdd(n, 1)
	got = x.winRead(psn, va, key, 64)
	x.Observe("READ through the old key -> %s", DescribeAll(got))
	x.nakOnce("the READ through the unbound window", got, bth.SyndromeRemoteAccessError, psn)
}

// runMWType2Bounds: a class C NAK ends the QP, and a type 2 window serves
// only the QP it is bound to, so each out-of-range access gets a fresh QP
// with a fresh window.
func runMWType2Bounds(x *X) {
	n := randPSN()
	mem := x.openMW(n, AccessAll|AccessMWBind)
	mr := x.S.MR(1)
	va := mr.Addr + mwOff
	mw := x.allocMW(x.S, 2)
	x.bindOK(x.S, 61, mw, mwLen, AccessRemoteWrite|AccessRemoteRead)
	got := x.winRead(n, va+mwLen-256, mw.RKey, 256)
	x.Observe("type 2 window 0x%08x: READ its last 256 B -> %s", mw.RKey, DescribeAll(got))
	x.readData("READ inside the window", got, mem[mwOff+mwLen-256:mwOff+mwLen])
	psn := bth.PSNAdd(n, 1)
	got = x.winRead(psn, va-1, mw.RKey, 8)
	x.Observe("READ 8 B from 1 B before the window -> %s", DescribeAll(got))
	x.nakOnce("the READ before the window", got, bth.SyndromeRemoteAccessError, psn)

	m := randPSN()
	b := x.OpenQP(QPSpec{RecvPSN: m})
	mw2 := x.allocMW(b, 2)
	x.bindOK(b, 62, mw2, mwLen, AccessRemoteWrite|AccessRemoteRead)
	got = x.winWrite(m, va+mwLen-8, mw2.RKey, pattern(16, 0xce))
	x.Observe("fresh QP and window: WRITE 16 B from 8 B before the window's end -> %s", DescribeAll(got))
	x.nakOnce("the WRITE past the window", got, bth.SyndromeRemoteAccessError, m)
	x.Check(bytes.Equal(x.mem(1, 0, mwSize), mem), "an access outside the window changed memory")
}

func runMWType2LocalInv(x *X) {
	n := randPSN()
	mem := x.openMW(n, AccessAll|AccessMWBind)
	mr := x.S.MR(1)
	mw := x.allocMW(x.S, 2)
	x.bindOK(x.S, 61, mw, mwLen, AccessRemoteRead|AccessRemoteWrite)
	va := mr.Addr + mwOff
	data := pattern(128, 0xc5)
	got := x.winWrite(n, va+1000, mw.RKey, data)
	x.Observe("type 2 window 0x%08x: WRITE -> %s", mw.RKey, DescribeAll(got))
	x.Check(len(got) == 1 && isACK(got[0], n), "the WRITE through the bound type 2 window was not ACKed")
	copy(mem[mwOff+1000:], data)
	wc, err := x.S.LocalInv(x.Ctx, 63, mw.RKey)
	x.Must(err, "post LOCAL_INV")
	switch {
	case wc == nil:
		x.Fatalf("the LOCAL_INV did not complete")
	case wc.WRID != 63 || wc.Status != 0:
		x.Failf("LOCAL_INV completed wr %d %s, want wr 63 SUCCESS", wc.WRID, wcStatusName(wc.Status))
		return
	}
	x.Observe("LOCAL_INV -> %s", wcStatusName(wc.Status))
	psn := bth.PSNAdd(n, 1)
	got = x.winWrite(psn, va+1000, mw.RKey, pattern(128, 0xc6))
	x.Observe("WRITE after LOCAL_INV -> %s", DescribeAll(got))
	x.nakOnce("the WRITE through the invalidated window", got, bth.SyndromeRemoteAccessError, psn)
	x.Check(bytes.Equal(x.mem(1, 0, mwSize), mem), "memory is not the first WRITE's alone: the WRITE after LOCAL_INV landed, or the first did not")
}

func runMWType2OtherQP(x *X) {
	n := randPSN()
	mem := x.openMW(n, AccessAll|AccessMWBind)
	a, aPeer := x.S, x.C.PeerQPN
	mr := a.MR(1)
	mw := x.allocMW(a, 2)
	x.bindOK(a, 61, mw, mwLen, AccessRemoteRead|AccessRemoteWrite)
	va := mr.Addr + mwOff
	got := x.winRead(n, va+64, mw.RKey, 64)
	x.Observe("type 2 window bound on QP A: READ on A -> %s", DescribeAll(got))
	x.readData("READ on the QP the window is bound to", got, mem[mwOff+64:mwOff+128])

	m := randPSN()
	x.OpenQP(QPSpec{RecvPSN: m})
	got = x.winRead(m, va+64, mw.RKey, 64)
	x.Observe("READ on QP B -> %s", DescribeAll(got))
	x.nakOnce("the READ through a window bound to another QP", got, bth.SyndromeRemoteAccessError, m)

	x.useQP(a, aPeer)
	got = x.winRead(bth.PSNAdd(n, 1), va+128, mw.RKey, 64)
	x.Observe("READ on A again -> %s", DescribeAll(got))
	x.readData("READ on QP A after QP B's attempt", got, mem[mwOff+128:mwOff+192])
}

// sendInv sends a SEND_ONLY_WITH_INVALIDATE of data naming rkey and
// returns the answer.
func (x *X) sendInv(psn, rkey uint32, data []byte) []*Pkt {
	x.Send(bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCSendOnlyInv, PSN: psn, AckReq: true}, InvRKey: rkey}, data)
	return x.C.Collect(quietWait, nil)
}

// refusedInvalidate judges the answer to a SEND with invalidate that must
// not invalidate: no NAK, or one NAK 0x61 or 0x62; and a receive
// completion, if any, that is not a success.
func (x *X) refusedInvalidate(s Session, psn uint32, got []*Pkt, wrID uint64) {
	var naks []*Pkt
	for _, q := range got {
		if anyNAK(q) {
			naks = append(naks, q)
		}
	}
	switch {
	case len(naks) == 0:
		x.Notef("answer: no NAK (%s)", DescribeAll(got))
	case len(naks) == 1 && (isNAK(naks[0], bth.SyndromeInvalidRequest, psn) || isNAK(naks[0], bth.SyndromeRemoteAccessError, psn)):
		x.Notef("answer: NAK 0x%02x", uint8(naks[0].Syndrome()))
	default:
		x.Failf("answered %s: want no NAK, or one NAK 0x61 or 0x62 at PSN 0x%06x", DescribeAll(got), psn)
	}
	x.Never("a NAK after the answer recorded", anyNAK)
	wc, err := s.Poll(x.Ctx, answerWait)
	x.Must(err, "poll")
	if wc == nil {
		x.Observe("receive completion: none")
		return
	}
	x.Observe("receive completion %s", wcStatusName(wc.Status))
	x.Check(wc.WRID != wrID || wc.Status != 0, "the receive completed successfully (flags 0x%x): the invalidation was accepted", wc.Flags)
}

func runMWSendInvType2(x *X) {
	n := randPSN()
	mem := x.openMW(n, AccessAll|AccessMWBind)
	mr := x.S.MR(1)
	mw := x.allocMW(x.S, 2)
	x.bindOK(x.S, 61, mw, mwLen, AccessRemoteRead|AccessRemoteWrite)
	x.Must(x.S.PostRecv(x.Ctx, 71, 0, 256), "post receive")
	msg := pattern(100, 0xc7)
	got := x.sendInv(n, mw.RKey, msg)
	x.Observe("SEND_ONLY_WITH_INVALIDATE of type 2 window 0x%08x -> %s", mw.RKey, DescribeAll(got))
	x.Check(len(got) == 1 && isACK(got[0], n), "the SEND with invalidate was not ACKed")
	wc, err := x.S.Poll(x.Ctx, answerWait)
	x.Must(err, "poll")
	if wc == nil {
		x.Failf("no receive completion")
	} else {
		x.Observe("receive completion %s, %d bytes, wc_flags 0x%x, invalidated rkey 0x%08x", wcStatusName(wc.Status), wc.ByteLen, wc.Flags, wc.InvRKey)
		x.Check(wc.WRID == 71 && wc.Status == 0 && wc.ByteLen == uint32(len(msg)), "receive completion wr %d %s %d bytes, want wr 71 SUCCESS %d bytes",
			wc.WRID, wcStatusName(wc.Status), wc.ByteLen, len(msg))
		if !wc.WithInv {
			x.Notef("without IBV_WC_WITH_INV the imm_data/invalidated_rkey field reads 0x%08x (as an immediate)", wc.Imm)
		}
		x.Check(wc.WithInv && wc.InvRKey == mw.RKey, "the receive completion does not report the invalidation (IBV_WC_WITH_INV with rkey 0x%08x): wc_flags 0x%x, invalidated rkey 0x%08x",
			mw.RKey, wc.Flags, wc.InvRKey)
	}
	x.Check(bytes.Equal(x.mem(0, 0, len(msg)), msg), "the SEND's data did not land in the receive buffer")
	psn := bth.PSNAdd(n, 1)
	got = x.winWrite(psn, mr.Addr+mwOff, mw.RKey, pattern(64, 0xc8))
	x.Observe("then WRITE through the window -> %s", DescribeAll(got))
	x.nakOnce("the WRITE through the remotely invalidated window", got, bth.SyndromeRemoteAccessError, psn)
	x.Check(bytes.Equal(x.mem(1, 0, mwSize), mem), "the WRITE through the invalidated window changed memory")
}

func runMWSendInvOtherQP(x *X) {
	n := randPSN()
	mem := x.openMW(n, AccessAll|AccessMWBind)
	a, aPeer := x.S, x.C.PeerQPN
	mr := a.MR(1)
	mw := x.allocMW(a, 2)
	x.bindOK(a, 61, mw, mwLen, AccessRemoteRead|AccessRemoteWrite)

	m := randPSN()
	b := x.OpenQP(QPSpec{RecvPSN: m})
	x.Must(b.PostRecv(x.Ctx, 72, 0, 256), "post receive on QP B")
	got := x.sendInv(m, mw.RKey, pattern(64, 0xc9))
	x.Observe("QP B: SEND_ONLY_WITH_INVALIDATE of the window bound on QP A -> %s", DescribeAll(got))
	x.refusedInvalidate(b, m, got, 72)
	x.Check(bytes.Equal(x.mem(1, 0, mwSize), mem), "the window's region changed")

	x.useQP(a, aPeer)
	data := pattern(64, 0xca)
	got = x.winWrite(n, mr.Addr+mwOff+512, mw.RKey, data)
	x.Observe("QP A: WRITE through the window -> %s", DescribeAll(got))
	x.Check(len(got) == 1 && isACK(got[0], n), "the window did not survive: a WRITE through it on QP A was not ACKed")
	copy(mem[mwOff+512:], data)
	x.Check(bytes.Equal(x.mem(1, 0, mwSize), mem), "the WRITE through the window did not land exactly")
}

func runMWSendInvType1(x *X) {
	n := randPSN()
	mem := x.openMW(n, AccessAll|AccessMWBind)
	mr := x.S.MR(1)
	mw := x.allocMW(x.S, 1)
	x.bindOK(x.S, 61, mw, mwLen, AccessRemoteRead|AccessRemoteWrite)
	x.Must(x.S.PostRecv(x.Ctx, 73, 0, 256), "post receive")
	got := x.sendInv(n, mw.RKey, pattern(64, 0xcb))
	x.Observe("SEND_ONLY_WITH_INVALIDATE of type 1 window 0x%08x -> %s", mw.RKey, DescribeAll(got))
	x.refusedInvalidate(x.S, n, got, 73)
	m := randPSN()
	x.OpenQP(QPSpec{RecvPSN: m})
	got = x.winRead(m, mr.Addr+mwOff+2048, mw.RKey, 256)
	x.Observe("fresh QP: READ through the window -> %s", DescribeAll(got))
	x.readData("READ through the type 1 window after the SEND with invalidate", got, mem[mwOff+2048:mwOff+2304])
}

// refusedBind binds mw on s and checks the target refuses; it returns the
// key to probe: the window's key for type 1 (a refused bind keeps it), the
// key the BIND_MW named for type 2.
func (x *X) refusedBind(s Session, wrID uint64, mw *MW, acc Access, what string) uint32 {
	old := mw.RKey
	refused, err := s.BindMW(x.Ctx, wrID, mw, 1, mwOff, mwLen, acc)
	x.Must(err, "bind a window")
	if refused == "" {
		x.Failf("%s: the type %d bind was accepted (key 0x%08x)", what, mw.Type, mw.RKey)
		x.Observe("type %d bind: accepted", mw.Type)
		return mw.RKey
	}
	x.Observe("type %d bind: refused (%s)", mw.Type, refused)
	if mw.Type == 2 {
		return old&^0xff | (old+1)&0xff
	}
	return old
}

func runMWBindNeedsMWBind(x *X) {
	n := randPSN()
	mem := x.openMW(n, AccessAll)
	mr := x.S.MR(1)
	mw1 := x.allocMW(x.S, 1)
	k1 := x.refusedBind(x.S, 61, mw1, AccessRemoteRead, "an MR without MW_BIND")
	b := x.OpenQP(QPSpec{RecvPSN: randPSN()})
	mw2 := x.allocMW(b, 2)
	k2 := x.refusedBind(b, 62, mw2, AccessRemoteRead, "an MR without MW_BIND")
	for i, k := range []uint32{k1, k2} {
		m := randPSN()
		x.OpenQP(QPSpec{RecvPSN: m})
		got := x.winRead(m, mr.Addr+mwOff, k, 64)
		x.Observe("fresh QP: READ through type %d key 0x%08x -> %s", i+1, k, DescribeAll(got))
		x.nakOnce(fmt.Sprintf("the READ through the refused type %d window", i+1), got, bth.SyndromeRemoteAccessError, m)
	}
	x.Check(bytes.Equal(x.mem(1, 0, mwSize), mem), "the region changed")
}

func runMWBindNeedsLocalWrite(x *X) {
	n := randPSN()
	mem := x.openMW(n, AccessRemoteRead|AccessMWBind)
	mr := x.S.MR(1)
	mw1 := x.allocMW(x.S, 1)
	x.refusedBind(x.S, 61, mw1, AccessRemoteRead|AccessRemoteWrite, "a window granting remote write over an MR without local write")
	c := x.OpenQP(QPSpec{RecvPSN: randPSN()})
	mw2 := x.allocMW(c, 2)
	k2 := x.refusedBind(c, 62, mw2, AccessRemoteWrite, "a window granting remote write over an MR without local write")

	m := randPSN()
	b := x.OpenQP(QPSpec{RecvPSN: m})
	mw3 := x.allocMW(b, 1)
	x.bindOK(b, 63, mw3, mwLen, AccessRemoteRead)
	x.Observe("read-only type 1 window: bound")
	va := mr.Addr + mwOff
	got := x.winRead(m, va+3000, mw3.RKey, 100)
	x.Observe("READ through it -> %s", DescribeAll(got))
	x.readData("READ through the read-only window", got, mem[mwOff+3000:mwOff+3100])
	psn := bth.PSNAdd(m, 1)
	got = x.winWrite(psn, va+3000, mw3.RKey, pattern(32, 0xcc))
	x.Observe("WRITE through it -> %s", DescribeAll(got))
	x.nakOnce("the WRITE through the read-only window", got, bth.SyndromeRemoteAccessError, psn)

	k := randPSN()
	x.OpenQP(QPSpec{RecvPSN: k})
	got = x.winWrite(k, va, k2, pattern(32, 0xcd))
	x.Observe("fresh QP: WRITE through the refused type 2 key 0x%08x -> %s", k2, DescribeAll(got))
	x.nakOnce("the WRITE through the refused type 2 window", got, bth.SyndromeRemoteAccessError, k)
	x.Check(bytes.Equal(x.mem(1, 0, mwSize), mem), "the region changed")
}
