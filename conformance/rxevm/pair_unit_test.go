package rxevm

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
)

func TestGIDSuffix(t *testing.T) {
	for a, want := range map[string]string{
		"10.88.0.2":       "ffff:0a58:0002",
		"10.88.0.3":       "ffff:0a58:0003",
		"192.168.255.254": "ffff:c0a8:fffe",
	} {
		if got := gidSuffix(netip.MustParseAddr(a)); got != want {
			t.Errorf("gidSuffix(%s) = %q, want %q", a, got, want)
		}
	}
}

// The two guests of a pair differ in everything that must be unique on one
// bridge: address (kernel command line), tap, MAC.
func TestPairGuestsDistinct(t *testing.T) {
	var cmdlines, args [2]string
	for i := range 2 {
		vm := &VM{dir: "/x", opts: Options{MTU: 1500, CommandPort: 7000, MemoryMB: 384},
			tap: pairLayout(1500, 0).taps[i], guest: pairGuests[i], mac: pairMACs[i]}
		c, err := vm.cmdline()
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(c, " sr_addr="+pairGuests[i].String()+" ") {
			t.Fatalf("guest %d cmdline %q lacks its address", i, c)
		}
		cmdlines[i] = c
		a := vm.qemuArgs("k", "i", c)
		j := slices.Index(a, "-netdev")
		if j < 0 || !strings.Contains(a[j+1], "ifname="+vm.tap+",") {
			t.Fatalf("guest %d: qemu -netdev %v, want ifname=%s", i, a, vm.tap)
		}
		j = slices.Index(a, "-device")
		if j < 0 || !strings.HasSuffix(a[j+1], ",mac="+pairMACs[i]) {
			t.Fatalf("guest %d: qemu -device %v, want mac=%s", i, a, pairMACs[i])
		}
		args[i] = strings.Join(a, " ")
	}
	if cmdlines[0] == cmdlines[1] || args[0] == args[1] || pairGuests[0].Addr() == pairGuests[1].Addr() {
		t.Fatal("the two guests of a pair boot identically")
	}
	// A single VM keeps qemu's default MAC and tap0.
	single := (&VM{opts: Options{MemoryMB: 384}, tap: TapName}).qemuArgs("k", "i", "c")
	if s := strings.Join(single, " "); strings.Contains(s, "mac=") || !strings.Contains(s, "ifname="+TapName+",") {
		t.Fatalf("single VM qemu args changed: %s", s)
	}
}

// The pair's namespace: both taps are ports of the bridge, at the MTU, up,
// and the host address sits on the bridge (no qemu needed to check that).
func TestPairNetns(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2's ip")
	}
	name := fmt.Sprintf("%s%d-pairtest", NetnsPrefix, os.Getpid())
	ns, err := createNetns(context.Background(), name, pairLayout(1500, 4))
	if err != nil {
		t.Fatal(err)
	}
	defer deleteNamed(name)
	defer ns.Close()
	err = inNetns(ns, func() error {
		br, err := netlink.LinkByName(BridgeName)
		if err != nil {
			return err
		}
		if br.Type() != "bridge" || br.Attrs().MTU != 1500 {
			return fmt.Errorf("%s: type %s mtu %d", BridgeName, br.Type(), br.Attrs().MTU)
		}
		addrs, err := netlink.AddrList(br, netlink.FAMILY_V4)
		if err != nil || len(addrs) != 1 || addrs[0].IPNet.String() != hostPrefix.String() {
			return fmt.Errorf("%s addresses %v, %v; want %s", BridgeName, addrs, err, hostPrefix)
		}
		for _, tap := range pairLayout(1500, 4).taps {
			l, err := netlink.LinkByName(tap)
			if err != nil {
				return err
			}
			// qemu's queues=4 attaches only to a multi-queue tap.
			if tt, ok := l.(*netlink.Tuntap); !ok || tt.Flags&netlink.TUNTAP_MULTI_QUEUE == 0 {
				return fmt.Errorf("%s: %T %+v is not a multi-queue tap", tap, l, l)
			}
			if l.Attrs().MasterIndex != br.Attrs().Index || l.Attrs().MTU != 1500 || l.Attrs().Flags&net.FlagUp == 0 {
				return fmt.Errorf("%s: master %d (bridge %d), mtu %d, flags %v", tap, l.Attrs().MasterIndex, br.Attrs().Index, l.Attrs().MTU, l.Attrs().Flags)
			}
			if a, _ := netlink.AddrList(l, netlink.FAMILY_V4); len(a) != 0 {
				return fmt.Errorf("%s has addresses %v; the host's belongs on the bridge", tap, a)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// NICQueues gives the guest a multi-queue virtio-net NIC: qemu's tap
// backend opens that many queues and the device gets mq and a vector
// per queue and direction, plus config and control; without it neither.
func TestNICQueuesArgs(t *testing.T) {
	arg := func(a []string, flag string) string {
		j := slices.Index(a, flag)
		if j < 0 || j+1 == len(a) {
			t.Fatalf("qemu args %v lack %s", a, flag)
		}
		return a[j+1]
	}
	mq := (&VM{opts: Options{MemoryMB: 384, NICQueues: 4}, tap: TapName}).qemuArgs("k", "i", "c")
	if n, d := arg(mq, "-netdev"), arg(mq, "-device"); !strings.Contains(n, ",queues=4") || !strings.Contains(d, ",mq=on,vectors=10") {
		t.Fatalf("NICQueues 4: -netdev %q -device %q, want queues=4 and mq=on,vectors=10", n, d)
	}
	for _, q := range []int{0, 1} {
		one := (&VM{opts: Options{MemoryMB: 384, NICQueues: q}, tap: TapName}).qemuArgs("k", "i", "c")
		if n, d := arg(one, "-netdev"), arg(one, "-device"); strings.Contains(n, "queues") || strings.Contains(d, "mq=") {
			t.Fatalf("NICQueues %d: -netdev %q -device %q, want a single queue", q, n, d)
		}
	}
	if single := singleLayout(1500, 0); single.queues != 0 {
		t.Fatalf("singleLayout(1500, 0).queues = %d", single.queues)
	}
}
