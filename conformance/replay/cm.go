package replay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/gopacket/gopacket"

	"github.com/softroce/softroce/bth/mad"
	"github.com/softroce/softroce/cm"
	"github.com/softroce/softroce/icrc"
	"github.com/softroce/softroce/inspect"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/nic/capture"
	"github.com/softroce/softroce/verbs"
)

// CMExchange is one captured active-side CM message fed to a softroce
// passive-side CM, and the answers of both.
type CMExchange struct {
	Frame int `json:"frame"`
	// Side is the side softroce plays: "passive" (fed the active side's
	// MADs) or "active" (fed the real passive side's REP).
	Side    string `json:"side"`
	Message string `json:"message"` // the message fed to softroce: REQ, RTU, DREQ, REP ...
	// Setup says what softroce's application did when it was not to accept.
	Setup    string   `json:"setup,omitempty"`
	Verdict  Verdict  `json:"verdict"`
	Allowed  []string `json:"allowed,omitempty"`
	Failures []string `json:"failures,omitempty"`
	Request  string   `json:"request"`
	Real     []string `json:"real"`
	Softroce []string `json:"softroce"`
}

// madOf returns the record's MAD bytes (a UD SEND to QP1: BTH, DETH, MAD).
func madOf(r *inspect.Record) mad.MAD {
	roce := roceBytes(r)
	if len(roce) < 12+8+mad.Len {
		return nil
	}
	return append(mad.MAD(nil), roce[20:20+mad.Len]...)
}

// stillClock is simulated time that never advances: timers never fire,
// so no retransmission is ever judged.
type stillClock struct{ t time.Time }

type stillTimer struct{ c chan time.Time }

func (c stillClock) Now() time.Time                { return c.t }
func (stillClock) NewTimer(time.Duration) cm.Timer { return stillTimer{make(chan time.Time)} }
func (t stillTimer) C() <-chan time.Time           { return t.c }
func (stillTimer) Stop() bool                      { return true }

// memMAD is an in-memory MADConn: Feed hands the CM one MAD and returns
// once the CM has taken it in (it asks for the next one).
type memMAD struct {
	in        chan []byte
	from      cm.Peer
	processed chan struct{}
	closed    chan struct{}
	once      sync.Once
	mu        sync.Mutex
	sent      []mad.MAD
}

func newMemMAD() *memMAD {
	return &memMAD{in: make(chan []byte), processed: make(chan struct{}), closed: make(chan struct{})}
}

func (c *memMAD) SendMAD(to cm.Peer, b []byte) error {
	c.mu.Lock()
	c.sent = append(c.sent, append(mad.MAD(nil), b...))
	c.mu.Unlock()
	return nil
}

func (c *memMAD) RecvMAD(buf []byte) (int, cm.Peer, error) {
	select {
	case c.processed <- struct{}{}:
	case <-c.closed:
		return 0, cm.Peer{}, errors.New("closed")
	}
	select {
	case b := <-c.in:
		return copy(buf, b), c.from, nil
	case <-c.closed:
		return 0, cm.Peer{}, errors.New("closed")
	}
}

func (c *memMAD) Close() error { c.once.Do(func() { close(c.closed) }); return nil }

func (c *memMAD) feed(b []byte) {
	c.in <- b
	<-c.processed
}

func (c *memMAD) take() []mad.MAD {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.sent
	c.sent = nil
	return s
}

// waitSent waits (a safety net only: the CM answers at once) for a MAD.
func (c *memMAD) waitSent() []mad.MAD {
	for range 2000 {
		if s := c.take(); len(s) > 0 {
			return s
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

// cmLine decodes a MAD as softroce inspect prints it.
func cmLine(m mad.MAD, src, dst netip.Addr, ts time.Time) (string, *inspect.Record) {
	roce := make([]byte, 12+8, 12+8+mad.Len+4)
	roce[0] = 0x64 // UD SEND_ONLY
	roce[2], roce[3] = 0xff, 0xff
	roce[7] = 1 // dest QP 1
	copy(roce[12:], []byte{0x80, 0x01, 0x00, 0x00, 0, 0, 0, 1})
	roce = append(roce, m...)
	roce = append(roce, 0, 0, 0, 0)
	s, d := netip.AddrPortFrom(src.Unmap(), nic.RoCEv2Port), netip.AddrPortFrom(dst.Unmap(), nic.RoCEv2Port)
	if crc, err := synthICRC(s, d, roce); err == nil {
		icrc.Put(roce, crc)
	}
	frame, err := capture.AppendFrame(nil, s, d, roce)
	if err != nil {
		return fmt.Sprintf("(%v)", err), nil
	}
	r := inspect.Decode(frame, gopacket.CaptureInfo{Timestamp: ts, CaptureLength: len(frame), Length: len(frame)})
	return inspect.Line(&r), &r
}

// replayCM replays every captured REQ's exchange into a softroce passive CM.
func (rep *Report) replayCM(recs []inspect.Record) {
	for i := range recs {
		r := &recs[i]
		if r.CM == nil || r.CM.Message != "REQ" {
			continue
		}
		m := madOf(r)
		if m == nil {
			continue // counted as skipped below
		}
		if dup := rep.cmSeen[m.REQ().LocalCommID()]; dup {
			continue // a retransmitted REQ belongs to the first one's exchange
		}
		rep.cmSeen[m.REQ().LocalCommID()] = true
		rep.CMExchanges = append(rep.CMExchanges, passiveCM(recs, i, rep.cmUsed)...)
		rep.CMExchanges = append(rep.CMExchanges, activeCM(recs, i, rep.cmUsed)...)
	}
	for i := range recs {
		if recs[i].CM != nil && !rep.cmUsed[recs[i].Frame] {
			rep.CMSkipped++
		}
	}
	for _, e := range rep.CMExchanges {
		rep.CMReplayed++
		switch e.Verdict {
		case Agree:
			rep.CMAgree++
		case Allowed:
			rep.CMAllowed++
		default:
			rep.CMDiffer++
		}
	}
}

// passiveCM drives a softroce passive CM with the exchange of the REQ at
// recs[at]: the active side's MADs in order, each answer compared with the
// real passive side's.
func passiveCM(recs []inspect.Record, at int, used map[int]bool) []CMExchange {
	reqRec := &recs[at]
	req := madOf(reqRec)
	active, passive := reqRec.Src, reqRec.Dst
	aID := req.REQ().LocalCommID()
	sid := req.REQ().ServiceID()
	fail := func(why string) []CMExchange {
		return []CMExchange{{Frame: reqRec.Frame, Message: "REQ", Verdict: Differ, Failures: []string{why}, Request: inspect.Line(reqRec)}}
	}
	link := newTapLink(passive.Unmap())
	defer link.Close()
	dev, err := verbs.Open(link, &verbs.Options{Name: "replay-cm"})
	if err != nil {
		return fail("open softroce: " + err.Error())
	}
	defer dev.Close()
	mc := newMemMAD()
	mc.from = cm.Peer{Addr: netip.AddrPortFrom(active.Unmap(), nic.RoCEv2Port), QPN: 1}
	c, err := cm.New(dev, mc, &cm.Options{Clock: stillClock{reqRec.Time}})
	if err != nil {
		return fail("start softroce's CM: " + err.Error())
	}
	defer c.Close()
	<-mc.processed
	// softroce's application does what the real one did: a REJ 8 means
	// nobody listened, a REJ 28 that the application refused, no answer
	// that it neither accepted nor refused. Everything else is the CM's.
	policy, note := "accept", ""
	for _, rr := range realAnswer(recs, at, active, passive, aID) {
		if m := madOf(rr); m != nil && m.AttrID() == mad.AttrREJ {
			switch m.REJ().Reason() {
			case 8:
				policy, note = "none", "no listener (the real passive side had none: REJ 8)"
			case 28:
				policy, note = "reject", "the application rejects (as the real one did: REJ 28)"
			}
		}
	}
	if len(realAnswer(recs, at, active, passive, aID)) == 0 {
		policy, note = "wait", "the application neither accepts nor rejects (the real passive side never answered)"
	}
	var lis *cm.Listener
	if sid.IsRDMACM() && policy != "none" {
		if lis, err = c.Listen(sid.PortSpace(), sid.Port()); err != nil {
			return fail("listen on " + sid.String() + ": " + err.Error())
		}
	}
	pd, _ := dev.AllocPD()
	cq, _ := dev.CreateCQ(16)
	var softID uint32
	var softQPN uint32
	// Accept runs until the RTU or the end of the replay; it is waited for
	// before the CM and the device close.
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// The exchange's MADs in capture order.
	var exs []CMExchange
	seen := map[string]bool{}
	for i := at; i < len(recs); i++ {
		r := &recs[i]
		if r.CM == nil {
			continue
		}
		m := madOf(r)
		if m == nil {
			continue
		}
		fromActive := r.Src == active && r.Dst == passive
		if !fromActive {
			continue
		}
		var ok bool
		switch m.AttrID() {
		case mad.AttrREQ:
			ok = m.REQ().LocalCommID() == aID && i == at
		case mad.AttrRTU, mad.AttrDREQ, mad.AttrREJ, mad.AttrMRA:
			l, _, k := m.CommIDs()
			ok = k && l == aID
		}
		if !ok {
			continue
		}
		key := m.AttrID().String()
		if seen[key] {
			continue // a retransmission: its answer is the first one's
		}
		seen[key] = true
		real := realAnswer(recs, i, active, passive, aID)
		used[r.Frame] = true
		for _, rr := range real {
			used[rr.Frame] = true
		}
		// Map the capture's passive comm ID and QPN onto softroce's.
		switch m.AttrID() {
		case mad.AttrRTU, mad.AttrREJ, mad.AttrMRA:
			m.RTU().SetRemoteCommID(softID)
		case mad.AttrDREQ:
			m.DREQ().SetRemoteCommID(softID)
			m.DREQ().SetRemoteQPN(softQPN)
		}
		mc.feed(m)
		var soft []mad.MAD
		if m.AttrID() == mad.AttrREQ {
			// Accept what the listener hands over, with the real REP's
			// private data passed through.
			soft = mc.take()
			if len(soft) == 0 {
				soft = acceptNext(ctx, &wg, lis, pd, cq, mc, real, policy)
			}
		} else {
			soft = mc.take()
			if m.AttrID() == mad.AttrDREQ && len(soft) == 0 {
				soft = mc.waitSent()
			}
		}
		for _, s := range soft {
			if l, _, ok := s.CommIDs(); ok && softID == 0 {
				softID = l
			}
			if s.AttrID() == mad.AttrREP {
				softQPN = s.REP().LocalQPN()
			}
		}
		e := judgeCM(r, req, real, soft, passive, active)
		if note != "" && m.AttrID() == mad.AttrREQ {
			e.Setup = note
		}
		exs = append(exs, e)
	}
	return exs
}

// acceptNext takes the request from the listener and accepts it on a new
// QP, passing the real REP's private data through; it returns the MADs
// softroce sent (its REP).
func acceptNext(ctx context.Context, wg *sync.WaitGroup, lis *cm.Listener, pd *verbs.PD, cq *verbs.CQ, mc *memMAD, real []*inspect.Record, policy string) []mad.MAD {
	if lis == nil || pd == nil || cq == nil {
		return nil
	}
	nctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	r, err := lis.Next(nctx)
	if err != nil || policy == "wait" {
		return nil
	}
	if policy == "reject" {
		var pd []byte
		for _, rr := range real {
			if m := madOf(rr); m != nil && m.AttrID() == mad.AttrREJ {
				pd = bytes.TrimRight(m.REJ().PrivateData(), "\x00")
			}
		}
		r.Reject(pd)
		return mc.take()
	}
	qp, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		return nil
	}
	p := cm.ConnParam{ResponderResources: r.Param.ResponderResources, InitiatorDepth: r.Param.InitiatorDepth, RNRRetryCount: 7}
	for _, rr := range real {
		if m := madOf(rr); m != nil && m.AttrID() == mad.AttrREP {
			p.PrivateData = bytes.TrimRight(m.REP().PrivateData(), "\x00")
		}
	}
	wg.Go(func() { r.Accept(ctx, qp, &p) }) // returns on the RTU, or when ctx ends
	return mc.waitSent()
}

// realAnswer is the real passive side's first answer to the active MAD at
// recs[i]: the MADs it sent for the exchange before the active side's next.
func realAnswer(recs []inspect.Record, i int, active, passive netip.Addr, aID uint32) []*inspect.Record {
	var out []*inspect.Record
	for j := i + 1; j < len(recs); j++ {
		r := &recs[j]
		if r.CM == nil {
			continue
		}
		m := madOf(r)
		if m == nil {
			continue
		}
		_, rem, ok := m.CommIDs()
		if r.Src == active && r.Dst == passive {
			if l, _, ok := m.CommIDs(); ok && l == aID || m.AttrID() == mad.AttrREQ && m.REQ().LocalCommID() == aID {
				if m.AttrID() != mad.AttrREQ {
					break // the active side's next message
				}
			}
			continue
		}
		if r.Src == passive && r.Dst == active && ok && rem == aID {
			out = append(out, r)
			if m.AttrID() != mad.AttrMRA {
				break
			}
		}
	}
	return out
}

// judgeCM compares softroce's answers to the active MAD at r with the real
// passive side's.
func judgeCM(r *inspect.Record, req mad.MAD, real []*inspect.Record, soft []mad.MAD, passive, active netip.Addr) CMExchange {
	e := CMExchange{Frame: r.Frame, Side: "passive", Message: r.CM.Message, Request: inspect.Line(r)}
	var realM, softM []mad.MAD
	for _, rr := range real {
		e.Real = append(e.Real, inspect.Line(rr))
		realM = append(realM, madOf(rr))
	}
	for _, s := range soft {
		l, _ := cmLine(s, passive, active, r.Time)
		e.Softroce = append(e.Softroce, l)
		softM = append(softM, s)
	}
	// MRAs are the responder's choice of timing (IBTA 12.6.6).
	strip := func(ms []mad.MAD, who string) []mad.MAD {
		var out []mad.MAD
		for _, m := range ms {
			if m.AttrID() == mad.AttrMRA {
				e.Allowed = append(e.Allowed, who+" sent an MRA (IBTA 12.6.6: the receiver's choice)")
				continue
			}
			out = append(out, m)
		}
		return out
	}
	realM, softM = strip(realM, "real"), strip(softM, "softroce")
	var rm, sm mad.MAD
	if len(realM) > 0 {
		rm = realM[0]
	}
	if len(softM) > 0 {
		sm = softM[0]
	}
	switch {
	case rm == nil && sm == nil:
	case rm == nil:
		if len(real) == 0 && r.CM.Message != "REQ" {
			e.Allowed = append(e.Allowed, "no answer captured (the capture ends or the sniffer missed it); softroce sent "+sm.AttrID().String())
		} else {
			e.Failures = append(e.Failures, "real sent no answer, softroce sent "+sm.AttrID().String())
		}
	case sm == nil:
		e.Failures = append(e.Failures, "real sent "+rm.AttrID().String()+", softroce no answer")
	case rm.AttrID() != sm.AttrID():
		e.Failures = append(e.Failures, fmt.Sprintf("message: real %v, softroce %v", rm.AttrID(), sm.AttrID()))
	default:
		e.compareFields(req, rm, sm)
	}
	switch {
	case len(e.Failures) > 0:
		e.Verdict = Differ
	case len(e.Allowed) > 0:
		e.Verdict = Allowed
	default:
		e.Verdict = Agree
	}
	return e
}

func (e *CMExchange) compareFields(req, rm, sm mad.MAD) {
	aID := req.REQ().LocalCommID()
	if _, rem, _ := sm.CommIDs(); rem != aID {
		e.Failures = append(e.Failures, fmt.Sprintf("remote comm ID 0x%08x, the REQ's local comm ID is 0x%08x (IBTA 12.6)", rem, aID))
	}
	if rl, _, _ := rm.CommIDs(); rl != 0 {
		if sl, _, _ := sm.CommIDs(); sl != rl {
			e.Allowed = append(e.Allowed, "local comm ID: the side's own choice")
		}
	}
	switch sm.AttrID() {
	case mad.AttrREP:
		rp, sp := rm.REP(), sm.REP()
		if sp.LocalQPN() == 0 {
			e.Failures = append(e.Failures, "REP carries no QPN")
		}
		if sp.ResponderResources() > req.REQ().InitiatorDepth() {
			e.Failures = append(e.Failures, fmt.Sprintf("REP responder resources %d above the REQ's initiator depth %d (IBTA 12.7.22)", sp.ResponderResources(), req.REQ().InitiatorDepth()))
		}
		if sp.InitiatorDepth() > req.REQ().ResponderResources() {
			e.Failures = append(e.Failures, fmt.Sprintf("REP initiator depth %d above the REQ's responder resources %d (IBTA 12.7.22)", sp.InitiatorDepth(), req.REQ().ResponderResources()))
		}
		if sp.ResponderResources() != rp.ResponderResources() || sp.InitiatorDepth() != rp.InitiatorDepth() {
			e.Allowed = append(e.Allowed, fmt.Sprintf("responder resources/initiator depth: real %d/%d, softroce %d/%d, both within the REQ's limits", rp.ResponderResources(), rp.InitiatorDepth(), sp.ResponderResources(), sp.InitiatorDepth()))
		}
		if !bytes.Equal(rp.PrivateData(), sp.PrivateData()) {
			e.Failures = append(e.Failures, "REP private data not passed through as the application gave it")
		}
		e.Allowed = append(e.Allowed, "QPN, starting PSN and CA GUID: the side's own")
	case mad.AttrREJ:
		if rr, sr := rm.REJ().Reason(), sm.REJ().Reason(); rr != sr {
			e.Failures = append(e.Failures, fmt.Sprintf("REJ reason: real %d, softroce %d", rr, sr))
		}
		if !bytes.Equal(rm.REJ().PrivateData(), sm.REJ().PrivateData()) {
			e.Failures = append(e.Failures, "REJ private data not passed through as the application gave it")
		}
	}
}

// activeCM drives a softroce active CM: it dials the REQ's service ID, is
// fed the real passive side's REP (its comm IDs mapped onto softroce's
// REQ), and must answer RTU, compared with the captured active side's.
// It returns nothing when the capture holds no REP for the REQ at recs[at].
func activeCM(recs []inspect.Record, at int, used map[int]bool) []CMExchange {
	reqRec := &recs[at]
	req := madOf(reqRec)
	active, passive := reqRec.Src, reqRec.Dst
	aID := req.REQ().LocalCommID()
	sid := req.REQ().ServiceID()
	var repRec *inspect.Record
	for _, rr := range realAnswer(recs, at, active, passive, aID) {
		if m := madOf(rr); m != nil && m.AttrID() == mad.AttrREP {
			repRec = rr
		}
	}
	if repRec == nil || !sid.IsRDMACM() {
		return nil
	}
	// The captured active side's answer to the REP.
	var realRTU []*inspect.Record
	repID := madOf(repRec).REP().LocalCommID()
	for j := range recs {
		r := &recs[j]
		if r.Frame <= repRec.Frame || r.CM == nil || r.Src != active || r.Dst != passive {
			continue
		}
		if m := madOf(r); m != nil {
			if l, rem, ok := m.CommIDs(); ok && l == aID && rem == repID {
				realRTU = append(realRTU, r)
				break
			}
		}
	}
	if len(realRTU) > 0 {
		if m := madOf(realRTU[0]); m.AttrID() == mad.AttrREJ && m.REJ().Reason() == 28 {
			// The application refused the REP: Dial has no such choice,
			// so there is nothing to compare.
			return nil
		}
	}
	e := CMExchange{Frame: repRec.Frame, Message: "REP", Side: "active", Request: inspect.Line(repRec)}
	fail := func(why string) []CMExchange {
		e.Verdict, e.Failures = Differ, []string{why}
		return []CMExchange{e}
	}
	link := newTapLink(active.Unmap())
	defer link.Close()
	dev, err := verbs.Open(link, &verbs.Options{Name: "replay-cm-active"})
	if err != nil {
		return fail("open softroce: " + err.Error())
	}
	defer dev.Close()
	mc := newMemMAD()
	mc.from = cm.Peer{Addr: netip.AddrPortFrom(passive.Unmap(), nic.RoCEv2Port), QPN: 1}
	c, err := cm.New(dev, mc, &cm.Options{Clock: stillClock{reqRec.Time}})
	if err != nil {
		return fail("start softroce's CM: " + err.Error())
	}
	defer c.Close()
	<-mc.processed
	pd, err := dev.AllocPD()
	if err != nil {
		return fail(err.Error())
	}
	cq, err := dev.CreateCQ(16)
	if err != nil {
		return fail(err.Error())
	}
	qp, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		return fail(err.Error())
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := req.REQ()
	p := cm.ConnParam{ResponderResources: r.ResponderResources(), InitiatorDepth: r.InitiatorDepth(), RetryCount: r.RetryCount(), RNRRetryCount: r.RNRRetryCount()}
	wg.Go(func() { c.Dial(ctx, passive.Unmap(), sid.PortSpace(), sid.Port(), qp, &p) })
	sent := mc.waitSent()
	if len(sent) == 0 || sent[0].AttrID() != mad.AttrREQ {
		return fail("softroce's Dial sent no REQ")
	}
	soft := sent[0]
	rep := madOf(repRec)
	rep.REP().SetRemoteCommID(soft.REQ().LocalCommID())
	rep.SetTID(soft.TID())
	mc.feed(rep)
	answers := mc.waitSent()
	used[repRec.Frame] = true
	for _, rr := range realRTU {
		used[rr.Frame] = true
	}
	x := judgeCM(repRec, req, realRTU, answers, active, passive)
	x.Side, x.Message = "active", "REP"
	// The REQ whose comm ID the RTU must echo is softroce's, and the REP's
	// local comm ID is the real passive side's.
	x.Failures = nil
	x.Allowed = nil
	var rm, sm mad.MAD
	for _, rr := range realRTU {
		rm = madOf(rr)
	}
	for _, s := range answers {
		if s.AttrID() != mad.AttrMRA {
			sm = s
			break
		}
	}
	switch {
	case sm == nil && rm == nil:
	case sm == nil:
		x.Failures = append(x.Failures, "real sent "+rm.AttrID().String()+", softroce no answer")
	case rm == nil:
		x.Allowed = append(x.Allowed, "no answer captured (the capture ends or the sniffer missed it); softroce sent "+sm.AttrID().String())
	case rm.AttrID() != sm.AttrID():
		x.Failures = append(x.Failures, fmt.Sprintf("message: real %v, softroce %v", rm.AttrID(), sm.AttrID()))
	default:
		if l, rem, _ := sm.CommIDs(); rem != repID || l != soft.REQ().LocalCommID() {
			x.Failures = append(x.Failures, fmt.Sprintf("%v comm IDs 0x%08x/0x%08x, want softroce's REQ's 0x%08x and the REP's 0x%08x (IBTA 12.6)", sm.AttrID(), l, rem, soft.REQ().LocalCommID(), repID))
		}
		if sm.TID() != soft.TID() {
			x.Failures = append(x.Failures, fmt.Sprintf("%v transaction ID 0x%x, want the REQ's 0x%x (IBTA 12.6)", sm.AttrID(), sm.TID(), soft.TID()))
		}
		x.Allowed = append(x.Allowed, "local comm ID and transaction ID: the side's own choice")
	}
	switch {
	case len(x.Failures) > 0:
		x.Verdict = Differ
	case len(x.Allowed) > 0:
		x.Verdict = Allowed
	default:
		x.Verdict = Agree
	}
	return []CMExchange{x}
}
