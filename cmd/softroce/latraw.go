package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"

	"github.com/softroce/softroce/perf"
)

// runRawUDP is `lat --raw-udp`: the plain UDP ping-pong the RC latency is
// compared with, between the same hosts, with the same sizes and report.
func runRawUDP(ctx context.Context, f *perfFlags, c perf.Config, bind netip.Addr, peer string, pr *printer, fail func(string, ...any) int) int {
	if f.backend != "udp" {
		return fail("--raw-udp measures kernel UDP sockets: drop --backend %s", f.backend)
	}
	if f.test != "write" {
		return fail("--raw-udp sends datagrams: drop --test %s", f.test)
	}
	rc := perf.RawConfig{BusyPoll: time.Duration(f.busy), Wait: f.wait}
	if f.server {
		if peer != "" {
			return fail("--server takes no peer address")
		}
		la := netip.AddrPortFrom(netip.IPv4Unspecified(), uint16(f.udpPort))
		if bind.IsValid() {
			la = netip.AddrPortFrom(bind, uint16(f.udpPort))
		}
		conn, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(la))
		if err != nil {
			return fail("listen on UDP %v: %v (pick another --udp-port)", la, err)
		}
		defer conn.Close()
		fmt.Fprintf(os.Stderr, "softroce lat: answering a raw UDP ping-pong on %v\n", conn.LocalAddr())
		n, err := perf.RawUDPServe(ctx, conn, rc)
		if err != nil {
			fmt.Fprintf(os.Stderr, "softroce lat: %v\n", err)
			return 1
		}
		fmt.Fprintf(os.Stderr, "softroce lat: answered %d datagrams\n", n)
		return 0
	}
	if peer == "" {
		return fail("give the server's address (or --server on the other side)")
	}
	pa, err := perf.ParsePeer(peer, f.udpPort)
	if err != nil {
		return fail("%v", err)
	}
	pa = netip.AddrPortFrom(pa.Addr(), uint16(f.udpPort))
	la := netip.AddrPortFrom(netip.IPv4Unspecified(), 0)
	if bind.IsValid() {
		la = netip.AddrPortFrom(bind, 0)
	} else if pa.Addr().Is6() {
		la = netip.AddrPortFrom(netip.IPv6Unspecified(), 0)
	}
	conn, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(la))
	if err != nil {
		return fail("open a UDP socket on %v: %v", la, err)
	}
	defer conn.Close()
	c.Progress = pr.progress
	rep, err := perf.RawUDPPing(ctx, conn, pa, c, rc, pr.row)
	if err != nil {
		pr.w.(*bufio.Writer).Flush()
		fmt.Fprintf(os.Stderr, "softroce lat: %v\n", err)
		return 1
	}
	return pr.finish(rep)
}
