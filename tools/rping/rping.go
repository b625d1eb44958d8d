// Package rping is rdmacm-utils' rping on softroce: an RC connection made
// by package cm (rdma_cm), then the ping loop of librdmacm's example,
// interoperable with the real tool in either role.
//
// One ping, as rping does it:
//
//	client: SEND {start buffer's address, rkey, size}   (struct rping_rdma_info:
//	                                                     be64 addr, be32 rkey, be32 size)
//	server: RDMA READ of the start buffer, then SEND "go ahead"
//	client: SEND {sink buffer's address, rkey, size}
//	server: RDMA WRITE of what it read into the sink, then SEND "go ahead"
//	client: compares the sink with the start buffer (-V), prints it (-v)
//
// The start buffer holds "rdma-ping-N: " followed by letters from 'A'
// (65) to 'z' (122), wrapping, starting one further along on each ping,
// and a NUL in its last byte (see Fill). The client pings Count times (0:
// forever) and disconnects; a server serves one connection (or, with
// Persistent, every one until it is stopped). The messages and exit
// statuses are rping's: 0, 22 for a refused command line, 255 for a
// failed run.
package rping

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/softroce/softroce/cm"
	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/verbs"
)

// InfoLen is the size of struct rping_rdma_info, the only message rping
// SENDs: be64 buf, be32 rkey, be32 size.
const InfoLen = 16

// rping's queue sizes: 16 sends, 2 receives, a CQ of twice the send depth.
const (
	sqDepth = 16
	rqDepth = 2
)

// rping's states (enum test_state), whose numbers its messages print.
const (
	stIdle = 1 + iota
	stConnectRequest
	stAddrResolved
	stRouteResolved
	stConnected
	stReadAdv
	stReadComplete
	stWriteAdv
	stWriteComplete
	stDisconnected
	stError
)

// ConnParam is what rping puts in rdma_conn_param: one READ in flight
// each way, 7 transport retries, RNR retries forever.
var ConnParam = cm.ConnParam{ResponderResources: 1, InitiatorDepth: 1, RetryCount: 7, RNRRetryCount: 7}

// Fill writes ping number ping into buf as rping's client does: the
// "rdma-ping-%d: " prefix, then characters from 'A'+ping%58 on, each one
// further, back to 'A' after 'z', and a NUL in the last byte.
func Fill(buf []byte, ping int) {
	if len(buf) == 0 {
		return
	}
	n := copy(buf, fmt.Sprintf("rdma-ping-%d: ", ping))
	c := byte(65 + ping%58)
	for i := n; i < len(buf); i++ {
		buf[i] = c
		if c++; c > 122 {
			c = 65
		}
	}
	buf[len(buf)-1] = 0
}

// Line is the "ping data: ..." line rping -v prints for ping number ping
// of size bytes (without the newline).
func Line(ping, size int) string {
	b := make([]byte, size)
	Fill(b, ping)
	return "ping data: " + cstring(b)
}

// cstring is b up to its first NUL (all of it without one).
func cstring(b []byte) string {
	if i := strings.IndexByte(string(b), 0); i >= 0 {
		return string(b[:i])
	}
	return string(b)
}

// Failed is a run that failed after its messages were printed; the
// command exits with ExitFailed.
type Failed struct{ Msg string }

func (e *Failed) Error() string { return e.Msg }

// ExitCode is the process exit status for Run's error.
func ExitCode(err error) int {
	switch {
	case err == nil:
		return 0
	case IsUsage(err):
		return ExitUsage
	}
	return ExitFailed
}

// syncWriter serializes the lines of concurrent connections (-P).
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) printf(format string, a ...any) {
	s.mu.Lock()
	fmt.Fprintf(s.w, format, a...)
	s.mu.Unlock()
}

// Run runs cfg on dev's connection manager c (opened on dev when nil):
// rping's stdout lines (-v, -d) go to stdout, its error lines to stderr.
// A client returns after Count pings and a disconnect; a server after
// its one connection ends, or with Persistent when ctx ends.
func Run(ctx context.Context, dev *verbs.Device, c *cm.CM, cfg Config, stdout, stderr io.Writer) error {
	if c == nil {
		var err error
		if c, err = cm.Open(dev, nil); err != nil {
			fmt.Fprintf(stderr, "rdma_create_id: %v\n", err)
			return &Failed{err.Error()}
		}
		defer c.Close()
	}
	r := &runner{dev: dev, cm: c, cfg: cfg, out: &syncWriter{w: stdout}, err: &syncWriter{w: stderr}}
	if cfg.Server {
		return r.server(ctx)
	}
	return r.client(ctx)
}

type runner struct {
	dev *verbs.Device
	cm  *cm.CM
	cfg Config
	out *syncWriter
	err *syncWriter
}

func (r *runner) debug(format string, a ...any) {
	if r.cfg.Debug {
		r.out.printf(format, a...)
	}
}

func (r *runner) fail(format string, a ...any) error {
	r.err.printf(format+"\n", a...)
	return &Failed{fmt.Sprintf(format, a...)}
}

// conn is one connection's resources and state (rping's control block).
type conn struct {
	r      *runner
	server bool
	size   int

	pd      *verbs.PD
	cq      *verbs.CQ
	qp      *verbs.QP
	recvMR  *verbs.MR // the peer's rping_rdma_info lands here
	sendMR  *verbs.MR // ours leaves from here
	rdmaMR  *verbs.MR // the server's READ target and WRITE source; the client's sink
	startMR *verbs.MR // the client's start buffer
	recv    []byte
	send    []byte
	rdma    []byte
	start   []byte

	state       int
	remoteRKey  uint32
	remoteAddr  uint64
	remoteLen   uint32
	k           *cm.Conn
	wctx        context.Context // ends when the connection does
	stopWatch   context.CancelFunc
	wc          [1]verbs.WC
	disconnects int
}

func (r *runner) newConn(server bool) (*conn, error) {
	s := &conn{r: r, server: server, size: r.cfg.Size, state: stIdle,
		recv: make([]byte, InfoLen), send: make([]byte, InfoLen), rdma: make([]byte, r.cfg.Size)}
	var err error
	if s.pd, err = r.dev.AllocPD(); err != nil {
		return nil, r.fail("ibv_alloc_pd failed: %v", err)
	}
	r.debug("created pd %p\n", s.pd)
	if s.cq, err = r.dev.CreateCQ(2 * sqDepth); err != nil {
		s.free()
		return nil, r.fail("ibv_create_cq failed: %v", err)
	}
	r.debug("created cq %p\n", s.cq)
	if s.qp, err = s.pd.CreateQP(verbs.QPInitAttr{Type: verbs.QPTypeRC, SendCQ: s.cq, RecvCQ: s.cq,
		Cap: verbs.QPCap{MaxSendWR: sqDepth, MaxRecvWR: rqDepth, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
		s.free()
		return nil, r.fail("rdma_create_qp: %v", err)
	}
	r.debug("created qp %p\n", s.qp)
	// rdma_create_qp leaves the QP in INIT, where it takes receives.
	if err := s.qp.Init(0); err != nil {
		s.free()
		return nil, r.fail("rdma_create_qp: %v", err)
	}
	remote := verbs.AccessLocalWrite | verbs.AccessRemoteRead | verbs.AccessRemoteWrite
	reg := func(buf []byte, access verbs.Access, what string) *verbs.MR {
		if err != nil {
			return nil
		}
		var mr *verbs.MR
		if mr, err = s.pd.RegMR(buf, access); err != nil {
			err = fmt.Errorf("%s reg_mr failed: %w", what, err)
		}
		return mr
	}
	s.recvMR = reg(s.recv, verbs.AccessLocalWrite, "recv_buf")
	s.sendMR = reg(s.send, 0, "send_buf")
	s.rdmaMR = reg(s.rdma, remote, "rdma_buf")
	if !server {
		s.start = make([]byte, r.cfg.Size)
		s.startMR = reg(s.start, remote, "start_buf")
	}
	if err != nil {
		s.free()
		return nil, r.fail("%v", err)
	}
	r.debug("allocated & registered buffers...\n")
	if err := s.postRecv(); err != nil {
		s.free()
		return nil, r.fail("ibv_post_recv failed: %v", err)
	}
	s.wctx = context.Background()
	return s, nil
}

func (s *conn) postRecv() error {
	return s.qp.PostRecv(&verbs.RecvWR{SGL: []verbs.SGE{{Addr: s.recvMR.Addr(), Length: InfoLen, LKey: s.recvMR.LKey()}}})
}

// free releases what newConn made (rping_free_buffers, rping_free_qp).
func (s *conn) free() {
	if s.stopWatch != nil {
		s.stopWatch()
	}
	if s.qp != nil {
		s.qp.Destroy()
	}
	for _, mr := range []*verbs.MR{s.recvMR, s.sendMR, s.rdmaMR, s.startMR} {
		if mr != nil {
			s.r.dev.DeregMR(mr)
		}
	}
	if s.cq != nil {
		s.r.dev.DestroyCQ(s.cq)
	}
	if s.pd != nil {
		s.pd.Dealloc()
	}
}

// connected starts watching k: waits end once it is disconnected.
func (s *conn) connected(ctx context.Context, k *cm.Conn) {
	s.k = k
	var cancel context.CancelFunc
	s.wctx, cancel = context.WithCancel(ctx)
	go func() {
		select {
		case <-k.Done():
			cancel()
		case <-s.wctx.Done():
		}
	}()
	s.stopWatch = cancel
}

// wait is rping's sem_wait: it takes completions (rping_cq_event_handler)
// until one of them, an error or the disconnect wakes the waiter.
func (s *conn) wait(ctx context.Context) {
	wctx := s.wctx
	if s.k == nil {
		wctx = ctx
	}
	for {
		n, err := s.cq.Wait(wctx, s.wc[:])
		if err != nil {
			switch {
			case ctx.Err() != nil:
				s.r.err.printf("%s interrupted: %v\n", s.side(), ctx.Err())
				s.state = stError
			case errors.Is(err, cq.ErrOverrun):
				s.r.err.printf("poll error %v\n", err)
				s.state = stError
			default:
				// The connection ended (RDMA_CM_EVENT_DISCONNECTED).
				if s.disconnects == 0 {
					s.r.err.printf("%s DISCONNECT EVENT...\n", s.side())
				}
				s.disconnects++
				s.state = stDisconnected
			}
			return
		}
		if n == 1 && s.handle(&s.wc[0]) {
			return
		}
	}
}

func (s *conn) side() string {
	if s.server {
		return "server"
	}
	return "client"
}

// handle processes one completion; it says whether rping would post the
// semaphore for it.
func (s *conn) handle(wc *verbs.WC) bool {
	if wc.Status != cq.Success {
		if wc.Status == cq.WRFlushErr {
			return false
		}
		s.r.err.printf("cq completion failed status %d\n", wc.Status)
		s.r.err.printf("rping: %s: %v%s\n", s.side(), wc.Status, s.hint(wc.Status))
		s.state = stError
		return true
	}
	switch wc.Opcode {
	case cq.OpSend:
		s.r.debug("send completion\n")
		return false
	case cq.OpRDMAWrite:
		s.r.debug("rdma write completion\n")
		s.state = stWriteComplete
	case cq.OpRDMARead:
		s.r.debug("rdma read completion\n")
		s.state = stReadComplete
	case cq.OpRecv:
		s.r.debug("recv completion\n")
		if wc.ByteLen != InfoLen {
			s.r.err.printf("Received bogus data, size %d\n", wc.ByteLen)
			s.r.err.printf("recv wc error: -1\n")
			s.state = stError
			return true
		}
		if s.server {
			s.remoteAddr = binary.BigEndian.Uint64(s.recv[0:8])
			s.remoteRKey = binary.BigEndian.Uint32(s.recv[8:12])
			s.remoteLen = binary.BigEndian.Uint32(s.recv[12:16])
			s.r.debug("Received rkey %x addr %x len %d from peer\n", s.remoteRKey, s.remoteAddr, s.remoteLen)
			if s.state <= stConnected || s.state == stWriteComplete {
				s.state = stReadAdv
			} else {
				s.state = stWriteAdv
			}
		} else {
			if s.state == stReadAdv {
				s.state = stWriteAdv
			} else {
				s.state = stWriteComplete
			}
		}
		if err := s.postRecv(); err != nil {
			s.r.err.printf("post recv error: %v\n", err)
			s.state = stError
		}
	default:
		s.r.debug("unknown!!!!! completion\n")
		s.state = stError
	}
	return true
}

// hint says what a failed completion most likely means in rping.
func (s *conn) hint(st cq.Status) string {
	switch st {
	case cq.RemAccessErr:
		if s.server {
			return fmt.Sprintf(" (the peer refused the RDMA access: the rkey 0x%x, address 0x%x or length %d it advertised is not a buffer it registered)", s.remoteRKey, s.remoteAddr, s.remoteLen)
		}
		return " (the server accessed a buffer of ours with a bad rkey, address or length)"
	case cq.LocLenErr:
		return fmt.Sprintf(" (the peer sent a message longer than the %d-byte rping_rdma_info)", InfoLen)
	case cq.RetryExcErr:
		return " (the peer stopped answering)"
	}
	return ""
}

func (s *conn) postSend(wr *verbs.SendWR) bool {
	wr.Flags |= verbs.SendSignaled
	if err := s.qp.PostSend(wr); err != nil {
		s.r.err.printf("post send error %v\n", err)
		return false
	}
	return true
}

func (s *conn) sendInfo() *verbs.SendWR {
	return &verbs.SendWR{Opcode: verbs.WRSend, SGL: []verbs.SGE{{Addr: s.sendMR.Addr(), Length: InfoLen, LKey: s.sendMR.LKey()}}}
}

// formatSend puts buf's address, rkey and rping's size in the send buffer.
func (s *conn) formatSend(mr *verbs.MR) {
	binary.BigEndian.PutUint64(s.send[0:8], mr.Addr())
	binary.BigEndian.PutUint32(s.send[8:12], mr.RKey())
	binary.BigEndian.PutUint32(s.send[12:16], uint32(s.size))
	s.r.debug("RDMA addr %x rkey %x len %d\n", mr.Addr(), mr.RKey(), s.size)
}

func (s *conn) disconnect() {
	if s.k == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	before := s.disconnects
	if err := s.k.Disconnect(ctx); err == nil && before == 0 && !s.server {
		s.r.err.printf("%s DISCONNECT EVENT...\n", s.side())
	}
}

// ---- server ----

func (r *runner) server(ctx context.Context) error {
	if r.cfg.Addr.IsValid() && r.cfg.Addr != r.cm.Local() {
		return r.fail("rdma_bind_addr: Cannot assign requested address (%v is not this device's address %v)", r.cfg.Addr, r.cm.Local())
	}
	l, err := r.cm.Listen(cm.PortSpaceTCP, r.cfg.Port)
	if err != nil {
		return r.fail("rdma_bind_addr: %v", err)
	}
	defer l.Close()
	r.debug("rdma_bind_addr successful\n")
	r.debug("rdma_listen\n")
	if r.cfg.Persistent {
		var wg sync.WaitGroup
		defer wg.Wait()
		for {
			req, err := l.Next(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return r.fail("wait for CONNECT_REQUEST state %d: %v", stError, err)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				r.serve(ctx, req)
			}()
		}
	}
	req, err := l.Next(ctx)
	if err != nil {
		return r.fail("wait for CONNECT_REQUEST state %d: %v", stIdle, err)
	}
	l.Close() // one connection: later requests are refused
	return r.serve(ctx, req)
}

// serve runs one accepted connection: rping_accept, then
// rping_test_server until the client disconnects.
func (r *runner) serve(ctx context.Context, req *cm.ConnRequest) error {
	r.debug("child cma %v port %d\n", req.Remote, req.RemotePort)
	s, err := r.newConn(true)
	if err != nil {
		req.Reject(nil)
		return err
	}
	defer s.free()
	s.state = stConnectRequest
	r.debug("accepting client connection request\n")
	var p *cm.ConnParam
	if r.cfg.SelfQP {
		pp := ConnParam
		p = &pp
	}
	k, err := req.Accept(ctx, s.qp, p)
	if err != nil {
		r.err.printf("rdma_accept: %v\n", err)
		return r.fail("connect error -1")
	}
	s.connected(ctx, k)
	err = s.testServer(ctx)
	s.disconnect()
	if err != nil {
		r.err.printf("rping server failed: -1\n")
	}
	return err
}

func (s *conn) testServer(ctx context.Context) error {
	r := s.r
	for {
		// The client's start buffer.
		s.wait(ctx)
		if s.state != stReadAdv {
			return s.stateErr("RDMA_READ_ADV")
		}
		r.debug("server received sink adv\n")
		if int64(s.remoteLen) > int64(s.size) {
			// rping posts this READ and fails it locally (the sink is
			// too small); the same lines, without touching the wire.
			r.err.printf("cq completion failed status %d\n", cq.LocProtErr)
			r.err.printf("rping: the client's buffer is %d bytes, more than this server's %d (-S): give both sides the same -S\n", s.remoteLen, s.size)
			s.state = stError
			return s.stateErr("RDMA_READ_COMPLETE")
		}
		if !s.postSend(&verbs.SendWR{Opcode: verbs.WRRDMARead, RemoteAddr: s.remoteAddr, RKey: s.remoteRKey,
			SGL: []verbs.SGE{{Addr: s.rdmaMR.Addr(), Length: s.remoteLen, LKey: s.rdmaMR.LKey()}}}) {
			return &Failed{"post send error"}
		}
		r.debug("server posted rdma read req \n")
		s.wait(ctx)
		if s.state != stReadComplete {
			return s.stateErr("RDMA_READ_COMPLETE")
		}
		r.debug("server received read complete\n")
		if r.cfg.Verbose {
			r.out.printf("server ping data: %s\n", cstring(s.rdma))
		}
		// Go ahead.
		if !s.postSend(s.sendInfo()) {
			return &Failed{"post send error"}
		}
		r.debug("server posted go ahead\n")
		// The client's sink buffer.
		s.wait(ctx)
		if s.state != stWriteAdv {
			return s.stateErr("RDMA_WRITE_ADV")
		}
		r.debug("server received sink adv\n")
		// Echo what was read, up to and with its NUL (strlen + 1), never
		// past the buffer.
		n := len(cstring(s.rdma)) + 1
		n = min(n, len(s.rdma))
		if uint32(n) > s.remoteLen {
			r.err.printf("rping: the client's sink is %d bytes, less than the %d to echo: give both sides the same -S\n", s.remoteLen, n)
			s.state = stError
			return &Failed{"remote sink smaller than the data"}
		}
		r.debug("rdma write from lkey %x laddr %x len %d\n", s.rdmaMR.LKey(), s.rdmaMR.Addr(), n)
		if !s.postSend(&verbs.SendWR{Opcode: verbs.WRRDMAWrite, RemoteAddr: s.remoteAddr, RKey: s.remoteRKey,
			SGL: []verbs.SGE{{Addr: s.rdmaMR.Addr(), Length: uint32(n), LKey: s.rdmaMR.LKey()}}}) {
			return &Failed{"post send error"}
		}
		s.wait(ctx)
		if s.state != stWriteComplete {
			return s.stateErr("RDMA_WRITE_COMPLETE")
		}
		r.debug("server rdma write complete \n")
		if !s.postSend(s.sendInfo()) {
			return &Failed{"post send error"}
		}
		r.debug("server posted go ahead\n")
	}
}

// stateErr is rping's "wait for X state N": an error unless the peer
// disconnected, which ends a run normally.
func (s *conn) stateErr(want string) error {
	s.r.err.printf("wait for %s state %d\n", want, s.state)
	if s.state == stDisconnected {
		return nil
	}
	return &Failed{fmt.Sprintf("wait for %s state %d", want, s.state)}
}

// ---- client ----

func (r *runner) client(ctx context.Context) error {
	s, err := r.newConn(false)
	if err != nil {
		return err
	}
	defer s.free()
	k, err := r.cm.Dial(ctx, r.cfg.Addr, cm.PortSpaceTCP, r.cfg.Port, s.qp, &ConnParam)
	if err != nil {
		var rej *cm.RejectError
		switch {
		case errors.As(err, &rej):
			r.err.printf("cma event RDMA_CM_EVENT_REJECTED, error %d\n", rej.Reason)
			if errors.Is(err, cm.ErrNoListener) {
				r.err.printf("rping: nobody listens on port %d at %v: start the server (rping -s) first, or check -p and -a\n", r.cfg.Port, r.cfg.Addr)
			}
		case errors.Is(err, cm.ErrUnreachable):
			r.err.printf("cma event RDMA_CM_EVENT_UNREACHABLE, error -110\n")
			r.err.printf("rping: no answer from %v: is it a RoCE device reachable on UDP port 4791?\n", r.cfg.Addr)
		default:
			r.err.printf("rdma_connect: %v\n", err)
		}
		return r.fail("connect error -1")
	}
	r.debug("rdma_connect successful\n")
	s.state = stConnected
	s.connected(ctx, k)
	err = s.testClient(ctx)
	if err != nil {
		r.err.printf("rping client failed: -1\n")
	}
	s.disconnect()
	return err
}

func (s *conn) testClient(ctx context.Context) error {
	r := s.r
	for ping := 0; r.cfg.Count == 0 || ping < r.cfg.Count; ping++ {
		s.state = stReadAdv
		Fill(s.start, ping)
		s.formatSend(s.startMR)
		if !s.postSend(s.sendInfo()) {
			return &Failed{"post send error"}
		}
		// The server has read the start buffer.
		s.wait(ctx)
		if s.state != stWriteAdv {
			return s.stateErr("RDMA_WRITE_ADV")
		}
		s.formatSend(s.rdmaMR)
		if !s.postSend(s.sendInfo()) {
			return &Failed{"post send error"}
		}
		// The server has written the sink.
		s.wait(ctx)
		if s.state != stWriteComplete {
			return s.stateErr("RDMA_WRITE_COMPLETE")
		}
		if r.cfg.Validate && !bytes.Equal(s.start, s.rdma) {
			r.err.printf("data mismatch!\n")
			return &Failed{"data mismatch"}
		}
		if r.cfg.Verbose {
			r.out.printf("ping data: %s\n", cstring(s.rdma))
		}
	}
	return nil
}
