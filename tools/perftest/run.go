package perftest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/softroce/softroce/cm"
	"github.com/softroce/softroce/internal/traffic"
	"github.com/softroce/softroce/verbs"
)

// Test is the RDMA operation a bandwidth test measures.
type Test int

// The tests, named after the perftest tool each one pairs with.
const (
	Write  Test = iota + 1 // ib_write_bw: RDMA WRITE
	Read                   // ib_read_bw: RDMA READ
	Atomic                 // ib_atomic_bw: FETCH_AND_ADD or CMP_AND_SWAP
	Send                   // ib_send_bw: SEND into posted receives
)

// String is the short name used on the command line ("write", ...).
func (t Test) String() string {
	switch t {
	case Write:
		return "write"
	case Read:
		return "read"
	case Atomic:
		return "atomic"
	case Send:
		return "send"
	}
	return "Test(" + strconv.Itoa(int(t)) + ")"
}

// Tool is the perftest binary that speaks this test.
func (t Test) Tool() string { return "ib_" + t.String() + "_bw" }

// ParseTest maps "write", "read", "atomic", "send" (or the tool names) to
// a Test.
func ParseTest(s string) (Test, error) {
	switch strings.TrimSuffix(strings.TrimPrefix(s, "ib_"), "_bw") {
	case "write":
		return Write, nil
	case "read":
		return Read, nil
	case "atomic":
		return Atomic, nil
	case "send":
		return Send, nil
	}
	return 0, fmt.Errorf("perftest: unknown test %q (want write, read, atomic or send)", s)
}

// access is the single remote right perftest gives the passive side's QP
// and MR for the test (catalogue B.3): a write_bw buffer is not readable.
// send_bw asks for REMOTE_WRITE too (with LOCAL_WRITE, which every MR
// here has).
func (t Test) access() verbs.Access {
	switch t {
	case Read:
		return verbs.AccessRemoteRead
	case Atomic:
		return verbs.AccessRemoteAtomic
	}
	return verbs.AccessRemoteWrite
}

// AtomicOp is ib_atomic_bw's -A choice.
type AtomicOp int

// Atomic operations. perftest adds 1 (FETCH_AND_ADD) or compares with 0
// and swaps in 0 (CMP_AND_SWAP).
const (
	FetchAndAdd AtomicOp = iota
	CmpAndSwap
)

// Config mirrors the flags of perftest's bandwidth tools that matter to
// the exchange and the traffic.
type Config struct {
	Test     Test
	Server   string // -> connect to this host (active side); empty: listen (passive side)
	Port     int    // -p, TCP port (18515)
	Size     int    // -s, message size (65536; atomics are always 8)
	Iters    int    // -n, iterations (5000 for write, 1000 for the others)
	MTU      int    // -m, path MTU; 0: the port's active MTU
	GIDIndex int    // -x
	TxDepth  int    // -t, outstanding send WRs (128)
	RxDepth  int    // -r, receives kept posted by a send_bw receiver (512)
	QPs      int    // -q, number of QPs (1); iterations are per QP
	// Duplex is -b: both sides post traffic at the same time and each
	// prints the sum of both reports (WRITE, READ, atomic).
	Duplex   bool
	CQMod    int      // -Q, one signaled WR every CQMod (100)
	OutReads int      // -o, READ/atomic depth announced and used (16)
	Atomic   AtomicOp // -A
	// QPTimeout is -u, the local ACK timeout exponent (4.096 us << u;
	// default 14, about 67 ms).
	QPTimeout uint8
	// Gbits reports Gbit/s instead of MiB/s (--report_gbits).
	Gbits bool
	// RemotePort is the peer's UDP port when it is not 4791 (another
	// softroce on the same address).
	RemotePort uint16
	// AdaptiveTimeout makes the RC QPs' local ACK timeout follow the
	// measured round trip, never below QPTimeout's
	// (verbs.QP.SetAdaptiveTimeout): for hosts that schedule unevenly.
	AdaptiveTimeout bool
	// Conn is -c, the QPs' service: RC (the zero value), UC for write
	// and send, or UD for send, as perftest allows. perftest does not
	// exchange it: both sides must be given the same.
	Conn verbs.QPType
	// RDMACM is -R: the exchange and the test QPs are connected with
	// rdma_cm on port Port instead of over TCP (RC QPs on RDMA_PS_TCP, UD
	// QPs resolved by SIDR on RDMA_PS_UDP; UC is not, as with perftest).
	// Server must then be the peer's RoCE IP address.
	RDMACM bool
	// CM is the connection manager on the device to use with RDMACM;
	// nil: one is opened on the device's QP1 for the run.
	CM *cm.CM
	// RecvIdle is how long a UC or UD receiver waits for the next message
	// before it gives up on the ones lost and reports what arrived
	// (perftest waits 60 to 120 s); 0: 10 s.
	RecvIdle time.Duration
	// All is -a: every size from 2 bytes to 8 MiB (UD: to the MTU),
	// doubling, -n iterations each, one report row per size. The passive
	// side sizes its buffer for 8 MiB, so give -a to both sides.
	All bool
	// Duration is -D: each active side posts for this long (whole
	// seconds) instead of -n iterations and reports what completed in
	// the middle of the run: a quarter of it (rounded down to seconds) is
	// left out at either end, as perftest's margins. A send receiver
	// needs it too: it counts for as long from its first receive.
	Duration time.Duration
	// Infinite is --run_infinitely: post until Stop (or the peer goes
	// away) and print a row every Duration (default 5 s) of what
	// completed in it. It takes precedence over All, as in perftest.
	Infinite bool
	// Stop ends an Infinite run: the active side stops posting; for
	// write, read and atomic it then finishes the exchange, so that the
	// passive side prints the whole run's figures and ends as after a
	// normal run; a passive side stops waiting.
	Stop <-chan struct{}
	// Timeout bounds the whole run (perftest itself waits forever); a
	// Duration adds to it, and an Infinite run has none.
	Timeout time.Duration
	// Dial and Listen replace the net package's for the TCP exchange.
	Dial   func(ctx context.Context, network, addr string) (net.Conn, error)
	Listen func(network, addr string) (net.Listener, error)

	// Latency selects perftest's latency protocol (ib_write_lat,
	// ib_read_lat, ib_atomic_lat, ib_send_lat) instead of the bandwidth
	// one: one operation at a time, a ping-pong for write and send (both
	// sides post), the connector alone posting for read and atomic. One
	// RC QP over the TCP exchange, -n iterations of one size.
	Latency bool

	sizeGiven bool // -s was given: UD refuses a larger size than the MTU instead of adopting it
}

func (c *Config) defaults() error {
	if c.Test == 0 {
		c.Test = Write
	}
	if c.Test < Write || c.Test > Send {
		return fmt.Errorf("perftest: unknown test %d", c.Test)
	}
	if c.Port == 0 {
		c.Port = DefaultPort
	}
	switch c.Conn {
	case verbs.QPTypeRC:
	case verbs.QPTypeUC:
		if c.Test != Write && c.Test != Send {
			return fmt.Errorf("perftest: a UC connection is not possible with %v (UC has no READ or atomics)", c.Test)
		}
		if c.RDMACM {
			return fmt.Errorf("perftest: UC is not supported in librdmacm (drop -R or use -c RC)")
		}
	case verbs.QPTypeUD:
		if c.Test != Send {
			return fmt.Errorf("perftest: UD connection only possible in SEND verb (use send, or -c RC)")
		}
	default:
		return fmt.Errorf("perftest: connection type %v is not implemented (RC, UC or UD)", c.Conn)
	}
	if c.Latency {
		if err := c.latDefaults(); err != nil {
			return err
		}
	}
	if c.Infinite {
		c.All = false // perftest's --run_infinitely overrides -a
		if c.Duration == 0 {
			c.Duration = 5 * time.Second
		}
		if c.Duplex {
			return fmt.Errorf("perftest: --run_infinitely with -b is not implemented")
		}
	}
	if c.Duration < 0 || c.Duration%time.Second != 0 {
		return fmt.Errorf("perftest: duration %v is not a positive number of seconds", c.Duration)
	}
	if c.All {
		if c.Duration > 0 {
			return fmt.Errorf("perftest: Duration mode currently doesn't support running on all sizes.")
		}
		if c.Test == Atomic {
			return fmt.Errorf("perftest: Message size cannot be changed for Atomic tests (-a)")
		}
		// The buffer is laid out for the largest size.
		c.Size = MaxSize
	}
	c.sizeGiven = c.Size != 0 && !c.All
	if c.Test == Atomic {
		if c.Size != 0 && c.Size != 8 {
			return fmt.Errorf("perftest: atomic messages are 8 bytes, not %d", c.Size)
		}
		c.Size = 8
	}
	if c.Size == 0 {
		c.Size = 65536
	}
	if c.Size < 1 || c.Size > 1<<30 {
		return fmt.Errorf("perftest: size %d out of range 1..1 GiB", c.Size)
	}
	if c.Iters == 0 {
		c.Iters = 1000 // ib_read_bw, ib_atomic_bw, ib_send_bw
		if c.Test == Write {
			c.Iters = 5000
		}
	}
	if c.Iters < 1 {
		return fmt.Errorf("perftest: iterations %d < 1", c.Iters)
	}
	if c.TxDepth == 0 {
		c.TxDepth = 128
	}
	if c.TxDepth < 1 || c.TxDepth > verbs.MaxQPWR {
		return fmt.Errorf("perftest: tx depth %d out of range 1..%d", c.TxDepth, verbs.MaxQPWR)
	}
	if c.Duplex && c.Test == Send {
		return fmt.Errorf("perftest: -b with send is not implemented")
	}
	if c.QPs == 0 {
		c.QPs = 1
	}
	if c.QPs < 1 || c.QPs > maxQPs {
		return fmt.Errorf("perftest: %d QPs out of range 1..%d", c.QPs, maxQPs)
	}
	if c.RxDepth == 0 {
		c.RxDepth = 512
	}
	if c.RxDepth < 1 || c.RxDepth > verbs.MaxQPWR {
		return fmt.Errorf("perftest: rx depth %d out of range 1..%d", c.RxDepth, verbs.MaxQPWR)
	}
	if c.Conn != verbs.QPTypeRC && c.RxDepth == 512 && !c.timed() {
		// perftest's rule for UC and UD: a receiver left at the default
		// depth posts a receive for every message (up to 16000), since a
		// message that finds none is lost, not retried.
		c.RxDepth = min(c.Iters, ucMaxRx)
	}
	if c.CQMod <= 0 {
		c.CQMod = 100
	}
	// A signaled WR must come up before the send queue fills, or the
	// requester would wait for a completion that was never asked for.
	c.CQMod = min(c.CQMod, c.TxDepth)
	if c.OutReads == 0 {
		c.OutReads = 16
	}
	if c.OutReads < 1 || c.OutReads > verbs.MaxQPRDAtom {
		return fmt.Errorf("perftest: outstanding reads %d out of range 1..%d", c.OutReads, verbs.MaxQPRDAtom)
	}
	if c.Test == Write || c.Test == Send {
		c.OutReads = 1 // what ib_write_bw and ib_send_bw announce
	}
	if c.MTU != 0 {
		if _, err := mtuEnum(c.MTU); err != nil {
			return err
		}
	}
	if c.QPTimeout == 0 {
		c.QPTimeout = 14
	}
	if c.QPTimeout > 31 {
		return fmt.Errorf("perftest: QP timeout %d out of range 1..31", c.QPTimeout)
	}
	if c.Timeout == 0 {
		c.Timeout = 60 * time.Second
	}
	if c.Infinite {
		c.Timeout = 100 * 365 * 24 * time.Hour
	} else {
		c.Timeout += c.Duration
	}
	if c.RecvIdle <= 0 {
		c.RecvIdle = 10 * time.Second
	}
	return nil
}

// MaxSize is the largest size -a runs (perftest's MAX_SIZE).
const MaxSize = 1 << 23

// timed reports whether the run posts for a time instead of -n
// iterations.
func (c *Config) timed() bool { return c.Duration > 0 }

// maxQPs bounds -q.
const maxQPs = 64

// ucMaxRx is perftest's UC_MAX_RX: the most receives a UC receiver posts
// by default.
const ucMaxRx = 16000

// Result is what one run agreed on and measured.
type Result struct {
	// Local and Remote are QP 0's KEYS; LocalQPs and RemoteQPs those of
	// every QP.
	Local, Remote       Keys
	LocalQPs, RemoteQPs []Keys
	PeerVersion         string
	MTU                 int // negotiated path MTU
	CycleBuffer         int // negotiated cycle buffer (the larger page size)
	CacheLine           int // negotiated cache line
	// Report holds the active side's numbers: softroce's own when it
	// was active, the peer's when it was passive (perftest's rule). In
	// a send test each side reports what it measured itself, and in a
	// duplex test Report is softroce's own and PeerReport the peer's
	// (perftest prints their sum).
	Report, PeerReport Report
	// Rows are the result rows this side printed: one per size with
	// -a, one per interval of an endless run, else the one Report (or,
	// with Duplex, the sum of both sides'). An endless run's last row is
	// the whole run.
	Rows []Report
	// Lat is a latency run's result (nil otherwise, and on the passive
	// side of read and atomic, which measures nothing).
	Lat *LatReport
	// Checked says which data check ran and passed ("" when none could
	// run, e.g. softroce writing into a write-only perftest buffer).
	Checked string
	// Stats are the transport counters of softroce's QPs at the end,
	// summed (retransmissions, timeouts, NAKs: what explains a slow run).
	Stats verbs.QPStats
	// Lost counts the messages a UC or UD receiver never got: it stopped
	// waiting for them after RecvIdle and reported what arrived.
	Lost int
	// Engine holds the traffic engine's figures of this side's own run,
	// from which Report was computed (nil when this side only exposed its
	// memory): among them the packets its QPs really sent and received
	// per second, and how the transport counters moved during the run.
	Engine *traffic.Result
}

// Active reports whether the side with this configuration posts the
// traffic: the TCP connector, as in perftest's one-way tests, and both
// sides with Duplex.
func (c *Config) Active() bool { return c.Server != "" || c.Duplex }

// canary fills buffers before the run, so that the data checks can tell
// bytes the peer wrote from bytes nobody touched.
const canary = 0x5a

// Run performs one test session on dev, printing what perftest prints (the
// addresses and the result table) to out.
func Run(ctx context.Context, dev *verbs.Device, cfg Config, out io.Writer) (*Result, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	if cfg.Infinite && cfg.Stop != nil && cfg.Server == "" {
		// A passive side stops waiting (and receiving) when stopped.
		stopCtx, stop := context.WithCancel(ctx)
		defer stop()
		go func() {
			select {
			case <-cfg.Stop:
				stop()
			case <-stopCtx.Done():
			}
		}()
		ctx = stopCtx
	}
	if cfg.RDMACM {
		ch, err := openCMChannel(ctx, dev, &cfg)
		if err != nil {
			return nil, err
		}
		s := &session{cfg: cfg, dev: dev, ch: ch, ctx: ctx, connector: cfg.Server != "", out: out, stop: cfg.Stop}
		res, err := s.run(ctx)
		ch.close(err == nil)
		return res, err
	}
	conn, err := connect(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	// Unblock a pending read or write as soon as ctx ends (e.g. Ctrl-C).
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	s := &session{cfg: cfg, dev: dev, conn: conn, ctx: ctx, connector: cfg.Server != "", out: out, stop: cfg.Stop}
	return s.run(ctx)
}

func connect(ctx context.Context, cfg Config) (net.Conn, error) {
	if cfg.Server != "" {
		dial := cfg.Dial
		if dial == nil {
			dial = (&net.Dialer{}).DialContext
		}
		addr := net.JoinHostPort(cfg.Server, strconv.Itoa(cfg.Port))
		for {
			conn, err := dial(ctx, "tcp4", addr)
			if err == nil {
				return conn, nil
			}
			// perftest's client gives up at once; retrying briefly lets
			// a script start both sides together.
			select {
			case <-ctx.Done():
				return nil, fmt.Errorf("connect to %s: %w (is the perftest server running?)", addr, err)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	listen := cfg.Listen
	if listen == nil {
		listen = net.Listen
	}
	// perftest listens on IPv4 only and accepts exactly one connection.
	ln, err := listen("tcp4", ":"+strconv.Itoa(cfg.Port))
	if err != nil {
		return nil, fmt.Errorf("listen on TCP port %d: %w (choose another with -p)", cfg.Port, err)
	}
	defer ln.Close()
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	conn, err := ln.Accept()
	if err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return nil, fmt.Errorf("wait for a client on TCP port %d: %w", cfg.Port, err)
	}
	return conn, nil
}

// session is one run's state.
type session struct {
	cfg       Config
	dev       *verbs.Device
	conn      net.Conn   // the TCP exchange, or
	ch        *cmChannel // the rdma_cm one (-R)
	ctx       context.Context
	connector bool
	out       io.Writer
	res       Result

	pd  *verbs.PD
	cq  *verbs.CQ
	qps []*qpCtx
	mr  *verbs.MR
	buf []byte
	// Region layout, perftest's: messages of size bytes land every inc
	// bytes, cycling over slots slots (1 when size > cycle buffer / 2),
	// in a region of region bytes; each QP owns part bytes of buf: a
	// local area of local bytes, then a target area of region bytes.
	inc, slots          int
	grh                 int // UD: the GRH's room at the head of every receive
	region, local, part int
	size                int          // the current message size (-a changes it)
	rwr                 verbs.RecvWR // reused by postRecvs

	stop     <-chan struct{} // Config.Stop (never closed when nil)
	peerGone chan struct{}   // closed when the peer closed the TCP exchange during an endless run
	rows     bool            // the result rows were printed as the run went
}

// xchg is perftest's ctx_xchg_data: the connector writes its message and
// then reads the peer's, the listener the other way round. Each message is
// one write of the whole buffer (perftest does not loop on short reads).
func (s *session) xchg(step string, my, rem []byte) error {
	if s.ch != nil {
		return s.ch.xchg(s.ctx, step, my, rem)
	}
	if s.connector {
		if _, err := s.conn.Write(my); err != nil {
			return connErr(step, "send", err)
		}
	}
	if _, err := io.ReadFull(s.conn, rem); err != nil {
		return connErr(step, "receive", err)
	}
	if !s.connector {
		if _, err := s.conn.Write(my); err != nil {
			return connErr(step, "send", err)
		}
	}
	return nil
}

// connErr names the usual reason for a failed exchange: perftest exits
// (closing the connection) when it dislikes something, and says why on
// its own output.
func connErr(step, op string, err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		return fmt.Errorf("perftest %s: peer closed the connection (%w); see its output", step, err)
	}
	return fmt.Errorf("perftest %s: %s: %w", step, op, err)
}

// keysXchg exchanges KEYS messages; it also serves as perftest's barrier
// (ctx_hand_shake).
func (s *session) keysXchg(step string, k Keys) (Keys, error) {
	if s.ch != nil {
		rem := make([]byte, BinaryKeysLen)
		if err := s.ch.xchg(s.ctx, step, k.MarshalBinary(s.cfg.GIDIndex), rem); err != nil {
			return Keys{}, err
		}
		return ParseBinaryKeys(rem)
	}
	rem := make([]byte, KeysLen)
	if err := s.xchg(step, k.Marshal(), rem); err != nil {
		return Keys{}, err
	}
	rk, err := ParseKeys(rem)
	if err != nil {
		return Keys{}, fmt.Errorf("perftest %s: %w", step, err)
	}
	return rk, nil
}

// barrier is a KEYS exchange of QP 0's record, perftest's
// synchronisation point.
func (s *session) barrier(step string) error {
	_, err := s.keysXchg(step, s.qps[0].local)
	return err
}

func (s *session) run(ctx context.Context) (*Result, error) {
	cfg := &s.cfg
	// Version (step 2).
	rv := make([]byte, VersionLen)
	if err := s.xchg("version exchange", MarshalVersion(Version), rv); err != nil {
		return nil, err
	}
	v, err := ParseVersion(rv)
	if err != nil {
		return nil, err
	}
	s.res.PeerVersion = v
	// System data (step 3): both sides adopt the larger cycle buffer
	// (page size) and cache line.
	s.res.CycleBuffer, err = s.xchgInt("cycle buffer exchange", 4096)
	if err != nil {
		return nil, err
	}
	s.res.CacheLine, err = s.xchgInt("cache line exchange", 64)
	if err != nil {
		return nil, err
	}
	if s.res.CycleBuffer < 64 || s.res.CycleBuffer > 1<<24 || s.res.CacheLine < 8 || s.res.CacheLine > s.res.CycleBuffer {
		return nil, fmt.Errorf("%w: system data cycle buffer %d, cache line %d", ErrMalformed, s.res.CycleBuffer, s.res.CacheLine)
	}
	// MTU (step 4): min(local, remote) when the remote value is valid.
	mtu := cfg.MTU
	if mtu == 0 {
		mtu = s.dev.QueryPort().ActiveMTU
	}
	mm, err := MarshalMTU(mtu)
	if err != nil {
		return nil, err
	}
	rm := make([]byte, MTULen)
	if err := s.xchg("MTU exchange", mm, rm); err != nil {
		return nil, err
	}
	if r := ParseMTU(rm); r != 0 && r < mtu {
		mtu = r
	}
	s.res.MTU = mtu
	if cfg.Conn == verbs.QPTypeUD && cfg.Size > mtu {
		// A UD message is one packet.
		if cfg.sizeGiven {
			return nil, fmt.Errorf("perftest: Max message size in UD cannot be greater than MTU (%d; give -s %d or less)", mtu, mtu)
		}
		fmt.Fprintf(s.out, " Max msg size in UD is MTU %d\n Changing to this MTU\n", mtu)
		cfg.Size = mtu
	}

	if err := s.setup(); err != nil {
		return nil, err
	}
	defer s.teardown()
	if cfg.Latency {
		return s.runLat(ctx)
	}
	if s.ch != nil {
		// The test QPs connect through the CM between two barriers.
		if err := s.barrier("barrier before the rdma_cm connections"); err != nil {
			return nil, err
		}
		if err := s.ch.connectTests(ctx, s); err != nil {
			return nil, err
		}
		if err := s.barrier("barrier after the rdma_cm connections"); err != nil {
			return nil, err
		}
		if cfg.Conn == verbs.QPTypeRC {
			// The CM chose the path MTU (both ports' active MTU, the smaller).
			a, _ := s.qps[0].qp.Query()
			s.res.MTU = a.PathMTU
		}
	}

	// Keys, first round (step 5): one message per QP, in QP order; then
	// the GID-type check on QP 0 (step 6).
	for i, c := range s.qps {
		if c.remote, err = s.keysXchg(fmt.Sprintf("keys exchange (QP %d)", i), c.local); err != nil {
			return nil, err
		}
	}
	s.res.Local, s.res.Remote = s.qps[0].local, s.qps[0].remote
	for _, c := range s.qps {
		s.res.LocalQPs = append(s.res.LocalQPs, c.local)
		s.res.RemoteQPs = append(s.res.RemoteQPs, c.remote)
	}
	if s.ch == nil {
		if l, r := s.res.Local.GID, s.res.Remote.GID; l.Addr().Is4() != r.Addr().Is4() {
			return nil, fmt.Errorf("perftest: GID type mismatch (local %v, remote %v): use the same IP version on both sides", l, r)
		}
		// QP bring-up (step 7); with -R the CM did it.
		for i, c := range s.qps {
			if err := s.connectQP(c); err != nil {
				return nil, fmt.Errorf("QP %d: %w", i, err)
			}
		}
	}
	fmt.Fprintln(s.out, dashes)
	for _, c := range s.qps {
		s.printAddr("local", c.local)
	}
	// Keys, second round (step 8), and the barrier after RTR (step 9):
	// traffic starts only after it. ib_send_bw has the barrier before the
	// second round (the same bytes when there is one QP).
	if cfg.Test == Send {
		if err := s.barrier("barrier after RTR"); err != nil {
			return nil, err
		}
	}
	for i, c := range s.qps {
		if again, err := s.keysXchg(fmt.Sprintf("second keys exchange (QP %d)", i), c.local); err != nil {
			return nil, err
		} else if again != c.remote {
			return nil, fmt.Errorf("%w: keys of QP %d changed between rounds (%+v, then %+v)", ErrMalformed, i, c.remote, again)
		}
	}
	for _, c := range s.qps {
		s.printAddr("remote", c.remote)
	}
	fmt.Fprintln(s.out, dashes)
	if cfg.Test != Send {
		if err := s.barrier("barrier after RTR"); err != nil {
			return nil, err
		}
	}
	s.printHeader()
	if cfg.Test == Send {
		return s.runSend(ctx)
	}
	if cfg.Duplex {
		return s.runDuplex(ctx)
	}
	var my Report
	if s.connector {
		if cfg.All {
			// One size after the other with no exchange between them;
			// the report sent at the end is the last size's.
			for _, size := range s.sizes() {
				s.layout(size)
				if my, err = s.transmit(ctx); err != nil {
					return nil, err
				}
				s.printRow(my)
			}
			s.rows = true
		} else {
			stop := s.watchPeer()
			my, err = s.transmit(ctx)
			if gone := stop(); gone {
				return s.endless(true)
			}
			if err != nil {
				return nil, err
			}
		}
	}
	// Finish barrier (step 11): the passive side blocks here for the whole
	// run; the active side arrives once its last WR completed.
	if err := s.barrier("finish barrier"); err != nil {
		if cfg.Infinite && !s.connector && (s.stopped() || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)) {
			// An endless run ends when its active side is interrupted.
			return s.endless(!s.stopped())
		}
		return nil, err
	}
	// Reports (step 12): the passive side prints the active side's.
	var myF, remF [5][8]byte = my.fields(), [5][8]byte{}
	for i := range myF {
		if err := s.xchg("report exchange", myF[i][:], remF[i][:]); err != nil {
			return nil, err
		}
	}
	if s.connector {
		s.res.Report = my
	} else {
		s.res.Report = reportFromFields(remF)
	}
	return s.finish()
}

// sizes are the message sizes of the run: -a's powers of two from 2 up
// to the largest (8 MiB, or a UD MTU), else the one size.
func (s *session) sizes() []int {
	if !s.cfg.All {
		return []int{s.cfg.Size}
	}
	var v []int
	for n := 2; n <= s.cfg.Size; n *= 2 {
		v = append(v, n)
	}
	return v
}

// stopped reports whether Config.Stop was closed.
func (s *session) stopped() bool {
	select {
	case <-s.stop:
		return true
	default:
		return false
	}
}

// watchPeer watches the TCP exchange during an endless run: perftest
// sends nothing then, so a read returns only when the peer closed the
// connection (it was interrupted, which is how perftest's endless runs
// end); peerGone is closed then. The returned function stops watching
// and reports whether the peer went away. Outside endless runs, and over
// rdma_cm, it does nothing.
func (s *session) watchPeer() (stop func() (gone bool)) {
	if !s.cfg.Infinite || s.conn == nil {
		return func() bool { return false }
	}
	s.peerGone = make(chan struct{})
	done := make(chan struct{})
	var n int
	var rerr error
	go func() {
		defer close(done)
		var b [1]byte
		n, rerr = s.conn.Read(b[:])
		if n == 0 && !errors.Is(rerr, os.ErrDeadlineExceeded) {
			close(s.peerGone)
		}
	}()
	return func() bool {
		s.conn.SetReadDeadline(time.Now())
		<-done
		s.conn.SetReadDeadline(time.Time{})
		select {
		case <-s.peerGone:
			return true
		default:
		}
		// Nothing should have come; if something did, the exchange is
		// out of step, which the next step reports.
		return n > 0
	}
}

// endless ends an endless run without the closing exchange, because the
// peer closed the connection (gone) or the run was stopped where perftest
// has no exchange left: what it measured was printed as it went.
func (s *session) endless(gone bool) (*Result, error) {
	if gone {
		fmt.Fprintln(s.out, " the peer closed the connection: end of the endless run")
	} else {
		fmt.Fprintln(s.out, " stopped: end of the endless run")
	}
	fmt.Fprintln(s.out, dashes)
	s.res.Stats = s.stats()
	return &s.res, nil
}

// runDuplex is the -b flow of ib_write_bw, ib_read_bw and ib_atomic_bw:
// one more barrier, then both sides post their traffic; each side then
// sends its report (no finish barrier: the report exchange waits for the
// slower side) and prints the sum. With -a that is done for every size,
// with one more barrier after each size's traffic.
func (s *session) runDuplex(ctx context.Context) (*Result, error) {
	for _, size := range s.sizes() {
		s.layout(size)
		if err := s.barrier("duplex barrier"); err != nil {
			return nil, err
		}
		my, err := s.transmit(ctx)
		if err != nil {
			return nil, err
		}
		if s.cfg.All {
			if err := s.barrier("barrier after a size"); err != nil {
				return nil, err
			}
		}
		var myF, remF [5][8]byte = my.fields(), [5][8]byte{}
		for i := range myF {
			if err := s.xchg("report exchange", myF[i][:], remF[i][:]); err != nil {
				return nil, err
			}
		}
		s.res.Report, s.res.PeerReport = my, reportFromFields(remF)
		if s.cfg.All {
			s.printRow(s.duplexSum())
		}
	}
	s.rows = s.cfg.All
	return s.finish()
}

// duplexSum is what perftest -b prints: both directions added up.
func (s *session) duplexSum() Report {
	r, p := s.res.Report, s.res.PeerReport
	r.PeakBW, r.AvgBW, r.MsgRate = r.PeakBW+p.PeakBW, r.AvgBW+p.AvgBW, r.MsgRate+p.MsgRate
	return r
}

// runSend is ib_send_bw's part after the barrier that follows RTR: the
// receiver posts its receives, one more barrier, then the sender sends
// and the receiver counts. There is no finish barrier and no report
// exchange: each side prints what it measured itself. With -a that is
// done for every size, with one more barrier after each.
func (s *session) runSend(ctx context.Context) (*Result, error) {
	for _, size := range s.sizes() {
		s.layout(size)
		if !s.connector {
			for i, c := range s.qps {
				c.recvPosted, c.recvDone = 0, 0
				n := s.cfg.RxDepth
				if !s.cfg.timed() {
					n = min(n, s.cfg.Iters)
				}
				if err := s.postRecvs(i, n); err != nil {
					return nil, err
				}
			}
		}
		if err := s.barrier("barrier after posting receives"); err != nil {
			return nil, err
		}
		stop := s.watchPeer()
		var err error
		if s.connector {
			s.res.Report, err = s.transmit(ctx)
		} else {
			s.res.Report, err = s.receive(ctx)
		}
		if gone := stop(); gone || (s.cfg.Infinite && err == nil) {
			// An endless send run has no closing exchange: perftest's
			// receiver never reads again.
			if err == nil && !gone {
				s.printRow(s.res.Report)
				s.rows = true
			}
			return s.endless(gone)
		}
		if err != nil {
			return nil, err
		}
		if s.cfg.All {
			s.printRow(s.res.Report)
			if err := s.barrier("barrier after a size"); err != nil {
				return nil, err
			}
		}
	}
	s.rows = s.cfg.All
	return s.finish()
}

// finish is the close (step 13): a last barrier, then "done" which nobody
// reads; then the passive side checks its buffer and the report is
// printed.
func (s *session) finish() (*Result, error) {
	if err := s.barrier("closing barrier"); err != nil {
		return nil, err
	}
	if s.conn != nil {
		if _, err := s.conn.Write([]byte("done\x00")); err != nil {
			return nil, fmt.Errorf("perftest close: send done: %w", err)
		}
	}
	s.res.Stats = s.stats()
	var checkErr error
	if !s.connector || s.cfg.Duplex {
		if s.cfg.Conn == verbs.QPTypeUC && s.cfg.Test == Write {
			s.awaitUCWrites()
		}
		// Deregistering waits for the remote accesses still in flight,
		// so no late packet changes the buffer while it is checked.
		if err := s.dev.DeregMR(s.mr); err != nil {
			return nil, fmt.Errorf("perftest: deregister the exposed buffer: %w", err)
		}
		s.mr = nil
		peer := s.res.Report
		if s.cfg.Duplex {
			peer = s.res.PeerReport
		}
		activeCheck := s.res.Checked
		checkErr = s.checkTarget(peer)
		if activeCheck != "" {
			s.res.Checked = activeCheck + "; " + s.res.Checked
		}
	}
	s.printReport()
	if checkErr != nil {
		return &s.res, checkErr
	}
	return &s.res, nil
}

func (s *session) xchgInt(step string, v int) (int, error) {
	var my, rem [4]byte
	binary.BigEndian.PutUint32(my[:], uint32(int32(v)))
	if err := s.xchg(step, my[:], rem[:]); err != nil {
		return 0, err
	}
	return max(v, int(int32(binary.BigEndian.Uint32(rem[:])))), nil
}

const dashes = "---------------------------------------------------------------------------------------"

func (s *session) printAddr(side string, k Keys) {
	fmt.Fprintf(s.out, " %s address: LID %#04x QPN %#06x PSN %#06x", side, k.LID, k.QPN, k.PSN)
	if s.cfg.Test != Write {
		fmt.Fprintf(s.out, " OUT %#04x", k.OutReads)
	}
	fmt.Fprintf(s.out, " RKey %#08x VAddr %#016x\n", k.RKey, k.VAddr)
	g := k.GID
	fmt.Fprintf(s.out, " GID: %02d:%02d:%02d:%02d:%02d:%02d:%02d:%02d:%02d:%02d:%02d:%02d:%02d:%02d:%02d:%02d\n",
		g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], g[8], g[9], g[10], g[11], g[12], g[13], g[14], g[15])
}

// printHeader prints the result table's header in perftest's layout
// (the header and rows that rxevm.ParseBW and scripts parse), before the
// run as perftest does.
func (s *session) printHeader() {
	unit := "MB/sec"
	if s.cfg.Gbits {
		unit = "Gb/sec"
	}
	fmt.Fprintf(s.out, " #bytes     #iterations    BW peak[%s]    BW average[%s]   MsgRate[Mpps]\n", unit, unit)
}

// printRow prints one result row and keeps it in Result.Rows.
func (s *session) printRow(r Report) {
	s.res.Rows = append(s.res.Rows, r)
	fmt.Fprintf(s.out, " %-7d    %-10d       %-7.2f            %-7.2f\t\t   %-7.6f\n", r.Size, r.Iters, r.PeakBW, r.AvgBW, r.MsgRate)
}

// printReport ends the result table: the row of the run unless the rows
// were printed as it went, then the data check.
func (s *session) printReport() {
	if !s.rows {
		r := s.res.Report
		if s.cfg.Duplex {
			r = s.duplexSum() // perftest -b prints the sum of both directions
		}
		s.printRow(r)
	}
	fmt.Fprintln(s.out, dashes)
	if s.res.Checked != "" {
		fmt.Fprintf(s.out, " data check: %s\n", s.res.Checked)
	}
}

// awaitUCWrites lets a UC WRITE target take in what is still on its way
// before the data check. UC completes a WRITE at the sender when it is
// sent, so the peer's "done" can overtake its last packets (over loopback,
// even its first ones, still in this side's socket). It waits until the
// QPs received every packet the peer's reported messages take, or until
// no packet came for a while (UC may lose some: the check then reports
// what was never written).
func (s *session) awaitUCWrites() {
	peer := s.res.Report
	if s.cfg.Duplex {
		peer = s.res.PeerReport
	}
	per := uint64(1)
	if mtu := uint64(s.res.MTU); mtu > 0 && peer.Size > mtu {
		per = (peer.Size + mtu - 1) / mtu
	}
	want := peer.Iters * per
	const idle = 200 * time.Millisecond
	last, since := s.stats().RxPackets, time.Now()
	for last < want && time.Since(since) < idle {
		time.Sleep(time.Millisecond)
		if n := s.stats().RxPackets; n != last {
			last, since = n, time.Now()
		}
	}
}
