package rping

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/softroce/softroce/cm"
	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/nic/pipe"
	"github.com/softroce/softroce/verbs"
)

func TestFill(t *testing.T) {
	// The line every rping user has seen, and the next one.
	if got, want := Line(0, 64), "ping data: rdma-ping-0: ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqr"; got != want {
		t.Fatalf("ping 0:\n got %q\nwant %q", got, want)
	}
	if got, want := Line(1, 64), "ping data: rdma-ping-1: BCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrs"; got != want {
		t.Fatalf("ping 1:\n got %q\nwant %q", got, want)
	}
	// Ping 57 starts at 'z', 58 at 'A' again; within a buffer 'z' is
	// followed by 'A'.
	b := make([]byte, 100)
	Fill(b, 57)
	if p := len("rdma-ping-57: "); b[p] != 'z' || b[p+1] != 'A' {
		t.Fatalf("ping 57: %q", b)
	}
	Fill(b, 58)
	if p := len("rdma-ping-58: "); b[p] != 'A' {
		t.Fatalf("ping 58: %q", b)
	}
	Fill(b, 0)
	if p := len("rdma-ping-0: ") + 58; b[p-1] != 'z' || b[p] != 'A' || b[99] != 0 {
		t.Fatalf("wrap inside a buffer: %q", b)
	}
	// The smallest size holds the largest ping number.
	b = make([]byte, MinSize)
	Fill(b, 1<<31-1)
	if got := cstring(b); got != "rdma-ping-2147483647: "+string(rune(65+(1<<31-1)%58))+"IJ" {
		t.Fatalf("min size: %q", got)
	}
}

func TestParse(t *testing.T) {
	cfg, err := Parse([]string{"-c", "-vV", "-a", "10.0.0.2", "-C10", "-S", "4096", "-p", "7000", "--udp-port=4792"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Server || !cfg.Verbose || !cfg.Validate || cfg.Addr != netip.MustParseAddr("10.0.0.2") || cfg.Count != 10 ||
		cfg.Size != 4096 || cfg.Port != 7000 || cfg.UDPPort != 4792 {
		t.Fatalf("%+v", cfg)
	}
	cfg, err = Parse([]string{"-s"})
	if err != nil || !cfg.Server || cfg.Size != 64 || cfg.Port != 7174 || cfg.Count != 0 || cfg.Addr.IsValid() {
		t.Fatalf("defaults: %+v %v", cfg, err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "-s (server) or -c (client)"},
		{[]string{"-c"}, "-a ADDR"},
		{[]string{"-s", "-S", "25"}, "Invalid size 25 (valid range is 26 to 65535)"},
		{[]string{"-s", "-S", "65536"}, "Invalid size 65536"},
		{[]string{"-s", "-C", "-1"}, "Invalid count -1"},
		{[]string{"-s", "-C", "x"}, `-C "x": not a number`},
		{[]string{"-s", "-p", "70000"}, "port 1..65535"},
		{[]string{"-s", "-x"}, "unknown option -x"},
		{[]string{"-s", "-a"}, "-a needs a value"},
		{[]string{"-c", "-P", "-a", "1.2.3.4"}, "-P is a server option"},
		{[]string{"-s", "1.2.3.4"}, "after -a"},
		{[]string{"-s", "--backend", "dpdk"}, "choose udp"},
	} {
		_, err := Parse(tc.args)
		if err == nil || !strings.Contains(err.Error(), tc.want) || ExitCode(err) != ExitUsage {
			t.Errorf("%q: %v, want %q (exit %d)", tc.args, err, tc.want, ExitCode(err))
		}
	}
}

// pair is two softroce devices on a pipe, each with its CM.
type pair struct {
	a, b     *verbs.Device
	cma, cmb *cm.CM
}

func newPair(t *testing.T) *pair {
	t.Helper()
	la, lb := pipe.New(pipe.Config{})
	p := &pair{}
	var err error
	if p.a, err = verbs.Open(la, nil); err != nil {
		t.Fatal(err)
	}
	if p.b, err = verbs.Open(lb, nil); err != nil {
		t.Fatal(err)
	}
	if p.cma, err = cm.Open(p.a, nil); err != nil {
		t.Fatal(err)
	}
	if p.cmb, err = cm.Open(p.b, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.cma.Close(); p.cmb.Close(); p.a.Close(); p.b.Close() })
	return p
}

// buffer is a bytes.Buffer safe for the writers of concurrent runs.
type buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *buffer) Write(p []byte) (int, error) { b.mu.Lock(); defer b.mu.Unlock(); return b.b.Write(p) }
func (b *buffer) String() string              { b.mu.Lock(); defer b.mu.Unlock(); return b.b.String() }

type result struct {
	out, errOut *buffer
	err         error
	done        chan struct{}
}

func start(ctx context.Context, dev *verbs.Device, c *cm.CM, cfg Config) *result {
	r := &result{out: &buffer{}, errOut: &buffer{}, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.err = Run(ctx, dev, c, cfg, r.out, r.errOut)
	}()
	return r
}

func (r *result) ended() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

func (r *result) wait(t *testing.T, ctx context.Context) {
	t.Helper()
	select {
	case <-r.done:
	case <-ctx.Done():
		t.Fatalf("run did not end: stdout %q stderr %q", r.out, r.errOut)
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestLoopback runs a softroce client against a softroce server with -v
// -V: both print every ping's data, exactly as rping does, and exit 0.
func TestLoopback(t *testing.T) {
	for _, tc := range []struct{ size, count int }{{MinSize, 3}, {64, 10}, {4096, 5}, {MaxSize, 2}} {
		t.Run(fmt.Sprintf("size%d/count%d", tc.size, tc.count), func(t *testing.T) {
			ctx := ctxT(t)
			p := newPair(t)
			srv := start(ctx, p.b, p.cmb, Config{Server: true, Port: DefaultPort, Size: tc.size, Verbose: true})
			// The client dials as soon as the server runs: a REJ 8 from
			// a server not yet listening is retried here.
			var cli *result
			for {
				cli = start(ctx, p.a, p.cma, Config{Addr: p.cmb.Local(), Port: DefaultPort, Size: tc.size, Count: tc.count, Verbose: true, Validate: true})
				cli.wait(t, ctx)
				if cli.err == nil || !strings.Contains(cli.errOut.String(), "error 8") {
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
			srv.wait(t, ctx)
			if cli.err != nil || srv.err != nil {
				t.Fatalf("client %v: %s\nserver %v: %s", cli.err, cli.errOut, srv.err, srv.errOut)
			}
			var want, wantSrv strings.Builder
			for i := range tc.count {
				fmt.Fprintf(&want, "%s\n", Line(i, tc.size))
				fmt.Fprintf(&wantSrv, "server %s\n", Line(i, tc.size))
			}
			if got := cli.out.String(); got != want.String() {
				t.Fatalf("client stdout:\n%s\nwant:\n%s", got, &want)
			}
			if got := srv.out.String(); got != wantSrv.String() {
				t.Fatalf("server stdout:\n%s\nwant:\n%s", got, &wantSrv)
			}
			// The server learns of the end from the client's DREQ, as
			// rping's does.
			if e := srv.errOut.String(); !strings.Contains(e, "server DISCONNECT EVENT...") || !strings.Contains(e, "wait for RDMA_READ_ADV state 10") {
				t.Fatalf("server stderr: %q", e)
			}
		})
	}
}

// TestNoServer: a client without a server gets rping's REJECTED line and
// exit status 255, with advice.
func TestNoServer(t *testing.T) {
	ctx := ctxT(t)
	p := newPair(t)
	var out, errOut buffer
	err := Run(ctx, p.a, p.cma, Config{Addr: p.cmb.Local(), Port: 7999, Size: 64, Count: 1}, &out, &errOut)
	if ExitCode(err) != ExitFailed || !strings.Contains(errOut.String(), "cma event RDMA_CM_EVENT_REJECTED, error 8") ||
		!strings.Contains(errOut.String(), "start the server") {
		t.Fatalf("%v: %s", err, &errOut)
	}
}

// hostile is a client that speaks rping's protocol badly: it connects and
// SENDs info, a raw message of any length.
type hostile struct {
	qp  *verbs.QP
	cq  *verbs.CQ
	mr  *verbs.MR
	buf []byte
	k   *cm.Conn
}

func dialHostile(t *testing.T, ctx context.Context, p *pair, port uint16) *hostile {
	t.Helper()
	h := &hostile{buf: make([]byte, 256)}
	pd, _ := p.a.AllocPD()
	h.cq, _ = p.a.CreateCQ(32)
	h.mr, _ = pd.RegMR(h.buf, verbs.AccessLocalWrite|verbs.AccessRemoteRead|verbs.AccessRemoteWrite)
	var err error
	if h.qp, err = pd.CreateQP(verbs.QPInitAttr{SendCQ: h.cq, RecvCQ: h.cq}); err != nil {
		t.Fatal(err)
	}
	for {
		h.k, err = p.cma.Dial(ctx, p.cmb.Local(), cm.PortSpaceTCP, port, h.qp, &ConnParam)
		if !errors.Is(err, cm.ErrNoListener) || ctx.Err() != nil {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func (h *hostile) send(t *testing.T, msg []byte) {
	t.Helper()
	copy(h.buf, msg)
	if err := h.qp.PostSend(&verbs.SendWR{Opcode: verbs.WRSend, Flags: verbs.SendSignaled,
		SGL: []verbs.SGE{{Addr: h.mr.Addr(), Length: uint32(len(msg)), LKey: h.mr.LKey()}}}); err != nil {
		t.Fatal(err)
	}
}

func info(addr uint64, rkey, size uint32) []byte {
	b := make([]byte, InfoLen)
	binary.BigEndian.PutUint64(b, addr)
	binary.BigEndian.PutUint32(b[8:], rkey)
	binary.BigEndian.PutUint32(b[12:], size)
	return b
}

// TestHostileClient: a client advertising a bad rkey, a size larger than
// the server's buffer, or a message of the wrong length makes the server
// report it and fail (exit 255), never crash; a persistent server goes on
// serving the next, well-behaved client.
func TestHostileClient(t *testing.T) {
	for _, tc := range []struct {
		name string
		msg  func(h *hostile) []byte
		want []string
	}{
		{"bad-rkey", func(h *hostile) []byte { return info(h.mr.Addr(), h.mr.RKey()^0x5a5a5a00, 64) },
			[]string{fmt.Sprintf("cq completion failed status %d", cq.RemAccessErr), "wait for RDMA_READ_COMPLETE state 11", "rping server failed: -1"}},
		{"bad-address", func(h *hostile) []byte { return info(0xdead0000, h.mr.RKey(), 64) },
			[]string{fmt.Sprintf("cq completion failed status %d", cq.RemAccessErr)}},
		{"huge-size", func(h *hostile) []byte { return info(h.mr.Addr(), h.mr.RKey(), 0xffffffff) },
			[]string{fmt.Sprintf("cq completion failed status %d", cq.LocProtErr), "the client's buffer is 4294967295 bytes, more than this server's 64",
				"wait for RDMA_READ_COMPLETE state 11", "rping server failed: -1"}},
		{"short-message", func(h *hostile) []byte { return make([]byte, 8) },
			[]string{"Received bogus data, size 8", "wait for RDMA_READ_ADV state 11"}},
		{"long-message", func(h *hostile) []byte { return make([]byte, 100) },
			[]string{fmt.Sprintf("cq completion failed status %d", cq.LocLenErr)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := ctxT(t)
			p := newPair(t)
			srv := start(ctx, p.b, p.cmb, Config{Server: true, Port: DefaultPort, Size: 64, Verbose: true})
			h := dialHostile(t, ctx, p, DefaultPort)
			h.send(t, tc.msg(h))
			srv.wait(t, ctx)
			if ExitCode(srv.err) != ExitFailed {
				t.Fatalf("server: %v, want a failure; stderr %q", srv.err, srv.errOut)
			}
			for _, w := range tc.want {
				if !strings.Contains(srv.errOut.String(), w) {
					t.Fatalf("server stderr lacks %q:\n%s", w, srv.errOut)
				}
			}
			// The server disconnected the hostile client.
			select {
			case <-h.k.Done():
			case <-ctx.Done():
				t.Fatal("the server never disconnected")
			}
		})
	}
	t.Run("persistent", func(t *testing.T) {
		ctx, cancel := context.WithCancel(ctxT(t))
		p := newPair(t)
		srv := start(ctx, p.b, p.cmb, Config{Server: true, Persistent: true, Port: DefaultPort, Size: 64})
		h := dialHostile(t, ctx, p, DefaultPort)
		h.send(t, info(h.mr.Addr(), 0x12345678, 64))
		select {
		case <-h.k.Done():
		case <-ctx.Done():
			t.Fatal("the server never disconnected")
		}
		for range 2 {
			var out, errOut buffer
			if err := Run(ctx, p.a, p.cma, Config{Addr: p.cmb.Local(), Port: DefaultPort, Size: 64, Count: 3, Verbose: true, Validate: true}, &out, &errOut); err != nil {
				t.Fatalf("client after the hostile one: %v: %s", err, &errOut)
			}
			if n := strings.Count(out.String(), "ping data: rdma-ping-"); n != 3 {
				t.Fatalf("%d pings:\n%s", n, &out)
			}
		}
		cancel()
		srv.wait(t, ctxT(t))
		if srv.err != nil || !strings.Contains(srv.errOut.String(), fmt.Sprintf("cq completion failed status %d", cq.RemAccessErr)) {
			t.Fatalf("server: %v\n%s", srv.err, srv.errOut)
		}
	})
}

// TestDebugAndSelfQP: -d prints rping's debug lines (the advertised
// buffers, each completion), and a -q server accepts with rping's own
// connection parameters; the pings go through as usual.
func TestDebugAndSelfQP(t *testing.T) {
	ctx := ctxT(t)
	p := newPair(t)
	srv := start(ctx, p.b, p.cmb, Config{Server: true, Port: DefaultPort, Size: 64, SelfQP: true, Debug: true})
	var cli *result
	for {
		cli = start(ctx, p.a, p.cma, Config{Addr: p.cmb.Local(), Port: DefaultPort, Size: 64, Count: 2, Debug: true, Verbose: true})
		cli.wait(t, ctx)
		if cli.err == nil || !strings.Contains(cli.errOut.String(), "error 8") {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	srv.wait(t, ctx)
	if cli.err != nil || srv.err != nil {
		t.Fatalf("client %v: %s\nserver %v: %s", cli.err, cli.errOut, srv.err, srv.errOut)
	}
	for _, w := range []string{"rdma_connect successful", "RDMA addr ", "recv completion", "send completion", Line(1, 64)} {
		if !strings.Contains(cli.out.String(), w) {
			t.Errorf("client stdout lacks %q:\n%s", w, cli.out)
		}
	}
	for _, w := range []string{"accepting client connection request", "Received rkey ", "server posted rdma read req", "rdma read completion",
		"rdma write completion", "server posted go ahead"} {
		if !strings.Contains(srv.out.String(), w) {
			t.Errorf("server stdout lacks %q:\n%s", w, srv.out)
		}
	}
	if strings.Contains(srv.out.String(), "server ping data") {
		t.Error("the server printed ping data without -v")
	}
}

// TestClientInterrupted: a client pinging forever (-C 0) stops when its
// context ends, disconnects, and reports the run as failed (rping dies of
// the signal).
func TestClientInterrupted(t *testing.T) {
	ctx := ctxT(t)
	p := newPair(t)
	srv := start(ctx, p.b, p.cmb, Config{Server: true, Port: DefaultPort, Size: 64})
	cctx, cancel := context.WithCancel(ctx)
	var cli *result
	for {
		cli = start(cctx, p.a, p.cma, Config{Addr: p.cmb.Local(), Port: DefaultPort, Size: 64, Verbose: true})
		// Wait for pings, or for the end of a run that met a server not
		// listening yet.
		pinged := func() bool { return strings.Contains(cli.out.String(), "rdma-ping-20:") }
		for !pinged() && !cli.ended() {
			time.Sleep(time.Millisecond)
		}
		if pinged() {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	cli.wait(t, ctx)
	srv.wait(t, ctx)
	if ExitCode(cli.err) != ExitFailed || !strings.Contains(cli.errOut.String(), "client interrupted") {
		t.Fatalf("client: %v: %s", cli.err, cli.errOut)
	}
	// The server saw the disconnect: a normal end for it.
	if srv.err != nil || !strings.Contains(srv.errOut.String(), "server DISCONNECT EVENT...") {
		t.Fatalf("server: %v: %s", srv.err, srv.errOut)
	}
}
