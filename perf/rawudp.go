package perf

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"syscall"
	"time"
)

// The raw UDP ping-pong is the reference `softroce lat` is compared with:
// the same round trip (a client sends size bytes, the server answers with
// as many, the client times write to read) over plain kernel UDP sockets
// with no transport above them, so the difference between the two is what
// the RC stack and its goroutine hand-offs cost. It runs as two processes
// (RawUDPServe, RawUDPPing) on the port `lat --raw-udp` is given, and
// reports in LatResult's columns.

// RawTest names the raw ping-pong in reports.
const RawTest Test = "raw-udp"

// RawTitle is the title of a raw ping-pong report.
const RawTitle = "Raw UDP ping-pong Latency Test"

// rawEnd is the one-byte datagram that ends a session: every sample
// carries the round's sequence number in at least 2 bytes or is a 1-byte
// datagram whose byte is not rawEndByte.
const rawEndByte = 0xff

// rawRetry is how long the client waits for an answer before it sends the
// datagram again (UDP may drop one under load).
const rawRetry = 200 * time.Millisecond

// RawConfig configures the raw ping-pong.
type RawConfig struct {
	// BusyPoll, if positive, makes a reader poll its socket without
	// waiting (non-blocking recvfrom, yielding the processor between
	// tries) for up to this long before it sleeps in the poller: the
	// raw counterpart of Config.BusyPoll.
	BusyPoll time.Duration
	// Wait is how long the client keeps trying to reach the server
	// before the first round (default 5s).
	Wait time.Duration
}

// RawUDPServe answers every datagram on conn with one of the same length
// and contents, until a session-ending datagram arrives or ctx ends. It
// returns the number of round trips answered (probes not counted).
func RawUDPServe(ctx context.Context, conn *net.UDPConn, rc RawConfig) (int64, error) {
	stop := context.AfterFunc(ctx, func() { conn.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	r, err := newRawReader(conn, rc.BusyPoll)
	if err != nil {
		return 0, err
	}
	buf := make([]byte, MaxSize+1)
	var n int64
	for {
		k, from, err := r.readFrom(buf)
		if err != nil {
			if ctx.Err() != nil {
				return n, ctx.Err()
			}
			return n, fmt.Errorf("raw UDP server: read: %w", err)
		}
		if _, err := conn.WriteToUDPAddrPort(buf[:k], from); err != nil {
			return n, fmt.Errorf("raw UDP server: answer %v: %w", from, err)
		}
		if k == 1 && buf[0] == rawEndByte {
			return n, nil
		}
		if k > 0 { // empty: the client's probe, not a round trip
			n++
		}
	}
}

// RawUDPPing runs c's latency rounds (c.Sizes, c.Iters or c.Duration)
// against the server at peer over conn, which must not be connected. Rows
// are passed to row as they complete (may be nil). The server is told to
// stop when the run ends.
func RawUDPPing(ctx context.Context, conn *net.UDPConn, peer netip.AddrPort, c Config, rc RawConfig, row func(any)) (*Report, error) {
	c.Test = Write // for fill's checks; the report says RawTest
	if err := c.fill(true); err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { conn.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	r, err := newRawReader(conn, rc.BusyPoll)
	if err != nil {
		return nil, err
	}
	rep := &Report{Kind: "lat", Test: RawTest, Backend: "udp", QPs: 1, MTU: c.MTU}
	out := make([]byte, c.maxSize())
	in := make([]byte, c.maxSize()+1)
	if err := rawProbe(ctx, conn, peer, rc.Wait, in); err != nil {
		return rep, err
	}
	var runErr error
	for _, size := range c.Sizes {
		res, err := rawRound(ctx, conn, r, peer, &c, size, out, in)
		if err != nil {
			runErr = fmt.Errorf("%d bytes: %w", size, err)
			break
		}
		rep.Lat = append(rep.Lat, res)
		if row != nil {
			row(&res)
		}
	}
	// Tell the server to stop; it echoes the datagram, which says it got
	// it. A lost one is sent again a few times, then given up on.
	for try := 0; try < 5; try++ {
		if _, err := conn.WriteToUDPAddrPort([]byte{rawEndByte}, peer); err != nil {
			break
		}
		r.deadline = time.Now().Add(rawRetry)
		conn.SetReadDeadline(r.deadline)
		k, _, err := conn.ReadFromUDPAddrPort(in)
		if err == nil && k == 1 && in[0] == rawEndByte {
			break
		}
		if ctx.Err() != nil {
			break
		}
	}
	return rep, runErr
}

// rawProbe waits until the server answers an empty datagram (no round
// is timed before the server is there), for up to wait. Answers to probes
// sent again come late and are empty: no round mistakes them for its own.
func rawProbe(ctx context.Context, conn *net.UDPConn, peer netip.AddrPort, wait time.Duration, in []byte) error {
	if wait <= 0 {
		wait = 5 * time.Second
	}
	end := time.Now().Add(wait)
	for time.Now().Before(end) && ctx.Err() == nil {
		if _, err := conn.WriteToUDPAddrPort(nil, peer); err != nil {
			return fmt.Errorf("send to %v: %w", peer, err)
		}
		conn.SetReadDeadline(time.Now().Add(min(rawRetry, time.Until(end))))
		k, _, err := conn.ReadFromUDPAddrPort(in)
		if err == nil && k == 0 {
			conn.SetReadDeadline(time.Time{})
			return nil
		}
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("%w from %v within %v: is `softroce lat --server --raw-udp` running there?", ErrNoAnswer, peer, wait)
}

// rawRound is one size of the raw ping-pong.
func rawRound(ctx context.Context, conn *net.UDPConn, r *rawReader, peer netip.AddrPort, c *Config, size int, out, in []byte) (LatResult, error) {
	res := LatResult{Test: RawTest, Bytes: size}
	total := int64(c.Iters)
	var deadline time.Time
	start := time.Now()
	if c.Duration > 0 {
		total = 1 << 62
		deadline = start.Add(c.Duration)
	}
	samples := make([]float64, 0, min(total, 1<<20))
	msg := out[:size]
	clk := latClock{start: start}
	for i := int64(0); i < total; i++ {
		t0 := clk.now()
		if !deadline.IsZero() && t0 > c.Duration {
			break
		}
		if ctx.Err() != nil {
			return res, ctx.Err()
		}
		// The sequence number (as much of it as fits) tells this round's
		// answer from a late one to a datagram sent again.
		var seq [8]byte
		binary.LittleEndian.PutUint64(seq[:], uint64(i))
		copy(msg, seq[:])
		if size == 1 && msg[0] == rawEndByte {
			msg[0] = 0
		}
		if _, err := conn.WriteToUDPAddrPort(msg, peer); err != nil {
			return res, fmt.Errorf("send to %v: %w", peer, err)
		}
		for {
			r.arm()
			k, _, err := r.readFrom(in)
			if errors.Is(err, os.ErrDeadlineExceeded) && ctx.Err() == nil {
				// Lost on the way there or back: send it again.
				res.Retransmits++
				if res.Retransmits > 50 {
					return res, fmt.Errorf("no answer from %v after %d tries: is `softroce lat --server --raw-udp` running there?", peer, res.Retransmits)
				}
				if _, err := conn.WriteToUDPAddrPort(msg, peer); err != nil {
					return res, fmt.Errorf("send to %v: %w", peer, err)
				}
				continue
			}
			if err != nil {
				return res, fmt.Errorf("after %d round trips: %w", i, err)
			}
			if k == size && string(in[:min(size, 8)]) == string(msg[:min(size, 8)]) {
				break
			}
			// A stale answer: keep reading.
		}
		t1 := clk.now()
		samples = append(samples, float64((t1-t0).Nanoseconds())/1000)
		clk.progress(c, t1, i+1, total)
	}
	if c.Progress != nil {
		c.Progress(int64(len(samples)), int64(len(samples)))
	}
	if len(samples) == 0 {
		return res, errors.New("no round trip completed")
	}
	fillLat(&res, samples)
	return res, nil
}

// rawReader reads datagrams either blocking (Go's poller) or by polling
// the socket first.
type rawReader struct {
	conn *net.UDPConn
	raw  syscall.RawConn
	busy time.Duration
	// deadline, if set, is the socket's read deadline (the client's
	// resend time), moved on by arm.
	deadline time.Time
	// Scratch of the polling read, kept here so the closure does not
	// allocate per call.
	pollBuf  []byte
	pollN    int
	pollFrom syscall.Sockaddr
	pollErr  error
	pollFn   func(fd uintptr) bool
}

func newRawReader(conn *net.UDPConn, busy time.Duration) (*rawReader, error) {
	r := &rawReader{conn: conn, busy: busy}
	if busy > 0 {
		raw, err := conn.SyscallConn()
		if err != nil {
			return nil, err
		}
		r.raw = raw
		r.pollFn = func(fd uintptr) bool {
			r.pollN, r.pollFrom, r.pollErr = syscall.Recvfrom(int(fd), r.pollBuf, syscall.MSG_DONTWAIT)
			return true // never wait here: the caller polls again
		}
	}
	return r, nil
}

// readFrom reads one datagram into b.
func (r *rawReader) readFrom(b []byte) (int, netip.AddrPort, error) {
	if r.busy > 0 {
		t0 := time.Now()
		r.pollBuf = b
		for i := 0; ; i++ {
			if err := r.raw.Read(r.pollFn); err != nil {
				return 0, netip.AddrPort{}, err
			}
			if r.pollErr == nil {
				return r.pollN, sockaddrPort(r.pollFrom), nil
			}
			if r.pollErr != syscall.EAGAIN && r.pollErr != syscall.EINTR {
				return 0, netip.AddrPort{}, r.pollErr
			}
			if i&15 == 15 {
				if now := time.Now(); now.Sub(t0) > r.busy || !r.deadline.IsZero() && now.After(r.deadline) {
					break
				}
			}
			runtime.Gosched()
		}
	}
	return r.conn.ReadFromUDPAddrPort(b)
}

// arm makes sure an answer lost now is noticed between rawRetry/2 and
// rawRetry from now. The deadline moves only when half of it has passed:
// setting it for every datagram would add a timer update to each round
// trip of the reference.
func (r *rawReader) arm() {
	now := time.Now()
	if r.deadline.Sub(now) < rawRetry/2 {
		r.deadline = now.Add(rawRetry)
		r.conn.SetReadDeadline(r.deadline)
	}
}

func sockaddrPort(sa syscall.Sockaddr) netip.AddrPort {
	switch a := sa.(type) {
	case *syscall.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port))
	case *syscall.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(a.Addr).Unmap(), uint16(a.Port))
	}
	return netip.AddrPort{}
}

// WriteRawLatHeader writes the title block and column header of a raw
// ping-pong report, in WriteLatHeader's layout (the rows are WriteLatRow's).
func WriteRawLatHeader(w io.Writer, c *Config) error {
	how := "blocking reads"
	if c.BusyPoll > 0 {
		how = fmt.Sprintf("reads poll the socket for %v before they block", c.BusyPoll)
	}
	iters := fmt.Sprintf("%d iterations per size", c.Iters)
	if c.Duration > 0 {
		iters = fmt.Sprintf("%v per size", c.Duration)
	}
	_, err := fmt.Fprintf(w, "%s\n                    %s\n kernel UDP sockets, %s, %s\n %s\n%s\n #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99%% percentile[usec]   99.9%% percentile[usec]\n",
		rule, RawTitle, how, iters, "t = send to answer of one datagram at a time (a full round trip)", rule)
	return err
}
