// Package replay replays a capture of a real RC requester talking to a
// real responder (a ConnectX, rdma_rxe, any RNIC) into softroce's
// responder and compares softroce's answers with the real ones.
//
// Each requester QP's requests to one responder QP form a flow. For each
// flow a softroce device is opened on an in-process link that injects one
// captured request at a time and records what the device answers. The
// softroce QP is connected to match the capture: the requester's QP number
// and starting PSN (from the CM exchange when the capture holds it,
// otherwise learned from the first message start), the path MTU (from
// full-sized FIRST and MIDDLE packets, else the CM REQ). One MR is
// registered per captured rkey, covering the ranges the RETHs and
// AtomicETHs touched, with the permissions the successful accesses used,
// and filled with what READ responses and atomic original values show the
// memory held before the capture's own writes. A receive is posted before
// each SEND the real responder accepted, none before one it RNR-NAKed.
// Requests' QP numbers, rkeys and virtual addresses are rewritten onto
// softroce's; answers keep the capture's PSNs.
//
// Answers are compared field by field: opcode, PSN, AETH class and
// syndrome, MSN, READ response payloads, atomic original values. What IBTA
// leaves to the responder is an allowed difference, not a failure: one ACK
// covering several requests (§9.7.5.1.1 coalescing), the credit count of
// an ACK (§9.7.7.2), the RNR timer value, an ACK of a packet that did not
// ask for one. The real responder's PSN sequence error NAKs show which
// requests it never received; those are not replayed.
//
// CM MADs (UD SENDs to QP1) are counted and skipped, as are UD, UC and CNP
// packets.
package replay

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/gopacket/gopacket"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/icrc"
	"github.com/softroce/softroce/inspect"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/nic/capture"
	"github.com/softroce/softroce/verbs"
)

// Verdict is an exchange's outcome.
type Verdict string

// Verdicts.
const (
	Agree   Verdict = "agree"
	Allowed Verdict = "allowed"
	Differ  Verdict = "differ"
)

// Exchange is one replayed request packet and the answers to it.
type Exchange struct {
	Flow    int     `json:"flow"`
	Frame   int     `json:"frame"`
	Opcode  string  `json:"opcode"`
	PSN     uint32  `json:"psn"`
	Verdict Verdict `json:"verdict"`
	// Allowed lists the differences the spec allows; Failures the rest.
	Allowed  []string `json:"allowed,omitempty"`
	Failures []string `json:"failures,omitempty"`
	// Request, Real and Softroce are the packets as softroce inspect
	// prints them.
	Request  string   `json:"request"`
	Real     []string `json:"real"`
	Softroce []string `json:"softroce"`

	real, soft []*inspect.Record
}

// Flow describes one replayed flow and how softroce was set up for it.
type Flow struct {
	Requester   netip.Addr `json:"requester"`
	Responder   netip.Addr `json:"responder"`
	RequesterQP uint32     `json:"requester_qp"`
	// RequesterQPKnown: the capture shows the requester's QP number.
	RequesterQPKnown bool   `json:"requester_qp_known"`
	ResponderQP      uint32 `json:"responder_qp"`
	PathMTU          int    `json:"path_mtu"`
	StartPSN         uint32 `json:"start_psn"`
	// Setup explains what was learned and how: the PSN's origin, the MRs.
	Setup []string `json:"setup"`
	// Error is set when softroce could not be set up for the flow.
	Error string `json:"error,omitempty"`
	// NotReplayed counts the flow's request packets not replayed, by why.
	NotReplayed map[string]int `json:"not_replayed,omitempty"`
}

// Report is the outcome of a replay.
type Report struct {
	File      string     `json:"file"`
	Flows     []Flow     `json:"flows"`
	Exchanges []Exchange `json:"exchanges"`
	Requests  int        `json:"requests"`
	Agree     int        `json:"agree"`
	AllowedN  int        `json:"allowed"`
	DifferN   int        `json:"differ"`
	CMSkipped int        `json:"cm_skipped"`

	// The CM side: softroce's passive CM fed the captured active side's MADs.
	CMExchanges []CMExchange `json:"cm_exchanges,omitempty"`
	CMReplayed  int          `json:"cm_replayed"`
	CMAgree     int          `json:"cm_agree"`
	CMAllowed   int          `json:"cm_allowed"`
	CMDiffer    int          `json:"cm_differ"`
	cmSeen      map[uint32]bool
	cmUsed      map[int]bool
	Skipped     map[string]int `json:"skipped,omitempty"`

	// The requester side: softroce's requester fed the real answers.
	RequesterFlows []RequesterFlow `json:"requester_flows,omitempty"`
	Completions    []Completion    `json:"completions,omitempty"`
	ReqAgree       int             `json:"requester_agree"`
	ReqDiffer      int             `json:"requester_differ"`

	recs []inspect.Record
	lost map[*inspect.Record]bool
}

// Summary is the one-line outcome.
func (r *Report) Summary() string {
	return fmt.Sprintf("replayed %d requests: %d agree, %d allowed differences, %d differ", r.Requests, r.Agree, r.AllowedN, r.DifferN)
}

// CMSummary is the CM side's one-line outcome.
func (r *Report) CMSummary() string {
	return fmt.Sprintf("CM: replayed %d exchanges: %d agree, %d allowed differences, %d differ", r.CMReplayed, r.CMAgree, r.CMAllowed, r.CMDiffer)
}

// RequesterSummary is the requester side's one-line outcome.
func (r *Report) RequesterSummary() string {
	return fmt.Sprintf("requester side: posted %d work requests: %d complete as the real answers complete them, %d differ", len(r.Completions), r.ReqAgree, r.ReqDiffer)
}

// File replays the capture at path.
func File(path string) (*Report, error) {
	recs, err := inspect.Records(path)
	if err != nil {
		return nil, err
	}
	return Records(path, recs), nil
}

// Records replays already decoded records; name labels the report.
func Records(name string, recs []inspect.Record) *Report {
	pl := newPlan(recs)
	rep := &Report{File: name, Skipped: pl.skipped, recs: recs, lost: map[*inspect.Record]bool{}, cmSeen: map[uint32]bool{}, cmUsed: map[int]bool{}}
	rep.replayCM(recs)
	for i, f := range pl.flows {
		rep.runFlow(i+1, f)
		if len(f.resp) > 0 {
			rep.checkRequester(i+1, f)
		}
	}
	for _, c := range rep.Completions {
		if c.Verdict == Agree {
			rep.ReqAgree++
		} else {
			rep.ReqDiffer++
		}
	}
	for _, e := range rep.Exchanges {
		rep.Requests++
		switch e.Verdict {
		case Agree:
			rep.Agree++
		case Allowed:
			rep.AllowedN++
		default:
			rep.DifferN++
		}
	}
	if len(rep.Skipped) == 0 {
		rep.Skipped = nil
	}
	return rep
}

// mapped is a captured rkey's softroce MR.
type mapped struct {
	mr   *verbs.MR
	base uint64 // the captured VA at the MR's start
}

// session is softroce set up for one flow.
type session struct {
	f      *flow
	link   *tapLink
	dev    *verbs.Device
	pd     *verbs.PD
	qp     *verbs.QP
	cq     *verbs.CQ
	keys   map[uint32]*mapped
	badKey uint32 // an rkey nothing is registered under
	recvMR *verbs.MR
	posted map[uint32]bool // receives posted, by the PSN of the packet that takes them
	wcs    []verbs.WC
}

func (rep *Report) runFlow(idx int, f *flow) {
	fr := Flow{Requester: f.key.req, Responder: f.key.resp, RequesterQP: f.reqQPN, RequesterQPKnown: f.reqQPNKnown, ResponderQP: f.key.qp, PathMTU: f.mtu, StartPSN: f.startPSN, NotReplayed: map[string]int{}}
	if f.cmKnown {
		fr.Setup = append(fr.Setup, fmt.Sprintf("first PSN %d from the CM exchange", f.startPSN))
	} else {
		fr.Setup = append(fr.Setup, fmt.Sprintf("first PSN %d learned (no CM exchange captured: the capture may start mid-connection)", f.startPSN))
	}
	if !f.reqQPNKnown {
		fr.Setup = append(fr.Setup, "requester QP unknown (no answer captured)")
	}
	s, err := newSession(f, &fr)
	if err != nil {
		fr.Error = err.Error()
		rep.Flows = append(rep.Flows, fr)
		return
	}
	defer s.close()
	cmp := &comparer{f: f, msnFixed: f.cmKnown}
	var exs []Exchange
	var txOf []*tx
	next := f.startPSN // the PSN the real responder expects, as far as the capture shows
	realNAKed := false // it sent a PSN sequence error NAK and waits for next
	for _, t := range f.txs {
		switch {
		case t.skip != "":
			fr.NotReplayed[t.skip]++
			continue
		case t.lost:
			fr.NotReplayed["lost before the real responder (its PSN sequence error NAK says so)"]++
			rep.lost[t.rec] = true
			continue
		}
		info := bth.Opcode(t.rec.Opcode).Info()
		d := bth.PSNDiff(t.rec.PSN, next)
		if d > 0 && !realNAKed && !seqNAKed(t) && info.Valid {
			// Ahead of what the responder expects, and the real one did
			// not NAK it: the sniffer missed packets the responder got.
			// softroce starts again from here, on a new QP.
			if info.Pos != bth.PosFirst && info.Pos != bth.PosOnly {
				fr.NotReplayed["inside a message whose start the sniffer missed"]++
				continue
			}
			if err := s.connect(t.rec.PSN); err != nil {
				fr.Error = err.Error()
				break
			}
			fr.Setup = append(fr.Setup, fmt.Sprintf("the sniffer missed psn %d..%d (the real responder did not NAK): softroce resynchronised on a new QP at frame %d", next, bth.PSNAdd(t.rec.PSN, -1), t.rec.Frame))
			cmp.msnFixed = false
			next, d = t.rec.PSN, 0
		}
		switch {
		case d == 0:
			realNAKed = false
			n := 1
			if info.Op == bth.OpReadRequest && t.rec.RETH != nil {
				n = readPackets(t.rec.RETH.DMALen, f.mtu)
			}
			if !seqNAKed(t) {
				next = bth.PSNAdd(next, n)
			}
		case d > 0 && seqNAKed(t):
			realNAKed = true
		}
		pkt, why := s.rewrite(t)
		if pkt == nil {
			fr.NotReplayed[why]++
			continue
		}
		s.prepareRecv(t)
		out := s.link.Inject(pkt, netip.AddrPortFrom(f.key.req, t.rec.SrcPort))
		s.drain()
		soft := s.decode(t.rec, out)
		e := Exchange{Flow: idx, Frame: t.rec.Frame, Opcode: t.rec.OpcodeName, PSN: t.rec.PSN, Request: inspect.Line(t.rec), real: t.real, soft: soft}
		if why != "" {
			e.Allowed = append(e.Allowed, why)
		}
		cmp.compare(&e, t)
		exs = append(exs, e)
		txOf = append(txOf, t)
	}
	cmp.coalesced(exs, txOf)
	for i := range exs {
		e := &exs[i]
		for _, r := range e.real {
			e.Real = append(e.Real, inspect.Line(r))
		}
		for _, r := range e.soft {
			e.Softroce = append(e.Softroce, inspect.Line(r))
		}
		switch {
		case len(e.Failures) > 0:
			e.Verdict = Differ
		case len(e.Allowed) > 0:
			e.Verdict = Allowed
		default:
			e.Verdict = Agree
		}
	}
	if len(fr.NotReplayed) == 0 {
		fr.NotReplayed = nil
	}
	if f.orphans > 0 {
		fr.Setup = append(fr.Setup, fmt.Sprintf("%d answers of the real responder answer requests the capture does not hold", f.orphans))
	}
	rep.Flows = append(rep.Flows, fr)
	rep.Exchanges = append(rep.Exchanges, exs...)
}

func newSession(f *flow, fr *Flow) (s *session, err error) {
	if !f.key.req.IsValid() || !f.key.resp.IsValid() || f.key.req.Unmap().Is4() != f.key.resp.Unmap().Is4() {
		return nil, fmt.Errorf("addresses %v and %v cannot be replayed", f.key.req, f.key.resp)
	}
	s = &session{f: f, link: newTapLink(f.key.resp.Unmap()), keys: map[uint32]*mapped{}, posted: map[uint32]bool{}, wcs: make([]verbs.WC, 64)}
	s.dev, err = verbs.Open(s.link, &verbs.Options{Name: "replay"})
	if err != nil {
		s.link.Close()
		return nil, fmt.Errorf("open softroce: %w", err)
	}
	defer func() {
		if err != nil {
			s.close()
			s = nil
		}
	}()
	pd, err := s.dev.AllocPD()
	if err != nil {
		return nil, err
	}
	if s.cq, err = s.dev.CreateCQ(4096); err != nil {
		return nil, err
	}
	s.pd = pd
	// Receives land in one buffer as large as the largest message.
	longest := 1
	cur := 0
	for _, t := range f.txs {
		info := bth.Opcode(t.rec.Opcode).Info()
		if info.Op != bth.OpSend {
			continue
		}
		if info.Pos == bth.PosFirst || info.Pos == bth.PosOnly {
			cur = 0
		}
		cur += t.rec.PayloadLen
		longest = max(longest, cur)
	}
	if s.recvMR, err = pd.RegMR(make([]byte, min(longest, maxRegion)), verbs.AccessLocalWrite); err != nil {
		return nil, fmt.Errorf("register the receive buffer: %w", err)
	}
	used := map[uint32]bool{s.recvMR.RKey(): true}
	for _, k := range sortedKeys(f.keys()) {
		var access verbs.Access
		if k.ops[bth.OpWrite] {
			access |= verbs.AccessRemoteWrite | verbs.AccessLocalWrite
		}
		if k.ops[bth.OpReadRequest] {
			access |= verbs.AccessRemoteRead
		}
		if k.ops[bth.OpCompareSwap] || k.ops[bth.OpFetchAdd] {
			access |= verbs.AccessRemoteAtomic | verbs.AccessLocalWrite
		}
		if !k.anyUsed || access == 0 {
			fr.Setup = append(fr.Setup, fmt.Sprintf("rkey 0x%08x: every access the capture shows was NAKed: left unregistered", k.rkey))
			continue
		}
		if k.tooLarge {
			fr.Setup = append(fr.Setup, fmt.Sprintf("rkey 0x%08x: %d bytes accessed, more than a replay mirrors (%d per rkey, %d per flow): left unregistered", k.rkey, k.hi-k.lo, maxRegion, 2*maxRegion))
			continue
		}
		base, n, buf := k.base, len(k.img), k.img
		mr, err := pd.RegMR(buf, access)
		if err != nil {
			return nil, fmt.Errorf("register the MR of rkey 0x%08x: %w", k.rkey, err)
		}
		used[mr.RKey()] = true
		s.keys[k.rkey] = &mapped{mr: mr, base: base}
		fr.Setup = append(fr.Setup, fmt.Sprintf("rkey 0x%08x: MR of %d bytes at va 0x%x (%s), %d bytes of it known from READ responses and atomic original values",
			k.rkey, n, base, accessNames(access), k.nKnown))
	}
	s.badKey = 0x5eed0000
	for used[s.badKey] {
		s.badKey++
	}
	if err = s.connect(f.startPSN); err != nil {
		return nil, err
	}
	return s, nil
}

// connect (re)creates the softroce QP, expecting psn next.
func (s *session) connect(psn uint32) error {
	if s.qp != nil {
		s.qp.Destroy()
		s.qp = nil
		s.posted = map[uint32]bool{}
	}
	qp, err := s.pd.CreateQP(verbs.QPInitAttr{SendCQ: s.cq, RecvCQ: s.cq, Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 1024, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		return fmt.Errorf("create QP: %w", err)
	}
	s.qp = qp
	f := s.f
	err = qp.Connect(verbs.RemoteInfo{QPN: f.reqQPN, PSN: psn, GID: verbs.GIDFromAddr(f.key.req)},
		&verbs.ConnectOptions{PathMTU: f.mtu, MaxRDAtomic: 16})
	if err != nil {
		return fmt.Errorf("connect the QP: %w", err)
	}
	return nil
}

func accessNames(a verbs.Access) string {
	var b []byte
	for _, x := range []struct {
		a verbs.Access
		n string
	}{{verbs.AccessRemoteWrite, "write"}, {verbs.AccessRemoteRead, "read"}, {verbs.AccessRemoteAtomic, "atomic"}} {
		if a&x.a != 0 {
			if len(b) > 0 {
				b = append(b, '+')
			}
			b = append(b, x.n...)
		}
	}
	return "remote " + string(b)
}

func (s *session) close() {
	if s.dev != nil {
		s.dev.Close()
	}
	s.link.Close()
}

// drain polls completions so the CQ never overruns.
func (s *session) drain() {
	for s.cq.Poll(s.wcs) > 0 {
	}
}

// rewrite returns the captured request with softroce's QP number, rkey
// and VA; a packet the capture cut has its payload zero-filled, and the
// second result says so. A nil packet cannot be replayed; the string says
// why.
func (s *session) rewrite(t *tx) ([]byte, string) {
	r := t.rec
	roce := roceBytes(r)
	if roce == nil {
		return nil, "BTH not captured"
	}
	info := bth.Opcode(r.Opcode).Info()
	var pkt []byte
	note := ""
	if r.ICRC == "truncated" {
		if !info.Valid || len(roce) < info.HdrLen {
			return nil, "cut by the capture inside its headers"
		}
		n := r.PayloadLen + r.PadCnt
		if info.HdrLen+n+bth.ICRCLen > 9000 {
			return nil, "cut by the capture and too long to rebuild"
		}
		pkt = make([]byte, info.HdrLen+n+bth.ICRCLen)
		copy(pkt, roce[:info.HdrLen])
		note = "payload cut by the capture: replayed zero-filled"
	} else {
		pkt = append([]byte(nil), roce...)
	}
	if len(pkt) < bth.BTHLen+bth.ICRCLen {
		return nil, "shorter than a BTH"
	}
	bth.BTH(pkt[:bth.BTHLen]).SetDestQP(s.qp.Num())
	if info.Valid && (r.RETH != nil || r.AtomicETH != nil) && len(pkt) >= bth.BTHLen+16 {
		h := pkt[bth.BTHLen:]
		va, key := binary.BigEndian.Uint64(h), binary.BigEndian.Uint32(h[8:])
		if m := s.keys[key]; m != nil {
			binary.BigEndian.PutUint64(h, m.mr.Addr()+(va-m.base))
			binary.BigEndian.PutUint32(h[8:], m.mr.RKey())
		} else {
			binary.BigEndian.PutUint32(h[8:], s.badKey)
		}
	}
	return pkt, note
}

// seqNAKed reports whether the real responder answered t with a PSN
// sequence error NAK.
func seqNAKed(t *tx) bool {
	for _, a := range t.real {
		if a.AETH != nil && a.AETH.Kind == "NAK" && a.AETH.NAKCode != nil && *a.AETH.NAKCode == bth.NAKPSNSeqError {
			return true
		}
	}
	return false
}

// takesRecv reports whether the request consumes a receive WQE.
func takesRecv(info *bth.OpInfo) bool {
	switch info.Op {
	case bth.OpSend:
		return info.Pos == bth.PosFirst || info.Pos == bth.PosOnly
	case bth.OpWrite:
		return info.Imm && (info.Pos == bth.PosLast || info.Pos == bth.PosOnly)
	}
	return false
}

// prepareRecv posts a receive before a request that takes one, unless the
// real responder had none (it RNR-NAKed this transmission) or did not take
// the packet (it NAKed it).
func (s *session) prepareRecv(t *tx) {
	info := bth.Opcode(t.rec.Opcode).Info()
	if !info.Valid || !takesRecv(info) || s.posted[t.rec.PSN] {
		return
	}
	for _, a := range t.real {
		// An RNR NAK says there was no receive; any other NAK that
		// the packet was not taken (a PSN sequence error above all).
		if a.AETH != nil && a.AETH.Kind != "ACK" {
			return
		}
	}
	s.posted[t.rec.PSN] = true
	_ = s.qp.PostRecv(&verbs.RecvWR{ID: uint64(t.rec.Frame), SGL: []verbs.SGE{{Addr: s.recvMR.Addr(), Length: uint32(s.recvMR.Len()), LKey: s.recvMR.LKey()}}})
}

// decode turns softroce's answers into records, framed as the real
// responder's would be (its addresses and UDP port), so they print and
// draw like the capture's.
func (s *session) decode(req *inspect.Record, out []sent) []*inspect.Record {
	var recs []*inspect.Record
	f := s.f
	src := netip.AddrPortFrom(f.key.resp.Unmap(), f.respPort)
	if f.respPort == 0 {
		src = netip.AddrPortFrom(f.key.resp.Unmap(), req.SrcPort)
	}
	dst := netip.AddrPortFrom(f.key.req.Unmap(), nic.RoCEv2Port)
	for _, p := range out {
		roce := append([]byte(nil), p.roce...)
		if crc, err := synthICRC(src, dst, roce); err == nil {
			icrc.Put(roce, crc)
		}
		frame, err := capture.AppendFrame(nil, src, dst, roce)
		if err != nil {
			continue
		}
		r := inspect.Decode(frame, gopacket.CaptureInfo{Timestamp: req.Time, CaptureLength: len(frame), Length: len(frame)})
		r.Frame = req.Frame
		recs = append(recs, &r)
	}
	return recs
}

func synthICRC(src, dst netip.AddrPort, roce []byte) (uint32, error) {
	h := icrc.Header{DF: true, SrcPort: src.Port(), DstPort: dst.Port()}
	if src.Addr().Is4() {
		s4, d4 := src.Addr().As4(), dst.Addr().As4()
		h.Src, h.Dst = s4[:], d4[:]
	} else {
		s16, d16 := src.Addr().As16(), dst.Addr().As16()
		h.Src, h.Dst = s16[:], d16[:]
	}
	return icrc.Synth(&h, roce)
}

// comparer judges one flow's exchanges.
type comparer struct {
	f        *flow
	msnFixed bool // the offset between real and softroce MSNs is known
	msnOff   uint32
}

func isAckLike(r *inspect.Record) bool { return r.AETH != nil && r.AETH.Kind == "ACK" }

func (c *comparer) compare(e *Exchange, t *tx) {
	real, soft := e.real, e.soft
	switch {
	case len(real) == 0 && len(soft) == 0:
		return
	case len(real) == 0:
		return // judged by coalesced, which sees the later answers
	case len(soft) == 0:
		all := true
		for _, r := range real {
			all = all && isAckLike(r) && bth.Opcode(r.Opcode).Info().Op == bth.OpAck
		}
		if all && !t.rec.AckReq {
			e.Allowed = append(e.Allowed, "the real responder acknowledged a packet that did not ask for it (a responder may ACK any packet)")
			return
		}
		e.Failures = append(e.Failures, fmt.Sprintf("softroce sent no answer; the real responder sent %d", len(real)))
		return
	}
	if len(real) != len(soft) {
		e.Failures = append(e.Failures, fmt.Sprintf("the real responder sent %d answers, softroce %d", len(real), len(soft)))
	}
	for i := range min(len(real), len(soft)) {
		c.pairDiff(e, i, real[i], soft[i])
	}
}

func (c *comparer) pairDiff(e *Exchange, i int, r, s *inspect.Record) {
	at := ""
	if len(e.real) > 1 {
		at = fmt.Sprintf("answer %d: ", i+1)
	}
	fail := func(format string, a ...any) { e.Failures = append(e.Failures, at+fmt.Sprintf(format, a...)) }
	allow := func(format string, a ...any) { e.Allowed = append(e.Allowed, at+fmt.Sprintf(format, a...)) }
	if r.Opcode != s.Opcode {
		fail("opcode: real %s, softroce %s", r.OpcodeName, s.OpcodeName)
	}
	if r.PSN != s.PSN {
		fail("PSN: real %d, softroce %d", r.PSN, s.PSN)
	}
	switch {
	case r.AETH != nil && s.AETH != nil:
		ra, sa := r.AETH, s.AETH
		if ra.Kind != sa.Kind {
			fail("AETH class: real %s, softroce %s", ra.Text, sa.Text)
		} else {
			switch ra.Kind {
			case "ACK":
				if ra.Syndrome != sa.Syndrome {
					allow("ACK credit count: real %s, softroce %s (IBTA 9.7.7.2: the responder's choice)", creditText(ra), creditText(sa))
				}
			case "RNR_NAK":
				if ra.Syndrome != sa.Syndrome {
					allow("RNR NAK timer: real %d, softroce %d (the responder's choice)", *ra.RNRTimer, *sa.RNRTimer)
				}
			default:
				if ra.Syndrome != sa.Syndrome {
					fail("AETH syndrome: real 0x%02x (%s), softroce 0x%02x (%s)", ra.Syndrome, ra.Text, sa.Syndrome, sa.Text)
				}
			}
		}
		if !c.msnFixed {
			c.msnFixed, c.msnOff = true, (ra.MSN-sa.MSN)&0xffffff
			if c.msnOff != 0 {
				allow("MSN offset %d learned: the capture starts mid-connection, softroce's MSN counts from its start", c.msnOff)
			}
		}
		if want := (sa.MSN + c.msnOff) & 0xffffff; want != ra.MSN {
			if c.msnOff != 0 {
				fail("MSN: real %d, softroce %d (+%d offset learned earlier)", ra.MSN, sa.MSN, c.msnOff)
			} else {
				fail("MSN: real %d, softroce %d", ra.MSN, sa.MSN)
			}
		}
	case r.AETH != nil || s.AETH != nil:
		fail("AETH: real %s, softroce %s", aethText(r), aethText(s))
	}
	if bth.Opcode(r.Opcode).Info().Op == bth.OpReadResponse && r.Opcode == s.Opcode {
		rp, sp := payload(r), payload(s)
		switch {
		case rp == nil && r.PayloadLen > 0:
			allow("READ response payload cut by the capture: not compared")
		case !bytes.Equal(rp, sp):
			fail("READ response payload: %s", firstDiff(rp, sp))
		}
	}
	if r.AtomicAck != nil && s.AtomicAck != nil && r.AtomicAck.Orig != s.AtomicAck.Orig {
		fail("atomic original value: real 0x%x, softroce 0x%x", r.AtomicAck.Orig, s.AtomicAck.Orig)
	}
}

func creditText(a *inspect.AETH) string {
	if a.Credits == nil || *a.Credits < 0 {
		return "unlimited"
	}
	return fmt.Sprint(*a.Credits)
}

func aethText(r *inspect.Record) string {
	if r.AETH == nil {
		return "none"
	}
	return r.AETH.Text
}

func firstDiff(a, b []byte) string {
	if len(a) != len(b) {
		return fmt.Sprintf("real %d bytes, softroce %d", len(a), len(b))
	}
	for i := range a {
		if a[i] != b[i] {
			return fmt.Sprintf("first difference at byte %d: real 0x%02x, softroce 0x%02x", i, a[i], b[i])
		}
	}
	return "equal"
}

// coalesced judges the exchanges the real responder did not answer
// itself: an answer to a later request acknowledges it (IBTA 9.7.5.1.1:
// an ACK or NAK acknowledges every request before its PSN), which is
// coalescing; with no later answer at all, the capture ends first.
func (c *comparer) coalesced(exs []Exchange, txs []*tx) {
	for i := range exs {
		e := &exs[i]
		if len(e.real) != 0 || len(e.soft) == 0 {
			continue
		}
		var cover *inspect.Record
		later := false
		for _, o := range c.f.order[txs[i].pos+1:] {
			if o >= 0 {
				continue
			}
			r := c.f.resp[-o-1]
			later = true
			d := bth.PSNDiff(r.PSN, txs[i].rec.PSN)
			if d > 0 || d == 0 && isAckLike(r) {
				cover = r
				break
			}
		}
		acksOnly := true
		for _, s := range e.soft {
			acksOnly = acksOnly && isAckLike(s) && bth.Opcode(s.Opcode).Info().Op == bth.OpAck
		}
		switch {
		case cover != nil && acksOnly:
			e.Allowed = append(e.Allowed, fmt.Sprintf("ACK coalescing: the real responder's %s of psn %d (frame %d) covers it", shortName(cover), cover.PSN, cover.Frame))
		case !later:
			e.Allowed = append(e.Allowed, "the capture holds no later answer from the real responder (it ends, or the sniffer missed it): not compared")
		default:
			e.Failures = append(e.Failures, fmt.Sprintf("the real responder sent no answer; softroce sent %d", len(e.soft)))
		}
	}
}

func shortName(r *inspect.Record) string {
	if r.AETH != nil && r.AETH.Kind != "ACK" {
		return r.AETH.Text
	}
	return bth.Opcode(r.Opcode).Info().Op.String()
}
