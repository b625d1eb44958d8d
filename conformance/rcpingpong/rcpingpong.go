// Package rcpingpong speaks ibv_rc_pingpong's protocol (rdma-core
// libibverbs/examples/rc_pingpong.c): the out-of-band TCP exchange of
// "LID:QPN:PSN:GID" and the SEND ping-pong that follows, so that softroce
// and ibv_rc_pingpong interoperate in either role.
package rcpingpong

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/softroce/softroce/verbs"
)

// MsgLen is the size of the exchange message: "%04x:%06x:%06x:%s" with a
// 32-hex-digit GID, plus the terminating NUL; always sent whole.
const MsgLen = 52

// Dest is what one side announces: LID (0 on Ethernet), QPN, PSN, GID.
type Dest struct {
	LID uint16
	QPN uint32
	PSN uint32
	GID verbs.GID
}

// Marshal formats d as ibv_rc_pingpong does, NUL-padded to MsgLen bytes.
func (d Dest) Marshal() []byte {
	s := fmt.Sprintf("%04x:%06x:%06x:%s", d.LID, d.QPN&0xffffff, d.PSN&0xffffff, hex.EncodeToString(d.GID[:]))
	b := make([]byte, MsgLen)
	copy(b, s)
	return b
}

// ParseDest reads a peer's message.
func ParseDest(b []byte) (Dest, error) {
	s := strings.TrimRight(string(b), "\x00")
	parts := strings.Split(s, ":")
	if len(parts) != 4 || len(parts[3]) != 32 {
		return Dest{}, fmt.Errorf("rcpingpong: malformed peer message %q (want LID:QPN:PSN:GID)", s)
	}
	var d Dest
	lid, err1 := strconv.ParseUint(parts[0], 16, 16)
	qpn, err2 := strconv.ParseUint(parts[1], 16, 24)
	psn, err3 := strconv.ParseUint(parts[2], 16, 24)
	g, err4 := hex.DecodeString(parts[3])
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return Dest{}, fmt.Errorf("rcpingpong: malformed peer message %q: %w", s, err)
	}
	d.LID, d.QPN, d.PSN = uint16(lid), uint32(qpn), uint32(psn)
	copy(d.GID[:], g)
	return d, nil
}

// Config mirrors ibv_rc_pingpong's flags.
type Config struct {
	Server     string // host to connect to; empty: listen
	Port       int    // -p, TCP port of the exchange (18515)
	Size       int    // -s, message size (4096)
	MTU        int    // -m, path MTU (1024)
	RxDepth    int    // -r, receives posted (500)
	Iters      int    // -n, iterations (1000)
	GIDIndex   int    // -g
	Events     bool   // -e: wait on completion events instead of polling
	Check      bool   // -c: validate received buffers
	RemotePort uint16 // peer's UDP port, when not 4791 (softroce-to-softroce tests)
	Timeout    time.Duration
	// Dial and Listen replace the net package's for the TCP exchange
	// (e.g. to reach a peer inside a network namespace).
	Dial   func(ctx context.Context, network, addr string) (net.Conn, error)
	Listen func(network, addr string) (net.Listener, error)
}

func (c *Config) defaults() {
	if c.Port == 0 {
		c.Port = 18515
	}
	if c.Size == 0 {
		c.Size = 4096
	}
	if c.MTU == 0 {
		c.MTU = 1024
	}
	if c.RxDepth == 0 {
		c.RxDepth = 500
	}
	if c.Iters == 0 {
		c.Iters = 1000
	}
	if c.Timeout == 0 {
		c.Timeout = 30 * time.Second
	}
}

// Result is what a run measured.
type Result struct {
	Local, Remote Dest
	Bytes         int64
	Elapsed       time.Duration
}

// Run performs one ibv_rc_pingpong session on dev, printing what
// ibv_rc_pingpong prints to out.
func Run(ctx context.Context, dev *verbs.Device, cfg Config, out io.Writer) (*Result, error) {
	cfg.defaults()
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	pd, err := dev.AllocPD()
	if err != nil {
		return nil, err
	}
	buf := make([]byte, cfg.Size)
	for i := range buf {
		buf[i] = 0x7b // rc_pingpong's fill
	}
	mr, err := pd.RegMR(buf, verbs.AccessLocalWrite)
	if err != nil {
		return nil, err
	}
	defer dev.DeregMR(mr)
	cq, err := dev.CreateCQ(cfg.RxDepth + 1)
	if err != nil {
		return nil, err
	}
	qp, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: cfg.RxDepth, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		return nil, err
	}
	defer qp.Destroy()
	gid, err := dev.QueryGID(cfg.GIDIndex)
	if err != nil {
		return nil, err
	}
	local := Dest{QPN: qp.Num(), PSN: rand.Uint32() & 0xffffff, GID: gid}
	const recvID, sendID = 1, 2
	postRecv := func() error {
		return qp.PostRecv(&verbs.RecvWR{ID: recvID, SGL: []verbs.SGE{{Addr: mr.Addr(), Length: uint32(cfg.Size), LKey: mr.LKey()}}})
	}
	// rc_pingpong moves the QP to INIT at creation, with no remote access.
	if err := qp.Init(verbs.AccessLocalWrite); err != nil {
		return nil, err
	}
	for i := 0; i < cfg.RxDepth; i++ {
		if err := postRecv(); err != nil {
			return nil, fmt.Errorf("post receive %d: %w", i, err)
		}
	}
	fmt.Fprintf(out, "  local address:  LID 0x%04x, QPN 0x%06x, PSN 0x%06x, GID %s\n", local.LID, local.QPN, local.PSN, gidString(local.GID))
	connect := func(rem Dest) error {
		return qp.Connect(verbs.RemoteInfo{QPN: rem.QPN, PSN: rem.PSN, GID: rem.GID}, &verbs.ConnectOptions{
			PathMTU: cfg.MTU, SQPSN: local.PSN, SGIDIndex: uint8(cfg.GIDIndex), Timeout: 14, RetryCnt: 7, RNRRetry: 7,
			MinRNRTimer: 12, MaxRDAtomic: 1, Access: verbs.AccessLocalWrite, RemotePort: cfg.RemotePort})
	}
	remote, err := exchange(ctx, cfg, local, connect)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(out, "  remote address: LID 0x%04x, QPN 0x%06x, PSN 0x%06x, GID %s\n", remote.LID, remote.QPN, remote.PSN, gidString(remote.GID))

	if cfg.Server != "" && cfg.Check {
		// rc_pingpong -c: the sender zeroes the first byte of every page.
		for off := 0; off < cfg.Size; off += 4096 {
			buf[off] = 0
		}
	}
	start := time.Now()
	send := func() error {
		return qp.PostSend(&verbs.SendWR{ID: sendID, Opcode: verbs.WRSend, Flags: verbs.SendSignaled,
			SGL: []verbs.SGE{{Addr: mr.Addr(), Length: uint32(cfg.Size), LKey: mr.LKey()}}})
	}
	// The connector sends first; afterwards each side sends again once its
	// previous SEND completed and a RECV arrived (rc_pingpong's pending
	// bits), until both counts reach iters.
	sendPending, recvPending := false, true
	if cfg.Server != "" {
		if err := send(); err != nil {
			return nil, err
		}
		sendPending = true
	}
	recvs, sends := 0, 0
	routs := cfg.RxDepth
	wcs := make([]verbs.WC, 2)
	for recvs < cfg.Iters || sends < cfg.Iters {
		n, err := cq.Wait(ctx, wcs)
		if err != nil {
			return nil, fmt.Errorf("waiting for completions after %d sends and %d receives: %w (is the peer still running?)", sends, recvs, err)
		}
		for _, wc := range wcs[:n] {
			if wc.Status != 0 {
				return nil, fmt.Errorf("failed status %s (%d) for wr_id %d", wc.Status, uint8(wc.Status), wc.WRID)
			}
			switch wc.WRID {
			case sendID:
				sends++
				sendPending = false
			case recvID:
				recvs++
				recvPending = false
				if routs--; routs <= 1 {
					for routs < cfg.RxDepth {
						if err := postRecv(); err != nil {
							return nil, err
						}
						routs++
					}
				}
			default:
				return nil, fmt.Errorf("completion for unknown wr_id %d", wc.WRID)
			}
			if !sendPending && !recvPending && sends < cfg.Iters {
				if err := send(); err != nil {
					return nil, err
				}
				sendPending, recvPending = true, true
			}
		}
	}
	el := time.Since(start)
	bytes := int64(cfg.Size) * int64(cfg.Iters) * 2
	fmt.Fprintf(out, "%d bytes in %.2f seconds = %.2f Mbit/sec\n", bytes, el.Seconds(), float64(bytes)*8/el.Seconds()/1e6)
	fmt.Fprintf(out, "%d iters in %.2f seconds = %.2f usec/iter\n", cfg.Iters, el.Seconds(), float64(el.Microseconds())/float64(cfg.Iters))
	if cfg.Server == "" && cfg.Check {
		for off := 0; off < cfg.Size; off += 4096 {
			if buf[off] != 0 {
				fmt.Fprintf(out, "invalid data in page %d\n", off/4096)
			}
		}
	}
	return &Result{Local: local, Remote: remote, Bytes: bytes, Elapsed: el}, nil
}

func gidString(g verbs.GID) string { return g.String() }

// exchange runs the TCP handshake: the connector sends first, the listener
// connects its QP before answering, then the connector sends "done".
func exchange(ctx context.Context, cfg Config, local Dest, connect func(Dest) error) (Dest, error) {
	var conn net.Conn
	var err error
	if cfg.Server != "" {
		dial := cfg.Dial
		if dial == nil {
			dial = (&net.Dialer{}).DialContext
		}
		addr := net.JoinHostPort(cfg.Server, strconv.Itoa(cfg.Port))
		for {
			conn, err = dial(ctx, "tcp", addr)
			if err == nil || ctx.Err() != nil {
				break
			}
			// ibv_rc_pingpong's client gives up at once; retrying briefly
			// lets a script start both sides together.
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
		if err != nil {
			return Dest{}, fmt.Errorf("couldn't connect to %s: %w (is the pingpong server running?)", addr, err)
		}
	} else {
		listen := cfg.Listen
		if listen == nil {
			listen = net.Listen
		}
		ln, err := listen("tcp", ":"+strconv.Itoa(cfg.Port))
		if err != nil {
			return Dest{}, fmt.Errorf("listen on TCP port %d: %w (choose another with -p)", cfg.Port, err)
		}
		go func() { <-ctx.Done(); ln.Close() }()
		conn, err = ln.Accept()
		ln.Close()
		if err != nil {
			return Dest{}, fmt.Errorf("waiting for a client on TCP port %d: %w", cfg.Port, err)
		}
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	if cfg.Server != "" {
		if _, err := conn.Write(local.Marshal()); err != nil {
			return Dest{}, fmt.Errorf("send local address: %w", err)
		}
		rem, err := readAndConnect(conn, connect)
		if err != nil {
			return Dest{}, err
		}
		if _, err := conn.Write([]byte("done\x00")); err != nil {
			return Dest{}, err
		}
		return rem, nil
	}
	rem, err := readAndConnect(conn, connect)
	if err != nil {
		return Dest{}, err
	}
	if _, err := conn.Write(local.Marshal()); err != nil {
		return Dest{}, fmt.Errorf("send local address: %w", err)
	}
	done := make([]byte, 5)
	io.ReadFull(conn, done) // the client's "done"; content not checked, like rc_pingpong
	return rem, nil
}

// readAndConnect reads the peer's message and brings our QP to RTS with it.
func readAndConnect(conn net.Conn, connect func(Dest) error) (Dest, error) {
	msg := make([]byte, MsgLen)
	if _, err := io.ReadFull(conn, msg); err != nil {
		return Dest{}, fmt.Errorf("read remote address: %w", err)
	}
	rem, err := ParseDest(msg)
	if err != nil {
		return Dest{}, err
	}
	if err := connect(rem); err != nil {
		return Dest{}, fmt.Errorf("couldn't connect to remote QP: %w", err)
	}
	return rem, nil
}
