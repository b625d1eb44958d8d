package mad

import "net/netip"

// Sizes of the message areas (IBTA §12.6; each message's private data
// fills the MAD to its end).
const (
	REQPrivateDataLen     = 92
	MRAPrivateDataLen     = 222
	REJPrivateDataLen     = 148
	REPPrivateDataLen     = 196
	RTUPrivateDataLen     = 224
	DREQPrivateDataLen    = 220
	DREPPrivateDataLen    = 224
	SIDRREQPrivateDataLen = 216
	SIDRREPPrivateDataLen = 136
	APRPrivateDataLen     = 148
	LAPPrivateDataLen     = 168
	ARILen                = 72 // REJ ARI, APR and SIDR_REP additional information
	PathLen               = 44 // a REQ path description
)

// Transport service types of REQ (IBTA §12.6.5, table 106).
const (
	TransportRC  = 0
	TransportUC  = 1
	TransportRD  = 2
	TransportXRC = 3 // with extended transport type 1 (XRC annex)
)

// Codes of the message that a REJ rejects or an MRA acknowledges.
const (
	RejectedREQ   = 0
	RejectedREP   = 1
	RejectedOther = 2 // neither: a REJ on a stale or unknown connection
	MRAedREQ      = 0
	MRAedREP      = 1
	MRAedLAP      = 2
)

// SIDR_REP status codes (IBTA §12.11.2, table 120).
const (
	SIDRSuccess            = 0
	SIDRUnsupported        = 1 // service ID not supported
	SIDRReject             = 2
	SIDRNoQP               = 3
	SIDRRedirect           = 4
	SIDRUnsupportedVersion = 5
)

var sidrStatusNames = [...]string{"success", "service ID not supported", "rejected", "no QP", "redirect", "class version not supported"}

// SIDRStatusName names a SIDR_REP status.
func SIDRStatusName(s uint8) string {
	if int(s) < len(sidrStatusNames) {
		return sidrStatusNames[s]
	}
	return "reserved"
}

// PathMTUBytes is the MTU a path MTU code stands for (IBTA §9.6.1: 1 is
// 256 bytes ... 5 is 4096), or 0 for a reserved code.
func PathMTUBytes(code uint8) int {
	if code < 1 || code > 5 {
		return 0
	}
	return 128 << code
}

// REQ views a MAD as a connection request (IBTA §12.6.5, table 106).
type REQ struct{ MAD }

// MRA views a MAD as a message receipt acknowledgement (table 107).
type MRA struct{ MAD }

// REJ views a MAD as a reject (table 108).
type REJ struct{ MAD }

// REP views a MAD as a connection reply (table 110).
type REP struct{ MAD }

// RTU views a MAD as a ready to use (table 111).
type RTU struct{ MAD }

// DREQ views a MAD as a disconnection request (table 112).
type DREQ struct{ MAD }

// DREP views a MAD as a disconnection reply (table 113).
type DREP struct{ MAD }

// LAP views a MAD as a load alternate path, by its comm IDs only (table 115).
type LAP struct{ MAD }

// APR views a MAD as an alternate path response (table 116).
type APR struct{ MAD }

// SIDRREQ views a MAD as a service ID resolution request (table 119).
type SIDRREQ struct{ MAD }

// SIDRREP views a MAD as a service ID resolution response (table 120).
type SIDRREP struct{ MAD }

// REQ and the other methods of MAD return its message views; they do not
// check the attribute ID.
func (m MAD) REQ() REQ { return REQ{m} }

// MRA returns m's MRA view.
func (m MAD) MRA() MRA { return MRA{m} }

// REJ returns m's REJ view.
func (m MAD) REJ() REJ { return REJ{m} }

// REP returns m's REP view.
func (m MAD) REP() REP { return REP{m} }

// RTU returns m's RTU view.
func (m MAD) RTU() RTU { return RTU{m} }

// DREQ returns m's DREQ view.
func (m MAD) DREQ() DREQ { return DREQ{m} }

// DREP returns m's DREP view.
func (m MAD) DREP() DREP { return DREP{m} }

// LAP returns m's LAP view.
func (m MAD) LAP() LAP { return LAP{m} }

// APR returns m's APR view.
func (m MAD) APR() APR { return APR{m} }

// SIDRREQ returns m's SIDR_REQ view.
func (m MAD) SIDRREQ() SIDRREQ { return SIDRREQ{m} }

// SIDRREP returns m's SIDR_REP view.
func (m MAD) SIDRREP() SIDRREP { return SIDRREP{m} }

// CommIDs returns the local and remote comm IDs of the messages that carry
// both at data offsets 0 and 4 (every message but REQ, whose remote ID is
// not yet known, and SIDR_REQ/SIDR_REP, which carry a request ID at 0), and
// ok false otherwise.
func (m MAD) CommIDs() (local, remote uint32, ok bool) {
	switch m.AttrID() {
	case AttrMRA, AttrREJ, AttrREP, AttrRTU, AttrDREQ, AttrDREP, AttrLAP, AttrAPR:
		return m.d32(0), m.d32(4), true
	}
	return 0, 0, false
}

// --- REQ ---

// LocalCommID is the sender's comm ID (data offset 0).
func (r REQ) LocalCommID() uint32 { return r.d32(0) }

// ServiceID is the service the request connects to (8).
func (r REQ) ServiceID() ServiceID { return ServiceID(r.d64(8)) }

// LocalCAGUID is the sender's channel adapter GUID (16).
func (r REQ) LocalCAGUID() uint64 { return r.d64(16) }

// LocalQKey is the sender's Q_Key, for RD (28).
func (r REQ) LocalQKey() uint32 { return r.d32(28) }

// LocalQPN is the sender's QP number (32, 24 bits).
func (r REQ) LocalQPN() uint32 { return r.d24(32) }

// ResponderResources is how many RDMA reads/atomics the sender accepts in flight (35).
func (r REQ) ResponderResources() uint8 { return r.d8(35) }

// LocalEECN is the sender's EE context, for RD (36, 24 bits).
func (r REQ) LocalEECN() uint32 { return r.d24(36) }

// InitiatorDepth is how many RDMA reads/atomics the sender issues in flight (39).
func (r REQ) InitiatorDepth() uint8 { return r.d8(39) }

// RemoteEECN is the receiver's EE context, for RD (40, 24 bits).
func (r REQ) RemoteEECN() uint32 { return r.d24(40) }

// RemoteCMResponseTimeout is the time the receiver's CM may take to answer,
// 4.096 µs * 2^t (43, bits 7-3).
func (r REQ) RemoteCMResponseTimeout() uint8 { return r.bits(43, 0xf8) }

// TransportType is the transport service type (43, bits 2-1): TransportRC...
func (r REQ) TransportType() uint8 { return r.bits(43, 0x06) }

// E2EFlowControl is the end-to-end flow control bit (43, bit 0).
func (r REQ) E2EFlowControl() bool { return r.flag(43, 0x01) }

// StartingPSN is the first PSN the sender will send (44, 24 bits).
func (r REQ) StartingPSN() uint32 { return r.d24(44) }

// LocalCMResponseTimeout is the time the sender's CM takes to answer (47, bits 7-3).
func (r REQ) LocalCMResponseTimeout() uint8 { return r.bits(47, 0xf8) }

// RetryCount is the transport retry count (47, bits 2-0).
func (r REQ) RetryCount() uint8 { return r.bits(47, 0x07) }

// PKey is the partition key (48).
func (r REQ) PKey() uint16 { return r.d16(48) }

// PathMTU is the path MTU code (50, bits 7-4); see PathMTUBytes.
func (r REQ) PathMTU() uint8 { return r.bits(50, 0xf0) }

// RDCExists is the RD channel bit (50, bit 3).
func (r REQ) RDCExists() bool { return r.flag(50, 0x08) }

// RNRRetryCount is the RNR NAK retry count, 7 meaning unlimited (50, bits 2-0).
func (r REQ) RNRRetryCount() uint8 { return r.bits(50, 0x07) }

// MaxCMRetries is how often the sender's CM retransmits (51, bits 7-4).
func (r REQ) MaxCMRetries() uint8 { return r.bits(51, 0xf0) }

// SRQ says the sender's QP takes receives from an SRQ (51, bit 3).
func (r REQ) SRQ() bool { return r.flag(51, 0x08) }

// ExtTransportType is the extended transport type, 1 for XRC (51, bits 2-0).
func (r REQ) ExtTransportType() uint8 { return r.bits(51, 0x07) }

// Primary is the primary path (data offsets 52-95).
func (r REQ) Primary() Path { return Path(r.dBytes(52, PathLen)) }

// Alternate is the alternate path (96-139); all zero when there is none.
func (r REQ) Alternate() Path { return Path(r.dBytes(96, PathLen)) }

// SAPSupported is the "alternate path supported by the sender" bit (139, bit 2).
func (r REQ) SAPSupported() bool { return r.flag(139, 0x04) }

// PrivateData is the 92-byte private data area (140); rdma_cm puts a
// cma_hdr at its head (CMAHeader).
func (r REQ) PrivateData() []byte { return r.dBytes(140, REQPrivateDataLen) }

// CMAHeader is the cma_hdr at the head of the private data.
func (r REQ) CMAHeader() CMAHeader { return CMAHeader(r.dBytes(140, CMAHeaderLen)) }

// SetLocalCommID writes the sender's comm ID.
func (r REQ) SetLocalCommID(v uint32) { r.setD32(0, v) }

// SetServiceID writes the service ID.
func (r REQ) SetServiceID(v ServiceID) { r.setD64(8, uint64(v)) }

// SetLocalCAGUID writes the sender's CA GUID.
func (r REQ) SetLocalCAGUID(v uint64) { r.setD64(16, v) }

// SetLocalQKey writes the sender's Q_Key.
func (r REQ) SetLocalQKey(v uint32) { r.setD32(28, v) }

// SetLocalQPN writes the 24-bit QPN.
func (r REQ) SetLocalQPN(v uint32) { r.setD24(32, v) }

// SetResponderResources writes byte 35.
func (r REQ) SetResponderResources(v uint8) { r.setD8(35, v) }

// SetLocalEECN writes the 24-bit local EECN.
func (r REQ) SetLocalEECN(v uint32) { r.setD24(36, v) }

// SetInitiatorDepth writes byte 39.
func (r REQ) SetInitiatorDepth(v uint8) { r.setD8(39, v) }

// SetRemoteEECN writes the 24-bit remote EECN.
func (r REQ) SetRemoteEECN(v uint32) { r.setD24(40, v) }

// SetRemoteCMResponseTimeout writes the 5-bit timeout.
func (r REQ) SetRemoteCMResponseTimeout(v uint8) { r.setBits(43, 0xf8, v) }

// SetTransportType writes the 2-bit transport service type.
func (r REQ) SetTransportType(v uint8) { r.setBits(43, 0x06, v) }

// SetE2EFlowControl writes the end-to-end flow control bit.
func (r REQ) SetE2EFlowControl(v bool) { r.setFlag(43, 0x01, v) }

// SetStartingPSN writes the 24-bit starting PSN.
func (r REQ) SetStartingPSN(v uint32) { r.setD24(44, v) }

// SetLocalCMResponseTimeout writes the 5-bit timeout.
func (r REQ) SetLocalCMResponseTimeout(v uint8) { r.setBits(47, 0xf8, v) }

// SetRetryCount writes the 3-bit retry count.
func (r REQ) SetRetryCount(v uint8) { r.setBits(47, 0x07, v) }

// SetPKey writes the partition key.
func (r REQ) SetPKey(v uint16) { r.setD16(48, v) }

// SetPathMTU writes the 4-bit MTU code.
func (r REQ) SetPathMTU(v uint8) { r.setBits(50, 0xf0, v) }

// SetRDCExists writes the RDC bit.
func (r REQ) SetRDCExists(v bool) { r.setFlag(50, 0x08, v) }

// SetRNRRetryCount writes the 3-bit RNR retry count.
func (r REQ) SetRNRRetryCount(v uint8) { r.setBits(50, 0x07, v) }

// SetMaxCMRetries writes the 4-bit CM retry count.
func (r REQ) SetMaxCMRetries(v uint8) { r.setBits(51, 0xf0, v) }

// SetSRQ writes the SRQ bit.
func (r REQ) SetSRQ(v bool) { r.setFlag(51, 0x08, v) }

// SetExtTransportType writes the 3-bit extended transport type.
func (r REQ) SetExtTransportType(v uint8) { r.setBits(51, 0x07, v) }

// SetSAPSupported writes the SAP bit.
func (r REQ) SetSAPSupported(v bool) { r.setFlag(139, 0x04, v) }

// SetPrivateData copies p into the private data area and zeroes the rest.
func (r REQ) SetPrivateData(p []byte) error { return setData(r.PrivateData(), p) }

// Path views the 44-byte path description of a REQ (primary or alternate).
type Path []byte

// LocalLID is the sender's port LID (0xFFFF, permissive, on routed RoCE).
func (p Path) LocalLID() uint16 { return be.Uint16(p[0:]) }

// RemoteLID is the receiver's port LID.
func (p Path) RemoteLID() uint16 { return be.Uint16(p[2:]) }

// LocalGID is the sender's port GID (an IPv4-mapped address on RoCEv2 over IPv4).
func (p Path) LocalGID() netip.Addr { return netip.AddrFrom16([16]byte(p[4:20])) }

// RemoteGID is the receiver's port GID.
func (p Path) RemoteGID() netip.Addr { return netip.AddrFrom16([16]byte(p[20:36])) }

// FlowLabel is the 20-bit flow label (path offset 36, bits 31-12 of the word).
func (p Path) FlowLabel() uint32 { return be.Uint32(p[36:]) >> 12 }

// PacketRate is the 6-bit packet rate code (39, bits 5-0).
func (p Path) PacketRate() uint8 { return p[39] & 0x3f }

// TrafficClass is the GRH traffic class (40).
func (p Path) TrafficClass() uint8 { return p[40] }

// HopLimit is the GRH hop limit (41).
func (p Path) HopLimit() uint8 { return p[41] }

// SL is the service level (42, bits 7-4).
func (p Path) SL() uint8 { return p[42] >> 4 }

// SubnetLocal says the path stays in the subnet (42, bit 3).
func (p Path) SubnetLocal() bool { return p[42]&0x08 != 0 }

// LocalAckTimeout is the transport ACK timeout, 4.096 µs * 2^t (43, bits 7-3).
func (p Path) LocalAckTimeout() uint8 { return p[43] >> 3 }

// SetLocalLID writes the sender's LID.
func (p Path) SetLocalLID(v uint16) { be.PutUint16(p[0:], v) }

// SetRemoteLID writes the receiver's LID.
func (p Path) SetRemoteLID(v uint16) { be.PutUint16(p[2:], v) }

// SetLocalGID writes the sender's GID; an IPv4 address is stored IPv4-mapped.
func (p Path) SetLocalGID(a netip.Addr) { putGID(p[4:20], a) }

// SetRemoteGID writes the receiver's GID.
func (p Path) SetRemoteGID(a netip.Addr) { putGID(p[20:36], a) }

// SetFlowLabel writes the 20-bit flow label, keeping the packet rate.
func (p Path) SetFlowLabel(v uint32) {
	w := be.Uint32(p[36:])
	be.PutUint32(p[36:], w&0xfff|v<<12)
}

// SetPacketRate writes the 6-bit packet rate.
func (p Path) SetPacketRate(v uint8) { p[39] = p[39]&^0x3f | v&0x3f }

// SetTrafficClass writes the traffic class.
func (p Path) SetTrafficClass(v uint8) { p[40] = v }

// SetHopLimit writes the hop limit.
func (p Path) SetHopLimit(v uint8) { p[41] = v }

// SetSL writes the 4-bit service level.
func (p Path) SetSL(v uint8) { p[42] = bitsSet(p[42], 0xf0, v) }

// SetSubnetLocal writes the subnet-local bit.
func (p Path) SetSubnetLocal(v bool) { p[42] = flagSet(p[42], 0x08, v) }

// SetLocalAckTimeout writes the 5-bit ACK timeout, keeping the low bits.
func (p Path) SetLocalAckTimeout(v uint8) { p[43] = bitsSet(p[43], 0xf8, v) }

func flagSet(b, mask uint8, v bool) uint8 {
	if v {
		return b | mask
	}
	return b &^ mask
}

// putGID writes a as 16 bytes (IPv4 as ::ffff:a.b.c.d); the zero Addr is all zeroes.
func putGID(dst []byte, a netip.Addr) {
	if !a.IsValid() {
		clear(dst[:16])
		return
	}
	b := a.As16()
	copy(dst, b[:])
}

// --- MRA ---

// LocalCommID is the sender's comm ID (0).
func (r MRA) LocalCommID() uint32 { return r.d32(0) }

// RemoteCommID is the receiver's comm ID (4).
func (r MRA) RemoteCommID() uint32 { return r.d32(4) }

// MsgMRAed is which message is acknowledged (8, bits 7-6): MRAedREQ, MRAedREP, MRAedLAP.
func (r MRA) MsgMRAed() uint8 { return r.bits(8, 0xc0) }

// ServiceTimeout is the time the sender needs before it answers (9, bits 7-3).
func (r MRA) ServiceTimeout() uint8 { return r.bits(9, 0xf8) }

// PrivateData is the 222-byte private data area (10).
func (r MRA) PrivateData() []byte { return r.dBytes(10, MRAPrivateDataLen) }

// SetLocalCommID writes the sender's comm ID.
func (r MRA) SetLocalCommID(v uint32) { r.setD32(0, v) }

// SetRemoteCommID writes the receiver's comm ID.
func (r MRA) SetRemoteCommID(v uint32) { r.setD32(4, v) }

// SetMsgMRAed writes the 2-bit message code.
func (r MRA) SetMsgMRAed(v uint8) { r.setBits(8, 0xc0, v) }

// SetServiceTimeout writes the 5-bit service timeout.
func (r MRA) SetServiceTimeout(v uint8) { r.setBits(9, 0xf8, v) }

// SetPrivateData copies p into the private data area and zeroes the rest.
func (r MRA) SetPrivateData(p []byte) error { return setData(r.PrivateData(), p) }

// --- REJ ---

// LocalCommID is the sender's comm ID (0).
func (r REJ) LocalCommID() uint32 { return r.d32(0) }

// RemoteCommID is the receiver's comm ID (4), 0 when rejecting a REQ that gave none.
func (r REJ) RemoteCommID() uint32 { return r.d32(4) }

// MsgRejected is which message is rejected (8, bits 7-6): RejectedREQ, RejectedREP, RejectedOther.
func (r REJ) MsgRejected() uint8 { return r.bits(8, 0xc0) }

// ARILength is the length of the additional rejection information (9, bits 7-1).
func (r REJ) ARILength() uint8 { return r.bits(9, 0xfe) }

// Reason is the rejection reason (10).
func (r REJ) Reason() RejReason { return RejReason(r.d16(10)) }

// ARI is the additional rejection information, ARILength bytes (12), at most 72.
func (r REJ) ARI() []byte { return r.dBytes(12, min(int(r.ARILength()), ARILen)) }

// PrivateData is the 148-byte private data area (84).
func (r REJ) PrivateData() []byte { return r.dBytes(84, REJPrivateDataLen) }

// SetLocalCommID writes the sender's comm ID.
func (r REJ) SetLocalCommID(v uint32) { r.setD32(0, v) }

// SetRemoteCommID writes the receiver's comm ID.
func (r REJ) SetRemoteCommID(v uint32) { r.setD32(4, v) }

// SetMsgRejected writes the 2-bit message code.
func (r REJ) SetMsgRejected(v uint8) { r.setBits(8, 0xc0, v) }

// SetARILength writes the 7-bit ARI length alone (SetARI sets it too).
func (r REJ) SetARILength(v uint8) { r.setBits(9, 0xfe, v) }

// SetReason writes the rejection reason.
func (r REJ) SetReason(v RejReason) { r.setD16(10, uint16(v)) }

// SetARI copies p into the ARI area, zeroes the rest and sets ARILength.
func (r REJ) SetARI(p []byte) error {
	if err := setData(r.dBytes(12, ARILen), p); err != nil {
		return err
	}
	r.SetARILength(uint8(len(p)))
	return nil
}

// SetPrivateData copies p into the private data area and zeroes the rest.
func (r REJ) SetPrivateData(p []byte) error { return setData(r.PrivateData(), p) }

// --- REP ---

// LocalCommID is the sender's comm ID (0).
func (r REP) LocalCommID() uint32 { return r.d32(0) }

// RemoteCommID is the requester's comm ID (4).
func (r REP) RemoteCommID() uint32 { return r.d32(4) }

// LocalQKey is the sender's Q_Key, for RD (8).
func (r REP) LocalQKey() uint32 { return r.d32(8) }

// LocalQPN is the sender's QP number (12, 24 bits).
func (r REP) LocalQPN() uint32 { return r.d24(12) }

// LocalEECN is the sender's EE context (16, 24 bits).
func (r REP) LocalEECN() uint32 { return r.d24(16) }

// StartingPSN is the first PSN the sender will send (20, 24 bits).
func (r REP) StartingPSN() uint32 { return r.d24(20) }

// ResponderResources is byte 24.
func (r REP) ResponderResources() uint8 { return r.d8(24) }

// InitiatorDepth is byte 25.
func (r REP) InitiatorDepth() uint8 { return r.d8(25) }

// TargetAckDelay is the sender's ACK delay (26, bits 7-3).
func (r REP) TargetAckDelay() uint8 { return r.bits(26, 0xf8) }

// FailoverAccepted is the alternate path answer (26, bits 2-1).
func (r REP) FailoverAccepted() uint8 { return r.bits(26, 0x06) }

// E2EFlowControl is the end-to-end flow control bit (26, bit 0).
func (r REP) E2EFlowControl() bool { return r.flag(26, 0x01) }

// RNRRetryCount is the RNR retry count (27, bits 7-5).
func (r REP) RNRRetryCount() uint8 { return r.bits(27, 0xe0) }

// SRQ says the sender's QP uses an SRQ (27, bit 4).
func (r REP) SRQ() bool { return r.flag(27, 0x10) }

// LocalCAGUID is the sender's CA GUID (28).
func (r REP) LocalCAGUID() uint64 { return r.d64(28) }

// PrivateData is the 196-byte private data area (36).
func (r REP) PrivateData() []byte { return r.dBytes(36, REPPrivateDataLen) }

// SetLocalCommID writes the sender's comm ID.
func (r REP) SetLocalCommID(v uint32) { r.setD32(0, v) }

// SetRemoteCommID writes the requester's comm ID.
func (r REP) SetRemoteCommID(v uint32) { r.setD32(4, v) }

// SetLocalQKey writes the Q_Key.
func (r REP) SetLocalQKey(v uint32) { r.setD32(8, v) }

// SetLocalQPN writes the 24-bit QPN.
func (r REP) SetLocalQPN(v uint32) { r.setD24(12, v) }

// SetLocalEECN writes the 24-bit EECN.
func (r REP) SetLocalEECN(v uint32) { r.setD24(16, v) }

// SetStartingPSN writes the 24-bit PSN.
func (r REP) SetStartingPSN(v uint32) { r.setD24(20, v) }

// SetResponderResources writes byte 24.
func (r REP) SetResponderResources(v uint8) { r.setD8(24, v) }

// SetInitiatorDepth writes byte 25.
func (r REP) SetInitiatorDepth(v uint8) { r.setD8(25, v) }

// SetTargetAckDelay writes the 5-bit ACK delay.
func (r REP) SetTargetAckDelay(v uint8) { r.setBits(26, 0xf8, v) }

// SetFailoverAccepted writes the 2-bit failover code.
func (r REP) SetFailoverAccepted(v uint8) { r.setBits(26, 0x06, v) }

// SetE2EFlowControl writes the flow control bit.
func (r REP) SetE2EFlowControl(v bool) { r.setFlag(26, 0x01, v) }

// SetRNRRetryCount writes the 3-bit RNR retry count.
func (r REP) SetRNRRetryCount(v uint8) { r.setBits(27, 0xe0, v) }

// SetSRQ writes the SRQ bit.
func (r REP) SetSRQ(v bool) { r.setFlag(27, 0x10, v) }

// SetLocalCAGUID writes the CA GUID.
func (r REP) SetLocalCAGUID(v uint64) { r.setD64(28, v) }

// SetPrivateData copies p into the private data area and zeroes the rest.
func (r REP) SetPrivateData(p []byte) error { return setData(r.PrivateData(), p) }

// --- RTU ---

// LocalCommID is the sender's comm ID (0).
func (r RTU) LocalCommID() uint32 { return r.d32(0) }

// RemoteCommID is the receiver's comm ID (4).
func (r RTU) RemoteCommID() uint32 { return r.d32(4) }

// PrivateData is the 224-byte private data area (8).
func (r RTU) PrivateData() []byte { return r.dBytes(8, RTUPrivateDataLen) }

// SetLocalCommID writes the sender's comm ID.
func (r RTU) SetLocalCommID(v uint32) { r.setD32(0, v) }

// SetRemoteCommID writes the receiver's comm ID.
func (r RTU) SetRemoteCommID(v uint32) { r.setD32(4, v) }

// SetPrivateData copies p into the private data area and zeroes the rest.
func (r RTU) SetPrivateData(p []byte) error { return setData(r.PrivateData(), p) }

// --- DREQ ---

// LocalCommID is the sender's comm ID (0).
func (r DREQ) LocalCommID() uint32 { return r.d32(0) }

// RemoteCommID is the receiver's comm ID (4).
func (r DREQ) RemoteCommID() uint32 { return r.d32(4) }

// RemoteQPN is the receiver's QPN (or EECN) of the connection (8, 24 bits).
func (r DREQ) RemoteQPN() uint32 { return r.d24(8) }

// PrivateData is the 220-byte private data area (12).
func (r DREQ) PrivateData() []byte { return r.dBytes(12, DREQPrivateDataLen) }

// SetLocalCommID writes the sender's comm ID.
func (r DREQ) SetLocalCommID(v uint32) { r.setD32(0, v) }

// SetRemoteCommID writes the receiver's comm ID.
func (r DREQ) SetRemoteCommID(v uint32) { r.setD32(4, v) }

// SetRemoteQPN writes the 24-bit QPN.
func (r DREQ) SetRemoteQPN(v uint32) { r.setD24(8, v) }

// SetPrivateData copies p into the private data area and zeroes the rest.
func (r DREQ) SetPrivateData(p []byte) error { return setData(r.PrivateData(), p) }

// --- DREP ---

// LocalCommID is the sender's comm ID (0).
func (r DREP) LocalCommID() uint32 { return r.d32(0) }

// RemoteCommID is the receiver's comm ID (4).
func (r DREP) RemoteCommID() uint32 { return r.d32(4) }

// PrivateData is the 224-byte private data area (8).
func (r DREP) PrivateData() []byte { return r.dBytes(8, DREPPrivateDataLen) }

// SetLocalCommID writes the sender's comm ID.
func (r DREP) SetLocalCommID(v uint32) { r.setD32(0, v) }

// SetRemoteCommID writes the receiver's comm ID.
func (r DREP) SetRemoteCommID(v uint32) { r.setD32(4, v) }

// SetPrivateData copies p into the private data area and zeroes the rest.
func (r DREP) SetPrivateData(p []byte) error { return setData(r.PrivateData(), p) }

// --- LAP and APR (comm IDs and status only) ---

// LocalCommID is the sender's comm ID (0).
func (r LAP) LocalCommID() uint32 { return r.d32(0) }

// RemoteCommID is the receiver's comm ID (4).
func (r LAP) RemoteCommID() uint32 { return r.d32(4) }

// RemoteQPN is the receiver's QPN or EECN (12, 24 bits).
func (r LAP) RemoteQPN() uint32 { return r.d24(12) }

// LocalCommID is the sender's comm ID (0).
func (r APR) LocalCommID() uint32 { return r.d32(0) }

// RemoteCommID is the receiver's comm ID (4).
func (r APR) RemoteCommID() uint32 { return r.d32(4) }

// InfoLength is the additional information length (8).
func (r APR) InfoLength() uint8 { return r.d8(8) }

// APStatus is the alternate path status (9).
func (r APR) APStatus() uint8 { return r.d8(9) }

// --- SIDR_REQ ---

// RequestID is the sender's request ID (0).
func (r SIDRREQ) RequestID() uint32 { return r.d32(0) }

// PKey is the partition key (4).
func (r SIDRREQ) PKey() uint16 { return r.d16(4) }

// ServiceID is the service to resolve (8).
func (r SIDRREQ) ServiceID() ServiceID { return ServiceID(r.d64(8)) }

// PrivateData is the 216-byte private data area (16); rdma_cm puts a
// cma_hdr at its head.
func (r SIDRREQ) PrivateData() []byte { return r.dBytes(16, SIDRREQPrivateDataLen) }

// CMAHeader is the cma_hdr at the head of the private data.
func (r SIDRREQ) CMAHeader() CMAHeader { return CMAHeader(r.dBytes(16, CMAHeaderLen)) }

// SetRequestID writes the request ID.
func (r SIDRREQ) SetRequestID(v uint32) { r.setD32(0, v) }

// SetPKey writes the partition key.
func (r SIDRREQ) SetPKey(v uint16) { r.setD16(4, v) }

// SetServiceID writes the service ID.
func (r SIDRREQ) SetServiceID(v ServiceID) { r.setD64(8, uint64(v)) }

// SetPrivateData copies p into the private data area and zeroes the rest.
func (r SIDRREQ) SetPrivateData(p []byte) error { return setData(r.PrivateData(), p) }

// --- SIDR_REP ---

// RequestID echoes the SIDR_REQ's request ID (0).
func (r SIDRREP) RequestID() uint32 { return r.d32(0) }

// Status is the resolution status (4): SIDRSuccess...
func (r SIDRREP) Status() uint8 { return r.d8(4) }

// InfoLength is the additional information length (5).
func (r SIDRREP) InfoLength() uint8 { return r.d8(5) }

// QPN is the UD QP serving the service (8, 24 bits).
func (r SIDRREP) QPN() uint32 { return r.d24(8) }

// ServiceID echoes the resolved service ID (12).
func (r SIDRREP) ServiceID() ServiceID { return ServiceID(r.d64(12)) }

// QKey is the Q_Key of that QP (20).
func (r SIDRREP) QKey() uint32 { return r.d32(20) }

// Info is the additional information (ClassPortInfo on redirect), InfoLength bytes (24).
func (r SIDRREP) Info() []byte { return r.dBytes(24, min(int(r.InfoLength()), ARILen)) }

// PrivateData is the 136-byte private data area (96).
func (r SIDRREP) PrivateData() []byte { return r.dBytes(96, SIDRREPPrivateDataLen) }

// SetRequestID writes the request ID.
func (r SIDRREP) SetRequestID(v uint32) { r.setD32(0, v) }

// SetStatus writes the status.
func (r SIDRREP) SetStatus(v uint8) { r.setD8(4, v) }

// SetQPN writes the 24-bit QPN.
func (r SIDRREP) SetQPN(v uint32) { r.setD24(8, v) }

// SetServiceID writes the service ID.
func (r SIDRREP) SetServiceID(v ServiceID) { r.setD64(12, uint64(v)) }

// SetQKey writes the Q_Key.
func (r SIDRREP) SetQKey(v uint32) { r.setD32(20, v) }

// SetInfo copies p into the additional information area, zeroes the rest
// and sets InfoLength.
func (r SIDRREP) SetInfo(p []byte) error {
	if err := setData(r.dBytes(24, ARILen), p); err != nil {
		return err
	}
	r.setD8(5, uint8(len(p)))
	return nil
}

// SetPrivateData copies p into the private data area and zeroes the rest.
func (r SIDRREP) SetPrivateData(p []byte) error { return setData(r.PrivateData(), p) }
