package inspect

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/bth/mad"
)

// CM is a connection management MAD carried by a UD SEND to QP1 with Q_Key
// 0x80010000 (IBTA §12, §13.4), decoded. Fields a message does not carry
// are omitted.
type CM struct {
	Message string `json:"message"` // "REQ", "REP", ... as mad.AttrID.String
	AttrID  uint16 `json:"attr_id"`
	Method  string `json:"method"`
	Status  uint16 `json:"status"`
	TID     uint64 `json:"tid"`

	LocalCommID  *uint32 `json:"local_comm_id,omitempty"`
	RemoteCommID *uint32 `json:"remote_comm_id,omitempty"`
	RequestID    *uint32 `json:"request_id,omitempty"` // SIDR

	ServiceID *uint64 `json:"service_id,omitempty"`
	PortSpace string  `json:"port_space,omitempty"` // rdma_cm service IDs: "RDMA_PS_TCP"
	Port      *uint16 `json:"port,omitempty"`

	// QPN is the sender's QP (REQ, REP), the receiver's (DREQ) or the
	// resolved one (SIDR_REP).
	QPN                *uint32 `json:"qpn,omitempty"`
	QKey               *uint32 `json:"qkey,omitempty"` // SIDR_REP
	StartingPSN        *uint32 `json:"starting_psn,omitempty"`
	ResponderResources *uint8  `json:"responder_resources,omitempty"`
	InitiatorDepth     *uint8  `json:"initiator_depth,omitempty"`
	Transport          string  `json:"transport,omitempty"`      // REQ: "RC", "UC", "RD", "XRC"
	PathMTU            *int    `json:"path_mtu,omitempty"`       // REQ, in bytes (0 for a reserved code)
	RetryCount         *uint8  `json:"retry_count,omitempty"`    // REQ
	RNRRetry           *uint8  `json:"rnr_retry,omitempty"`      // REQ, REP
	CMTimeout          *uint8  `json:"cm_timeout,omitempty"`     // REQ: remote CM response timeout (4.096 µs * 2^t)
	MaxCMRetries       *uint8  `json:"max_cm_retries,omitempty"` // REQ
	SRQ                *bool   `json:"srq,omitempty"`
	LocalGID           string  `json:"primary_local_gid,omitempty"` // REQ primary path
	RemoteGID          string  `json:"primary_remote_gid,omitempty"`

	CMA *CMAHeader `json:"cma_hdr,omitempty"` // REQ, SIDR_REQ of rdma_cm

	RejReason     *uint16 `json:"rej_reason,omitempty"`
	RejReasonName string  `json:"rej_reason_name,omitempty"`
	MsgCode       *uint8  `json:"msg_code,omitempty"`        // REJ: message rejected, MRA: message MRAed (0 REQ, 1 REP, 2 other/LAP)
	ARILen        *uint8  `json:"ari_len,omitempty"`         // REJ
	ServiceTO     *uint8  `json:"service_timeout,omitempty"` // MRA
	SIDRStatus    *uint8  `json:"sidr_status,omitempty"`
	SIDRStatusStr string  `json:"sidr_status_name,omitempty"`

	// PrivateDataLen is the size of the message's private data area (after
	// the cma_hdr when there is one); PrivateDataUsed counts its bytes up
	// to the last non-zero one (the wire carries no length).
	PrivateDataLen  int `json:"private_data_len"`
	PrivateDataUsed int `json:"private_data_used"`

	// Error says why the MAD was refused (mad.Parse's error); the header
	// fields above are still shown.
	Error string `json:"error,omitempty"`

	body bool // the message's fields were decoded (the header allowed it)
}

// CMAHeader is rdma_cm's header at the head of REQ and SIDR_REQ private data.
type CMAHeader struct {
	Version   uint8      `json:"version"`
	IPVersion uint8      `json:"ip_version"`
	SrcPort   uint16     `json:"src_port"`
	Src       netip.Addr `json:"src"`
	Dst       netip.Addr `json:"dst"`
	Error     string     `json:"error,omitempty"`
}

// isCM reports whether a UD packet is addressed as CM traffic: QP1, the
// QP1 Q_Key, a MAD of the CM class.
func isCM(p *bth.Packet) bool {
	return p.DETH != nil && p.BTH.DestQP() == mad.GSIQPN && p.DETH.QKey() == mad.QP1QKey &&
		len(p.Payload) >= mad.HeaderLen && p.Payload[1] == mad.ClassCM
}

func u8p(v uint8) *uint8    { return &v }
func u16p(v uint16) *uint16 { return &v }
func u32p(v uint32) *uint32 { return &v }

var transportNames = [4]string{"RC", "UC", "RD", "XRC"}

// decodeCM decodes the MAD in a QP1 payload.
func decodeCM(payload []byte) *CM {
	m, err := mad.Parse(payload)
	if m == nil {
		c := &CM{Error: err.Error()}
		if len(payload) >= mad.HeaderLen {
			h := mad.MAD(payload[:mad.HeaderLen:mad.HeaderLen])
			c.Message, c.AttrID, c.Method, c.Status, c.TID = h.AttrID().String(), uint16(h.AttrID()), h.Method().String(), h.Status(), h.TID()
		}
		return c
	}
	c := &CM{Message: m.AttrID().String(), AttrID: uint16(m.AttrID()), Method: m.Method().String(), Status: m.Status(), TID: m.TID()}
	if err != nil {
		c.Error = err.Error()
		// A header that is not CM class version 2 with a known attribute
		// and method says nothing of the layout behind it; a field out of
		// range leaves the rest worth showing.
		if !errors.Is(err, mad.ErrKindField) {
			return c
		}
	}
	c.body = true
	if l, r, ok := m.CommIDs(); ok {
		c.LocalCommID, c.RemoteCommID = &l, &r
	}
	svc := func(s mad.ServiceID) {
		v := uint64(s)
		c.ServiceID = &v
		if s.IsRDMACM() {
			c.PortSpace = s.PortSpace().String()
			c.Port = u16p(s.Port())
		}
	}
	var pd []byte
	switch m.AttrID() {
	case mad.AttrREQ:
		r := m.REQ()
		c.LocalCommID = u32p(r.LocalCommID())
		svc(r.ServiceID())
		c.QPN, c.StartingPSN = u32p(r.LocalQPN()), u32p(r.StartingPSN())
		c.ResponderResources, c.InitiatorDepth = u8p(r.ResponderResources()), u8p(r.InitiatorDepth())
		c.Transport = transportNames[r.TransportType()&3]
		mtu := mad.PathMTUBytes(r.PathMTU())
		c.PathMTU = &mtu
		c.RetryCount, c.RNRRetry = u8p(r.RetryCount()), u8p(r.RNRRetryCount())
		c.CMTimeout, c.MaxCMRetries = u8p(r.RemoteCMResponseTimeout()), u8p(r.MaxCMRetries())
		srq := r.SRQ()
		c.SRQ = &srq
		c.LocalGID, c.RemoteGID = r.Primary().LocalGID().String(), r.Primary().RemoteGID().String()
		pd = c.cma(r.PrivateData(), r.ServiceID())
	case mad.AttrREP:
		r := m.REP()
		c.QPN, c.StartingPSN = u32p(r.LocalQPN()), u32p(r.StartingPSN())
		c.ResponderResources, c.InitiatorDepth = u8p(r.ResponderResources()), u8p(r.InitiatorDepth())
		c.RNRRetry = u8p(r.RNRRetryCount())
		srq := r.SRQ()
		c.SRQ = &srq
		pd = r.PrivateData()
	case mad.AttrRTU:
		pd = m.RTU().PrivateData()
	case mad.AttrREJ:
		r := m.REJ()
		c.RejReason, c.RejReasonName = u16p(uint16(r.Reason())), r.Reason().String()
		c.MsgCode, c.ARILen = u8p(r.MsgRejected()), u8p(r.ARILength())
		pd = r.PrivateData()
	case mad.AttrMRA:
		r := m.MRA()
		c.MsgCode, c.ServiceTO = u8p(r.MsgMRAed()), u8p(r.ServiceTimeout())
		pd = r.PrivateData()
	case mad.AttrDREQ:
		r := m.DREQ()
		c.QPN = u32p(r.RemoteQPN())
		pd = r.PrivateData()
	case mad.AttrDREP:
		pd = m.DREP().PrivateData()
	case mad.AttrSIDRREQ:
		r := m.SIDRREQ()
		c.RequestID = u32p(r.RequestID())
		svc(r.ServiceID())
		pd = c.cma(r.PrivateData(), r.ServiceID())
	case mad.AttrSIDRREP:
		r := m.SIDRREP()
		c.RequestID = u32p(r.RequestID())
		svc(r.ServiceID())
		c.QPN, c.QKey = u32p(r.QPN()), u32p(r.QKey())
		c.SIDRStatus, c.SIDRStatusStr = u8p(r.Status()), mad.SIDRStatusName(r.Status())
		pd = r.PrivateData()
	}
	c.PrivateDataLen, c.PrivateDataUsed = len(pd), used(pd)
	return c
}

// cma decodes the cma_hdr of an rdma_cm service's private data and
// returns the consumer's part of the private data.
func (c *CM) cma(pd []byte, s mad.ServiceID) []byte {
	if !s.IsRDMACM() {
		return pd
	}
	h, err := mad.ParseCMAHeader(pd)
	if h == nil {
		return pd
	}
	c.CMA = &CMAHeader{Version: h.Version(), IPVersion: h.IPVersion(), SrcPort: h.Port(), Src: h.SrcAddr(), Dst: h.DstAddr()}
	if err != nil {
		c.CMA.Error = err.Error()
	}
	return pd[mad.CMAHeaderLen:]
}

// hexID renders an optional 32-bit ID.
func hexID(p *uint32) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprintf("0x%08x", *p)
}

// serviceShort renders the service ID as "0x106:7174" for rdma_cm
// services and as hex otherwise.
func (c *CM) serviceShort() string {
	if c.ServiceID == nil {
		return ""
	}
	return mad.ServiceID(*c.ServiceID).Short()
}

// Text renders the message for the one-line output: "CM REQ lcid ... svc
// RDMA_PS_TCP:7174 qpn 0x000011 psn ...".
func (c *CM) Text() string {
	var b strings.Builder
	fmt.Fprintf(&b, "CM %s", c.Message)
	if c.Method != "Send" {
		fmt.Fprintf(&b, " (%s)", c.Method)
	}
	if c.RequestID != nil {
		fmt.Fprintf(&b, " reqid %s", hexID(c.RequestID))
	}
	if c.LocalCommID != nil {
		fmt.Fprintf(&b, " lcid %s", hexID(c.LocalCommID))
	}
	if c.RemoteCommID != nil {
		fmt.Fprintf(&b, " rcid %s", hexID(c.RemoteCommID))
	}
	fmt.Fprintf(&b, " tid 0x%x", c.TID)
	if c.ServiceID != nil {
		fmt.Fprintf(&b, " svc %s", mad.ServiceID(*c.ServiceID))
	}
	if c.QPN != nil {
		fmt.Fprintf(&b, " qpn 0x%06x", *c.QPN)
	}
	if c.QKey != nil {
		fmt.Fprintf(&b, " qkey 0x%08x", *c.QKey)
	}
	if c.StartingPSN != nil {
		fmt.Fprintf(&b, " spsn 0x%06x", *c.StartingPSN)
	}
	if c.ResponderResources != nil {
		fmt.Fprintf(&b, " rr %d id %d", *c.ResponderResources, *c.InitiatorDepth)
	}
	if c.Transport != "" {
		fmt.Fprintf(&b, " %s mtu %d retry %d", c.Transport, *c.PathMTU, *c.RetryCount)
	}
	if c.RNRRetry != nil {
		fmt.Fprintf(&b, " rnr %d", *c.RNRRetry)
	}
	if c.SRQ != nil && *c.SRQ {
		b.WriteString(" srq")
	}
	if h := c.CMA; h != nil {
		if h.Error != "" {
			fmt.Fprintf(&b, " cma_hdr BAD (%s)", h.Error)
		} else {
			fmt.Fprintf(&b, " cma %s > %s", netip.AddrPortFrom(h.Src, h.SrcPort), h.Dst)
		}
	}
	if c.RejReason != nil {
		fmt.Fprintf(&b, " reason %d (%s) rejects %s", *c.RejReason, c.RejReasonName, msgCodeName(*c.MsgCode, false))
		if *c.ARILen > 0 {
			fmt.Fprintf(&b, " ari %d", *c.ARILen)
		}
	}
	if c.ServiceTO != nil {
		fmt.Fprintf(&b, " for %s timeout %d", msgCodeName(*c.MsgCode, true), *c.ServiceTO)
	}
	if c.SIDRStatus != nil {
		fmt.Fprintf(&b, " status %d (%s)", *c.SIDRStatus, c.SIDRStatusStr)
	}
	if c.PrivateDataLen > 0 {
		fmt.Fprintf(&b, " pdata %d/%d", c.PrivateDataUsed, c.PrivateDataLen)
	}
	if c.Error != "" {
		fmt.Fprintf(&b, " MAD REFUSED: %s", c.Error)
	}
	return b.String()
}

// Label is the short text of the ladder diagram's arrow: "REQ svc
// 0x106:7174 qpn 0x11 psn 0xe1a47d".
func (c *CM) Label() string {
	var b strings.Builder
	b.WriteString(c.Message)
	if c.ServiceID != nil && c.Message != "SIDR_REP" {
		fmt.Fprintf(&b, " svc %s", c.serviceShort())
	}
	if c.QPN != nil {
		fmt.Fprintf(&b, " qpn 0x%x", *c.QPN)
	}
	if c.StartingPSN != nil {
		fmt.Fprintf(&b, " psn 0x%x", *c.StartingPSN)
	}
	if c.RejReason != nil {
		fmt.Fprintf(&b, " %d %s", *c.RejReason, c.RejReasonName)
	}
	if c.SIDRStatus != nil {
		fmt.Fprintf(&b, " %s", c.SIDRStatusStr)
	}
	if c.Error != "" {
		b.WriteString(" REFUSED")
	}
	return b.String()
}

func msgCodeName(code uint8, mra bool) string {
	switch code {
	case 0:
		return "REQ"
	case 1:
		return "REP"
	case 2:
		if mra {
			return "LAP"
		}
		return "other"
	}
	return "reserved"
}

// cmFields adds the MAD's fields, starting at frame offset o.
func (t *tree) cmFields(o int, c *CM) {
	if !t.has(o, mad.HeaderLen) {
		return
	}
	t.add(o, o+1, "MAD.base_version", 0, "%d", t.u8(o))
	t.add(o+1, o+2, "MAD.mgmt_class", 0, "0x%02x (CM)", t.u8(o+1))
	t.add(o+2, o+3, "MAD.class_version", 0, "%d", t.u8(o+2))
	t.add(o+3, o+4, "MAD.method", 0, "0x%02x %s", t.u8(o+3), mad.Method(t.u8(o+3)))
	t.add(o+4, o+6, "MAD.status", 0, "0x%04x", t.u16(o+4))
	t.add(o+6, o+8, "MAD.class_specific", 0, "0x%04x", t.u16(o+6))
	t.add(o+8, o+16, "MAD.tid", 0, "0x%016x", t.u64(o+8))
	t.add(o+16, o+18, "MAD.attr_id", 0, "0x%04x %s", t.u16(o+16), mad.AttrID(t.u16(o+16)))
	t.add(o+20, o+24, "MAD.attr_mod", 0, "0x%08x", t.u32(o+20))
	if c.Error != "" {
		t.add(o, o+mad.HeaderLen, "MAD.error", 0, "%s", c.Error)
	}
	if !t.has(o, mad.Len) || !c.body {
		return
	}
	d := o + mad.HeaderLen
	u24 := func(x int) uint32 { return t.u32(x) >> 8 }
	id := func(x int, name string) { t.add(d+x, d+x+4, name, 0, "0x%08x", t.u32(d+x)) }
	svc := func(x int, name string) {
		s := mad.ServiceID(t.u64(d + x))
		t.add(d+x, d+x+8, name, 0, "0x%016x (%s)", uint64(s), s)
	}
	pdata := func(x, n int, name string) {
		t.add(d+x, d+x+n, name, 0, "%d bytes, %d used", n, used(t.b[d+x:d+x+n]))
	}
	switch mad.AttrID(t.u16(o + 16)) {
	case mad.AttrREQ:
		id(0, "CM.REQ.local_comm_id")
		svc(8, "CM.REQ.service_id")
		t.add(d+16, d+24, "CM.REQ.local_ca_guid", 0, "0x%016x", t.u64(d+16))
		t.add(d+28, d+32, "CM.REQ.local_qkey", 0, "0x%08x", t.u32(d+28))
		t.add(d+32, d+35, "CM.REQ.local_qpn", 0, "0x%06x", u24(d+32))
		t.add(d+35, d+36, "CM.REQ.responder_resources", 0, "%d", t.u8(d+35))
		t.add(d+36, d+39, "CM.REQ.local_eecn", 0, "0x%06x", u24(d+36))
		t.add(d+39, d+40, "CM.REQ.initiator_depth", 0, "%d", t.u8(d+39))
		t.add(d+40, d+43, "CM.REQ.remote_eecn", 0, "0x%06x", u24(d+40))
		b := t.u8(d + 43)
		t.add(d+43, d+44, "CM.REQ.remote_cm_response_timeout", 0xf8, "%d", b>>3)
		t.add(d+43, d+44, "CM.REQ.transport_type", 0x06, "%d %s", b>>1&3, transportNames[b>>1&3])
		t.add(d+43, d+44, "CM.REQ.e2e_flow_control", 0x01, "%d", b&1)
		t.add(d+44, d+47, "CM.REQ.starting_psn", 0, "0x%06x", u24(d+44))
		b = t.u8(d + 47)
		t.add(d+47, d+48, "CM.REQ.local_cm_response_timeout", 0xf8, "%d", b>>3)
		t.add(d+47, d+48, "CM.REQ.retry_count", 0x07, "%d", b&7)
		t.add(d+48, d+50, "CM.REQ.pkey", 0, "0x%04x", t.u16(d+48))
		b = t.u8(d + 50)
		t.add(d+50, d+51, "CM.REQ.path_mtu", 0xf0, "%d (%d bytes)", b>>4, mad.PathMTUBytes(b>>4))
		t.add(d+50, d+51, "CM.REQ.rdc_exists", 0x08, "%d", b>>3&1)
		t.add(d+50, d+51, "CM.REQ.rnr_retry_count", 0x07, "%d", b&7)
		b = t.u8(d + 51)
		t.add(d+51, d+52, "CM.REQ.max_cm_retries", 0xf0, "%d", b>>4)
		t.add(d+51, d+52, "CM.REQ.srq", 0x08, "%d", b>>3&1)
		t.add(d+51, d+52, "CM.REQ.ext_transport_type", 0x07, "%d", b&7)
		t.path(d+52, "CM.REQ.primary")
		t.path(d+96, "CM.REQ.alternate")
		t.add(d+139, d+140, "CM.REQ.sap_supported", 0x04, "%d", t.u8(d+139)>>2&1)
		t.cmaFields(d+140, c)
		if c.CMA != nil {
			pdata(140+mad.CMAHeaderLen, mad.REQPrivateDataLen-mad.CMAHeaderLen, "CM.REQ.private_data")
		} else {
			pdata(140, mad.REQPrivateDataLen, "CM.REQ.private_data")
		}
	case mad.AttrREP:
		id(0, "CM.REP.local_comm_id")
		id(4, "CM.REP.remote_comm_id")
		t.add(d+8, d+12, "CM.REP.local_qkey", 0, "0x%08x", t.u32(d+8))
		t.add(d+12, d+15, "CM.REP.local_qpn", 0, "0x%06x", u24(d+12))
		t.add(d+16, d+19, "CM.REP.local_eecn", 0, "0x%06x", u24(d+16))
		t.add(d+20, d+23, "CM.REP.starting_psn", 0, "0x%06x", u24(d+20))
		t.add(d+24, d+25, "CM.REP.responder_resources", 0, "%d", t.u8(d+24))
		t.add(d+25, d+26, "CM.REP.initiator_depth", 0, "%d", t.u8(d+25))
		b := t.u8(d + 26)
		t.add(d+26, d+27, "CM.REP.target_ack_delay", 0xf8, "%d", b>>3)
		t.add(d+26, d+27, "CM.REP.failover_accepted", 0x06, "%d", b>>1&3)
		t.add(d+26, d+27, "CM.REP.e2e_flow_control", 0x01, "%d", b&1)
		b = t.u8(d + 27)
		t.add(d+27, d+28, "CM.REP.rnr_retry_count", 0xe0, "%d", b>>5)
		t.add(d+27, d+28, "CM.REP.srq", 0x10, "%d", b>>4&1)
		t.add(d+28, d+36, "CM.REP.local_ca_guid", 0, "0x%016x", t.u64(d+28))
		pdata(36, mad.REPPrivateDataLen, "CM.REP.private_data")
	case mad.AttrRTU:
		id(0, "CM.RTU.local_comm_id")
		id(4, "CM.RTU.remote_comm_id")
		pdata(8, mad.RTUPrivateDataLen, "CM.RTU.private_data")
	case mad.AttrREJ:
		id(0, "CM.REJ.local_comm_id")
		id(4, "CM.REJ.remote_comm_id")
		t.add(d+8, d+9, "CM.REJ.msg_rejected", 0xc0, "%d (%s)", t.u8(d+8)>>6, msgCodeName(t.u8(d+8)>>6, false))
		t.add(d+9, d+10, "CM.REJ.ari_length", 0xfe, "%d", t.u8(d+9)>>1)
		t.add(d+10, d+12, "CM.REJ.reason", 0, "%d (%s)", t.u16(d+10), mad.RejReason(t.u16(d+10)))
		t.add(d+12, d+84, "CM.REJ.ari", 0, "%d bytes", min(int(t.u8(d+9)>>1), mad.ARILen))
		pdata(84, mad.REJPrivateDataLen, "CM.REJ.private_data")
	case mad.AttrMRA:
		id(0, "CM.MRA.local_comm_id")
		id(4, "CM.MRA.remote_comm_id")
		t.add(d+8, d+9, "CM.MRA.msg_mraed", 0xc0, "%d (%s)", t.u8(d+8)>>6, msgCodeName(t.u8(d+8)>>6, true))
		t.add(d+9, d+10, "CM.MRA.service_timeout", 0xf8, "%d", t.u8(d+9)>>3)
		pdata(10, mad.MRAPrivateDataLen, "CM.MRA.private_data")
	case mad.AttrDREQ:
		id(0, "CM.DREQ.local_comm_id")
		id(4, "CM.DREQ.remote_comm_id")
		t.add(d+8, d+11, "CM.DREQ.remote_qpn", 0, "0x%06x", u24(d+8))
		pdata(12, mad.DREQPrivateDataLen, "CM.DREQ.private_data")
	case mad.AttrDREP:
		id(0, "CM.DREP.local_comm_id")
		id(4, "CM.DREP.remote_comm_id")
		pdata(8, mad.DREPPrivateDataLen, "CM.DREP.private_data")
	case mad.AttrLAP, mad.AttrAPR:
		id(0, "CM."+c.Message+".local_comm_id")
		id(4, "CM."+c.Message+".remote_comm_id")
	case mad.AttrSIDRREQ:
		id(0, "CM.SIDR_REQ.request_id")
		t.add(d+4, d+6, "CM.SIDR_REQ.pkey", 0, "0x%04x", t.u16(d+4))
		svc(8, "CM.SIDR_REQ.service_id")
		t.cmaFields(d+16, c)
		if c.CMA != nil {
			pdata(16+mad.CMAHeaderLen, mad.SIDRREQPrivateDataLen-mad.CMAHeaderLen, "CM.SIDR_REQ.private_data")
		} else {
			pdata(16, mad.SIDRREQPrivateDataLen, "CM.SIDR_REQ.private_data")
		}
	case mad.AttrSIDRREP:
		id(0, "CM.SIDR_REP.request_id")
		t.add(d+4, d+5, "CM.SIDR_REP.status", 0, "%d (%s)", t.u8(d+4), mad.SIDRStatusName(t.u8(d+4)))
		t.add(d+5, d+6, "CM.SIDR_REP.info_length", 0, "%d", t.u8(d+5))
		t.add(d+8, d+11, "CM.SIDR_REP.qpn", 0, "0x%06x", u24(d+8))
		svc(12, "CM.SIDR_REP.service_id")
		t.add(d+20, d+24, "CM.SIDR_REP.qkey", 0, "0x%08x", t.u32(d+20))
		t.add(d+24, d+96, "CM.SIDR_REP.info", 0, "%d bytes", min(int(t.u8(d+5)), mad.ARILen))
		pdata(96, mad.SIDRREPPrivateDataLen, "CM.SIDR_REP.private_data")
	}
}

// path adds a REQ path description at frame offset o.
func (t *tree) path(o int, name string) {
	t.add(o, o+2, name+".local_lid", 0, "0x%04x", t.u16(o))
	t.add(o+2, o+4, name+".remote_lid", 0, "0x%04x", t.u16(o+2))
	t.add(o+4, o+20, name+".local_gid", 0, "%s", netip.AddrFrom16([16]byte(t.b[o+4:o+20])))
	t.add(o+20, o+36, name+".remote_gid", 0, "%s", netip.AddrFrom16([16]byte(t.b[o+20:o+36])))
	t.add(o+36, o+40, name+".flow_label", 0xfffff000, "0x%05x", t.u32(o+36)>>12)
	t.add(o+39, o+40, name+".packet_rate", 0x3f, "%d", t.u8(o+39)&0x3f)
	t.add(o+40, o+41, name+".traffic_class", 0, "%d", t.u8(o+40))
	t.add(o+41, o+42, name+".hop_limit", 0, "%d", t.u8(o+41))
	t.add(o+42, o+43, name+".sl", 0xf0, "%d", t.u8(o+42)>>4)
	t.add(o+42, o+43, name+".subnet_local", 0x08, "%d", t.u8(o+42)>>3&1)
	t.add(o+43, o+44, name+".local_ack_timeout", 0xf8, "%d", t.u8(o+43)>>3)
}

// cmaFields adds the cma_hdr at frame offset o when the message has one.
func (t *tree) cmaFields(o int, c *CM) {
	h := c.CMA
	if h == nil {
		return
	}
	t.add(o, o+1, "CMA.version", 0, "%d", t.u8(o))
	t.add(o+1, o+2, "CMA.ip_version", 0xf0, "%d", t.u8(o+1)>>4)
	t.add(o+2, o+4, "CMA.src_port", 0, "%d", t.u16(o+2))
	if h.IPVersion == 4 {
		t.add(o+16, o+20, "CMA.src_addr", 0, "%s", h.Src)
		t.add(o+32, o+36, "CMA.dst_addr", 0, "%s", h.Dst)
	} else {
		t.add(o+4, o+20, "CMA.src_addr", 0, "%s", h.Src)
		t.add(o+20, o+36, "CMA.dst_addr", 0, "%s", h.Dst)
	}
	if h.Error != "" {
		t.add(o, o+mad.CMAHeaderLen, "CMA.error", 0, "%s", h.Error)
	}
}

// used counts the bytes of b up to its last non-zero one.
func used(b []byte) int {
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] != 0 {
			return i + 1
		}
	}
	return 0
}
