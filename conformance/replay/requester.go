package replay

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/inspect"
	"github.com/softroce/softroce/verbs"
)

// The other direction: softroce's requester posts the work requests the
// captured requests show, the real responder's answers are fed to it in
// capture order (each once softroce has sent the request it answers), and
// softroce's completions are compared with what the answers complete.

// Completion is one work request of the requester check.
type Completion struct {
	Flow    int     `json:"flow"`
	Frame   int     `json:"frame"` // the message's first packet
	Op      string  `json:"op"`
	PSN     uint32  `json:"psn"`
	Length  int     `json:"length"`
	Want    string  `json:"want"` // what the real answers complete it with
	Got     string  `json:"got"`  // softroce's completion
	Verdict Verdict `json:"verdict"`
	Detail  string  `json:"detail,omitempty"`
}

// RequesterFlow says whether and how far a flow's requester side was
// checked.
type RequesterFlow struct {
	Flow     int `json:"flow"`
	Messages int `json:"messages"`
	// Segments counts the runs of messages checked on a QP each: the
	// capture's gaps end one and the next message start begins another.
	Segments int    `json:"segments"`
	Note     string `json:"note,omitempty"` // gaps, and why the check stopped if it did
}

// message is one work request a captured request shows.
type message struct {
	first     *tx
	info      *bth.OpInfo
	psn, last uint32 // first and last PSN the message occupies
	data      []byte
	imm, inv  uint32
	va        uint64
	rkey      uint32
	length    int
	swap, cmp uint64
}

// requesterWait bounds how long the check waits for softroce to send a
// request while it keeps sending new ones.
const requesterWait = 10 * time.Second

// segment is a run of messages with no PSN the capture misses: softroce's
// requester replays each on a QP of its own, starting at start.
type segment struct {
	start uint32
	ms    []*message
}

// segments derives the flow's work requests from the first transmission
// of every PSN. Where the capture misses a PSN (or cuts or garbles a
// packet), the segment ends and the next starts at the next message
// start; notes say where.
func (f *flow) segments() (segs []segment, notes []string) {
	var seg *segment
	var cur *message
	next := f.startPSN
	seeking := false // after a gap: waiting for a message start
	total := 0
	gaps, firstGap := 0, ""
	defer func() {
		switch {
		case gaps == 1:
			notes = append([]string{"the capture misses psn " + firstGap}, notes...)
		case gaps > 1:
			notes = append([]string{fmt.Sprintf("the capture misses %d PSN ranges, the first psn %s", gaps, firstGap)}, notes...)
		}
	}()
	stop := func(why string) {
		if seg != nil && len(seg.ms) > 0 {
			segs = append(segs, *seg)
		}
		seg, cur, seeking = nil, nil, true
		if why != "" {
			notes = append(notes, why)
		}
	}
	for _, t := range f.txs {
		r := t.rec
		info := bth.Opcode(r.Opcode).Info()
		d := bth.PSNDiff(r.PSN, next)
		start := info.Valid && (info.Pos == bth.PosFirst || info.Pos == bth.PosOnly)
		if seeking {
			if !start || d < 0 {
				continue
			}
			seeking, next, d = false, r.PSN, 0
		}
		switch {
		case d < 0:
			continue // a retransmission
		case d > 0:
			if gaps++; gaps == 1 {
				firstGap = fmt.Sprintf("%d..%d", next, bth.PSNAdd(r.PSN, -1))
			}
			stop("")
			if !start {
				continue
			}
			seeking, next = false, r.PSN
		case !info.Valid:
			stop(fmt.Sprintf("frame %d has an unknown opcode", r.Frame))
			continue
		case r.ICRC == "truncated" && r.PayloadLen > 0:
			stop(fmt.Sprintf("frame %d is cut by the capture", r.Frame))
			continue
		case start == (cur != nil):
			stop(fmt.Sprintf("frame %d is out of message order", r.Frame))
			continue
		}
		if seg == nil {
			seg = &segment{start: r.PSN}
		}
		if start {
			cur = &message{first: t, info: info, psn: r.PSN, last: r.PSN}
			if r.RETH != nil {
				cur.va, cur.rkey, cur.length = r.RETH.VA, r.RETH.RKey, int(r.RETH.DMALen)
			}
			if r.AtomicETH != nil {
				cur.va, cur.rkey, cur.swap, cur.cmp, cur.length = r.AtomicETH.VA, r.AtomicETH.RKey, r.AtomicETH.SwapAdd, r.AtomicETH.Compare, 8
			}
		}
		cur.data = append(cur.data, payload(r)...)
		if r.Imm != nil {
			cur.imm = *r.Imm
		}
		if r.IETH != nil {
			cur.inv = r.IETH.RKey
		}
		cur.last = r.PSN
		n := 1
		if info.Op == bth.OpReadRequest {
			n = readPackets(uint32(cur.length), f.mtu)
			cur.last = bth.PSNAdd(r.PSN, n-1)
		}
		next = bth.PSNAdd(next, n)
		if info.Pos == bth.PosLast || info.Pos == bth.PosOnly {
			if info.Op == bth.OpSend || info.Op == bth.OpWrite && info.Pos == bth.PosOnly && cur.length == 0 {
				cur.length = len(cur.data)
			}
			seg.ms = append(seg.ms, cur)
			cur = nil
			if total++; total >= 4096 {
				stop("more than 4096 messages: checked the first 4096")
				return segs, notes
			}
		}
	}
	if cur != nil {
		notes = append(notes, "the capture ends inside a message")
	}
	if seg != nil && len(seg.ms) > 0 {
		segs = append(segs, *seg)
	}
	return segs, notes
}

// wrOpcode maps a message onto a work request opcode.
func wrOpcode(m *message) (verbs.WROpcode, bool) {
	switch m.info.Op {
	case bth.OpSend:
		switch {
		case m.info.Inv:
			return verbs.WRSendWithInv, true
		case m.imm != 0 || hasImm(m):
			return verbs.WRSendWithImm, true
		}
		return verbs.WRSend, true
	case bth.OpWrite:
		if hasImm(m) {
			return verbs.WRRDMAWriteWithImm, true
		}
		return verbs.WRRDMAWrite, true
	case bth.OpReadRequest:
		return verbs.WRRDMARead, true
	case bth.OpCompareSwap:
		return verbs.WRAtomicCmpAndSwp, true
	case bth.OpFetchAdd:
		return verbs.WRAtomicFetchAndAdd, true
	}
	return 0, false
}

// hasImm reports whether the message's last packet carries immediate data.
func hasImm(m *message) bool {
	return m.info.Imm || m.last != m.psn && m.imm != 0
}

// fed returns the real answers the check feeds: those within the PSNs of
// the derived messages (answers beyond them answer requests softroce was
// never asked to send).
func (f *flow) fed(start uint32, ms []*message) []*inspect.Record {
	if len(ms) == 0 {
		return nil
	}
	end := bth.PSNDiff(ms[len(ms)-1].last, start)
	var out []*inspect.Record
	for _, r := range f.resp {
		if d := bth.PSNDiff(r.PSN, start); d >= 0 && d <= end {
			out = append(out, r)
		}
	}
	return out
}

// expectation is what the real answers complete a message with.
type expectation struct {
	done   bool
	status cq.Status
	data   []byte // READ payload, atomic original value (native order)
	why    string
}

// expect derives each message's completion from the real answers: a
// fatal NAK in a message fails it and flushes the rest (IBTA 9.7.5.1.3);
// a SEND or WRITE completes once an ACK reaches its last PSN or any
// answer passes it; a READ once its last response arrives; an atomic with
// its atomic ACK.
func (f *flow) expect(start uint32, ms []*message) []expectation {
	ex := make([]expectation, len(ms))
	failed := -1
	for i, m := range ms {
		if failed >= 0 {
			ex[i] = expectation{done: true, status: cq.WRFlushErr, why: fmt.Sprintf("flushed after the error of frame %d", ms[failed].first.rec.Frame)}
			continue
		}
		reads := map[int][]byte{}
		for _, r := range f.fed(start, ms) {
			in := bth.PSNDiff(r.PSN, m.psn) >= 0 && bth.PSNDiff(m.last, r.PSN) >= 0
			if r.AETH == nil {
				if m.info.Op == bth.OpReadRequest && bth.Opcode(r.Opcode).Info().Op == bth.OpReadResponse && in {
					reads[bth.PSNDiff(r.PSN, m.psn)] = payload(r)
				}
				continue
			}
			if r.AETH.Kind == "NAK" && r.AETH.NAKCode != nil && *r.AETH.NAKCode != bth.NAKPSNSeqError && in {
				st := map[uint8]cq.Status{bth.NAKInvalidRequest: cq.RemInvReqErr, bth.NAKRemoteAccessError: cq.RemAccessErr,
					bth.NAKRemoteOpError: cq.RemOpErr, bth.NAKInvalidRDRequest: cq.RemInvReqErr}[*r.AETH.NAKCode]
				ex[i] = expectation{done: true, status: st, why: fmt.Sprintf("NAK of frame %d", r.Frame)}
				failed = i
				break
			}
			switch m.info.Op {
			case bth.OpReadRequest:
				if bth.Opcode(r.Opcode).Info().Op == bth.OpReadResponse && in {
					reads[bth.PSNDiff(r.PSN, m.psn)] = payload(r)
				}
			case bth.OpCompareSwap, bth.OpFetchAdd:
				if r.AtomicAck != nil && r.PSN == m.psn && !ex[i].done {
					var b [8]byte
					binary.NativeEndian.PutUint64(b[:], r.AtomicAck.Orig)
					ex[i] = expectation{done: true, status: cq.Success, data: b[:], why: fmt.Sprintf("atomic ACK of frame %d", r.Frame)}
				}
			default:
				if !ex[i].done && (r.AETH.Kind == "ACK" && bth.PSNDiff(r.PSN, m.last) >= 0 || bth.PSNDiff(r.PSN, m.last) > 0 && r.AETH.Kind != "RNR_NAK") {
					ex[i] = expectation{done: true, status: cq.Success, why: fmt.Sprintf("answer of frame %d", r.Frame)}
				}
			}
		}
		if failed == i {
			continue
		}
		if m.info.Op == bth.OpReadRequest {
			n := bth.PSNDiff(m.last, m.psn) + 1
			var data []byte
			whole := true
			for k := range n {
				p, ok := reads[k]
				if !ok {
					whole = false
					break
				}
				data = append(data, p...)
			}
			if whole {
				ex[i] = expectation{done: true, status: cq.Success, data: data, why: "every READ response captured"}
			}
		}
		if !ex[i].done {
			ex[i].why = "the capture holds no answer completing it"
		}
	}
	return ex
}

func statusText(done bool, s cq.Status) string {
	if !done {
		return "no completion"
	}
	return s.String()
}

// checkRequester runs the requester side of one flow.
func (rep *Report) checkRequester(idx int, f *flow) {
	rf := RequesterFlow{Flow: idx}
	defer func() { rep.RequesterFlows = append(rep.RequesterFlows, rf) }()
	segs, notes := f.segments()
	for _, g := range segs {
		rf.Messages += len(g.ms)
	}
	rf.Segments = len(segs)
	if len(segs) == 0 {
		notes = append(notes, "no complete message captured")
	}
	defer func() { rf.Note = strings.Join(notes, "; ") }()
	if len(segs) == 0 {
		return
	}
	if !f.key.req.IsValid() || !f.key.resp.IsValid() || f.key.req.Unmap().Is4() != f.key.resp.Unmap().Is4() {
		notes = append(notes, "addresses cannot be replayed")
		return
	}
	link := newTapLink(f.key.req.Unmap())
	dev, err := verbs.Open(link, &verbs.Options{Name: "replay-requester"})
	if err != nil {
		link.Close()
		notes = append(notes, "open softroce: "+err.Error())
		return
	}
	defer func() {
		dev.Close()
		link.Close()
	}()
	pd, err := dev.AllocPD()
	if err != nil {
		notes = append(notes, err.Error())
		return
	}
	for _, g := range segs {
		cs, err := rep.runSegment(idx, f, link, dev, pd, g)
		rep.Completions = append(rep.Completions, cs...)
		if err != "" {
			notes = append(notes, err)
			return
		}
	}
}

// runSegment posts one segment's messages on a fresh softroce QP, feeds
// it the real answers and compares its completions with theirs. The
// string says why the check stopped early, if it did.
func (rep *Report) runSegment(idx int, f *flow, link *tapLink, dev *verbs.Device, pd *verbs.PD, g segment) ([]Completion, string) {
	ms := g.ms
	want := f.expect(g.start, ms)
	cqq, err := dev.CreateCQ(len(ms) + 16)
	if err != nil {
		return nil, err.Error()
	}
	defer dev.DestroyCQ(cqq)
	qp, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: cqq, RecvCQ: cqq, Cap: verbs.QPCap{MaxSendWR: len(ms), MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		return nil, err.Error()
	}
	defer qp.Destroy()
	// One local buffer holds every message's data at its own offset.
	offs := make([]int, len(ms))
	total := 0
	for i, m := range ms {
		offs[i] = total
		total += max(m.length, len(m.data), 8)
	}
	if total > maxRegion {
		return nil, fmt.Sprintf("the messages from frame %d need %d bytes, more than the %d a replay mirrors", ms[0].first.rec.Frame, total, maxRegion)
	}
	buf := make([]byte, total)
	for i, m := range ms {
		copy(buf[offs[i]:], m.data)
	}
	mr, err := pd.RegMR(buf, verbs.AccessLocalWrite)
	if err != nil {
		return nil, err.Error()
	}
	defer dev.DeregMR(mr)
	err = qp.Connect(verbs.RemoteInfo{QPN: f.key.qp, PSN: 0, GID: verbs.GIDFromAddr(f.key.resp)},
		&verbs.ConnectOptions{PathMTU: f.mtu, SQPSN: g.start, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRDAtomic: 16})
	if err != nil {
		return nil, err.Error()
	}
	before := len(link.all()) // packets of earlier segments' QPs
	for i, m := range ms {
		op, ok := wrOpcode(m)
		if !ok {
			return nil, fmt.Sprintf("frame %d: no work request sends %s", m.first.rec.Frame, m.info.Name)
		}
		w := verbs.SendWR{ID: uint64(i), Opcode: op, Flags: verbs.SendSignaled, RemoteAddr: m.va, RKey: m.rkey, Imm: m.imm, InvRKey: m.inv}
		if n := m.length; n > 0 {
			w.SGL = []verbs.SGE{{Addr: mr.Addr() + uint64(offs[i]), Length: uint32(n), LKey: mr.LKey()}}
		}
		if op == verbs.WRAtomicCmpAndSwp {
			w.CompareAdd, w.Swap = m.cmp, m.swap
		} else if op == verbs.WRAtomicFetchAndAdd {
			w.CompareAdd = m.swap
		}
		if err := qp.PostSend(&w); err != nil {
			return nil, fmt.Sprintf("frame %d: post %s: %v", m.first.rec.Frame, m.info.Name, err)
		}
	}
	// Feed the answers in capture order, each once softroce has sent a
	// request at or past its PSN.
	stopped := ""
	from := netip.AddrPortFrom(f.key.resp, f.respPort)
	rt := &reachTracker{start: g.start, mtu: f.mtu, reach: -1, n: before}
	for _, r := range f.fed(g.start, ms) {
		if !waitSent(link, rt, r.PSN) {
			stopped = fmt.Sprintf("softroce sent no request answered by frame %d (psn %d): stopped there", r.Frame, r.PSN)
			break
		}
		b := roceBytes(r)
		if b == nil || r.ICRC == "truncated" {
			continue
		}
		pkt := append([]byte(nil), b...)
		bth.BTH(pkt[:bth.BTHLen]).SetDestQP(qp.Num())
		link.Inject(pkt, from)
	}
	// Collect completions: as many as the answers complete, then what
	// else is already there.
	expected := 0
	for _, w := range want {
		if w.done {
			expected++
		}
	}
	got := map[uint64]verbs.WC{}
	wcs := make([]verbs.WC, 64)
	collect := func() bool {
		for {
			n := cqq.Poll(wcs)
			if n == 0 {
				break
			}
			for _, w := range wcs[:n] {
				got[w.WRID] = w
			}
		}
		return len(got) >= expected
	}
	// Wait for them while completions keep coming.
	for n, since := -1, time.Now(); !collect() && time.Since(since) < requesterQuiet; time.Sleep(200 * time.Microsecond) {
		if len(got) > n {
			n, since = len(got), time.Now()
		}
	}
	var cs []Completion
	for i, m := range ms {
		c := Completion{Flow: idx, Frame: m.first.rec.Frame, Op: m.info.Name, PSN: m.psn, Length: m.length, Want: statusText(want[i].done, want[i].status), Detail: want[i].why}
		w, ok := got[uint64(i)]
		c.Got = statusText(ok, w.Status)
		c.Verdict = Agree
		if c.Got != c.Want {
			c.Verdict = Differ
		} else if ok && w.Status == cq.Success && want[i].data != nil {
			if d := buf[offs[i] : offs[i]+len(want[i].data)]; !bytes.Equal(d, want[i].data) {
				c.Verdict = Differ
				c.Detail = "data landed differs from the real answers: " + firstDiff(want[i].data, d)
			}
		}
		cs = append(cs, c)
	}
	return cs, stopped
}

// reachTracker follows how far past start the PSNs of softroce's
// requests reach (-1 before any), reading each sent packet once.
type reachTracker struct {
	start uint32
	mtu   int
	n     int
	reach int
}

func (rt *reachTracker) update(out []sent) int {
	for i := rt.n; i < len(out); i++ {
		var p bth.Packet
		if bth.Parse(&p, out[i].roce) != nil || !p.Info.Request {
			continue
		}
		last := p.BTH.PSN()
		if p.Info.Op == bth.OpReadRequest && p.RETH != nil {
			last = bth.PSNAdd(last, readPackets(p.RETH.DMALen(), rt.mtu)-1)
		}
		rt.reach = max(rt.reach, bth.PSNDiff(last, rt.start))
	}
	rt.n = len(out)
	return rt.reach
}

// requesterQuiet is how long softroce's requester may send nothing new
// (retransmissions aside) before the check stops waiting for it: longer
// than the longest RNR timer (655 ms) with room for a loaded machine, shorter than requesterWait.
// (A variable: the fuzz test, whose inputs stall the requester on
// purpose, shortens it.)
var requesterQuiet = 3 * time.Second

// waitSent waits until softroce has sent a request reaching psn. It gives
// up when softroce's requests have reached no further for requesterQuiet,
// or after requesterWait.
func waitSent(link *tapLink, rt *reachTracker, psn uint32) bool {
	want := bth.PSNDiff(psn, rt.start)
	best, since := -2, time.Now()
	deadline := since.Add(requesterWait)
	for {
		reach := rt.update(link.all())
		if reach >= want {
			return true
		}
		now := time.Now()
		if reach > best {
			best, since = reach, now
		}
		if now.Sub(since) > requesterQuiet || now.After(deadline) {
			return false
		}
		time.Sleep(200 * time.Microsecond)
	}
}
