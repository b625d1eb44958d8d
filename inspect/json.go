package inspect

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strconv"
	"time"
	"unicode/utf8"
)

// AppendJSON appends the JSON encoding of r to dst: the same bytes as
// json.Marshal(r), written by hand because reflection costs more than the
// decoding itself. A CM MAD, rare, is still encoded by package json.
func AppendJSON(dst []byte, r *Record) ([]byte, error) {
	start := len(dst)
	b := dst
	b = append(b, '{')
	if r.File != "" {
		b = append(b, `"file":`...)
		b = appendJSONString(b, r.File)
		b = append(b, ',')
	}
	b = append(b, `"frame":`...)
	b = strconv.AppendInt(b, int64(r.Frame), 10)
	b = append(b, `,"time":"`...)
	dst = b
	if b = appendTimeUTC(b, r.Time); b == nil {
		ts := len(dst)
		b = r.Time.AppendFormat(dst, time.RFC3339Nano)
		if !strictRFC3339(b[ts:]) {
			return dst[:start], marshalErr(r)
		}
	}
	b = append(b, `","cap_len":`...)
	b = strconv.AppendInt(b, int64(r.CapLen), 10)
	b = append(b, `,"wire_len":`...)
	b = strconv.AppendInt(b, int64(r.WireLen), 10)
	if r.Interface != 0 {
		b = append(b, `,"interface":`...)
		b = strconv.AppendInt(b, int64(r.Interface), 10)
	}
	b = append(b, `,"transport":`...)
	b = appendJSONString(b, r.Transport)
	if len(r.VLAN) > 0 {
		b = append(b, `,"vlan":[`...)
		for i, v := range r.VLAN {
			if i > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendUint(b, uint64(v), 10)
		}
		b = append(b, ']')
	}
	b = append(b, `,"src":`...)
	b = appendAddr(b, r.Src)
	b = append(b, `,"dst":`...)
	b = appendAddr(b, r.Dst)
	b = append(b, `,"src_port":`...)
	b = strconv.AppendUint(b, uint64(r.SrcPort), 10)
	b = append(b, `,"dst_port":`...)
	b = strconv.AppendUint(b, uint64(r.DstPort), 10)
	if r.ECN != 0 {
		b = append(b, `,"ecn":`...)
		b = strconv.AppendUint(b, uint64(r.ECN), 10)
	}
	b = append(b, `,"opcode":`...)
	b = strconv.AppendUint(b, uint64(r.Opcode), 10)
	b = append(b, `,"opcode_name":`...)
	b = appendJSONString(b, r.OpcodeName)
	b = append(b, `,"se":`...)
	b = strconv.AppendBool(b, r.SE)
	b = append(b, `,"mig_req":`...)
	b = strconv.AppendBool(b, r.MigReq)
	b = append(b, `,"pad_cnt":`...)
	b = strconv.AppendInt(b, int64(r.PadCnt), 10)
	b = append(b, `,"tver":`...)
	b = strconv.AppendUint(b, uint64(r.TVer), 10)
	b = append(b, `,"pkey":`...)
	b = strconv.AppendUint(b, uint64(r.PKey), 10)
	b = append(b, `,"fecn":`...)
	b = strconv.AppendBool(b, r.FECN)
	b = append(b, `,"becn":`...)
	b = strconv.AppendBool(b, r.BECN)
	b = append(b, `,"dest_qp":`...)
	b = strconv.AppendUint(b, uint64(r.DestQP), 10)
	b = append(b, `,"ack_req":`...)
	b = strconv.AppendBool(b, r.AckReq)
	b = append(b, `,"psn":`...)
	b = strconv.AppendUint(b, uint64(r.PSN), 10)
	if h := r.RDETH; h != nil {
		b = append(b, `,"rdeth":{"ee_context":`...)
		b = strconv.AppendUint(b, uint64(h.EEContext), 10)
		b = append(b, '}')
	}
	if h := r.DETH; h != nil {
		b = append(b, `,"deth":{"qkey":`...)
		b = strconv.AppendUint(b, uint64(h.QKey), 10)
		b = append(b, `,"src_qp":`...)
		b = strconv.AppendUint(b, uint64(h.SrcQP), 10)
		b = append(b, '}')
	}
	if h := r.XRCETH; h != nil {
		b = append(b, `,"xrceth":{"xrc_srq":`...)
		b = strconv.AppendUint(b, uint64(h.XRCSRQ), 10)
		b = append(b, '}')
	}
	if h := r.FETH; h != nil {
		b = append(b, `,"feth":{"placement_type":`...)
		b = strconv.AppendUint(b, uint64(h.Placement), 10)
		b = append(b, `,"selectivity":`...)
		b = strconv.AppendUint(b, uint64(h.Selectivity), 10)
		b = append(b, '}')
	}
	if h := r.RETH; h != nil {
		b = append(b, `,"reth":{"va":`...)
		b = strconv.AppendUint(b, h.VA, 10)
		b = append(b, `,"rkey":`...)
		b = strconv.AppendUint(b, uint64(h.RKey), 10)
		b = append(b, `,"dma_len":`...)
		b = strconv.AppendUint(b, uint64(h.DMALen), 10)
		b = append(b, '}')
	}
	if h := r.AtomicETH; h != nil {
		b = append(b, `,"atomic_eth":{"va":`...)
		b = strconv.AppendUint(b, h.VA, 10)
		b = append(b, `,"rkey":`...)
		b = strconv.AppendUint(b, uint64(h.RKey), 10)
		b = append(b, `,"swap_add":`...)
		b = strconv.AppendUint(b, h.SwapAdd, 10)
		b = append(b, `,"compare":`...)
		b = strconv.AppendUint(b, h.Compare, 10)
		b = append(b, '}')
	}
	if h := r.AETH; h != nil {
		b = appendAETH(b, h)
	}
	if h := r.AtomicAck; h != nil {
		b = append(b, `,"atomic_ack_eth":{"orig":`...)
		b = strconv.AppendUint(b, h.Orig, 10)
		b = append(b, '}')
	}
	if r.Imm != nil {
		b = append(b, `,"imm":`...)
		b = strconv.AppendUint(b, uint64(*r.Imm), 10)
	}
	if h := r.IETH; h != nil {
		b = append(b, `,"ieth":{"rkey":`...)
		b = strconv.AppendUint(b, uint64(h.RKey), 10)
		b = append(b, '}')
	}
	if r.CM != nil {
		cm, err := json.Marshal(r.CM)
		if err != nil {
			return dst[:start], marshalErr(r)
		}
		b = append(b, `,"cm":`...)
		b = append(b, cm...)
	}
	b = append(b, `,"payload_len":`...)
	b = strconv.AppendInt(b, int64(r.PayloadLen), 10)
	b = append(b, `,"icrc":`...)
	b = appendJSONString(b, r.ICRC)
	if r.ICRCComputed != 0 {
		b = append(b, `,"icrc_computed":`...)
		b = strconv.AppendUint(b, uint64(r.ICRCComputed), 10)
	}
	if r.ICRCWire != 0 {
		b = append(b, `,"icrc_wire":`...)
		b = strconv.AppendUint(b, uint64(r.ICRCWire), 10)
	}
	if r.Malformed != "" {
		b = append(b, `,"malformed":`...)
		b = appendJSONString(b, r.Malformed)
	}
	return append(b, '}'), nil
}

func appendAETH(b []byte, h *AETH) []byte {
	b = append(b, `,"aeth":{"syndrome":`...)
	b = strconv.AppendUint(b, uint64(h.Syndrome), 10)
	b = append(b, `,"kind":`...)
	b = appendJSONString(b, h.Kind)
	if h.Credits != nil {
		b = append(b, `,"credits":`...)
		b = strconv.AppendInt(b, int64(*h.Credits), 10)
	}
	if h.RNRTimer != nil {
		b = append(b, `,"rnr_timer":`...)
		b = strconv.AppendUint(b, uint64(*h.RNRTimer), 10)
	}
	if h.RNRTimerUS != nil {
		b = append(b, `,"rnr_timer_us":`...)
		b = strconv.AppendInt(b, *h.RNRTimerUS, 10)
	}
	if h.NAKCode != nil {
		b = append(b, `,"nak_code":`...)
		b = strconv.AppendUint(b, uint64(*h.NAKCode), 10)
	}
	if h.NAKName != "" {
		b = append(b, `,"nak":`...)
		b = appendJSONString(b, h.NAKName)
	}
	b = append(b, `,"msn":`...)
	b = strconv.AppendUint(b, uint64(h.MSN), 10)
	b = append(b, `,"text":`...)
	b = appendJSONString(b, h.Text)
	return append(b, '}')
}

// marshalErr is the error json.Marshal gives for r, for the values the
// hand-written encoder does not take (a year beyond 9999).
func marshalErr(r *Record) error {
	_, err := json.Marshal(r)
	if err == nil {
		err = fmt.Errorf("json: cannot encode %v", r.Time)
	}
	return fmt.Errorf("encode frame %d: %w", r.Frame, err)
}

// appendTimeUTC appends a UTC time of the years 0-9999 as
// AppendFormat(time.RFC3339Nano) does, computing the civil date directly
// (days to year, month, day as in proleptic Gregorian arithmetic); it
// returns nil for any other time, left to AppendFormat.
func appendTimeUTC(b []byte, t time.Time) []byte {
	if t.Location() != time.UTC {
		return nil
	}
	sec := t.Unix()
	days := sec / 86400
	if sec%86400 < 0 {
		days--
	}
	rem := sec - days*86400
	// Days since 0000-03-01, in 400-year eras of 146097 days.
	z := days + 719468
	era := z / 146097
	if z%146097 < 0 {
		era--
	}
	doe := z - era*146097
	yoe := (doe - doe/1460 + doe/36524 - doe/146096) / 365
	doy := doe - (365*yoe + yoe/4 - yoe/100)
	mp := (5*doy + 2) / 153
	day := doy - (153*mp+2)/5 + 1
	month := mp + 3
	if month > 12 {
		month -= 12
	}
	year := yoe + era*400
	if month <= 2 {
		year++
	}
	if year < 0 || year > 9999 {
		return nil
	}
	b = append(b, byte('0'+year/1000), byte('0'+year/100%10), byte('0'+year/10%10), byte('0'+year%10), '-',
		byte('0'+month/10), byte('0'+month%10), '-', byte('0'+day/10), byte('0'+day%10), 'T',
		byte('0'+rem/36000), byte('0'+rem/3600%10), ':', byte('0'+rem/600%6), byte('0'+rem/60%10), ':',
		byte('0'+rem%60/10), byte('0'+rem%10))
	if ns := t.Nanosecond(); ns != 0 {
		var frac [10]byte
		frac[0] = '.'
		for i := 9; i > 0; i-- {
			frac[i] = byte('0' + ns%10)
			ns /= 10
		}
		n := 10
		for frac[n-1] == '0' {
			n--
		}
		b = append(b, frac[:n]...)
	}
	return append(b, 'Z')
}

// strictRFC3339 reports whether an RFC 3339 time as AppendFormat wrote it
// is one time.Time.MarshalJSON accepts: a four-digit year and a zone
// offset below 24 hours.
func strictRFC3339(b []byte) bool {
	if len(b) < len("2006-01-02T15:04:05Z") || b[4] != '-' {
		return false
	}
	if b[len(b)-1] == 'Z' {
		return true
	}
	z := b[len(b)-len("Z07:00"):]
	if '0' <= z[0] && z[0] <= '9' {
		return false
	}
	return (z[1]-'0')*10+(z[2]-'0') < 24
}

// appendAddr appends an address as netip.Addr.MarshalText renders it, quoted.
func appendAddr(b []byte, a netip.Addr) []byte {
	b = append(b, '"')
	if a.Zone() != "" {
		// A zone is text from elsewhere: escape it as package json would.
		return appendJSONString(b[:len(b)-1], a.String())
	}
	b = a.AppendTo(b)
	return append(b, '"')
}

// jsonPlain marks the ASCII bytes package json copies into a string
// unchanged (with its default HTML escaping of <, > and &).
var jsonPlain = func() (t [utf8.RuneSelf]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\' && c != '<' && c != '>' && c != '&'
	}
	return
}()

const hexDigits = "0123456789abcdef"

// appendJSONString appends s quoted and escaped exactly as json.Marshal
// does: control characters, quote, backslash, <, > and &, invalid UTF-8
// as U+FFFD, and U+2028 and U+2029.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if jsonPlain[c] {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '\\', '"':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
