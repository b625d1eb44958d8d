package cases

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/softroce/softroce/conformance/agent"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/nic/udp"
)

// RemoteConfig says how to reach a softroce-agent on another host and
// where the fake peer sends from.
type RemoteConfig struct {
	// Agent is the agent's control address, HOST or HOST:PORT (port
	// agent.DefaultPort when absent).
	Agent string
	// Token is the agent's shared secret.
	Token string
	// LocalAddr is the fake peer's address on this host (the remote NIC
	// sends its answers there). Zero: the address of Iface, or the one the
	// route to the remote NIC's address leaves from.
	LocalAddr netip.Addr
	// Iface, if set, is the interface whose address the peer uses when
	// LocalAddr is zero (and which must hold LocalAddr when it is not).
	Iface string
	// Driver overrides the driver the agent reports (the key of the
	// documented deviations), for a device whose sysfs names none.
	Driver string
	// Dial opens the control connection (nil: net.Dialer).
	Dial agent.DialFunc
	// Do runs fn where the peer's socket is to live, e.g. a network
	// namespace (nil: here).
	Do func(fn func() error) error
	// Peer is how the fake peer sends: PeerUDP ("" too) or PeerRaw.
	Peer string
}

// RemoteTarget is an RDMA device on another host, driven through a
// standalone softroce-agent over TCP (docs/remote.md). The fake peer is a
// nic/udp link on this host: it crafts packets toward the remote NIC's
// RoCEv2 address over the real network, and the NIC's answers come back
// to the link's UDP port 4791 (this host must not run RoCE on that
// address itself). The sessions are the rxe target's: only how the agent
// is reached, and where the packets go, differ.
type RemoteTarget struct {
	inner  *RxeTarget
	info   agent.DevInfo
	addr   netip.Addr
	driver string
	host   string
	kind   string
}

// NewRemoteTarget connects to the agent, asks what its device is, and
// opens the fake peer's link toward the device's RoCEv2 address (its GID at
// the agent's --gid-index).
func NewRemoteTarget(ctx context.Context, cfg RemoteConfig) (*RemoteTarget, error) {
	addr := cfg.Agent
	if _, _, err := net.SplitHostPort(addr); err != nil {
		addr = net.JoinHostPort(strings.Trim(addr, "[]"), strconv.Itoa(agent.DefaultPort))
	}
	dial := cfg.Dial
	if dial == nil {
		var d net.Dialer
		dial = d.DialContext
	}
	do := cfg.Do
	if do == nil {
		do = func(fn func() error) error { return fn() }
	}
	ag, err := agent.Dial(ctx, dial, addr, cfg.Token)
	if err != nil {
		return nil, fmt.Errorf("remote: connect to the agent at %s: %w", addr, err)
	}
	info, err := ag.DevInfo(ctx)
	if err != nil {
		ag.Close()
		return nil, fmt.Errorf("remote: device of the agent at %s: %w", addr, err)
	}
	if info.GIDType != "" && !strings.Contains(strings.ToLower(info.GIDType), "v2") {
		ag.Close()
		return nil, fmt.Errorf("remote: %s GID index %d is of type %s; start the agent with the --gid-index of a RoCE v2 GID",
			info.Name, info.GIDIndex, info.GIDType)
	}
	raddr := netip.AddrFrom16(info.GID).Unmap()
	if !raddr.IsValid() || raddr.IsUnspecified() || raddr.Is6() && raddr.IsLinkLocalUnicast() {
		ag.Close()
		return nil, fmt.Errorf("remote: %s GID index %d is %s, not a routable RoCEv2 address; pick another --gid-index",
			info.Name, info.GIDIndex, raddr)
	}
	kind := cfg.Peer
	if kind == "" {
		kind = PeerUDP
	}
	if kind != PeerUDP && kind != PeerRaw {
		ag.Close()
		return nil, fmt.Errorf("remote: unknown peer %q (want %s or %s)", kind, PeerUDP, PeerRaw)
	}
	t := &RemoteTarget{info: info, addr: raddr, driver: cfg.Driver, host: addr, kind: kind}
	if t.driver == "" {
		t.driver = remoteDriver(info)
	}
	var link nic.RawSender
	err = do(func() error {
		local, err := localAddr(cfg, raddr)
		if err != nil {
			return err
		}
		if kind == PeerRaw {
			link, err = openRawPeer(local)
			return err
		}
		link, err = udp.Open(udp.Config{Addr: local})
		return err
	})
	if err != nil {
		ag.Close()
		return nil, fmt.Errorf("remote: open the peer's %s link: %w", kind, err)
	}
	peer, err := NewPeer(link)
	if err != nil {
		link.Close()
		ag.Close()
		return nil, err
	}
	t.inner = &RxeTarget{ag: ag, peer: peer, dev: info.Name}
	return t, nil
}

// remoteDriver is the key of the documented deviations for a device:
// the kernel driver of its parent device, or for a software device
// (no parent: sysfs has no device/driver link) the RDMA driver its node
// description names (rdma_rxe's is "rxe").
func remoteDriver(d agent.DevInfo) string {
	if d.Driver != "" {
		return d.Driver
	}
	switch {
	case d.NodeDesc == "rxe" || strings.HasPrefix(d.Name, "rxe") && d.VendorID == 0xffffff:
		return "rxe"
	case d.NodeDesc == "siw" || strings.HasPrefix(d.Name, "siw"):
		return "siw"
	}
	return d.Name
}

// localAddr picks the peer's address: cfg.LocalAddr, the first address of
// cfg.Iface of raddr's family, or the source of the route to raddr.
func localAddr(cfg RemoteConfig, raddr netip.Addr) (netip.Addr, error) {
	var ifAddrs []netip.Addr
	if cfg.Iface != "" {
		ifc, err := net.InterfaceByName(cfg.Iface)
		if err != nil {
			return netip.Addr{}, err
		}
		as, err := ifc.Addrs()
		if err != nil {
			return netip.Addr{}, err
		}
		for _, a := range as {
			if p, err := netip.ParsePrefix(a.String()); err == nil {
				ifAddrs = append(ifAddrs, p.Addr())
			}
		}
	}
	if cfg.LocalAddr.IsValid() {
		if cfg.Iface != "" && !containsAddr(ifAddrs, cfg.LocalAddr) {
			return netip.Addr{}, fmt.Errorf("%s is not an address of %s", cfg.LocalAddr, cfg.Iface)
		}
		return cfg.LocalAddr, nil
	}
	for _, a := range ifAddrs {
		if a.Is4() == raddr.Is4() && !a.IsLinkLocalUnicast() {
			return a, nil
		}
	}
	if cfg.Iface != "" {
		return netip.Addr{}, fmt.Errorf("%s has no %s address", cfg.Iface, map[bool]string{true: "IPv4", false: "IPv6"}[raddr.Is4()])
	}
	// A connected UDP socket sends nothing: it only asks the routing
	// table which source address reaches raddr.
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(raddr, nic.RoCEv2Port)))
	if err != nil {
		return netip.Addr{}, fmt.Errorf("no route to %s: %w", raddr, err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).AddrPort().Addr().Unmap(), nil
}

func containsAddr(as []netip.Addr, a netip.Addr) bool {
	for _, x := range as {
		if x == a {
			return true
		}
	}
	return false
}

// Name implements Target.
func (t *RemoteTarget) Name() string { return "remote" }

// Driver implements DriverTarget: the device's driver, so that the
// deviations documented for it apply.
func (t *RemoteTarget) Driver() string { return t.driver }

// Device implements DeviceTarget.
func (t *RemoteTarget) Device() DeviceInfo {
	return DeviceInfo{Name: t.info.Name, FW: t.info.FW, Driver: t.driver, VendorID: t.info.VendorID, PartID: t.info.PartID, Host: t.host}
}

// PeerKind is how the fake peer sends (PeerUDP or PeerRaw).
func (t *RemoteTarget) PeerKind() string { return t.kind }

// Info is what the agent reported about its device.
func (t *RemoteTarget) Info() agent.DevInfo { return t.info }

// Peer implements Target.
func (t *RemoteTarget) Peer() *Peer { return t.inner.peer }

// Addr implements Target: the remote device's RoCEv2 address.
func (t *RemoteTarget) Addr() netip.Addr { return t.addr }

// Open implements Target (one session at a time, as for rxe).
func (t *RemoteTarget) Open(ctx context.Context, spec QPSpec) (Session, error) {
	return t.inner.Open(ctx, spec)
}

// Objects counts the verbs objects the agent holds.
func (t *RemoteTarget) Objects(ctx context.Context) (agent.Objects, error) {
	return t.inner.ag.Objects(ctx)
}

// Close implements Target: it ends the control connection (the agent then
// destroys everything the harness created) and closes the peer.
func (t *RemoteTarget) Close() error {
	return errors.Join(t.inner.Close())
}

// CMListen implements CMTarget: the agent starts an rdma_cm server (rping,
// rdmacm-utils on the agent's host) on the device's address.
func (t *RemoteTarget) CMListen(ctx context.Context, port uint16) (func(), error) {
	id, err := t.inner.ag.CMListen(ctx, port)
	if err != nil {
		return nil, err
	}
	return t.cmStop(id), nil
}

// CMConnect implements CMTarget: the agent's rdma_cm client connects to
// the peer's address.
func (t *RemoteTarget) CMConnect(ctx context.Context, port uint16) (func(), error) {
	id, err := t.inner.ag.CMConnect(ctx, t.inner.peer.Addr(), port)
	if err != nil {
		return nil, err
	}
	return t.cmStop(id), nil
}

func (t *RemoteTarget) cmStop(id int) func() {
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		t.inner.ag.CMStop(ctx, id)
	}
}
