package bth

import "encoding/binary"

// The header types below are zero-copy views: typed byte slices whose
// accessors read and write the wire bytes in place (all fields big-endian).
// A view must be at least its header's length; Parse guarantees that.

var be = binary.BigEndian

// BTH is a view of the 12-byte Base Transport Header (IBTA §9.2).
type BTH []byte

// Opcode is byte 0: transport (bits 7-5) and operation.
func (b BTH) Opcode() Opcode { return Opcode(b[0]) }

// SE is the Solicited Event bit.
func (b BTH) SE() bool { return b[1]&0x80 != 0 }

// MigReq is the migration-request bit (path migration state).
func (b BTH) MigReq() bool { return b[1]&0x40 != 0 }

// PadCnt is the number of pad bytes (0-3) after the payload.
func (b BTH) PadCnt() int { return int(b[1]>>4) & 3 }

// TVer is the transport header version; receivers drop TVer != 0.
func (b BTH) TVer() uint8 { return b[1] & 0x0f }

// PKey is the partition key.
func (b BTH) PKey() uint16 { return be.Uint16(b[2:]) }

// FECN is the forward ECN bit (byte 4, bit 7).
func (b BTH) FECN() bool { return b[4]&0x80 != 0 }

// BECN is the backward ECN bit (byte 4, bit 6).
func (b BTH) BECN() bool { return b[4]&0x40 != 0 }

// Resv8a returns byte 4 whole (FECN, BECN, 6 reserved bits): the byte the ICRC covers as ones.
func (b BTH) Resv8a() uint8 { return b[4] }

// DestQP is the 24-bit destination queue pair number.
func (b BTH) DestQP() uint32 { return be.Uint32(b[4:]) & 0xffffff }

// AckReq asks the responder for an acknowledgement.
func (b BTH) AckReq() bool { return b[8]&0x80 != 0 }

// PSN is the 24-bit packet sequence number.
func (b BTH) PSN() uint32 { return be.Uint32(b[8:]) & 0xffffff }

// SetOpcode writes byte 0.
func (b BTH) SetOpcode(o Opcode) { b[0] = byte(o) }

// SetPSN writes the 24-bit PSN, keeping AckReq.
func (b BTH) SetPSN(psn uint32) {
	b[9], b[10], b[11] = byte(psn>>16), byte(psn>>8), byte(psn)
}

// SetDestQP writes the 24-bit destination QP, keeping FECN/BECN.
func (b BTH) SetDestQP(qp uint32) {
	b[5], b[6], b[7] = byte(qp>>16), byte(qp>>8), byte(qp)
}

// SetAckReq sets or clears AckReq.
func (b BTH) SetAckReq(v bool) { b[8] = setBit(b[8], 0x80, v) }

// SetSE sets or clears the Solicited Event bit.
func (b BTH) SetSE(v bool) { b[1] = setBit(b[1], 0x80, v) }

// SetPadCnt writes PadCnt (n & 3).
func (b BTH) SetPadCnt(n int) { b[1] = b[1]&^0x30 | byte(n&3)<<4 }

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

// VA is the remote virtual address.
func (h RETH) VA() uint64 { return be.Uint64(h[0:]) }

// RKey is the remote key of the memory region.
func (h RETH) RKey() uint32 { return be.Uint32(h[8:]) }

// DMALen is the length of the whole RDMA operation in bytes.
func (h RETH) DMALen() uint32 { return be.Uint32(h[12:]) }

// Encode writes the RETH fields.
func (h RETH) Encode(va uint64, rkey, length uint32) {
	be.PutUint64(h[0:], va)
	be.PutUint32(h[8:], rkey)
	be.PutUint32(h[12:], length)
}

// AETH is a view of the ACK Extended Transport Header (4 bytes): an 8-bit
// syndrome and a 24-bit MSN (IBTA §9.3.5).
type AETH []byte

// Syndrome is the ACK/NAK syndrome byte.
func (h AETH) Syndrome() Syndrome { return Syndrome(h[0]) }

// MSN is the 24-bit message sequence number.
func (h AETH) MSN() uint32 { return be.Uint32(h[0:]) & 0xffffff }

// Encode writes syndrome and MSN.
func (h AETH) Encode(s Syndrome, msn uint32) {
	be.PutUint32(h[0:], msn&0xffffff)
	h[0] = byte(s)
}

// AtomicETH is a view of the Atomic Extended Transport Header (28 bytes).
type AtomicETH []byte

// VA is the remote address of the 8-byte operand.
func (h AtomicETH) VA() uint64 { return be.Uint64(h[0:]) }

// RKey is the remote key.
func (h AtomicETH) RKey() uint32 { return be.Uint32(h[8:]) }

// SwapAdd is the swap value (COMPARE_SWAP) or addend (FETCH_ADD).
func (h AtomicETH) SwapAdd() uint64 { return be.Uint64(h[12:]) }

// Compare is the compare value of COMPARE_SWAP.
func (h AtomicETH) Compare() uint64 { return be.Uint64(h[20:]) }

// Encode writes the AtomicETH fields.
func (h AtomicETH) Encode(va uint64, rkey uint32, swapAdd, compare uint64) {
	be.PutUint64(h[0:], va)
	be.PutUint32(h[8:], rkey)
	be.PutUint64(h[12:], swapAdd)
	be.PutUint64(h[20:], compare)
}

// AtomicAckETH is a view of the Atomic ACK Extended Transport Header (8 bytes).
type AtomicAckETH []byte

// Orig is the remote value before the atomic operation.
func (h AtomicAckETH) Orig() uint64 { return be.Uint64(h) }

// Encode writes the original value.
func (h AtomicAckETH) Encode(orig uint64) { be.PutUint64(h, orig) }

// ImmDt is a view of the 4-byte immediate data. The value is opaque; it is
// returned in network byte order as read from the wire.
type ImmDt []byte

// Imm returns the immediate data.
func (h ImmDt) Imm() uint32 { return be.Uint32(h) }

// Encode writes the immediate data.
func (h ImmDt) Encode(imm uint32) { be.PutUint32(h, imm) }

// IETH is a view of the Invalidate Extended Transport Header (4 bytes).
type IETH []byte

// RKey is the remote key to invalidate.
func (h IETH) RKey() uint32 { return be.Uint32(h) }

// Encode writes the key to invalidate.
func (h IETH) Encode(rkey uint32) { be.PutUint32(h, rkey) }

// DETH is a view of the Datagram Extended Transport Header (8 bytes).
type DETH []byte

// QKey is the queue key the receiver checks.
func (h DETH) QKey() uint32 { return be.Uint32(h[0:]) }

// SrcQP is the sender's 24-bit QP number.
func (h DETH) SrcQP() uint32 { return be.Uint32(h[4:]) & 0xffffff }

// Encode writes Q_Key and source QP (the byte between them is reserved).
func (h DETH) Encode(qkey, srcQP uint32) {
	be.PutUint32(h[0:], qkey)
	be.PutUint32(h[4:], srcQP&0xffffff)
}

// RDETH is a view of the Reliable Datagram Extended Transport Header (4 bytes).
type RDETH []byte

// EEContext is the 24-bit end-to-end context.
func (h RDETH) EEContext() uint32 { return be.Uint32(h) & 0xffffff }

// Encode writes the EE context.
func (h RDETH) Encode(ee uint32) { be.PutUint32(h, ee&0xffffff) }

// XRCETH is a view of the XRC Extended Transport Header (4 bytes).
type XRCETH []byte

// XRCSRQ is the 24-bit XRC shared receive queue number.
func (h XRCETH) XRCSRQ() uint32 { return be.Uint32(h) & 0xffffff }

// Encode writes the XRC SRQ number.
func (h XRCETH) Encode(srq uint32) { be.PutUint32(h, srq&0xffffff) }

// FETH is a view of the FLUSH Extended Transport Header (4 bytes, IBTA 1.5
// annex A19): placement type in bits 3-0, selectivity level in bits 5-4.
type FETH []byte

// PlacementType is the FLUSH placement type (bits 3-0).
func (h FETH) PlacementType() uint8 { return h[3] & 0x0f }

// Selectivity is the FLUSH selectivity level (bits 5-4).
func (h FETH) Selectivity() uint8 { return h[3] >> 4 & 3 }

// Encode writes placement type and selectivity level.
func (h FETH) Encode(placement, selectivity uint8) {
	be.PutUint32(h, uint32(placement&0x0f)|uint32(selectivity&3)<<4)
}
