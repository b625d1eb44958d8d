package udp

import (
	"bufio"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"
)

// ErrNoLinkLocal says that an interface has no IPv6 link-local address
// (loopback, or IPv6 disabled on it).
var ErrNoLinkLocal = errors.New("no IPv6 link-local address")

// Address flags of /proc/net/if_inet6 (linux/if_addr.h).
const (
	ifaTentative = 0x40 // IFA_F_TENTATIVE: duplicate address detection runs
	ifaDADFailed = 0x08 // IFA_F_DADFAILED
)

// LinkLocalOf returns the IPv6 link-local address of the interface that
// owns addr, zoned with the interface's name (fe80::1%eth0), as a Config
// Addr wants it. A kernel RoCE device puts it at GID index 0 (the
// "default GID"). A new address is tentative while duplicate address
// detection runs (about a second after the link comes up) and cannot be
// bound then: LinkLocalOf waits up to wait for it. It returns
// ErrNoLinkLocal when the interface has none, and an error saying why
// when the address stays unusable.
func LinkLocalOf(addr netip.Addr, wait time.Duration) (netip.Addr, error) {
	ifi, err := InterfaceOf(addr)
	if err != nil {
		return netip.Addr{}, err
	}
	deadline := time.Now().Add(wait)
	for {
		ll, flags, err := linkLocal(ifi.Name)
		if err != nil {
			return netip.Addr{}, fmt.Errorf("%s: %w", ifi.Name, err)
		}
		switch {
		case flags&ifaDADFailed != 0:
			return netip.Addr{}, fmt.Errorf("%s: link-local %v failed duplicate address detection", ifi.Name, ll)
		case flags&ifaTentative == 0:
			return ll.WithZone(ifi.Name), nil
		case time.Now().After(deadline):
			return netip.Addr{}, fmt.Errorf("%s: link-local %v is still tentative (duplicate address detection) after %v", ifi.Name, ll, wait)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// linkLocal reads the link-local address of interface name and its flags
// from the calling thread's network namespace.
func linkLocal(name string) (netip.Addr, int, error) {
	f, err := os.Open("/proc/thread-self/net/if_inet6")
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return netip.Addr{}, 0, ErrNoLinkLocal // no IPv6 at all
		}
		return netip.Addr{}, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// ADDRESS IFINDEX PREFIXLEN SCOPE FLAGS NAME, in hex.
		fs := strings.Fields(sc.Text())
		if len(fs) != 6 || fs[5] != name || len(fs[0]) != 32 {
			continue
		}
		var b [16]byte
		if _, err := hex.Decode(b[:], []byte(fs[0])); err != nil {
			continue
		}
		a := netip.AddrFrom16(b)
		flags, err := strconv.ParseUint(fs[4], 16, 32)
		if err != nil || !a.IsLinkLocalUnicast() {
			continue
		}
		return a, int(flags), nil
	}
	if err := sc.Err(); err != nil {
		return netip.Addr{}, 0, err
	}
	return netip.Addr{}, 0, ErrNoLinkLocal
}
