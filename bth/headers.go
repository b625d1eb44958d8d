package bth

import "encoding/binary"

// The header types below are zero-copy views: typed byte slices whose
// accessors read and write the wire bytes in place (all fields big-endian).
// A view must be at least its header's length; Parse guarantees that.

var be = binary.BigEndian

// BTH is a view of the 12-byte Base Transport Header (IBTA §9.2).
type BTH []byte

func (b BTH) Opcode() Opcode     { return Opcode(b[0]) }
func (b BTH) SE() bool           { return b[1]&0x80 != 0 }
func (b BTH) MigReq() bool       { return b[1]&0x40 != 0 }
func (b BTH) PadCnt() int        { return int(b[1]>>4) & 3 }
func (b BTH) TVer() uint8        { return b[1] & 0x0f }
func (b BTH) PKey() uint16       { return be.Uint16(b[2:]) }
func (b BTH) FECN() bool         { return b[4]&0x80 != 0 }
func (b BTH) BECN() bool         { return b[4]&0x40 != 0 }
func (b BTH) Resv8a() uint8      { return b[4] }
func (b BTH) DestQP() uint32     { return be.Uint32(b[4:]) & 0xffffff }
func (b BTH) AckReq() bool       { return b[8]&0x80 != 0 }
func (b BTH) PSN() uint32        { return be.Uint32(b[8:]) & 0xffffff }
func (b BTH) SetOpcode(o Opcode) { b[0] = byte(o) }
func (b BTH) SetPSN(psn uint32) {
	b[9], b[10], b[11] = byte(psn>>16), byte(psn>>8), byte(psn)
}
func (b BTH) SetDestQP(qp uint32) {
	b[5], b[6], b[7] = byte(qp>>16), byte(qp>>8), byte(qp)
}
func (b BTH) SetAckReq(v bool) { b[8] = setBit(b[8], 0x80, v) }
func (b BTH) SetSE(v bool)     { b[1] = setBit(b[1], 0x80, v) }
func (b BTH) SetPadCnt(n int)  { b[1] = b[1]&^0x30 | byte(n&3)<<4 }

func setBit(x, m byte, v bool) byte {
	if v {
		return x | m
	}
	return x &^ m
}

// BTHFields are the BTH's fields, for building.
type BTHFields struct {
	Opcode     Opcode
	SE         bool
	MigReq     bool
	PadCnt     int
	TVer       uint8
	PKey       uint16
	FECN, BECN bool
	DestQP     uint32
	AckReq     bool
	PSN        uint32
}

// Encode writes f into b.
func (b BTH) Encode(f *BTHFields) {
	b[0] = byte(f.Opcode)
	b[1] = f.TVer&0x0f | byte(f.PadCnt&3)<<4
	b[1] = setBit(b[1], 0x80, f.SE)
	b[1] = setBit(b[1], 0x40, f.MigReq)
	be.PutUint16(b[2:], f.PKey)
	be.PutUint32(b[4:], f.DestQP&0xffffff)
	b[4] = setBit(setBit(0, 0x80, f.FECN), 0x40, f.BECN)
	be.PutUint32(b[8:], f.PSN&0xffffff)
	b[8] = setBit(0, 0x80, f.AckReq)
}

// Fields decodes the BTH.
func (b BTH) Fields() BTHFields {
	return BTHFields{Opcode: b.Opcode(), SE: b.SE(), MigReq: b.MigReq(), PadCnt: b.PadCnt(), TVer: b.TVer(),
		PKey: b.PKey(), FECN: b.FECN(), BECN: b.BECN(), DestQP: b.DestQP(), AckReq: b.AckReq(), PSN: b.PSN()}
}

// RETH is a view of the RDMA Extended Transport Header (16 bytes).
type RETH []byte

func (h RETH) VA() uint64     { return be.Uint64(h[0:]) }
func (h RETH) RKey() uint32   { return be.Uint32(h[8:]) }
func (h RETH) DMALen() uint32 { return be.Uint32(h[12:]) }
func (h RETH) Encode(va uint64, rkey, length uint32) {
	be.PutUint64(h[0:], va)
	be.PutUint32(h[8:], rkey)
	be.PutUint32(h[12:], length)
}

// AETH is a view of the ACK Extended Transport Header (4 bytes): an 8-bit
// syndrome and a 24-bit MSN (IBTA §9.3.5).
type AETH []byte

func (h AETH) Syndrome() Syndrome { return Syndrome(h[0]) }
func (h AETH) MSN() uint32        { return be.Uint32(h[0:]) & 0xffffff }
func (h AETH) Encode(s Syndrome, msn uint32) {
	be.PutUint32(h[0:], msn&0xffffff)
	h[0] = byte(s)
}

// AtomicETH is a view of the Atomic Extended Transport Header (28 bytes).
type AtomicETH []byte

func (h AtomicETH) VA() uint64      { return be.Uint64(h[0:]) }
func (h AtomicETH) RKey() uint32    { return be.Uint32(h[8:]) }
func (h AtomicETH) SwapAdd() uint64 { return be.Uint64(h[12:]) }
func (h AtomicETH) Compare() uint64 { return be.Uint64(h[20:]) }
func (h AtomicETH) Encode(va uint64, rkey uint32, swapAdd, compare uint64) {
	be.PutUint64(h[0:], va)
	be.PutUint32(h[8:], rkey)
	be.PutUint64(h[12:], swapAdd)
	be.PutUint64(h[20:], compare)
}

// AtomicAckETH is a view of the Atomic ACK Extended Transport Header (8 bytes).
type AtomicAckETH []byte

func (h AtomicAckETH) Orig() uint64       { return be.Uint64(h) }
func (h AtomicAckETH) Encode(orig uint64) { be.PutUint64(h, orig) }

// ImmDt is a view of the 4-byte immediate data. The value is opaque; it is
// returned in network byte order as read from the wire.
type ImmDt []byte

func (h ImmDt) Imm() uint32       { return be.Uint32(h) }
func (h ImmDt) Encode(imm uint32) { be.PutUint32(h, imm) }

// IETH is a view of the Invalidate Extended Transport Header (4 bytes).
type IETH []byte

func (h IETH) RKey() uint32       { return be.Uint32(h) }
func (h IETH) Encode(rkey uint32) { be.PutUint32(h, rkey) }

// DETH is a view of the Datagram Extended Transport Header (8 bytes).
type DETH []byte

func (h DETH) QKey() uint32  { return be.Uint32(h[0:]) }
func (h DETH) SrcQP() uint32 { return be.Uint32(h[4:]) & 0xffffff }
func (h DETH) Encode(qkey, srcQP uint32) {
	be.PutUint32(h[0:], qkey)
	be.PutUint32(h[4:], srcQP&0xffffff)
}

// RDETH is a view of the Reliable Datagram Extended Transport Header (4 bytes).
type RDETH []byte

func (h RDETH) EEContext() uint32 { return be.Uint32(h) & 0xffffff }
func (h RDETH) Encode(ee uint32)  { be.PutUint32(h, ee&0xffffff) }

// XRCETH is a view of the XRC Extended Transport Header (4 bytes).
type XRCETH []byte

func (h XRCETH) XRCSRQ() uint32    { return be.Uint32(h) & 0xffffff }
func (h XRCETH) Encode(srq uint32) { be.PutUint32(h, srq&0xffffff) }

// FETH is a view of the FLUSH Extended Transport Header (4 bytes, IBTA 1.5
// annex A19): placement type in bits 3-0, selectivity level in bits 5-4.
type FETH []byte

func (h FETH) PlacementType() uint8 { return h[3] & 0x0f }
func (h FETH) Selectivity() uint8   { return h[3] >> 4 & 3 }
func (h FETH) Encode(placement, selectivity uint8) {
	be.PutUint32(h, uint32(placement&0x0f)|uint32(selectivity&3)<<4)
}
