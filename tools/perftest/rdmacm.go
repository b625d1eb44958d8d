package perftest

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/softroce/softroce/cm"
	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/verbs"
)

// With -R perftest 4.5 uses rdma_cm twice, both times on port Port of
// RDMA_PS_TCP:
//
//  1. for its exchange: one RC QP connected by the CM (no private data,
//     no READ resources, 7 retries, RNR retries forever), over which every
//     message of the TCP exchange travels as one SEND of the same size
//     into a single posted receive of BinaryKeysLen bytes; the KEYS
//     messages and the barriers are binary (Keys.MarshalBinary), and
//     there is no "done";
//  2. for the test's QPs: after a barrier the client connects one rdma_cm
//     connection per QP (READ tests offer -o responder resources and
//     initiator depth; UD QPs are resolved by SIDR on RDMA_PS_UDP instead
//     and take rdma_cm's Q_Key), another barrier follows, and the KEYS
//     exchange of the TCP flow carries only the buffer addresses and
//     rkeys, since the QPs are already in RTS (no GID check, no modify to
//     RTR/RTS).
//
// The perftest server listens for each step and stops listening in
// between; the client retries a rejected test connection ten times, 100
// ms apart. At the end the client disconnects every test QP, then the
// exchange's.

// cmSlot is the room of one message on the exchange QP.
const cmSlot = 64

// cmRecvs is the number of receives the exchange QP keeps posted.
const cmRecvs = 4

// cmRetryDelay is how long a dial refused with "no listener" waits before
// trying again: perftest's server listens only once it is ready.
const cmRetryDelay = 100 * time.Millisecond

// cmLinger bounds how long the passive side waits, after the last
// barrier, for the active side's disconnects before disconnecting itself.
const cmLinger = 5 * time.Second

// cmChannel is the exchange over rdma_cm.
type cmChannel struct {
	dev    *verbs.Device
	cm     *cm.CM
	ownCM  bool
	l      *cm.Listener // passive side: still listening for the test QPs
	lu     *cm.Listener // passive side, UD: the test QPs' SIDR requests
	conn   *cm.Conn
	peer   netip.Addr
	pd     *verbs.PD
	scq    *verbs.CQ
	rcq    *verbs.CQ
	mr     *verbs.MR
	qp     *verbs.QP
	buf    []byte // slot 0 sends; slots 1..cmRecvs receive
	wc     []verbs.WC
	swr    verbs.SendWR
	rwr    verbs.RecvWR
	tests  []*cm.Conn // the test QPs' connections
	active bool
}

// openCMChannel connects the exchange: the connector dials Server (until
// a listener answers or ctx ends), the listener accepts the first request
// on Port.
func openCMChannel(ctx context.Context, dev *verbs.Device, cfg *Config) (*cmChannel, error) {
	ch := &cmChannel{dev: dev, cm: cfg.CM, buf: make([]byte, (1+cmRecvs)*cmSlot), wc: make([]verbs.WC, 1),
		active: cfg.Server != ""}
	ok := false
	defer func() {
		if !ok {
			ch.close(false)
		}
	}()
	var err error
	if ch.cm == nil {
		if ch.cm, err = cm.Open(dev, nil); err != nil {
			return nil, fmt.Errorf("perftest -R: start the connection manager: %w", err)
		}
		ch.ownCM = true
	}
	if ch.pd, err = dev.AllocPD(); err != nil {
		return nil, fmt.Errorf("perftest -R: %w", err)
	}
	if ch.scq, err = dev.CreateCQ(2); err != nil {
		return nil, fmt.Errorf("perftest -R: %w", err)
	}
	if ch.rcq, err = dev.CreateCQ(cmRecvs); err != nil {
		return nil, fmt.Errorf("perftest -R: %w", err)
	}
	if ch.mr, err = ch.pd.RegMR(ch.buf, verbs.AccessLocalWrite); err != nil {
		return nil, fmt.Errorf("perftest -R: %w", err)
	}
	if ch.qp, err = ch.pd.CreateQP(verbs.QPInitAttr{SendCQ: ch.scq, RecvCQ: ch.rcq,
		Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: cmRecvs, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
		return nil, fmt.Errorf("perftest -R: %w", err)
	}
	// The receives go in before the connection, as perftest's do: the
	// peer may send as soon as it is established.
	if err := ch.qp.Init(0); err != nil {
		return nil, fmt.Errorf("perftest -R: %w", err)
	}
	ch.swr = verbs.SendWR{Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{{Addr: ch.mr.Addr(), LKey: ch.mr.LKey()}}}
	ch.rwr = verbs.RecvWR{SGL: make([]verbs.SGE, 1)}
	for i := 1; i <= cmRecvs; i++ {
		if err := ch.postRecv(i); err != nil {
			return nil, err
		}
	}
	param := &cm.ConnParam{RetryCount: 7, RNRRetryCount: 7}
	port := uint16(cfg.Port)
	if ch.active {
		if ch.peer, err = netip.ParseAddr(cfg.Server); err != nil {
			return nil, fmt.Errorf("perftest -R: server %q is not an IP address (rdma_cm needs the peer's RoCE address)", cfg.Server)
		}
		if ch.conn, err = dialRetry(ctx, ch.cm, ch.peer, port, ch.qp, param, -1); err != nil {
			return nil, fmt.Errorf("perftest -R: connect the exchange to %v port %d: %w (is the perftest server running with -R?)", ch.peer, port, err)
		}
	} else {
		if ch.l, err = ch.cm.Listen(cm.PortSpaceTCP, port); err != nil {
			return nil, fmt.Errorf("perftest -R: listen on rdma_cm port %d: %w (choose another with -p)", port, err)
		}
		if cfg.Conn == verbs.QPTypeUD {
			// UD QPs are resolved on RDMA_PS_UDP, the same port.
			if ch.lu, err = ch.cm.Listen(cm.PortSpaceUDP, port); err != nil {
				return nil, fmt.Errorf("perftest -R: listen on rdma_cm UDP port %d: %w (choose another with -p)", port, err)
			}
		}
		req, err := ch.l.Next(ctx)
		if err != nil {
			return nil, fmt.Errorf("perftest -R: wait for a client on rdma_cm port %d: %w", port, err)
		}
		ch.peer = req.Remote
		if ch.conn, err = req.Accept(ctx, ch.qp, param); err != nil {
			return nil, fmt.Errorf("perftest -R: accept the exchange from %v: %w", req.Remote, err)
		}
	}
	ok = true
	return ch, nil
}

// dialRetry dials until a listener answers: at most tries refusals (-1:
// until ctx ends).
func dialRetry(ctx context.Context, c *cm.CM, peer netip.Addr, port uint16, qp *verbs.QP, p *cm.ConnParam, tries int) (*cm.Conn, error) {
	for {
		k, err := c.Dial(ctx, peer, cm.PortSpaceTCP, port, qp, p)
		if !errors.Is(err, cm.ErrNoListener) || tries == 0 {
			return k, err
		}
		if tries > 0 {
			tries--
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(cmRetryDelay):
		}
	}
}

func (ch *cmChannel) postRecv(slot int) error {
	ch.rwr.ID = uint64(slot)
	ch.rwr.SGL[0] = verbs.SGE{Addr: ch.mr.Addr() + uint64(slot*cmSlot), Length: cmSlot, LKey: ch.mr.LKey()}
	if err := ch.qp.PostRecv(&ch.rwr); err != nil {
		return fmt.Errorf("perftest -R: post a receive on the exchange QP: %w", err)
	}
	return nil
}

func (ch *cmChannel) send(ctx context.Context, step string, my []byte) error {
	if len(my) > BinaryKeysLen {
		return fmt.Errorf("perftest -R %s: %d-byte message does not fit perftest's %d-byte receive", step, len(my), BinaryKeysLen)
	}
	copy(ch.buf, my)
	ch.swr.SGL[0].Length = uint32(len(my))
	if err := ch.qp.PostSend(&ch.swr); err != nil {
		return fmt.Errorf("perftest -R %s: send: %w", step, err)
	}
	if _, err := ch.scq.Wait(ctx, ch.wc); err != nil {
		return fmt.Errorf("perftest -R %s: send: %w", step, ch.ctxErr(err))
	}
	if st := ch.wc[0].Status; st != cq.Success {
		return fmt.Errorf("perftest -R %s: send completed with %v (has the peer gone?)", step, st)
	}
	return nil
}

func (ch *cmChannel) recv(ctx context.Context, step string, rem []byte) error {
	if _, err := ch.rcq.Wait(ctx, ch.wc); err != nil {
		return fmt.Errorf("perftest -R %s: receive: %w", step, ch.ctxErr(err))
	}
	wc := ch.wc[0]
	if wc.Status != cq.Success {
		return fmt.Errorf("perftest -R %s: receive completed with %v (has the peer gone?)", step, wc.Status)
	}
	slot := int(wc.WRID)
	if slot < 1 || slot > cmRecvs {
		return fmt.Errorf("perftest -R %s: completion for unknown receive %#x", step, wc.WRID)
	}
	if int(wc.ByteLen) != len(rem) {
		return fmt.Errorf("%w: perftest -R %s: %d-byte message, want %d", ErrMalformed, step, wc.ByteLen, len(rem))
	}
	copy(rem, ch.buf[slot*cmSlot:])
	return ch.postRecv(slot)
}

// ctxErr says that the exchange's connection ended, when it did, rather
// than only that the wait was cut short.
func (ch *cmChannel) ctxErr(err error) error {
	select {
	case <-ch.conn.Done():
		return fmt.Errorf("%w: the peer disconnected (%v); see its output", err, ch.conn.Err())
	default:
		return err
	}
}

// xchg is ctx_xchg_data over rdma_cm: the connector sends first.
func (ch *cmChannel) xchg(ctx context.Context, step string, my, rem []byte) error {
	if ch.active {
		if err := ch.send(ctx, step, my); err != nil {
			return err
		}
	}
	if err := ch.recv(ctx, step, rem); err != nil {
		return err
	}
	if !ch.active {
		return ch.send(ctx, step, my)
	}
	return nil
}

// connectTests connects the test QPs through the CM, QP i as the i-th
// connection (perftest numbers its QPs in the order they connect). RC: a
// READ or atomic test offers -o responder resources and initiator depth,
// the others none, as perftest does; retries and RNR retries are 7. UD:
// the QPs take rdma_cm's Q_Key (cm.UDPQKey), the client resolves each
// with a SIDR_REQ and sends where the SIDR_REP says, the server answers
// with its QP's number.
func (ch *cmChannel) connectTests(ctx context.Context, s *session) error {
	cfg := &s.cfg
	port := uint16(cfg.Port)
	var rd uint8
	if cfg.Test == Read || cfg.Test == Atomic {
		rd = uint8(cfg.OutReads)
	}
	param := &cm.ConnParam{ResponderResources: rd, InitiatorDepth: rd, RetryCount: 7, RNRRetryCount: 7}
	for i, c := range s.qps {
		var err error
		if cfg.Conn == verbs.QPTypeUD {
			err = ch.connectUD(ctx, s, c, port)
		} else {
			var k *cm.Conn
			if ch.active {
				// perftest retries ten times, 100 ms apart; a slow server
				// may need longer to listen again, so retry until ctx ends.
				k, err = dialRetry(ctx, ch.cm, ch.peer, port, c.qp, param, -1)
			} else {
				var req *cm.ConnRequest
				if req, err = ch.l.Next(ctx); err == nil {
					k, err = req.Accept(ctx, c.qp, param)
				}
			}
			if err == nil {
				ch.tests = append(ch.tests, k)
			}
		}
		if err != nil {
			return fmt.Errorf("perftest -R: connect test QP %d: %w", i, err)
		}
	}
	for _, l := range []**cm.Listener{&ch.l, &ch.lu} {
		if *l != nil {
			(*l).Close()
			*l = nil
		}
	}
	return nil
}

func (ch *cmChannel) connectUD(ctx context.Context, s *session, c *qpCtx, port uint16) error {
	if err := c.qp.ReadyUD(cm.UDPQKey, c.local.PSN); err != nil {
		return fmt.Errorf("UD QP to RTS: %w", err)
	}
	if !ch.active {
		req, err := ch.lu.Next(ctx)
		if err != nil {
			return err
		}
		if !req.UD() {
			req.Reject(nil)
			return fmt.Errorf("%w: an RC request on the UD test's port (use -c UD on both sides)", ErrMalformed)
		}
		return req.AcceptUD(c.qp.Num(), cm.UDPQKey, nil)
	}
	for {
		r, err := ch.cm.ResolveUD(ctx, ch.peer, port, nil)
		if errors.Is(err, cm.ErrNoListener) && ctx.Err() == nil {
			select {
			case <-ctx.Done():
			case <-time.After(cmRetryDelay):
			}
			continue
		}
		if err != nil {
			return err
		}
		return s.udDest(c, verbs.GIDFromAddr(ch.peer), r.QPN, r.QKey)
	}
}

// close ends the connections. After a good run the active side
// disconnects (the test QPs first, as perftest does) and the passive side
// first waits a while for the active side to do so; either way a
// connection still up is disconnected, each wait bounded.
func (ch *cmChannel) close(good bool) {
	conns := append(ch.tests, ch.conn)
	if good && !ch.active {
		deadline := time.NewTimer(cmLinger)
		for _, k := range conns {
			if k == nil {
				continue
			}
			select {
			case <-k.Done():
			case <-deadline.C:
			}
		}
		deadline.Stop()
	}
	for _, k := range conns {
		if k == nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), cmLinger)
		k.Disconnect(ctx)
		cancel()
	}
	for _, l := range []*cm.Listener{ch.l, ch.lu} {
		if l != nil {
			l.Close()
		}
	}
	if ch.qp != nil {
		ch.qp.Destroy()
	}
	if ch.mr != nil {
		ch.dev.DeregMR(ch.mr)
	}
	for _, c := range []*verbs.CQ{ch.scq, ch.rcq} {
		if c != nil {
			ch.dev.DestroyCQ(c)
		}
	}
	if ch.pd != nil {
		ch.pd.Dealloc()
	}
	if ch.ownCM && ch.cm != nil {
		ch.cm.Close()
	}
}
