// Package demo is `softroce demo`: two RoCEv2 endpoints in one process,
// joined by an in-process wire (nic/pipe), that connect an RC queue pair
// and run SEND, RDMA WRITE with immediate, RDMA READ, compare-and-swap and
// fetch-and-add, printing for each step the verbs call, every packet on
// the wire decoded, the completions and the memory they changed.
//
// It is written to teach the protocol by showing it: each step starts with
// one line on what the requester sends and why the responder answers as it
// does. With impairment (nic/impair) it shows packets lost or damaged on
// the wire, the go-back-N retransmissions and the NAKs that repair them.
//
// The wire is watched with nic/capture at two heights: above the
// impairment (what the transport sent) and below it (what reached the
// wire). A packet seen above but not below was lost.
package demo

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/gopacket/gopacket"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/inspect"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/nic/capture"
	"github.com/softroce/softroce/nic/impair"
	"github.com/softroce/softroce/nic/pipe"
	"github.com/softroce/softroce/verbs"
)

// Options configure a run. The zero value runs the plain demo.
type Options struct {
	// Impair is an impairment in nic/impair syntax ("loss=10%,seed=7").
	// The demo supports loss, dup, corrupt and seed: delay, jitter and
	// reorder move packets in time, which a step-by-step printout cannot
	// follow.
	Impair string
	// Color uses ANSI colors (only when writing to a terminal).
	Color bool
	// Pcap, if set, receives every packet that reached the wire.
	Pcap io.Writer
	// PathMTU is the IB path MTU (default 256, so that a few hundred bytes
	// already make multi-packet messages).
	PathMTU int
	// StepTimeout bounds the wait for each step's completions (default 10s).
	StepTimeout time.Duration
}

// Result is what a run did, for callers that go on to draw or check it.
type Result struct {
	// Records are the packets that reached the wire, in order, decoded.
	Records []inspect.Record
	// Lost[i] reports that Records[i] was sent by the transport but
	// dropped by the impairment: it never reached the wire (its frame is
	// the packet as sent).
	Lost []bool
	// Repeat[i] reports that Records[i] was sent before: a retransmitted
	// request, a response sent again, or a duplicate made by the wire.
	Repeat []bool
	// Counters of what the printout marked.
	Packets, LostPackets, Retransmits, NAKs, RNRNAKs, Corrupted, Duplicated int
	// Steps lists the operations that completed successfully.
	Steps []string
	// Seed is the impairment seed in use (0 without impairment).
	Seed uint64
}

const (
	bufSize = 4096
	// Offsets in the two 4 KiB buffers, chosen so every step leaves its
	// own visible trace in memory.
	offSend   = 0
	offWrite  = 256
	offRead   = 1024
	offAtomic = 2048
	writeLen  = 600
	readLen   = 600
	psnA      = 100 // A's initial send PSN (B's expected receive PSN)
	psnB      = 500
	immValue  = 0x1234abcd
)

// side is one endpoint.
type side struct {
	name string
	dev  *verbs.Device
	pd   *verbs.PD
	cq   *verbs.CQ
	qp   *verbs.QP
	mr   *verbs.MR
	buf  []byte
	imp  *impair.Link

	// pending are packets offered to the impairment, not yet seen on
	// the wire (see tracer.onWire).
	pending []pendingPkt
}

// tracer prints the wire as the two sides use it.
type tracer struct {
	mu     sync.Mutex
	w      io.Writer
	color  bool
	sides  [2]*side
	seen   map[string]int // transport packets already sent once, by identity
	res    *Result
	lastTx [2][]byte // the previous wire packet of each side, to spot duplicates
	pcap   *capture.PcapWriter
	dupOn  bool // the impairment duplicates packets
	done   bool // the summary is printed: record nothing more
	// maxReq is the highest request PSN each side has sent (sentReq: any).
	maxReq  [2]uint32
	sentReq [2]bool
	mtu     int
	err     error
}

// ParseImpair reads Options.Impair as Run does, refusing what the demo
// cannot show.
func ParseImpair(spec string) (impair.Config, error) {
	c, err := impair.Parse(spec)
	if err != nil {
		return c, fmt.Errorf("--impair %q: %w", spec, err)
	}
	if c.Delay != 0 || c.Jitter != 0 || c.Reorder != 0 {
		return c, fmt.Errorf("--impair %q: the demo shows loss, dup and corrupt (with seed); delay, jitter and reorder move packets in time, which its step-by-step printout cannot follow: `softroce bw --impair` and `softroce lat --impair` take them", spec)
	}
	return c, nil
}

// Run runs the demo, printing to w.
func Run(w io.Writer, opts Options) (*Result, error) {
	res := &Result{}
	var icfg impair.Config
	impaired := strings.TrimSpace(opts.Impair) != ""
	if impaired {
		c, err := ParseImpair(opts.Impair)
		if err != nil {
			return nil, err
		}
		if c.Seed == 0 {
			c.Seed = uint64(time.Now().UnixNano())%100000 + 1
		}
		icfg = c
		res.Seed = c.Seed
	}
	mtu := opts.PathMTU
	if mtu == 0 {
		mtu = 256
	}
	stepTimeout := opts.StepTimeout
	if stepTimeout == 0 {
		stepTimeout = 10 * time.Second
	}
	t := &tracer{w: w, color: opts.Color, seen: map[string]int{}, res: res, dupOn: icfg.Dup > 0, mtu: mtu}
	if opts.Pcap != nil {
		pw, err := capture.NewPcapWriter(opts.Pcap)
		if err != nil {
			return nil, err
		}
		t.pcap = pw
	}

	la, lb := pipe.New(pipe.Config{})
	a := &side{name: "A", buf: make([]byte, bufSize)}
	b := &side{name: "B", buf: make([]byte, bufSize)}
	t.sides = [2]*side{a, b}
	var err error
	for i, s := range t.sides {
		l := []nic.Link{la, lb}[i]
		idx := i
		// Below the impairment: what reaches the wire, reported before the
		// peer can receive it so the printout stays in order.
		var link nic.Link = capture.Wrap(l, capture.Options{Dirs: capture.Tx,
			OnPacket: func(ev *capture.Event) { t.onWire(idx, ev) }})
		if impaired {
			cfg := icfg
			cfg.Seed = icfg.Seed + uint64(i) // each direction its own stream
			s.imp = impair.Wrap(link, cfg)
			// Above it: what the transport sent, reported before and
			// after the impairment decided; a packet offered but not
			// seen below was lost.
			link = capture.Wrap(s.imp, capture.Options{Dirs: capture.Tx, TxAfterSend: true,
				OnPacket: func(ev *capture.Event) { t.onSent(idx, ev) }})
			link = capture.Wrap(link, capture.Options{Dirs: capture.Tx,
				OnPacket: func(ev *capture.Event) { t.onOffer(idx, ev) }})
		}
		if s.dev, err = verbs.Open(link, &verbs.Options{Name: "softroce-" + strings.ToLower(s.name)}); err != nil {
			return nil, fmt.Errorf("open device %s: %w", s.name, err)
		}
		defer s.dev.Close()
	}

	t.header(impaired, icfg, mtu)
	if err := t.setup(mtu); err != nil {
		return res, err
	}
	steps := []struct {
		name string
		run  func(ctx context.Context) error
	}{
		{"SEND", t.stepSend},
		{"RDMA_WRITE_WITH_IMM", t.stepWrite},
		{"RDMA_READ", t.stepRead},
		{"ATOMIC_CMP_AND_SWP", t.stepCAS},
		{"ATOMIC_FETCH_AND_ADD", t.stepFAA},
	}
	for i, st := range steps {
		ctx, cancel := context.WithTimeout(context.Background(), stepTimeout)
		err := st.run(ctx)
		cancel()
		if err != nil {
			t.printf("\n%s\n", t.paint(red, fmt.Sprintf("step %d (%s) failed: %v", i+1, st.name, err)))
			return res, fmt.Errorf("step %d (%s): %w", i+1, st.name, err)
		}
		res.Steps = append(res.Steps, st.name)
	}
	t.summary(impaired)
	if t.pcap != nil {
		if err := t.pcap.Err(); err != nil {
			return res, err
		}
	}
	return res, nil
}

// ---- printing helpers ----

const (
	red    = "31"
	green  = "32"
	yellow = "33"
	blue   = "34"
	purple = "35"
	cyan   = "36"
	dim    = "2"
	bold   = "1"
)

func (t *tracer) paint(code, s string) string {
	if !t.color {
		return s
	}
	return "\x1b[" + code + "m" + s + "\x1b[0m"
}

func (t *tracer) printf(format string, args ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.printfLocked(format, args...)
}

func (t *tracer) printfLocked(format string, args ...any) {
	if _, err := fmt.Fprintf(t.w, format, args...); err != nil && t.err == nil {
		t.err = err
	}
}

// explain prints a teaching note, wrapped to 90 columns.
func (t *tracer) explain(text string) {
	for _, l := range wrap(text, 86) {
		t.printf("  %s\n", t.paint(dim, "| "+l))
	}
}

func wrap(text string, width int) []string {
	var lines []string
	var cur strings.Builder
	for _, w := range strings.Fields(text) {
		if cur.Len() > 0 && cur.Len()+1+len(w) > width {
			lines = append(lines, cur.String())
			cur.Reset()
		}
		if cur.Len() > 0 {
			cur.WriteByte(' ')
		}
		cur.WriteString(w)
	}
	if cur.Len() > 0 {
		lines = append(lines, cur.String())
	}
	return lines
}

func (t *tracer) header(impaired bool, c impair.Config, mtu int) {
	a, b := t.sides[0], t.sides[1]
	t.printf("%s\n", t.paint(bold, "softroce demo: two RoCEv2 endpoints in this process, joined by an in-process wire"))
	t.printf("  A = %v (%s, requester)   B = %v (%s, responder)   path MTU %d\n",
		a.dev.Link().Addrs()[0], a.dev.Name(), b.dev.Link().Addrs()[0], b.dev.Name(), mtu)
	if impaired {
		t.printf("  %s\n", t.paint(yellow, fmt.Sprintf("impaired wire: %v (each direction seeded on its own; rerun with seed=%d to repeat)", c, c.Seed)))
	}
	t.printf("  packets:  A -> B  opcode  psn N [A=ack requested]  headers  len payload  icrc\n")
}

func (t *tracer) section(n int, title string) {
	t.printf("\n%s\n", t.paint(bold, fmt.Sprintf("== %d. %s ", n, title)+strings.Repeat("=", max(0, 70-len(title)))))
}

// call prints a verbs call, continued on indented lines at ", " when it
// is wider than the terminal.
func (t *tracer) call(format string, args ...any) {
	s := fmt.Sprintf(format, args...)
	for _, l := range breakAt(s, width-2, 4) {
		t.printf("  %s\n", t.paint(cyan, l))
	}
}

// breakAt splits s at ", " so no piece is wider than w; continuation
// lines are indented by indent spaces.
func breakAt(s string, w, indent int) []string {
	var out []string
	for len(s) > w {
		cut := strings.LastIndex(s[:w], ", ")
		if cut <= indent {
			break
		}
		out = append(out, s[:cut+1])
		s = strings.Repeat(" ", indent) + s[cut+2:]
	}
	return append(out, s)
}

// ---- the wire ----

// identity names a transport packet for retransmission and loss matching:
// the BTH without its resv8a byte (which the ICRC masks) and the length.
func identity(p []byte) string {
	if len(p) < bth.BTHLen {
		return string(p)
	}
	var k [bth.BTHLen + 4]byte
	copy(k[:], p[:bth.BTHLen])
	k[4] = 0
	binary.BigEndian.PutUint32(k[bth.BTHLen:], uint32(len(p)))
	return string(k[:])
}

// pendingPkt is a packet the transport handed to the impairment whose
// fate is not known yet.
type pendingPkt struct {
	id    string
	frame []byte
	time  time.Time
	pkt   []byte
}

// onOffer is called (with impairment only) for every packet the transport
// sends, before the impairment sees it.
func (t *tracer) onOffer(idx int, ev *capture.Event) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.sides[idx]
	s.pending = append(s.pending, pendingPkt{id: identity(ev.Packet.Bytes()), frame: bytes.Clone(ev.Frame),
		time: ev.Time, pkt: bytes.Clone(ev.Packet.Bytes())})
}

// onWire is called for every packet that reaches the wire, before the peer
// can receive it. Offered packets ahead of it that never reached the wire
// were lost; they are printed first, in the order the transport sent them.
func (t *tracer) onWire(idx int, ev *capture.Event) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.sides[idx]
	pkt := ev.Packet.Bytes()
	id := identity(pkt)
	for k := range s.pending {
		if s.pending[k].id == id {
			for _, p := range s.pending[:k] {
				t.recordLost(idx, &p)
			}
			s.pending = append(s.pending[:0], s.pending[k+1:]...)
			break
		}
	}
	// Two identical packets in a row are the wire's duplicate only when the
	// impairment duplicates at all: a responder re-sending the same ACK
	// for a duplicate request is the protocol, shown as "resent".
	dup := t.dupOn && t.lastTx[idx] != nil && bytes.Equal(t.lastTx[idx], pkt)
	t.lastTx[idx] = append(t.lastTx[idx][:0], pkt...)
	if t.pcap != nil && !t.done {
		_ = t.pcap.WriteFrame(ev.Time, ev.Frame)
	}
	t.record(idx, ev.Time, ev.Frame, pkt, false, dup)
}

// onSent is called (with impairment only) for every packet the transport
// sent, once the impairment has acted on it: still pending means lost.
func (t *tracer) onSent(idx int, ev *capture.Event) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.sides[idx]
	id := identity(ev.Packet.Bytes())
	for k := range s.pending {
		if s.pending[k].id == id {
			for _, p := range s.pending[:k+1] {
				t.recordLost(idx, &p)
			}
			s.pending = append(s.pending[:0], s.pending[k+1:]...)
			return
		}
	}
}

// recordLost records a packet the impairment dropped. It was offered
// before the packet recorded last may have reached the wire, but it was
// dropped after: its time is no earlier than that packet's, so the
// records' times follow their order.
func (t *tracer) recordLost(idx int, p *pendingPkt) {
	when := p.time
	if n := len(t.res.Records); n > 0 && when.Before(t.res.Records[n-1].Time) {
		when = t.res.Records[n-1].Time
	}
	t.record(idx, when, p.frame, p.pkt, true, false)
}

// record decodes, classifies and prints one packet. Called with t.mu held.
func (t *tracer) record(idx int, when time.Time, frame, pkt []byte, lost, dup bool) {
	if t.done {
		return
	}
	frame = bytes.Clone(frame)
	r := inspect.Decode(frame, gopacket.CaptureInfo{Timestamp: when, CaptureLength: len(frame), Length: len(frame)})
	r.Frame = len(t.res.Records) + 1
	t.res.Records = append(t.res.Records, r)
	t.res.Lost = append(t.res.Lost, lost)
	t.res.Repeat = append(t.res.Repeat, false)
	t.res.Packets++

	from, to := t.sides[idx].name, t.sides[1-idx].name
	arrow := from + " -> " + to
	var marks []string
	id := identity(pkt)
	request := r.Malformed == "" && r.RoCE && isRequest(r.Opcode)
	switch {
	case dup:
		t.res.Duplicated++
		marks = append(marks, t.paint(yellow, "DUPLICATED by the wire"))
	case request && (t.seen[id] > 0 || (t.sentReq[idx] && !psnAfter(r.PSN, t.maxReq[idx]))):
		// A request at or below the highest PSN sent is sent again: the
		// same packet, or a READ asked again from a later PSN (IBTA
		// 9.7.5.1: a READ retried mid-response restarts at the lost PSN).
		t.res.Retransmits++
		marks = append(marks, t.paint(yellow, "RETRANSMIT (go-back-N)"))
	case t.seen[id] > 0:
		marks = append(marks, t.paint(yellow, "resent"))
	}
	// Whatever the switch above marked was sent before.
	t.res.Repeat[len(t.res.Repeat)-1] = len(marks) > 0

	if !dup {
		t.seen[id]++
	}
	if request {
		last := r.PSN
		if r.RETH != nil && r.OpcodeName == "RC RDMA_READ_REQUEST" && r.RETH.DMALen > 0 {
			// A READ takes one PSN per response packet (IBTA 9.7.1).
			last = (r.PSN + (r.RETH.DMALen+uint32(t.mtu)-1)/uint32(t.mtu) - 1) & 0xffffff
		}
		if !t.sentReq[idx] || psnAfter(last, t.maxReq[idx]) {
			t.maxReq[idx], t.sentReq[idx] = last, true
		}
	}
	if lost {
		t.res.LostPackets++
		arrow = from + " -x " + to
		marks = append(marks, t.paint(red, "LOST on the wire"))
	}
	if r.ICRC == "bad" {
		t.res.Corrupted++
		marks = append(marks, t.paint(red, "CORRUPTED: ICRC BAD, "+to+" drops it"))
	}
	if a := r.AETH; a != nil {
		switch a.Kind {
		case "NAK":
			t.res.NAKs++
			marks = append(marks, t.paint(red, "<< NAK: "+a.NAKName))
		case "RNR_NAK":
			t.res.RNRNAKs++
			marks = append(marks, t.paint(purple, "<< RNR NAK: receiver not ready"))
		}
	}
	color := blue
	if lost {
		color = red
	}
	t.printfLocked("  %s  %s\n", t.paint(color, arrow), packetLine(&r, lost, 2+len(arrow)+2))
	if len(marks) > 0 {
		t.printfLocked("  %s  %s\n", strings.Repeat(" ", len(arrow)), strings.Join(marks, "  "))
	}
}

// psnAfter reports a > b in 24-bit PSN arithmetic (IBTA 9.7.1).
func psnAfter(a, b uint32) bool {
	d := (a - b) & 0xffffff
	return d != 0 && d < 1<<23
}

func isRequest(op uint8) bool {
	info := bth.Opcode(op).Info()
	return info.Valid && info.Request
}

// width is the terminal width the printout is laid out for.
const width = 100

// packetLine is one packet: the BTH summary and headers, on two lines
// (the second indented by indent) when one would not fit width columns.
func packetLine(r *inspect.Record, lost bool, indent int) string {
	line := packetText(r, lost)
	if indent+len(line) <= width {
		return line
	}
	// Split after the AckReq column: "OPCODE psn N A" | headers.
	const head = 30 + 5 + 4 + 2
	if len(line) <= head+1 {
		return line
	}
	return strings.TrimRight(line[:head], " ") + "\n" + strings.Repeat(" ", indent+2) + strings.TrimSpace(line[head:])
}

func packetText(r *inspect.Record, lost bool) string {
	if !r.RoCE || r.Transport == "RoCE" {
		return "malformed: " + r.Malformed
	}
	var b strings.Builder
	// The opcode table's names, as softroce inspect prints them.
	name := strings.TrimPrefix(r.OpcodeName, "RC ")
	fmt.Fprintf(&b, "%-30s psn %-4d", name, r.PSN)
	if r.AckReq {
		b.WriteString(" A")
	} else {
		b.WriteString("  ")
	}
	if h := r.RETH; h != nil {
		fmt.Fprintf(&b, " RETH va 0x%x rkey 0x%x dmalen %d", h.VA, h.RKey, h.DMALen)
	}
	if h := r.AtomicETH; h != nil {
		fmt.Fprintf(&b, " AtomicETH va 0x%x rkey 0x%x", h.VA, h.RKey)
		if r.OpcodeName == "RC COMPARE_SWAP" {
			fmt.Fprintf(&b, " compare %d swap %d", h.Compare, h.SwapAdd)
		} else {
			fmt.Fprintf(&b, " add %d", h.SwapAdd)
		}
	}
	if h := r.AETH; h != nil {
		switch h.Kind {
		case "ACK":
			b.WriteString(" AETH ACK")
		case "NAK":
			fmt.Fprintf(&b, " AETH NAK %s", h.NAKName)
		case "RNR_NAK":
			fmt.Fprintf(&b, " AETH RNR_NAK %dus", *h.RNRTimerUS)
		default:
			fmt.Fprintf(&b, " AETH 0x%02x", h.Syndrome)
		}
		fmt.Fprintf(&b, " msn %d", h.MSN)
	}
	if h := r.AtomicAck; h != nil {
		fmt.Fprintf(&b, " orig %d", h.Orig)
	}
	if r.Imm != nil {
		fmt.Fprintf(&b, " ImmDt 0x%08x", *r.Imm)
	}
	fmt.Fprintf(&b, " len %d", r.PayloadLen)
	switch {
	case lost:
		// Its ICRC was filled but nobody will ever check it.
	case r.ICRC == "ok":
		b.WriteString(" icrc ok")
	default:
		b.WriteString(" icrc " + strings.ToUpper(r.ICRC))
	}
	return b.String()
}

// ---- memory ----

// hexdump prints n bytes of buf at off as hex and ASCII, eliding the
// middle of long ranges.
func (t *tracer) hexdump(who string, mr *verbs.MR, buf []byte, off, n int) {
	t.printf("  memory %s va 0x%x (%d bytes):\n", who, mr.Addr()+uint64(off), n)
	rows := (n + 15) / 16
	for row := 0; row < rows; row++ {
		if rows > 4 && row == 2 {
			t.printf("    %s\n", t.paint(dim, fmt.Sprintf("... %d more bytes ...", (rows-3)*16-(rows*16-n))))
			row = rows - 2
			continue
		}
		start := off + row*16
		end := min(start+16, off+n)
		var hx, asc strings.Builder
		for i := start; i < start+16; i++ {
			if i < end {
				fmt.Fprintf(&hx, "%02x ", buf[i])
				c := buf[i]
				if c < 0x20 || c > 0x7e {
					c = '.'
				}
				asc.WriteByte(c)
			} else {
				hx.WriteString("   ")
			}
		}
		t.printf("    +%04x  %s |%s|\n", start-off, hx.String(), asc.String())
	}
}

// ---- steps ----

func (t *tracer) setup(mtu int) error {
	a, b := t.sides[0], t.sides[1]
	t.section(0, "Setup: memory, completion queues, an RC queue pair")
	t.explain("Each side registers 4 KiB of memory. Registration returns an lkey (used in local " +
		"scatter/gather lists) and an rkey: whoever holds the rkey and the address may read, write or " +
		"update that memory remotely, within the access rights given here.")
	acc := verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead | verbs.AccessRemoteAtomic
	for _, s := range []*side{a, b} {
		var err error
		if s.pd, err = s.dev.AllocPD(); err != nil {
			return fmt.Errorf("alloc PD on %s: %w", s.name, err)
		}
		if s.mr, err = s.pd.RegMR(s.buf, acc); err != nil {
			return fmt.Errorf("register memory on %s: %w", s.name, err)
		}
		if s.cq, err = s.dev.CreateCQ(64); err != nil {
			return fmt.Errorf("create CQ on %s: %w", s.name, err)
		}
		if s.qp, err = s.pd.CreateQP(verbs.QPInitAttr{SendCQ: s.cq, RecvCQ: s.cq, Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16}}); err != nil {
			return fmt.Errorf("create QP on %s: %w", s.name, err)
		}
		t.call("ibv_reg_mr(%s, %d, LOCAL_WRITE|REMOTE_*) -> va 0x%x lkey 0x%x rkey 0x%x",
			s.name, bufSize, s.mr.Addr(), s.mr.LKey(), s.mr.RKey())
		t.call("ibv_create_cq(%s, 64); ibv_create_qp(%s, RC) -> qp 0x%06x", s.name, s.name, s.qp.Num())
	}
	t.explain(fmt.Sprintf("The two sides swap QP number, first PSN and GID out of band (a TCP socket, usually). "+
		"A starts its Packet Sequence Numbers at %d, B at %d: every request packet gets the next PSN, "+
		"and the responder accepts only the PSN it expects next.", psnA, psnB))
	ga, _ := a.dev.QueryGID(0)
	gb, _ := b.dev.QueryGID(0)
	// Timeout 14 (4.096 us * 2^14 = 67 ms, IBTA 9.7.6.1.3) is
	// ibv_rc_pingpong's: long enough that a slow host does not look like
	// a lossy wire, short enough to watch.
	oa := &verbs.ConnectOptions{PathMTU: mtu, SQPSN: psnA, Timeout: 14}
	ob := &verbs.ConnectOptions{PathMTU: mtu, SQPSN: psnB, Timeout: 14}
	if err := a.qp.Connect(verbs.RemoteInfo{QPN: b.qp.Num(), PSN: psnB, GID: gb}, oa); err != nil {
		return fmt.Errorf("connect A: %w", err)
	}
	if err := b.qp.Connect(verbs.RemoteInfo{QPN: a.qp.Num(), PSN: psnA, GID: ga}, ob); err != nil {
		return fmt.Errorf("connect B: %w", err)
	}
	for _, p := range [][2]*side{{a, b}, {b, a}} {
		s, o := p[0], p[1]
		t.call("ibv_modify_qp(qp 0x%06x: RESET->RTS, dest qp 0x%06x, sq_psn %d, rq_psn %d, mtu %d)",
			s.qp.Num(), o.qp.Num(), map[string]int{"A": psnA, "B": psnB}[s.name], map[string]int{"A": psnB, "B": psnA}[s.name], mtu)
	}
	return nil
}

// wait collects completions until want have arrived on s.
func (t *tracer) wait(ctx context.Context, s *side, want int) ([]verbs.WC, error) {
	var got []verbs.WC
	wc := make([]verbs.WC, 4)
	for len(got) < want {
		n, err := s.cq.Wait(ctx, wc)
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				return got, fmt.Errorf("no completion on %s after waiting: QP state %v", s.name, s.qp.State())
			}
			return got, err
		}
		for _, c := range wc[:n] {
			t.printWC(s, c)
			if c.Status.String() != "success" {
				return got, fmt.Errorf("%s completed with status %v", s.name, c.Status)
			}
		}
		got = append(got, wc[:n]...)
	}
	return got, nil
}

func (t *tracer) printWC(s *side, c verbs.WC) {
	var extra string
	if c.Flags&0x2 != 0 {
		extra = fmt.Sprintf(" imm 0x%08x", c.ImmData)
	}
	st := t.paint(green, c.Status.String())
	if c.Status.String() != "success" {
		st = t.paint(red, c.Status.String())
	}
	// byte_len is defined for receives and READs only (ibv_wc).
	if c.Opcode.String() == "RDMA_READ" || strings.HasPrefix(c.Opcode.String(), "RECV") {
		extra = fmt.Sprintf(", %d bytes", c.ByteLen) + extra
	}
	t.printf("  completion on %s: wr_id %d %s %s%s\n", s.name, c.WRID, c.Opcode, st, extra)
}

func (t *tracer) stepSend(ctx context.Context) error {
	a, b := t.sides[0], t.sides[1]
	t.section(1, "SEND: a message into a receive buffer B posted")
	t.explain("B first posts a receive work request: SEND needs a buffer the receiver chose. A's " +
		"SEND_ONLY packet carries the bytes and sets the AckReq bit; B writes them into its receive " +
		"buffer and answers with an ACK whose MSN (message sequence number) counts the messages B " +
		"has completed, so A knows which work request is done.")
	msg := []byte("hello from A over RoCEv2!")
	copy(a.buf[offSend:], msg)
	if err := b.qp.PostRecv(&verbs.RecvWR{ID: 10, SGL: []verbs.SGE{{Addr: b.mr.Addr() + offSend, Length: 64, LKey: b.mr.LKey()}}}); err != nil {
		return fmt.Errorf("post receive: %w", err)
	}
	t.call("ibv_post_recv(qp 0x%06x, wr_id 10, 64 bytes at va 0x%x)", b.qp.Num(), b.mr.Addr()+offSend)
	t.call("ibv_post_send(qp 0x%06x, wr_id 1, SEND, %d bytes from va 0x%x)", a.qp.Num(), len(msg), a.mr.Addr()+offSend)
	if err := a.qp.PostSend(&verbs.SendWR{ID: 1, Opcode: verbs.WRSend, Flags: verbs.SendSignaled,
		SGL: []verbs.SGE{{Addr: a.mr.Addr() + offSend, Length: uint32(len(msg)), LKey: a.mr.LKey()}}}); err != nil {
		return fmt.Errorf("post send: %w", err)
	}
	if _, err := t.wait(ctx, a, 1); err != nil {
		return err
	}
	wcs, err := t.wait(ctx, b, 1)
	if err != nil {
		return err
	}
	if wcs[0].ByteLen != uint32(len(msg)) || !bytes.Equal(b.buf[offSend:offSend+len(msg)], msg) {
		return fmt.Errorf("B received %q (%d bytes), want %q", b.buf[offSend:offSend+len(msg)], wcs[0].ByteLen, msg)
	}
	t.hexdump("B", b.mr, b.buf, offSend, len(msg))
	return nil
}

func (t *tracer) stepWrite(ctx context.Context) error {
	a, b := t.sides[0], t.sides[1]
	t.section(2, "RDMA WRITE with immediate: straight into B's memory")
	t.explain(fmt.Sprintf("%d bytes do not fit one packet of the path MTU, so the requester splits the "+
		"message into FIRST, MIDDLE and LAST packets with consecutive PSNs. Only the FIRST carries the "+
		"RETH (remote address, rkey, total length): the responder remembers it. The LAST carries the "+
		"immediate value, which consumes a receive buffer at B and gives B a completion, and asks for "+
		"the ACK; one ACK covers the whole message.", writeLen))
	const pattern = "RDMA WRITE puts bytes in remote memory. "
	for i := 0; i < writeLen; i++ {
		a.buf[offWrite+i] = pattern[i%len(pattern)]
	}
	if err := b.qp.PostRecv(&verbs.RecvWR{ID: 11}); err != nil {
		return fmt.Errorf("post receive: %w", err)
	}
	t.call("ibv_post_recv(qp 0x%06x, wr_id 11, no buffer: only the immediate arrives)", b.qp.Num())
	t.call("ibv_post_send(qp 0x%06x, wr_id 2, RDMA_WRITE_WITH_IMM, %d bytes -> va 0x%x rkey 0x%x, imm 0x%08x)",
		a.qp.Num(), writeLen, b.mr.Addr()+offWrite, b.mr.RKey(), immValue)
	if err := a.qp.PostSend(&verbs.SendWR{ID: 2, Opcode: verbs.WRRDMAWriteWithImm, Flags: verbs.SendSignaled, Imm: immValue,
		SGL:        []verbs.SGE{{Addr: a.mr.Addr() + offWrite, Length: writeLen, LKey: a.mr.LKey()}},
		RemoteAddr: b.mr.Addr() + offWrite, RKey: b.mr.RKey()}); err != nil {
		return fmt.Errorf("post send: %w", err)
	}
	if _, err := t.wait(ctx, a, 1); err != nil {
		return err
	}
	wcs, err := t.wait(ctx, b, 1)
	if err != nil {
		return err
	}
	if wcs[0].ImmData != immValue {
		return fmt.Errorf("B got immediate 0x%08x, want 0x%08x", wcs[0].ImmData, immValue)
	}
	if !bytes.Equal(b.buf[offWrite:offWrite+writeLen], a.buf[offWrite:offWrite+writeLen]) {
		return errors.New("B's memory does not hold what A wrote")
	}
	t.hexdump("B", b.mr, b.buf, offWrite, writeLen)
	return nil
}

func (t *tracer) stepRead(ctx context.Context) error {
	a, b := t.sides[0], t.sides[1]
	t.section(3, "RDMA READ: fetch bytes from B's memory")
	t.explain("The READ REQUEST is a single packet with a RETH; it reserves as many PSNs as there " +
		"will be response packets. B answers with READ RESPONSE FIRST/MIDDLE/LAST carrying those PSNs " +
		"and an AETH on the first and last: the responses are the acknowledgement, there is no separate " +
		"ACK. B posts nothing and sees no completion.")
	for i := 0; i < readLen; i++ {
		b.buf[offRead+i] = byte('a' + i%26)
	}
	t.call("ibv_post_send(qp 0x%06x, wr_id 3, RDMA_READ, %d bytes <- va 0x%x rkey 0x%x)", a.qp.Num(), readLen, b.mr.Addr()+offRead, b.mr.RKey())
	if err := a.qp.PostSend(&verbs.SendWR{ID: 3, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
		SGL:        []verbs.SGE{{Addr: a.mr.Addr() + offRead, Length: readLen, LKey: a.mr.LKey()}},
		RemoteAddr: b.mr.Addr() + offRead, RKey: b.mr.RKey()}); err != nil {
		return fmt.Errorf("post send: %w", err)
	}
	if _, err := t.wait(ctx, a, 1); err != nil {
		return err
	}
	if !bytes.Equal(a.buf[offRead:offRead+readLen], b.buf[offRead:offRead+readLen]) {
		return errors.New("A's memory does not hold what B had")
	}
	t.hexdump("A", a.mr, a.buf, offRead, readLen)
	return nil
}

func (t *tracer) atomic(ctx context.Context, id uint64, op verbs.WROpcode, cmpAdd, swap, wantOrig, wantNew uint64) error {
	a, b := t.sides[0], t.sides[1]
	if err := a.qp.PostSend(&verbs.SendWR{ID: id, Opcode: op, Flags: verbs.SendSignaled, CompareAdd: cmpAdd, Swap: swap,
		SGL:        []verbs.SGE{{Addr: a.mr.Addr() + offAtomic, Length: 8, LKey: a.mr.LKey()}},
		RemoteAddr: b.mr.Addr() + offAtomic, RKey: b.mr.RKey()}); err != nil {
		return fmt.Errorf("post send: %w", err)
	}
	if _, err := t.wait(ctx, a, 1); err != nil {
		return err
	}
	orig := binary.NativeEndian.Uint64(a.buf[offAtomic:])
	now := binary.NativeEndian.Uint64(b.buf[offAtomic:])
	t.printf("  original value returned to A: %d; B's counter is now %d\n", orig, now)
	if orig != wantOrig || now != wantNew {
		return fmt.Errorf("got original %d and new %d, want %d and %d", orig, now, wantOrig, wantNew)
	}
	t.hexdump("B", b.mr, b.buf, offAtomic, 8)
	return nil
}

func (t *tracer) stepCAS(ctx context.Context) error {
	a, b := t.sides[0], t.sides[1]
	t.section(4, "Compare-and-swap on a 64-bit counter in B's memory")
	t.explain("An atomic request carries an AtomicETH (address, rkey, compare and swap values). B " +
		"performs it atomically and answers with ATOMIC ACKNOWLEDGE, whose AtomicAckETH returns the " +
		"value found there: A learns whether the swap happened. B keeps the answer, so a retransmitted " +
		"request is answered again without executing twice.")
	binary.NativeEndian.PutUint64(b.buf[offAtomic:], 41)
	t.call("ibv_post_send(qp 0x%06x, wr_id 4, ATOMIC_CMP_AND_SWP, va 0x%x rkey 0x%x, compare 41, swap 42)",
		a.qp.Num(), b.mr.Addr()+offAtomic, b.mr.RKey())
	return t.atomic(ctx, 4, verbs.WRAtomicCmpAndSwp, 41, 42, 41, 42)
}

func (t *tracer) stepFAA(ctx context.Context) error {
	a, b := t.sides[0], t.sides[1]
	t.section(5, "Fetch-and-add on the same counter")
	t.explain("Same shape: an AtomicETH with the value to add, an ATOMIC ACKNOWLEDGE with the value " +
		"before the addition.")
	t.call("ibv_post_send(qp 0x%06x, wr_id 5, ATOMIC_FETCH_AND_ADD, va 0x%x rkey 0x%x, add 1000)",
		a.qp.Num(), b.mr.Addr()+offAtomic, b.mr.RKey())
	return t.atomic(ctx, 5, verbs.WRAtomicFetchAndAdd, 1000, 0, 42, 1042)
}

func (t *tracer) summary(impaired bool) {
	t.mu.Lock()
	r := *t.res
	// Packets after this (a late duplicate, a timer firing while the
	// devices close) would print below the summary: the run is over.
	t.done = true
	t.mu.Unlock()
	t.printf("\n%s\n", t.paint(bold, "== Done "+strings.Repeat("=", 72)))
	t.printf("  %s: %d operations completed, %d packets on the wire\n",
		t.paint(green, "all good"), len(r.Steps), r.Packets-r.LostPackets)
	if impaired {
		t.printf("  the wire lost %d, corrupted %d and duplicated %d; %d retransmitted, %d NAKs\n",
			r.LostPackets, r.Corrupted, r.Duplicated, r.Retransmits, r.NAKs)
	}
	if impaired && r.LostPackets+r.Corrupted > 0 {
		t.explain("RC repaired every loss: a gap in PSNs makes the responder send a NAK (PSN sequence " +
			"error) and the requester goes back to the missing PSN and resends from there (go-back-N); " +
			"when nothing comes back at all, the requester's timer fires and it resends the oldest " +
			"unacknowledged packet. Duplicates are recognised by their PSN and answered, not executed twice.")
	}
}
