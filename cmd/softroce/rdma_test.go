package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/abitest"
	"github.com/softroce/softroce/nic/udp"
	"github.com/softroce/softroce/serve"
	"github.com/softroce/softroce/verbs"
)

func u32p(v uint32) *uint32 { return &v }
func u64p(v uint64) *uint64 { return &v }

// A fixed view, printed as rdma prints it: the lines, the words, the JSON
// keys in rdma's order; keys only where the daemon sent them.
func TestRdmaFormat(t *testing.T) {
	v := serve.RdmaView{
		Links: []serve.RdmaLink{{IfIndex: 0, Port: 1, IfName: "softroce0", NodeGUID: 0x020000ff7f000001, State: "ACTIVE", PhysicalState: "LINK_UP", Netdev: "lo", NetdevIndex: 1,
			MTU: 1024, GIDs: []string{"::ffff:127.0.0.1"}, Counters: []serve.Counter{{Name: "rcvd_pkts", Value: 7}, {Name: "sent_pkts", Value: 9}}}},
		Summary: []serve.RdmaSummary{{IfName: "softroce0", PD: 1, CQ: 2, QP: 1, MR: 2, Ctx: 1}},
		QPs: []serve.RdmaQP{{Port: 1, IfName: "softroce0", LQPN: 17, PDN: 1, RQPN: 18, Type: "RC", State: "RTS", RQPSN: 5, SQPSN: 6,
			PathMig: "MIGRATED", PID: 42, Comm: "ibv_rc_pingpong", DstAddr: "10.0.0.2", Counters: []serve.Counter{{Name: "retransmitted_pkts", Value: 3}}}},
		CQs: []serve.RdmaCQ{{IfName: "softroce0", CQE: 256, Users: 2, PID: 42, Comm: "ibv_rc_pingpong", CQN: 3}},
		MRs: []serve.RdmaMR{
			{IfName: "softroce0", RKey: u32p(0x1234), LKey: u32p(0x1234), IOVA: u64p(0x7f0000001000), MRLen: 4096, PID: 42, Comm: "ibv_rc_pingpong", MRN: 2, PDN: 1},
			{IfName: "softroce0", MRLen: 8192, PID: 43, Comm: "other", MRN: 4, PDN: 1},
		},
	}
	for _, c := range []struct {
		words []string
		o     rdmaOpts
		want  string
	}{
		{[]string{"dev"}, rdmaOpts{}, "0: softroce0: node_type ca node_guid 0200:00ff:7f00:0001 sys_image_guid 0200:00ff:7f00:0001 \n"},
		{[]string{"dev", "show", "softroce0"}, rdmaOpts{json: true},
			`[{"ifindex":0,"ifname":"softroce0","node_type":"ca","node_guid":"0200:00ff:7f00:0001","sys_image_guid":"0200:00ff:7f00:0001"}]` + "\n"},
		{[]string{"link"}, rdmaOpts{}, "0/1: softroce0/1: state ACTIVE physical_state LINK_UP netdev lo mtu 1024 gid ::ffff:127.0.0.1 \n"},
		{[]string{"link", "show", "softroce1/1"}, rdmaOpts{}, ""},
		{[]string{"link"}, rdmaOpts{json: true},
			`[{"ifindex":0,"port":1,"ifname":"softroce0/1","state":"ACTIVE","physical_state":"LINK_UP","netdev":"lo","netdev_index":1,"mtu":1024,"gids":["::ffff:127.0.0.1"]}]` + "\n"},
		{[]string{"stat"}, rdmaOpts{}, "link softroce0/1 rcvd_pkts 7 sent_pkts 9 \n"},
		{[]string{"statistic", "show", "link", "softroce0/1"}, rdmaOpts{json: true}, `[{"ifindex":0,"port":1,"ifname":"softroce0","rcvd_pkts":7,"sent_pkts":9}]` + "\n"},
		{[]string{"res"}, rdmaOpts{}, "0: softroce0: pd 1 cq 2 qp 1 mr 2 ctx 1 srq 0 \n"},
		{[]string{"resource", "show", "qp"}, rdmaOpts{},
			"link softroce0/1 lqpn 17 pdn 1 rqpn 18 type RC state RTS rq-psn 5 sq-psn 6 path-mig-state MIGRATED pid 42 comm ibv_rc_pingpong dst-addr 10.0.0.2 \n"},
		{[]string{"res", "qp", "lqpn", "18"}, rdmaOpts{}, ""},
		{[]string{"res", "qp"}, rdmaOpts{details: true},
			"link softroce0/1 lqpn 17 pdn 1 rqpn 18 type RC state RTS rq-psn 5 sq-psn 6 path-mig-state MIGRATED pid 42 comm ibv_rc_pingpong dst-addr 10.0.0.2 retransmitted_pkts 3 \n"},
		{[]string{"res", "qp"}, rdmaOpts{json: true},
			`[{"ifindex":0,"port":1,"ifname":"softroce0","lqpn":17,"pdn":1,"rqpn":18,"type":"RC","state":"RTS","rq-psn":5,"sq-psn":6,"path-mig-state":"MIGRATED","pid":42,"comm":"ibv_rc_pingpong","dst-addr":"10.0.0.2","retransmitted_pkts":3}]` + "\n"},
		{[]string{"res", "cq"}, rdmaOpts{}, "dev softroce0 cqe 256 users 2 pid 42 comm ibv_rc_pingpong cqn 3 \n"},
		{[]string{"res", "mr", "pid", "43"}, rdmaOpts{}, "dev softroce0 mrlen 8192 pid 43 comm other mrn 4 pdn 1 \n"},
		{[]string{"res", "mr"}, rdmaOpts{json: true},
			`[{"ifindex":0,"ifname":"softroce0","rkey":4660,"lkey":4660,"iova":139637976731648,"mrlen":4096,"pid":42,"comm":"ibv_rc_pingpong","mrn":2,"pdn":1},` +
				`{"ifindex":0,"ifname":"softroce0","mrlen":8192,"pid":43,"comm":"other","mrn":4,"pdn":1}]` + "\n"},
		{[]string{"res", "mr", "pid", "42"}, rdmaOpts{},
			"dev softroce0 rkey 0x1234 lkey 0x1234 iova 0x7f0000001000 mrlen 4096 pid 42 comm ibv_rc_pingpong mrn 2 pdn 1 \n"},
		{[]string{"res", "cq", "dev", "nosuch"}, rdmaOpts{json: true}, "[]\n"},
	} {
		q, err := parseRdmaWords(c.words)
		if err != nil {
			t.Errorf("%v: %v", c.words, err)
			continue
		}
		var b bytes.Buffer
		writeRdma(&b, v, q, c.o)
		if b.String() != c.want {
			t.Errorf("softroce rdma %v (%+v):\n got %q\nwant %q", c.words, c.o, b.String(), c.want)
		}
		if c.o.json && !json.Valid(b.Bytes()) {
			t.Errorf("softroce rdma -j %v: not JSON: %s", c.words, b.Bytes())
		}
	}
}

// Words rdma would not take are usage errors (exit 2), before the daemon
// is asked.
func TestRdmaUsageErrors(t *testing.T) {
	for _, args := range [][]string{{}, {"nosuch"}, {"link", "show", "a", "b"}, {"res", "qp", "lqpn"}, {"res", "qp", "lqpn", "x"},
		{"res", "cq", "lqpn", "1"}, {"link", "softroce0/x"}, {"stat", "pid", "1"}} {
		var code int
		_, errOut := runOut(t, func() { code = run(append([]string{"rdma", "--socket", "/nonexistent"}, args...)) })
		if code != 2 || !strings.Contains(errOut, "Usage") {
			t.Errorf("softroce rdma %v: exit %d, want 2 and the usage:\n%s", args, code, errOut)
		}
	}
	var code int
	_, errOut := runOut(t, func() { code = run([]string{"rdma", "--socket", filepath.Join(t.TempDir(), "none.sock"), "link"}) })
	if code != 1 || errOut == "" {
		t.Errorf("softroce rdma with no daemon: exit %d, %q; want 1 and why", code, errOut)
	}
}

// startDaemon runs a daemon on 127.0.0.1:port whose QPs send to remote
// until the test ends.
func startDaemon(t *testing.T, port, remote int) *serve.Server {
	t.Helper()
	l, err := udp.Open(udp.Config{Addr: netip.MustParseAddr("127.0.0.1"), Port: port})
	if err != nil {
		t.Fatal(err)
	}
	d, err := verbs.Open(l, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := serve.New([]*verbs.Device{d}, serve.Config{Socket: filepath.Join(t.TempDir(), "s.sock"), RemotePort: uint16(remote)})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen(); err != nil {
		s.Close()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve() }()
	t.Cleanup(func() { s.Close(); <-done })
	return s
}

// softroce rdma on a live pair: two daemons and ibv_rc_pingpong between
// them. The QP lines have rdma's words with the peer's QPN, the link and
// statistic lines theirs, and the counters grow between two looks.
func TestRdmaLivePair(t *testing.T) {
	p, lib := abitest.Tool(t, "ibv_rc_pingpong", "ibverbs-utils")
	x, y := freePort("udp"), freePort("udp")
	s1, s2 := startDaemon(t, x, y), startDaemon(t, y, x)
	port := fmt.Sprint(freePort("tcp"))
	pp := func(s *serve.Server, args ...string) *exec.Cmd {
		cmd := exec.Command(p, append([]string{"-g", "0", "-p", port, "-n", "100000000"}, args...)...)
		cmd.Env = append(os.Environ(), "SOFTROCE_SOCKET="+s.Socket(), "LD_LIBRARY_PATH="+lib)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd
	}
	srv := pp(s1)
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		// ibv_rc_pingpong takes its first connection for the peer: a
		// probe would be one, so watch the socket table.
		if listening(port) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("ibv_rc_pingpong server did not listen")
		}
	}
	cli := pp(s2, "127.0.0.1")
	rdma := func(s *serve.Server, args ...string) string {
		t.Helper()
		var code int
		out, errOut := runOut(t, func() { code = run(append([]string{"rdma", "--socket", s.Socket()}, args...)) })
		if code != 0 {
			t.Fatalf("softroce rdma %v: exit %d: %s", args, code, errOut)
		}
		return out
	}
	re := regexp.MustCompile(`^link softroce0/1 lqpn (\d+) pdn \d+ rqpn (\d+) type RC state RTS rq-psn \d+ sq-psn \d+ path-mig-state MIGRATED pid (\d+) comm ibv_rc_pingpong dst-addr 127\.0\.0\.1 \n$`)
	var m1, m2 []string
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		a, b := rdma(s1, "res", "show", "qp"), rdma(s2, "resource", "qp")
		if m1, m2 = re.FindStringSubmatch(a), re.FindStringSubmatch(b); m1 != nil && m2 != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no RTS QP lines after a minute:\n%s%s", a, b)
		}
	}
	if m1[2] != m2[1] || m2[2] != m1[1] || m1[3] != fmt.Sprint(srv.Process.Pid) || m2[3] != fmt.Sprint(cli.Process.Pid) {
		t.Errorf("QPs %v and %v: each one's rqpn must be the other's lqpn, pids %d and %d", m1, m2, srv.Process.Pid, cli.Process.Pid)
	}
	if l := rdma(s1, "link"); !regexp.MustCompile(`^0/1: softroce0/1: state ACTIVE physical_state LINK_UP netdev lo mtu \d+ gid ::ffff:127\.0\.0\.1 \n$`).MatchString(l) {
		t.Errorf("softroce rdma link: %q", l)
	}
	if d := rdma(s1, "dev"); d != "0: softroce0: node_type ca node_guid 0200:00ff:7f00:0001 sys_image_guid 0200:00ff:7f00:0001 \n" {
		t.Errorf("softroce rdma dev: %q (ibv_devinfo's node_guid of 127.0.0.1's device is 0200:00ff:7f00:0001)", d)
	}
	sent := func() uint64 {
		var st []map[string]any
		if err := json.Unmarshal([]byte(rdma(s1, "-j", "statistic")), &st); err != nil || len(st) != 1 {
			t.Fatalf("softroce rdma -j statistic: %v %v", st, err)
		}
		return uint64(st[0]["sent_pkts"].(float64))
	}
	first := sent()
	for deadline := time.Now().Add(time.Minute); sent() <= first; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("sent_pkts stays %d", first)
		}
	}
	t.Logf("\n%s%s%s%s%s", rdma(s1, "link"), rdma(s1, "res"), rdma(s1, "res", "qp"), rdma(s1, "res", "cq"), rdma(s1, "stat"))
}

// listening reports whether a socket listens on TCP port (from the
// socket table, which a probe connection would not disturb).
func listening(port string) bool {
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, _ := os.ReadFile(f)
		for _, l := range strings.Split(string(b), "\n")[1:] {
			fs := strings.Fields(l)
			if len(fs) > 3 && fs[3] == "0A" && strings.HasSuffix(strings.ToUpper(fs[1]), fmt.Sprintf(":%04X", atoiPort(port))) {
				return true
			}
		}
	}
	return false
}

func atoiPort(p string) int {
	var n int
	fmt.Sscan(p, &n)
	return n
}
