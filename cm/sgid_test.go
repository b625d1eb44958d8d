package cm

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/softroce/softroce/bth/mad"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/nic/pipe"
	"github.com/softroce/softroce/verbs"
)

// TestDefaultSGID: a CM's own address is the device's first GID that is
// not link-local, wherever the link-local GID is.
func TestDefaultSGID(t *testing.T) {
	g := func(as ...string) []verbs.GIDEntry {
		var e []verbs.GIDEntry
		for _, a := range as {
			e = append(e, verbs.GIDEntry{Addr: netip.MustParseAddr(a)})
		}
		return e
	}
	for _, c := range []struct {
		table []verbs.GIDEntry
		want  int
	}{
		{g("10.0.0.1"), 0},
		{g("fe80::1", "10.0.0.1"), 1},
		{g("fe80::1", "2001:db8::1"), 1},
		{g("fe80::1"), 0},
		{nil, 0},
	} {
		if got := DefaultSGID(c.table); got != c.want {
			t.Errorf("DefaultSGID(%v) = %d, want %d", c.table, got, c.want)
		}
	}
}

// TestSGIDFor: a link-local peer is reached from the device's link-local
// GID, any other from the CM's own; a device without a link-local GID has
// no source for a link-local peer.
func TestSGIDFor(t *testing.T) {
	g := func(as ...string) []verbs.GIDEntry {
		var e []verbs.GIDEntry
		for _, a := range as {
			e = append(e, verbs.GIDEntry{Addr: netip.MustParseAddr(a)})
		}
		return e
	}
	for _, c := range []struct {
		table  []verbs.GIDEntry
		remote string
		want   int
		ok     bool
	}{
		{g("fe80::1", "10.0.0.1"), "10.0.0.2", 1, true},
		{g("fe80::1", "10.0.0.1"), "fe80::2", 0, true},
		{g("fe80::1", "10.0.0.1"), "fe80::2%veth0", 0, true},
		{g("10.0.0.1", "fe80::1"), "fe80::2", 1, true},
		{g("10.0.0.1"), "fe80::2", 0, false},
		{g("fe80::1", "2001:db8::1"), "2001:db8::2", 1, true},
	} {
		got, ok := SGIDFor(c.table, netip.MustParseAddr(c.remote), DefaultSGID(c.table))
		if got != c.want || ok != c.ok {
			t.Errorf("SGIDFor(%v, %s) = %d, %v, want %d, %v", c.table, c.remote, got, ok, c.want, c.ok)
		}
	}
}

// llLink is a link whose device has the kernel's GID order: an IPv6
// link-local GID first, the link's own address after it.
type llLink struct {
	nic.Link
	ll netip.Addr
}

func (l llLink) Addrs() []netip.Addr { return append([]netip.Addr{l.ll}, l.Link.Addrs()...) }

// TestDialLinkLocalREQ: a Dial to a link-local peer from a CM on the
// IPv4 GID goes from the device's link-local GID: the REQ's primary path
// and its cma_hdr carry the two link-local addresses; a Dial to an IPv4
// peer keeps the CM's own.
func TestDialLinkLocalREQ(t *testing.T) {
	la, _ := pipe.New(pipe.Config{})
	dev, err := verbs.Open(llLink{la, netip.MustParseAddr("fe80::1")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ta, _ := chanMADPair(netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"))
	c, err := New(dev, ta, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); dev.Close() })
	if c.Local() != netip.MustParseAddr("10.0.0.1") {
		t.Fatalf("the CM's own address is %v", c.Local())
	}
	pd, _ := dev.AllocPD()
	cq, _ := dev.CreateCQ(16)
	reqs := make(chan mad.REQ, 4)
	ta.setDrop(func(b []byte) bool {
		if m := mad.MAD(append([]byte(nil), b...)); m.AttrID() == mad.AttrREQ {
			select {
			case reqs <- m.REQ():
			default:
			}
		}
		return true
	})
	for _, c2 := range []struct{ remote, local string }{
		{"fe80::2", "fe80::1"},
		{"10.0.0.2", "10.0.0.1"},
	} {
		qp, err := pd.CreateQP(verbs.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		remote := netip.MustParseAddr(c2.remote)
		// The IPv4 dial names its source port; the other takes an
		// ephemeral one.
		var param *ConnParam
		if remote.Is4() {
			p := DefaultConnParam
			p.SourcePort = 40123
			param = &p
		}
		go func() { _, err := c.Dial(ctx, remote, PortSpaceTCP, 7471, qp, param); done <- err }()
		var r mad.REQ
		select {
		case r = <-reqs:
		case err := <-done:
			t.Fatalf("dial %v: %v", remote, err)
		case <-time.After(5 * time.Second):
			t.Fatalf("dial %v: no REQ sent", remote)
		}
		cancel()
		<-done
		local := netip.MustParseAddr(c2.local)
		p, h := r.Primary(), r.CMAHeader()
		if p.LocalGID().Unmap() != local || p.RemoteGID().Unmap() != remote || h.SrcAddr().Unmap() != local || h.DstAddr().Unmap() != remote {
			t.Errorf("dial %v: REQ path GIDs %v -> %v, cma_hdr %v -> %v; want %v -> %v", remote,
				p.LocalGID(), p.RemoteGID(), h.SrcAddr(), h.DstAddr(), local, remote)
		}
		if port := h.Port(); param != nil && port != 40123 || param == nil && port < 0x8000 {
			t.Errorf("dial %v: cma_hdr source port %d", remote, port)
		}
	}
}
