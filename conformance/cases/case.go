package cases

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/softroce/softroce/bth"
)

// Case is one packet-level conformance case: a scripted exchange between
// the fake peer and a target QP, judged against the IBTA specification.
type Case struct {
	// ID is a short stable name ("psn-sequence-error").
	ID string
	// Spec is the specification's expectation, with its section.
	Spec string
	// Ref names the entries of docs/conformance-catalogue.md section A the
	// case implements ("RS-06, LU-01"), if any.
	Ref string
	// Known records documented departures from the spec per device driver
	// (DriverOf: "rxe", "softroce", or a remote RNIC's kernel driver;
	// docs/rxe-behaviour.md for rxe), so that rxe reached as a remote host
	// deviates as documented for rxe. A case with a known deviation is
	// expected NOT to conform on that target; tests assert that it still
	// deviates.
	Known map[string]string
	// Bugs records known defects per device driver, like Known: the verdict stays
	// "fail" (the report says so), and tests expect the failure until the
	// defect is fixed and the entry removed.
	Bugs map[string]string
	// Run scripts the exchange; it reports through x.
	Run func(x *X)
}

// Verdicts of a case on one target.
const (
	VerdictPass      = "pass"      // conforms to the spec
	VerdictFail      = "fail"      // does not conform, and no deviation is documented
	VerdictDeviation = "deviation" // does not conform, as documented in Case.Known
	VerdictError     = "error"     // the harness could not run the case
)

// Result is the outcome of one case on one target.
type Result struct {
	Target string `json:"target"`
	// Driver is the target's device driver (DriverOf), the key of
	// Case.Known and Case.Bugs.
	Driver string `json:"driver,omitempty"`
	// Verdict is one of the Verdict constants.
	Verdict string `json:"verdict"`
	// Conforms says whether the observed behaviour meets Case.Spec.
	Conforms bool `json:"conforms"`
	// Observed summarises what the target did.
	Observed string `json:"observed"`
	// Failures list every way the behaviour departed from the spec.
	Failures []string `json:"failures,omitempty"`
	// Notes are facts worth knowing that do not decide the verdict.
	Notes []string `json:"notes,omitempty"`
	// Error is why the harness could not run the case (VerdictError).
	Error string `json:"error,omitempty"`
	// Trace is the packet conversation, one packet a line.
	Trace []string `json:"trace,omitempty"`
	// Millis is how long the case took.
	Millis int64 `json:"ms"`

	conv *Conv
}

// key is the result's key into Case.Known and Case.Bugs.
func (r *Result) key() string {
	if r.Driver != "" {
		return r.Driver
	}
	return r.Target
}

// Conv is the case's packet conversation (nil when the case never opened
// a QP); the runner writes it to a pcap file when asked.
func (r *Result) Conv() *Conv { return r.conv }

// X is what a case runs with: the target, its QP, the conversation, and
// the result being built.
type X struct {
	Ctx    context.Context
	Target Target
	S      Session
	C      *Conv
	Spec   QPSpec
	res    *Result
	abort  bool
	obs    []string
	extra  []Session // further QPs the case opened (OpenQP)
	never  []watch
	after  []func() // Defer's functions
}

// Defer runs f when the case is over, after the final listening window of
// its Never checks, before its QPs are closed: for what must stay up while
// late packets are still judged (a listener on the target).
func (x *X) Defer(f func()) { x.after = append(x.after, f) }

// watch is a negative assertion that holds for the rest of a case.
type watch struct {
	what    string
	peerQPN uint32
	from    int // index into C.Pkts where the watch starts
	since   time.Time
	bad     func(*Pkt) bool
}

// errAbort unwinds a case after a harness error.
type errAbort struct{}

// Open creates the case's QP on the target, connected to a fresh peer QP
// number, and starts the conversation. A failure aborts the case with
// VerdictError.
func (x *X) Open(spec QPSpec) {
	spec.PeerQPN = 0x100 + rand.Uint32N(0xff0000)
	spec.fill()
	s, err := x.Target.Open(x.Ctx, spec)
	if err != nil {
		x.Fatalf("open a QP on %s: %v", x.Target.Name(), err)
	}
	x.S, x.Spec = s, spec
	x.C = x.Target.Peer().NewConv(x.Ctx, x.Target.Addr(), spec.PeerQPN, s.QPN())
	x.res.conv = x.C
}

// OpenQP1 starts a conversation between the peer's QP1 and the target's
// QP1 (GSI), where CM MADs travel, without opening a QP on the target.
func (x *X) OpenQP1() {
	x.C = x.Target.Peer().NewConv(x.Ctx, x.Target.Addr(), 1, 1)
	x.res.conv = x.C
}

// OpenQP opens a fresh QP on the target in the case's protection domain,
// sharing the case's memory regions (spec.MRs is ignored), connected to a
// new peer QP number, and moves the conversation to it: later sends go to
// the new QP and Collect returns what the target sends to the new peer
// QPN. Packets still arriving for the earlier QP stay in the trace and in
// Never's view.
func (x *X) OpenQP(spec QPSpec) Session {
	spec.PeerQPN = 0x100 + rand.Uint32N(0xff0000)
	spec.MRs = x.Spec.MRs
	spec.fill()
	s, err := x.S.OpenQP(x.Ctx, spec)
	if err != nil {
		x.Fatalf("open a second QP on %s: %v", x.Target.Name(), err)
	}
	x.extra = append(x.extra, s)
	x.C.retarget(spec.PeerQPN, s.QPN())
	return s
}

// Never asserts that, from now to the end of the case, the target sends
// the peer's current QP no packet for which bad returns true. It is how a
// case says "exactly one NAK" or "silence" without trusting one short
// window: every packet that arrives later — in the case's next windows or
// in a final listening window (lateWait) at the end of the case — is
// checked, so an answer delayed by a busy machine is still seen.
func (x *X) Never(what string, bad func(*Pkt) bool) {
	x.never = append(x.never, watch{what: what, peerQPN: x.C.PeerQPN, from: len(x.C.Pkts), since: time.Now(), bad: bad})
}

// checkNever listens for lateWait and fails every Never a packet broke.
func (x *X) checkNever() {
	if len(x.never) == 0 || x.C == nil {
		return
	}
	x.C.Collect(lateWait, nil)
	for _, w := range x.never {
		for _, q := range x.C.Pkts[w.from:] {
			if q.Dir != 'R' || q.ParseErr != nil || q.P.BTH.DestQP() != w.peerQPN || !w.bad(q) {
				continue
			}
			x.Failf("%s: %s came %.1f ms after the check began", w.what, Describe(q), float64(q.Time.Sub(w.since).Microseconds())/1000)
			break
		}
	}
}

// Fatalf records a harness error and ends the case.
func (x *X) Fatalf(format string, args ...any) {
	x.res.Error = fmt.Sprintf(format, args...)
	x.abort = true
	panic(errAbort{})
}

// Must ends the case with a harness error when err is not nil.
func (x *X) Must(err error, what string) {
	if err != nil {
		x.Fatalf("%s: %v", what, err)
	}
}

// Failf records a departure from the spec (the case goes on).
func (x *X) Failf(format string, args ...any) {
	x.res.Failures = append(x.res.Failures, fmt.Sprintf(format, args...))
}

// Check records a failure unless ok.
func (x *X) Check(ok bool, format string, args ...any) bool {
	if !ok {
		x.Failf(format, args...)
	}
	return ok
}

// Notef records a note.
func (x *X) Notef(format string, args ...any) {
	x.res.Notes = append(x.res.Notes, fmt.Sprintf(format, args...))
}

// Observe adds a phrase to the observed summary.
func (x *X) Observe(format string, args ...any) {
	x.obs = append(x.obs, fmt.Sprintf(format, args...))
}

// Send sends a packet from the peer; a send failure is a harness error.
func (x *X) Send(f bth.Fields, payload []byte) {
	if _, err := x.C.Send(f, payload); err != nil {
		x.Fatalf("peer send: %v", err)
	}
}

// SendBadICRC sends a packet whose ICRC is wrong.
func (x *X) SendBadICRC(f bth.Fields, payload []byte) {
	if _, err := x.C.SendBadICRC(f, payload); err != nil {
		x.Fatalf("peer send: %v", err)
	}
}

// Run runs c against t and returns its result.
func Run(ctx context.Context, t Target, c *Case) (res *Result) {
	start := time.Now()
	res = &Result{Target: t.Name(), Driver: DriverOf(t)}
	x := &X{Ctx: ctx, Target: t, res: res}
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(errAbort); !ok {
				res.Error = fmt.Sprintf("case panicked: %v", r)
				x.abort = true
			}
		}
		if !x.abort {
			func() {
				// A panic here is the harness's, like one in the case.
				defer func() {
					if r := recover(); r != nil {
						if _, ok := r.(errAbort); !ok {
							res.Error = fmt.Sprintf("case panicked: %v", r)
						}
						x.abort = true
					}
				}()
				x.checkNever()
			}()
		}
		for i := len(x.after) - 1; i >= 0; i-- {
			x.after[i]()
		}
		for i := len(x.extra) - 1; i >= 0; i-- {
			if err := x.extra[i].Close(); err != nil {
				res.Notes = append(res.Notes, "closing a second QP: "+err.Error())
			}
		}
		if x.S != nil {
			if err := x.S.Close(); err != nil {
				res.Notes = append(res.Notes, "closing the QP: "+err.Error())
			}
		}
		if x.C != nil {
			res.Trace = x.C.Trace()
			if x.C.Stray > 0 {
				res.Notes = append(res.Notes, fmt.Sprintf("%d stray packet(s) for other QPs ignored", x.C.Stray))
			}
		}
		if err := t.Peer().Err(); err != nil {
			res.Error, x.abort = "peer link: "+err.Error(), true
		}
		res.Observed = strings.Join(x.obs, "; ")
		switch {
		case x.abort:
			res.Verdict = VerdictError
		case len(res.Failures) == 0:
			res.Conforms, res.Verdict = true, VerdictPass
		case c.Known[res.Driver] != "":
			res.Verdict = VerdictDeviation
		default:
			res.Verdict = VerdictFail
		}
		res.Millis = time.Since(start).Milliseconds()
	}()
	c.Run(x)
	return res
}

// Describe is a compact form of a response for observed summaries:
// "ACK@0x000005", "NAK 0x60@0x000003", "READ_RESPONSE_FIRST@... 1024B".
func Describe(q *Pkt) string {
	if q.ParseErr != nil {
		return "unparsable packet"
	}
	op := q.Opcode()
	s := fmt.Sprintf("%s@0x%06x", opName(op), q.PSN())
	if op == bth.RCAck {
		syn := q.Syndrome()
		switch {
		case syn.IsACK():
			s = fmt.Sprintf("ACK@0x%06x", q.PSN())
		case syn.IsRNRNAK():
			s = fmt.Sprintf("RNR NAK 0x%02x@0x%06x", uint8(syn), q.PSN())
		default:
			s = fmt.Sprintf("NAK 0x%02x@0x%06x", uint8(syn), q.PSN())
		}
	}
	if q.P.Info != nil && q.P.Info.Payload != bth.PayloadNone && op != bth.RCAck {
		s += fmt.Sprintf(" %dB", len(q.P.Payload))
	}
	if q.P.AtomicAckETH != nil {
		s += fmt.Sprintf(" orig=%d", q.P.AtomicAckETH.Orig())
	}
	return s
}

// DescribeAll joins Describe of every packet, or "no response".
func DescribeAll(ps []*Pkt) string {
	if len(ps) == 0 {
		return "no response"
	}
	var s []string
	for _, q := range ps {
		s = append(s, Describe(q))
	}
	return strings.Join(s, ", ")
}

// opName is the opcode's name without the "RC " transport prefix.
func opName(op bth.Opcode) string { return strings.TrimPrefix(op.String(), "RC ") }
