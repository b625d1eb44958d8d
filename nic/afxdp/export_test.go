package afxdp

import (
	"net"
	"net/netip"
)

var netErrClosed = net.ErrClosed

// setResolver replaces how the link resolves a next hop; real calls
// n.resolve. Call before the first Send.
func (l *Link) setResolver(fn func(real func(netip.Addr) ([6]byte, error), dst netip.Addr) ([6]byte, error)) {
	n := l.neigh
	n.mu.Lock()
	defer n.mu.Unlock()
	n.resolveFn = func(dst netip.Addr) ([6]byte, error) { return fn(n.resolve, dst) }
}

// resolving is the number of background resolutions started and not
// finished.
func (l *Link) resolving() int {
	n := l.neigh
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.resolving)
}
