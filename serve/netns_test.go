package serve

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/netnstest"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/nic/udp"
	"github.com/softroce/softroce/verbs"
)

// startInNS runs a daemon for end e, its UDP socket on port 4791 of e's
// address opened inside e's namespace (a socket keeps the namespace it
// was made in).
func startInNS(t *testing.T, e *netnstest.End) *Server {
	t.Helper()
	var l *udp.Link
	e.NS.Run(t, func() (err error) {
		l, err = udp.Open(udp.Config{Addr: e.Addr(), Port: 4791})
		return err
	})
	return startOn(t, l)
}

// startLinkLocalInNS is startInNS with the device on e's link-local and
// IPv4 addresses, GIDs 0 and 1, as softroce serve opens it.
func startLinkLocalInNS(t *testing.T, e *netnstest.End) *Server {
	t.Helper()
	var l *udp.Multi
	e.NS.Run(t, func() error {
		ll, err := udp.LinkLocalOf(e.Addr(), 5*time.Second)
		if err != nil {
			return err
		}
		l, err = udp.OpenMulti(udp.Config{Port: 4791}, ll, e.Addr())
		return err
	})
	return startOn(t, l)
}

func startOn(t *testing.T, l nic.Link) *Server {
	t.Helper()
	d, err := verbs.Open(l, nil)
	if err != nil {
		t.Fatal(err)
	}
	return start(t, d, 0)
}

// nsTool is one program started inside ns (ip netns exec) on daemon s.
func nsTool(t *testing.T, ns *netnstest.NS, s *Server, lib, path string, args ...string) *toolProc {
	t.Helper()
	p := &toolProc{cmd: exec.Command("ip", append([]string{"netns", "exec", ns.Name, path}, args...)...), done: make(chan error, 1)}
	p.cmd.Env = env(s, lib)
	p.cmd.Stdout, p.cmd.Stderr = p, p
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() { p.cmd.Process.Kill() })
	return p
}

// Two hosts: a daemon in namespace A and one in namespace B, joined by a
// veth pair, each running the distribution's unmodified programs inside
// its namespace. Out-of-band exchanges (TCP, rdma_cm's MADs) and the RDMA
// traffic cross the veth, as between two machines.
func TestTwoHostsNetns(t *testing.T) {
	netnstest.Require(t)
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("ip (iproute2) is not installed")
	}
	_, lib := tool(t, "ibv_devinfo")
	v := netnstest.Pair(t, netnstest.VethConfig{})
	sa, sb := startInNS(t, v.A), startInNS(t, v.B)
	srvAddr := v.A.Addr().String()
	look := func(t *testing.T, name string) string {
		p, err := exec.LookPath(name)
		if err != nil {
			t.Skipf("%s is not installed", name)
		}
		return p
	}
	// pair runs the server on host A and the client on host B.
	pair := func(t *testing.T, name string, srvArgs, cliArgs []string, listen func()) (string, string) {
		p := look(t, name)
		srv := nsTool(t, v.A.NS, sa, lib, p, srvArgs...)
		listen()
		cli := nsTool(t, v.B.NS, sb, lib, p, cliArgs...)
		co := waitTool(t, cli, name+" client on host B")
		so := waitTool(t, srv, name+" server on host A")
		t.Logf("%s", lastLines(co, 2))
		return co, so
	}
	sleep := func(d time.Duration) func() { return func() { time.Sleep(d) } }

	t.Run("ibv_devinfo", func(t *testing.T) {
		cmd := exec.Command("ip", "netns", "exec", v.B.NS.Name, look(t, "ibv_devinfo"), "-v")
		cmd.Env = env(sb, lib)
		out, err := cmd.CombinedOutput()
		if want := "::ffff:" + v.B.Addr().String() + ", RoCE v2"; err != nil || !strings.Contains(string(out), want) {
			t.Errorf("ibv_devinfo on host B lacks %q: %v\n%s", want, err, out)
		}
	})
	t.Run("ibv_rc_pingpong", func(t *testing.T) {
		args := []string{"-g", "0", "-p", "18700", "-n", "500"}
		co, so := pair(t, "ibv_rc_pingpong", args, append(args, srvAddr), sleep(300*time.Millisecond))
		for _, o := range []string{co, so} {
			if !strings.Contains(o, "500 iters in") {
				t.Errorf("no result:\n%s", o)
			}
		}
	})
	t.Run("ib_write_bw", func(t *testing.T) {
		args := []string{"-x", "0", "-s", "65536", "-n", "1000", "-p", "18701"}
		co, _ := pair(t, "ib_write_bw", args, append(args, srvAddr), sleep(time.Second))
		if !strings.Contains(co, " 65536      1000") {
			t.Errorf("no result line:\n%s", co)
		}
	})
	t.Run("ib_read_bw-R", func(t *testing.T) {
		p := look(t, "ib_read_bw")
		for attempt := 0; ; attempt++ {
			port := 18710 + attempt
			args := []string{"-R", "-F", "-n", "100", "-s", "4096", "-p", fmt.Sprint(port)}
			srv := nsTool(t, v.A.NS, sa, lib, p, args...)
			waitListening(t, sa, uint16(port))
			cli := nsTool(t, v.B.NS, sb, lib, p, append(args, srvAddr)...)
			<-cli.done
			cli.mu.Lock()
			co := cli.out.String()
			cli.mu.Unlock()
			if strings.Contains(co, "RDMA_CM_EVENT_REJECTED; error: 8") && attempt < 4 {
				srv.cmd.Process.Kill()
				<-srv.done
				continue
			}
			so := waitTool(t, srv, "ib_read_bw -R server on host A")
			for _, o := range []string{co, so} {
				if !strings.Contains(o, " 4096       100") {
					t.Errorf("ib_read_bw -R printed no result:\n%s", o)
				}
			}
			t.Logf("%s", lastLines(co, 2))
			return
		}
	})
	t.Run("rping", func(t *testing.T) {
		co, so := pair(t, "rping", []string{"-s", "-a", srvAddr, "-p", "7494", "-C", "10", "-v"},
			[]string{"-c", "-a", srvAddr, "-p", "7494", "-C", "10", "-v"}, func() { waitListening(t, sa, 7494) })
		if !strings.Contains(co, "ping data: rdma-ping-9") || !strings.Contains(so, "server ping data: rdma-ping-9") {
			t.Errorf("rping did not complete 10 pings:\nclient:\n%s\nserver:\n%s", co, so)
		}
	})
}

// Two hosts whose devices have the kernel's GID order: 0 the link-local
// IPv6 GID, 1 the IPv4 one. The distribution's programs run over GID 0
// (RoCEv2 over IPv6 link-local, what they get on rxe) for RC and UD;
// rdma_cm finds GID 1 by IPv4 address, and GID 0 by link-local address
// and scope id (fe80::X%IFNAME).
func TestTwoHostsLinkLocalNetns(t *testing.T) {
	netnstest.Require(t)
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("ip (iproute2) is not installed")
	}
	_, lib := tool(t, "ibv_devinfo")
	v := netnstest.Pair(t, netnstest.VethConfig{NoDAD: true})
	sa, sb := startLinkLocalInNS(t, v.A), startLinkLocalInNS(t, v.B)
	srvAddr := v.A.Addr().String()
	look := func(t *testing.T, name string) string {
		p, err := exec.LookPath(name)
		if err != nil {
			t.Skipf("%s is not installed", name)
		}
		return p
	}
	pair := func(t *testing.T, name string, srvArgs, cliArgs []string, listen func()) (string, string) {
		p := look(t, name)
		srv := nsTool(t, v.A.NS, sa, lib, p, srvArgs...)
		listen()
		cli := nsTool(t, v.B.NS, sb, lib, p, cliArgs...)
		co := waitTool(t, cli, name+" client on host B")
		so := waitTool(t, srv, name+" server on host A")
		t.Logf("%s", lastLines(co, 2))
		return co, so
	}
	sleep := func(d time.Duration) func() { return func() { time.Sleep(d) } }

	t.Run("ibv_devinfo", func(t *testing.T) {
		cmd := exec.Command("ip", "netns", "exec", v.B.NS.Name, look(t, "ibv_devinfo"), "-v")
		cmd.Env = env(sb, lib)
		out, err := cmd.CombinedOutput()
		ll := sb.devs[0].v.GIDTable()[0].Addr
		for _, want := range []string{"GID[  0]:\t\t" + ll.String() + ", RoCE v2", "GID[  1]:\t\t::ffff:" + v.B.Addr().String() + ", RoCE v2"} {
			if err != nil || !strings.Contains(string(out), want) {
				t.Errorf("ibv_devinfo on host B lacks %q: %v\n%s", want, err, out)
			}
		}
	})
	for _, c := range []struct {
		tool string
		args []string
	}{
		{"ibv_rc_pingpong", []string{"-g", "0", "-n", "300"}},
		{"ibv_ud_pingpong", []string{"-g", "0", "-s", "1024", "-n", "300"}},
		{"ibv_rc_pingpong", []string{"-g", "1", "-n", "300"}},
	} {
		t.Run(c.tool+"-g"+c.args[1], func(t *testing.T) {
			args := append([]string{"-p", fmt.Sprint(freeTCPPort(t))}, c.args...)
			ll := func(s *Server) nic.Stats { return s.devs[0].v.Link().(*udp.Multi).Links()[0].Stats() }
			before := ll(sa).RxPackets
			co, so := pair(t, c.tool, args, append(args, srvAddr), sleep(300*time.Millisecond))
			for _, o := range []string{co, so} {
				if !strings.Contains(o, "300 iters in") {
					t.Errorf("no result:\n%s", o)
				}
			}
			// -g 0 goes over the link-local sockets (IPv6, the whole
			// ICRC verified), -g 1 not.
			st := ll(sa)
			if got := st.RxPackets - before; (c.args[1] == "0") != (got >= 300) || st.RxICRCVerified != st.RxPackets {
				t.Errorf("-g %s: host A's link-local socket received %d packets (stats %+v)", c.args[1], got, st)
			}
		})
	}
	t.Run("rping", func(t *testing.T) {
		co, so := pair(t, "rping", []string{"-s", "-a", srvAddr, "-p", "7494", "-C", "10", "-v"},
			[]string{"-c", "-a", srvAddr, "-p", "7494", "-C", "10", "-v"}, func() { waitListening(t, sa, 7494) })
		if !strings.Contains(co, "ping data: rdma-ping-9") || !strings.Contains(so, "server ping data: rdma-ping-9") {
			t.Errorf("rping did not complete 10 pings:\nclient:\n%s\nserver:\n%s", co, so)
		}
	})
	// rdma_cm over the link-local addresses, scope ids as %IFNAME (each
	// host's own interface): the ids bind and resolve to GID 0, the REQ
	// carries the link-local GIDs and the connection's traffic goes over
	// the link-local sockets.
	llA := sa.devs[0].v.GIDTable()[0].Addr.String()
	llB := sb.devs[0].v.GIDTable()[0].Addr.String()
	llRx := func(s *Server) uint64 { return s.devs[0].v.Link().(*udp.Multi).Links()[0].Stats().RxPackets }
	t.Run("ucmatose-link-local", func(t *testing.T) {
		before := llRx(sa)
		co, so := pair(t, "ucmatose", []string{"-b", llA + "%" + v.A.Name, "-p", "7496", "-c", "2", "-C", "20"},
			[]string{"-s", llA + "%" + v.B.Name, "-b", llB + "%" + v.B.Name, "-p", "7496", "-c", "2", "-C", "20"},
			func() { waitListening(t, sa, 7496) })
		for _, o := range []string{co, so} {
			if !strings.Contains(o, "data transfers complete") || !strings.Contains(o, "return status 0") {
				t.Errorf("ucmatose did not complete:\nclient:\n%s\nserver:\n%s", co, so)
				break
			}
		}
		// 2 connections x 20 SENDs from B, their ACKs and the CM's MADs.
		if got := llRx(sa) - before; got < 40 {
			t.Errorf("host A's link-local socket received %d packets, want at least 40", got)
		} else {
			t.Logf("host A's link-local socket received %d packets", got)
		}
	})
	t.Run("rping-link-local", func(t *testing.T) {
		before := llRx(sa)
		co, so := pair(t, "rping", []string{"-s", "-a", llA + "%" + v.A.Name, "-p", "7497", "-C", "10", "-v"},
			[]string{"-c", "-a", llA + "%" + v.B.Name, "-p", "7497", "-C", "10", "-v"}, func() { waitListening(t, sa, 7497) })
		if !strings.Contains(co, "ping data: rdma-ping-9") || !strings.Contains(so, "server ping data: rdma-ping-9") {
			t.Errorf("rping did not complete 10 pings:\nclient:\n%s\nserver:\n%s", co, so)
		}
		if got := llRx(sa) - before; got < 20 {
			t.Errorf("host A's link-local socket received %d packets, want at least 20", got)
		} else {
			t.Logf("host A's link-local socket received %d packets", got)
		}
	})
	t.Run("udaddy-link-local", func(t *testing.T) {
		before := llRx(sa)
		co, so := pair(t, "udaddy", []string{"-b", llA + "%" + v.A.Name},
			[]string{"-s", llA + "%" + v.B.Name}, sleep(300*time.Millisecond))
		for _, o := range []string{co, so} {
			if !strings.Contains(o, "data transfers complete") || !strings.Contains(o, "return status 0") {
				t.Errorf("udaddy did not complete:\nclient:\n%s\nserver:\n%s", co, so)
				break
			}
		}
		if got := llRx(sa) - before; got < 10 {
			t.Errorf("host A's link-local socket received %d packets, want at least 10", got)
		} else {
			t.Logf("host A's link-local socket received %d packets", got)
		}
	})
	// UD over rdma_cm: the address handle of the ESTABLISHED event names
	// the source GID of the IPv4 address (index 1), not GID 0.
	t.Run("udaddy", func(t *testing.T) {
		co, so := pair(t, "udaddy", nil, []string{"-s", srvAddr}, sleep(300*time.Millisecond))
		for _, o := range []string{co, so} {
			if !strings.Contains(o, "data transfers complete") || !strings.Contains(o, "return status 0") {
				t.Errorf("udaddy did not complete:\n%s", o)
			}
		}
	})
}
