package replay

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"sort"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/inspect"
)

// The plan turns a capture into flows: the requests one requester sent to
// one responder QP, with the answers the real responder sent, each answer
// tied to the request transmission it answers. Everything here reads
// untrusted input and only counts what it cannot use.

// flowKey names a flow: requester, responder and the responder's QP (the
// destination QP of the requests).
type flowKey struct {
	req, resp netip.Addr
	qp        uint32
}

type flow struct {
	key flowKey
	// reqQPN is the requester's QP, learned from the answers' destination
	// QP or from the CM exchange; reqQPNKnown says whether it was.
	reqQPN      uint32
	reqQPNKnown bool
	// cmPSN is the requester's starting PSN from the CM exchange, when the
	// capture holds it: the connection's start was captured.
	cmPSN   uint32
	cmAlt   uint32
	cmKnown bool
	cmMTU   int

	txs  []*tx             // request transmissions, capture order
	resp []*inspect.Record // the real responder's answers, capture order
	// order interleaves both as in the capture: >= 0 is txs[i], < 0 is
	// resp[-i-1].
	order []int

	mtu      int
	startPSN uint32
	reqPort  uint16 // requester's UDP source port
	respPort uint16 // responder's UDP source port
	seenPSN  map[uint32]bool
	orphans  int // answers tied to no captured request
}

// tx is one transmission of a request packet.
type tx struct {
	rec  *inspect.Record
	real []*inspect.Record // the real responder's answers to it
	// skip says why it is not replayed ("" when it is).
	skip string
	// lost: the real responder's NAK shows it never received it.
	lost bool
	pos  int // index in flow.order
}

// plan is a capture cut into flows.
type plan struct {
	recs    []inspect.Record
	flows   []*flow
	skipped map[string]int // reason -> packets
	cm      int            // CM MADs seen (skipped)
}

func (pl *plan) skip(reason string) { pl.skipped[reason]++ }

// kindOf classifies a record: an RC request, an RC response, or neither.
func kindOf(r *inspect.Record) (info *bth.OpInfo, request, response bool) {
	info = bth.Opcode(r.Opcode).Info()
	if !info.Valid || info.Transport != bth.TransportRC {
		return info, false, false
	}
	return info, info.Request, !info.Request
}

// readPackets is the number of READ response packets a READ request of n
// bytes draws at the given MTU (one for a zero-length READ).
func readPackets(n uint32, mtu int) int {
	if mtu <= 0 {
		mtu = 256
	}
	if n == 0 {
		return 1
	}
	return int((uint64(n) + uint64(mtu) - 1) / uint64(mtu))
}

// covers reports whether an answer with PSN psn answers request t.
func covers(t *tx, psn uint32, mtu int) bool {
	d := bth.PSNDiff(psn, t.rec.PSN)
	if d == 0 {
		return true
	}
	if t.rec.RETH != nil && bth.Opcode(t.rec.Opcode).Info().Op == bth.OpReadRequest {
		return d > 0 && d < readPackets(t.rec.RETH.DMALen, mtu)
	}
	return false
}

// newPlan cuts recs into flows.
func newPlan(recs []inspect.Record) *plan {
	pl := &plan{recs: recs, skipped: map[string]int{}}
	byKey := map[flowKey]*flow{}
	// Pass 1: the flows, from the RC requests, and what CM says of them.
	type cmSide struct {
		qpn, psn uint32
		mtu      int
		from, to netip.Addr
	}
	var reqs, reps []cmSide
	for i := range recs {
		r := &recs[i]
		if !r.RoCE || !r.Located() || r.OpcodeName == "" {
			continue
		}
		if r.CM != nil {
			if r.CM.QPN != nil && r.CM.StartingPSN != nil {
				s := cmSide{qpn: *r.CM.QPN, psn: *r.CM.StartingPSN, from: r.Src, to: r.Dst}
				if r.CM.PathMTU != nil {
					s.mtu = *r.CM.PathMTU
				}
				switch r.CM.Message {
				case "REQ":
					reqs = append(reqs, s)
				case "REP":
					reps = append(reps, s)
				}
			}
			continue
		}
		if _, request, _ := kindOf(r); request {
			k := flowKey{r.Src, r.Dst, r.DestQP}
			if byKey[k] == nil {
				f := &flow{key: k, seenPSN: map[uint32]bool{}}
				byKey[k] = f
				pl.flows = append(pl.flows, f)
			}
		}
	}
	// A REQ and its REP name both QPs and both starting PSNs.
	for _, q := range reqs {
		for _, p := range reps {
			if p.from != q.to || p.to != q.from {
				continue
			}
			// The kernel CM's REQ carries the PSN the passive side's
			// requests start at and the REP the active side's (rxe's and
			// ConnectX's captures agree); a flow whose first request
			// shows the other one takes that instead.
			if f := byKey[flowKey{q.from, q.to, p.qpn}]; f != nil {
				f.reqQPN, f.reqQPNKnown, f.cmMTU = q.qpn, true, q.mtu
				f.cmPSN, f.cmAlt, f.cmKnown = p.psn, q.psn, true
			}
			if f := byKey[flowKey{p.from, p.to, q.qpn}]; f != nil {
				f.reqQPN, f.reqQPNKnown, f.cmMTU = p.qpn, true, q.mtu
				f.cmPSN, f.cmAlt, f.cmKnown = q.psn, p.psn, true
			}
		}
	}
	// Pass 2: requests and answers in capture order.
	type respKey struct {
		resp, req netip.Addr
		qp        uint32
	}
	byResp := map[respKey]*flow{}
	for i := range recs {
		r := &recs[i]
		if !r.RoCE {
			continue
		}
		if !r.Located() || r.OpcodeName == "" {
			pl.skip("undecodable (headers not captured or malformed)")
			continue
		}
		if r.CM != nil {
			pl.cm++
			continue
		}
		info, request, response := kindOf(r)
		switch {
		case request:
			f := byKey[flowKey{r.Src, r.Dst, r.DestQP}]
			f.addTx(r)
		case response:
			k := respKey{r.Src, r.Dst, r.DestQP}
			f := byResp[k]
			if f == nil {
				f = pl.answerFlow(r)
				if f == nil {
					pl.skip("answers to no captured request")
					continue
				}
				byResp[k] = f
				if !f.reqQPNKnown {
					f.reqQPN, f.reqQPNKnown = r.DestQP, true
				}
			}
			if f.respPort == 0 {
				f.respPort = r.SrcPort
			}
			f.order = append(f.order, -len(f.resp)-1)
			f.resp = append(f.resp, r)
		case !info.Valid:
			// An unknown opcode to a QP that receives requests is
			// replayed: how a responder treats it is conformance too.
			if f := byKey[flowKey{r.Src, r.Dst, r.DestQP}]; f != nil {
				f.addTx(r)
			} else {
				pl.skip("unknown opcode to no known responder QP")
			}
		default:
			switch info.Transport {
			case bth.TransportUD:
				pl.skip("UD datagrams (not CM)")
			case bth.TransportCNP:
				pl.skip("CNPs")
			default:
				pl.skip(info.Transport.String() + " packets (only RC is replayed)")
			}
		}
	}
	for _, f := range pl.flows {
		f.learn()
		f.pair()
		f.learnPSN()
	}
	return pl
}

func (f *flow) addTx(r *inspect.Record) {
	if f.reqPort == 0 {
		f.reqPort = r.SrcPort
	}
	f.order = append(f.order, len(f.txs))
	f.txs = append(f.txs, &tx{rec: r})
	f.seenPSN[r.PSN] = true
}

// answerFlow finds the flow an answer belongs to: the one between its
// addresses whose requester QP it names, or whose requests include its
// PSN, or the only one between those addresses.
func (pl *plan) answerFlow(r *inspect.Record) *flow {
	var byPSN, only *flow
	n := 0
	for _, f := range pl.flows {
		if f.key.req != r.Dst || f.key.resp != r.Src {
			continue
		}
		if f.reqQPNKnown {
			if f.reqQPN == r.DestQP {
				return f
			}
			continue
		}
		n++
		only = f
		if byPSN == nil && f.seenPSN[r.PSN] {
			byPSN = f
		}
		if byPSN == nil {
			for _, t := range f.txs {
				if covers(t, r.PSN, 256) {
					byPSN = f
					break
				}
			}
		}
	}
	if byPSN != nil {
		return byPSN
	}
	if n == 1 {
		return only
	}
	return nil
}

// pathMTUs are the IB path MTUs.
var pathMTUs = []int{256, 512, 1024, 2048, 4096}

// learn derives the flow's path MTU.
func (f *flow) learn() {
	// FIRST and MIDDLE packets (requests or READ responses) are exactly
	// one MTU long; failing those, the CM REQ says; failing that, the
	// largest MTU, which splits no message the capture shows whole.
	full := 0
	consider := func(r *inspect.Record) {
		info := bth.Opcode(r.Opcode).Info()
		if info.Valid && (info.Pos == bth.PosFirst || info.Pos == bth.PosMiddle) {
			for _, m := range pathMTUs {
				if r.PayloadLen == m && m > full {
					full = m
				}
			}
		}
	}
	for _, t := range f.txs {
		consider(t.rec)
	}
	for _, r := range f.resp {
		consider(r)
	}
	switch {
	case full > 0:
		f.mtu = full
	case f.cmMTU >= 256 && f.cmMTU <= 4096:
		f.mtu = f.cmMTU
	default:
		f.mtu = 4096
	}
}

// learnPSN derives the PSN the responder expects first.
func (f *flow) learnPSN() {
	if f.cmKnown {
		f.startPSN = f.cmPSN
		if len(f.txs) > 0 && f.txs[0].rec.PSN == f.cmAlt && f.cmAlt != f.cmPSN {
			f.startPSN = f.cmAlt
		}
		return
	}
	// Mid-connection: the first message start is where the responder's
	// expected PSN is taken to be; packets before it belong to a message
	// whose start the capture missed.
	for _, t := range f.txs {
		info := bth.Opcode(t.rec.Opcode).Info()
		if info.Valid && (info.Pos == bth.PosFirst || info.Pos == bth.PosOnly) {
			f.startPSN = t.rec.PSN
			// A PSN sequence error NAK to it names the PSN the
			// responder expected instead.
			for _, a := range t.real {
				if a.AETH != nil && a.AETH.Kind == "NAK" && a.AETH.NAKCode != nil && *a.AETH.NAKCode == bth.NAKPSNSeqError && bth.PSNDiff(t.rec.PSN, a.PSN) > 0 {
					f.startPSN = a.PSN
				}
			}
			return
		}
		t.skip = "capture starts inside this message"
	}
	if len(f.txs) > 0 {
		f.startPSN = f.txs[0].rec.PSN
	}
}

// pair ties each real answer to the request transmission it answers, and
// marks the transmissions the real responder's PSN sequence error NAKs
// show it never received.
func (f *flow) pair() {
	last := -1       // latest transmission before the answer
	var high uint32  // highest request PSN so far
	dupLast := false // the latest transmission is behind high: a duplicate
	for pos, o := range f.order {
		if o >= 0 {
			p := f.txs[o].rec.PSN
			dupLast = last >= 0 && bth.PSNDiff(p, high) < 0
			if last < 0 || bth.PSNDiff(p, high) > 0 {
				high = p
			}
			last = o
			f.txs[o].pos = pos
			continue
		}
		r := f.resp[-o-1]
		seqNAK := r.AETH != nil && r.AETH.Kind == "NAK" && r.AETH.NAKCode != nil && *r.AETH.NAKCode == bth.NAKPSNSeqError
		// A responder re-ACKs a duplicate SEND or WRITE with the PSN of
		// the last request it took, not the duplicate's (rxe does):
		// an ACK right after an unanswered duplicate answers it.
		dupACK := dupLast && len(f.txs[last].real) == 0 && r.AETH != nil && r.AETH.Kind == "ACK" &&
			bth.Opcode(r.Opcode).Info().Op == bth.OpAck && bth.Opcode(f.txs[last].rec.Opcode).Info().Op != bth.OpReadRequest
		target := last
		if !seqNAK && !dupACK {
			target = -1
			for i := last; i >= 0 && last-i < 4096; i-- {
				if covers(f.txs[i], r.PSN, f.mtu) {
					target = i
					break
				}
			}
			if target < 0 {
				// A sniffer that sees both directions on different
				// ports may record a request after its answer.
				for k, seen := pos+1, 0; k < len(f.order) && seen < 64; k++ {
					if i := f.order[k]; i >= 0 {
						seen++
						if covers(f.txs[i], r.PSN, f.mtu) {
							target = i
							break
						}
					}
				}
			}
		}
		if target < 0 {
			// An answer to a request the capture does not hold (or one
			// before any captured request): it still acknowledges the
			// requests before its PSN.
			f.orphans++
			continue
		}
		t := f.txs[target]
		t.real = append(t.real, r)
		if seqNAK {
			f.markLost(target, r.PSN)
		}
	}
}

// markLost marks, for every PSN from expected up to transmission i's,
// the latest earlier transmission of it as lost before the responder.
func (f *flow) markLost(i int, expected uint32) {
	d := bth.PSNDiff(f.txs[i].rec.PSN, expected)
	if d <= 0 || d > 4096 {
		return
	}
	found := map[uint32]bool{}
	for j := i - 1; j >= 0 && i-j <= 8192 && len(found) < d; j-- {
		p := f.txs[j].rec.PSN
		k := bth.PSNDiff(p, expected)
		if k < 0 || k >= d || found[p] {
			continue
		}
		found[p] = true
		if len(f.txs[j].real) == 0 {
			f.txs[j].lost = true
		}
	}
}

// keyPlan is what a replay registers for one captured rkey.
type keyPlan struct {
	rkey    uint32
	lo, hi  uint64 // the accessed range [lo, hi) of accesses that did not fail
	ops     map[bth.Operation]bool
	anyUsed bool
	// base is the VA of img[0]; img is the memory as the capture shows
	// it before the replay (nil when too large to mirror), known and
	// written bitmaps of its bytes: revealed by an answer, changed by a
	// captured request.
	base     uint64
	img      []byte
	known    []uint64
	written  []uint64
	nKnown   int
	tooLarge bool
}

// maxRegion bounds the memory a replay mirrors per rkey; a flow mirrors
// at most twice that.
const maxRegion = 64 << 20

// keys gathers every rkey's accesses and the memory the capture reveals.
func (f *flow) keys() map[uint32]*keyPlan {
	ks := map[uint32]*keyPlan{}
	// access describes the memory access of a transmission.
	access := func(t *tx) (k *keyPlan, va, n uint64, failed bool) {
		r := t.rec
		for _, a := range t.real {
			// Any NAK but a PSN sequence error refused the access.
			if a.AETH != nil && a.AETH.Kind == "NAK" && a.AETH.NAKCode != nil && *a.AETH.NAKCode != bth.NAKPSNSeqError {
				failed = true
			}
		}
		var key uint32
		switch {
		case r.RETH != nil:
			key, va, n = r.RETH.RKey, r.RETH.VA, uint64(r.RETH.DMALen)
		case r.AtomicETH != nil:
			key, va, n = r.AtomicETH.RKey, r.AtomicETH.VA, 8
		default:
			return nil, 0, 0, failed
		}
		k = ks[key]
		if k == nil {
			k = &keyPlan{rkey: key, ops: map[bth.Operation]bool{}}
			ks[key] = k
		}
		return k, va, n, failed
	}
	// Pass 1: the ranges and permissions.
	for _, t := range f.txs {
		if t.skip != "" || t.lost {
			continue
		}
		if k, va, n, failed := access(t); k != nil && n > 0 && !failed {
			k.note(bth.Opcode(t.rec.Opcode).Info().Op, va, n)
		}
	}
	var total uint64
	for _, k := range sortedKeys(ks) {
		if !k.anyUsed {
			continue
		}
		k.base = k.lo &^ 63
		size := k.hi - k.base
		if size > maxRegion || total+size > 2*maxRegion {
			k.tooLarge = true
			continue
		}
		total += size
		k.img = make([]byte, size)
		k.known = make([]uint64, (size+63)/64)
		k.written = make([]uint64, (size+63)/64)
	}
	// Pass 2: what the answers reveal of memory no captured request had
	// changed yet.
	var wkey *keyPlan // the WRITE in progress and where it writes next
	var wva uint64
	for _, t := range f.txs {
		if t.skip != "" || t.lost {
			continue
		}
		r := t.rec
		info := bth.Opcode(r.Opcode).Info()
		kp, va, _, failed := access(t)
		switch info.Op {
		case bth.OpWrite:
			if r.RETH != nil {
				wkey, wva = kp, va
			}
			if wkey != nil && !failed {
				for i := range payload(r) {
					wkey.mark(wva + uint64(i))
				}
				wva += uint64(r.PayloadLen)
			}
			if info.Pos == bth.PosLast || info.Pos == bth.PosOnly {
				wkey = nil
			}
		case bth.OpReadRequest:
			if kp == nil {
				break
			}
			for _, a := range t.real {
				if bth.Opcode(a.Opcode).Info().Op != bth.OpReadResponse {
					continue
				}
				off := uint64(bth.PSNDiff(a.PSN, r.PSN)) * uint64(f.mtu)
				for i, b := range payload(a) {
					kp.reveal(va+off+uint64(i), b)
				}
			}
		case bth.OpCompareSwap, bth.OpFetchAdd:
			if kp == nil {
				break
			}
			for _, a := range t.real {
				if a.AtomicAck != nil {
					var b [8]byte
					binary.NativeEndian.PutUint64(b[:], a.AtomicAck.Orig)
					for i := range b {
						kp.reveal(va+uint64(i), b[i])
					}
				}
			}
			if !failed {
				for i := range uint64(8) {
					kp.mark(va + i)
				}
			}
		}
	}
	return ks
}

func (k *keyPlan) note(op bth.Operation, va, n uint64) {
	k.ops[op] = true
	end := va + n
	if end < va { // wraps: no region can hold it
		return
	}
	if !k.anyUsed || va < k.lo {
		k.lo = va
	}
	if !k.anyUsed || end > k.hi {
		k.hi = end
	}
	k.anyUsed = true
}

// index returns va's byte in img, or false outside it.
func (k *keyPlan) index(va uint64) (uint64, bool) {
	if k.img == nil || va < k.base || va-k.base >= uint64(len(k.img)) {
		return 0, false
	}
	return va - k.base, true
}

// mark records that a captured request changed the byte at va.
func (k *keyPlan) mark(va uint64) {
	if i, ok := k.index(va); ok {
		k.written[i/64] |= 1 << (i % 64)
	}
}

// reveal records a byte the capture shows memory held before the replay
// wrote it.
func (k *keyPlan) reveal(va uint64, b byte) {
	i, ok := k.index(va)
	if !ok || k.written[i/64]&(1<<(i%64)) != 0 || k.known[i/64]&(1<<(i%64)) != 0 {
		return
	}
	k.known[i/64] |= 1 << (i % 64)
	k.img[i] = b
	k.nKnown++
}

// payload returns the packet's payload as captured (nil when cut).
func payload(r *inspect.Record) []byte {
	roce := roceBytes(r)
	if roce == nil || r.ICRC == "truncated" {
		return nil
	}
	var p bth.Packet
	if err := bth.Parse(&p, roce); err != nil {
		return nil
	}
	return p.Payload
}

// roceBytes returns the captured packet from the BTH through the ICRC.
func roceBytes(r *inspect.Record) []byte {
	if !r.Located() || r.Base > len(r.Data) {
		return nil
	}
	pkt := r.Data[r.Base:]
	end := min(r.Loc.End, len(pkt))
	if r.Loc.BTH < 0 || r.Loc.BTH+bth.BTHLen > end {
		return nil
	}
	return pkt[r.Loc.BTH:end]
}

// sortedReasons lists skip reasons in a stable order.
func sortedReasons(m map[string]int) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

func (f *flow) String() string {
	return fmt.Sprintf("%v > %v qp 0x%06x", f.key.req, f.key.resp, f.key.qp)
}
