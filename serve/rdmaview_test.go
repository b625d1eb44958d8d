package serve

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/nic/impair"
	"github.com/softroce/softroce/nic/udp"
	"github.com/softroce/softroce/verbs"
)

func init() {
	// rdma-view prints the rdma views of the daemon on SOFTROCE_SOCKET as
	// its uid sees them.
	childRoles["rdma-view"] = func() int {
		v, err := QueryRdma(os.Getenv("SOFTROCE_SOCKET"))
		if err != nil {
			fmt.Println("error", err)
			return 1
		}
		b, _ := json.Marshal(v)
		fmt.Println(string(b))
		return 0
	}
}

// A view larger than one control message comes in pages, each object
// once; the owner sees its MRs' keys; a client does not see itself.
// RDMA_VIEW with flags is refused, and one asked past the end answers an
// empty page.
func TestRdmaViewPages(t *testing.T) {
	s := startPipe(t)
	// Two clients: pages end inside the first one's objects and inside
	// the second's, and a page may start past a whole client.
	const nMR, nCQ = 30, 20
	keys := map[uint32]bool{}
	var r *rawClient
	for range 2 {
		r = dial(t, s)
		r.open()
		pd := r.handle(opAllocPD, nil)
		for range nMR / 2 {
			_, key := r.regMem(pd, 4096)
			keys[key] = true
		}
		for range nCQ / 2 {
			r.cqRing(16)
		}
	}
	v, err := QueryRdma(s.Socket())
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := json.Marshal(v); len(b) <= maxMsg {
		t.Fatalf("the view is %d bytes, not more than one message: the test does not page", len(b))
	}
	if len(v.MRs) != nMR || len(v.CQs) != nCQ || len(v.Links) != 1 || len(v.Summary) != 1 {
		t.Fatalf("view: %d MRs, %d CQs, %d links, %d summaries; want %d, %d, 1, 1", len(v.MRs), len(v.CQs), len(v.Links), len(v.Summary), nMR, nCQ)
	}
	for _, m := range v.MRs {
		if m.LKey == nil || m.RKey == nil || !keys[*m.LKey] || m.MRLen != 4096 || m.PID != os.Getpid() {
			t.Errorf("MR %+v: want one of ours, once, with its keys, 4096 bytes, our pid %d", m, os.Getpid())
		}
		delete(keys, *m.LKey)
	}
	if sm := v.Summary[0]; sm.MR != nMR || sm.CQ != nCQ || sm.PD != 2 || sm.Ctx != 2 {
		t.Errorf("summary %+v", sm)
	}
	// Page by page: each starts where the last ended, and together they
	// hold every object once.
	pages, items := 0, 0
	asker := dial(t, s)
	for from := 0; ; {
		pages++
		e, b, _ := asker.call(opRdmaView, u32s(uint32(from), 0))
		var p rdmaPage
		if err := json.Unmarshal(b, &p); e != 0 || err != nil || p.Total != 2+nMR+nCQ || p.Next <= from && p.Next != p.Total {
			t.Fatalf("RDMA_VIEW from %d: %v %v %s", from, e, err, b)
		}
		if len(b) > maxMsg-sizeResp || len(p.Items) != p.Next-from {
			t.Fatalf("RDMA_VIEW from %d: %d bytes, %d items to %d", from, len(b), len(p.Items), p.Next)
		}
		items += len(p.Items)
		if p.Next == p.Total {
			break
		}
		from = p.Next
	}
	if pages < 3 || items != 2+nMR+nCQ {
		t.Errorf("%d pages of %d items; want at least 3 pages of %d", pages, items, 2+nMR+nCQ)
	}
	t.Logf("%d pages", pages)
	// A client that opened a device does not see itself (as STATUS).
	e, b, _ := r.call(opRdmaView, u32s(0, 0))
	var own rdmaPage
	if err := json.Unmarshal(b, &own); e != 0 || err != nil || own.Total != 2+nMR/2+nCQ/2 {
		t.Errorf("RDMA_VIEW on a client with objects: %v %v, total %d, want %d (the other client's and the port)", e, err, own.Total, 2+nMR/2+nCQ/2)
	}
	if e, _, _ := r.call(opRdmaView, u32s(0, 1)); e != syscall.EINVAL {
		t.Errorf("RDMA_VIEW with flags: %v, want EINVAL", e)
	}
	e, b, _ = r.call(opRdmaView, u32s(1<<31, 0))
	var p rdmaPage
	if err := json.Unmarshal(b, &p); e != 0 || err != nil || len(p.Items) != 0 || p.Next != p.Total {
		t.Errorf("RDMA_VIEW past the end: %v %v %s", e, err, b)
	}
}

// startGroupPorts is startPorts for a daemon that nogroup's members use.
func startGroupPorts(t *testing.T, port, remote int) *Server {
	t.Helper()
	l, err := udp.Open(udp.Config{Addr: netip.MustParseAddr("127.0.0.1"), Port: port})
	if err != nil {
		t.Fatal(err)
	}
	d, err := verbs.Open(l, nil)
	if err != nil {
		t.Fatal(err)
	}
	return serveOn(t, []*verbs.Device{d}, Config{Socket: sharedSocket(t), Group: "nogroup", RemotePort: uint16(remote)})
}

// The rdma views on a live pair: two daemons, and between them two
// ibv_rc_pingpong pairs, one run by root, one by nobody. Each daemon shows
// both servers' (or clients') QPs to root, RC in RTS with the peer's QPN
// and address, the process's pid and comm; the port and QP counters move
// while they run; nobody sees only nobody's objects; root sees nobody's
// MR without its keys.
func TestRdmaViewLivePair(t *testing.T) {
	p, lib := tool(t, "ibv_rc_pingpong")
	if os.Geteuid() != 0 {
		t.Skip("needs root to run programs as other users")
	}
	g, err := user.LookupGroup("nogroup")
	if err != nil {
		t.Skip("no group nogroup")
	}
	gid, _ := strconv.Atoi(g.Gid)
	for d := lib; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		os.Chmod(d, 0o755)
	}
	x, y := freeUDPPort(t), freeUDPPort(t)
	s1, s2 := startGroupPorts(t, x, y), startGroupPorts(t, y, x)
	nobody := &syscall.Credential{Uid: 65534, Gid: uint32(gid)}

	type pair struct{ srv, cli *pingpong }
	start := func(cred *syscall.Credential) pair {
		port := fmt.Sprint(freeTCPPort(t))
		// Many iterations: the pair runs while the test looks, and is
		// killed when it ends.
		args := []string{"-g", "0", "-p", port, "-n", "100000000"}
		srv := startPingpongAs(t, s1, lib, cred, p, args...)
		waitTCPListen(t, srv, port)
		return pair{srv, startPingpongAs(t, s2, lib, cred, p, append(args, "127.0.0.1")...)}
	}
	mine, theirs := start(nil), start(nobody)
	pid := func(pp *pingpong) int { return pp.cmd.Process.Pid }

	// Both daemons show both pairs' QPs in RTS once they exchange.
	var v1, v2 RdmaView
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		if v1, err = QueryRdma(s1.Socket()); err != nil {
			t.Fatal(err)
		}
		if v2, err = QueryRdma(s2.Socket()); err != nil {
			t.Fatal(err)
		}
		if rts(v1) == 2 && rts(v2) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no two RTS QPs on each daemon after a minute:\n%+v\n%+v\n%s\n%s", v1.QPs, v2.QPs, mine.cli.output(), theirs.cli.output())
		}
	}
	for _, pr := range []pair{mine, theirs} {
		a, b := qpOf(t, v1, pid(pr.srv)), qpOf(t, v2, pid(pr.cli))
		for _, c := range []struct {
			q, peer RdmaQP
		}{{a, b}, {b, a}} {
			if c.q.Type != "RC" || c.q.State != "RTS" || c.q.RQPN != c.peer.LQPN || c.q.DstAddr != "127.0.0.1" || c.q.Comm != "ibv_rc_pingpong" || c.q.PathMig != "MIGRATED" {
				t.Errorf("QP %+v: want RC, RTS, MIGRATED, rqpn %d (its peer's lqpn), dst-addr 127.0.0.1, comm ibv_rc_pingpong", c.q, c.peer.LQPN)
			}
		}
	}
	if n := v1.Links[0]; n.State != "ACTIVE" || n.PhysicalState != "LINK_UP" || n.Netdev != "lo" || n.MTU < 1024 || len(n.GIDs) != 1 || n.GIDs[0] != "::ffff:127.0.0.1" {
		t.Errorf("link %+v: want ACTIVE, LINK_UP, netdev lo, an MTU, GID ::ffff:127.0.0.1", n)
	}

	// The counters move while the programs run.
	before := v1
	var after RdmaView
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		if after, err = QueryRdma(s1.Socket()); err != nil {
			t.Fatal(err)
		}
		q0, q1 := qpOf(t, before, pid(mine.srv)), qpOf(t, after, pid(mine.srv))
		if counter(after.Links[0].Counters, "sent_pkts") > counter(before.Links[0].Counters, "sent_pkts") &&
			counter(after.Links[0].Counters, "rcvd_bytes") > counter(before.Links[0].Counters, "rcvd_bytes") &&
			counter(q1.Counters, "sent_pkts") > counter(q0.Counters, "sent_pkts") && q1.SQPSN != q0.SQPSN && q1.RQPSN != q0.RQPSN {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("counters and PSNs still after a minute:\n%+v\n%+v\n%+v\n%+v", before.Links[0].Counters, after.Links[0].Counters, q0, q1)
		}
	}

	// Root sees nobody's MR, but not its keys; its own with them.
	for _, m := range after.MRs {
		own := m.PID == pid(mine.srv)
		if own != (m.LKey != nil) || own != (m.RKey != nil) || own != (m.IOVA != nil) || m.MRLen == 0 {
			t.Errorf("root's view of MR %+v (pid %d; root's program is %d): keys must show to their owner only", m, m.PID, pid(mine.srv))
		}
	}
	if len(after.MRs) != 2 || len(after.CQs) != 2 || after.Summary[0].Ctx != 2 {
		t.Errorf("root sees %d MRs, %d CQs, %d contexts; want both programs': 2, 2, 2", len(after.MRs), len(after.CQs), after.Summary[0].Ctx)
	}

	// Nobody sees nobody's objects only, with their keys.
	out, err := childCmd(t, "rdma-view", nobody, "SOFTROCE_SOCKET="+s1.Socket()).Output()
	if err != nil {
		t.Fatalf("rdma-view as nobody: %v\n%s", err, out)
	}
	var nv RdmaView
	if err := json.Unmarshal(out, &nv); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if len(nv.QPs) != 1 || nv.QPs[0].PID != pid(theirs.srv) || nv.QPs[0].UID != 65534 || nv.QPs[0].State != "RTS" {
		t.Errorf("nobody's QPs: %+v; want only its program's (pid %d)", nv.QPs, pid(theirs.srv))
	}
	if len(nv.MRs) != 1 || nv.MRs[0].PID != pid(theirs.srv) || nv.MRs[0].LKey == nil {
		t.Errorf("nobody's MRs: %+v; want only its program's, with its keys", nv.MRs)
	}
	for _, c := range nv.CQs {
		if c.PID != pid(theirs.srv) {
			t.Errorf("nobody sees root's CQ %+v", c)
		}
	}
	if len(nv.Links) != 1 || nv.Summary[0].QP != 1 || nv.Summary[0].Ctx != 1 {
		t.Errorf("nobody's links %+v, summary %+v: want the port and only its own QP and context", nv.Links, nv.Summary)
	}
}

func rts(v RdmaView) int {
	n := 0
	for _, q := range v.QPs {
		if q.State == "RTS" {
			n++
		}
	}
	return n
}

func qpOf(t *testing.T, v RdmaView, pid int) RdmaQP {
	t.Helper()
	for _, q := range v.QPs {
		if q.PID == pid {
			return q
		}
	}
	t.Fatalf("no QP of pid %d in %+v", pid, v.QPs)
	return RdmaQP{}
}

func counter(cs []Counter, name string) uint64 {
	for _, c := range cs {
		if c.Name == name {
			return c.Value
		}
	}
	return 0
}

// The port counters name what the link and the engine count: a packet
// with a bad ICRC is rx_icrc_encapsulated (mlx5's name), one for no QP
// rx_unknown_qp; both are rcvd_pkts and rcvd_bytes only if delivered.
func TestRdmaViewLinkCounters(t *testing.T) {
	s := startUDP(t)
	dl, ok := s.devs[0].v.Link().(*udp.Link)
	if !ok {
		t.Fatalf("the daemon's link is a %T", s.devs[0].v.Link())
	}
	a, err := udp.Open(udp.Config{Addr: netip.MustParseAddr("127.0.0.1"), Port: freeUDPPort(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	out := make([]nic.Packet, 2)
	for i := range out {
		b := make([]byte, 64)
		// BTH: RC SEND_ONLY, P_Key 0xFFFF, a QP no one has, then the ICRC.
		b[0], b[2], b[3], b[5], b[6], b[7] = 0x04, 0xff, 0xff, 0x12, 0x34, 0x56
		out[i] = nic.Packet{Buf: b, N: bth.BTHLen + bth.ICRCLen, Remote: dl.LocalAddrPort()}
		if err := a.PutICRC(&out[i]); err != nil {
			t.Fatal(err)
		}
	}
	out[1].Buf[out[1].N-1] ^= 1
	if n, err := a.SendRaw(out); n != 2 || err != nil {
		t.Fatalf("SendRaw: %d, %v", n, err)
	}
	var c []Counter
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		v, err := QueryRdma(s.Socket())
		if err != nil {
			t.Fatal(err)
		}
		c = v.Links[0].Counters
		if counter(c, "rx_icrc_encapsulated") == 1 && counter(c, "rx_unknown_qp") == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("port counters %+v: want rx_icrc_encapsulated 1, rx_unknown_qp 1", c)
		}
	}
	if counter(c, "rcvd_pkts") != 1 || counter(c, "rcvd_bytes") != uint64(bth.BTHLen+bth.ICRCLen) || counter(c, "sent_pkts") != 0 {
		t.Errorf("port counters %+v: want the one delivered packet of %d bytes, none sent", c, bth.BTHLen+bth.ICRCLen)
	}
}

// Over a lossy path the error counters move, and a port keeps them after
// the programs' QPs are gone: ibv_rc_pingpong between two daemons, one
// of which drops 3% of what it sends, then the port counters of both.
func TestRdmaViewCountsLoss(t *testing.T) {
	p, lib := tool(t, "ibv_rc_pingpong")
	x, y := freeUDPPort(t), freeUDPPort(t)
	open := func(port int, loss float64) *verbs.Device {
		l, err := udp.Open(udp.Config{Addr: netip.MustParseAddr("127.0.0.1"), Port: port})
		if err != nil {
			t.Fatal(err)
		}
		var nl nic.Link = l
		if loss > 0 {
			nl = impair.Wrap(l, impair.Config{Loss: loss, Seed: 7})
		}
		d, err := verbs.Open(nl, nil)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	s1, s2 := start(t, open(x, 0.03), uint16(y)), start(t, open(y, 0), uint16(x))
	port := fmt.Sprint(freeTCPPort(t))
	args := []string{"-g", "0", "-p", port, "-n", "500"}
	srv := startPingpong(t, s1, lib, p, args...)
	waitTCPListen(t, srv, port)
	cli := startPingpong(t, s2, lib, p, append(args, "127.0.0.1")...)
	cli.wait(t, "ibv_rc_pingpong client")
	srv.wait(t, "ibv_rc_pingpong server")
	sum := map[string]uint64{}
	for _, s := range []*Server{s1, s2} {
		v, err := QueryRdma(s.Socket())
		if err != nil {
			t.Fatal(err)
		}
		if v.Summary[0].QP != 0 || len(v.QPs) != 0 {
			t.Fatalf("QPs left after the programs exited: %+v", v.QPs)
		}
		for _, c := range v.Links[0].Counters {
			sum[c.Name] += c.Value
		}
		t.Logf("%+v", v.Links[0].Counters)
	}
	if sum["retransmitted_pkts"] == 0 || sum["local_ack_timeout_err"] == 0 || sum["duplicate_request"] == 0 {
		t.Errorf("after 500 round trips over 3%% loss: retransmitted_pkts %d, local_ack_timeout_err %d, duplicate_request %d; want each above 0",
			sum["retransmitted_pkts"], sum["local_ack_timeout_err"], sum["duplicate_request"])
	}
}
