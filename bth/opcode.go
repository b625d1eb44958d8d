package bth

import "fmt"

// Opcode is the 8-bit BTH opcode: the top three bits select the transport
// (IBTA vol. 1 §9.2.1, table 41 "OpCode field"), the low five the operation.
type Opcode uint8

// Transport is the transport class encoded in the opcode's top three bits.
type Transport uint8

const (
	TransportRC      Transport = 0 // 000: Reliable Connection
	TransportUC      Transport = 1 // 001: Unreliable Connection
	TransportRD      Transport = 2 // 010: Reliable Datagram
	TransportUD      Transport = 3 // 011: Unreliable Datagram
	TransportCNP     Transport = 4 // 100: CNP (RoCEv2 annex A17, opcode 0x81)
	TransportXRC     Transport = 5 // 101: eXtended Reliable Connection
	TransportVendor6 Transport = 6 // 110: manufacturer specific
	TransportVendor7 Transport = 7 // 111: manufacturer specific
)

var transportNames = [8]string{"RC", "UC", "RD", "UD", "CNP", "XRC", "VENDOR", "VENDOR"}

// String names the transport ("RC", "UC", "RD", "UD", "CNP", "XRC", "VENDOR").
func (t Transport) String() string { return transportNames[t&7] }

// Operation is what an opcode does, independent of transport and position.
type Operation uint8

const (
	OpReserved Operation = iota
	OpSend
	OpWrite
	OpReadRequest
	OpReadResponse
	OpAck
	OpAtomicAck
	OpCompareSwap
	OpFetchAdd
	OpResync
	OpFlush
	OpAtomicWrite
	OpCNP
	OpVendor
)

var operationNames = [...]string{"RESERVED", "SEND", "RDMA_WRITE", "RDMA_READ_REQUEST", "RDMA_READ_RESPONSE",
	"ACKNOWLEDGE", "ATOMIC_ACKNOWLEDGE", "COMPARE_SWAP", "FETCH_ADD", "RESYNC", "FLUSH", "ATOMIC_WRITE", "CNP", "VENDOR"}

// String names the operation as in the opcode names ("RDMA_WRITE").
func (o Operation) String() string {
	if int(o) < len(operationNames) {
		return operationNames[o]
	}
	return fmt.Sprintf("Operation(%d)", uint8(o))
}

// Position is where a packet sits in a multi-packet message.
type Position uint8

const (
	PosNone   Position = iota // not part of a segmented message (ACK, CNP, reserved)
	PosFirst                  // FIRST: more packets follow
	PosMiddle                 // MIDDLE
	PosLast                   // LAST: ends the message
	PosOnly                   // ONLY: the whole message in one packet
)

var positionNames = [...]string{"", "FIRST", "MIDDLE", "LAST", "ONLY"}

// String names the position ("FIRST", ...; empty for PosNone).
func (p Position) String() string {
	if int(p) < len(positionNames) {
		return positionNames[p]
	}
	return fmt.Sprintf("Position(%d)", uint8(p))
}

// Header is a set of extended transport headers, as a bit mask.
type Header uint16

const (
	HdrRDETH        Header = 1 << iota // Reliable Datagram ETH, 4 bytes
	HdrDETH                            // Datagram ETH, 8 bytes
	HdrXRCETH                          // XRC ETH, 4 bytes
	HdrFETH                            // FLUSH ETH, 4 bytes (IBTA 1.5 annex A19)
	HdrRETH                            // RDMA ETH, 16 bytes
	HdrAtomicETH                       // Atomic ETH, 28 bytes
	HdrAETH                            // ACK ETH, 4 bytes
	HdrAtomicAckETH                    // Atomic ACK ETH, 8 bytes
	HdrImmDt                           // Immediate data, 4 bytes
	HdrIETH                            // Invalidate ETH, 4 bytes
	hdrCount        = iota
)

// Sizes of the extended headers, in the order they appear on the wire.
var headerOrder = [hdrCount]struct {
	h    Header
	size int
	name string
}{
	{HdrRDETH, RDETHLen, "RDETH"},
	{HdrDETH, DETHLen, "DETH"},
	{HdrXRCETH, XRCETHLen, "XRCETH"},
	{HdrFETH, FETHLen, "FETH"},
	{HdrRETH, RETHLen, "RETH"},
	{HdrAtomicETH, AtomicETHLen, "AtomicETH"},
	{HdrAETH, AETHLen, "AETH"},
	{HdrAtomicAckETH, AtomicAckETHLen, "AtomicAckETH"},
	{HdrImmDt, ImmDtLen, "ImmDt"},
	{HdrIETH, IETHLen, "IETH"},
}

// Len is the total length of the headers in h.
func (h Header) Len() int {
	n := 0
	for _, e := range headerOrder {
		if h&e.h != 0 {
			n += e.size
		}
	}
	return n
}

// String lists the headers in wire order joined by "+", or "-" for none.
func (h Header) String() string {
	s := ""
	for _, e := range headerOrder {
		if h&e.h != 0 {
			if s != "" {
				s += "+"
			}
			s += e.name
		}
	}
	if s == "" {
		return "-"
	}
	return s
}

// Payload says what payload a packet of an opcode may carry.
type Payload uint8

const (
	PayloadNone  Payload = iota // no payload (requests such as READ, ACKs)
	PayloadPMTU                 // exactly the path MTU (FIRST, MIDDLE)
	PayloadUpTo                 // 1..PMTU for LAST, 0..PMTU for ONLY
	PayloadFixed                // a fixed size given by OpInfo.FixedLen (CNP, ATOMIC_WRITE)
	PayloadAny                  // unknown rules (vendor-specific)
)

// OpInfo is one row of the opcode table.
type OpInfo struct {
	Opcode    Opcode
	Name      string // e.g. "RC SEND_FIRST", or "RESERVED 0x15"
	Valid     bool   // false for reserved and vendor-specific opcodes
	Transport Transport
	Op        Operation
	Pos       Position
	Headers   Header // extended headers that follow the BTH
	HdrLen    int    // total transport header length, BTH included
	Payload   Payload
	FixedLen  int  // payload length when Payload == PayloadFixed
	Imm       bool // carries immediate data
	Inv       bool // carries an IETH (SEND with invalidate)
	Request   bool // sent by a requester (as opposed to responses and ACKs)
}

// BTHLen is the Base Transport Header length.
const BTHLen = 12

// ICRCLen is the invariant CRC trailer length.
const ICRCLen = 4

// Lengths of the extended transport headers.
const (
	RDETHLen        = 4
	DETHLen         = 8
	XRCETHLen       = 4
	FETHLen         = 4
	RETHLen         = 16
	AtomicETHLen    = 28
	AETHLen         = 4
	AtomicAckETHLen = 8
	ImmDtLen        = 4
	IETHLen         = 4
	CNPPayloadLen   = 16 // RoCEv2 annex A17.9: 16 reserved bytes
)

var table [256]OpInfo

// Info returns the table row of the opcode. Every opcode has a row;
// reserved and vendor-specific ones have Valid == false.
func (o Opcode) Info() *OpInfo { return &table[o] }

// String returns the opcode's name.
func (o Opcode) String() string { return table[o].Name }

// Transport returns the transport encoded in the opcode's top three bits.
func (o Opcode) Transport() Transport { return Transport(o >> 5) }

// rcRow is the shape of one operation (low five bits) in the RC-like
// transports; UC, RD and XRC are derived from it by the rules of IBTA §9.2.
type rcRow struct {
	low     uint8
	name    string
	op      Operation
	pos     Position
	hdr     Header
	payload Payload
	imm     bool
	inv     bool
}

var rcRows = []rcRow{
	{0x00, "SEND_FIRST", OpSend, PosFirst, 0, PayloadPMTU, false, false},
	{0x01, "SEND_MIDDLE", OpSend, PosMiddle, 0, PayloadPMTU, false, false},
	{0x02, "SEND_LAST", OpSend, PosLast, 0, PayloadUpTo, false, false},
	{0x03, "SEND_LAST_WITH_IMMEDIATE", OpSend, PosLast, HdrImmDt, PayloadUpTo, true, false},
	{0x04, "SEND_ONLY", OpSend, PosOnly, 0, PayloadUpTo, false, false},
	{0x05, "SEND_ONLY_WITH_IMMEDIATE", OpSend, PosOnly, HdrImmDt, PayloadUpTo, true, false},
	{0x06, "RDMA_WRITE_FIRST", OpWrite, PosFirst, HdrRETH, PayloadPMTU, false, false},
	{0x07, "RDMA_WRITE_MIDDLE", OpWrite, PosMiddle, 0, PayloadPMTU, false, false},
	{0x08, "RDMA_WRITE_LAST", OpWrite, PosLast, 0, PayloadUpTo, false, false},
	{0x09, "RDMA_WRITE_LAST_WITH_IMMEDIATE", OpWrite, PosLast, HdrImmDt, PayloadUpTo, true, false},
	{0x0A, "RDMA_WRITE_ONLY", OpWrite, PosOnly, HdrRETH, PayloadUpTo, false, false},
	{0x0B, "RDMA_WRITE_ONLY_WITH_IMMEDIATE", OpWrite, PosOnly, HdrRETH | HdrImmDt, PayloadUpTo, true, false},
	{0x0C, "RDMA_READ_REQUEST", OpReadRequest, PosOnly, HdrRETH, PayloadNone, false, false},
	{0x0D, "RDMA_READ_RESPONSE_FIRST", OpReadResponse, PosFirst, HdrAETH, PayloadPMTU, false, false},
	{0x0E, "RDMA_READ_RESPONSE_MIDDLE", OpReadResponse, PosMiddle, 0, PayloadPMTU, false, false},
	{0x0F, "RDMA_READ_RESPONSE_LAST", OpReadResponse, PosLast, HdrAETH, PayloadUpTo, false, false},
	{0x10, "RDMA_READ_RESPONSE_ONLY", OpReadResponse, PosOnly, HdrAETH, PayloadUpTo, false, false},
	{0x11, "ACKNOWLEDGE", OpAck, PosNone, HdrAETH, PayloadNone, false, false},
	{0x12, "ATOMIC_ACKNOWLEDGE", OpAtomicAck, PosNone, HdrAETH | HdrAtomicAckETH, PayloadNone, false, false},
	{0x13, "COMPARE_SWAP", OpCompareSwap, PosOnly, HdrAtomicETH, PayloadNone, false, false},
	{0x14, "FETCH_ADD", OpFetchAdd, PosOnly, HdrAtomicETH, PayloadNone, false, false},
	{0x15, "RESYNC", OpResync, PosOnly, 0, PayloadNone, false, false}, // RD only
	{0x16, "SEND_LAST_WITH_INVALIDATE", OpSend, PosLast, HdrIETH, PayloadUpTo, false, true},
	{0x17, "SEND_ONLY_WITH_INVALIDATE", OpSend, PosOnly, HdrIETH, PayloadUpTo, false, true},
	{0x1C, "FLUSH", OpFlush, PosOnly, HdrFETH | HdrRETH, PayloadNone, false, false},
	{0x1D, "ATOMIC_WRITE", OpAtomicWrite, PosOnly, HdrRETH, PayloadFixed, false, false},
}

func isResponse(op Operation) bool {
	return op == OpReadResponse || op == OpAck || op == OpAtomicAck
}

func init() {
	for i := range table {
		o := Opcode(i)
		t := o.Transport()
		name := fmt.Sprintf("RESERVED 0x%02x", i)
		op := OpReserved
		if t >= TransportVendor6 {
			name = fmt.Sprintf("VENDOR 0x%02x", i)
			op = OpVendor
		}
		table[i] = OpInfo{Opcode: o, Name: name, Transport: t, Op: op, HdrLen: BTHLen, Payload: PayloadAny}
	}
	for _, r := range rcRows {
		for _, t := range []Transport{TransportRC, TransportUC, TransportRD, TransportXRC} {
			hdr := r.hdr
			switch t {
			case TransportRC:
				if r.op == OpResync {
					continue
				}
			case TransportUC:
				// UC carries only SEND and RDMA WRITE (IBTA table 41).
				if r.op != OpSend && r.op != OpWrite || r.inv {
					continue
				}
			case TransportRD:
				// RD: every packet has an RDETH, requests a DETH too. No
				// invalidate, FLUSH or ATOMIC_WRITE.
				if r.inv || r.op == OpFlush || r.op == OpAtomicWrite {
					continue
				}
				hdr |= HdrRDETH
				if !isResponse(r.op) {
					hdr |= HdrDETH
				}
			case TransportXRC:
				// XRC: requests carry an XRCETH; no RESYNC, FLUSH, ATOMIC_WRITE.
				if r.op == OpResync || r.op == OpFlush || r.op == OpAtomicWrite {
					continue
				}
				if !isResponse(r.op) {
					hdr |= HdrXRCETH
				}
			}
			code := Opcode(uint8(t)<<5 | r.low)
			info := OpInfo{
				Opcode: code, Name: t.String() + " " + r.name, Valid: true, Transport: t,
				Op: r.op, Pos: r.pos, Headers: hdr, HdrLen: BTHLen + hdr.Len(), Payload: r.payload,
				Imm: r.imm, Inv: r.inv, Request: !isResponse(r.op),
			}
			if r.op == OpAtomicWrite {
				info.FixedLen = 8
			}
			table[code] = info
		}
	}
	ud := func(code Opcode, name string, hdr Header, imm bool) {
		table[code] = OpInfo{Opcode: code, Name: "UD " + name, Valid: true, Transport: TransportUD,
			Op: OpSend, Pos: PosOnly, Headers: hdr, HdrLen: BTHLen + hdr.Len(), Payload: PayloadUpTo, Imm: imm, Request: true}
	}
	ud(0x64, "SEND_ONLY", HdrDETH, false)
	ud(0x65, "SEND_ONLY_WITH_IMMEDIATE", HdrDETH|HdrImmDt, true)
	table[0x81] = OpInfo{Opcode: 0x81, Name: "CNP", Valid: true, Transport: TransportCNP, Op: OpCNP,
		HdrLen: BTHLen, Payload: PayloadFixed, FixedLen: CNPPayloadLen}
}

// Lookup finds an opcode by its table name ("RC SEND_ONLY"), for tools and tests.
func Lookup(name string) (Opcode, bool) {
	for i := range table {
		if table[i].Valid && table[i].Name == name {
			return Opcode(i), true
		}
	}
	return 0, false
}

// Common RC opcodes, named for the transport code.
const (
	RCSendFirst          Opcode = 0x00
	RCSendMiddle         Opcode = 0x01
	RCSendLast           Opcode = 0x02
	RCSendLastImm        Opcode = 0x03
	RCSendOnly           Opcode = 0x04
	RCSendOnlyImm        Opcode = 0x05
	RCWriteFirst         Opcode = 0x06
	RCWriteMiddle        Opcode = 0x07
	RCWriteLast          Opcode = 0x08
	RCWriteLastImm       Opcode = 0x09
	RCWriteOnly          Opcode = 0x0A
	RCWriteOnlyImm       Opcode = 0x0B
	RCReadRequest        Opcode = 0x0C
	RCReadResponseFirst  Opcode = 0x0D
	RCReadResponseMiddle Opcode = 0x0E
	RCReadResponseLast   Opcode = 0x0F
	RCReadResponseOnly   Opcode = 0x10
	RCAck                Opcode = 0x11
	RCAtomicAck          Opcode = 0x12
	RCCompareSwap        Opcode = 0x13
	RCFetchAdd           Opcode = 0x14
	RCSendLastInv        Opcode = 0x16
	RCSendOnlyInv        Opcode = 0x17
	RCFlush              Opcode = 0x1C
	RCAtomicWrite        Opcode = 0x1D
	UDSendOnly           Opcode = 0x64
	UDSendOnlyImm        Opcode = 0x65
	CNP                  Opcode = 0x81
)
