package cm

import (
	"errors"
	"net/netip"

	"github.com/softroce/softroce/bth/mad"
)

// errUnknownAttr marks a MAD of an attribute the CM does not define.
var errUnknownAttr = errors.New("cm: unknown attribute")

// decode fills m from a received MAD. It refuses what mad.Parse refuses;
// every field it copies is range-checked by its width in the codec.
func decode(b []byte, m *msg) error {
	v, err := mad.Parse(b)
	if err != nil {
		if errors.Is(err, mad.ErrKindAttribute) {
			return errUnknownAttr
		}
		return err
	}
	m.attr = uint16(v.AttrID())
	m.tid = v.TID()
	switch v.AttrID() {
	case mad.AttrREQ:
		r := v.REQ()
		m.localID = r.LocalCommID()
		m.serviceID = uint64(r.ServiceID())
		m.caGUID = r.LocalCAGUID()
		m.qkey = r.LocalQKey()
		m.qpn = r.LocalQPN()
		m.respRes = r.ResponderResources()
		m.initDepth = r.InitiatorDepth()
		m.remoteCMTimeout = r.RemoteCMResponseTimeout()
		m.transport = r.TransportType()
		m.flowControl = r.E2EFlowControl()
		m.psn = r.StartingPSN()
		m.localCMTimeout = r.LocalCMResponseTimeout()
		m.retryCount = r.RetryCount()
		m.pkey = r.PKey()
		m.mtu = r.PathMTU()
		m.rnrRetry = r.RNRRetryCount()
		m.maxCMRetries = r.MaxCMRetries()
		m.srq = r.SRQ()
		p := r.Primary()
		m.localGID = p.LocalGID().As16()
		m.remoteGID = p.RemoteGID().As16()
		m.flowLabel = p.FlowLabel()
		m.trafficClass = p.TrafficClass()
		m.hopLimit = p.HopLimit()
		m.sl = p.SL()
		m.localAckTimeout = p.LocalAckTimeout()
		m.private = r.PrivateData()
	case mad.AttrMRA:
		r := v.MRA()
		m.localID, m.remoteID = r.LocalCommID(), r.RemoteCommID()
		m.msgMRAed = r.MsgMRAed()
		m.serviceTimeout = r.ServiceTimeout()
		m.private = r.PrivateData()
	case mad.AttrREJ:
		r := v.REJ()
		m.localID, m.remoteID = r.LocalCommID(), r.RemoteCommID()
		m.msgRejected = r.MsgRejected()
		m.reason = uint16(r.Reason())
		m.ari = r.ARI()
		m.private = r.PrivateData()
	case mad.AttrREP:
		r := v.REP()
		m.localID, m.remoteID = r.LocalCommID(), r.RemoteCommID()
		m.qkey = r.LocalQKey()
		m.qpn = r.LocalQPN()
		m.psn = r.StartingPSN()
		m.respRes = r.ResponderResources()
		m.initDepth = r.InitiatorDepth()
		m.targetAckDelay = r.TargetAckDelay()
		m.flowControl = r.E2EFlowControl()
		m.rnrRetry = r.RNRRetryCount()
		m.srq = r.SRQ()
		m.caGUID = r.LocalCAGUID()
		m.private = r.PrivateData()
	case mad.AttrRTU:
		r := v.RTU()
		m.localID, m.remoteID = r.LocalCommID(), r.RemoteCommID()
		m.private = r.PrivateData()
	case mad.AttrDREQ:
		r := v.DREQ()
		m.localID, m.remoteID = r.LocalCommID(), r.RemoteCommID()
		m.qpn = r.RemoteQPN()
		m.private = r.PrivateData()
	case mad.AttrDREP:
		r := v.DREP()
		m.localID, m.remoteID = r.LocalCommID(), r.RemoteCommID()
		m.private = r.PrivateData()
	case mad.AttrSIDRREQ:
		r := v.SIDRREQ()
		m.localID = r.RequestID()
		m.pkey = r.PKey()
		m.serviceID = uint64(r.ServiceID())
		m.private = r.PrivateData()
	case mad.AttrSIDRREP:
		r := v.SIDRREP()
		m.localID = r.RequestID()
		m.status = r.Status()
		m.qpn = r.QPN()
		m.serviceID = uint64(r.ServiceID())
		m.qkey = r.QKey()
		m.ari = r.Info()
		m.private = r.PrivateData()
	}
	return nil
}

// encode writes m as a MAD into b (MADSize bytes). Lengths were checked
// by the callers, so the setters' errors cannot happen.
func encode(b []byte, m *msg) {
	v := mad.MAD(b).Init(mad.AttrID(m.attr), m.tid)
	switch mad.AttrID(m.attr) {
	case mad.AttrREQ:
		r := v.REQ()
		r.SetLocalCommID(m.localID)
		r.SetServiceID(mad.ServiceID(m.serviceID))
		r.SetLocalCAGUID(m.caGUID)
		r.SetLocalQKey(m.qkey)
		r.SetLocalQPN(m.qpn)
		r.SetResponderResources(m.respRes)
		r.SetInitiatorDepth(m.initDepth)
		r.SetRemoteCMResponseTimeout(m.remoteCMTimeout)
		r.SetTransportType(m.transport)
		r.SetE2EFlowControl(m.flowControl)
		r.SetStartingPSN(m.psn)
		r.SetLocalCMResponseTimeout(m.localCMTimeout)
		r.SetRetryCount(m.retryCount)
		r.SetPKey(m.pkey)
		r.SetPathMTU(m.mtu)
		r.SetRNRRetryCount(m.rnrRetry)
		r.SetMaxCMRetries(m.maxCMRetries)
		r.SetSRQ(m.srq)
		p := r.Primary()
		// Hop limit above 1: a routed path with permissive LIDs, as the
		// kernel writes for RoCE.
		p.SetLocalLID(0xFFFF)
		p.SetRemoteLID(0xFFFF)
		p.SetLocalGID(netip.AddrFrom16(m.localGID))
		p.SetRemoteGID(netip.AddrFrom16(m.remoteGID))
		p.SetFlowLabel(m.flowLabel)
		p.SetTrafficClass(m.trafficClass)
		p.SetHopLimit(m.hopLimit)
		p.SetSL(m.sl)
		p.SetSubnetLocal(m.hopLimit <= 1)
		p.SetLocalAckTimeout(m.localAckTimeout)
		_ = r.SetPrivateData(m.private)
	case mad.AttrMRA:
		r := v.MRA()
		r.SetLocalCommID(m.localID)
		r.SetRemoteCommID(m.remoteID)
		r.SetMsgMRAed(m.msgMRAed)
		r.SetServiceTimeout(m.serviceTimeout)
		_ = r.SetPrivateData(m.private)
	case mad.AttrREJ:
		r := v.REJ()
		r.SetLocalCommID(m.localID)
		r.SetRemoteCommID(m.remoteID)
		r.SetMsgRejected(m.msgRejected)
		r.SetReason(mad.RejReason(m.reason))
		if len(m.ari) > 0 {
			_ = r.SetARI(m.ari)
		}
		_ = r.SetPrivateData(m.private)
	case mad.AttrREP:
		r := v.REP()
		r.SetLocalCommID(m.localID)
		r.SetRemoteCommID(m.remoteID)
		r.SetLocalQKey(m.qkey)
		r.SetLocalQPN(m.qpn)
		r.SetStartingPSN(m.psn)
		r.SetResponderResources(m.respRes)
		r.SetInitiatorDepth(m.initDepth)
		r.SetTargetAckDelay(m.targetAckDelay)
		r.SetE2EFlowControl(m.flowControl)
		r.SetRNRRetryCount(m.rnrRetry)
		r.SetSRQ(m.srq)
		r.SetLocalCAGUID(m.caGUID)
		_ = r.SetPrivateData(m.private)
	case mad.AttrRTU:
		r := v.RTU()
		r.SetLocalCommID(m.localID)
		r.SetRemoteCommID(m.remoteID)
		_ = r.SetPrivateData(m.private)
	case mad.AttrDREQ:
		r := v.DREQ()
		r.SetLocalCommID(m.localID)
		r.SetRemoteCommID(m.remoteID)
		r.SetRemoteQPN(m.qpn)
		_ = r.SetPrivateData(m.private)
	case mad.AttrDREP:
		r := v.DREP()
		r.SetLocalCommID(m.localID)
		r.SetRemoteCommID(m.remoteID)
		_ = r.SetPrivateData(m.private)
	case mad.AttrSIDRREQ:
		r := v.SIDRREQ()
		r.SetRequestID(m.localID)
		r.SetPKey(m.pkey)
		r.SetServiceID(mad.ServiceID(m.serviceID))
		_ = r.SetPrivateData(m.private)
	case mad.AttrSIDRREP:
		r := v.SIDRREP()
		r.SetRequestID(m.localID)
		r.SetStatus(m.status)
		r.SetQPN(m.qpn)
		r.SetServiceID(mad.ServiceID(m.serviceID))
		r.SetQKey(m.qkey)
		_ = r.SetPrivateData(m.private)
	}
}
