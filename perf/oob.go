package perf

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/verbs"
)

// Proto names the out-of-band protocol and its version. A peer speaking
// another version is refused with a clear message rather than misread.
const Proto = "softroce-perf/1"

// DefaultPort is the TCP port of the out-of-band exchange, perftest's.
const DefaultPort = 18515

const (
	// maxExchange bounds the bytes read from a peer over a whole session:
	// the messages are a few hundred bytes, a sweep's report a few KiB.
	maxExchange = 1 << 20
	// helloTimeout bounds the wait for a connected client's first message.
	helloTimeout = 10 * time.Second
)

// hello is the first message each way: the client's says what to run, the
// server's answers with its endpoint (or an error).
type hello struct {
	Proto string `json:"proto"`
	Kind  string `json:"kind"` // "bw" or "lat"
	Test  Test   `json:"test"`
	// MaxSize is the largest message of the run: the server registers
	// that much memory.
	MaxSize int `json:"max_size"`
	QPs     int `json:"qps"`
	MTU     int `json:"mtu"`
	TxDepth int `json:"tx_depth"`
	// CC is the client's congestion control ("dcqcn"; empty: none): the
	// server turns it on too, so that its QPs answer CE marks with CNPs.
	CC    string `json:"cc,omitempty"`
	Info  Info   `json:"info"`
	Error string `json:"error,omitempty"`
}

// done is the client's last message: the results, for the server to print.
type done struct {
	Done   bool   `json:"done"`
	Report Report `json:"report"`
	Error  string `json:"error,omitempty"`
}

// LinkOpener opens the data link on a local address. The perf package
// only asks for the address; the caller picks the backend.
type LinkOpener func(local netip.Addr) (nic.Link, uint16, error)

// ServerConfig configures Serve.
type ServerConfig struct {
	// Open opens the data link on the address the client reached us at
	// (or the one the caller fixed).
	Open LinkOpener
	// Backend names the backend in reports.
	Backend string
	// Log receives one line per event (may be nil).
	Log io.Writer
	// Receives is how many receive WRs per QP a send test keeps posted
	// (default 512).
	Receives int
	// BusyPoll is the device's verbs.Options.BusyPoll (0: off).
	BusyPoll time.Duration
	// NoInlineWait is the device's verbs.Options.NoInlineWait.
	NoInlineWait bool
	// CC is the device's congestion control (verbs.CCDCQCN: on), also
	// turned on when the client asks for it.
	CC verbs.CCMode
}

// Serve answers one client on ln: it sets up an endpoint as the client
// asks, lets the client run, and returns the client's report.
func Serve(ctx context.Context, ln net.Listener, sc ServerConfig) (*Report, error) {
	logf := func(format string, args ...any) {
		if sc.Log != nil {
			fmt.Fprintf(sc.Log, format+"\n", args...)
		}
	}
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	conn, err := ln.Accept()
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("accept: %w", err)
	}
	defer conn.Close()
	stopConn := context.AfterFunc(ctx, func() { conn.Close() })
	defer stopConn()
	logf("client %v connected", conn.RemoteAddr())
	// The peer is untrusted: bound what it may make us buffer, and how
	// long it may keep us waiting for its hello.
	dec, enc := json.NewDecoder(io.LimitReader(conn, maxExchange)), json.NewEncoder(conn)
	_ = conn.SetReadDeadline(time.Now().Add(helloTimeout))
	var h hello
	if err := dec.Decode(&h); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("client %v disconnected before saying what to run (did it fail to open its data link?)", conn.RemoteAddr())
		}
		return nil, fmt.Errorf("read the client's hello from %v: %w (is it a softroce bw/lat client?)", conn.RemoteAddr(), err)
	}
	refuse := func(err error) (*Report, error) {
		_ = enc.Encode(hello{Proto: Proto, Error: err.Error()})
		return nil, err
	}
	_ = conn.SetReadDeadline(time.Time{}) // a timed run may take long
	if h.Proto != Proto {
		return refuse(fmt.Errorf("client speaks %q, this server %q: use the same softroce version on both sides", h.Proto, Proto))
	}
	c := Config{Test: h.Test, Sizes: []int{h.MaxSize}, QPs: h.QPs, MTU: h.MTU, TxDepth: h.TxDepth}
	if err := c.fill(h.Kind == "lat"); err != nil {
		return refuse(fmt.Errorf("client asks for a bad run: %w", err))
	}
	local, ok := netip.AddrFromSlice(conn.LocalAddr().(*net.TCPAddr).IP)
	if !ok {
		return refuse(errors.New("cannot tell the local address of the connection"))
	}
	link, port, err := sc.Open(local.Unmap())
	if err != nil {
		return refuse(fmt.Errorf("open the data link: %w", err))
	}
	link = retarget(link, h.Info.UDPPort)
	mode := sc.CC
	if h.CC == verbs.CCDCQCN.String() {
		mode = verbs.CCDCQCN
	}
	dev, err := verbs.Open(link, deviceOptions("", sc.BusyPoll, sc.NoInlineWait, mode))
	if err != nil {
		link.Close()
		return refuse(fmt.Errorf("open device: %w", err))
	}
	ep, err := NewEndpoint(dev, c.QPs, h.MaxSize, c.TxDepth)
	if err != nil {
		dev.Close()
		return refuse(err)
	}
	defer ep.Close()
	if err := ep.Connect(h.Info, c.MTU); err != nil {
		return refuse(err)
	}
	recvCtx, cancelRecv := context.WithCancel(ctx)
	defer cancelRecv()
	var wg sync.WaitGroup
	var received int64
	var recvErr error
	if c.Test == Send {
		n := sc.Receives
		if n == 0 {
			n = 512
		}
		if err := ep.PostReceives(min(n, c.TxDepth), h.MaxSize); err != nil {
			return refuse(fmt.Errorf("post receives: %w", err))
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			received, recvErr = ep.ServeReceives(recvCtx, h.MaxSize)
		}()
	}
	if err := enc.Encode(hello{Proto: Proto, Kind: h.Kind, Test: c.Test, MaxSize: h.MaxSize, QPs: c.QPs, MTU: c.MTU, TxDepth: c.TxDepth, Info: ep.Info(port)}); err != nil {
		return nil, fmt.Errorf("answer the client: %w", err)
	}
	logf("serving %s %s: %d QP(s), up to %d bytes, data on %v port %d", h.Kind, c.Test, c.QPs, h.MaxSize, local, port)
	var d done
	err = dec.Decode(&d)
	cancelRecv()
	wg.Wait()
	if err != nil {
		return nil, fmt.Errorf("client went away before it finished: %w", err)
	}
	if d.Error != "" {
		return nil, fmt.Errorf("client failed: %s", d.Error)
	}
	if recvErr != nil {
		return nil, recvErr
	}
	if c.Test == Send {
		logf("received %d messages", received)
	}
	_ = enc.Encode(done{Done: true})
	d.Report.Backend = sc.Backend
	return &d.Report, nil
}

// ClientConfig configures Dial.
type ClientConfig struct {
	// Peer is the server's TCP address.
	Peer netip.AddrPort
	// Wait is how long to keep trying to reach the server (default 5s).
	Wait time.Duration
	// Open opens the data link; local is the address the TCP connection
	// to the server left from.
	Open LinkOpener
	// Backend names the backend in reports.
	Backend string
	// Command is the server command named in the hint when the server
	// does not answer (default "bw": "is `softroce bw --server` running
	// there?").
	Command string
}

// ErrNoAnswer is wrapped by Run when the server cannot be reached.
var ErrNoAnswer = errors.New("no answer")

// Run connects to the server, runs every size of c and returns the report.
// lat selects latency instead of bandwidth. Rows are passed to row as they
// complete (may be nil).
func Run(ctx context.Context, cc ClientConfig, c Config, lat bool, row func(any)) (*Report, error) {
	if err := c.fill(lat); err != nil {
		return nil, err
	}
	wait := cc.Wait
	if wait == 0 {
		wait = 5 * time.Second
	}
	cmd := cc.Command
	if cmd == "" {
		cmd = "bw"
	}
	conn, err := dialRetry(ctx, cc.Peer, wait, cmd)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	stopConn := context.AfterFunc(ctx, func() { conn.Close() })
	defer stopConn()
	local, _ := netip.AddrFromSlice(conn.LocalAddr().(*net.TCPAddr).IP)
	link, port, err := cc.Open(local.Unmap())
	if err != nil {
		return nil, fmt.Errorf("open the data link: %w", err)
	}
	pl := &portLink{Link: link}
	dev, err := verbs.Open(pl, deviceOptions("", c.BusyPoll, c.NoInlineWait, c.CC))
	if err != nil {
		link.Close()
		return nil, fmt.Errorf("open device: %w", err)
	}
	ep, err := NewEndpoint(dev, c.QPs, c.maxSize(), c.TxDepth)
	if err != nil {
		dev.Close()
		return nil, err
	}
	defer ep.Close()
	kind := "bw"
	if lat {
		kind = "lat"
	}
	dec, enc := json.NewDecoder(io.LimitReader(conn, maxExchange)), json.NewEncoder(conn)
	var ccName string
	if c.CC == verbs.CCDCQCN {
		ccName = c.CC.String()
	}
	if err := enc.Encode(hello{Proto: Proto, Kind: kind, Test: c.Test, MaxSize: c.maxSize(), QPs: c.QPs, MTU: c.MTU, TxDepth: c.TxDepth, CC: ccName, Info: ep.Info(port)}); err != nil {
		return nil, fmt.Errorf("send hello to %v: %w", cc.Peer, err)
	}
	var h hello
	if err := dec.Decode(&h); err != nil {
		return nil, fmt.Errorf("read the server's answer from %v: %w", cc.Peer, err)
	}
	if h.Error != "" {
		return nil, fmt.Errorf("server %v refused: %s", cc.Peer, h.Error)
	}
	if h.Proto != Proto {
		return nil, fmt.Errorf("server %v speaks %q, this client %q: use the same softroce version on both sides", cc.Peer, h.Proto, Proto)
	}
	pl.port.Store(uint32(h.Info.UDPPort))
	if err := ep.Connect(h.Info, c.MTU); err != nil {
		return nil, err
	}
	if c.Started != nil {
		c.Started(ep.qps)
	}
	rep, runErr := runSizes(ctx, ep, &c, h.Info, lat, row)
	rep.Backend = cc.Backend
	d := done{Done: true, Report: *rep}
	if runErr != nil {
		d.Error = runErr.Error()
	}
	if err := enc.Encode(d); err != nil && runErr == nil {
		return rep, fmt.Errorf("send results to %v: %w", cc.Peer, err)
	}
	var ack done
	_ = conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	_ = dec.Decode(&ack)
	return rep, runErr
}

// runSizes runs every size of c on ep against r.
func runSizes(ctx context.Context, ep *Endpoint, c *Config, r Info, lat bool, row func(any)) (*Report, error) {
	rep := &Report{Kind: "bw", Test: c.Test, QPs: c.QPs, MTU: c.MTU}
	if lat {
		rep.Kind = "lat"
	}
	for _, size := range c.Sizes {
		if lat {
			res, err := ep.RunLat(ctx, c, size, r)
			if err != nil {
				return rep, fmt.Errorf("%d bytes: %w", size, err)
			}
			rep.Lat = append(rep.Lat, res)
			if row != nil {
				row(&res)
			}
		} else {
			res, err := ep.RunBW(ctx, c, size, r)
			if err != nil {
				return rep, fmt.Errorf("%d bytes: %w", size, err)
			}
			rep.BW = append(rep.BW, res)
			if row != nil {
				row(&res)
			}
		}
	}
	return rep, nil
}

// dialRetry keeps trying to reach the server until wait has passed: the
// server may still be starting (perftest users start both at once).
func dialRetry(ctx context.Context, peer netip.AddrPort, wait time.Duration, cmd string) (net.Conn, error) {
	deadline := time.Now().Add(wait)
	var d net.Dialer
	for {
		left := time.Until(deadline)
		if left <= 0 {
			break
		}
		dctx, cancel := context.WithTimeout(ctx, left)
		conn, err := d.DialContext(dctx, "tcp", peer.String())
		cancel()
		if err == nil {
			return conn, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		// Refused: nobody listens yet; try again shortly. Anything
		// else (unreachable, timeout) also gets retried until wait.
		if !errors.Is(err, syscall.ECONNREFUSED) && time.Until(deadline) <= 0 {
			break
		}
		select {
		case <-time.After(min(200*time.Millisecond, max(time.Until(deadline), 0))):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return nil, fmt.Errorf("%w from %v within %v: is `softroce %s --server` running there?", ErrNoAnswer, peer, wait, cmd)
}
