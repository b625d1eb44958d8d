package mad

import (
	"encoding/binary"
	"errors"
	"fmt"
)

var be = binary.BigEndian

// Sizes and the fixed header values of a CM MAD.
const (
	Len       = 256 // every MAD is 256 bytes (IBTA §13.4.2)
	HeaderLen = 24  // the common MAD header
	DataLen   = Len - HeaderLen

	BaseVersion    = 1    // IBTA §13.4.2: the only base version
	ClassCM        = 0x07 // management class of communication management
	CMClassVersion = 2    // CM class version since IBTA 1.2

	// GSIQPN is the general services QP that carries CM MADs.
	GSIQPN = 1
	// QP1QKey is the Q_Key of every datagram to or from QP1.
	QP1QKey = 0x80010000
	// RDMAUDPQKey is the Q_Key rdma_cm gives UD QPs of RDMA_PS_UDP.
	RDMAUDPQKey = 0x01234567
)

// Method is the MAD method byte (IBTA §13.4.5, table 146).
type Method uint8

// The methods; the CM sends every message with MethodSend and answers
// ClassPortInfo with Get/Set/GetResp.
const (
	MethodGet         Method = 0x01
	MethodSet         Method = 0x02
	MethodSend        Method = 0x03
	MethodTrap        Method = 0x05
	MethodReport      Method = 0x06
	MethodTrapRepress Method = 0x07
	MethodGetResp     Method = 0x81
	MethodReportResp  Method = 0x86
)

var methodNames = map[Method]string{MethodGet: "Get", MethodSet: "Set", MethodSend: "Send", MethodTrap: "Trap",
	MethodReport: "Report", MethodTrapRepress: "TrapRepress", MethodGetResp: "GetResp", MethodReportResp: "ReportResp"}

// String names the method ("Send"), or gives its number.
func (m Method) String() string {
	if s, ok := methodNames[m]; ok {
		return s
	}
	return fmt.Sprintf("Method(0x%02x)", uint8(m))
}

// AttrID is the attribute ID: for the CM class, which message the MAD is
// (IBTA §12.6, table 104).
type AttrID uint16

// The CM attribute IDs.
const (
	AttrClassPortInfo AttrID = 0x0001
	AttrREQ           AttrID = 0x0010
	AttrMRA           AttrID = 0x0011
	AttrREJ           AttrID = 0x0012
	AttrREP           AttrID = 0x0013
	AttrRTU           AttrID = 0x0014
	AttrDREQ          AttrID = 0x0015
	AttrDREP          AttrID = 0x0016
	AttrSIDRREQ       AttrID = 0x0017
	AttrSIDRREP       AttrID = 0x0018
	AttrLAP           AttrID = 0x0019
	AttrAPR           AttrID = 0x001A
)

var attrNames = map[AttrID]string{AttrClassPortInfo: "ClassPortInfo", AttrREQ: "REQ", AttrMRA: "MRA", AttrREJ: "REJ",
	AttrREP: "REP", AttrRTU: "RTU", AttrDREQ: "DREQ", AttrDREP: "DREP", AttrSIDRREQ: "SIDR_REQ", AttrSIDRREP: "SIDR_REP",
	AttrLAP: "LAP", AttrAPR: "APR"}

// String names the attribute ("REQ", "SIDR_REP"), or gives its number.
func (a AttrID) String() string {
	if s, ok := attrNames[a]; ok {
		return s
	}
	return fmt.Sprintf("Attr(0x%04x)", uint16(a))
}

// Known reports whether a is a CM attribute this package decodes.
func (a AttrID) Known() bool { _, ok := attrNames[a]; return ok }

// Message reports whether a is one of the CM messages (REQ through APR),
// which travel with MethodSend.
func (a AttrID) Message() bool { return a >= AttrREQ && a <= AttrAPR }

// MAD is a view of a 256-byte management datagram; its methods read and
// write the common header. A MAD must be Len bytes; Parse guarantees it.
type MAD []byte

// BaseVersion is byte 0.
func (m MAD) BaseVersion() uint8 { return m[0] }

// MgmtClass is byte 1, the management class.
func (m MAD) MgmtClass() uint8 { return m[1] }

// ClassVersion is byte 2.
func (m MAD) ClassVersion() uint8 { return m[2] }

// Method is byte 3 (the high bit marks a response).
func (m MAD) Method() Method { return Method(m[3]) }

// Status is bytes 4-5.
func (m MAD) Status() uint16 { return be.Uint16(m[4:]) }

// ClassSpecific is bytes 6-7.
func (m MAD) ClassSpecific() uint16 { return be.Uint16(m[6:]) }

// TID is the 64-bit transaction ID at byte 8.
func (m MAD) TID() uint64 { return be.Uint64(m[8:]) }

// AttrID is bytes 16-17 (bytes 18-19 are reserved).
func (m MAD) AttrID() AttrID { return AttrID(be.Uint16(m[16:])) }

// AttrMod is the attribute modifier at byte 20.
func (m MAD) AttrMod() uint32 { return be.Uint32(m[20:]) }

// Data is the 232 bytes after the header.
func (m MAD) Data() []byte { return m[HeaderLen:Len] }

// SetBaseVersion writes byte 0.
func (m MAD) SetBaseVersion(v uint8) { m[0] = v }

// SetMgmtClass writes byte 1.
func (m MAD) SetMgmtClass(v uint8) { m[1] = v }

// SetClassVersion writes byte 2.
func (m MAD) SetClassVersion(v uint8) { m[2] = v }

// SetMethod writes byte 3.
func (m MAD) SetMethod(v Method) { m[3] = byte(v) }

// SetStatus writes bytes 4-5.
func (m MAD) SetStatus(v uint16) { be.PutUint16(m[4:], v) }

// SetClassSpecific writes bytes 6-7.
func (m MAD) SetClassSpecific(v uint16) { be.PutUint16(m[6:], v) }

// SetTID writes the transaction ID.
func (m MAD) SetTID(v uint64) { be.PutUint64(m[8:], v) }

// SetAttrID writes the attribute ID.
func (m MAD) SetAttrID(v AttrID) { be.PutUint16(m[16:], uint16(v)) }

// SetAttrMod writes the attribute modifier.
func (m MAD) SetAttrMod(v uint32) { be.PutUint32(m[20:], v) }

// Init zeroes the first Len bytes of m and writes the header of a CM
// message: base version 1, class CM, class version 2, method Send, the
// attribute and the transaction ID. Setters of the message view fill in
// the rest. m must hold at least Len bytes; Init returns m[:Len].
func (m MAD) Init(attr AttrID, tid uint64) MAD {
	m = m[:Len]
	clear(m)
	m[0], m[1], m[2], m[3] = BaseVersion, ClassCM, CMClassVersion, byte(MethodSend)
	m.SetAttrID(attr)
	m.SetTID(tid)
	return m
}

// ErrKind classifies a MAD that Parse refuses.
type ErrKind uint8

const (
	ErrLength       ErrKind = iota + 1 // not exactly Len bytes
	ErrBaseVersion                     // base version other than 1
	ErrClass                           // management class other than CM
	ErrClassVersion                    // CM class version other than 2
	ErrMethod                          // a method the attribute does not travel with
	ErrAttribute                       // an attribute ID the CM does not define
	ErrField                           // a field out of its range (a length beyond its area, a reserved code)
)

var errKindNames = map[ErrKind]string{ErrLength: "bad length", ErrBaseVersion: "bad base version", ErrClass: "not a CM MAD",
	ErrClassVersion: "bad CM class version", ErrMethod: "bad method", ErrAttribute: "unknown attribute", ErrField: "field out of range"}

// String describes the kind.
func (k ErrKind) String() string { return errKindNames[k] }

// ParseError is the typed error of Parse. Match the kind with
// errors.Is(err, mad.ErrKindAttribute) and friends, or errors.As.
type ParseError struct {
	Kind   ErrKind
	Attr   AttrID // zero when the header was not read
	Detail string
}

// Error describes the refused MAD.
func (e *ParseError) Error() string {
	if e.Attr != 0 {
		return fmt.Sprintf("mad: %s (%s): %s", e.Kind, e.Attr, e.Detail)
	}
	return fmt.Sprintf("mad: %s: %s", e.Kind, e.Detail)
}

// Is makes errors.Is(err, &ParseError{Kind: k}) match on the kind alone.
func (e *ParseError) Is(target error) bool {
	var t *ParseError
	return errors.As(target, &t) && t.Kind == e.Kind
}

// Sentinels for errors.Is.
var (
	ErrKindLength       = &ParseError{Kind: ErrLength}
	ErrKindBaseVersion  = &ParseError{Kind: ErrBaseVersion}
	ErrKindClass        = &ParseError{Kind: ErrClass}
	ErrKindClassVersion = &ParseError{Kind: ErrClassVersion}
	ErrKindMethod       = &ParseError{Kind: ErrMethod}
	ErrKindAttribute    = &ParseError{Kind: ErrAttribute}
	ErrKindField        = &ParseError{Kind: ErrField}
)

// ErrPrivateDataLen is returned by setters given more bytes than the
// message's area holds.
var ErrPrivateDataLen = errors.New("mad: data longer than the message's area")

// Parse checks that b is a CM MAD and returns the view of it. It refuses
// (with a *ParseError) a length other than Len, a base version other than
// 1, another management class, a class version other than 2, a method the
// attribute does not travel with, an unknown attribute, and lengths or
// codes the message defines as out of range (REJ and MRA message codes,
// REJ ARI, SIDR_REP and APR additional information lengths). Except for a
// bad length, the view is returned with the error so tools can show the
// header. Parse does not allocate unless it fails.
func Parse(b []byte) (MAD, error) {
	if len(b) != Len {
		return nil, &ParseError{Kind: ErrLength, Detail: fmt.Sprintf("%d bytes, a MAD is %d", len(b), Len)}
	}
	m := MAD(b)
	a := m.AttrID()
	switch {
	case m.BaseVersion() != BaseVersion:
		return m, &ParseError{Kind: ErrBaseVersion, Attr: a, Detail: fmt.Sprintf("base version %d", m.BaseVersion())}
	case m.MgmtClass() != ClassCM:
		return m, &ParseError{Kind: ErrClass, Attr: a, Detail: fmt.Sprintf("management class 0x%02x", m.MgmtClass())}
	case m.ClassVersion() != CMClassVersion:
		return m, &ParseError{Kind: ErrClassVersion, Attr: a, Detail: fmt.Sprintf("class version %d", m.ClassVersion())}
	case !a.Known():
		return m, &ParseError{Kind: ErrAttribute, Attr: a, Detail: fmt.Sprintf("attribute 0x%04x", uint16(a))}
	}
	meth := m.Method()
	if a.Message() {
		if meth != MethodSend {
			return m, &ParseError{Kind: ErrMethod, Attr: a, Detail: fmt.Sprintf("%s travels with Send, not %s", a, meth)}
		}
	} else if meth != MethodGet && meth != MethodSet && meth != MethodGetResp {
		return m, &ParseError{Kind: ErrMethod, Attr: a, Detail: fmt.Sprintf("%s with method %s", a, meth)}
	}
	if err := m.checkFields(a); err != nil {
		return m, err
	}
	return m, nil
}

func (m MAD) checkFields(a AttrID) error {
	bad := func(format string, args ...any) error {
		return &ParseError{Kind: ErrField, Attr: a, Detail: fmt.Sprintf(format, args...)}
	}
	switch a {
	case AttrREJ:
		r := REJ{m}
		if r.MsgRejected() > RejectedOther {
			return bad("message rejected code %d is reserved", r.MsgRejected())
		}
		if r.ARILength() > ARILen {
			return bad("ARI length %d, at most %d", r.ARILength(), ARILen)
		}
	case AttrMRA:
		if r := (MRA{m}); r.MsgMRAed() > MRAedLAP {
			return bad("message MRAed code %d is reserved", r.MsgMRAed())
		}
	case AttrSIDRREP:
		if r := (SIDRREP{m}); r.InfoLength() > ARILen {
			return bad("additional information length %d, at most %d", r.InfoLength(), ARILen)
		}
	case AttrAPR:
		if r := (APR{m}); r.InfoLength() > ARILen {
			return bad("additional information length %d, at most %d", r.InfoLength(), ARILen)
		}
	}
	return nil
}

// Helpers on data offsets (the specification's table offsets).

func (m MAD) d8(o int) uint8               { return m[HeaderLen+o] }
func (m MAD) d16(o int) uint16             { return be.Uint16(m[HeaderLen+o:]) }
func (m MAD) d32(o int) uint32             { return be.Uint32(m[HeaderLen+o:]) }
func (m MAD) d64(o int) uint64             { return be.Uint64(m[HeaderLen+o:]) }
func (m MAD) d24(o int) uint32             { return be.Uint32(m[HeaderLen+o:]) >> 8 }
func (m MAD) setD8(o int, v uint8)         { m[HeaderLen+o] = v }
func (m MAD) setD16(o int, v uint16)       { be.PutUint16(m[HeaderLen+o:], v) }
func (m MAD) setD32(o int, v uint32)       { be.PutUint32(m[HeaderLen+o:], v) }
func (m MAD) setD64(o int, v uint64)       { be.PutUint64(m[HeaderLen+o:], v) }
func (m MAD) dBytes(o, n int) []byte       { return m[HeaderLen+o : HeaderLen+o+n : HeaderLen+o+n] }
func (m MAD) bits(o int, mask uint8) uint8 { return bitsGet(m[HeaderLen+o], mask) }
func (m MAD) setBits(o int, mask, v uint8) { m[HeaderLen+o] = bitsSet(m[HeaderLen+o], mask, v) }
func (m MAD) flag(o int, mask uint8) bool  { return m[HeaderLen+o]&mask != 0 }
func (m MAD) setFlag(o int, mask uint8, v bool) {
	if v {
		m[HeaderLen+o] |= mask
	} else {
		m[HeaderLen+o] &^= mask
	}
}

// setD24 writes the 24 high-order bits of the word at o, keeping its low byte.
func (m MAD) setD24(o int, v uint32) {
	b := m[HeaderLen+o:]
	b[0], b[1], b[2] = byte(v>>16), byte(v>>8), byte(v)
}

// bitsGet extracts the field under mask, shifted down to bit 0.
func bitsGet(b, mask uint8) uint8 {
	shift := 0
	for mask&1 == 0 && shift < 8 {
		mask >>= 1
		shift++
	}
	return b >> shift & mask
}

// bitsSet writes v into the field under mask, dropping bits that do not fit.
func bitsSet(b, mask, v uint8) uint8 {
	shift := 0
	for m := mask; m&1 == 0 && shift < 8; m >>= 1 {
		shift++
	}
	return b&^mask | v<<shift&mask
}

// setData copies p into the area dst and zeroes the rest of it.
func setData(dst, p []byte) error {
	if len(p) > len(dst) {
		return ErrPrivateDataLen
	}
	n := copy(dst, p)
	clear(dst[n:])
	return nil
}
