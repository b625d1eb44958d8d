package cm

import (
	"time"
)

// receive handles one MAD under the engine lock. Whatever it does not act
// on is counted once in Stats and dropped; nothing in a MAD can make it
// panic or grow state beyond the half-open cap.
func (e *engine) receive(now time.Time, from Peer, mad []byte) {
	e.stats.Received++
	m := &e.in
	*m = msg{}
	if err := decode(mad, m); err != nil {
		switch {
		case e.answerUnsupported(from, mad):
		case err == errUnknownAttr:
			e.stats.UnknownAttr++
		default:
			e.stats.Malformed++
		}
		return
	}
	switch m.attr {
	case attrREQ:
		e.onREQ(now, from, m)
	case attrMRA:
		e.onMRA(now, m)
	case attrREJ:
		e.onREJ(now, m)
	case attrREP:
		e.onREP(now, from, m)
	case attrRTU:
		e.onRTU(m)
	case attrDREQ:
		e.onDREQ(now, from, m)
	case attrDREP:
		e.onDREP(now, m)
	case attrSIDRReq:
		e.onSIDRReq(now, from, m)
	case attrSIDRRep:
		e.onSIDRRep(m)
	default:
		// LAP and APR: the kernel refuses alternate paths on RoCE.
		// ClassPortInfo: no CM serves it.
		if !e.answerUnsupported(from, mad) {
			e.stats.UnknownAttr++
		}
	}
}

// copyMsg is m with its private data and ARI copied out of the receive
// buffer, for an event.
func copyMsg(m *msg) msg {
	c := *m
	c.private = copyPrivate(m.private)
	c.ari = copyPrivate(m.ari)
	return c
}

// issueRej answers a message with a REJ built from the message alone
// (cm_issue_rej): the comm IDs swapped, its transaction ID.
func (e *engine) issueRej(from Peer, m *msg, reason uint16, rejected uint8) {
	e.sendMsg(from, &msg{attr: attrREJ, tid: m.tid, localID: m.remoteID, remoteID: m.localID,
		msgRejected: rejected, reason: reason})
}

// staleQP rejects m (a REQ or REP) as stale when its QP is already in a
// connection of ours, and disconnects that connection if established.
func (e *engine) staleQP(now time.Time, from Peer, m *msg, rejected uint8) bool {
	c := e.remoteQPs[remoteKey{m.qpn, m.caGUID}]
	if c == nil {
		return false
	}
	e.stats.RejectedStale++
	e.issueRej(from, m, RejStaleConn, rejected)
	if c.state == stEstablished {
		mm := msg{attr: attrDREQ, tid: e.formTID(c), localID: c.localID, remoteID: c.remoteID, qpn: c.remoteQPN}
		e.setState(c, stDreqSent)
		e.sendRetx(now, c, &mm, c.timeout, c.maxRetries)
	}
	return true
}

func (e *engine) onREQ(now time.Time, from Peer, m *msg) {
	// A duplicate of a REQ being handled: its comm ID and CA GUID are known.
	if c := e.remoteIDs[remoteKey{m.localID, m.caGUID}]; c != nil {
		e.stats.Duplicates++
		switch c.state {
		case stMRAReqSent:
			c.dupSeen = true
			e.resendMRA(c, msgRespREQ)
		case stTimewait:
			e.stats.RejectedStale++
			e.sendMsg(c.peer, e.formatRej(c, RejStaleConn, nil, nil))
		}
		return
	}
	// The same remote QP already in a connection: stale (cm_match_req).
	if e.staleQP(now, from, m, msgRespREQ) {
		return
	}
	l := e.listeners[m.serviceID]
	if l == nil {
		e.stats.RejectedNoListener++
		e.issueRej(from, m, RejInvalidServiceID, msgRespREQ)
		return
	}
	switch {
	case m.transport != transportRC:
		e.stats.RejectedOther++
		e.issueRej(from, m, RejInvalidTransportType, msgRespREQ)
		return
	case m.mtu < 1 || m.mtu > 5:
		e.stats.RejectedOther++
		e.issueRej(from, m, RejInvalidMTU, msgRespREQ)
		return
	}
	if e.halfOpen >= e.cfg.MaxHalfOpen && !e.evictHalfOpen(now) {
		e.stats.HalfOpenDropped++
		return
	}
	c := e.newConn(true)
	c.born = now
	// The requester's REQ timer is at least its CM response timeout for us.
	c.evictAge = 2*cmTime(m.remoteCMTimeout) + time.Second
	c.remoteID = m.localID
	c.remoteGUID = m.caGUID
	c.serviceID = m.serviceID
	c.tid = m.tid
	c.peer = from
	c.timeout = cmTime(m.localCMTimeout)
	c.maxRetries = int(m.maxCMRetries)
	c.remoteQPN = m.qpn
	c.initDepth = m.respRes
	c.respRes = m.initDepth
	c.pathMTU = m.mtu
	c.sqPSN = m.psn
	c.retryCount = m.retryCount
	c.rnrRetry = m.rnrRetry
	// The passive side's ACK timeout is the one the REQ asks for.
	c.avTimeout = m.localAckTimeout
	c.serviceTimeout = e.cfg.MRAServiceTimeout
	e.remoteIDs[remoteKey{c.remoteID, c.remoteGUID}] = c
	e.remoteQPs[remoteKey{c.remoteQPN, c.remoteGUID}] = c
	c.inRemote = true
	c.user = l.user
	e.queueHalfOpen(c)
	// rdma_cm answers every REQ it hands to an application with a delayed
	// MRA: the state says MRA sent, and the MRA itself goes out only when
	// a duplicate REQ shows the peer is waiting.
	e.setState(c, stMRAReqSent)
	c.waitAt = now.Add(e.cfg.AcceptTimeout)
	e.touchTimer(c)
	e.post(event{typ: evReqReceived, c: c, l: l, m: copyMsg(m)})
}

func (e *engine) onMRA(now time.Time, m *msg) {
	var c *conn
	switch m.msgMRAed {
	case msgRespREQ:
		c = e.acquire(m.remoteID, 0)
	case msgRespREP, msgRespOther:
		c = e.acquire(m.remoteID, m.localID)
	}
	if c == nil {
		e.stats.Unmatched++
		return
	}
	timeout := cmTime(m.serviceTimeout) + cmTime(c.avTimeout)
	switch {
	case c.state == stReqSent && m.msgMRAed == msgRespREQ:
		e.setState(c, stMRAReqRcvd)
	case c.state == stRepSent && m.msgMRAed == msgRespREP:
		e.setState(c, stMRARepRcvd)
	case c.state == stMRAReqRcvd || c.state == stMRARepRcvd:
		e.stats.Duplicates++
		return
	default:
		e.stats.Ignored++
		return
	}
	// The outstanding message now waits the peer's service time, and so
	// do its remaining retries (ib_modify_mad).
	c.rt.timeout = timeout
	c.rt.deadline = now.Add(timeout)
}

func (e *engine) onREJ(now time.Time, m *msg) {
	var c *conn
	switch {
	case m.reason == RejTimeout:
		// The rejecter names us by its CA GUID in the ARI.
		if len(m.ari) >= 8 {
			var g uint64
			for _, b := range m.ari[:8] {
				g = g<<8 | uint64(b)
			}
			if t := e.remoteIDs[remoteKey{m.localID, g}]; t != nil {
				c = e.acquire(t.localID, m.localID)
			}
		}
	case m.msgRejected == msgRespREQ:
		c = e.acquire(m.remoteID, 0)
	default:
		c = e.acquire(m.remoteID, m.localID)
	}
	if c == nil {
		e.stats.Unmatched++
		return
	}
	switch c.state {
	case stReqSent, stMRAReqRcvd, stRepSent, stMRARepRcvd, stReqRcvd, stMRAReqSent:
		if m.reason == RejStaleConn {
			e.enterTimewait(now, c)
		} else {
			e.free(c)
		}
	case stDreqSent, stRepRcvd, stMRARepSent, stEstablished:
		e.enterTimewait(now, c)
	default:
		e.stats.Ignored++
		return
	}
	e.post(event{typ: evRejReceived, c: c, m: copyMsg(m)})
}

// resendMRA sends c's MRA of message mraed again, answering a duplicate.
func (e *engine) resendMRA(c *conn, mraed uint8) {
	e.sendMsg(c.peer, &msg{attr: attrMRA, tid: c.tid, localID: c.localID, remoteID: c.remoteID,
		msgMRAed: mraed, serviceTimeout: c.serviceTimeout})
}

// onDupREP answers a REP for a communication that is past it
// (cm_dup_rep_handler): the RTU again when established, the MRA when one
// was sent.
func (e *engine) onDupREP(m *msg) {
	c := e.acquire(m.remoteID, m.localID)
	if c == nil {
		e.stats.Unmatched++
		return
	}
	e.stats.Duplicates++
	switch c.state {
	case stEstablished:
		e.sendMsg(c.peer, &msg{attr: attrRTU, tid: c.tid, localID: c.localID, remoteID: c.remoteID, private: c.private})
	case stMRARepSent:
		e.resendMRA(c, msgRespREP)
	}
}

func (e *engine) onREP(now time.Time, from Peer, m *msg) {
	c := e.acquire(m.remoteID, 0)
	if c == nil {
		e.onDupREP(m)
		return
	}
	if c.state != stReqSent && c.state != stMRAReqRcvd {
		e.stats.Ignored++
		return
	}
	if e.remoteIDs[remoteKey{m.localID, m.caGUID}] != nil {
		e.stats.Duplicates++
		return
	}
	if e.staleQP(now, from, m, msgRespREP) {
		return
	}
	c.remoteID = m.localID
	c.remoteGUID = m.caGUID
	c.remoteQPN = m.qpn
	e.remoteIDs[remoteKey{c.remoteID, c.remoteGUID}] = c
	e.remoteQPs[remoteKey{c.remoteQPN, c.remoteGUID}] = c
	c.inRemote = true
	c.initDepth = m.respRes
	c.respRes = m.initDepth
	c.sqPSN = m.psn
	c.rnrRetry = m.rnrRetry
	c.targetAckDelay = m.targetAckDelay
	c.avTimeout = ackTimeout(m.targetAckDelay, c.avTimeout-1)
	e.setState(c, stRepRcvd)
	e.cancel(c)
	e.post(event{typ: evRepReceived, c: c, m: copyMsg(m)})
}

func (e *engine) onRTU(m *msg) {
	c := e.acquire(m.remoteID, m.localID)
	if c == nil {
		e.stats.Unmatched++
		return
	}
	if c.state != stRepSent && c.state != stMRARepRcvd {
		e.stats.Duplicates++
		return
	}
	e.setState(c, stEstablished)
	e.cancel(c)
	e.post(event{typ: evEstablished, c: c, m: copyMsg(m)})
}

func (e *engine) onDREQ(now time.Time, from Peer, m *msg) {
	c := e.acquire(m.remoteID, m.localID)
	if c == nil {
		// Answered anyway, so a peer whose DREP was lost can finish
		// (cm_issue_drep).
		e.stats.Unmatched++
		e.sendMsg(from, &msg{attr: attrDREP, tid: m.tid, localID: m.remoteID, remoteID: m.localID})
		return
	}
	if c.localQPN != m.qpn {
		e.stats.Ignored++
		return
	}
	switch c.state {
	case stRepSent, stDreqSent:
		e.cancel(c)
	case stEstablished, stMRARepRcvd:
	case stTimewait:
		e.stats.Duplicates++
		e.sendMsg(from, &msg{attr: attrDREP, tid: c.tid, localID: c.localID, remoteID: c.remoteID, private: c.private})
		return
	case stDreqRcvd:
		e.stats.Duplicates++
		return
	default:
		e.stats.Ignored++
		return
	}
	c.rt.on = false
	e.setState(c, stDreqRcvd)
	c.tid = m.tid
	e.touchTimer(c)
	e.post(event{typ: evDreqReceived, c: c, m: copyMsg(m)})
}

func (e *engine) onDREP(now time.Time, m *msg) {
	c := e.acquire(m.remoteID, m.localID)
	if c == nil {
		e.stats.Unmatched++
		return
	}
	if c.state != stDreqSent && c.state != stDreqRcvd {
		e.stats.Duplicates++
		return
	}
	e.enterTimewait(now, c)
	e.post(event{typ: evDrepReceived, c: c, m: copyMsg(m)})
}

func (e *engine) onSIDRReq(now time.Time, from Peer, m *msg) {
	k := sidrKey{m.localID, from.Addr.Addr()}
	if e.sidr[k] != nil {
		e.stats.Duplicates++
		return
	}
	l := e.listeners[m.serviceID]
	if l == nil {
		e.stats.RejectedNoListener++
		e.sendMsg(from, &msg{attr: attrSIDRRep, tid: m.tid, localID: m.localID, status: SIDRUnsupported, serviceID: m.serviceID})
		return
	}
	if e.halfOpen >= e.cfg.MaxHalfOpen {
		e.stats.HalfOpenDropped++
		return
	}
	c := e.newConn(true)
	c.remoteID = m.localID
	c.serviceID = m.serviceID
	c.tid = m.tid
	c.peer = from
	c.user = l.user
	e.sidr[k] = c
	c.inSIDR = true
	e.setState(c, stSIDRReqRcvd)
	c.waitAt = now.Add(e.cfg.AcceptTimeout)
	e.touchTimer(c)
	e.post(event{typ: evSIDRReqReceived, c: c, l: l, m: copyMsg(m)})
}

func (e *engine) onSIDRRep(m *msg) {
	c := e.acquire(m.localID, 0)
	if c == nil {
		e.stats.Unmatched++
		return
	}
	if c.state != stSIDRReqSent {
		e.stats.Ignored++
		return
	}
	e.free(c)
	e.post(event{typ: evSIDRRepReceived, c: c, m: copyMsg(m)})
}
