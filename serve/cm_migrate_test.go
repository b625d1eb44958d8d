package serve

import (
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/internal/netnstest"
)

// buildCM builds testdata/src against the system's rdma_cma.h, linked with
// softroce's two libraries.
func buildCM(t *testing.T, src string) (bin, lib string) {
	t.Helper()
	_, lib = tool(t, "ibv_devinfo")
	if _, err := os.Stat(filepath.Join(lib, "librdmacm.so.1")); err != nil {
		t.Skip("librdmacm.so.1 was not built (Debian: apt-get install librdmacm-dev)")
	}
	bin = filepath.Join(t.TempDir(), "prog")
	if out, err := exec.Command("gcc", "-O1", "-o", bin, filepath.Join("testdata", src), "-L"+lib,
		"-l:librdmacm.so.1", "-l:libibverbs.so.1").CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	return bin, lib
}

// runCM runs testdata/src on a daemon with the CM on 127.0.0.1: it must
// print "ok".
func runCM(t *testing.T, src string, args ...string) {
	bin, lib := buildCM(t, src)
	s := startCM(t)
	cmd := exec.Command(bin, args...)
	cmd.Env = env(s, lib)
	out, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("%v\n%s", err, out)
	}
}

// rdma_migrate_id: a CONNECT_REQUEST's id moved before the event is acked
// has its ESTABLISHED and DISCONNECTED on the new channel and nothing on
// the listener's; events queued but not taken move along (the old fd
// stops polling readable); NULL makes the id synchronous; a listener
// takes its queued requests along (testdata/cm_migrate.c).
func TestCProgramCMMigrate(t *testing.T) { runCM(t, "cm_migrate.c", "127.0.0.1", "7481") }

// rdma_create_qp on an id that has a QP fails with EINVAL and keeps the
// first, which connects and carries a SEND (testdata/cm_qp_twice.c).
func TestCProgramCMQPTwice(t *testing.T) { runCM(t, "cm_qp_twice.c", "127.0.0.1", "7482") }

// Loopback addresses on a daemon whose device is on a veth address, as
// the kernel's rdma_cm treats them (testdata/cm_loopback.c).
func TestCMLoopback(t *testing.T) {
	netnstest.Require(t)
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("ip (iproute2) is not installed")
	}
	bin, lib := buildCM(t, "cm_loopback.c")
	v := netnstest.Pair(t, netnstest.VethConfig{})
	s := startInNS(t, v.A)
	p := nsTool(t, v.A.NS, s, lib, bin, v.A.Addr().String(), "7483")
	if out := waitTool(t, p, "cm_loopback"); strings.TrimSpace(out) != "ok" {
		t.Fatalf("%s", out)
	}
}

// cmConn is a raw connection for the CM tests below.
func cmConn(t *testing.T, s *Server) *childConn {
	t.Helper()
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: s.Socket(), Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &childConn{c}
}

// cmChannel makes c an event channel and returns its token and event fd.
func cmChannel(t *testing.T, c *childConn) (uint64, int) {
	t.Helper()
	e, b, fds, err := c.call(opCMOpen, make([]byte, sizeCMReq))
	if err != nil || e != 0 || len(fds) != 1 || len(b) != sizeCMResp {
		t.Fatalf("CM_OPEN: %v %v, %d fds, %d bytes", e, err, len(fds), len(b))
	}
	t.Cleanup(func() { unix.Close(fds[0]) })
	return le.Uint64(b[sizeCMResp-8:]), fds[0]
}

func cmResolved(t *testing.T, c *childConn) uint32 {
	t.Helper()
	b := make([]byte, sizeCMReq)
	le.PutUint32(b[4:], psTCP)
	id, _, err := c.handle(opCMCreateID, b)
	if err != nil {
		t.Fatal(err)
	}
	b = make([]byte, sizeCMReq)
	le.PutUint32(b, id)
	putSockaddr(b[40+sizeSockaddr:], netip.MustParseAddrPort("127.0.0.1:7471"))
	if _, _, err := c.handle(opCMResolveAddr, b); err != nil {
		t.Fatal(err)
	}
	return id
}

func cmAttach(t *testing.T, c *childConn, id, qpn uint32, token uint64) syscall.Errno {
	t.Helper()
	b := make([]byte, sizeCMReq)
	le.PutUint32(b, id)
	le.PutUint32(b[12:], qpn)
	le.PutUint64(b[40+2*sizeSockaddr+cmPrivate:], token)
	e, _, fds, err := c.call(opCMAttachQP, b)
	closeAll(fds)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// An id keeps its QP: ATTACH_QP of a second QP (the process's own, with
// its token) is refused with EINVAL and leaves that QP in RESET; after
// DETACH_QP (rdma_destroy_qp) the id takes another.
func TestCMAttachQPRefusesSecond(t *testing.T) {
	s := startUDP(t)
	va, vb := cmConn(t, s), cmConn(t, s)
	_, qa, ta, err := va.rcQP()
	if err != nil {
		t.Fatal(err)
	}
	hb, qb, tb, err := vb.rcQP()
	if err != nil {
		t.Fatal(err)
	}
	c := cmConn(t, s)
	cmChannel(t, c)
	id := cmResolved(t, c)
	if e := cmAttach(t, c, id, qa, ta); e != 0 {
		t.Fatalf("first ATTACH_QP: %v", e)
	}
	if e := cmAttach(t, c, id, qb, tb); e != syscall.EINVAL {
		t.Errorf("second ATTACH_QP: %v, want EINVAL", e)
	}
	if e := cmAttach(t, c, id, qa, ta); e != syscall.EINVAL {
		t.Errorf("ATTACH_QP of the id's own QP again: %v, want EINVAL", e)
	}
	if _, b, err := vb.handle(opQueryQP, u32s(hb, 0)); err != nil || le.Uint32(b) != 0 {
		t.Errorf("the refused QP: state %d (%v), want RESET (0)", le.Uint32(b), err)
	}
	b := make([]byte, sizeCMReq)
	le.PutUint32(b, id)
	if e, _, _, err := c.call(opCMDetachQP, b); err != nil || e != 0 {
		t.Fatalf("DETACH_QP: %v %v", e, err)
	}
	if e := cmAttach(t, c, id, qb, tb); e != 0 {
		t.Errorf("ATTACH_QP after DETACH_QP: %v", e)
	}
}

// MIGRATE_ID takes only a token of an open channel: a wrong one is
// refused and the id stays; a right one moves the id to a new handle
// there, and its old handle is gone.
func TestCMMigrateToken(t *testing.T) {
	s := startUDP(t)
	a, b := cmConn(t, s), cmConn(t, s)
	cmChannel(t, a)
	tok, fdB := cmChannel(t, b)
	id := cmResolved(t, a) // ADDR_RESOLVED queued on a
	req := func(id uint32, token uint64) []byte {
		q := make([]byte, sizeCMReq)
		le.PutUint32(q, id)
		le.PutUint64(q[40+2*sizeSockaddr+cmPrivate:], token)
		return q
	}
	if e, _, _, _ := a.call(opCMMigrateID, req(id, tok^1)); e != syscall.EINVAL {
		t.Errorf("MIGRATE_ID with a wrong token: %v, want EINVAL", e)
	}
	e, body, _, err := a.call(opCMMigrateID, req(id, tok))
	if err != nil || e != 0 || len(body) != sizeCMResp {
		t.Fatalf("MIGRATE_ID: %v %v", e, err)
	}
	nid := le.Uint32(body)
	if e, _, _, _ := a.call(opCMQuery, req(id, 0)); e != syscall.EINVAL {
		t.Errorf("the old handle after MIGRATE_ID: %v, want EINVAL", e)
	}
	if e, _, _, _ := a.call(opCMGetEvent, req(0, 0)); e != syscall.EAGAIN {
		t.Errorf("the old channel still has an event: %v", e)
	}
	if n, _ := unix.Poll([]unix.PollFd{{Fd: int32(fdB), Events: unix.POLLIN}}, 5000); n != 1 {
		t.Fatal("the new channel's fd is not readable")
	}
	e, ev, _, _ := b.call(opCMGetEvent, req(0, 0))
	if e != 0 || le.Uint32(ev) != nid || le.Uint32(ev[4:]) != cmEvAddrResolved {
		t.Errorf("the moved event: %v, id %d type %d; want id %d ADDR_RESOLVED", e, le.Uint32(ev), le.Uint32(ev[4:]), nid)
	}
}

// rdma_getaddrinfo from the hints' addresses alone, as librdmacm's
// (testdata/cm_getaddrinfo.c).
func TestCProgramCMGetaddrinfo(t *testing.T) { runCM(t, "cm_getaddrinfo.c") }

// RDMA_MAX_RESP_RES and RDMA_MAX_INIT_DEPTH (0xFF) stand for the device's
// limits on connect and for the request's depths up to them on accept,
// as librdmacm makes them; the REQ and REP never carry 0xFF, which kernel
// rxe would put into its QP and refuse (testdata/cm_maxdepth.c).
func TestCProgramCMMaxDepth(t *testing.T) { runCM(t, "cm_maxdepth.c", "127.0.0.1", "7486") }
