package rxevm

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/vishvananda/netns"
)

// Addresses of a Pair's guests; the host keeps HostAddr on the bridge.
var pairGuests = [2]netip.Prefix{
	netip.MustParsePrefix("10.88.0.2/24"),
	netip.MustParsePrefix("10.88.0.3/24"),
}

// pairMACs are locally administered addresses, one per guest.
var pairMACs = [2]string{"52:54:00:88:00:02", "52:54:00:88:00:03"}

// Pair is two guests on one bridge in one network namespace: A's eth0 is
// 10.88.0.2 on tap0, B's is 10.88.0.3 on tap1, both taps ports of
// BridgeName, which carries HostAddr. Traffic between A and B crosses
// both guests' virtio-net devices and the host's bridge, the path two
// hosts on one switch take, unlike a client and server on one rxe0 (rxe's
// internal loopback never reaches UDP/IP).
type Pair struct {
	A, B *VM
	name string
	ns   netns.NsHandle
	once sync.Once
}

// BootPair boots two guests of img with the same options (MTU, Files,
// Env, ...) on one bridge, both at once, and returns when both rxe0 ports
// are ACTIVE. On error everything created so far is removed again.
func BootPair(ctx context.Context, img *Image, opts Options) (_ *Pair, err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("rxevm: booting a VM needs root (network namespaces, tap)")
	}
	opts = opts.withDefaults()
	sweepBeforeBoot(opts.logw())
	name := newNetnsName()
	l := pairLayout(opts.MTU, opts.NICQueues)
	ns, err := createNetns(ctx, name, l)
	if err != nil {
		return nil, err
	}
	p := &Pair{name: name, ns: ns}
	var vms [2]*VM
	var errs [2]error
	var wg sync.WaitGroup
	for i := range vms {
		h, herr := netns.GetFromName(name)
		if herr != nil {
			errs[i] = fmt.Errorf("rxevm: open netns %s: %w", name, herr)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			vms[i], errs[i] = boot(ctx, img, opts, vmNet{name: name, ns: h, tap: l.taps[i],
				guest: pairGuests[i], mac: pairMACs[i], shared: true})
		}()
	}
	wg.Wait()
	p.A, p.B = vms[0], vms[1]
	if err := errors.Join(errs[0], errs[1]); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// Close closes both VMs and removes the namespace with the bridge and the
// taps. It is safe to call more than once.
func (p *Pair) Close() error {
	var errs []error
	p.once.Do(func() {
		for _, vm := range []*VM{p.A, p.B} {
			if vm != nil {
				errs = append(errs, vm.Close())
			}
		}
		p.ns.Close()
		if err := deleteNamed(p.name); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("rxevm: delete netns %s: %w", p.name, err))
		}
	})
	return errors.Join(errs...)
}

// Netns is the name of the pair's network namespace.
func (p *Pair) Netns() string { return p.name }

// CloseOnSignal closes the pair when the process gets SIGINT or SIGTERM and
// then exits with status 130, like VM.CloseOnSignal.
func (p *Pair) CloseOnSignal() (stop func()) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case <-ch:
			p.Close()
			os.Exit(130)
		case <-done:
		}
	}()
	return func() { signal.Stop(ch); close(done) }
}
