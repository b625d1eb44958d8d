package serve

import (
	"net/netip"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/netnstest"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/nic/impair"
	"github.com/softroce/softroce/nic/udp"
	"github.com/softroce/softroce/verbs"
)

// sockaddrAt reads the struct sr_sockaddr at b: the address, with its
// scope id as zone (decodeSockaddr).
func sockaddrAt(t *testing.T, b []byte) netip.AddrPort {
	t.Helper()
	a, _, err := decodeSockaddr(b)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// BIND and RESOLVE_ADDR of a device's IPv6 link-local address (GID 0 on
// a daemon serving an interface's link-local and IPv4 addresses), as the
// kernel's rdma_cm takes them: with the scope id of the device's
// interface the id is bound to the device, its source the link-local
// address (so its source GID is GID 0) with that scope id; without a
// scope id EINVAL; with another interface's scope id, or an address the
// device does not have, ENODEV; an address of no interface stays
// EADDRNOTAVAIL.
func TestCMBindLinkLocal(t *testing.T) {
	netnstest.Require(t)
	v := netnstest.Pair(t, netnstest.VethConfig{NoDAD: true})
	sa, sb := startLinkLocalInNS(t, v.A), startLinkLocalInNS(t, v.B)
	llA, llB := sa.devs[0].v.GIDTable()[0].Addr, sb.devs[0].v.GIDTable()[0].Addr
	if !llA.IsLinkLocalUnicast() || !llB.IsLinkLocalUnicast() {
		t.Fatalf("GID 0 is %v and %v, want link-local addresses", llA, llB)
	}
	scope := uint32(v.A.Index)
	r := dial(t, sa)
	if e, _, _ := r.call(opCMOpen, cmReqBody(0, nil)); e != 0 {
		t.Fatalf("CM_OPEN: %v", e)
	}
	newID := func() uint32 {
		t.Helper()
		e, body, _ := r.call(opCMCreateID, cmReqBody(0, func(b []byte) { le.PutUint32(b[4:], psTCP) }))
		if e != 0 {
			t.Fatalf("CREATE_ID: %v", e)
		}
		return le.Uint32(body)
	}
	// at is a sockaddr body modifier: a at offset off with scope id.
	at := func(off int, a netip.Addr, port uint16, scope uint32) func([]byte) {
		return func(b []byte) {
			putSockaddr(b[off:], netip.AddrPortFrom(a, port))
			le.PutUint32(b[off+4:], scope)
		}
	}
	id := newID()
	for _, c := range []struct {
		what  string
		a     netip.Addr
		scope uint32
		want  syscall.Errno
	}{
		{"link-local without a scope id", llA, 0, syscall.EINVAL},
		{"link-local with the scope id of no interface", llA, scope + 100, syscall.ENODEV},
		{"link-local with the loopback interface's scope id", llA, 1, syscall.ENODEV},
		{"the peer's link-local address", llB, scope, syscall.ENODEV},
		{"another link-local address", netip.MustParseAddr("fe80::dead"), scope, syscall.ENODEV},
		{"an address of no interface", netip.MustParseAddr("2001:db8::9"), scope, syscall.EADDRNOTAVAIL},
	} {
		if e, _, _ := r.call(opCMBind, cmReqBody(id, at(40, c.a, 7480, c.scope))); e != c.want {
			t.Errorf("BIND to %s (%v, scope %d): %v, want %v", c.what, c.a, c.scope, e, c.want)
		}
	}
	e, body, _ := r.call(opCMBind, cmReqBody(id, at(40, llA, 7480, scope)))
	if e != 0 {
		t.Fatalf("BIND to %v%%%d: %v", llA, scope, e)
	}
	if dev, src := le.Uint32(body[4:]), sockaddrAt(t, body[8:]); dev != 0 || src.Addr().WithZone("") != llA ||
		le.Uint32(body[8+4:]) != scope || src.Port() != 7480 {
		t.Errorf("BIND answered device %d, source %v (scope %d), want device 0, %v%%%d port 7480", dev, src, le.Uint32(body[8+4:]), llA, scope)
	}
	if e, _, _ := r.call(opCMListen, cmReqBody(id, nil)); e != 0 {
		t.Errorf("LISTEN on %v%%%d: %v", llA, scope, e)
	}

	// RESOLVE_ADDR to the peer's link-local address: the scope id of the
	// destination picks the device, whose link-local address becomes the
	// source, with the scope id.
	rid := newID()
	if e, _, _ := r.call(opCMResolveAddr, cmReqBody(rid, at(64, llB, 7481, scope))); e != 0 {
		t.Fatalf("RESOLVE_ADDR to %v%%%d: %v", llB, scope, e)
	}
	ev := waitCMEvent(t, r)
	if typ := le.Uint32(ev[4:]); typ != cmEvAddrResolved {
		t.Fatalf("RESOLVE_ADDR: event %d status %d, want ADDR_RESOLVED", typ, int32(le.Uint32(ev[8:])))
	}
	src, dst := sockaddrAt(t, ev[32:]), sockaddrAt(t, ev[32+sizeSockaddr:])
	if want := netip.AddrPortFrom(llA.WithZone(strconv.Itoa(int(scope))), src.Port()); src != want || src.Port() == 0 {
		t.Errorf("ADDR_RESOLVED source %v, want %v", src, want)
	}
	if want := netip.AddrPortFrom(llB.WithZone(strconv.Itoa(int(scope))), 7481); dst != want {
		t.Errorf("ADDR_RESOLVED destination %v, want %v", dst, want)
	}
	// A link-local source and an IPv4 destination: EINVAL.
	fid := newID()
	if e, _, _ := r.call(opCMResolveAddr, cmReqBody(fid, func(b []byte) {
		at(40, llA, 0, scope)(b)
		putSockaddr(b[64:], netip.AddrPortFrom(v.B.Addr(), 7481))
	})); e != syscall.EINVAL {
		t.Errorf("RESOLVE_ADDR from %v%%%d to %v: %v, want EINVAL", llA, scope, v.B.Addr(), e)
	}
	// An IPv4 source and a link-local destination: EINVAL.
	gid := newID()
	if e, _, _ := r.call(opCMResolveAddr, cmReqBody(gid, func(b []byte) {
		putSockaddr(b[40:], netip.AddrPortFrom(v.A.Addr(), 0))
		at(64, llB, 7481, scope)(b)
	})); e != syscall.EINVAL {
		t.Errorf("RESOLVE_ADDR from %v to %v%%%d: %v, want EINVAL", v.A.Addr(), llB, scope, e)
	}
	// A link-local destination whose scope id names no device's
	// interface: ADDR_ERROR, ENODEV.
	nid := newID()
	if e, _, _ := r.call(opCMResolveAddr, cmReqBody(nid, at(64, llB, 7481, 1))); e != 0 {
		t.Fatalf("RESOLVE_ADDR to %v%%1: %v", llB, e)
	}
	if ev := waitCMEvent(t, r); le.Uint32(ev[4:]) != cmEvAddrError || int32(le.Uint32(ev[8:])) != -int32(syscall.ENODEV) {
		t.Errorf("RESOLVE_ADDR to %v%%1: event %d status %d, want ADDR_ERROR -ENODEV", llB, le.Uint32(ev[4:]), int32(le.Uint32(ev[8:])))
	}
}

// waitCMEvent takes the channel's next event (GET_EVENT until one is
// queued).
func waitCMEvent(t *testing.T, r *rawClient) []byte {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		e, ev, _ := r.call(opCMGetEvent, cmReqBody(0, nil))
		switch {
		case e == 0 && len(ev) == sizeCMEvent:
			return ev
		case e != syscall.EAGAIN || time.Now().After(deadline):
			t.Fatalf("GET_EVENT: %v, %d bytes", e, len(ev))
		}
	}
}

// librdmacm's view of the same (testdata/cm_linklocal.c): the scope ids a
// program gets back from rdma_get_local_addr and rdma_get_peer_addr, and
// the ids' source GID (GID 0), on both ends of a request to the device's
// own link-local address.
func TestCProgramCMLinkLocal(t *testing.T) {
	netnstest.Require(t)
	bin, lib := buildCM(t, "cm_linklocal.c")
	v := netnstest.Pair(t, netnstest.VethConfig{NoDAD: true})
	s := startLinkLocalInNS(t, v.A)
	ll := s.devs[0].v.GIDTable()[0].Addr
	p := nsTool(t, v.A.NS, s, lib, bin, ll.String(), v.A.Name, "7487")
	if out := waitTool(t, p, "cm_linklocal"); strings.TrimSpace(out) != "ok" {
		t.Fatalf("%s", out)
	}
}

// A struct sr_sockaddr's scope id travels with an IPv6 link-local address
// both ways; other addresses have none.
func TestSockaddrScope(t *testing.T) {
	for _, c := range []struct {
		scope uint32
		in    string
		want  string
	}{
		{7, "[fe80::1]:7471", "[fe80::1%7]:7471"},
		{0, "[fe80::1]:7471", "[fe80::1]:7471"},
		{7, "[2001:db8::1]:7471", "[2001:db8::1]:7471"},
		{7, "10.0.0.1:7471", "10.0.0.1:7471"},
	} {
		b := appendSockaddr(nil, netip.MustParseAddrPort(c.in))
		le.PutUint32(b[4:], c.scope)
		got, ok, err := decodeSockaddr(b)
		if err != nil || !ok || got.String() != c.want {
			t.Errorf("%s with scope id %d: %v %v %v, want %s", c.in, c.scope, got, ok, err, c.want)
			continue
		}
		if back := appendSockaddr(nil, got); le.Uint32(back[4:]) != scopeOf(got.Addr()) || (got.Addr().Zone() != "" && le.Uint32(back[4:]) != c.scope) {
			t.Errorf("%v encoded with scope id %d", got, le.Uint32(back[4:]))
		}
	}
}

// A device finds its link-local GID's interface through a wrapper of its
// link (softroce serve --impair) too.
func TestLinkLocalScopeImpaired(t *testing.T) {
	netnstest.Require(t)
	v := netnstest.Pair(t, netnstest.VethConfig{NoDAD: true})
	var l *udp.Multi
	v.A.NS.Run(t, func() error {
		ll, err := udp.LinkLocalOf(v.A.Addr(), 5*time.Second)
		if err != nil {
			return err
		}
		l, err = udp.OpenMulti(udp.Config{Port: 4791}, ll, v.A.Addr())
		return err
	})
	var link nic.Link = impair.Wrap(l, impair.Config{})
	d, err := verbs.Open(link, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if ll := linkLocalOf(d); ll.index != 0 || ll.scope != uint32(v.A.Index) || ll.addr != l.Addrs()[0] {
		t.Errorf("link-local GID %d %v on interface %d, want 0 %v on %d", ll.index, ll.addr, ll.scope, l.Addrs()[0], v.A.Index)
	}
}
