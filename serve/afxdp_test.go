package serve

import (
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/netnstest"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/nic/afxdp"
	"github.com/softroce/softroce/nic/udp"
	"github.com/softroce/softroce/verbs"
)

// startGroupInNS runs a daemon on link l (opened inside its namespace)
// whose socket the group may use, in a directory anyone may enter.
func startGroupInNS(t *testing.T, l nic.Link, group string) *Server {
	t.Helper()
	d, err := verbs.Open(l, nil)
	if err != nil {
		l.Close()
		t.Fatal(err)
	}
	return serveOn(t, []*verbs.Device{d}, Config{Socket: sharedSocket(t), Group: group})
}

// openAFXDPIn opens nic/afxdp on e's interface inside e's namespace, in
// the mode `softroce serve --backend afxdp` uses (native, else generic).
func openAFXDPIn(t *testing.T, e *netnstest.End) *afxdp.Link {
	t.Helper()
	var l *afxdp.Link
	e.NS.Run(t, func() (err error) {
		l, err = afxdp.Open(afxdp.Config{Interface: e.Name, Addr: e.Addr()})
		return err
	})
	return l
}

func openUDPIn(t *testing.T, e *netnstest.End) *udp.Link {
	t.Helper()
	var l *udp.Link
	e.NS.Run(t, func() (err error) {
		l, err = udp.Open(udp.Config{Addr: e.Addr(), Port: 4791})
		return err
	})
	return l
}

// nobodyIn starts programs as nobody:nogroup with no supplementary
// groups inside a namespace: `ip netns exec NS setpriv ... PROGRAM`.
type nobodyIn struct {
	setpriv, gid, lib string
	started           *atomic.Int32 // programs started
}

func nobody(t *testing.T, lib string) nobodyIn {
	t.Helper()
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("setpriv is not installed (Debian: util-linux)")
	}
	g, err := user.LookupGroup("nogroup")
	if err != nil {
		t.Skip("no group nogroup")
	}
	if u, err := user.LookupId("65534"); err != nil || u.Username != "nobody" {
		t.Skipf("uid 65534 is not nobody: %v", err)
	}
	// The library's directories must be searchable by nobody.
	for d := lib; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		os.Chmod(d, 0o755)
	}
	return nobodyIn{setpriv: setpriv, gid: g.Gid, lib: lib, started: new(atomic.Int32)}
}

func (n nobodyIn) start(t *testing.T, ns *netnstest.NS, s *Server, path string, args ...string) *toolProc {
	t.Helper()
	argv := append([]string{"netns", "exec", ns.Name, n.setpriv, "--reuid=65534", "--regid=" + n.gid, "--clear-groups", "--", path}, args...)
	p := &toolProc{cmd: exec.Command("ip", argv...), done: make(chan error, 1)}
	p.cmd.Env = env(s, n.lib)
	p.cmd.Stdout, p.cmd.Stderr = p, p
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	n.started.Add(1)
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() { p.cmd.Process.Kill() })
	return p
}

// uidWatch records, for every process the daemons serve, its name and
// real and effective uid (from /proc/PID/status).
type uidWatch struct {
	stop, done chan struct{}
	mu         sync.Mutex
	seen       map[int]string
}

func watchUIDs(ss ...*Server) *uidWatch {
	w := &uidWatch{stop: make(chan struct{}), done: make(chan struct{}), seen: map[int]string{}}
	go func() {
		defer close(w.done)
		for {
			for _, s := range ss {
				for _, c := range s.Status().Clients {
					w.mu.Lock()
					if _, ok := w.seen[c.PID]; !ok && c.PID != 0 {
						if who, ok := procUIDs(c.PID); ok {
							w.seen[c.PID] = who
						}
					}
					w.mu.Unlock()
				}
			}
			select {
			case <-w.stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	return w
}

func procUIDs(pid int) (string, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return "", false
	}
	var name, uids string
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Name:"); ok {
			name = strings.TrimSpace(v)
		}
		if v, ok := strings.CutPrefix(l, "Uid:"); ok {
			if f := strings.Fields(v); len(f) >= 2 {
				uids = f[0] + " " + f[1]
			}
		}
	}
	return name + " " + uids, name != "" && uids != ""
}

// check fails t unless the daemons served at least want processes (every
// program started: ip netns exec and setpriv exec it in place) and each
// ran as uid 65534, really and effectively.
func (w *uidWatch) check(t *testing.T, want int) {
	t.Helper()
	close(w.stop)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.seen) < want {
		t.Errorf("the daemons served %d processes they could see, want at least %d: %v", len(w.seen), want, w.seen)
	}
	for pid, who := range w.seen {
		if !strings.HasSuffix(who, " 65534 65534") {
			t.Errorf("client pid %d: %q, want uid and euid 65534", pid, who)
		}
	}
}

// bwRow returns the fields of perftest's result row for size bytes and
// iters iterations in out (nil when there is none).
func bwRow(out string, size, iters int) []string {
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) >= 4 && f[0] == strconv.Itoa(size) && f[1] == strconv.Itoa(iters) {
			return f
		}
	}
	return nil
}

// Two hosts, the daemon of host A on nic/afxdp (XDP on its veth end,
// AF_XDP sockets: the daemon is the only privileged process), the daemon
// of host B on nic/udp, the distribution's unmodified tools on both run
// as nobody through sockets group nogroup may use. Each tool runs with its
// server on either host: TCP and rdma_cm's MADs and the RDMA traffic all
// cross the veth.
func TestAFXDPDaemonUnprivilegedTools(t *testing.T) {
	netnstest.Require(t)
	_, lib := cmTool(t, "rping")
	nb := nobody(t, lib)
	v := netnstest.Pair(t, netnstest.VethConfig{MTU: 9000})
	xl := openAFXDPIn(t, v.A)
	sa := startGroupInNS(t, xl, "nogroup")
	sb := startGroupInNS(t, openUDPIn(t, v.B), "nogroup")
	w := watchUIDs(sa, sb)
	type host struct {
		name string
		ns   *netnstest.NS
		s    *Server
		addr string
	}
	hosts := [2]host{{"afxdp", v.A.NS, sa, v.A.Addr().String()}, {"udp", v.B.NS, sb, v.B.Addr().String()}}
	look := func(t *testing.T, name string) string {
		p, err := exec.LookPath(name)
		if err != nil {
			t.Skipf("%s is not installed", name)
		}
		return p
	}
	port := 18800
	// both runs name's server on each host in turn, its client on the
	// other; srvArgs and cliArgs may hold SRV for the server's address.
	both := func(t *testing.T, name string, srvArgs, cliArgs []string, listen func(t *testing.T, s *Server, port int), check func(t *testing.T, co, so string)) {
		p := look(t, name)
		for i, srv := range hosts {
			cli := hosts[1-i]
			t.Run("server-on-"+srv.name, func(t *testing.T) {
				port++
				sub := func(args []string) []string {
					out := make([]string, len(args))
					for i, a := range args {
						out[i] = strings.NewReplacer("SRV", srv.addr, "PORT", strconv.Itoa(port)).Replace(a)
					}
					return out
				}
				sp := nb.start(t, srv.ns, srv.s, p, sub(srvArgs)...)
				listen(t, srv.s, port)
				cp := nb.start(t, cli.ns, cli.s, p, sub(cliArgs)...)
				co := waitTool(t, cp, name+" client on the "+cli.name+" daemon")
				so := waitTool(t, sp, name+" server on the "+srv.name+" daemon")
				check(t, co, so)
				t.Logf("client: %s", lastLines(co, 2))
			})
		}
	}
	sleep := func(d time.Duration) func(*testing.T, *Server, int) {
		return func(*testing.T, *Server, int) { time.Sleep(d) }
	}
	cmListening := func(t *testing.T, s *Server, port int) { waitListening(t, s, uint16(port)) }

	t.Run("ibv_rc_pingpong", func(t *testing.T) {
		args := []string{"-g", "0", "-c", "-n", "300", "-p", "PORT"}
		both(t, "ibv_rc_pingpong", args, append(args, "SRV"), sleep(300*time.Millisecond), func(t *testing.T, co, so string) {
			for _, o := range []string{co, so} {
				if !strings.Contains(o, "300 iters in") || strings.Contains(o, "invalid data") {
					t.Errorf("ibv_rc_pingpong -c did not complete with valid data:\n%s", o)
				}
			}
		})
	})
	for _, c := range []struct {
		tool  string
		iters int
	}{{"ib_write_bw", 1000}, {"ib_read_bw", 300}} {
		t.Run(c.tool, func(t *testing.T) {
			args := []string{"-x", "0", "-s", "65536", "-n", strconv.Itoa(c.iters), "-p", "PORT"}
			both(t, c.tool, args, append(args, "SRV"), sleep(time.Second), func(t *testing.T, co, so string) {
				if bwRow(co, 65536, c.iters) == nil {
					t.Errorf("%s client printed no result row:\n%s\nserver:\n%s", c.tool, co, so)
				}
			})
		})
	}
	t.Run("rping", func(t *testing.T) {
		both(t, "rping", []string{"-s", "-a", "SRV", "-p", "PORT", "-C", "10", "-v"},
			[]string{"-c", "-a", "SRV", "-p", "PORT", "-C", "10", "-v"}, cmListening, func(t *testing.T, co, so string) {
				if !strings.Contains(co, "ping data: rdma-ping-9") || !strings.Contains(so, "server ping data: rdma-ping-9") {
					t.Errorf("rping did not complete 10 pings:\nclient:\n%s\nserver:\n%s", co, so)
				}
			})
	})
	w.check(t, int(nb.started.Load()))
	// Every peer was known to the kernel (the tools' TCP exchanges) before
	// RDMA traffic went to it, and the cache refreshes without a gap: the
	// AF_XDP link dropped nothing.
	st := xl.Stats()
	t.Logf("AF_XDP link (%s mode): %+v", xl.Mode(), st)
	if st.TxErrors != 0 || st.RxICRCBad != 0 || st.RxMalformed != 0 {
		t.Errorf("AF_XDP link: %d packets not sent, %d received with a bad ICRC, %d malformed", st.TxErrors, st.RxICRCBad, st.RxMalformed)
	}
}

// ib_write_bw, 64 KiB WRITEs, between a daemon on nic/afxdp and one on
// nic/udp over a veth pair (each direction), and between two daemons on
// nic/udp over another, interleaved round by round on the same machine.
// It only logs the figures. Run with SOFTROCE_PERF=1 -run AFXDPDaemonWriteBW -v.
func TestAFXDPDaemonWriteBW(t *testing.T) {
	if os.Getenv("SOFTROCE_PERF") != "1" {
		t.Skip("set SOFTROCE_PERF=1 to measure ib_write_bw through the AF_XDP and the UDP daemon")
	}
	netnstest.Require(t)
	p, lib := tool(t, "ib_write_bw")
	nb := nobody(t, lib)
	x := netnstest.Pair(t, netnstest.VethConfig{MTU: 9000})
	u := netnstest.Pair(t, netnstest.VethConfig{MTU: 9000})
	xa := startGroupInNS(t, openAFXDPIn(t, x.A), "nogroup")
	xb := startGroupInNS(t, openUDPIn(t, x.B), "nogroup")
	ua := startGroupInNS(t, openUDPIn(t, u.A), "nogroup")
	ub := startGroupInNS(t, openUDPIn(t, u.B), "nogroup")
	type path struct {
		name     string
		cli, srv *netnstest.End
		cs, ss   *Server
		gbits    []float64
	}
	paths := []*path{
		{name: "afxdp->udp", cli: x.A, srv: x.B, cs: xa, ss: xb},
		{name: "udp->afxdp", cli: x.B, srv: x.A, cs: xb, ss: xa},
		{name: "udp->udp", cli: u.A, srv: u.B, cs: ua, ss: ub},
	}
	const iters = 5000
	port := 18900
	for round := 0; round < 3; round++ {
		for _, pa := range paths {
			port++
			args := []string{"-x", "0", "-s", "65536", "-n", strconv.Itoa(iters), "-p", strconv.Itoa(port), "--report_gbits"}
			sp := nb.start(t, pa.srv.NS, pa.ss, p, args...)
			time.Sleep(time.Second)
			cp := nb.start(t, pa.cli.NS, pa.cs, p, append(args, pa.srv.Addr().String())...)
			co := waitTool(t, cp, "ib_write_bw client "+pa.name)
			waitTool(t, sp, "ib_write_bw server "+pa.name)
			row := bwRow(co, 65536, iters)
			if row == nil {
				t.Fatalf("%s: no result row:\n%s", pa.name, co)
			}
			g, err := strconv.ParseFloat(row[3], 64)
			if err != nil {
				t.Fatalf("%s: result row %q: %v", pa.name, row, err)
			}
			pa.gbits = append(pa.gbits, g)
		}
	}
	for _, pa := range paths {
		t.Logf("ib_write_bw 65536 B x %d, %s: %v Gbit/s (min %.2f, max %.2f)", iters, pa.name, pa.gbits, slices.Min(pa.gbits), slices.Max(pa.gbits))
	}
}
