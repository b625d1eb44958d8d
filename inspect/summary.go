package inspect

import (
	"net/netip"
	"sort"

	"github.com/softroce/softroce/bth"
)

// Summary totals a capture: frame counts, ICRC verdicts, opcode counts and
// one entry per connection.
type Summary struct {
	File          string `json:"file,omitempty"`
	Frames        int    `json:"frames"`
	RoCE          int    `json:"roce"`
	NonRoCE       int    `json:"non_roce"`
	Bytes         int    `json:"roce_bytes"` // wire bytes of the RoCE frames
	ICRCOK        int    `json:"icrc_ok"`
	ICRCBad       int    `json:"icrc_bad"`
	ICRCTruncated int    `json:"icrc_truncated"`
	Malformed     int    `json:"malformed"`
	CNPs          int    `json:"cnps"`
	// CEMarked counts packets whose IP header is marked Congestion
	// Experienced (ECN 11).
	CEMarked int            `json:"ce_marked,omitempty"`
	NAKs     map[string]int `json:"naks,omitempty"`
	RNRNAKs  int            `json:"rnr_naks"`
	Opcodes  map[string]int `json:"opcodes"`
	CM       map[string]int `json:"cm,omitempty"` // CM MADs by message
	// CMConns are the CM exchanges (REQ and what followed, SIDR_REQ and
	// its SIDR_REP); CMUntracked counts those beyond the first 1000,
	// CMUnmatched the MADs that belong to none seen.
	CMConns     []*CMConn     `json:"cm_exchanges,omitempty"`
	CMUntracked int           `json:"cm_untracked,omitempty"`
	CMUnmatched int           `json:"cm_unmatched,omitempty"`
	Connections []*Connection `json:"connections"`
	// Hints say what the capture likely is when its numbers have a known
	// cause other than the wire (SnifferHint).
	Hints []string `json:"hints,omitempty"`
	// Filter and Matched are set by callers that list only the packets
	// a filter matched: the counts above cover every packet, Matched how
	// many RoCE packets were listed.
	Filter  string `json:"filter,omitempty"`
	Matched *int   `json:"matched,omitempty"`
}

// SnifferHint is the hint for a capture whose every RoCEv2 packet has
// UDP source port 4791 and whose every checked ICRC fails. RoCEv2 senders
// pick a source port per QP for ECMP entropy (rxe and ConnectX use
// 0xC000 and up); port 4791 on every packet, with every ICRC failing,
// is what the captures of ConnectX's offloaded RDMA sniffer look like.
const SnifferHint = "every packet's ICRC fails and every UDP source port is 4791: this looks like a capture by ConnectX's " +
	"offloaded RDMA sniffer (tcpdump or ibdump on an mlx5 RDMA device), whose packets carry an ICRC that does not verify; " +
	"the failures are then the capture's, not the wire's"

// Connection is a queue-pair connection: the flow of packets addressed to
// one destination QP, and the reverse flow it was matched with. The BTH
// names only the destination QP, so A→B carries B's QPN and B→A carries
// A's; the two directions are paired by the PSNs that responses echo from
// requests (IBTA §9.7.5: an ACK or read response carries the request's
// PSN). A flow that cannot be paired is a connection with one direction.
type Connection struct {
	Transport string `json:"transport"`
	A         string `json:"a"`    // address of the first direction's sender
	B         string `json:"b"`    // address of its receiver
	QPA       *int64 `json:"qp_a"` // A's QPN if seen as a destination
	QPB       int64  `json:"qp_b"` // B's QPN
	AtoB      *Flow  `json:"a_to_b"`
	BtoA      *Flow  `json:"b_to_a,omitempty"`
}

// Flow counts one direction: the packets from one address to a
// destination QP at another.
type Flow struct {
	Src     netip.Addr     `json:"src"`
	Dst     netip.Addr     `json:"dst"`
	DestQP  uint32         `json:"dest_qp"`
	Packets int            `json:"packets"`
	Bytes   int            `json:"bytes"`         // wire bytes
	Payload int            `json:"payload_bytes"` // transport payload bytes
	Opcodes map[string]int `json:"opcodes"`
	// A direction carries two PSN spaces: its sender's requests and its
	// sender's responses to the other side's requests (§9.7.1).
	Requests  *PSNRange `json:"request_psns,omitempty"`
	Responses *PSNRange `json:"response_psns,omitempty"`
	Other     *PSNRange `json:"other_psns,omitempty"` // CNPs, reserved opcodes
	// PSNGaps counts requests that skipped ahead of the next expected PSN,
	// and responses that skipped a PSN of a READ response message in
	// progress (a FIRST or MIDDLE is followed by the next PSN), or that
	// continue one whose FIRST never showed; MissingPSNs the PSNs skipped
	// (one for a READ response message's missing start, its least).
	PSNGaps     int `json:"psn_gaps"`
	MissingPSNs int `json:"missing_psns"`
	// Retransmissions counts requests and read responses whose PSN is not
	// beyond the highest already seen in the flow (duplicates, go-back-N),
	// and requests at a PSN an earlier READ already took: a READ asked
	// again from the first response PSN that went missing (IBTA 9.7.5.1).
	Retransmissions int            `json:"retransmissions"`
	ACKs            int            `json:"acks"`
	NAKs            map[string]int `json:"naks,omitempty"`
	RNRNAKs         int            `json:"rnr_naks"`
	CNPs            int            `json:"cnps"`
	ECNMarked       int            `json:"becn_or_fecn"`
	// CEMarked counts the flow's packets marked Congestion Experienced
	// in the IP header; the CNPs answering them travel in the reverse
	// flow, addressed to this flow's sender (its CNPs).
	CEMarked      int `json:"ce_marked,omitempty"`
	ICRCBad       int `json:"icrc_bad"`
	ICRCTruncated int `json:"icrc_truncated"`
	Malformed     int `json:"malformed"`

	transport string
	reqMax    uint32 // highest request PSN
	reqSeen   bool
	expect    uint32 // next request PSN, when known
	expectOK  bool
	respMax   uint32 // highest read-response PSN
	respSeen  bool
	reqPSNs   map[uint32]struct{}
	respPSNs  []uint32
	// respNext is the PSN the READ response message in progress
	// continues at (respNextOK: one is in progress).
	respNext   uint32
	respNextOK bool
	// answers is the request flow this flow's responses answer, tied by
	// the first response whose PSN is one of its requests'.
	answers *Flow
	// readMax is the highest PSN this flow's READs are known to have
	// taken: the highest read-response PSN its peer sent (readSeen).
	readMax  uint32
	readSeen bool
	// srcQP is the sender's QP as its datagrams' DETHs name it (UD and
	// the CM's QP1), when they all name the same one (srcQPs 1; 2:
	// several).
	srcQP  uint32
	srcQPs int
}

// PSNRange is the PSNs of a set of packets: first and last seen, and the
// lowest and highest in 24-bit serial order (bth.PSNDiff).
type PSNRange struct {
	Packets int    `json:"packets"`
	First   uint32 `json:"first"`
	Last    uint32 `json:"last"`
	Min     uint32 `json:"min"`
	Max     uint32 `json:"max"`
}

func (p *PSNRange) add(psn uint32) *PSNRange {
	if p == nil {
		p = &PSNRange{First: psn, Min: psn, Max: psn}
	}
	p.Packets++
	p.Last = psn
	if bth.PSNDiff(psn, p.Min) < 0 {
		p.Min = psn
	}
	if bth.PSNDiff(psn, p.Max) > 0 {
		p.Max = psn
	}
	return p
}

type flowKey struct {
	transport string
	src, dst  netip.Addr
	qp        uint32
}

type hostsKey struct {
	transport string
	src, dst  netip.Addr
}

// Summarizer accumulates records into a Summary.
type Summarizer struct {
	s     Summary
	cm    cmTracker
	flows map[flowKey]*Flow
	order []*Flow
	// port4791 counts RoCEv2 packets from UDP source port 4791.
	port4791 int
	// byHosts are the flows from one address to another, to find the
	// request flow a response flow answers.
	byHosts map[hostsKey][]*Flow
}

// NewSummarizer returns an empty summarizer for the named file.
func NewSummarizer(file string) *Summarizer {
	return &Summarizer{s: Summary{File: file, Opcodes: map[string]int{}}, flows: map[flowKey]*Flow{}, byHosts: map[hostsKey][]*Flow{}}
}

// Mark is what the analysis made of one packet when it was added: the
// per-packet side of a Flow's Retransmissions and PSNGaps counts.
type Mark struct {
	Retransmission bool // counted in its flow's Retransmissions
	Gap            bool // came after a PSN gap (counted in its flow's PSNGaps)
}

// Add counts one record.
func (z *Summarizer) Add(r *Record) { z.AddMark(r) }

// AddMark counts one record, as Add, and says what the analysis made of
// it. Records must come in capture order: a packet is a retransmission by
// what came before it.
func (z *Summarizer) AddMark(r *Record) Mark {
	s := &z.s
	s.Frames++
	if !r.RoCE {
		s.NonRoCE++
		return Mark{}
	}
	s.RoCE++
	s.Bytes += r.WireLen
	if r.Transport == "RoCEv2" && r.SrcPort == 4791 {
		z.port4791++
	}
	switch r.ICRC {
	case "ok":
		s.ICRCOK++
	case "bad":
		s.ICRCBad++
	case "truncated":
		s.ICRCTruncated++
	}
	if r.Malformed != "" {
		s.Malformed++
	}
	if r.OpcodeName == "" { // headers not located
		return Mark{}
	}
	s.Opcodes[r.OpcodeName]++
	if r.CM != nil {
		if s.CM == nil {
			s.CM = map[string]int{}
		}
		s.CM[r.CM.Message]++
		z.cm.add(r)
	}
	k := flowKey{r.Transport, r.Src, r.Dst, r.DestQP}
	f := z.flows[k]
	if f == nil {
		f = &Flow{Src: r.Src, Dst: r.Dst, DestQP: r.DestQP, Opcodes: map[string]int{}, transport: r.Transport,
			reqPSNs: map[uint32]struct{}{}}
		z.flows[k] = f
		z.order = append(z.order, f)
		hk := hostsKey{r.Transport, r.Src, r.Dst}
		z.byHosts[hk] = append(z.byHosts[hk], f)
	}
	m := f.add(r)
	if info := bth.Opcode(r.Opcode).Info(); info.Valid && !info.Request && info.Op != bth.OpCNP {
		z.answer(f, r.PSN, info.Op == bth.OpReadResponse)
	}
	if r.Opcode == uint8(bth.CNP) {
		s.CNPs++
	}
	if r.ECN == 3 {
		s.CEMarked++
	}
	if a := r.AETH; a != nil {
		switch a.Kind {
		case "NAK":
			if s.NAKs == nil {
				s.NAKs = map[string]int{}
			}
			s.NAKs[a.NAKName]++
		case "RNR_NAK":
			s.RNRNAKs++
		}
	}
	return m
}

// answer ties response flow f to the request flow it answers, if it is
// not yet, and notes the PSNs a READ response shows that flow's READs took.
func (z *Summarizer) answer(f *Flow, psn uint32, read bool) {
	if f.answers == nil {
		for _, q := range z.byHosts[hostsKey{f.transport, f.Dst, f.Src}] {
			if _, ok := q.reqPSNs[psn]; ok {
				f.answers = q
				break
			}
		}
	}
	if q := f.answers; q != nil && read && (!q.readSeen || bth.PSNDiff(psn, q.readMax) > 0) {
		q.readMax, q.readSeen = psn, true
	}
}

func (f *Flow) add(r *Record) (m Mark) {
	f.Packets++
	f.Bytes += r.WireLen
	f.Payload += r.PayloadLen
	f.Opcodes[r.OpcodeName]++
	switch r.ICRC {
	case "bad":
		f.ICRCBad++
	case "truncated":
		f.ICRCTruncated++
	}
	if r.Malformed != "" {
		f.Malformed++
	}
	if r.FECN || r.BECN {
		f.ECNMarked++
	}
	if r.ECN == 3 {
		f.CEMarked++
	}
	if h := r.DETH; h != nil {
		switch {
		case f.srcQPs == 0:
			f.srcQP, f.srcQPs = h.SrcQP, 1
		case f.srcQP != h.SrcQP:
			f.srcQPs = 2
		}
	}
	psn := r.PSN
	info := bth.Opcode(r.Opcode).Info()
	switch {
	case info.Op == bth.OpCNP:
		f.CNPs++
		f.Other = f.Other.add(psn)
	case !info.Valid:
		f.Other = f.Other.add(psn)
	case info.Request:
		f.Requests = f.Requests.add(psn)
		f.reqPSNs[psn] = struct{}{}
		if (f.reqSeen && bth.PSNDiff(psn, f.reqMax) <= 0) || (f.readSeen && bth.PSNDiff(psn, f.readMax) <= 0) {
			f.Retransmissions++
			m.Retransmission = true
		} else if f.expectOK && bth.PSNDiff(psn, f.expect) > 0 {
			f.PSNGaps++
			m.Gap = true
			f.MissingPSNs += bth.PSNDiff(psn, f.expect)
		}
		if !f.reqSeen || bth.PSNDiff(psn, f.reqMax) > 0 {
			f.reqMax = psn
		}
		f.reqSeen = true
		// A READ request consumes one PSN per response packet, which
		// depends on the path MTU the capture does not show (§9.7.1):
		// the next expected PSN is unknown until the next request.
		f.expect, f.expectOK = bth.PSNAdd(psn, 1), info.Op != bth.OpReadRequest
	default: // responses: ACK, ATOMIC ACK, READ RESPONSE
		f.Responses = f.Responses.add(psn)
		f.respPSNs = append(f.respPSNs, psn)
		again := false
		if info.Op == bth.OpReadResponse {
			if f.respSeen && bth.PSNDiff(psn, f.respMax) <= 0 {
				f.Retransmissions++
				m.Retransmission = true
				again = true
			}
			if !f.respSeen || bth.PSNDiff(psn, f.respMax) > 0 {
				f.respMax = psn
			}
			f.respSeen = true
		}
		// The packets of a READ response message take consecutive PSNs
		// (§9.7.5.1.4); what comes after it may skip (ACKs coalesce).
		switch {
		case again:
		case f.respNextOK && bth.PSNDiff(psn, f.respNext) > 0:
			f.PSNGaps++
			m.Gap = true
			f.MissingPSNs += bth.PSNDiff(psn, f.respNext)
		case !f.respNextOK && info.Op == bth.OpReadResponse && (info.Pos == bth.PosMiddle || info.Pos == bth.PosLast):
			f.PSNGaps++
			m.Gap = true
			f.MissingPSNs++
		}
		f.respNext = bth.PSNAdd(psn, 1)
		f.respNextOK = info.Op == bth.OpReadResponse && (info.Pos == bth.PosFirst || info.Pos == bth.PosMiddle)
	}
	if a := r.AETH; a != nil {
		switch a.Kind {
		case "ACK":
			if info.Op == bth.OpAck {
				f.ACKs++
			}
		case "NAK":
			if f.NAKs == nil {
				f.NAKs = map[string]int{}
			}
			f.NAKs[a.NAKName]++
		case "RNR_NAK":
			f.RNRNAKs++
		}
	}
	return m
}

// Summary pairs the flows into connections and returns the totals.
func (z *Summarizer) Summary() Summary {
	s := z.s
	s.CMConns, s.CMUntracked, s.CMUnmatched = z.cm.summary(), z.cm.untracked, z.cm.unmatched
	s.Hints = nil
	if s.RoCE > 0 && z.port4791 == s.RoCE && s.ICRCBad > 0 && s.ICRCOK == 0 {
		s.Hints = append(s.Hints, SnifferHint)
	}
	s.Connections = nil
	paired := map[*Flow]bool{}
	// Score every pair of opposite flows by the PSNs their responses echo
	// from the other's requests; pair greedily, best first.
	type cand struct {
		x, y  *Flow
		score int
	}
	var cands []cand
	for i, x := range z.order {
		for _, y := range z.order[i+1:] {
			if x.transport != y.transport || x.Src != y.Dst || x.Dst != y.Src {
				continue
			}
			if sc := echoes(y, x) + echoes(x, y); sc > 0 {
				cands = append(cands, cand{x, y, sc})
			} else if x.srcQPs == 1 && y.srcQPs == 1 && x.srcQP == y.DestQP && y.srcQP == x.DestQP {
				// Datagrams name their sender's QP (DETH): two flows
				// that name each other's are one conversation (the
				// CM's, QP1 to QP1, among them).
				cands = append(cands, cand{x, y, 1})
			}
		}
	}
	sort.SliceStable(cands, func(i, j int) bool { return cands[i].score > cands[j].score })
	conns := map[*Flow]*Connection{}
	for _, c := range cands {
		if paired[c.x] || paired[c.y] {
			continue
		}
		paired[c.x], paired[c.y] = true, true
		qpa := int64(c.y.DestQP)
		conns[c.x] = &Connection{Transport: c.x.transport, A: c.x.Src.String(), B: c.x.Dst.String(),
			QPA: &qpa, QPB: int64(c.x.DestQP), AtoB: c.x, BtoA: c.y}
	}
	for _, f := range z.order {
		if c := conns[f]; c != nil {
			s.Connections = append(s.Connections, c)
		} else if !paired[f] {
			c := &Connection{Transport: f.transport, A: f.Src.String(), B: f.Dst.String(), QPB: int64(f.DestQP), AtoB: f}
			if f.srcQPs == 1 {
				qpa := int64(f.srcQP)
				c.QPA = &qpa
			}
			s.Connections = append(s.Connections, c)
		}
	}
	return s
}

// echoes counts the response PSNs of resp that match request PSNs of req.
func echoes(resp, req *Flow) int {
	n := 0
	for _, p := range resp.respPSNs {
		if _, ok := req.reqPSNs[p]; ok {
			n++
		}
	}
	return n
}
