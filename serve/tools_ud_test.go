package serve

import (
	"bufio"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/softroce/softroce/nic/udp"
	"github.com/softroce/softroce/verbs"
)

// Two unmodified ibv_ud_pingpong, ibv_uc_pingpong and ibv_srq_pingpong
// processes on one daemon, polling and on completion channels (-e): UD
// QPs with address handles and the GRH at the head of each receive, UC
// QPs, and 16 RC QPs sharing one SRQ per side.
func TestIbvUDUCSRQPingpong(t *testing.T) {
	for _, c := range []struct {
		tool  string
		size  int
		extra []string
	}{
		{"ibv_ud_pingpong", 1024, nil},
		{"ibv_ud_pingpong", 2048, []string{"-e"}},
		{"ibv_uc_pingpong", 4096, nil},
		{"ibv_uc_pingpong", 4096, []string{"-e"}},
		{"ibv_srq_pingpong", 4096, nil},
		{"ibv_srq_pingpong", 4096, []string{"-e", "-q", "4"}},
	} {
		t.Run(fmt.Sprintf("%s/%d%s", c.tool, c.size, strings.Join(c.extra, "")), func(t *testing.T) {
			p, lib := tool(t, c.tool)
			s := startUDP(t)
			const iters = 500
			srv, cli := runPair(t, s, lib, p, iters, append([]string{"-s", fmt.Sprint(c.size)}, c.extra...)...)
			cli.wait(t, c.tool+" client")
			srv.wait(t, c.tool+" server")
			want := fmt.Sprintf("%d bytes in", 2*iters*c.size)
			for _, pp := range []*pingpong{srv, cli} {
				o := pp.output()
				if !strings.Contains(o, want) || !strings.Contains(o, fmt.Sprintf("%d iters in", iters)) {
					t.Errorf("no %q line:\n%s", want, o)
				}
				t.Logf("%s", lastLines(o, 2))
			}
			for s.Stats().Clients != 0 {
				time.Sleep(time.Millisecond)
			}
			if n := s.QPs(); n != 0 {
				t.Errorf("%d QPs left after both programs exited", n)
			}
			if st := s.Stats(); st.BadWQEs != 0 || st.BadRequests != 0 {
				t.Errorf("daemon refused something: %+v", st)
			}
		})
	}
}

// SRQ (limit event through ibv_get_async_event, no ibv_post_recv on a QP
// on it, no destroy under a QP) and UD (the GRH at the head of the
// receive, src_qp, ibv_create_ah_from_wc) from a C program.
func TestCProgramUDSRQ(t *testing.T) { runC(t, "udsrq.c") }

// perftest over UD and UC, and the UD, UC and SRQ pingpongs, between two
// daemons on two UDP ports: UD datagrams follow the QP's remote port too.
func TestTwoDaemonsUDUC(t *testing.T) {
	for _, c := range []struct {
		tool string
		args []string
	}{
		{"ib_send_bw", []string{"-c", "UD", "-x", "0", "-s", "1024", "-n", "200"}},
		{"ib_write_bw", []string{"-c", "UC", "-x", "0", "-s", "65536", "-n", "500"}},
		{"ibv_ud_pingpong", []string{"-g", "0", "-s", "1024", "-n", "200"}},
		{"ibv_uc_pingpong", []string{"-g", "0", "-s", "4096", "-n", "200"}},
		{"ibv_srq_pingpong", []string{"-g", "0", "-s", "4096", "-n", "200"}},
	} {
		t.Run(c.tool+"/"+strings.Join(c.args[:2], ""), func(t *testing.T) {
			_, lib := tool(t, "ibv_devinfo")
			p, err := exec.LookPath(c.tool)
			if err != nil {
				t.Skipf("%s is not installed (Debian: apt-get install perftest ibverbs-utils)", c.tool)
			}
			x, y := freeUDPPort(t), freeUDPPort(t)
			s1, s2 := startPorts(t, x, y), startPorts(t, y, x)
			tcp := fmt.Sprint(freeTCPPort(t))
			args := append([]string{"-p", tcp}, c.args...)
			srv := startPingpong(t, s1, lib, p, args...)
			waitTCPListen(t, srv, tcp)
			cli := startPingpong(t, s2, lib, p, append(args, "127.0.0.1")...)
			cli.wait(t, c.tool+" client")
			srv.wait(t, c.tool+" server")
			want := "#bytes"
			if strings.HasPrefix(c.tool, "ibv_") {
				want = "200 iters in"
			}
			for _, pp := range []*pingpong{srv, cli} {
				if !strings.Contains(pp.output(), want) {
					t.Errorf("no %q line:\n%s", want, pp.output())
				}
			}
			t.Logf("%s", lastLines(cli.output(), 3))
		})
	}
}

// ibv_post_recv on a UD QP returns only once the daemon has taken the
// receive: with the data path stopped it does not return; once it runs,
// it does.
func TestUDPostRecvWaitsForDaemon(t *testing.T) {
	_, lib := tool(t, "ibv_devinfo")
	bin := filepath.Join(t.TempDir(), "prog")
	if out, err := exec.Command("gcc", "-O1", "-o", bin, filepath.Join("testdata", "udpost.c"), "-L"+lib, "-l:libibverbs.so.1").CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	s := startUDP(t)
	cmd := exec.Command(bin)
	cmd.Env = env(s, lib)
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	lines := make(chan string, 2)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	if l := <-lines; l != "ready" {
		t.Fatalf("program said %q", l)
	}
	d := s.devs[0]
	d.mu.Lock() // the poller and the doorbell goroutine stop here
	in.Write([]byte("go\n"))
	select {
	case l := <-lines:
		d.mu.Unlock()
		t.Fatalf("ibv_post_recv returned (%q) before the daemon took the receive", l)
	case <-time.After(300 * time.Millisecond):
	}
	d.mu.Unlock()
	if l := <-lines; l != "posted" {
		t.Fatalf("program said %q", l)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
}

// The UD and SRQ C program on an IPv6 device: the GRH is the IPv6 header,
// which ibv_create_ah_from_wc reads back; and ibv_ud_pingpong over ::1.
func TestUDIPv6(t *testing.T) {
	p, lib := tool(t, "ibv_ud_pingpong")
	port := freeUDPPort(t)
	l, err := udp.Open(udp.Config{Addr: netip.MustParseAddr("::1"), Port: port})
	if err != nil {
		t.Skipf("open ::1: %v", err)
	}
	d, err := verbs.Open(l, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := start(t, d, uint16(port))
	bin := filepath.Join(t.TempDir(), "prog")
	if out, err := exec.Command("gcc", "-O1", "-o", bin, filepath.Join("testdata", "udsrq.c"), "-L"+lib, "-l:libibverbs.so.1").CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	cmd := exec.Command(bin)
	cmd.Env = env(s, lib)
	if out, err := cmd.CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("udsrq over IPv6: %v\n%s", err, out)
	}
	tcp := fmt.Sprint(freeTCPPort(t))
	args := []string{"-g", "0", "-p", tcp, "-n", "200", "-s", "1024"}
	srv := startPingpong(t, s, lib, p, args...)
	time.Sleep(200 * time.Millisecond)
	cli := startPingpong(t, s, lib, p, append(args, "localhost")...)
	cli.wait(t, "client")
	srv.wait(t, "server")
	if o := cli.output(); !strings.Contains(o, "GID ::1") || !strings.Contains(o, "200 iters in") {
		t.Errorf("no IPv6 exchange:\n%s", o)
	}
}
