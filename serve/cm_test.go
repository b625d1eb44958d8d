package serve

import (
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/cm"
	"github.com/softroce/softroce/nic/udp"
	"github.com/softroce/softroce/verbs"
)

// startCM runs a daemon on 127.0.0.1 port 4791: the CM reaches its peers'
// QP1 on the RoCE port, so rdma_cm programs on one daemon need that port.
func startCM(t *testing.T) *Server {
	t.Helper()
	// Another test package run in parallel may hold the port for a
	// while: wait for it rather than skip (CI must run these).
	var l *udp.Link
	var err error
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(200 * time.Millisecond) {
		if l, err = udp.Open(udp.Config{Addr: netip.MustParseAddr("127.0.0.1"), Port: 4791}); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatalf("UDP 4791 on 127.0.0.1 stayed taken for 2 minutes: %v", err)
	}
	d, err := verbs.Open(l, nil)
	if err != nil {
		t.Fatal(err)
	}
	return start(t, d, 0)
}

func cmTool(t *testing.T, name string) (string, string) {
	t.Helper()
	p, lib := tool(t, name)
	if _, err := exec.Command("test", "-e", lib+"/librdmacm.so.1").CombinedOutput(); err != nil {
		t.Skip("librdmacm.so.1 was not built (Debian: apt-get install librdmacm-dev)")
	}
	return p, lib
}

// tool is one program with its output; out is complete once done fired
// (exec copies it before Wait returns).
type toolProc struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  strings.Builder
	done chan error
}

func (p *toolProc) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.Write(b)
}

func startTool(t *testing.T, s *Server, lib, path string, args ...string) *toolProc {
	t.Helper()
	p := &toolProc{cmd: exec.Command(path, args...), done: make(chan error, 1)}
	p.cmd.Env = env(s, lib)
	p.cmd.Stdout, p.cmd.Stderr = p, p
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() { p.cmd.Process.Kill() })
	return p
}

func waitTool(t *testing.T, pp *toolProc, what string) string {
	t.Helper()
	select {
	case err := <-pp.done:
		pp.mu.Lock()
		defer pp.mu.Unlock()
		if err != nil {
			t.Errorf("%s: %v\n%s", what, err, pp.out.String())
		}
		return pp.out.String()
	case <-time.After(2 * time.Minute):
		pp.mu.Lock()
		defer pp.mu.Unlock()
		t.Fatalf("%s did not finish:\n%s", what, pp.out.String())
	}
	return ""
}

// ucmatose, the distribution's binary, as server and client on one
// daemon: RC connections by rdma_cm, SENDs both ways, the server
// disconnects.
func TestUcmatose(t *testing.T) {
	p, lib := cmTool(t, "ucmatose")
	s := startCM(t)
	srv := startTool(t, s, lib, p, "-b", "127.0.0.1", "-p", "7471", "-c", "2", "-C", "20")
	time.Sleep(300 * time.Millisecond) // the server listens
	cli := startTool(t, s, lib, p, "-s", "127.0.0.1", "-p", "7471", "-c", "2", "-C", "20")
	co := waitTool(t, cli, "ucmatose client")
	so := waitTool(t, srv, "ucmatose server")
	for _, o := range []string{co, so} {
		if !strings.Contains(o, "data transfers complete") || !strings.Contains(o, "return status 0") {
			t.Errorf("ucmatose did not complete:\n%s", o)
		}
	}
	if !strings.Contains(so, "disconnected") {
		t.Errorf("server saw no DISCONNECTED:\n%s", so)
	}
}

// A connection to a port nobody listens on ends in REJECTED with the
// REJ reason (8, invalid service ID) as the status, as on the kernel.
func TestUcmatoseRejected(t *testing.T) {
	p, lib := cmTool(t, "ucmatose")
	s := startCM(t)
	cli := startTool(t, s, lib, p, "-s", "127.0.0.1", "-p", "7472")
	<-cli.done
	cli.mu.Lock()
	defer cli.mu.Unlock()
	if o := cli.out.String(); !strings.Contains(o, "RDMA_CM_EVENT_REJECTED, error: 8") {
		t.Errorf("want RDMA_CM_EVENT_REJECTED, error: 8:\n%s", o)
	}
}

// waitListening waits until a program listens on port of RDMA_PS_TCP on
// the daemon's first device.
func waitListening(t *testing.T, s *Server, port uint16) {
	t.Helper()
	c, err := s.devs[0].cmOpen()
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		l, err := c.Listen(cm.PortSpaceTCP, port)
		if err != nil {
			return
		}
		l.Close()
		if i == 600 {
			t.Fatalf("nobody listens on port %d", port)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func cmReqBody(id uint32, mod func(b []byte)) []byte {
	b := make([]byte, sizeCMReq)
	le.PutUint32(b, id)
	if mod != nil {
		mod(b)
	}
	return b
}

func putSockaddr(b []byte, a netip.AddrPort) { copy(b, appendSockaddr(nil, a)) }

// Every CM request is validated: ops before CM_OPEN, unknown ids, bad
// lengths, port spaces, addresses and private data lengths, QPs that are
// not the caller's, and a channel's ids go with its connection.
func TestCMHostile(t *testing.T) {
	s := startCM(t)
	r := dial(t, s)
	if e, _, _ := r.call(opCMCreateID, cmReqBody(0, nil)); e != syscall.EBADF {
		t.Errorf("CREATE_ID before CM_OPEN: %v, want EBADF", e)
	}
	if e, _, _ := r.call(opCMOpen, make([]byte, 3)); e != syscall.EINVAL {
		t.Errorf("CM_OPEN of 3 bytes: %v, want EINVAL", e)
	}
	if e, _, _ := r.call(opCMLast, cmReqBody(0, nil)); e != syscall.EINVAL {
		t.Errorf("unknown CM op: %v, want EINVAL", e)
	}
	e, _, fds := r.call(opCMOpen, cmReqBody(0, nil))
	if e != 0 || len(fds) != 1 {
		t.Fatalf("CM_OPEN: %v, %d fds", e, len(fds))
	}
	evfd := fds[0]
	defer unix.Close(evfd)
	if e, _, _ := r.call(opCMOpen, cmReqBody(0, nil)); e != syscall.EBUSY {
		t.Errorf("second CM_OPEN: %v, want EBUSY", e)
	}
	if e, _, _ := r.call(opOpen, u32s(0, 0)); e == 0 {
		t.Errorf("OPEN on a channel succeeded")
	}
	if e, _, _ := r.call(opCMCreateID, cmReqBody(0, func(b []byte) { le.PutUint32(b[4:], 0x9999) })); e != syscall.EPROTONOSUPPORT {
		t.Errorf("port space 0x9999: %v", e)
	}
	for _, op := range []uint32{opCMDestroyID, opCMBind, opCMListen, opCMConnect, opCMAccept, opCMReject, opCMDisconnect, opCMAttachQP, opCMQuery} {
		if e, _, _ := r.call(op, cmReqBody(77, nil)); e != syscall.EINVAL {
			t.Errorf("op %d on an unknown id: %v, want EINVAL", op, e)
		}
	}
	if e, _, _ := r.call(opCMGetEvent, cmReqBody(0, nil)); e != syscall.EAGAIN {
		t.Errorf("GET_EVENT with none queued: %v, want EAGAIN", e)
	}
	e, body, _ := r.call(opCMCreateID, cmReqBody(0, func(b []byte) { le.PutUint32(b[4:], psTCP) }))
	if e != 0 {
		t.Fatalf("CREATE_ID: %v", e)
	}
	id := le.Uint32(body)
	if e, _, _ := r.call(opCMConnect, cmReqBody(id, nil)); e != syscall.EINVAL {
		t.Errorf("CONNECT before resolving: %v, want EINVAL", e)
	}
	if e, _, _ := r.call(opCMAccept, cmReqBody(id, nil)); e != syscall.EINVAL {
		t.Errorf("ACCEPT without a request: %v, want EINVAL", e)
	}
	if e, _, _ := r.call(opCMBind, cmReqBody(id, func(b []byte) { putSockaddr(b[40:], netip.MustParseAddrPort("10.9.9.9:1")) })); e != syscall.EADDRNOTAVAIL {
		t.Errorf("BIND to no device's address: %v, want EADDRNOTAVAIL", e)
	}
	if e, _, _ := r.call(opCMBind, cmReqBody(id, func(b []byte) { le.PutUint16(b[40:], 77) })); e != syscall.EAFNOSUPPORT {
		t.Errorf("BIND of family 77: %v, want EAFNOSUPPORT", e)
	}
	if e, _, _ := r.call(opCMReject, cmReqBody(id, func(b []byte) { le.PutUint32(b[32:], 257) })); e != syscall.EINVAL {
		t.Errorf("257 bytes of private data: %v, want EINVAL", e)
	}
	// Resolving makes the channel's fd readable and queues ADDR_RESOLVED.
	if e, _, _ := r.call(opCMResolveAddr, cmReqBody(id, func(b []byte) { putSockaddr(b[64:], netip.MustParseAddrPort("127.0.0.1:7471")) })); e != 0 {
		t.Fatalf("RESOLVE_ADDR: %v", e)
	}
	pfd := []unix.PollFd{{Fd: int32(evfd), Events: unix.POLLIN}}
	if n, _ := unix.Poll(pfd, 5000); n != 1 {
		t.Fatalf("event fd not readable after RESOLVE_ADDR")
	}
	e, ev, _ := r.call(opCMGetEvent, cmReqBody(0, nil))
	if e != 0 || len(ev) != sizeCMEvent || le.Uint32(ev) != id || le.Uint32(ev[4:]) != cmEvAddrResolved {
		t.Fatalf("GET_EVENT: %v, %d bytes, id %d type %d", e, len(ev), le.Uint32(ev), le.Uint32(ev[4:]))
	}
	// A QP number that is no QP of this process on the device.
	if e, _, _ := r.call(opCMAttachQP, cmReqBody(id, func(b []byte) { le.PutUint32(b[12:], 0x123456) })); e != syscall.EINVAL {
		t.Errorf("ATTACH_QP of no QP: %v, want EINVAL", e)
	}
	// A listener's port is freed with the connection that held it.
	e, body, _ = r.call(opCMCreateID, cmReqBody(0, func(b []byte) { le.PutUint32(b[4:], psTCP) }))
	lid := le.Uint32(body)
	bind := func(r *rawClient, id uint32) syscall.Errno {
		e, _, _ := r.call(opCMBind, cmReqBody(id, func(b []byte) { putSockaddr(b[40:], netip.MustParseAddrPort("0.0.0.0:7473")) }))
		return e
	}
	if e := bind(r, lid); e != 0 {
		t.Fatalf("BIND: %v", e)
	}
	if e, _, _ := r.call(opCMListen, cmReqBody(lid, nil)); e != 0 {
		t.Fatalf("LISTEN: %v", e)
	}
	r2 := dial(t, s)
	if e, _, fds := r2.call(opCMOpen, cmReqBody(0, nil)); e != 0 {
		t.Fatal(e)
	} else {
		defer unix.Close(fds[0])
	}
	_, body, _ = r2.call(opCMCreateID, cmReqBody(0, func(b []byte) { le.PutUint32(b[4:], psTCP) }))
	id2 := le.Uint32(body)
	bind(r2, id2)
	if e, _, _ := r2.call(opCMListen, cmReqBody(id2, nil)); e != syscall.EADDRINUSE {
		t.Errorf("LISTEN on a port another channel has: %v, want EADDRINUSE", e)
	}
	r.c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, body, _ = r2.call(opCMCreateID, cmReqBody(0, func(b []byte) { le.PutUint32(b[4:], psTCP) }))
		id3 := le.Uint32(body)
		bind(r2, id3)
		if e, _, _ := r2.call(opCMListen, cmReqBody(id3, nil)); e == 0 {
			break
		}
		r2.call(opCMDestroyID, cmReqBody(id3, nil))
		if time.Now().After(deadline) {
			t.Fatal("the closed channel's listener still holds its port")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := s.Stats(); n.BadRequests == 0 {
		t.Errorf("bad requests not counted: %+v", n)
	}
}

// rping, server and client on one daemon: SENDs advertising buffers, RDMA
// READ and WRITE of them (small malloc'd buffers on shared pages), and
// the disconnect.
func TestRping(t *testing.T) {
	p, lib := cmTool(t, "rping")
	s := startCM(t)
	srv := startTool(t, s, lib, p, "-s", "-a", "127.0.0.1", "-p", "7474", "-C", "10", "-v")
	time.Sleep(300 * time.Millisecond)
	cli := startTool(t, s, lib, p, "-c", "-a", "127.0.0.1", "-p", "7474", "-C", "10", "-v")
	co := waitTool(t, cli, "rping client")
	so := waitTool(t, srv, "rping server")
	if !strings.Contains(co, "ping data: rdma-ping-9") || !strings.Contains(so, "server ping data: rdma-ping-9") {
		t.Errorf("rping did not complete 10 pings:\nclient:\n%s\nserver:\n%s", co, so)
	}
}

// perftest's tools with -R: connected by rdma_cm (which must return from
// rdma_accept with the QP in RTS: the server posts at once), then their
// parameters exchanged over the QP and the test: RDMA WRITE, READ, SEND
// and atomics. perftest connects twice (its parameters, then the test
// QP), and its client can send the second REQ before the server listens
// again: that is answered REJ 8, and perftest then crashes (the
// distribution's, against rxe too). Such a run is tried again on another
// port.
func TestPerftestCM(t *testing.T) {
	for i, c := range []struct{ tool, size string }{
		{"ib_write_bw", "4096"},
		{"ib_read_bw", "4096"},
		{"ib_send_bw", "4096"},
		{"ib_atomic_bw", "8"},
	} {
		t.Run(c.tool, func(t *testing.T) { testPerftestCM(t, c.tool, c.size, 18519+10*i) })
	}
}

func testPerftestCM(t *testing.T, tool_, size string, base int) {
	p, lib := cmTool(t, tool_)
	s := startCM(t)
	for attempt := 0; ; attempt++ {
		port := fmt.Sprint(base + attempt)
		args := []string{"-R", "-F", "-n", "100", "-s", size, "-p", port}
		srv := startTool(t, s, lib, p, args...)
		waitListening(t, s, uint16(base+attempt))
		cli := startTool(t, s, lib, p, append(args, "127.0.0.1")...)
		<-cli.done
		cli.mu.Lock()
		co := cli.out.String()
		cli.mu.Unlock()
		if strings.Contains(co, "RDMA_CM_EVENT_REJECTED; error: 8") && attempt < 4 {
			t.Logf("attempt %d: the client's second REQ came before the server listened again:\n%s", attempt, co)
			srv.cmd.Process.Kill()
			<-srv.done
			continue
		}
		so := waitTool(t, srv, tool_+" -R server")
		want := fmt.Sprintf(" %-10s %d", size, 100)
		for _, o := range []string{co, so} {
			if !strings.Contains(o, want) {
				t.Errorf("%s -R printed no result line %q:\n%s", tool_, want, o)
			}
		}
		t.Logf("%s", lastLines(co, 2))
		return
	}
}

// udQPs says whether the daemon makes UD QPs (IBV_QPT_UD through
// CREATE_QP).
func udQPs(t *testing.T, s *Server) bool {
	t.Helper()
	r := dial(t, s)
	r.open()
	_, pd, _ := r.call(opAllocPD, nil)
	e, cq, fds := r.call(opCreateCQ, u32s(16, 0))
	closeAll(fds)
	if e != 0 || len(pd) < 4 || len(cq) < 4 {
		t.Fatalf("PD or CQ: %v", e)
	}
	body := u32s(le.Uint32(pd), le.Uint32(cq), le.Uint32(cq), 4, 4, 4, 1, 1, 0, 0)
	e, _, fds = r.call(opCreateQP, body)
	closeAll(fds)
	return e == 0
}

// udaddy: UD QPs whose remote QPN and Q_Key come from SIDR (rdma_connect
// of an RDMA_PS_UDP id), 10 datagrams each way.
func TestUdaddy(t *testing.T) {
	p, lib := cmTool(t, "udaddy")
	s := startCM(t)
	if !udQPs(t, s) {
		t.Skip("this daemon makes no UD QPs yet")
	}
	srv := startTool(t, s, lib, p)
	time.Sleep(300 * time.Millisecond)
	cli := startTool(t, s, lib, p, "-s", "127.0.0.1")
	co := waitTool(t, cli, "udaddy client")
	so := waitTool(t, srv, "udaddy server")
	for _, o := range []string{co, so} {
		if !strings.Contains(o, "data transfers complete") || !strings.Contains(o, "return status 0") {
			t.Errorf("udaddy did not complete:\n%s", o)
		}
	}
}
