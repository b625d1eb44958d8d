package cases

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/softroce/softroce/bth"
)

// The catalogue itself: All lists every case in report order, catalogueRefs
// ties each case to its entries in docs/conformance-catalogue.md section A,
// catalogueNotCovered gives section A.5's reasons. The helpers here serve
// every file of the catalogue; basicCases, below, are the first responder
// cases (PSN checks, duplicates, RNR, access, lengths, the ICRC: sections
// A.1, A.2 and A.3) and the requester's retransmission and go-back-N (A.1
// RS-07, RS-11; A.2 LU-02, LU-03).

// Time windows. Both targets answer within milliseconds (rxe runs in the
// kernel of a TCG guest); a window is how long the peer listens for an
// answer that must come, or for silence that must hold.
//
// A negative assertion ("exactly one NAK", "silence") does not rest on one
// quietWait: X.Never keeps checking every packet to the end of the case and
// through lateWait after it, so an answer the target sends late (a busy
// machine, cases running in parallel) still fails the case.
const (
	answerWait = 2 * time.Second
	quietWait  = 500 * time.Millisecond
	lateWait   = time.Second
)

func randPSN() uint32 { return rand.Uint32N(0xff0000) + 0x100 }

// pattern is n bytes of a PRNG stream keyed by seed: distinct seeds give
// distinct data, and nothing repeats at any offset, so data landing at the
// wrong address (by a packet, a page, 64 KiB) shows.
func pattern(n int, seed byte) []byte {
	r := rand.New(rand.NewPCG(uint64(seed), uint64(n)))
	b := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	for i := n &^ 7; i < n; i++ {
		b[i] = byte(r.Uint64())
	}
	return b
}

func le64(v uint64) []byte { return binary.LittleEndian.AppendUint64(nil, v) }

func isACK(q *Pkt, psn uint32) bool {
	return q != nil && q.ParseErr == nil && q.Opcode() == bth.RCAck && q.Syndrome().IsACK() && q.PSN() == psn
}

func isNAK(q *Pkt, syn bth.Syndrome, psn uint32) bool {
	return q != nil && q.ParseErr == nil && q.Opcode() == bth.RCAck && q.Syndrome() == syn && q.PSN() == psn
}

func first(ps []*Pkt) *Pkt {
	if len(ps) == 0 {
		return nil
	}
	return ps[0]
}

func hasNAK(ps []*Pkt) bool {
	for _, q := range ps {
		if anyNAK(q) {
			return true
		}
	}
	return false
}

// anyNAK reports whether q is a NAK (or RNR NAK) of any PSN.
func anyNAK(q *Pkt) bool {
	return q.ParseErr == nil && q.Opcode() == bth.RCAck && !q.Syndrome().IsACK()
}

// answerAt returns a predicate for an acknowledgement (ACK, NAK or atomic
// ACK) carrying psn.
func answerAt(psn uint32) func(*Pkt) bool {
	return func(q *Pkt) bool {
		return q.ParseErr == nil && (q.Opcode() == bth.RCAck || q.Opcode() == bth.RCAtomicAck) && q.PSN() == psn
	}
}

// writeOnly is an RDMA WRITE ONLY request with AckReq.
func writeOnly(psn uint32, va uint64, rkey uint32, n int) bth.Fields {
	return bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCWriteOnly, PSN: psn, AckReq: true}, VA: va, RKey: rkey, DMALen: uint32(n)}
}

func readReq(psn uint32, va uint64, rkey uint32, n int) bth.Fields {
	return bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCReadRequest, PSN: psn, AckReq: true}, VA: va, RKey: rkey, DMALen: uint32(n)}
}

func ackFields(psn, msn uint32) bth.Fields {
	return bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCAck, PSN: psn}, Syndrome: bth.SyndromeACKUnlimited, MSN: msn}
}

// mem reads target memory; a failure is a harness error.
func (x *X) mem(i, off, n int) []byte {
	b, err := x.S.ReadMem(x.Ctx, i, off, n)
	x.Must(err, "read target memory")
	return b
}

func (x *X) setMem(i, off int, b []byte) {
	x.Must(x.S.WriteMem(x.Ctx, i, off, b), "write target memory")
}

// noteState records the QP state the target reports.
func (x *X) noteState(after string) string {
	st, err := x.S.State(x.Ctx)
	if err != nil {
		x.Notef("QP state after %s: query failed: %v", after, err)
		return ""
	}
	x.Notef("QP state after %s: %s", after, st)
	return st
}

// fatalNAK is the shape of every class C responder error case: one
// request, exactly one NAK with the request's PSN, no memory change, and
// the QP in the error state afterwards (later requests go unanswered).
func fatalNAK(x *X, syn bth.Syndrome, f bth.Fields, payload []byte, memOff int) {
	psn := f.BTH.PSN
	before := x.mem(0, memOff, 64)
	x.Send(f, payload)
	got := x.C.Collect(quietWait, nil)
	x.Observe("%s -> %s", opName(f.BTH.Opcode), DescribeAll(got))
	x.Check(len(got) == 1 && isNAK(got[0], syn, psn), "want exactly one NAK 0x%02x with the request's PSN 0x%06x", uint8(syn), psn)
	x.Never("a second answer to the failed request", answerAt(psn))
	x.Check(bytes.Equal(x.mem(0, memOff, 64), before), "target memory changed")
	if st := x.noteState("the NAK"); st != "" && st != "ERR" {
		x.Notef("IBTA §10.3 moves the QP to the error state on a class C responder error; the target reports %s", st)
	}
	// A class C error ends the connection: the next request is dropped.
	mr := x.S.MR(0)
	x.Send(writeOnly(bth.PSNAdd(psn, 1), mr.Addr, mr.RKey, 8), make([]byte, 8))
	after := x.C.Collect(quietWait, nil)
	x.Notef("next request after the NAK -> %s", DescribeAll(after))
}

// All is the catalogue, in report order: responder cases (the peer
// requests, the target answers), then requester cases (the target posts,
// the peer plays a scripted responder).
var All = catalogue(basicCases, moreResponder, assemblyCases, accessCases,
	overlapCases, invalidateCases, moreAccessCases, srqCases, mwCases, datagramCases, cmCases, moreRequester, responseCases, requesterNAKCases, readRecoveryCases, requesterAckCases, congestionCases)

// catalogue concatenates case lists, responder cases first; a requester
// case's ID starts with "requester-".
func catalogue(lists ...[]*Case) []*Case {
	var resp, req []*Case
	for _, l := range lists {
		for _, c := range l {
			c.Ref = catalogueRefs[c.ID]
			if strings.HasPrefix(c.ID, "requester-") {
				req = append(req, c)
			} else {
				resp = append(resp, c)
			}
		}
	}
	return append(resp, req...)
}

// catalogueRefs maps case IDs to the docs/conformance-catalogue.md entries
// (section A) they implement.
var catalogueRefs = map[string]string{
	"psn-sequence-error": "RS-09, LU-01", "duplicate-partial-read": "RS-08", "rnr-nak": "RS-21",
	"remote-access-bad-rkey": "RS-18, GU-06", "remote-access-out-of-bounds": "GU-07", "remote-access-no-permission": "GU-12",
	"invalid-request-opcode-sequence": "RS-22", "send-longer-than-receive": "RS-24, GU-01", "icrc-corrupted-dropped": "LU-06",
	"ce-marked-accepted": "LU-07", "cnp-on-ce-marked": "LU-08", "nak-without-cnp": "LU-09", "cnp-counters-equal-trace": "LU-10",
	"read-response-segmentation": "RS-02", "zero-length-read-write": "GU-08", "zero-length-invalid-rkey": "GU-08",
	"psn-gap-mid-message-recovery": "RS-06, LU-01", "remote-access-read-bad-rkey": "RS-18", "atomic-misaligned": "GU-10",
	"atomic-compare-swap": "RS-05, GU-11", "qp-without-remote-write": "TI-05", "reserved-opcode": "RS-25",
	"send-multi-packet-with-imm": "RS-03, RS-04", "write-imm-zero-length": "GU-24", "invalid-request-first-while-open": "RS-22",
	"remote-access-read-no-permission": "GU-12", "remote-access-atomic-no-permission": "GU-12", "duplicate-mid-message-resend": "LU-02",
	"atomic-out-of-bounds": "GU-07", "requester-retransmit-after-timeout": "RS-11, LU-03", "requester-go-back-after-nak": "LU-02",
	"requester-resume-mid-message-after-nak": "RS-07", "requester-rnr-retry": "RS-20", "requester-retry-exhausted": "RS-12",
	"requester-rnr-retry-exhausted": "RS-19, GU-02", "requester-implied-nak": "RS-13", "requester-bad-response-sequence": "RS-16",
	"requester-nak-invalid-request": "GU-14", "requester-nak-remote-access": "RS-17", "requester-nak-remote-op": "GU-05",
	"requester-ghost-ack": "RS-15", "requester-read-retransmit-after-timeout": "RS-11",
	"requester-read-resume-after-partial-response": "LU-11, LU-12", "requester-resume-after-partial-ack": "LU-03",
	"mw-type1-access": "GU-20", "mw-type1-rights": "GU-20", "mw-type1-unbind": "GU-20", "mw-type2-bounds": "GU-07, GU-21", "mw-type2-local-inv": "GU-21",
	"mw-type2-other-qp": "GU-21", "mw-send-invalidate-type2": "GU-22", "mw-send-invalidate-other-qp": "GU-22",
	"mw-send-invalidate-type1": "GU-22", "mw-bind-needs-mw-bind-access": "GU-23", "mw-bind-write-needs-local-write": "GU-23",
	"write-imm-bad-rkey": "GU-09",
}

var basicCases = []*Case{
	{
		ID: "psn-sequence-error",
		Spec: "Requests at ePSN+2..ePSN+4 (a gap): exactly one NAK PSN sequence error (0x60) carrying the expected PSN; " +
			"the out-of-sequence requests are not executed; the request at ePSN is then accepted " +
			"(IBTA §9.7.5 responder PSN check, NAK codes §9.3.5 table 43)",
		Run: func(x *X) {
			n := randPSN()
			x.Open(QPSpec{RecvPSN: n})
			mr := x.S.MR(0)
			for i := 2; i <= 4; i++ {
				x.Send(writeOnly(bth.PSNAdd(n, i), mr.Addr+uint64(64*i), mr.RKey, 8), pattern(8, byte(i)))
			}
			got := x.C.Collect(quietWait, nil)
			x.Observe("3 WRITEs past a gap -> %s", DescribeAll(got))
			x.Check(len(got) == 1 && isNAK(got[0], bth.SyndromePSNSeqError, n),
				"want exactly one NAK 0x60 with the expected PSN 0x%06x, got %d response(s)", n, len(got))
			x.Never("a second NAK", anyNAK)
			x.Check(bytes.Equal(x.mem(0, 128, 200), make([]byte, 200)), "an out-of-sequence WRITE was executed")
			x.Send(writeOnly(n, mr.Addr, mr.RKey, 8), pattern(8, 1))
			got = x.C.Expect(answerWait, 1)
			x.Observe("then the expected PSN -> %s", DescribeAll(got))
			x.Check(isACK(first(got), n), "the request at the expected PSN was not ACKed")
		},
	},
	{
		ID: "duplicate-write",
		Spec: "A duplicate RDMA WRITE (PSN already executed) is acknowledged again (ACK, PSN of the newest " +
			"executed request) and not NAKed (IBTA §9.7.5.2.1 duplicate requests, C9-105)",
		Run: func(x *X) {
			n := randPSN()
			x.Open(QPSpec{RecvPSN: n})
			mr := x.S.MR(0)
			f := writeOnly(n, mr.Addr, mr.RKey, 16)
			x.Send(f, pattern(16, 3))
			got := x.C.Expect(answerWait, 1)
			x.Observe("WRITE -> %s", DescribeAll(got))
			x.Check(isACK(first(got), n), "the original WRITE was not ACKed")
			x.Send(f, pattern(16, 3))
			got = x.C.Collect(quietWait, nil)
			x.Observe("duplicate -> %s", DescribeAll(got))
			x.Check(len(got) >= 1 && isACK(got[0], n), "the duplicate WRITE was not re-ACKed with PSN 0x%06x", n)
			x.Check(!hasNAK(got), "the duplicate was NAKed")
			x.Never("a NAK for the duplicate", anyNAK)
			x.Check(bytes.Equal(x.mem(0, 0, 16), pattern(16, 3)), "memory differs from the WRITE's data")
		},
	},
	{
		ID: "duplicate-send",
		Spec: "A duplicate SEND is ACKed again and does not consume a second receive WQE (no second completion); " +
			"the next new SEND completes normally (IBTA §9.7.5.2.1 duplicate requests)",
		Run: func(x *X) {
			n := randPSN()
			x.Open(QPSpec{RecvPSN: n})
			x.Must(x.S.PostRecv(x.Ctx, 1, 0, 256), "post receive")
			x.Must(x.S.PostRecv(x.Ctx, 2, 256, 256), "post receive")
			f := bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCSendOnly, PSN: n, AckReq: true}}
			x.Send(f, pattern(40, 9))
			got := x.C.Expect(answerWait, 1)
			x.Observe("SEND -> %s", DescribeAll(got))
			x.Check(isACK(first(got), n), "the SEND was not ACKed")
			wc, err := x.S.Poll(x.Ctx, answerWait)
			x.Must(err, "poll")
			x.Check(wc != nil && wc.WRID == 1 && wc.Status == 0 && wc.ByteLen == 40, "receive completion %+v, want wr 1 success 40 bytes", wc)
			x.Send(f, pattern(40, 9))
			got = x.C.Collect(quietWait, nil)
			x.Observe("duplicate -> %s", DescribeAll(got))
			x.Check(len(got) >= 1 && isACK(got[0], n), "the duplicate SEND was not re-ACKed")
			x.Never("a NAK for the duplicate", anyNAK)
			wc, err = x.S.Poll(x.Ctx, quietWait)
			x.Must(err, "poll")
			x.Check(wc == nil, "the duplicate consumed a receive: completion %+v", wc)
			x.Send(bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCSendOnly, PSN: bth.PSNAdd(n, 1), AckReq: true}}, pattern(20, 1))
			got = x.C.Expect(answerWait, 1)
			x.Observe("next SEND -> %s", DescribeAll(got))
			x.Check(isACK(first(got), bth.PSNAdd(n, 1)), "the next SEND was not ACKed")
			wc, err = x.S.Poll(x.Ctx, answerWait)
			x.Must(err, "poll")
			x.Check(wc != nil && wc.WRID == 2 && wc.Status == 0 && wc.ByteLen == 20, "second receive completion %+v, want wr 2 success 20 bytes", wc)
		},
	},
	{
		ID: "duplicate-read",
		Spec: "A duplicate RDMA READ request is executed again: the responses carry the original PSNs and the " +
			"memory's data; the responder's expected PSN does not move (IBTA §9.7.5.2.1 duplicate requests)",
		Run: func(x *X) {
			n := randPSN()
			x.Open(QPSpec{RecvPSN: n})
			mr := x.S.MR(0)
			data := pattern(100, 5)
			x.setMem(0, 0, data)
			f := readReq(n, mr.Addr, mr.RKey, 100)
			x.Send(f, nil)
			got := x.C.Expect(answerWait, 1)
			x.Observe("READ -> %s", DescribeAll(got))
			q := first(got)
			x.Check(q != nil && q.Opcode() == bth.RCReadResponseOnly && q.PSN() == n && bytes.Equal(q.P.Payload, data),
				"the READ was not answered with READ_RESPONSE_ONLY at PSN 0x%06x and the memory's data", n)
			x.Send(f, nil)
			got = x.C.Expect(answerWait, 1)
			x.Observe("duplicate -> %s", DescribeAll(got))
			q = first(got)
			x.Check(q != nil && q.Opcode() == bth.RCReadResponseOnly && q.PSN() == n && bytes.Equal(q.P.Payload, data),
				"the duplicate READ was not re-executed (READ_RESPONSE_ONLY, PSN 0x%06x, same data)", n)
			x.Send(writeOnly(bth.PSNAdd(n, 1), mr.Addr+4096, mr.RKey, 8), pattern(8, 1))
			got = x.C.Expect(answerWait, 1)
			x.Observe("next request -> %s", DescribeAll(got))
			x.Check(isACK(first(got), bth.PSNAdd(n, 1)), "the request after the duplicate was not accepted")
		},
	},
	{
		ID: "duplicate-atomic",
		Spec: "A duplicate FETCH_ADD is not executed again: the ATOMIC ACKNOWLEDGE replays the saved original " +
			"value and memory changes once (IBTA §9.7.5.2.1 duplicate requests, atomic responder resources)",
		Run: func(x *X) {
			n := randPSN()
			x.Open(QPSpec{RecvPSN: n})
			mr := x.S.MR(0)
			x.setMem(0, 64, le64(100))
			f := bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCFetchAdd, PSN: n, AckReq: true}, VA: mr.Addr + 64, RKey: mr.RKey, SwapAdd: 5}
			x.Send(f, nil)
			got := x.C.Expect(answerWait, 1)
			x.Observe("FETCH_ADD -> %s", DescribeAll(got))
			q := first(got)
			x.Check(q != nil && q.Opcode() == bth.RCAtomicAck && q.PSN() == n && q.P.AtomicAckETH.Orig() == 100,
				"want ATOMIC_ACKNOWLEDGE at 0x%06x with original value 100", n)
			x.Send(f, nil)
			got = x.C.Expect(answerWait, 1)
			x.Observe("duplicate -> %s", DescribeAll(got))
			q = first(got)
			x.Check(q != nil && q.Opcode() == bth.RCAtomicAck && q.PSN() == n && q.P.AtomicAckETH.Orig() == 100,
				"the duplicate did not replay the original value 100 at PSN 0x%06x", n)
			v := binary.LittleEndian.Uint64(x.mem(0, 64, 8))
			x.Observe("memory %d", v)
			x.Check(v == 105, "memory is %d, want 105 (executed exactly once)", v)
		},
	},
	{
		ID: "rnr-nak",
		Spec: "A SEND with no receive WQE posted draws an RNR NAK (syndrome 0x20|min_rnr_timer) with the SEND's PSN " +
			"and leaves the QP usable; resent after a receive is posted, it is ACKed and completes " +
			"(IBTA §9.7.5.2.8, timer table 45)",
		Run: func(x *X) {
			n := randPSN()
			x.Open(QPSpec{RecvPSN: n, MinRNRTimer: 18})
			f := bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCSendOnly, PSN: n, AckReq: true}}
			data := pattern(16, 2)
			x.Send(f, data)
			got := x.C.Collect(quietWait, nil)
			x.Observe("SEND, no receive -> %s", DescribeAll(got))
			x.Check(len(got) == 1 && isNAK(got[0], bth.RNRNAK(18), n), "want exactly one RNR NAK 0x32 at PSN 0x%06x", n)
			x.Never("a second NAK", anyNAK)
			x.Must(x.S.PostRecv(x.Ctx, 7, 0, 64), "post receive")
			x.Send(f, data)
			got = x.C.Expect(answerWait, 1)
			x.Observe("resent after posting -> %s", DescribeAll(got))
			x.Check(isACK(first(got), n), "the resent SEND was not ACKed")
			wc, err := x.S.Poll(x.Ctx, answerWait)
			x.Must(err, "poll")
			x.Check(wc != nil && wc.WRID == 7 && wc.Status == 0 && wc.ByteLen == 16, "receive completion %+v, want wr 7 success 16 bytes", wc)
			x.Check(bytes.Equal(x.mem(0, 0, 16), data), "received data differs")
		},
	},
	{
		ID:   "remote-access-bad-rkey",
		Spec: "An RDMA WRITE with an unknown R_Key: NAK remote access error (0x62) with the request's PSN, no memory change, QP to error (IBTA §9.7.5 class C, §9.3.5 table 43)",
		Run: func(x *X) {
			n := randPSN()
			x.Open(QPSpec{RecvPSN: n})
			mr := x.S.MR(0)
			fatalNAK(x, bth.SyndromeRemoteAccessError, writeOnly(n, mr.Addr, mr.RKey^0x00a5a500, 8), pattern(8, 1), 0)
		},
	},
	{
		ID:   "remote-access-out-of-bounds",
		Spec: "An RDMA WRITE that runs 12 bytes past the end of the MR: NAK remote access error (0x62), no memory change, QP to error (IBTA §9.7.5 class C, §10.6 memory access checks)",
		Run: func(x *X) {
			n := randPSN()
			x.Open(QPSpec{RecvPSN: n})
			mr := x.S.MR(0)
			fatalNAK(x, bth.SyndromeRemoteAccessError, writeOnly(n, mr.Addr+uint64(mr.Len)-4, mr.RKey, 16), pattern(16, 1), mr.Len-64)
		},
	},
	{
		ID:   "remote-access-no-permission",
		Spec: "An RDMA WRITE into an MR registered without REMOTE_WRITE: NAK remote access error (0x62), no memory change, QP to error (IBTA §9.7.5 class C, §10.6 access rights)",
		Run: func(x *X) {
			n := randPSN()
			x.Open(QPSpec{RecvPSN: n, MRs: []MRSpec{{Len: 16384, Access: AccessLocalWrite | AccessRemoteRead}}})
			mr := x.S.MR(0)
			fatalNAK(x, bth.SyndromeRemoteAccessError, writeOnly(n, mr.Addr, mr.RKey, 8), pattern(8, 1), 0)
		},
	},
	{
		ID:   "invalid-request-opcode-sequence",
		Spec: "An RDMA WRITE MIDDLE with no WRITE FIRST before it: NAK invalid request (0x61) with its PSN, QP to error (IBTA §9.7.5 opcode sequence check, class C)",
		Run: func(x *X) {
			n := randPSN()
			x.Open(QPSpec{RecvPSN: n})
			f := bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCWriteMiddle, PSN: n, AckReq: true}}
			fatalNAK(x, bth.SyndromeInvalidRequest, f, pattern(x.Spec.MTU, 4), 0)
		},
	},
	{
		ID: "send-longer-than-receive",
		Spec: "A SEND longer than the posted receive buffer: NAK invalid request (0x61) with its PSN, the receive " +
			"completes in error, QP to error (IBTA §9.7.5 class C: the message is too long for the WQE)",
		Known: map[string]string{"rxe": "rxe NAKs remote operational error (0x63), not invalid request (docs/rxe-behaviour.md §9)"},
		Run: func(x *X) {
			n := randPSN()
			x.Open(QPSpec{RecvPSN: n})
			x.Must(x.S.PostRecv(x.Ctx, 3, 0, 16), "post receive")
			f := bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCSendOnly, PSN: n, AckReq: true}}
			x.Send(f, pattern(64, 6))
			got := x.C.Collect(quietWait, nil)
			x.Observe("64-byte SEND into a 16-byte receive -> %s", DescribeAll(got))
			x.Check(len(got) == 1 && isNAK(got[0], bth.SyndromeInvalidRequest, n), "want exactly one NAK 0x61 at PSN 0x%06x", n)
			x.Never("a second answer to the SEND", answerAt(n))
			wc, err := x.S.Poll(x.Ctx, answerWait)
			x.Must(err, "poll")
			if wc == nil {
				x.Failf("the receive WQE did not complete")
			} else {
				x.Observe("receive completion status %s", wcStatusName(wc.Status))
				x.Check(wc.WRID == 3 && wc.Status != 0, "receive completion %+v, want wr 3 in error", wc)
			}
			x.noteState("the NAK")
		},
	},
	{
		ID: "icrc-corrupted-dropped",
		Spec: "A request with a wrong ICRC is silently dropped (no ACK or NAK, not executed); the same request " +
			"sent again with a good ICRC is accepted at the same PSN (IBTA annex A17.3.3, §9.7.5)",
		Run: func(x *X) {
			n := randPSN()
			x.Open(QPSpec{RecvPSN: n})
			mr := x.S.MR(0)
			f := writeOnly(n, mr.Addr, mr.RKey, 32)
			data := pattern(32, 8)
			x.SendBadICRC(f, data)
			got := x.C.Collect(quietWait, nil)
			x.Observe("bad ICRC -> %s", DescribeAll(got))
			x.Check(len(got) == 0, "the packet with a bad ICRC was answered")
			x.Check(bytes.Equal(x.mem(0, 0, 32), make([]byte, 32)), "the packet with a bad ICRC was executed")
			x.Send(f, data)
			got = x.C.Expect(answerWait, 1)
			x.Observe("good ICRC, same PSN -> %s", DescribeAll(got))
			x.Check(isACK(first(got), n), "the good packet was not ACKed at PSN 0x%06x", n)
			// One packet with a good ICRC draws one answer: a second is an
			// answer to the corrupted one.
			x.Never("a second answer at the PSN", answerAt(n))
			x.Check(bytes.Equal(x.mem(0, 0, 32), data), "the good packet was not executed")
		},
	},
	{
		ID: "psn-wraparound",
		Spec: "With the expected PSN at 0xFFFFFE, WRITEs at 0xFFFFFE, 0xFFFFFF, 0x000000, 0x000001 are all " +
			"executed and ACKed, with no NAK (IBTA §9.7.1: PSNs are 24-bit and wrap)",
		Run: func(x *X) {
			n := uint32(0xfffffe)
			x.Open(QPSpec{RecvPSN: n})
			mr := x.S.MR(0)
			for i := 0; i < 4; i++ {
				x.Send(writeOnly(bth.PSNAdd(n, i), mr.Addr+uint64(64*i), mr.RKey, 8), pattern(8, byte(10+i)))
			}
			got := x.C.Collect(answerWait, func(q *Pkt) bool { return isACK(q, 1) || hasNAK([]*Pkt{q}) })
			got = append(got, x.C.Collect(quietWait/3, nil)...)
			x.Observe("4 WRITEs across the wrap -> %s", DescribeAll(got))
			last := uint32(0xffffffff)
			for _, q := range got {
				if q.Opcode() == bth.RCAck && q.Syndrome().IsACK() {
					last = q.PSN()
				}
			}
			x.Check(!hasNAK(got), "a request across the wrap was NAKed")
			x.Never("a NAK", anyNAK)
			x.Check(last == 1, "the last ACK is not for PSN 0x000001")
			for i := 0; i < 4; i++ {
				x.Check(bytes.Equal(x.mem(0, 64*i, 8), pattern(8, byte(10+i))), "WRITE %d (PSN 0x%06x) not executed", i, bth.PSNAdd(n, i))
			}
		},
	},
	{
		ID: "read-response-segmentation",
		Spec: "An RDMA READ of 3*PMTU+5 bytes (PMTU 1024) is answered READ_RESPONSE FIRST, MIDDLE, MIDDLE, LAST at " +
			"consecutive PSNs from the request's: FIRST/MIDDLE carry exactly PMTU bytes, LAST 5 bytes with PadCnt 3, AETH " +
			"on FIRST and LAST only; the READ consumes 4 PSNs (IBTA §9.7.5, C9-92, AETH §9.3.5)",
		Run: func(x *X) {
			n := randPSN()
			x.Open(QPSpec{RecvPSN: n, MTU: 1024})
			mr := x.S.MR(0)
			size := 3*1024 + 5
			data := pattern(size, 11)
			x.setMem(0, 0, data)
			x.Send(readReq(n, mr.Addr, mr.RKey, size), nil)
			got := x.C.Expect(answerWait, 4)
			x.Observe("READ %d bytes -> %s", size, DescribeAll(got))
			want := []struct {
				op   bth.Opcode
				n    int
				aeth bool
			}{{bth.RCReadResponseFirst, 1024, true}, {bth.RCReadResponseMiddle, 1024, false}, {bth.RCReadResponseMiddle, 1024, false}, {bth.RCReadResponseLast, 5, true}}
			var all []byte
			if x.Check(len(got) == 4, "want 4 responses, got %d", len(got)) {
				for i, q := range got {
					w := want[i]
					x.Check(q.Opcode() == w.op && q.PSN() == bth.PSNAdd(n, i) && len(q.P.Payload) == w.n && (q.P.AETH != nil) == w.aeth,
						"response %d is %s, want %s@0x%06x %dB", i, Describe(q), w.op, bth.PSNAdd(n, i), w.n)
					all = append(all, q.P.Payload...)
				}
				x.Check(got[3].P.BTH.PadCnt() == 3, "LAST has PadCnt %d, want 3", got[3].P.BTH.PadCnt())
				x.Check(bytes.Equal(all, data), "response data differs from memory")
			}
			x.Send(writeOnly(bth.PSNAdd(n, 4), mr.Addr+8192, mr.RKey, 8), pattern(8, 1))
			got = x.C.Expect(answerWait, 1)
			x.Observe("request at PSN+4 -> %s", DescribeAll(got))
			x.Check(isACK(first(got), bth.PSNAdd(n, 4)), "the request at PSN+4 was not accepted")
		},
	},
	{
		ID: "zero-length-read-write",
		Spec: "A zero-length RDMA WRITE is ACKed; a zero-length RDMA READ is answered by one empty READ_RESPONSE_ONLY " +
			"and consumes one PSN (IBTA §9.7.5, C9-88)",
		Run: func(x *X) {
			n := randPSN()
			x.Open(QPSpec{RecvPSN: n})
			mr := x.S.MR(0)
			x.Send(writeOnly(n, mr.Addr, mr.RKey, 0), nil)
			got := x.C.Expect(answerWait, 1)
			x.Observe("WRITE 0 bytes -> %s", DescribeAll(got))
			x.Check(isACK(first(got), n), "the zero-length WRITE was not ACKed")
			x.Send(readReq(bth.PSNAdd(n, 1), mr.Addr, mr.RKey, 0), nil)
			got = x.C.Expect(answerWait, 1)
			x.Observe("READ 0 bytes -> %s", DescribeAll(got))
			q := first(got)
			x.Check(q != nil && q.Opcode() == bth.RCReadResponseOnly && q.PSN() == bth.PSNAdd(n, 1) && len(q.P.Payload) == 0,
				"want an empty READ_RESPONSE_ONLY at 0x%06x", bth.PSNAdd(n, 1))
			x.Send(writeOnly(bth.PSNAdd(n, 2), mr.Addr, mr.RKey, 8), pattern(8, 1))
			got = x.C.Expect(answerWait, 1)
			x.Observe("next -> %s", DescribeAll(got))
			x.Check(isACK(first(got), bth.PSNAdd(n, 2)), "the request after the zero-length READ was not accepted at PSN+2")
		},
	},
	{
		ID: "zero-length-invalid-rkey",
		Spec: "A zero-length RDMA WRITE and READ with an R_Key that names no MR (and VA 0) still succeed: with DMA " +
			"length 0 the responder does not check the R_Key or VA (IBTA C9-88)",
		Run: func(x *X) {
			n := randPSN()
			x.Open(QPSpec{RecvPSN: n})
			x.Send(writeOnly(n, 0, 0xdead00be, 0), nil)
			got := x.C.Expect(answerWait, 1)
			x.Observe("WRITE 0 bytes, bad rkey -> %s", DescribeAll(got))
			x.Check(isACK(first(got), n), "the zero-length WRITE with a bad R_Key was not ACKed")
			x.Send(readReq(bth.PSNAdd(n, 1), 0, 0xdead00be, 0), nil)
			got = x.C.Expect(answerWait, 1)
			x.Observe("READ 0 bytes, bad rkey -> %s", DescribeAll(got))
			q := first(got)
			x.Check(q != nil && q.Opcode() == bth.RCReadResponseOnly && q.PSN() == bth.PSNAdd(n, 1) && len(q.P.Payload) == 0,
				"want an empty READ_RESPONSE_ONLY at 0x%06x", bth.PSNAdd(n, 1))
		},
	},
	{
		ID: "requester-retransmit-after-timeout",
		Spec: "A WRITE whose ACK never comes is retransmitted with the same PSN and opcode after the local ACK " +
			"timeout (timeout 14: T = 4.096 us*2^14 = 67 ms; IBTA §9.7.6.1.3 allows T..4T; the check allows 10% below T for timer granularity, " +
			"two jiffies for rxe); ACKed, it completes successfully",
		Run: func(x *X) {
			s := randPSN()
			x.Open(QPSpec{SendPSN: s, Timeout: 14, Retry: 3})
			data := pattern(64, 12)
			x.setMem(0, 0, data)
			x.Must(x.S.PostSend(x.Ctx, SendReq{WRID: 21, Op: SendWrite, Len: 64, RemoteAddr: 0x10000, RKey: 0x1234}), "post WRITE")
			got := x.C.Expect(answerWait, 1)
			q1 := first(got)
			if !x.Check(q1 != nil && q1.Opcode() == bth.RCWriteOnly && q1.PSN() == s && bytes.Equal(q1.P.Payload, data),
				"want WRITE_ONLY at PSN 0x%06x with the data, got %s", s, DescribeAll(got)) {
				return
			}
			got = x.C.Expect(answerWait, 1)
			q2 := first(got)
			if !x.Check(q2 != nil, "no retransmission within %v", answerWait) {
				return
			}
			gap := q2.Time.Sub(q1.Time)
			x.Observe("WRITE, no ACK -> %s after %.1f ms", Describe(q2), float64(gap.Microseconds())/1000)
			T := 67108864 * time.Nanosecond
			x.Check(q2.Opcode() == bth.RCWriteOnly && q2.PSN() == s && bytes.Equal(q2.P.Payload, data), "the retransmission is not the same packet")
			x.Check(gap >= timeoutLow(x, T) && gap <= 4*T+50*time.Millisecond, "retransmitted after %v, want %v..%v", gap, T, 4*T)
			x.Send(ackFields(s, 1), nil)
			wc, err := x.S.Poll(x.Ctx, answerWait)
			x.Must(err, "poll")
			x.Observe("ACKed -> completion status %v", statusOf(wc))
			x.Check(wc != nil && wc.WRID == 21 && wc.Status == 0, "completion %+v, want wr 21 success", wc)
		},
	},
	{
		ID: "requester-go-back-after-nak",
		Spec: "A 3-packet WRITE NAKed with PSN sequence error (0x60) at its first PSN is resent from that PSN " +
			"(WRITE FIRST, MIDDLE, LAST, same PSNs) without waiting for the ACK timeout; ACKed, it completes " +
			"(IBTA §9.7.6 go-back-N on NAK sequence error)",
		Run: func(x *X) {
			s := randPSN()
			x.Open(QPSpec{SendPSN: s, Timeout: 14, Retry: 3, MTU: 1024})
			data := pattern(3*1024, 13)
			x.setMem(0, 0, data)
			x.Must(x.S.PostSend(x.Ctx, SendReq{WRID: 22, Op: SendWrite, Len: len(data), RemoteAddr: 0x20000, RKey: 0x4321}), "post WRITE")
			got := x.C.Expect(answerWait, 3)
			x.Observe("WRITE 3 KiB -> %s", DescribeAll(got))
			if !x.Check(len(got) == 3 && got[0].Opcode() == bth.RCWriteFirst && got[0].PSN() == s, "want 3 packets from WRITE_FIRST@0x%06x", s) {
				return
			}
			nakAt := time.Now()
			x.Send(bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCAck, PSN: s}, Syndrome: bth.SyndromePSNSeqError}, nil)
			got = x.C.Expect(answerWait, 3)
			x.Observe("NAK 0x60@first -> %s", DescribeAll(got))
			want := []bth.Opcode{bth.RCWriteFirst, bth.RCWriteMiddle, bth.RCWriteLast}
			if x.Check(len(got) == 3, "want 3 retransmitted packets, got %d", len(got)) {
				for i, q := range got {
					x.Check(q.Opcode() == want[i] && q.PSN() == bth.PSNAdd(s, i) && bytes.Equal(q.P.Payload, data[i*1024:(i+1)*1024]),
						"retransmission %d is %s, want %s@0x%06x with the same data", i, Describe(q), want[i], bth.PSNAdd(s, i))
				}
				d := got[0].Time.Sub(nakAt)
				x.Notef("first retransmission %.1f ms after the NAK", float64(d.Microseconds())/1000)
				x.Check(d < 60*time.Millisecond, "retransmission came %v after the NAK: that is the timeout, not the NAK", d)
			}
			x.Send(ackFields(bth.PSNAdd(s, 2), 1), nil)
			wc, err := x.S.Poll(x.Ctx, answerWait)
			x.Must(err, "poll")
			x.Observe("ACKed -> completion status %v", statusOf(wc))
			x.Check(wc != nil && wc.WRID == 22 && wc.Status == 0, "completion %+v, want wr 22 success", wc)
		},
	},
	{
		ID: "requester-resume-mid-message-after-nak",
		Spec: "A 3-packet WRITE NAKed 0x60 at its second PSN is resent from that PSN: WRITE MIDDLE then LAST " +
			"with the original PSNs, no new FIRST (IBTA §9.7.6 go-back-N: the NAK implicitly ACKs earlier PSNs)",
		Run: func(x *X) {
			s := randPSN()
			x.Open(QPSpec{SendPSN: s, Timeout: 14, Retry: 3, MTU: 1024})
			data := pattern(3*1024, 14)
			x.setMem(0, 0, data)
			x.Must(x.S.PostSend(x.Ctx, SendReq{WRID: 23, Op: SendWrite, Len: len(data), RemoteAddr: 0x20000, RKey: 0x4321}), "post WRITE")
			got := x.C.Expect(answerWait, 3)
			if !x.Check(len(got) == 3, "want 3 packets, got %s", DescribeAll(got)) {
				return
			}
			x.Send(bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCAck, PSN: bth.PSNAdd(s, 1)}, Syndrome: bth.SyndromePSNSeqError}, nil)
			got = x.C.Expect(answerWait, 2)
			x.Observe("NAK 0x60@first+1 -> %s", DescribeAll(got))
			want := []bth.Opcode{bth.RCWriteMiddle, bth.RCWriteLast}
			if x.Check(len(got) == 2, "want 2 retransmitted packets, got %d", len(got)) {
				for i, q := range got {
					x.Check(q.Opcode() == want[i] && q.PSN() == bth.PSNAdd(s, i+1) && bytes.Equal(q.P.Payload, data[(i+1)*1024:(i+2)*1024]),
						"retransmission %d is %s, want %s@0x%06x", i, Describe(q), want[i], bth.PSNAdd(s, i+1))
				}
			}
			x.Send(ackFields(bth.PSNAdd(s, 2), 1), nil)
			wc, err := x.S.Poll(x.Ctx, answerWait)
			x.Must(err, "poll")
			x.Observe("ACKed -> completion status %v", statusOf(wc))
			x.Check(wc != nil && wc.WRID == 23 && wc.Status == 0, "completion %+v, want wr 23 success", wc)
		},
	},
}

func statusOf(wc *Completion) string {
	if wc == nil {
		return "none"
	}
	return wcStatusName(wc.Status)
}

// catalogueNotCovered are the entries of the catalogue's numbering that
// no case implements, with why: docs/conformance-catalogue.md section A.5
// (TestCatalogueCoverage keeps the two in step).
var catalogueNotCovered = map[string]string{
	"RS-01": "the first step of many cases (`duplicate-write`, `psn-sequence-error`, ...), not a case of its own",
	"RS-10": "RS-12 covers retry exhaustion; the NAK-driven count is not scripted yet",
	"RS-14": "a variant of `requester-implied-nak`, not scripted yet",
	"RS-23": "the CQ overrun rules are unit tests of packages cq and verbs; not a packet case yet",
	"RS-26": "not scripted yet",
	"LU-04": "not scripted yet",
	"LU-05": "not scripted yet",
	"LU-13": "the verbs agent reads no rxe counters",
	"LU-14": "timings are recorded in the requester cases' notes, not judged",
	"LU-15": "a property of a switch capture, not of a target",
	"GU-03": "\"never completes\" has no end a case can wait for",
	"GU-04": "not scripted yet",
	"GU-13": "not scripted yet: the harness opens QPs in RTS",
	"GU-15": "verbs-level: unit tests of packages qpstate and verbs",
	"GU-16": "verbs-level: unit tests of package verbs",
	"GU-17": "verbs-level: unit tests of package verbs",
	"GU-18": "verbs-level: unit tests of packages cq and verbs",
	"GU-19": "needs a local error (bad lkey) the harness does not post",
	"TI-01": "the interop tests (`e2e/interop`, `tools/perftest`) run the tools",
	"TI-02": "as TI-01",
	"TI-03": "as TI-01",
	"TI-04": "the interop tests and `tools/pingpong`",
	"TI-06": "not scripted yet",
	"TI-07": "not scripted yet",
}
