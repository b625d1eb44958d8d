// Package inspect decodes and verifies RoCE captures: every frame of a pcap
// or pcapng file becomes a Record (addresses, BTH, extended headers, payload
// length, ICRC verdict), records add up to a per-connection Summary, and
// writers render them as one line per packet, as a field tree with frame
// offsets, or as JSON Lines.
//
// Decoding follows the lengths the headers give (UDP length for RoCEv2, GRH
// PayLen for RoCEv1), so Ethernet padding and FCS bytes are ignored, and a
// frame cut by the capture's snap length is reported as "truncated" rather
// than as an ICRC failure. The ICRC is checked with package icrc (IBTA annex
// A17); Wireshark shows the ICRC but never checks it.
package inspect

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/icrc"
)

// Record is one decoded frame. Non-RoCE frames have RoCE == false and only
// the capture fields set. Optional headers are nil when the opcode does not
// carry them.
type Record struct {
	File      string    `json:"file,omitempty"` // set by callers that read several files
	Frame     int       `json:"frame"`          // 1-based position in its file
	Time      time.Time `json:"time"`
	CapLen    int       `json:"cap_len"`  // bytes captured
	WireLen   int       `json:"wire_len"` // bytes on the wire
	Interface int       `json:"interface,omitempty"`
	RoCE      bool      `json:"-"`

	Transport string     `json:"transport"` // "RoCEv2", "RoCEv1", or "RoCE" when malformed headers hide which
	VLAN      []uint16   `json:"vlan,omitempty"`
	Src       netip.Addr `json:"src"` // IP source, or source GID for RoCEv1
	Dst       netip.Addr `json:"dst"`
	SrcPort   uint16     `json:"src_port"` // 0 for RoCEv1
	DstPort   uint16     `json:"dst_port"`
	// ECN is the ECN field of the IP header (or GRH): 0 not
	// ECN-capable, 2 ECT(0), 1 ECT(1), 3 CE, a switch's congestion
	// mark (RFC 3168). The ICRC does not cover it.
	ECN uint8 `json:"ecn,omitempty"`

	Opcode     uint8  `json:"opcode"`
	OpcodeName string `json:"opcode_name"`
	SE         bool   `json:"se"`
	MigReq     bool   `json:"mig_req"`
	PadCnt     int    `json:"pad_cnt"`
	TVer       uint8  `json:"tver"`
	PKey       uint16 `json:"pkey"`
	FECN       bool   `json:"fecn"`
	BECN       bool   `json:"becn"`
	DestQP     uint32 `json:"dest_qp"`
	AckReq     bool   `json:"ack_req"`
	PSN        uint32 `json:"psn"`

	RDETH     *RDETH     `json:"rdeth,omitempty"`
	DETH      *DETH      `json:"deth,omitempty"`
	XRCETH    *XRCETH    `json:"xrceth,omitempty"`
	FETH      *FETH      `json:"feth,omitempty"`
	RETH      *RETH      `json:"reth,omitempty"`
	AtomicETH *AtomicETH `json:"atomic_eth,omitempty"`
	AETH      *AETH      `json:"aeth,omitempty"`
	AtomicAck *AtomicAck `json:"atomic_ack_eth,omitempty"`
	Imm       *uint32    `json:"imm,omitempty"` // immediate data as read (big-endian)
	IETH      *IETH      `json:"ieth,omitempty"`

	// CM is the connection management MAD of a UD SEND to QP1.
	CM *CM `json:"cm,omitempty"`

	PayloadLen int `json:"payload_len"` // from the length fields; known even when truncated

	ICRC         string `json:"icrc"` // "ok", "bad" or "truncated"
	ICRCComputed uint32 `json:"icrc_computed,omitempty"`
	ICRCWire     uint32 `json:"icrc_wire,omitempty"`

	// Malformed explains why the transport headers could not be decoded
	// (short packet, PadCnt beyond the payload, reserved opcode, ...).
	Malformed string `json:"malformed,omitempty"`

	// Data is the frame as captured; Loc locates the packet in it.
	Data     []byte          `json:"-"`
	LinkType layers.LinkType `json:"-"`
	Base     int             `json:"-"` // Loc's offsets count from Data[Base:]
	Loc      icrc.Result     `json:"-"`
}

// RDETH holds the Reliable Datagram ETH fields.
type RDETH struct {
	EEContext uint32 `json:"ee_context"`
}

// DETH holds the Datagram ETH fields.
type DETH struct {
	QKey  uint32 `json:"qkey"`
	SrcQP uint32 `json:"src_qp"`
}

// XRCETH holds the XRC ETH fields.
type XRCETH struct {
	XRCSRQ uint32 `json:"xrc_srq"`
}

// FETH holds the FLUSH ETH fields (IBTA 1.5 annex A19).
type FETH struct {
	Placement   uint8 `json:"placement_type"`
	Selectivity uint8 `json:"selectivity"`
}

// RETH holds the RDMA ETH fields.
type RETH struct {
	VA     uint64 `json:"va"`
	RKey   uint32 `json:"rkey"`
	DMALen uint32 `json:"dma_len"`
}

// AtomicETH holds the Atomic ETH fields.
type AtomicETH struct {
	VA      uint64 `json:"va"`
	RKey    uint32 `json:"rkey"`
	SwapAdd uint64 `json:"swap_add"`
	Compare uint64 `json:"compare"`
}

// AETH holds the ACK ETH, with its syndrome decoded (IBTA §9.3.5).
type AETH struct {
	Syndrome uint8  `json:"syndrome"`
	Kind     string `json:"kind"` // "ACK", "RNR_NAK", "NAK" or "reserved"
	// Credits is the ACK credit count, -1 for "unlimited" (code 31).
	Credits *int `json:"credits,omitempty"`
	// RNRTimerUS is the RNR NAK's timer in microseconds.
	RNRTimer   *uint8 `json:"rnr_timer,omitempty"`
	RNRTimerUS *int64 `json:"rnr_timer_us,omitempty"`
	NAKCode    *uint8 `json:"nak_code,omitempty"`
	NAKName    string `json:"nak,omitempty"`
	MSN        uint32 `json:"msn"`
	Text       string `json:"text"` // as bth.Syndrome.String
}

// AtomicAck holds the Atomic ACK ETH.
type AtomicAck struct {
	Orig uint64 `json:"orig"`
}

// IETH holds the Invalidate ETH.
type IETH struct {
	RKey uint32 `json:"rkey"`
}

// Decode decodes one Ethernet frame. The caller sets Frame.
func Decode(frame []byte, ci gopacket.CaptureInfo) Record {
	return DecodeLink(layers.LinkTypeEthernet, frame, ci)
}

// DecodeLink decodes one frame of the given link type: Ethernet, Linux
// cooked (SLL, SLL2) and raw IP (101, 228, 229) captures are understood.
// Other link types give a non-RoCE record.
func DecodeLink(lt layers.LinkType, frame []byte, ci gopacket.CaptureInfo) Record {
	var r Record
	decodeLink(&r, new(headerStore), lt, frame, ci.Timestamp, ci.Length, ci.InterfaceIndex)
	return r
}

// headerStore holds what a Record's optional headers point to, so that a
// decoder that reuses records does not allocate for each packet.
type headerStore struct {
	rdeth     RDETH
	deth      DETH
	xrceth    XRCETH
	feth      FETH
	reth      RETH
	atomicETH AtomicETH
	aeth      AETH
	atomicAck AtomicAck
	ieth      IETH
	imm       uint32
	credits   int
	rnrTimer  uint8
	rnrUS     int64
	nakCode   uint8
	vlan      [icrc.MaxVLANTags]uint16
}

// decodeLink overwrites *r with the decoding of frame; its optional
// headers point into st, which must not be shared with a record still in
// use.
func decodeLink(r *Record, st *headerStore, lt layers.LinkType, frame []byte, ts time.Time, wireLen, iface int) {
	*r = Record{Time: ts, CapLen: len(frame), WireLen: wireLen, Interface: iface, Data: frame, LinkType: lt}
	if r.WireLen < r.CapLen {
		r.WireLen = r.CapLen
	}
	var (
		res icrc.Result
		err error
		off int
	)
	switch lt {
	case layers.LinkTypeEthernet:
		res, err = icrc.CheckFrame(frame)
	case layers.LinkTypeLinuxSLL:
		// 16-byte cooked header, protocol type in the last two bytes.
		if len(frame) < 16 {
			return
		}
		off = 16
		res, err = icrc.CheckL3(binary.BigEndian.Uint16(frame[14:]), frame[off:])
	case layers.LinkTypeLinuxSLL2:
		// 20-byte cooked header, protocol type first.
		if len(frame) < 20 {
			return
		}
		off = 20
		res, err = icrc.CheckL3(binary.BigEndian.Uint16(frame[0:]), frame[off:])
	case layers.LinkTypeRaw, layers.LinkTypeIPv4, layers.LinkTypeIPv6, 12, 14:
		// 12 and 14 are raw IP on some platforms (DLT_RAW/DLT_C_HDLC vary).
		if len(frame) == 0 {
			return
		}
		et := uint16(icrc.EtherTypeIPv4)
		if frame[0]>>4 == 6 {
			et = icrc.EtherTypeIPv6
		}
		res, err = icrc.CheckL3(et, frame)
	default:
		return
	}
	if errors.Is(err, icrc.ErrNotRoCE) {
		return
	}
	if err != nil {
		var fe *icrc.FrameError
		if !errors.As(err, &fe) || fe.Kind == 0 {
			// Cut or broken before anything said RoCE (UDP port 4791 or
			// EtherType 0x8915): ordinary traffic as far as we can tell.
			return
		}
		r.RoCE, r.Transport = true, fe.Kind.String()
		if fe.Truncated {
			r.ICRC = "truncated"
			return
		}
		// Headers that claim RoCE but cannot be followed: say why. The
		// transport is "RoCE" (not located), as callers test for it.
		r.Transport = "RoCE"
		r.Malformed = err.Error()
		r.ICRC = "bad"
		return
	}
	r.RoCE = true
	r.Base, r.Loc = off, res
	r.fill(frame[off:], &res, st)
}

// fill decodes addresses, BTH and extended headers of a located packet.
func (r *Record) fill(pkt []byte, res *icrc.Result, st *headerStore) {
	r.Transport = res.Kind.String()
	r.ICRC = res.Status.String()
	r.ICRCComputed, r.ICRCWire = res.Computed, res.Wire
	if n := min(res.NumVLAN, icrc.MaxVLANTags); n > 0 {
		st.vlan = res.VLAN
		r.VLAN = st.vlan[:n:n]
	}
	ip := pkt[res.L3:]
	switch res.Kind {
	case icrc.KindRoCEv2IPv4:
		r.Src = netip.AddrFrom4([4]byte(ip[12:16]))
		r.Dst = netip.AddrFrom4([4]byte(ip[16:20]))
		r.ECN = ip[1] & 3
	default: // IPv6 header and GRH share the address layout
		r.Src = netip.AddrFrom16([16]byte(ip[8:24]))
		r.Dst = netip.AddrFrom16([16]byte(ip[24:40]))
		r.ECN = ip[1] >> 4 & 3 // the traffic class's low bits
	}
	if res.UDP >= 0 {
		u := pkt[res.UDP:]
		r.SrcPort = binary.BigEndian.Uint16(u[0:])
		r.DstPort = binary.BigEndian.Uint16(u[2:])
	}
	end := min(res.End, len(pkt))
	roce := pkt[res.BTH:end]
	var p bth.Packet
	var err error
	if res.Status == icrc.StatusTruncated {
		err = bth.ParseHeaders(&p, roce)
	} else {
		err = bth.Parse(&p, roce)
	}
	if p.BTH != nil {
		f := p.BTH.Fields()
		r.Opcode, r.OpcodeName = uint8(f.Opcode), f.Opcode.String()
		r.SE, r.MigReq, r.PadCnt, r.TVer, r.PKey = f.SE, f.MigReq, f.PadCnt, f.TVer, f.PKey
		r.FECN, r.BECN, r.DestQP, r.AckReq, r.PSN = f.FECN, f.BECN, f.DestQP, f.AckReq, f.PSN
		// The payload length follows from the length fields, so it is
		// known even when the capture stops early (as rxe computes it).
		r.PayloadLen = max(0, res.End-res.BTH-p.Info.HdrLen-f.PadCnt-bth.ICRCLen)
	}
	if err != nil {
		// A capture that stops inside the BTH or the extended headers is
		// cut by its snap length, not malformed: show what was captured.
		if res.Status == icrc.StatusTruncated && (errors.Is(err, bth.ErrKindShort) || errors.Is(err, bth.ErrKindMissingHeader)) {
			return
		}
		r.Malformed = err.Error()
		if p.BTH == nil || !p.Info.Valid {
			return
		}
	}
	r.setHeaders(&p, st)
	if res.Status != icrc.StatusTruncated && isCM(&p) {
		r.CM = decodeCM(p.Payload)
	}
}

func (r *Record) setHeaders(p *bth.Packet, st *headerStore) {
	if p.RDETH != nil {
		st.rdeth = RDETH{EEContext: p.RDETH.EEContext()}
		r.RDETH = &st.rdeth
	}
	if p.DETH != nil {
		st.deth = DETH{QKey: p.DETH.QKey(), SrcQP: p.DETH.SrcQP()}
		r.DETH = &st.deth
	}
	if p.XRCETH != nil {
		st.xrceth = XRCETH{XRCSRQ: p.XRCETH.XRCSRQ()}
		r.XRCETH = &st.xrceth
	}
	if p.FETH != nil {
		st.feth = FETH{Placement: p.FETH.PlacementType(), Selectivity: p.FETH.Selectivity()}
		r.FETH = &st.feth
	}
	if p.RETH != nil {
		st.reth = RETH{VA: p.RETH.VA(), RKey: p.RETH.RKey(), DMALen: p.RETH.DMALen()}
		r.RETH = &st.reth
	}
	if p.AtomicETH != nil {
		st.atomicETH = AtomicETH{VA: p.AtomicETH.VA(), RKey: p.AtomicETH.RKey(), SwapAdd: p.AtomicETH.SwapAdd(), Compare: p.AtomicETH.Compare()}
		r.AtomicETH = &st.atomicETH
	}
	if p.AETH != nil {
		r.AETH = decodeAETH(p.AETH, st)
	}
	if p.AtomicAckETH != nil {
		st.atomicAck = AtomicAck{Orig: p.AtomicAckETH.Orig()}
		r.AtomicAck = &st.atomicAck
	}
	if p.ImmDt != nil {
		st.imm = p.ImmDt.Imm()
		r.Imm = &st.imm
	}
	if p.IETH != nil {
		st.ieth = IETH{RKey: p.IETH.RKey()}
		r.IETH = &st.ieth
	}
}

// syndromeText and nakNames are bth.Syndrome.String and bth.NAKName for
// every byte, made once: both format strings.
var syndromeText, nakNames = func() (t, n [256]string) {
	for i := range 256 {
		t[i], n[i] = bth.Syndrome(i).String(), bth.NAKName(uint8(i))
	}
	return
}()

func decodeAETH(h bth.AETH, st *headerStore) *AETH {
	s := h.Syndrome()
	a := &st.aeth
	*a = AETH{Syndrome: uint8(s), MSN: h.MSN(), Text: syndromeText[uint8(s)]}
	v := s.Value()
	switch s.Type() {
	case bth.SynACK:
		a.Kind = "ACK"
		st.credits = s.Credits()
		a.Credits = &st.credits
	case bth.SynRNRNAK:
		a.Kind = "RNR_NAK"
		st.rnrTimer, st.rnrUS = v, bth.RNRTimer(v).Microseconds()
		a.RNRTimer, a.RNRTimerUS = &st.rnrTimer, &st.rnrUS
	case bth.SynNAK:
		a.Kind = "NAK"
		st.nakCode = v
		a.NAKCode, a.NAKName = &st.nakCode, nakNames[v]
	default:
		a.Kind = "reserved"
	}
	return a
}

// Located reports whether the transport packet was found in the frame
// (false for malformed or cut IP/UDP/GRH headers): only then are the BTH
// fields and Loc meaningful.
func (r *Record) Located() bool { return r.Loc.Kind != 0 }

// Bad reports whether the record counts against --strict: an ICRC
// mismatch or a malformed RoCE packet.
func (r *Record) Bad() bool {
	return r.RoCE && (r.ICRC == "bad" || r.Malformed != "")
}
