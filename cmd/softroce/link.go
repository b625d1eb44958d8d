package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/nic/afxdp"
	"github.com/softroce/softroce/nic/impair"
	"github.com/softroce/softroce/nic/udp"
)

// linkFlags are the flags every network command shares.
type linkFlags struct {
	backend string
	bind    string
	udpPort int
	xdpMode afxdp.Mode // afxdp only: the XDP attach mode
	// linkLocal (udp only) also serves the interface's IPv6 link-local
	// address, first, as a kernel RoCE device orders its GID table;
	// warn reports why a device has no link-local GID.
	linkLocal bool
	warn      func(format string, args ...any)
	impair    string // --impair: the spec this side's sends are impaired by
}

// dadWait bounds the wait for a link-local address still tentative (DAD
// takes about a second after the link comes up).
const dadWait = 3 * time.Second

// openLink opens the chosen backend on the local address bind. With no
// bind it uses the address the kernel would route to peer from, or else
// the first non-loopback IPv4 address of the host.
func openLink(f linkFlags, peer string) (nic.Link, error) {
	addr, err := localAddr(f.bind, peer)
	if err != nil {
		return nil, err
	}
	switch f.backend {
	case "", "udp":
		if f.linkLocal && !addr.IsLinkLocalUnicast() {
			ll, err := udp.LinkLocalOf(addr, dadWait)
			switch {
			case err == nil:
				m, err := udp.OpenMulti(udp.Config{Port: f.udpPort}, ll, addr)
				if err == nil {
					return m, nil
				}
				if f.warn != nil {
					f.warn("%v: no link-local GID: %v", addr, err)
				}
			case !errors.Is(err, udp.ErrNoLinkLocal) && f.warn != nil:
				f.warn("%v: no link-local GID: %v", addr, err)
			}
		}
		l, err := udp.Open(udp.Config{Addr: addr, Port: f.udpPort})
		if err != nil {
			return nil, udpOpenError(err, addr, f.udpPort)
		}
		return l, nil
	case "afxdp":
		ifc, err := udp.InterfaceOf(addr)
		if err != nil {
			return nil, fmt.Errorf("--bind %v: %w", addr, err)
		}
		// Capabilities, not root, are what AF_XDP needs: afxdp.Open
		// names the ones missing.
		l, err := afxdp.Open(afxdp.Config{Interface: ifc.Name, Addr: addr, Port: f.udpPort, Mode: f.xdpMode})
		if err != nil {
			if strings.Contains(err.Error(), "not permitted") {
				return nil, fmt.Errorf("open AF_XDP backend on %s: %w (or use --backend udp, which needs no privilege)", ifc.Name, err)
			}
			return nil, fmt.Errorf("open AF_XDP backend on %s: %w", ifc.Name, err)
		}
		return l, nil
	}
	return nil, fmt.Errorf("unknown --backend %q: choose udp (portable) or afxdp (root, fast)", f.backend)
}

// udpOpenError explains a failure to open the udp backend. A port in use
// gets advice naming this command's flag (the backend's own message cannot
// know it).
func udpOpenError(err error, addr netip.Addr, port int) error {
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("UDP port %d on %v is in use (another softroce, or a kernel RoCE device such as rdma_rxe?): pick another with --udp-port", port, addr)
	}
	return fmt.Errorf("open UDP backend on %v: %w", addr, err)
}

func localAddr(bind, peer string) (netip.Addr, error) {
	if bind != "" {
		a, err := netip.ParseAddr(bind)
		if err != nil {
			return netip.Addr{}, fmt.Errorf("--bind %q is not an IP address", bind)
		}
		if _, err := udp.InterfaceOf(a); err != nil {
			return netip.Addr{}, fmt.Errorf("--bind %v: no local interface has this address", a)
		}
		return a, nil
	}
	if peer != "" {
		// A connected UDP socket reveals the source address the kernel
		// would use towards peer, without sending anything.
		c, err := net.Dial("udp", net.JoinHostPort(peer, "4791"))
		if err == nil {
			defer c.Close()
			if ap, err := netip.ParseAddrPort(c.LocalAddr().String()); err == nil {
				return ap.Addr().Unmap(), nil
			}
		}
	}
	ifs, _ := net.InterfaceAddrs()
	for _, a := range ifs {
		if p, err := netip.ParsePrefix(a.String()); err == nil && p.Addr().Is4() && !p.Addr().IsLoopback() {
			return p.Addr(), nil
		}
	}
	return netip.Addr{}, errors.New("no local IPv4 address found: give one with --bind ADDR")
}

// impairUsage is the help of --impair, the same in every command that
// takes it (bw, lat, pingpong, perftest, serve).
const impairUsage = "impair this side's sends, e.g. loss=1%,dup=1%,reorder=1%,corrupt=1%,delay=100us,jitter=50us,seed=7 (nic/impair syntax; retransmissions are counted)"

// parseImpair parses an --impair spec for cmd and picks a seed if it has
// none. Unless quiet, it says on stderr that the sends are impaired, with
// the seed, so that a run that fails can be repeated. The error names the
// flag.
func parseImpair(cmd, spec string, quiet bool) (impair.Config, error) {
	cfg, err := impair.Parse(spec)
	if err != nil {
		return cfg, fmt.Errorf("--impair %s: %v", spec, err)
	}
	if cfg.Seed == 0 {
		cfg.Seed = uint64(time.Now().UnixNano())%100000 + 1
	}
	if !quiet {
		fmt.Fprintf(os.Stderr, "softroce %s: impaired sends: %v (rerun with seed=%d to repeat)\n", cmd, cfg, cfg.Seed)
	}
	return cfg, nil
}

// impairLink wraps l in cfg's impairment, or returns it as it is when
// cfg is nil (no --impair).
func impairLink(l nic.Link, cfg *impair.Config) nic.Link {
	if cfg == nil {
		return l
	}
	return impair.Wrap(l, *cfg)
}

// printImpairCounters prints what an impaired link did to this side's
// sends.
func printImpairCounters(w io.Writer, l *impair.Link) {
	c := l.Counters()
	fmt.Fprintf(w, " softroce impair: %d packets sent, %d dropped, %d duplicated, %d reordered, %d corrupted, %d delayed\n",
		c.Packets, c.Dropped, c.Duplicated, c.Reordered, c.Corrupted, c.Delayed)
}
