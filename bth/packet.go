package bth

import (
	"errors"
	"fmt"
)

// Packet is a parsed RoCE transport packet: views into the caller's bytes,
// never copies. Views of headers the opcode does not carry are nil.
type Packet struct {
	BTH          BTH
	Info         *OpInfo
	RDETH        RDETH
	DETH         DETH
	XRCETH       XRCETH
	FETH         FETH
	RETH         RETH
	AtomicETH    AtomicETH
	AETH         AETH
	AtomicAckETH AtomicAckETH
	ImmDt        ImmDt
	IETH         IETH
	Payload      []byte // payload without pad
	Pad          []byte // 0-3 pad bytes (PadCnt)
	ICRC         []byte // the 4 ICRC bytes, as on the wire (little-endian CRC)
	Raw          []byte // BTH through ICRC
}

// ErrKind classifies malformed packets.
type ErrKind uint8

const (
	ErrShort          ErrKind = iota + 1 // fewer bytes than the BTH + headers + ICRC
	ErrReservedOpcode                    // a reserved or vendor-specific opcode
	ErrMissingHeader                     // the packet ends inside an extended header the opcode requires
	ErrPadCnt                            // PadCnt larger than the bytes after the headers
	ErrPayloadLen                        // payload present where the opcode allows none, or wrong fixed size
)

var errKindNames = map[ErrKind]string{ErrShort: "short packet", ErrReservedOpcode: "reserved opcode",
	ErrMissingHeader: "missing extended header", ErrPadCnt: "PadCnt exceeds payload", ErrPayloadLen: "bad payload length"}

// String describes the kind.
func (k ErrKind) String() string { return errKindNames[k] }

// ParseError is the typed error returned for malformed input. Match the
// kind with errors.Is(err, bth.ErrKindShort) and friends, or errors.As.
type ParseError struct {
	Kind   ErrKind
	Opcode Opcode
	Detail string
}

// Error describes the malformed packet with its opcode.
func (e *ParseError) Error() string {
	return fmt.Sprintf("bth: %s (opcode 0x%02x %s): %s", e.Kind, uint8(e.Opcode), e.Opcode, e.Detail)
}

// Is makes errors.Is(err, &ParseError{Kind: k}) match on the kind alone.
func (e *ParseError) Is(target error) bool {
	var t *ParseError
	return errors.As(target, &t) && t.Kind == e.Kind
}

// Sentinels for errors.Is.
var (
	ErrKindShort          = &ParseError{Kind: ErrShort}
	ErrKindReservedOpcode = &ParseError{Kind: ErrReservedOpcode}
	ErrKindMissingHeader  = &ParseError{Kind: ErrMissingHeader}
	ErrKindPadCnt         = &ParseError{Kind: ErrPadCnt}
	ErrKindPayloadLen     = &ParseError{Kind: ErrPayloadLen}
)

// Parse decodes b, a RoCE packet from the BTH through the ICRC (the UDP
// payload for RoCEv2), into p without allocating. Malformed input returns
// a *ParseError; reserved and vendor opcodes return ErrReservedOpcode
// with p.BTH, p.Info and p.Raw still set so tools can show them.
func Parse(p *Packet, b []byte) error {
	*p = Packet{}
	if len(b) < BTHLen+ICRCLen {
		var op Opcode
		if len(b) > 0 {
			op = Opcode(b[0])
		}
		return &ParseError{Kind: ErrShort, Opcode: op, Detail: fmt.Sprintf("%d bytes, need at least %d", len(b), BTHLen+ICRCLen)}
	}
	p.Raw = b
	p.BTH = BTH(b[:BTHLen])
	op := p.BTH.Opcode()
	info := op.Info()
	p.Info = info
	p.ICRC = b[len(b)-ICRCLen:]
	if !info.Valid {
		p.Payload = b[BTHLen : len(b)-ICRCLen]
		return &ParseError{Kind: ErrReservedOpcode, Opcode: op, Detail: info.Name}
	}
	body := b[BTHLen : len(b)-ICRCLen]
	if len(body) < info.HdrLen-BTHLen {
		return &ParseError{Kind: ErrMissingHeader, Opcode: op,
			Detail: fmt.Sprintf("%s needs %d header bytes after the BTH, packet has %d", info.Headers, info.HdrLen-BTHLen, len(body))}
	}
	off := p.setHeaders(body)
	rest := body[off:]
	pad := p.BTH.PadCnt()
	if pad > len(rest) {
		return &ParseError{Kind: ErrPadCnt, Opcode: op, Detail: fmt.Sprintf("PadCnt %d but only %d bytes after the headers", pad, len(rest))}
	}
	p.Payload = rest[:len(rest)-pad]
	p.Pad = rest[len(rest)-pad:]
	switch info.Payload {
	case PayloadNone:
		if len(rest) != 0 {
			return &ParseError{Kind: ErrPayloadLen, Opcode: op, Detail: fmt.Sprintf("%d bytes after the headers, opcode carries no payload", len(rest))}
		}
	case PayloadFixed:
		// A CNP's 16 bytes are reserved; real senders are consistent, but
		// accept a CNP of any length rather than drop congestion signals.
		if info.Op != OpCNP && len(p.Payload) != info.FixedLen {
			return &ParseError{Kind: ErrPayloadLen, Opcode: op, Detail: fmt.Sprintf("payload %d bytes, %s carries exactly %d", len(p.Payload), info.Name, info.FixedLen)}
		}
	}
	return nil
}

// setHeaders points the extended-header views at body, which starts
// right after the BTH and holds at least the opcode's headers, and returns
// their total length.
func (p *Packet) setHeaders(body []byte) int {
	off := 0
	hdrs := p.Info.Headers
	for _, e := range headerOrder {
		if hdrs&e.h == 0 {
			continue
		}
		h := body[off : off+e.size : off+e.size]
		off += e.size
		switch e.h {
		case HdrRDETH:
			p.RDETH = RDETH(h)
		case HdrDETH:
			p.DETH = DETH(h)
		case HdrXRCETH:
			p.XRCETH = XRCETH(h)
		case HdrFETH:
			p.FETH = FETH(h)
		case HdrRETH:
			p.RETH = RETH(h)
		case HdrAtomicETH:
			p.AtomicETH = AtomicETH(h)
		case HdrAETH:
			p.AETH = AETH(h)
		case HdrAtomicAckETH:
			p.AtomicAckETH = AtomicAckETH(h)
		case HdrImmDt:
			p.ImmDt = ImmDt(h)
		case HdrIETH:
			p.IETH = IETH(h)
		}
	}
	return off
}

// ParseHeaders decodes the BTH and the extended headers of a packet whose
// end may be missing, such as a capture cut by its snap length: b starts
// at the BTH and must hold at least the opcode's headers. Payload is set to
// whatever follows the headers (pad and ICRC not separated); Pad and ICRC
// stay nil. Errors are as for Parse (ErrShort, ErrReservedOpcode,
// ErrMissingHeader).
func ParseHeaders(p *Packet, b []byte) error {
	*p = Packet{}
	if len(b) < BTHLen {
		var op Opcode
		if len(b) > 0 {
			op = Opcode(b[0])
		}
		return &ParseError{Kind: ErrShort, Opcode: op, Detail: fmt.Sprintf("%d bytes, need the %d-byte BTH", len(b), BTHLen)}
	}
	p.Raw = b
	p.BTH = BTH(b[:BTHLen])
	op := p.BTH.Opcode()
	p.Info = op.Info()
	if !p.Info.Valid {
		p.Payload = b[BTHLen:]
		return &ParseError{Kind: ErrReservedOpcode, Opcode: op, Detail: p.Info.Name}
	}
	if len(b) < p.Info.HdrLen {
		return &ParseError{Kind: ErrMissingHeader, Opcode: op,
			Detail: fmt.Sprintf("%s needs %d header bytes after the BTH, have %d", p.Info.Headers, p.Info.HdrLen-BTHLen, len(b)-BTHLen)}
	}
	off := p.setHeaders(b[BTHLen:])
	p.Payload = b[BTHLen+off:]
	return nil
}

// PadFor returns the PadCnt for a payload of n bytes (pad to a 4-byte multiple).
func PadFor(n int) int { return -n & 3 }

// Fields describes a packet to build: the BTH plus the values of every
// extended header the opcode carries (others are ignored).
type Fields struct {
	BTH         BTHFields // PadCnt is computed from the payload by Build
	VA          uint64    // RETH or AtomicETH
	RKey        uint32    // RETH or AtomicETH
	DMALen      uint32    // RETH
	Syndrome    Syndrome  // AETH
	MSN         uint32    // AETH
	SwapAdd     uint64    // AtomicETH
	Compare     uint64    // AtomicETH
	Orig        uint64    // AtomicAckETH
	Imm         uint32    // ImmDt
	InvRKey     uint32    // IETH
	QKey        uint32    // DETH
	SrcQP       uint32    // DETH
	EEContext   uint32    // RDETH
	XRCSRQ      uint32    // XRCETH
	Placement   uint8     // FETH
	Selectivity uint8     // FETH
}

// Len is the size Build needs for the opcode and a payload of n bytes.
func Len(op Opcode, n int) int { return op.Info().HdrLen + n + PadFor(n) + ICRCLen }

// Build writes the headers of f, then payload and pad into dst and returns
// the packet length including a zeroed 4-byte ICRC slot for the link to
// fill. dst must have room for Len(f.BTH.Opcode, len(payload)).
func Build(dst []byte, f *Fields, payload []byte) (int, error) {
	n := WriteHeaders(dst, f, len(payload))
	if n < 0 {
		return 0, fmt.Errorf("bth: build %s with %d payload bytes: need %d bytes, have %d",
			f.BTH.Opcode, len(payload), Len(f.BTH.Opcode, len(payload)), len(dst))
	}
	copy(dst[f.BTH.Opcode.Info().HdrLen:], payload)
	return n, nil
}

// WriteHeaders writes the headers for a payload of n bytes that the caller
// copies (or has already gathered) at offset Info().HdrLen, zeroes the pad
// and ICRC slot, and returns the total packet length, or -1 if dst is short.
// It lets a sender gather payload straight from memory without a staging copy.
func WriteHeaders(dst []byte, f *Fields, n int) int {
	info := f.BTH.Opcode.Info()
	total := info.HdrLen + n + PadFor(n) + ICRCLen
	if len(dst) < total {
		return -1
	}
	bf := f.BTH
	bf.PadCnt = PadFor(n)
	BTH(dst).Encode(&bf)
	off := BTHLen
	for _, e := range headerOrder {
		if info.Headers&e.h == 0 {
			continue
		}
		h := dst[off : off+e.size]
		off += e.size
		switch e.h {
		case HdrRDETH:
			RDETH(h).Encode(f.EEContext)
		case HdrDETH:
			DETH(h).Encode(f.QKey, f.SrcQP)
		case HdrXRCETH:
			XRCETH(h).Encode(f.XRCSRQ)
		case HdrFETH:
			FETH(h).Encode(f.Placement, f.Selectivity)
		case HdrRETH:
			RETH(h).Encode(f.VA, f.RKey, f.DMALen)
		case HdrAtomicETH:
			AtomicETH(h).Encode(f.VA, f.RKey, f.SwapAdd, f.Compare)
		case HdrAETH:
			AETH(h).Encode(f.Syndrome, f.MSN)
		case HdrAtomicAckETH:
			AtomicAckETH(h).Encode(f.Orig)
		case HdrImmDt:
			ImmDt(h).Encode(f.Imm)
		case HdrIETH:
			IETH(h).Encode(f.InvRKey)
		}
	}
	clear(dst[off+n : total])
	return total
}

// PSN arithmetic: PSNs are 24-bit and wrap (IBTA §9.7.1).

// PSNMask keeps the low 24 bits.
const PSNMask = 0xffffff

// PSNAdd returns psn+n modulo 2^24.
func PSNAdd(psn uint32, n int) uint32 { return uint32(int(psn)+n) & PSNMask }

// PSNDiff returns a-b as a signed 24-bit distance in [-2^23, 2^23).
func PSNDiff(a, b uint32) int { return int(int32((a-b)<<8) >> 8) }

// Fields decodes the BTH and every extended header the packet carries into
// a Fields, the inverse of Build (reserved bits are not kept).
func (p *Packet) Fields() Fields {
	var f Fields
	if p.BTH == nil {
		return f
	}
	f.BTH = p.BTH.Fields()
	if p.RDETH != nil {
		f.EEContext = p.RDETH.EEContext()
	}
	if p.DETH != nil {
		f.QKey, f.SrcQP = p.DETH.QKey(), p.DETH.SrcQP()
	}
	if p.XRCETH != nil {
		f.XRCSRQ = p.XRCETH.XRCSRQ()
	}
	if p.FETH != nil {
		f.Placement, f.Selectivity = p.FETH.PlacementType(), p.FETH.Selectivity()
	}
	if p.RETH != nil {
		f.VA, f.RKey, f.DMALen = p.RETH.VA(), p.RETH.RKey(), p.RETH.DMALen()
	}
	if p.AtomicETH != nil {
		f.VA, f.RKey = p.AtomicETH.VA(), p.AtomicETH.RKey()
		f.SwapAdd, f.Compare = p.AtomicETH.SwapAdd(), p.AtomicETH.Compare()
	}
	if p.AETH != nil {
		f.Syndrome, f.MSN = p.AETH.Syndrome(), p.AETH.MSN()
	}
	if p.AtomicAckETH != nil {
		f.Orig = p.AtomicAckETH.Orig()
	}
	if p.ImmDt != nil {
		f.Imm = p.ImmDt.Imm()
	}
	if p.IETH != nil {
		f.InvRKey = p.IETH.RKey()
	}
	return f
}
