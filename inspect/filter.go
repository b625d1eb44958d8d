package inspect

import (
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"strings"

	"github.com/softroce/softroce/bth"
)

// A Filter selects packets the way a display filter does (tshark -Y): an
// expression over the fields inspect decodes and the marks its analysis
// gives (retransmission, gap), such as
//
//	qp == 0x11 && (nak || retransmission)
//	opcode == RDMA_WRITE_ONLY || read
//	src == 10.0.0.0/24 && psn >= 100 && psn <= 200
//
// The language is documented in docs/cli.md ("inspect filters"). A filter
// is compiled once; Match does no allocation and takes time linear in the
// expression's length, which is bounded by MaxFilterLen.
type Filter struct {
	expr string
	root node
}

// MaxFilterLen bounds a filter expression's length in bytes; maxDepth its
// nesting of parentheses and negations.
const (
	MaxFilterLen = 4096
	maxDepth     = 64
)

// FilterError is a filter expression that does not compile: Pos is the
// byte offset in Expr where the trouble is, Msg what was expected there.
type FilterError struct {
	Expr string
	Pos  int
	Msg  string
}

func (e *FilterError) Error() string {
	return fmt.Sprintf("filter: column %d: %s", e.Pos+1, e.Msg)
}

// Caret returns the expression and, below it, a caret under the column
// the error names (the expression's control characters shown as spaces).
func (e *FilterError) Caret() string {
	expr := e.Expr
	if len(expr) > 200 { // a line people can read
		start := max(0, e.Pos-100)
		end := min(len(expr), start+200)
		return (&FilterError{Expr: expr[start:end], Pos: e.Pos - start}).Caret()
	}
	b := []byte(expr)
	for i, c := range b {
		if c < ' ' || c == 0x7f {
			b[i] = ' '
		}
	}
	return string(b) + "\n" + strings.Repeat(" ", min(e.Pos, len(b))) + "^"
}

// String returns the expression the filter was compiled from.
func (f *Filter) String() string { return f.expr }

// Match reports whether a record passes the filter; m is what the
// analysis made of it (Summarizer.AddMark). Frames that are not RoCE never
// match: inspect lists only RoCE packets.
func (f *Filter) Match(r *Record, m Mark) bool {
	if !r.RoCE {
		return false
	}
	return f.root.eval(r, m)
}

// node is a compiled expression.
type node interface {
	eval(r *Record, m Mark) bool
}

type andNode struct{ a, b node }
type orNode struct{ a, b node }
type notNode struct{ x node }
type predNode func(r *Record, m Mark) bool

func (n *andNode) eval(r *Record, m Mark) bool { return n.a.eval(r, m) && n.b.eval(r, m) }
func (n *orNode) eval(r *Record, m Mark) bool  { return n.a.eval(r, m) || n.b.eval(r, m) }
func (n *notNode) eval(r *Record, m Mark) bool { return !n.x.eval(r, m) }
func (n predNode) eval(r *Record, m Mark) bool { return n(r, m) }

// cmpOp is a comparison operator.
type cmpOp int

const (
	opEq cmpOp = iota
	opNe
	opLt
	opLe
	opGt
	opGe
)

func (o cmpOp) cmp(a, b uint64) bool {
	switch o {
	case opEq:
		return a == b
	case opNe:
		return a != b
	case opLt:
		return a < b
	case opLe:
		return a <= b
	case opGt:
		return a > b
	}
	return a >= b
}

// numNode compares a numeric field; a packet without the field matches
// no comparison (as in tshark: !(qp == 1) selects the packets without one).
type numNode struct {
	get func(r *Record) (uint64, bool)
	op  cmpOp
	v   uint64
}

func (n *numNode) eval(r *Record, _ Mark) bool {
	v, ok := n.get(r)
	return ok && n.op.cmp(v, n.v)
}

// located reports whether the BTH was decoded.
func located(r *Record) bool { return r.OpcodeName != "" }

// numFields are the numeric fields, by every name they go by.
var numFields = map[string]func(r *Record) (uint64, bool){}

// boolFields are the fields that are true or false of a packet.
var boolFields = map[string]predNode{}

// addrFields say which addresses an address field compares.
var addrFields = map[string]int{}

const (
	addrSrc = 1
	addrDst = 2
	addrAny = 3
)

// families are the opcode families, usable bare (read) or as an opcode
// value (opcode == read).
var families = map[string]predNode{}

// fieldNames lists every field name, for error messages.
var fieldNames []string

func opInfo(r *Record) *bth.OpInfo { return bth.Opcode(r.Opcode).Info() }

func aethKind(r *Record, kind string) bool { return r.AETH != nil && r.AETH.Kind == kind }

func isOp(ops ...bth.Operation) predNode {
	return func(r *Record, _ Mark) bool {
		if !located(r) {
			return false
		}
		op := opInfo(r).Op
		for _, o := range ops {
			if op == o {
				return true
			}
		}
		return false
	}
}

func isTransport(t bth.Transport) predNode {
	return func(r *Record, _ Mark) bool {
		return located(r) && opInfo(r).Valid && opInfo(r).Transport == t
	}
}

func init() {
	num := func(get func(r *Record) (uint64, bool), names ...string) {
		for _, n := range names {
			numFields[n] = get
		}
	}
	bthField := func(get func(r *Record) uint64) func(r *Record) (uint64, bool) {
		return func(r *Record) (uint64, bool) { return get(r), located(r) }
	}
	num(bthField(func(r *Record) uint64 { return uint64(r.DestQP) }), "qp", "dest_qp", "destqp", "bth.destqp")
	num(bthField(func(r *Record) uint64 { return uint64(r.PSN) }), "psn", "bth.psn")
	num(bthField(func(r *Record) uint64 { return uint64(r.PKey) }), "pkey", "bth.pkey")
	num(bthField(func(r *Record) uint64 { return uint64(r.Opcode) }), "opcode", "bth.opcode")
	num(bthField(func(r *Record) uint64 { return uint64(r.PayloadLen) }), "len", "payload_len")
	num(func(r *Record) (uint64, bool) { return uint64(r.Frame), true }, "frame", "frame.number")
	num(func(r *Record) (uint64, bool) { return uint64(r.WireLen), true }, "wire_len", "frame.len")
	num(func(r *Record) (uint64, bool) { return uint64(r.SrcPort), r.SrcPort != 0 }, "sport", "src_port", "udp.srcport")
	num(func(r *Record) (uint64, bool) { return uint64(r.DstPort), r.DstPort != 0 }, "dport", "dst_port", "udp.dstport")
	num(func(r *Record) (uint64, bool) {
		if len(r.VLAN) == 0 {
			return 0, false
		}
		return uint64(r.VLAN[0]), true
	}, "vlan", "vlan.id")
	num(func(r *Record) (uint64, bool) {
		if r.DETH == nil {
			return 0, false
		}
		return uint64(r.DETH.SrcQP), true
	}, "srcqp", "src_qp", "deth.srcqp")
	num(func(r *Record) (uint64, bool) {
		if r.DETH == nil {
			return 0, false
		}
		return uint64(r.DETH.QKey), true
	}, "qkey", "deth.qkey")
	num(func(r *Record) (uint64, bool) {
		switch {
		case r.RETH != nil:
			return uint64(r.RETH.RKey), true
		case r.AtomicETH != nil:
			return uint64(r.AtomicETH.RKey), true
		}
		return 0, false
	}, "rkey")
	num(func(r *Record) (uint64, bool) {
		if r.RETH == nil {
			return 0, false
		}
		return uint64(r.RETH.DMALen), true
	}, "dmalen", "reth.dmalen")
	num(func(r *Record) (uint64, bool) {
		if r.AETH == nil {
			return 0, false
		}
		return uint64(r.AETH.MSN), true
	}, "msn", "aeth.msn")
	num(func(r *Record) (uint64, bool) {
		if r.AETH == nil {
			return 0, false
		}
		return uint64(r.AETH.Syndrome), true
	}, "syndrome", "aeth.syndrome")

	for name, a := range map[string]int{"src": addrSrc, "ip.src": addrSrc, "dst": addrDst, "ip.dst": addrDst,
		"addr": addrAny, "host": addrAny, "ip.addr": addrAny} {
		addrFields[name] = a
	}

	fam := func(p predNode, names ...string) {
		for _, n := range names {
			families[n] = p
		}
	}
	fam(isOp(bth.OpReadRequest, bth.OpReadResponse), "read")
	fam(isOp(bth.OpWrite), "write")
	fam(isOp(bth.OpSend), "send")
	fam(isOp(bth.OpCompareSwap, bth.OpFetchAdd, bth.OpAtomicAck, bth.OpAtomicWrite), "atomic")
	fam(isOp(bth.OpCNP), "cnp")
	fam(func(r *Record, _ Mark) bool {
		return located(r) && (opInfo(r).Op == bth.OpAck || opInfo(r).Op == bth.OpAtomicAck) && aethKind(r, "ACK")
	}, "ack")
	fam(func(r *Record, _ Mark) bool { return aethKind(r, "NAK") }, "nak")
	fam(func(r *Record, _ Mark) bool { return aethKind(r, "RNR_NAK") }, "rnr_nak", "rnr")
	fam(func(r *Record, _ Mark) bool { return located(r) && opInfo(r).Valid && opInfo(r).Request }, "request")
	fam(func(r *Record, _ Mark) bool {
		return located(r) && opInfo(r).Valid && !opInfo(r).Request && opInfo(r).Op != bth.OpCNP
	}, "response")

	b := func(p predNode, names ...string) {
		for _, n := range names {
			boolFields[n] = p
		}
	}
	for n, p := range families {
		b(p, n)
	}
	b(func(_ *Record, m Mark) bool { return m.Retransmission }, "retransmission", "retrans", "retransmit")
	b(func(_ *Record, m Mark) bool { return m.Gap }, "gap")
	b(func(r *Record, _ Mark) bool { return r.FECN || r.BECN }, "ecn")
	b(func(r *Record, _ Mark) bool { return r.FECN }, "fecn")
	b(func(r *Record, _ Mark) bool { return r.BECN }, "becn")
	b(func(r *Record, _ Mark) bool { return located(r) && r.AckReq }, "ackreq")
	b(func(r *Record, _ Mark) bool { return located(r) && r.SE }, "se")
	b(func(r *Record, _ Mark) bool { return r.ICRC == "bad" }, "icrc_bad", "bad_icrc")
	b(func(r *Record, _ Mark) bool { return r.ICRC == "ok" }, "icrc_ok")
	b(func(r *Record, _ Mark) bool { return r.ICRC == "truncated" }, "truncated")
	b(func(r *Record, _ Mark) bool { return r.Malformed != "" }, "malformed")
	b(func(r *Record, _ Mark) bool { return r.CM != nil }, "cm")
	b(func(r *Record, _ Mark) bool { return r.Imm != nil }, "imm")
	b(func(r *Record, _ Mark) bool { return r.Transport == "RoCEv1" }, "rocev1")
	b(func(r *Record, _ Mark) bool { return r.Transport == "RoCEv2" }, "rocev2")
	b(isTransport(bth.TransportRC), "rc")
	b(isTransport(bth.TransportUC), "uc")
	b(isTransport(bth.TransportRD), "rd")
	b(isTransport(bth.TransportUD), "ud")
	b(isTransport(bth.TransportXRC), "xrc")

	for _, m := range []map[string]predNode{boolFields} {
		for n := range m {
			fieldNames = append(fieldNames, n)
		}
	}
	for n := range numFields {
		fieldNames = append(fieldNames, n)
	}
	for n := range addrFields {
		fieldNames = append(fieldNames, n)
	}
	sort.Strings(fieldNames)
}

// token kinds.
const (
	tEOF = iota
	tLParen
	tRParen
	tNot
	tAnd
	tOr
	tCmp
	tWord
	tString
)

type token struct {
	kind int
	pos  int
	text string // the word, the string's contents, or the operator as written
	op   cmpOp
}

func (t token) describe() string {
	switch t.kind {
	case tEOF:
		return "the end of the expression"
	case tString:
		return strconv.Quote(t.text)
	}
	return fmt.Sprintf("%q", t.text)
}

// isWordByte reports whether c can be part of a word: field names,
// numbers, names, addresses (IPv6 ones included) and prefixes.
func isWordByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == ':' || c == '/'
}

// lex splits the expression into tokens.
func lex(s string) ([]token, error) {
	var toks []token
	fail := func(pos int, format string, a ...any) ([]token, error) {
		return nil, &FilterError{Expr: s, Pos: pos, Msg: fmt.Sprintf(format, a...)}
	}
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '(':
			toks = append(toks, token{kind: tLParen, pos: i, text: "("})
			i++
		case c == ')':
			toks = append(toks, token{kind: tRParen, pos: i, text: ")"})
			i++
		case c == '&' || c == '|':
			if i+1 >= len(s) || s[i+1] != c {
				return fail(i, "expected %c%c, found a single %c", c, c, c)
			}
			k := tAnd
			if c == '|' {
				k = tOr
			}
			toks = append(toks, token{kind: k, pos: i, text: s[i : i+2]})
			i += 2
		case c == '!' || c == '=' || c == '<' || c == '>':
			two := i+1 < len(s) && s[i+1] == '='
			switch {
			case c == '!' && two:
				toks = append(toks, token{kind: tCmp, pos: i, text: "!=", op: opNe})
			case c == '!':
				toks = append(toks, token{kind: tNot, pos: i, text: "!"})
				i++
				continue
			case c == '=' && two:
				toks = append(toks, token{kind: tCmp, pos: i, text: "==", op: opEq})
			case c == '=':
				return fail(i, "expected ==, found a single =")
			case c == '<' && two:
				toks = append(toks, token{kind: tCmp, pos: i, text: "<=", op: opLe})
			case c == '>' && two:
				toks = append(toks, token{kind: tCmp, pos: i, text: ">=", op: opGe})
			case c == '<':
				toks = append(toks, token{kind: tCmp, pos: i, text: "<", op: opLt})
				i++
				continue
			default:
				toks = append(toks, token{kind: tCmp, pos: i, text: ">", op: opGt})
				i++
				continue
			}
			i += 2
		case c == '"':
			j := i + 1
			for j < len(s) && s[j] != '"' {
				j++
			}
			if j >= len(s) {
				return fail(i, "expected a closing \" for the string opened here")
			}
			toks = append(toks, token{kind: tString, pos: i, text: s[i+1 : j]})
			i = j + 1
		case isWordByte(c):
			j := i
			for j < len(s) && isWordByte(s[j]) {
				j++
			}
			w := s[i:j]
			t := token{kind: tWord, pos: i, text: w}
			switch strings.ToLower(w) {
			case "and":
				t.kind = tAnd
			case "or":
				t.kind = tOr
			case "not":
				t.kind = tNot
			case "eq":
				t.kind, t.op = tCmp, opEq
			case "ne":
				t.kind, t.op = tCmp, opNe
			case "lt":
				t.kind, t.op = tCmp, opLt
			case "le":
				t.kind, t.op = tCmp, opLe
			case "gt":
				t.kind, t.op = tCmp, opGt
			case "ge":
				t.kind, t.op = tCmp, opGe
			}
			toks = append(toks, t)
			i = j
		default:
			return fail(i, "unexpected character %q: expected a field, a value, an operator (== != < <= > >= && || !) or a parenthesis", rune(c))
		}
	}
	return append(toks, token{kind: tEOF, pos: len(s)}), nil
}

type parser struct {
	expr  string
	toks  []token
	i     int
	depth int
}

func (p *parser) peek() token { return p.toks[p.i] }
func (p *parser) next() token {
	t := p.toks[p.i]
	if t.kind != tEOF {
		p.i++
	}
	return t
}

func (p *parser) fail(pos int, format string, a ...any) error {
	return &FilterError{Expr: p.expr, Pos: pos, Msg: fmt.Sprintf(format, a...)}
}

// ParseFilter compiles a filter expression; errors are *FilterError.
func ParseFilter(expr string) (*Filter, error) {
	if len(expr) > MaxFilterLen {
		return nil, &FilterError{Expr: expr, Pos: MaxFilterLen, Msg: fmt.Sprintf("expression longer than %d bytes", MaxFilterLen)}
	}
	toks, err := lex(expr)
	if err != nil {
		return nil, err
	}
	p := &parser{expr: expr, toks: toks}
	if p.peek().kind == tEOF {
		return nil, p.fail(0, "empty expression: expected a field, ( or !")
	}
	n, err := p.or()
	if err != nil {
		return nil, err
	}
	if t := p.peek(); t.kind != tEOF {
		what := "&&, || or the end of the expression"
		if t.kind == tRParen {
			return nil, p.fail(t.pos, "expected %s, found a ) that closes nothing", what)
		}
		return nil, p.fail(t.pos, "expected %s, found %s", what, t.describe())
	}
	return &Filter{expr: expr, root: n}, nil
}

func (p *parser) or() (node, error) {
	a, err := p.and()
	if err != nil {
		return nil, err
	}
	for p.peek().kind == tOr {
		p.next()
		b, err := p.and()
		if err != nil {
			return nil, err
		}
		a = &orNode{a, b}
	}
	return a, nil
}

func (p *parser) and() (node, error) {
	a, err := p.unary()
	if err != nil {
		return nil, err
	}
	for p.peek().kind == tAnd {
		p.next()
		b, err := p.unary()
		if err != nil {
			return nil, err
		}
		a = &andNode{a, b}
	}
	return a, nil
}

func (p *parser) unary() (node, error) {
	t := p.peek()
	switch t.kind {
	case tNot, tLParen:
		if p.depth >= maxDepth {
			return nil, p.fail(t.pos, "nested deeper than %d parentheses and negations", maxDepth)
		}
		p.depth++
		defer func() { p.depth-- }()
		p.next()
		if t.kind == tNot {
			x, err := p.unary()
			if err != nil {
				return nil, err
			}
			return &notNode{x}, nil
		}
		x, err := p.or()
		if err != nil {
			return nil, err
		}
		if c := p.peek(); c.kind != tRParen {
			return nil, p.fail(c.pos, "expected ) to close the ( at column %d, found %s", t.pos+1, c.describe())
		}
		p.next()
		return x, nil
	case tWord:
		return p.field()
	}
	return nil, p.fail(t.pos, "expected a field, ( or !, found %s", t.describe())
}

// field parses a field test: a bare boolean field or a comparison.
func (p *parser) field() (node, error) {
	t := p.next()
	name := strings.ToLower(t.text)
	c := p.peek()
	if c.kind != tCmp {
		if pred, ok := boolFields[name]; ok {
			return pred, nil
		}
		if _, ok := numFields[name]; ok {
			return nil, p.fail(c.pos, "expected a comparison after %s (e.g. %s == 0x11), found %s", t.text, t.text, c.describe())
		}
		if _, ok := addrFields[name]; ok {
			return nil, p.fail(c.pos, "expected a comparison after %s (e.g. %s == 10.0.0.1), found %s", t.text, t.text, c.describe())
		}
		return nil, p.unknown(t)
	}
	if _, ok := boolFields[name]; ok {
		return nil, p.fail(c.pos, "%s is true or false of a packet: use it bare (%s, !%s), not with %s", t.text, t.text, t.text, c.text)
	}
	p.next()
	v := p.next()
	if v.kind != tWord && v.kind != tString {
		return nil, p.fail(v.pos, "expected a value after %s %s, found %s", t.text, c.text, v.describe())
	}
	if name == "opcode" || name == "bth.opcode" {
		if _, err := parseNum(v.text); err != nil || v.kind == tString {
			return p.opcodeName(t, c, v)
		}
	}
	if get, ok := numFields[name]; ok {
		n, err := parseNum(v.text)
		if err != nil || v.kind == tString {
			return nil, p.fail(v.pos, "expected a number (decimal or 0x hex) after %s %s, found %s", t.text, c.text, v.describe())
		}
		return &numNode{get: get, op: c.op, v: n}, nil
	}
	if which, ok := addrFields[name]; ok {
		return p.address(t, c, v, which)
	}
	return nil, p.unknown(t)
}

func (p *parser) unknown(t token) error {
	return p.fail(t.pos, "unknown field %q (fields: %s)", t.text, strings.Join(fieldNames, ", "))
}

// parseNum reads a decimal or 0x hexadecimal number.
func parseNum(s string) (uint64, error) {
	if len(s) > 2 && (s[:2] == "0x" || s[:2] == "0X") {
		return strconv.ParseUint(s[2:], 16, 64)
	}
	return strconv.ParseUint(s, 10, 64)
}

// opcodeName compiles opcode == NAME: a name as inspect prints it, with
// or without its transport ("RC SEND_ONLY", RC_SEND_ONLY, SEND_ONLY), or a
// family (read, write, send, atomic, ack, nak, rnr_nak, cnp, request,
// response).
func (p *parser) opcodeName(t, c, v token) (node, error) {
	if c.op != opEq && c.op != opNe {
		return nil, p.fail(c.pos, "opcode names compare with == or != only; %s needs a number (e.g. opcode %s 0x0c)", c.text, c.text)
	}
	want := strings.ToUpper(strings.ReplaceAll(strings.TrimSpace(v.text), " ", "_"))
	var pred predNode
	if f, ok := families[strings.ToLower(want)]; ok {
		pred = f
	} else {
		var set [256]bool
		found := false
		for i := range 256 {
			info := bth.Opcode(i).Info()
			if !info.Valid {
				continue
			}
			full := strings.ReplaceAll(info.Name, " ", "_")
			_, short, _ := strings.Cut(info.Name, " ")
			if want == full || want == short {
				set[i], found = true, true
			}
		}
		if !found {
			return nil, p.fail(v.pos, "unknown opcode %s: expected a name as inspect prints it (RDMA_WRITE_ONLY, \"RC SEND_ONLY\"), a number, or a family (read, write, send, atomic, ack, nak, rnr_nak, cnp, request, response)", v.describe())
		}
		pred = func(r *Record, _ Mark) bool { return located(r) && set[r.Opcode] }
	}
	if c.op == opNe {
		// A packet without an opcode has none to differ.
		return predNode(func(r *Record, m Mark) bool { return located(r) && !pred(r, m) }), nil
	}
	return pred, nil
}

// address compiles an address comparison: an address or a prefix
// (10.0.0.0/24), with == or != (!= is the negation of ==: for addr,
// neither address is it).
func (p *parser) address(t, c, v token, which int) (node, error) {
	if c.op != opEq && c.op != opNe {
		return nil, p.fail(c.pos, "addresses compare with == or != only, found %s", c.text)
	}
	var pfx netip.Prefix
	if strings.Contains(v.text, "/") {
		q, err := netip.ParsePrefix(v.text)
		if err != nil {
			return nil, p.fail(v.pos, "expected an IP address or prefix after %s %s, found %s", t.text, c.text, v.describe())
		}
		pfx = q.Masked()
	} else {
		a, err := netip.ParseAddr(v.text)
		if err != nil {
			return nil, p.fail(v.pos, "expected an IP address or prefix after %s %s, found %s", t.text, c.text, v.describe())
		}
		pfx = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
	}
	neg := c.op == opNe
	return predNode(func(r *Record, _ Mark) bool {
		if !r.Src.IsValid() {
			return false
		}
		hit := which&addrSrc != 0 && pfx.Contains(r.Src.Unmap()) || which&addrDst != 0 && pfx.Contains(r.Dst.Unmap())
		return hit != neg
	}), nil
}
