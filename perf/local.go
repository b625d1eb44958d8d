package perf

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/nic/pipe"
	"github.com/softroce/softroce/verbs"
)

// portLink sends every packet to one UDP port of the peer. The transport
// addresses peers by IP only (RoCEv2 always uses UDP port 4791); softroce
// endpoints may listen elsewhere (two on one host, or an unprivileged
// test), and the port they use is exchanged out of band.
type portLink struct {
	nic.Link
	port atomic.Uint32 // 0: leave packets alone
}

func retarget(l nic.Link, port uint16) nic.Link {
	p := &portLink{Link: l}
	p.port.Store(uint32(port))
	return p
}

// Send implements nic.Link.
func (p *portLink) Send(pkts []nic.Packet) (int, error) {
	if port := uint16(p.port.Load()); port != 0 {
		for i := range pkts {
			if pkts[i].Remote.Port() != port {
				pkts[i].Remote = netip.AddrPortFrom(pkts[i].Remote.Addr(), port)
			}
		}
	}
	return p.Link.Send(pkts)
}

// RecvSide implements nic.SendWrapper: only sends are rewritten, so the
// device receives from the wrapped link directly, with every receive
// loop it offers (busy-poll, inline waits).
func (p *portLink) RecvSide() nic.Link { return p.Link }

// Local is the result of RunLocal: the report and both endpoints, still
// open (the caller closes them), for tests that check memory.
type Local struct {
	Report         *Report
	Client, Server *Endpoint
}

// Close closes both endpoints.
func (l *Local) Close() {
	l.Client.Close()
	l.Server.Close()
}

// RunLocal runs c with both sides in this process. With links nil it uses
// an in-process pipe; otherwise links are the client's and the server's
// links, already able to reach each other, whose UDP ports (0: 4791)
// serverPort and clientPort are used to address each side.
func RunLocal(ctx context.Context, c Config, lat bool, links *[2]nic.Link, ports [2]uint16, row func(any)) (*Local, error) {
	if err := c.fill(lat); err != nil {
		return nil, err
	}
	var lc, ls nic.Link
	if links == nil {
		lc, ls = pipe.New(pipe.Config{Depth: 4096})
	} else {
		lc, ls = retarget(links[0], ports[1]), retarget(links[1], ports[0])
	}
	dc, err := verbs.Open(lc, deviceOptions("softroce-client", c.BusyPoll, c.NoInlineWait, c.CC))
	if err != nil {
		return nil, fmt.Errorf("open client device: %w", err)
	}
	ds, err := verbs.Open(ls, deviceOptions("softroce-server", c.BusyPoll, c.NoInlineWait, c.CC))
	if err != nil {
		dc.Close()
		return nil, fmt.Errorf("open server device: %w", err)
	}
	cl, err := NewEndpoint(dc, c.QPs, c.maxSize(), c.TxDepth)
	if err != nil {
		dc.Close()
		ds.Close()
		return nil, fmt.Errorf("client: %w", err)
	}
	sv, err := NewEndpoint(ds, c.QPs, c.maxSize(), c.TxDepth)
	if err != nil {
		cl.Close()
		ds.Close()
		return nil, fmt.Errorf("server: %w", err)
	}
	l := &Local{Client: cl, Server: sv}
	ci, si := cl.Info(ports[0]), sv.Info(ports[1])
	if err := cl.Connect(si, c.MTU); err != nil {
		l.Close()
		return nil, err
	}
	if err := sv.Connect(ci, c.MTU); err != nil {
		l.Close()
		return nil, err
	}
	if c.Started != nil {
		c.Started(cl.qps)
	}
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var recvErr error
	if c.Test == Send {
		if err := sv.PostReceives(c.TxDepth, c.maxSize()); err != nil {
			cancel()
			l.Close()
			return nil, fmt.Errorf("post receives: %w", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, recvErr = sv.ServeReceives(rctx, c.maxSize())
		}()
	}
	rep, err := runSizes(ctx, cl, &c, si, lat, row)
	cancel()
	wg.Wait()
	l.Report = rep
	if err == nil {
		err = recvErr
	}
	if err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}
