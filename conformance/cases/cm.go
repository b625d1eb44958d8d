package cases

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"time"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/bth/mad"
)

// docs/conformance-catalogue.md has no entries for the connection manager:
// IBTA vol. 1 chapter 12 (communication management).

// Connection management: CM MADs in UD SENDs between the peer's QP1 and
// the target's (Q_Key 0x80010000), the target's side driven through
// rdma_cm where a case needs a listener or an active connect (CMTarget).
var cmCases = []*Case{
	{
		ID: "cm-rej-unknown-service",
		Spec: "A CM REQ for an rdma_cm service ID (RDMA_PS_TCP, a port nobody listens on) sent to QP1 is answered by " +
			"a REJ to QP1: Remote Communication ID = the REQ's Local Communication ID, message rejected = REQ, reason 8 " +
			"(invalid Service ID); no REP (IBTA vol. 1 §12.6 CM messages, REJ reasons; §12.11 service IDs)",
		Run: runCMRejUnknownService,
	},
	{
		ID: "cm-req-retransmission",
		Spec: "The target connecting actively (rdma_cm) sends a REQ to the peer's QP1; unanswered, the REQ is sent " +
			"again, identical (same Local Communication ID and transaction ID, same bytes), no sooner than the response " +
			"time it announced (4.096 us * 2^Remote CM Response Timeout; 10% granularity allowed); a REJ (consumer " +
			"defined) then ends the attempt: no further REQ (IBTA vol. 1 §12.6 REQ, §12.7 timers and retries, §12.9 " +
			"the CM state machine)",
		Run: runCMReqRetransmission,
	},
	{
		ID: "cm-duplicate-req",
		Spec: "A REQ to a listening service is answered by a REP (Remote Communication ID = the REQ's, the target's QPN " +
			"and starting PSN); the same REQ sent again (a duplicate: same Local Communication ID and CA GUID) does not " +
			"start a second connection: no REP with another Local Communication ID or QPN, no REJ; at most the same REP " +
			"again (IBTA vol. 1 §12.9 duplicate REQs in the passive state machine)",
		Run: runCMDuplicateREQ,
	},
	{
		ID: "cm-dreq-drep",
		Spec: "After REQ, REP and RTU have connected the peer to a listening service, a DREQ (the target's QPN as Remote " +
			"QPN) is answered by a DREP whose Local Communication ID is the target's and Remote Communication ID the " +
			"peer's (IBTA vol. 1 §12.6 DREQ/DREP, §12.9.6 disconnection)",
		Run: runCMDreqDrep,
	},
	{
		ID: "cm-dreq-unknown-connection",
		Spec: "A DREQ naming communication IDs the target has no connection for is still answered by a DREP (Local " +
			"Communication ID = the DREQ's Remote, Remote = the DREQ's Local), so that the sender's retries stop (IBTA " +
			"vol. 1 §12.9.6: a DREQ in the idle or time-wait state draws a DREP)",
		Run: runCMDreqUnknown,
	},
}

// cmPeer is the peer's side of a CM conversation on QP1.
type cmPeer struct {
	x     *X
	psn   uint32
	guid  uint64
	tidHi uint64
	qpn   uint32 // the QPN the peer's REQs announce (no QP stands behind it)
}

func (x *X) openCM() *cmPeer {
	x.OpenQP1()
	return &cmPeer{x: x, psn: randPSN(), guid: 0x0200_5eff_fe00_0000 | rand.Uint64N(1<<24),
		tidHi: uint64(rand.Uint32()) << 32, qpn: 0x100 + rand.Uint32N(0xff0000)}
}

// send sends m as the payload of a UD SEND_ONLY from QP1 to QP1.
func (c *cmPeer) send(m mad.MAD) {
	c.x.Send(bth.Fields{BTH: bth.BTHFields{Opcode: bth.UDSendOnly, PSN: c.psn}, QKey: mad.QP1QKey, SrcQP: mad.GSIQPN}, m)
	c.psn = bth.PSNAdd(c.psn, 1)
}

// cmMsg is a CM MAD the target sent.
type cmMsg struct {
	m   mad.MAD
	pkt *Pkt
}

// recv collects the target's CM MADs to the peer's QP1 for up to d and
// returns them, stopping after the first for which stop returns true.
// Packets that are not UD SENDs with a MAD are returned as nil MADs and
// noted.
func (c *cmPeer) recv(d time.Duration, stop func(mad.MAD) bool) []cmMsg {
	var out []cmMsg
	c.x.C.Collect(d, func(q *Pkt) bool {
		if q.ParseErr != nil || q.Opcode() != bth.UDSendOnly {
			c.x.Notef("not a CM MAD in a UD SEND: %s", q)
			return false
		}
		if q.P.DETH == nil || q.P.DETH.QKey() != mad.QP1QKey || q.P.DETH.SrcQP() != mad.GSIQPN {
			c.x.Failf("a UD SEND to QP1 without Q_Key 0x%08x and source QP 1: %s", uint32(mad.QP1QKey), q)
		}
		m, err := mad.Parse(q.P.Payload)
		if err != nil {
			c.x.Notef("unparsable MAD (%v): %s", err, q)
			return false
		}
		out = append(out, cmMsg{m, q})
		return stop != nil && stop(m)
	})
	return out
}

// describe is a compact form of a CM MAD for observations.
func describeMAD(m mad.MAD) string {
	switch m.AttrID() {
	case mad.AttrREJ:
		r := m.REJ()
		return fmt.Sprintf("REJ %s (%d) of msg %d, comm 0x%x->0x%x", r.Reason(), uint16(r.Reason()), r.MsgRejected(), r.LocalCommID(), r.RemoteCommID())
	case mad.AttrREP:
		r := m.REP()
		return fmt.Sprintf("REP comm 0x%x->0x%x qpn 0x%x psn 0x%06x", r.LocalCommID(), r.RemoteCommID(), r.LocalQPN(), r.StartingPSN())
	case mad.AttrREQ:
		r := m.REQ()
		return fmt.Sprintf("REQ comm 0x%x svc %s qpn 0x%x psn 0x%06x", r.LocalCommID(), r.ServiceID().Short(), r.LocalQPN(), r.StartingPSN())
	}
	if l, r, ok := m.CommIDs(); ok {
		return fmt.Sprintf("%s comm 0x%x->0x%x", m.AttrID(), l, r)
	}
	return m.AttrID().String()
}

func describeMADs(ms []cmMsg) string {
	if len(ms) == 0 {
		return "no CM MAD"
	}
	var s []string
	for _, m := range ms {
		s = append(s, describeMAD(m.m))
	}
	return strings.Join(s, ", ")
}

// req builds a REQ from the peer for service svc, comm ID comm, in the
// shape rdma_cm gives it on RoCE (permissive LIDs, IPv4-mapped GIDs, a
// cma_hdr at the head of the private data).
func (c *cmPeer) req(comm uint32, svc mad.ServiceID, srcPort uint16) mad.MAD {
	peer, tgt := c.x.Target.Peer().Addr(), c.x.Target.Addr()
	m := mad.MAD(make([]byte, mad.Len)).Init(mad.AttrREQ, c.tidHi|uint64(comm))
	r := m.REQ()
	r.SetLocalCommID(comm)
	r.SetServiceID(svc)
	r.SetLocalCAGUID(c.guid)
	r.SetLocalQPN(c.qpn)
	r.SetResponderResources(1)
	r.SetInitiatorDepth(1)
	r.SetRemoteCMResponseTimeout(20)
	r.SetTransportType(mad.TransportRC)
	r.SetStartingPSN(randPSN())
	r.SetLocalCMResponseTimeout(20)
	r.SetRetryCount(7)
	r.SetPKey(0xffff)
	r.SetPathMTU(3) // 1024
	r.SetRNRRetryCount(7)
	r.SetMaxCMRetries(15)
	p := r.Primary()
	p.SetLocalLID(0xffff)
	p.SetRemoteLID(0xffff)
	p.SetLocalGID(netip.AddrFrom16(peer.As16()))
	p.SetRemoteGID(netip.AddrFrom16(tgt.As16()))
	p.SetPacketRate(3)
	p.SetHopLimit(64)
	p.SetLocalAckTimeout(18)
	r.CMAHeader().Encode(netip.AddrPortFrom(peer, srcPort), tgt)
	return m
}

func isAttr(a mad.AttrID) func(mad.MAD) bool { return func(m mad.MAD) bool { return m.AttrID() == a } }

// cmPort is a random rdma_cm port for one case.
func cmPort() uint16 { return uint16(20000 + rand.IntN(20000)) }

func runCMRejUnknownService(x *X) {
	c := x.openCM()
	comm := rand.Uint32() | 1
	svc := mad.RDMACMServiceID(mad.PortSpaceTCP, cmPort())
	c.send(c.req(comm, svc, uint16(40000+rand.IntN(20000))))
	got := c.recv(answerWait, isAttr(mad.AttrREJ))
	x.Observe("REQ for %s (nobody listening) -> %s", svc.Short(), describeMADs(got))
	var rej mad.REJ
	for _, g := range got {
		switch g.m.AttrID() {
		case mad.AttrREJ:
			rej = g.m.REJ()
		case mad.AttrREP, mad.AttrMRA:
			x.Failf("the REQ for a service nobody listens on drew a %s", g.m.AttrID())
		}
	}
	if rej.MAD == nil {
		x.Failf("no REJ came within %v", answerWait)
		return
	}
	x.Check(rej.RemoteCommID() == comm, "REJ Remote Communication ID 0x%x, want the REQ's Local Communication ID 0x%x", rej.RemoteCommID(), comm)
	x.Check(rej.MsgRejected() == mad.RejectedREQ, "REJ message rejected %d, want 0 (REQ)", rej.MsgRejected())
	x.Check(rej.Reason() == mad.RejInvalidServiceID, "REJ reason %d (%s), want 8 (invalid service ID)", uint16(rej.Reason()), rej.Reason())
	x.Notef("REJ transaction ID 0x%016x (the REQ's: 0x%016x), local comm ID 0x%x", rej.TID(), c.tidHi|uint64(comm), rej.LocalCommID())
	x.Never("a CM answer after the REJ", func(q *Pkt) bool { return q.Opcode() == bth.UDSendOnly })
}

func runCMReqRetransmission(x *X) {
	ct, ok := x.Target.(CMTarget)
	c := x.openCM()
	if !ok {
		x.Observe("the target has no rdma_cm to connect with")
		x.Failf("the target has no rdma_cm to connect with")
		return
	}
	stop, err := ct.CMConnect(x.Ctx, cmPort())
	x.Must(err, "start an rdma_cm connect on the target")
	x.Defer(stop)
	got := c.recv(12*time.Second, isAttr(mad.AttrREQ))
	if len(got) == 0 || got[len(got)-1].m.AttrID() != mad.AttrREQ {
		x.Fatalf("the target's rdma_cm connect sent no REQ within 12 s (%s)", describeMADs(got))
	}
	first := got[len(got)-1]
	req := first.m.REQ()
	t := time.Duration(4096<<req.RemoteCMResponseTimeout()) * time.Nanosecond
	x.Observe("target's %s (response timeout %d: %.0f ms)", describeMAD(first.m), req.RemoteCMResponseTimeout(), float64(t.Microseconds())/1000)
	again := c.recv(4*t, isAttr(mad.AttrREQ))
	var second *cmMsg
	for i := range again {
		if again[i].m.AttrID() == mad.AttrREQ {
			second = &again[i]
		} else {
			x.Notef("meanwhile: %s", describeMAD(again[i].m))
		}
	}
	if second == nil {
		x.Failf("no REQ retransmission within %v", 4*t)
		return
	}
	gap := second.pkt.Time.Sub(first.pkt.Time)
	x.Observe("unanswered -> REQ again after %.0f ms", float64(gap.Microseconds())/1000)
	x.Check(bytes.Equal(second.m, first.m), "the retransmitted REQ differs from the first (comm 0x%x->0x%x, TID 0x%x->0x%x)",
		req.LocalCommID(), second.m.REQ().LocalCommID(), first.m.TID(), second.m.TID())
	x.Check(gap >= t*9/10, "the REQ was retransmitted after %v, before the response timeout %v it announced", gap, t)

	rej := mad.MAD(make([]byte, mad.Len)).Init(mad.AttrREJ, first.m.TID())
	r := rej.REJ()
	r.SetLocalCommID(rand.Uint32() | 1)
	r.SetRemoteCommID(req.LocalCommID())
	r.SetMsgRejected(mad.RejectedREQ)
	r.SetReason(mad.RejConsumerDefined)
	c.send(rej)
	x.Observe("REJ (consumer defined) sent")
	comm := req.LocalCommID()
	x.Never("a REQ after the REJ", func(q *Pkt) bool {
		m, err := mad.Parse(q.P.Payload)
		return err == nil && m.AttrID() == mad.AttrREQ && m.REQ().LocalCommID() == comm
	})
	x.C.Collect(t+time.Second, nil)
}

// cmConnectREQ starts a listener on the target and sends REQs until one
// is answered by a REP (a REJ 8 means the listener is not up yet). It
// returns the REQ and the REP.
func cmConnectREQ(x *X, c *cmPeer) (mad.MAD, mad.REP, func()) {
	ct, ok := x.Target.(CMTarget)
	if !ok {
		x.Observe("the target has no rdma_cm to listen with")
		x.Failf("the target has no rdma_cm to listen with")
		return nil, mad.REP{}, nil
	}
	port := cmPort()
	stop, err := ct.CMListen(x.Ctx, port)
	x.Must(err, "start an rdma_cm listener on the target")
	svc := mad.RDMACMServiceID(mad.PortSpaceTCP, port)
	src := uint16(40000 + rand.IntN(20000))
	for try := 0; try < 40; try++ {
		comm := rand.Uint32() | 1
		req := c.req(comm, svc, src)
		c.send(req)
		got := c.recv(answerWait, func(m mad.MAD) bool { return m.AttrID() == mad.AttrREP || m.AttrID() == mad.AttrREJ })
		if len(got) == 0 {
			continue
		}
		last := got[len(got)-1].m
		if last.AttrID() == mad.AttrREP && last.REP().RemoteCommID() == comm {
			if try > 0 {
				x.Notef("the listener answered REP after %d REQ(s) rejected while it started", try)
			}
			return req, last.REP(), stop
		}
		if last.AttrID() == mad.AttrREJ && last.REJ().Reason() == mad.RejInvalidServiceID {
			time.Sleep(250 * time.Millisecond)
			continue
		}
		stop()
		x.Fatalf("REQ to the listener drew %s", describeMADs(got))
	}
	stop()
	x.Fatalf("the target's listener on port %d never answered a REQ with a REP", port)
	return nil, mad.REP{}, nil
}

func (c *cmPeer) rtu(req mad.MAD, rep mad.REP) {
	m := mad.MAD(make([]byte, mad.Len)).Init(mad.AttrRTU, req.TID())
	m.RTU().SetLocalCommID(req.REQ().LocalCommID())
	m.RTU().SetRemoteCommID(rep.LocalCommID())
	c.send(m)
}

func runCMDuplicateREQ(x *X) {
	c := x.openCM()
	req, rep, stop := cmConnectREQ(x, c)
	if stop == nil {
		return
	}
	x.Defer(stop)
	x.Observe("REQ -> %s", describeMAD(rep.MAD))
	x.Check(rep.LocalQPN() != 0, "the REP names QPN 0")
	c.send(req)
	got := c.recv(quietWait+answerWait, nil)
	x.Observe("the same REQ again -> %s", describeMADs(got))
	for _, g := range got {
		switch g.m.AttrID() {
		case mad.AttrREP:
			r := g.m.REP()
			x.Check(r.LocalCommID() == rep.LocalCommID() && r.LocalQPN() == rep.LocalQPN() && r.StartingPSN() == rep.StartingPSN(),
				"the duplicate REQ drew a different REP (%s; first %s): a second connection", describeMAD(g.m), describeMAD(rep.MAD))
		case mad.AttrREJ:
			x.Failf("the duplicate REQ was rejected: %s", describeMAD(g.m))
		default:
			x.Notef("after the duplicate: %s", describeMAD(g.m))
		}
	}
	c.rtu(req, rep)
	x.Observe("RTU sent")
	x.Never("a REJ after the RTU", func(q *Pkt) bool {
		m, err := mad.Parse(q.P.Payload)
		return err == nil && m.AttrID() == mad.AttrREJ
	})
}

func runCMDreqDrep(x *X) {
	c := x.openCM()
	req, rep, stop := cmConnectREQ(x, c)
	if stop == nil {
		return
	}
	x.Defer(stop)
	c.rtu(req, rep)
	x.Observe("REQ -> %s; RTU", describeMAD(rep.MAD))
	got := c.recv(quietWait, nil)
	if len(got) > 0 {
		x.Notef("after the RTU: %s", describeMADs(got))
	}
	comm := req.REQ().LocalCommID()
	m := mad.MAD(make([]byte, mad.Len)).Init(mad.AttrDREQ, c.tidHi|uint64(rand.Uint32()))
	d := m.DREQ()
	d.SetLocalCommID(comm)
	d.SetRemoteCommID(rep.LocalCommID())
	d.SetRemoteQPN(rep.LocalQPN())
	c.send(m)
	got = c.recv(answerWait, isAttr(mad.AttrDREP))
	x.Observe("DREQ -> %s", describeMADs(got))
	if len(got) == 0 || got[len(got)-1].m.AttrID() != mad.AttrDREP {
		x.Failf("no DREP came within %v", answerWait)
		return
	}
	r := got[len(got)-1].m.DREP()
	x.Check(r.LocalCommID() == rep.LocalCommID() && r.RemoteCommID() == comm, "DREP comm 0x%x->0x%x, want 0x%x->0x%x",
		r.LocalCommID(), r.RemoteCommID(), rep.LocalCommID(), comm)
	x.Notef("DREP transaction ID 0x%016x (the DREQ's: 0x%016x)", r.TID(), m.TID())
}

func runCMDreqUnknown(x *X) {
	c := x.openCM()
	local, remote := rand.Uint32()|1, rand.Uint32()|1
	m := mad.MAD(make([]byte, mad.Len)).Init(mad.AttrDREQ, c.tidHi|uint64(local))
	d := m.DREQ()
	d.SetLocalCommID(local)
	d.SetRemoteCommID(remote)
	d.SetRemoteQPN(0x100 + rand.Uint32N(0xff0000))
	c.send(m)
	got := c.recv(answerWait, isAttr(mad.AttrDREP))
	x.Observe("DREQ comm 0x%x->0x%x (no such connection) -> %s", local, remote, describeMADs(got))
	if len(got) == 0 || got[len(got)-1].m.AttrID() != mad.AttrDREP {
		x.Failf("no DREP came within %v", answerWait)
		return
	}
	r := got[len(got)-1].m.DREP()
	x.Check(r.LocalCommID() == remote && r.RemoteCommID() == local, "DREP comm 0x%x->0x%x, want 0x%x->0x%x",
		r.LocalCommID(), r.RemoteCommID(), remote, local)
}
