package verbs

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"sync/atomic"

	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/qpstate"
	"github.com/softroce/softroce/transport/ud"
	"github.com/softroce/softroce/wr"
)

// UD constants.
const (
	// GRHLen is the room a UD receive buffer must leave at its head for
	// the 40-byte GRH: a UD receive completes with ByteLen = GRHLen plus
	// the payload, as with libibverbs.
	GRHLen = ud.GRHLen
	// GSIQKey is the Q_Key of QP1 (IB_QP1_QKEY), where management
	// datagrams go: send to RemoteQPN 1 with RemoteQKey GSIQKey.
	GSIQKey = ud.GSIQKey
)

// Work completion flags (enum ibv_wc_flags), re-exported: a UD receive
// has WCFlagGRH, and WCFlagWithImm when it carried immediate data.
const (
	WCFlagGRH     = cq.FlagGRH
	WCFlagWithImm = cq.FlagWithImm
	WCFlagWithInv = cq.FlagWithInv
)

// AHAttr are an address handle's attributes on RoCEv2 (struct ibv_ah_attr
// with is_global set; the GRH fields are what RoCEv2 uses).
type AHAttr struct {
	DGID         GID    // destination GID (IPv4-mapped for IPv4)
	SGIDIndex    int    // index of the source GID in the port's GID table
	FlowLabel    uint32 // 20 bits; a non-zero flow label picks the UDP source port
	HopLimit     uint8  // the IPv4 TTL or IPv6 hop limit of its packets (0: the link's default)
	TrafficClass uint8  // their IPv4 TOS (DSCP and ECN) or IPv6 traffic class
	SL           uint8  // service level, 0..15
}

// AH is an address handle (struct ibv_ah): where a UD send goes. A send
// work request names it as SendWR{AH: ah.AV(), RemoteQPN: ..., RemoteQKey:
// ...}, the Go form of wr.ud.ah, wr.ud.remote_qpn and wr.ud.remote_qkey.
type AH struct {
	pd        *PD
	attr      AHAttr
	av        wr.AH
	destroyed atomic.Bool
}

// CreateAH creates an address handle (ibv_create_ah). It checks what
// ibv_create_ah checks on RoCE: the source GID index exists, the
// destination GID is set and of the source GID's family (IPv4-mapped or
// IPv6), the flow label fits 20 bits and the SL 4.
func (pd *PD) CreateAH(attr AHAttr) (*AH, error) {
	d := pd.d
	if err := d.unusable("create AH"); err != nil {
		return nil, err
	}
	switch {
	case attr.SGIDIndex < 0 || attr.SGIDIndex >= len(d.gids):
		return nil, fmt.Errorf("verbs: create AH: sgid_index %d out of range (GID table has %d entries)", attr.SGIDIndex, len(d.gids))
	case attr.DGID == GID{}:
		return nil, fmt.Errorf("verbs: create AH: the destination GID is zero")
	case attr.FlowLabel > 0xfffff:
		return nil, fmt.Errorf("verbs: create AH: flow label %#x does not fit 20 bits", attr.FlowLabel)
	case attr.SL > 15:
		return nil, fmt.Errorf("verbs: create AH: SL %d above 15", attr.SL)
	}
	src, dst := d.gids[attr.SGIDIndex].Addr, attr.DGID.Addr()
	if src.Is4() != dst.Is4() {
		return nil, fmt.Errorf("verbs: create AH: destination GID %v and source GID %d (%v) are of different IP families", attr.DGID, attr.SGIDIndex, src)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if pd.dead {
		return nil, fmt.Errorf("verbs: create AH: PD %d is deallocated", pd.pd.Handle())
	}
	pd.nAH++
	return &AH{pd: pd, attr: attr, av: wr.AH{Remote: dst, Local: src, FlowLabel: attr.FlowLabel,
		HopLimit: attr.HopLimit, TrafficClass: attr.TrafficClass, SL: attr.SL}}, nil
}

// AV is the address vector a UD send work request carries in SendWR.AH.
// The transport copies it when the work request is posted.
func (ah *AH) AV() *wr.AH { return &ah.av }

// Attr returns the attributes the AH was created with (ibv_query_ah).
func (ah *AH) Attr() AHAttr { return ah.attr }

// Destroy frees the address handle (ibv_destroy_ah). Work requests
// already posted with it are not affected.
func (ah *AH) Destroy() error {
	d := ah.pd.d
	if err := d.isClosed("destroy AH"); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if ah.destroyed.Swap(true) {
		return fmt.Errorf("verbs: destroy AH: already destroyed")
	}
	ah.pd.nAH--
	return nil
}

// ReadyUD moves a UD QP from RESET through INIT and RTR to RTS with Q_Key
// qkey and send PSN sqPSN (pkey_index 0, port 1), the three ibv_modify_qp
// calls of a UD program such as ibv_ud_pingpong.
func (qp *QP) ReadyUD(qkey, sqPSN uint32) error {
	if qp.init.Type != QPTypeUD {
		return fmt.Errorf("verbs: ReadyUD on a %v QP", qp.init.Type)
	}
	steps := []struct {
		attr QPAttr
		mask AttrMask
	}{
		{QPAttr{State: StateInit, Port: 1, QKey: qkey}, qpstate.AttrState | qpstate.AttrPKeyIndex | qpstate.AttrPort | qpstate.AttrQKey},
		{QPAttr{State: StateRTR}, qpstate.AttrState},
		{QPAttr{State: StateRTS, SQPSN: sqPSN}, qpstate.AttrState | qpstate.AttrSQPSN},
	}
	for _, s := range steps {
		if err := qp.Modify(&s.attr, s.mask); err != nil {
			return err
		}
	}
	return nil
}

// CreateGSI creates the device's QP1, the General Services Interface QP
// that management datagrams (the connection manager's MADs) use, and
// brings it to RTS: a UD QP numbered 1 with Q_Key GSIQKey (0x80010000),
// which accepts only datagrams carrying that Q_Key. A device has at most
// one: a second CreateGSI fails with an error matching ErrBusy until QP1
// is destroyed. MADs are sent to RemoteQPN 1 (QP1 sends every datagram
// with Q_Key GSIQKey, whatever the work request's RemoteQKey, as rxe does)
// and received into buffers of GRHLen + 256 bytes; the sender's address is
// in the GRH (AHAttrFromWC builds the answer's address handle). Zero
// capacities get CreateQP's defaults.
func (d *Device) CreateGSI(pd *PD, sendCQ, recvCQ *CQ, c QPCap) (*QP, error) {
	if pd == nil || pd.d != d {
		return nil, fmt.Errorf("verbs: create GSI QP: the PD is not of device %s", d.name)
	}
	qp, err := pd.createQP(QPInitAttr{Type: QPTypeUD, SendCQ: sendCQ, RecvCQ: recvCQ, Cap: c}, true)
	if err != nil {
		return nil, err
	}
	if err := qp.ReadyUD(GSIQKey, 0); err != nil {
		qp.Destroy()
		return nil, err
	}
	return qp, nil
}

// AHAttrFromWC builds the attributes of an address handle back to the
// sender of a UD receive (ibv_init_ah_from_wc): grh is the first GRHLen
// bytes of the receive buffer. The destination is the GRH's source, the
// source GID index the one of the GRH's destination, the traffic class
// (and, for IPv6, the flow label) as received, hop limit 0xFF as
// libibverbs sets it.
func (d *Device) AHAttrFromWC(wc *WC, grh []byte) (AHAttr, error) {
	if wc.Flags&WCFlagGRH == 0 {
		return AHAttr{}, fmt.Errorf("verbs: AH from WC: the completion has no GRH (not a UD receive)")
	}
	if len(grh) < GRHLen {
		return AHAttr{}, fmt.Errorf("verbs: AH from WC: GRH is %d bytes, have %d", GRHLen, len(grh))
	}
	var src, dst netip.Addr
	var tclass uint8
	var fl uint32
	switch {
	case grh[0]>>4 == 6:
		src, dst = netip.AddrFrom16([16]byte(grh[8:24])).Unmap(), netip.AddrFrom16([16]byte(grh[24:40])).Unmap()
		v := binary.BigEndian.Uint32(grh[0:])
		tclass, fl = uint8(v>>20), v&0xfffff
	case grh[20]>>4 == 4:
		src, dst = netip.AddrFrom4([4]byte(grh[32:36])), netip.AddrFrom4([4]byte(grh[36:40]))
		tclass = grh[21]
	default:
		return AHAttr{}, fmt.Errorf("verbs: AH from WC: the GRH holds neither an IPv4 nor an IPv6 header")
	}
	for i, g := range d.gids {
		if g.Addr == dst {
			return AHAttr{DGID: GIDFromAddr(src), SGIDIndex: i, FlowLabel: fl, HopLimit: 0xff, TrafficClass: tclass, SL: wc.SL}, nil
		}
	}
	return AHAttr{}, fmt.Errorf("verbs: AH from WC: the datagram was sent to %v, which is not in the GID table", dst)
}

// CreateAHFromWC creates an address handle back to the sender of a UD
// receive (ibv_create_ah_from_wc); see AHAttrFromWC.
func (pd *PD) CreateAHFromWC(wc *WC, grh []byte) (*AH, error) {
	a, err := pd.d.AHAttrFromWC(wc, grh)
	if err != nil {
		return nil, err
	}
	return pd.CreateAH(a)
}
