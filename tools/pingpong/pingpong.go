// Package pingpong speaks the protocol of rdma-core's pingpong examples
// (libibverbs/examples/{rc,uc,ud,srq}_pingpong.c): the out-of-band TCP
// exchange of "LID:QPN:PSN:GID" messages and the SEND ping-pong that
// follows, so that softroce and ibv_rc_pingpong, ibv_uc_pingpong,
// ibv_ud_pingpong and ibv_srq_pingpong interoperate in either role.
//
// The four tools share the exchange and the loop; what differs is the
// service of the QPs, how many there are (srq_pingpong: -q QPs on one
// SRQ, and always MaxQP address messages each way), how they connect, and
// UD's address handle and 40-byte GRH at the head of every receive buffer.
package pingpong

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"time"

	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/internal/traffic"
	"github.com/softroce/softroce/qpstate"
	"github.com/softroce/softroce/verbs"
)

// Type is which tool's protocol to speak.
type Type string

// The pingpong tools.
const (
	RC  Type = "rc"  // ibv_rc_pingpong
	UC  Type = "uc"  // ibv_uc_pingpong
	UD  Type = "ud"  // ibv_ud_pingpong
	SRQ Type = "srq" // ibv_srq_pingpong: RC QPs on one shared receive queue
)

// Types lists the types in the order the command line documents them.
var Types = []Type{RC, UC, UD, SRQ}

// Tool is the rdma-core program this type talks to.
func (t Type) Tool() string { return "ibv_" + string(t) + "_pingpong" }

const (
	// MaxQP is srq_pingpong's QP limit, and the number of address
	// messages its exchange always carries each way (unused ones zero).
	MaxQP = 256
	// GRHLen is the room a UD receive buffer keeps at its head for the
	// GRH (IBTA 11.4.1.2); ud_pingpong sends from just after it.
	GRHLen = verbs.GRHLen
	// UDQKey is ud_pingpong's Q_Key, on its QP and in its sends.
	UDQKey = 0x11111111
)

// Config mirrors the tools' flags. Zero fields take the tool's default.
type Config struct {
	Type       Type   // default RC
	Server     string // host to connect to; empty: listen
	Port       int    // -p, TCP port of the exchange (18515)
	Size       int    // -s, message size (4096; UD: 1024)
	MTU        int    // -m, path MTU (1024); UD: not used, the port's MTU bounds Size
	RxDepth    int    // -r, receives posted (500)
	Iters      int    // -n, iterations (1000)
	NumQP      int    // -q, QPs on the SRQ (16); 1 for the other types
	SL         uint8  // -l, service level
	GIDIndex   int    // -g
	Events     bool   // -e: sleep on the completion channel instead of polling
	Check      bool   // -c (rc, uc): validate received buffers
	RemotePort uint16 // peer's UDP port, when not 4791 (softroce-to-softroce tests; not UD: its address handles name no port)
	Timeout    time.Duration
	// Dial and Listen replace the net package's for the TCP exchange
	// (e.g. to reach a peer inside a network namespace).
	Dial   func(ctx context.Context, network, addr string) (net.Conn, error)
	Listen func(network, addr string) (net.Listener, error)
}

// Defaults fills zero fields with the tool's defaults and checks what the
// tool checks, with the tool's words where it has some. Run calls it;
// calling it first reports a bad configuration before anything is opened.
func (c *Config) Defaults() error {
	if c.Type == "" {
		c.Type = RC
	}
	switch c.Type {
	case RC, UC, UD, SRQ:
	default:
		return fmt.Errorf("unknown pingpong type %q (want rc, uc, ud or srq)", c.Type)
	}
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.Port, 18515)
	if c.Type == UD {
		// ibv_ud_pingpong 44 sends 1024 bytes by default, though its
		// help says 2048; a peer expecting 1024 fails a larger message
		// with a local QP operation error, so the two must agree.
		def(&c.Size, 1024)
	} else {
		def(&c.Size, 4096)
	}
	def(&c.MTU, 1024)
	def(&c.RxDepth, 500)
	def(&c.Iters, 1000)
	if c.Type == SRQ {
		def(&c.NumQP, 16)
	} else {
		def(&c.NumQP, 1)
	}
	if c.Timeout == 0 {
		c.Timeout = 30 * time.Second
	}
	switch {
	case c.Port < 0 || c.Port > 65535:
		return fmt.Errorf("TCP port %d out of range (-p takes 1..65535)", c.Port)
	case c.Size < 0 || c.RxDepth < 0 || c.Iters < 0 || c.NumQP < 0:
		return fmt.Errorf("negative -s %d, -r %d, -n %d or -q %d", c.Size, c.RxDepth, c.Iters, c.NumQP)
	case c.NumQP != 1 && c.Type != SRQ:
		return fmt.Errorf("%s has one QP: -q is srq_pingpong's (use --type srq)", c.Type.Tool())
	case c.NumQP > MaxQP:
		return fmt.Errorf("%d QPs: ibv_srq_pingpong's exchange carries at most %d (lower -q)", c.NumQP, MaxQP)
	case c.NumQP > c.RxDepth:
		return fmt.Errorf("rx_depth %d is too small for %d QPs -- must have at least one receive per QP (raise -r or lower -q)", c.RxDepth, c.NumQP)
	case c.Check && (c.Type == UD || c.Type == SRQ):
		return fmt.Errorf("%s has no buffer validation: -c is for --type rc and uc", c.Type.Tool())
	}
	switch c.MTU {
	case 256, 512, 1024, 2048, 4096:
	default:
		return fmt.Errorf("path MTU %d: -m takes 256, 512, 1024, 2048 or 4096", c.MTU)
	}
	return nil
}

// Result is what a run measured.
type Result struct {
	Local, Remote []Dest // one per QP
	Iters         int
	Bytes         int64 // size * iters * 2, as the tools count
	Elapsed       time.Duration
	CQEvents      int // completion events waited for (-e)
	// GRH is, for UD, the first GRHLen bytes of the receive buffer after
	// the last receive: the GRH of the last datagram (ud_pingpong itself
	// never reads it).
	GRH [GRHLen]byte
	// Stats are the QPs' transport counters summed at the end of the
	// run (retransmissions, timeouts, sequence NAKs: what loss cost).
	Stats verbs.QPStats
}

// Mbps is the throughput the tools print, in Mbit/s.
func (r *Result) Mbps() float64 { return float64(r.Bytes) * 8 / r.Elapsed.Seconds() / 1e6 }

const (
	recvID = 1 // the tools' PINGPONG_RECV_WRID
	sendID = 2 // PINGPONG_SEND_WRID; the two are also the pending bits
)

// session is one run's verbs objects.
type session struct {
	cfg   *Config
	dev   *verbs.Device
	pd    *verbs.PD
	buf   []byte
	mr    *verbs.MR
	cq    *verbs.CQ
	srq   *verbs.SRQ
	qps   []*verbs.QP
	local []Dest
	ah    *verbs.AH // UD: the peer
	rem   []Dest
}

// Run performs one session of cfg.Type's tool on dev, printing what the
// tool prints to out.
func Run(ctx context.Context, dev *verbs.Device, cfg Config, out io.Writer) (*Result, error) {
	if err := cfg.Defaults(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	s := &session{cfg: &cfg, dev: dev}
	defer s.close()
	if err := s.setup(); err != nil {
		return nil, err
	}
	if cfg.Events {
		s.cq.ReqNotify(false)
	}
	for _, d := range s.local {
		sep := ","
		if cfg.Type == UD {
			sep = ":" // ud_pingpong's own spelling of this one line
		}
		fmt.Fprintf(out, "  local address:  LID 0x%04x, QPN 0x%06x, PSN 0x%06x%s GID %s\n", d.LID, d.QPN, d.PSN, sep, gidString(d.GID))
	}
	msgs := s.local
	if cfg.Type == SRQ {
		msgs = make([]Dest, MaxQP)
		copy(msgs, s.local)
	}
	rem, err := exchange(ctx, &cfg, msgs, s.connect)
	if err != nil {
		return nil, err
	}
	for _, d := range rem[:cfg.NumQP] {
		fmt.Fprintf(out, "  remote address: LID 0x%04x, QPN 0x%06x, PSN 0x%06x, GID %s\n", d.LID, d.QPN, d.PSN, gidString(d.GID))
	}
	res, err := s.loop(ctx)
	if err != nil {
		return nil, err
	}
	res.Local, res.Remote = s.local, s.rem
	qps := make([]traffic.QP, len(s.qps))
	for i, qp := range s.qps {
		qps[i] = qp
	}
	res.Stats = traffic.Sum(qps)
	if cfg.Type == UD {
		copy(res.GRH[:], s.buf)
	}
	us := float64(res.Elapsed.Microseconds())
	fmt.Fprintf(out, "%d bytes in %.2f seconds = %.2f Mbit/sec\n", res.Bytes, us/1e6, float64(res.Bytes)*8/us)
	fmt.Fprintf(out, "%d iters in %.2f seconds = %.2f usec/iter\n", res.Iters, us/1e6, us/float64(res.Iters))
	if cfg.Server == "" && cfg.Check {
		for off := 0; off < cfg.Size; off += pageSize {
			if s.buf[off] != 0 {
				fmt.Fprintf(out, "invalid data in page %d\n", off/pageSize)
			}
		}
	}
	return res, nil
}

// pageSize is the page the tools' -c marks the first byte of.
const pageSize = 4096

func (s *session) setup() error {
	cfg, dev := s.cfg, s.dev
	if cfg.Type == UD {
		if mtu := dev.QueryPort().ActiveMTU; cfg.Size > mtu {
			return fmt.Errorf("Requested size larger than port MTU (%d): a UD message is one packet (lower -s)", mtu)
		}
	}
	var err error
	if s.pd, err = dev.AllocPD(); err != nil {
		return err
	}
	n := cfg.Size
	if cfg.Type == UD {
		n += GRHLen
	}
	s.buf = make([]byte, n)
	if cfg.Type != SRQ {
		for i := range s.buf {
			s.buf[i] = 0x7b // the fill of rc, uc and ud_pingpong; srq's is zero
		}
	}
	if s.mr, err = s.pd.RegMR(s.buf, verbs.AccessLocalWrite); err != nil {
		return err
	}
	if s.cq, err = dev.CreateCQ(cfg.RxDepth + cfg.NumQP); err != nil {
		return err
	}
	init := verbs.QPInitAttr{Type: verbs.QPTypeRC, SendCQ: s.cq, RecvCQ: s.cq,
		Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: cfg.RxDepth, MaxSendSGE: 1, MaxRecvSGE: 1}}
	switch cfg.Type {
	case UC:
		init.Type = verbs.QPTypeUC
	case UD:
		init.Type = verbs.QPTypeUD
	case SRQ:
		if s.srq, err = s.pd.CreateSRQ(verbs.SRQInitAttr{MaxWR: cfg.RxDepth, MaxSGE: 1}); err != nil {
			return err
		}
		init.SRQ = s.srq
		init.Cap.MaxRecvWR, init.Cap.MaxRecvSGE = 0, 0
	}
	gid, err := dev.QueryGID(cfg.GIDIndex)
	if err != nil {
		return fmt.Errorf("%w (choose another with -g)", err)
	}
	for range cfg.NumQP {
		qp, err := s.pd.CreateQP(init)
		if err != nil {
			return fmt.Errorf("couldn't create QP %d: %w", len(s.qps), err)
		}
		s.qps = append(s.qps, qp)
		// The tools move their QPs to INIT at creation, with no remote
		// access (UD: with its Q_Key).
		attr := verbs.QPAttr{State: verbs.StateInit, Port: 1}
		mask := qpstate.AttrState | qpstate.AttrPKeyIndex | qpstate.AttrPort
		if cfg.Type == UD {
			attr.QKey, mask = UDQKey, mask|qpstate.AttrQKey
		} else {
			mask |= qpstate.AttrAccessFlags
		}
		if err := qp.Modify(&attr, mask); err != nil {
			return fmt.Errorf("failed to modify QP %d to INIT: %w", len(s.qps)-1, err)
		}
		s.local = append(s.local, Dest{QPN: qp.Num(), PSN: rand.Uint32() & 0xffffff, GID: gid})
	}
	for i := range cfg.RxDepth {
		if err := s.postRecv(); err != nil {
			return fmt.Errorf("couldn't post receive %d: %w", i, err)
		}
	}
	return nil
}

func (s *session) close() {
	for _, qp := range s.qps {
		qp.Destroy()
	}
	if s.srq != nil {
		s.srq.Destroy()
	}
	if s.cq != nil {
		s.dev.DestroyCQ(s.cq)
	}
	if s.mr != nil {
		s.dev.DeregMR(s.mr)
	}
	if s.ah != nil {
		s.ah.Destroy()
	}
	if s.pd != nil {
		s.pd.Dealloc()
	}
}

func (s *session) postRecv() error {
	wr := &verbs.RecvWR{ID: recvID, SGL: []verbs.SGE{{Addr: s.mr.Addr(), Length: uint32(len(s.buf)), LKey: s.mr.LKey()}}}
	if s.srq != nil {
		return s.srq.PostRecv(wr)
	}
	return s.qps[0].PostRecv(wr)
}

func (s *session) postSend(i int) error {
	sge := verbs.SGE{Addr: s.mr.Addr(), Length: uint32(s.cfg.Size), LKey: s.mr.LKey()}
	wr := &verbs.SendWR{ID: sendID, Opcode: verbs.WRSend, Flags: verbs.SendSignaled}
	if s.cfg.Type == UD {
		sge.Addr += GRHLen
		wr.AH, wr.RemoteQPN, wr.RemoteQKey = s.ah.AV(), s.rem[0].QPN, UDQKey
	}
	wr.SGL = []verbs.SGE{sge}
	return s.qps[i].PostSend(wr)
}

// connect checks the peer's addresses and brings every QP to RTS against
// its counterpart (UD: to RTS, and an address handle to the peer).
func (s *session) connect(rem []Dest) error {
	r, err := checkRemote(s.cfg, rem)
	if err != nil {
		return err
	}
	s.rem = r
	for i, d := range r {
		if err := s.connectQP(i, d); err != nil {
			return fmt.Errorf("couldn't connect QP %d to the remote QP 0x%06x: %w", i, d.QPN, err)
		}
	}
	return nil
}

// checkRemote returns the peer's addresses that pair with this side's QPs,
// or why they cannot.
func checkRemote(cfg *Config, rem []Dest) ([]Dest, error) {
	// srq_pingpong announces its QPs first and zeros after them; both
	// sides must have the same number, or QPs would pair with QPN 0.
	n := 0
	for n < len(rem) && rem[n].QPN != 0 {
		n++
	}
	for _, d := range rem[n:] {
		if d.QPN != 0 {
			return nil, fmt.Errorf("the peer's addresses have a gap (QPN 0 before QPN 0x%06x): not %s's exchange", d.QPN, cfg.Type.Tool())
		}
	}
	if n != cfg.NumQP {
		if cfg.Type == SRQ {
			return nil, fmt.Errorf("the peer announced %d QPs and this side has %d: give both sides the same -q", n, cfg.NumQP)
		}
		return nil, fmt.Errorf("the peer announced QPN 0: not %s's exchange", cfg.Type.Tool())
	}
	for _, d := range rem[:n] {
		if d.GID == (verbs.GID{}) {
			return nil, fmt.Errorf("the peer sent no GID (all zeros), and RoCE needs one: run %s with -g N, N the index of its device's GID for the address it uses: "+
				"-g 1 for an IPv4 address on kernel rdma_rxe and under `softroce run` (index 0 there is the interface's link-local IPv6 GID; a device without one has the address at index 0)", cfg.Type.Tool())
		}
	}
	return rem[:n], nil
}

func (s *session) connectQP(i int, rem Dest) error {
	cfg, qp := s.cfg, s.qps[i]
	av := verbs.AddressVector{DGID: rem.GID, SGIDIndex: uint8(cfg.GIDIndex), HopLimit: 64, SL: cfg.SL}
	rtr := verbs.QPAttr{State: verbs.StateRTR}
	rtrMask := qpstate.AttrState
	rts := verbs.QPAttr{State: verbs.StateRTS, SQPSN: s.local[i].PSN}
	rtsMask := qpstate.AttrState | qpstate.AttrSQPSN
	switch cfg.Type {
	case RC, SRQ:
		rtr.AV, rtr.PathMTU, rtr.DestQPN, rtr.RQPSN, rtr.MaxDestRDAtomic, rtr.MinRNRTimer = av, cfg.MTU, rem.QPN, rem.PSN, 1, 12
		rtrMask |= qpstate.AttrAV | qpstate.AttrPathMTU | qpstate.AttrDestQPN | qpstate.AttrRQPSN | qpstate.AttrMaxDestRDAtomic | qpstate.AttrMinRNRTimer
		rts.Timeout, rts.RetryCnt, rts.RNRRetry, rts.MaxRDAtomic = 14, 7, 7, 1
		rtsMask |= qpstate.AttrTimeout | qpstate.AttrRetryCnt | qpstate.AttrRNRRetry | qpstate.AttrMaxQPRDAtomic
	case UC:
		rtr.AV, rtr.PathMTU, rtr.DestQPN, rtr.RQPSN = av, cfg.MTU, rem.QPN, rem.PSN
		rtrMask |= qpstate.AttrAV | qpstate.AttrPathMTU | qpstate.AttrDestQPN | qpstate.AttrRQPSN
	}
	if err := qp.Modify(&rtr, rtrMask); err != nil {
		return fmt.Errorf("modify to RTR: %w", err)
	}
	if err := qp.Modify(&rts, rtsMask); err != nil {
		return fmt.Errorf("modify to RTS: %w", err)
	}
	if cfg.Type == UD {
		ah, err := s.pd.CreateAH(verbs.AHAttr{DGID: rem.GID, SGIDIndex: cfg.GIDIndex, HopLimit: av.HopLimit, SL: cfg.SL})
		if err != nil {
			return fmt.Errorf("failed to create AH: %w", err)
		}
		s.ah = ah
	} else if cfg.RemotePort != 0 {
		qp.SetRemotePort(cfg.RemotePort)
	}
	return nil
}

// loop is the ping-pong: the client sends first on every QP; afterwards a
// QP sends again once its previous SEND completed and a receive arrived on
// it (the tools' pending bits), until both counts reach the iterations.
// srq_pingpong counts over all its QPs, so its -n is a total, like the
// others'.
func (s *session) loop(ctx context.Context) (*Result, error) {
	cfg := s.cfg
	idx := make(map[uint32]int, len(s.qps))
	for i, qp := range s.qps {
		idx[qp.Num()] = i
	}
	pending := make([]int, len(s.qps))
	for i := range s.qps {
		pending[i] = recvID
		if cfg.Server != "" {
			if cfg.Check {
				// -c: the client zeroes the first byte of every page.
				for off := 0; off < cfg.Size; off += pageSize {
					s.buf[off] = 0
				}
			}
			if err := s.postSend(i); err != nil {
				return nil, fmt.Errorf("couldn't post send: %w", err)
			}
			pending[i] |= sendID
		}
	}
	start := time.Now()
	res := &Result{Iters: cfg.Iters, Bytes: int64(cfg.Size) * int64(cfg.Iters) * 2}
	rcnt, scnt, routs := 0, 0, cfg.RxDepth
	wcs := make([]verbs.WC, cfg.RxDepth+cfg.NumQP)
	for rcnt < cfg.Iters || scnt < cfg.Iters {
		n, err := s.wait(ctx, wcs, res)
		if err != nil {
			hint := "is the peer still running?"
			if cfg.Type == UC || cfg.Type == UD {
				hint += " " + string(cfg.Type) + " does not retransmit: one lost packet stops the ping-pong"
			}
			return nil, fmt.Errorf("waiting for completions after %d sends and %d receives: %w (%s)", scnt, rcnt, err, hint)
		}
		for _, wc := range wcs[:n] {
			if wc.Status != cq.Success {
				return nil, fmt.Errorf("failed status %s (%d) for wr_id %d", wc.Status, uint8(wc.Status), wc.WRID)
			}
			i, ok := idx[wc.QPNum]
			if !ok {
				return nil, fmt.Errorf("couldn't find QPN %06x", wc.QPNum)
			}
			switch wc.WRID {
			case sendID:
				scnt++
			case recvID:
				if routs--; routs <= cfg.NumQP {
					for routs < cfg.RxDepth {
						if err := s.postRecv(); err != nil {
							return nil, fmt.Errorf("couldn't post receive (%d): %w", routs, err)
						}
						routs++
					}
				}
				rcnt++
			default:
				return nil, fmt.Errorf("completion for unknown wr_id %d", wc.WRID)
			}
			pending[i] &^= int(wc.WRID)
			if scnt < cfg.Iters && pending[i] == 0 {
				if err := s.postSend(i); err != nil {
					return nil, fmt.Errorf("couldn't post send: %w", err)
				}
				pending[i] = recvID | sendID
			}
		}
	}
	res.Elapsed = time.Since(start)
	return res, nil
}

// wait returns the next completions. With -e it sleeps on the completion
// channel as the tools do (event, re-arm, poll); otherwise it blocks in
// CQ.Wait, which does not spin either.
func (s *session) wait(ctx context.Context, wcs []verbs.WC, res *Result) (int, error) {
	if !s.cfg.Events {
		return s.cq.Wait(ctx, wcs)
	}
	select {
	case <-s.cq.Notify():
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	res.CQEvents++
	s.cq.ReqNotify(false)
	n := s.cq.Poll(wcs)
	if n == 0 {
		if err := s.cq.Err(); err != nil {
			return 0, err
		}
	}
	return n, nil
}
