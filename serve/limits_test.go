package serve

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/user"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/nic/pipe"
	"github.com/softroce/softroce/verbs"
)

// The limit tests run an attacker and a victim as child processes under
// distinct uids against a daemon in the test process. The attacker takes
// what one limit lets it, prints what it holds and keeps it until its
// stdin closes; the victim then has to be served.

const (
	attackerUID = 1001
	victimUID   = 1002
)

// peer is a child's connection to the daemon: the control protocol, raw,
// with a deadline on every answer (a daemon that stopped serving is a
// refusal, not a hang).
type peer struct{ c *net.UnixConn }

func dialPeer() (*peer, error) {
	d := net.Dialer{Timeout: 5 * time.Second}
	c, err := d.Dial("unixpacket", os.Getenv("SOFTROCE_SOCKET"))
	if err != nil {
		return nil, err
	}
	return &peer{c.(*net.UnixConn)}, nil
}

// call sends a request and returns the errno and body of the answer and
// the descriptors it carried; err is a broken or silent connection.
func (p *peer) call(op uint32, body []byte, fds ...int) (syscall.Errno, []byte, []int, error) {
	msg := append(u32s(op, 0), body...)
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	p.c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, _, err := p.c.WriteMsgUnix(msg, oob, nil); err != nil {
		return 0, nil, nil, err
	}
	buf := make([]byte, maxMsg)
	ob := make([]byte, unix.CmsgSpace(4*4))
	n, on, _, _, err := p.c.ReadMsgUnix(buf, ob)
	if err != nil {
		return 0, nil, nil, err
	}
	if n < sizeResp {
		return 0, nil, nil, fmt.Errorf("answer of %d bytes", n)
	}
	return syscall.Errno(le.Uint32(buf)), buf[sizeResp:n], parseFDs(ob[:on]), nil
}

// must is call for a request that has to succeed: it returns the
// answer's first word (a handle) and closes the descriptors.
func (p *peer) must(op uint32, body []byte, fds ...int) uint32 {
	e, b, rfds, err := p.call(op, body, fds...)
	closeAll(rfds)
	if err != nil || e != 0 {
		fmt.Printf("op %d: errno %v, %v\n", op, e, err)
		os.Exit(1)
	}
	if len(b) < 4 {
		return 0
	}
	return le.Uint32(b)
}

// holdUntilEOF reports what the attacker holds and keeps it until the
// test closes the child's stdin.
func holdUntilEOF(format string, a ...any) int {
	fmt.Printf(format+"\n", a...)
	io.Copy(io.Discard, os.Stdin)
	return 0
}

func sealedMemfd(size int) int {
	fd, err := unix.MemfdCreate("t", unix.MFD_ALLOW_SEALING)
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	unix.Ftruncate(fd, int64(size))
	unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK)
	return fd
}

func init() {
	// REG_MRs of 64 one-page extents at non-contiguous offsets of one
	// sparse memfd (costing the attacker nothing), until refused or
	// until it would hold more mappings than the kernel allows the
	// daemon.
	childRoles["fill-mappings"] = func() int {
		p, err := dialPeer()
		if err != nil {
			fmt.Println(err)
			return 1
		}
		p.must(opOpen, u32s(0, 0))
		pd := p.must(opAllocPD, nil)
		fd := sealedMemfd(2 * maxExtents * pageSize)
		fds := make([]int, maxExtents)
		for i := range fds {
			fds[i] = fd
		}
		limit := 65530
		if b, err := os.ReadFile("/proc/sys/vm/max_map_count"); err == nil {
			limit, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		}
		n := 0
		for ; n*maxExtents < limit+maxExtents; n++ {
			va := uint64(0x7e0000000000) + uint64(n)*maxExtents*pageSize
			ext := make([]extent, maxExtents)
			for i := range ext {
				ext[i] = extent{va: va + uint64(i)*pageSize, len: pageSize, off: uint64(2*i) * pageSize}
			}
			e, _, _, err := p.call(opRegMR, regMRBody(pd, va, maxExtents*pageSize, ext...), fds...)
			if err != nil {
				return holdUntilEOF("mrs %d extents %d err %v", n, n*maxExtents, err)
			}
			if e != 0 {
				return holdUntilEOF("mrs %d extents %d errno %d", n, n*maxExtents, e)
			}
		}
		return holdUntilEOF("mrs %d extents %d errno 0", n, n*maxExtents)
	}
	// A program's ordinary start: an MR and a CQ.
	childRoles["victim-mr-cq"] = func() int {
		p, err := dialPeer()
		if err != nil {
			fmt.Println(err)
			return 1
		}
		p.must(opOpen, u32s(0, 0))
		pd := p.must(opAllocPD, nil)
		fd := sealedMemfd(2 * pageSize)
		b, err := unix.Mmap(fd, 0, 2*pageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			fmt.Println(err)
			return 1
		}
		addr := uint64(uintptr(unsafePointer(b)))
		p.must(opRegMR, regMRBody(pd, addr, 2*pageSize, extent{addr, 2 * pageSize, 0}), fd)
		p.must(opCreateCQ, u32s(64, 0))
		fmt.Println("served")
		return 0
	}
}

// sharedDaemon runs a daemon (one device on an in-memory link) whose
// socket attackerUID and victimUID, in group nogroup, may use; it returns
// the group and a channel that receives what Serve returned.
func sharedDaemon(t *testing.T, c Config) (*Server, chan error, uint32) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to run the attacker and the victim as other users")
	}
	g, err := user.LookupGroup("nogroup")
	if err != nil {
		t.Skip("no group nogroup")
	}
	gid, _ := strconv.Atoi(g.Gid)
	a, b := pipe.New(pipe.Config{})
	b.Close()
	d, err := verbs.Open(a, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.Socket, c.Group = sharedSocket(t), "nogroup"
	s, err := New([]*verbs.Device{d}, c)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen(); err != nil {
		s.Close()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve() }()
	t.Cleanup(func() { s.Close() })
	return s, done, uint32(gid)
}

// stillServing fails the test if Serve returned.
func stillServing(t *testing.T, done chan error) {
	t.Helper()
	select {
	case err := <-done:
		t.Fatalf("Serve returned during the attack: %v", err)
	default:
	}
}

// attacker starts role as uid attackerUID and returns its first line of
// output; the role holds what it took until the test ends.
func startAttacker(t *testing.T, s *Server, gid uint32, role string) string {
	t.Helper()
	cmd := childCmd(t, role, &syscall.Credential{Uid: attackerUID, Gid: gid}, "SOFTROCE_SOCKET="+s.Socket())
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		in.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("attacker %s: %v", role, err)
	}
	t.Logf("attacker (uid %d): %s", attackerUID, strings.TrimSpace(line))
	return line
}

// victim runs role as uid victimUID to its end and fails the test unless
// it was served.
func victim(t *testing.T, s *Server, gid uint32, role string) {
	t.Helper()
	cmd := childCmd(t, role, &syscall.Credential{Uid: victimUID, Gid: gid}, "SOFTROCE_SOCKET="+s.Socket())
	done := make(chan struct{})
	var out []byte
	var err error
	go func() { out, err = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		<-done
	}
	if err != nil {
		t.Fatalf("victim (uid %d) %s: %v: %s", victimUID, role, err, out)
	}
}

// mapsLines is how many mappings the test process (the daemon) has.
func mapsLines(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "\n")
}

// fileMappings is how many of the process's mappings map fd's file: what
// one test made, whatever other tests and the runtime map meanwhile.
func fileMappings(t *testing.T, fd int) int {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	ino, n := strconv.FormatUint(st.Ino, 10), 0
	for _, l := range strings.Split(string(b), "\n") {
		// address perms offset dev inode path
		if f := strings.Fields(l); len(f) >= 6 && f[4] == ino && strings.HasPrefix(f[5], "/memfd:") {
			n++
		}
	}
	return n
}

func maxMapCount(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/sys/vm/max_map_count")
	if err != nil {
		t.Skip("no /proc/sys/vm/max_map_count")
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}

// One user's MRs of many one-page extents cannot take the daemon's
// mappings (issue 19, defect 2): it is refused with ENOMEM at its share,
// another user's REG_MR and CREATE_CQ still succeed, and the daemon's
// mappings stay under the cap.
func TestMappingsPerUser(t *testing.T) {
	s, done, gid := sharedDaemon(t, Config{})
	limit := maxMapCount(t)
	before := mapsLines(t)
	line := startAttacker(t, s, gid, "fill-mappings")
	var mrs, extents, e int
	if _, err := fmt.Sscanf(line, "mrs %d extents %d errno %d", &mrs, &extents, &e); err != nil {
		t.Fatalf("attacker: %s", line)
	}
	if syscall.Errno(e) != syscall.ENOMEM {
		t.Errorf("the attacker's REG_MR past its share: errno %v, want ENOMEM", syscall.Errno(e))
	}
	held := mapsLines(t)
	victim(t, s, gid, "victim-mr-cq")
	stillServing(t, done)
	share := DefaultLimits().MappingsPerUser
	if held-before > share {
		t.Errorf("the attacker's MRs made %d mappings, more than its share %d", held-before, share)
	}
	if held >= limit/2 {
		t.Errorf("the daemon has %d mappings, not under half of vm.max_map_count (%d)", held, limit)
	}
	if extents > share {
		t.Errorf("the attacker registered %d extents of one page, more than its share of %d mappings", extents, share)
	}
	if n := s.Stats().Refusals[limMappingsPerUser]; n == 0 {
		t.Errorf("no refusal counted for %s: %v", limMappingsPerUser, s.Stats().Refusals)
	}
	t.Logf("daemon mappings: %d before, %d with the attacker's share (%d mappings, %d MRs)", before, held, share, mrs)
}

func init() {
	// Connections, each with as many completion channels as the daemon
	// gives (the received pipe ends closed at once: the attacker keeps
	// one descriptor a connection), until a connection is refused or
	// goes unanswered.
	childRoles["fill-conns"] = func() int {
		var conns []*peer
		chans := 0
		for len(conns) < 4096 {
			p, err := dialPeer()
			if err != nil {
				return holdUntilEOF("conns %d chans %d errno 0 (%v)", len(conns), chans, err)
			}
			e, _, fds, err := p.call(opOpen, u32s(0, 0))
			closeAll(fds)
			if err != nil || e != 0 {
				return holdUntilEOF("conns %d chans %d errno %d (%v)", len(conns), chans, e, err)
			}
			conns = append(conns, p)
			for {
				e, _, fds, err := p.call(opCreateChannel, nil)
				closeAll(fds)
				if err != nil {
					return holdUntilEOF("conns %d chans %d errno 0 (%v)", len(conns), chans, err)
				}
				if e != 0 {
					break
				}
				chans++
			}
		}
		return holdUntilEOF("conns %d chans %d errno 0", len(conns), chans)
	}
	// A program with a completion channel: the daemon accepts it, gives
	// it a channel and a CQ on it.
	childRoles["victim-channel"] = func() int {
		p, err := dialPeer()
		if err != nil {
			fmt.Println(err)
			return 1
		}
		p.must(opOpen, u32s(0, 0))
		p.must(opAllocPD, nil)
		ch := p.must(opCreateChannel, nil)
		p.must(opCreateCQ, u32s(64, ch))
		fmt.Println("served")
		return 0
	}
}

// One user's connections and channels cannot take the daemon's
// descriptors, nor make it stop accepting (issue 19, defect 5): the
// attacker is refused with EMFILE, another user is served and Serve never
// returns.
func TestConnectionsPerUser(t *testing.T) {
	s, done, gid := sharedDaemon(t, Config{})
	fdsBefore := openFDs(t)
	line := startAttacker(t, s, gid, "fill-conns")
	var conns, chans, e int
	if _, err := fmt.Sscanf(line, "conns %d chans %d errno %d", &conns, &chans, &e); err != nil {
		t.Fatalf("attacker: %s", line)
	}
	held := openFDs(t) - fdsBefore
	if syscall.Errno(e) != syscall.EMFILE {
		t.Errorf("the attacker's connection past its share: errno %v, want EMFILE", syscall.Errno(e))
	}
	victim(t, s, gid, "victim-channel")
	stillServing(t, done)
	l := DefaultLimits()
	if held > l.FDsPerUser+16 { // 16: descriptors of the test itself
		t.Errorf("the attacker's %d connections and %d channels hold %d of the daemon's descriptors, more than its %d", conns, chans, held, l.FDsPerUser)
	}
	if st := s.Stats(); st.Refusals[limFDsPerUser] == 0 {
		t.Errorf("no refusal counted for %s: %v", limFDsPerUser, st.Refusals)
	}
	t.Logf("the attacker held %d connections, %d channels, %d descriptors of the daemon", conns, chans, held)
}

func openFDs(t *testing.T) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}

func init() {
	// QPs of the largest queues, until refused.
	childRoles["fill-queue-slots"] = func() int {
		p, err := dialPeer()
		if err != nil {
			fmt.Println(err)
			return 1
		}
		p.must(opOpen, u32s(0, 0))
		pd := p.must(opAllocPD, nil)
		cq := p.must(opCreateCQ, u32s(64, 0))
		n := 0
		for ; n < 64; n++ {
			e, _, fds, err := p.call(opCreateQP, u32s(pd, cq, cq, 2, maxRingWR, maxRingWR, 1, 1, 0, 0))
			closeAll(fds)
			if err != nil || e != 0 {
				return holdUntilEOF("qps %d errno %d", n, e)
			}
		}
		return holdUntilEOF("qps %d errno 0", n)
	}
	// A program that sizes its QP by what QUERY_DEVICE reports; then the
	// smallest QP.
	childRoles["victim-qp"] = func() int {
		p, err := dialPeer()
		if err != nil {
			fmt.Println(err)
			return 1
		}
		p.must(opOpen, u32s(0, 0))
		e, b, _, err := p.call(opQueryDevice, nil)
		if err != nil || e != 0 || len(b) < sizeDevAttr {
			fmt.Printf("QUERY_DEVICE: %v %v\n", e, err)
			return 1
		}
		maxQPWR := le.Uint32(b[16+4*4:])
		pd := p.must(opAllocPD, nil)
		cq := p.must(opCreateCQ, u32s(64, 0))
		qp := p.must(opCreateQP, u32s(pd, cq, cq, 2, maxQPWR, maxQPWR, 1, 1, 0, 0))
		p.must(opDestroyQP, u32s(qp, 0))
		p.must(opCreateQP, u32s(pd, cq, cq, 2, 1, 1, 1, 1, 0, 0))
		fmt.Println("served")
		return 0
	}
}

// One user's QPs cannot take a device's whole completion capacity (issue
// 19, defect 6): it gets its share, and another user still creates the
// smallest QP and one of the max_qp_wr QUERY_DEVICE reports.
func TestQueueSlotsPerUser(t *testing.T) {
	s, done, gid := sharedDaemon(t, Config{})
	line := startAttacker(t, s, gid, "fill-queue-slots")
	var qps, e int
	if _, err := fmt.Sscanf(line, "qps %d errno %d", &qps, &e); err != nil {
		t.Fatalf("attacker: %s", line)
	}
	if syscall.Errno(e) != syscall.ENOMEM {
		t.Errorf("the attacker's QP past its share: errno %v, want ENOMEM", syscall.Errno(e))
	}
	share := DefaultLimits().QueueSlotsPerUser
	if got := qps * 2 * maxRingWR; got > share {
		t.Errorf("the attacker holds %d queue slots, more than its share %d", got, share)
	}
	victim(t, s, gid, "victim-qp")
	stillServing(t, done)
	if n := s.Stats().Refusals[limQueueSlots]; n == 0 {
		t.Errorf("no refusal counted for %s", limQueueSlots)
	}
}

// Extents that continue each other in one memfd are one mapping, charged
// as one; extents that do not are one each. Unmapping gives the charge
// back and leaves no mapping.
func TestContiguousExtentsOneMapping(t *testing.T) {
	fd := memfd(t, 2*maxExtents*pageSize, true)
	fds := make([]int, maxExtents)
	for i := range fds {
		fds[i] = fd
	}
	for _, c := range []struct {
		name   string
		stride uint64 // offset step between extents, in pages
		want   int
	}{{"contiguous", 1, 1}, {"holes", 2, maxExtents}} {
		a, err := mmap(0, maxExtents*pageSize, unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS, -1, 0)
		if err != nil {
			t.Fatal(err)
		}
		munmap(a, maxExtents*pageSize)
		va := uint64(a)
		ext := make([]extent, maxExtents)
		for i := range ext {
			ext[i] = extent{va: va + uint64(i)*pageSize, len: pageSize, off: uint64(i) * c.stride * pageSize}
		}
		for _, pages := range []pageMap{nil, {}} {
			charged := 0
			before := fileMappings(t, fd)
			m, err := mapClientMem(&regMR{addr: va, length: maxExtents * pageSize, extents: ext}, fds, pages, func(n int) error { charged += n; return nil })
			if err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			if got := fileMappings(t, fd) - before; charged != c.want || got > charged {
				t.Errorf("%s (at the client's address: %v): charged %d mappings, want %d; %d made", c.name, pages != nil, charged, c.want, got)
			}
			charged -= m.unmap()
			if charged != 0 || fileMappings(t, fd) != before {
				t.Errorf("%s: after unmap %d mappings still charged, %d made", c.name, charged, fileMappings(t, fd)-before)
			}
		}
	}
}

// An accept that fails for want of descriptors does not end Serve: the
// daemon waits, accepts again and serves the connection once descriptors
// are free (issue 19, defect 5: Serve used to return EMFILE).
func TestAcceptOutOfDescriptorsRetries(t *testing.T) {
	s := startPipe(t) // Serve must return nil when the test ends
	var filler []int
	defer func() { closeAll(filler) }()
	for {
		fd, err := unix.Dup(0)
		if err != nil {
			break
		}
		filler = append(filler, fd)
	}
	if len(filler) == 0 {
		t.Fatal("no descriptor to fill the table with")
	}
	unix.Close(filler[len(filler)-1]) // the client's socket
	filler = filler[:len(filler)-1]
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: s.Socket(), Net: "unixpacket"})
	if err != nil {
		t.Fatalf("dial with the table full: %v", err)
	}
	defer c.Close()
	for deadline := time.Now().Add(10 * time.Second); s.Stats().AcceptErrors == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the daemon's accept never failed with the descriptor table full")
		}
	}
	closeAll(filler)
	filler = nil
	c.SetDeadline(time.Now().Add(10 * time.Second))
	r := &rawClient{t: t, c: c}
	r.open()
	if e, _, _ := r.call(opQueryDevice, nil); e != 0 {
		t.Fatalf("QUERY_DEVICE after the descriptors came back: %v", e)
	}
}

// A request over a limit gets the limit's errno; the daemon logs the
// limit once per client, naming the flag that raises it, and counts every
// refusal by the limit's name in Stats, whose JSON is snake_case.
func TestRefusalLoggedAndCounted(t *testing.T) {
	lg, logged := keptLog()
	s := startPipeOn(t, Config{Socket: t.TempDir() + "/s.sock", Log: lg, Limits: Limits{ChannelsPerConn: 1}})
	c := dial(t, s)
	c.open()
	c.handle(opCreateChannel, nil)
	for range 3 {
		if e, _, fds := c.call(opCreateChannel, nil); e != syscall.ENOMEM {
			closeAll(fds)
			t.Fatalf("a channel over --max-channels-per-conn 1: %v, want ENOMEM", e)
		}
	}
	if n := s.Stats().Refusals[limChannels]; n != 3 {
		t.Errorf("refusals of %s: %d, want 3", limChannels, n)
	}
	lines := logged()
	if n := strings.Count(lines, "--max-channels-per-conn"); n != 1 {
		t.Errorf("the limit is logged %d times, want once:\n%s", n, lines)
	}
	js := string(s.statusJSON(maxMsg, nil))
	for _, want := range []string{`"refusals":{"max-channels-per-conn":3}`, `"bad_requests":`, `"queue_full":`, `"accept_errors":`} {
		if !strings.Contains(js, want) {
			t.Errorf("status JSON has no %s: %s", want, js)
		}
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// What a connection was charged goes back when it closes: its user holds
// nothing once its last connection is gone.
func TestChargesReturnOnClose(t *testing.T) {
	s := startPipe(t)
	c := dial(t, s)
	c.open()
	pd := c.handle(opAllocPD, nil)
	c.regMem(pd, 3*pageSize)
	ch := c.handle(opCreateChannel, nil)
	cq := c.handle(opCreateCQ, u32s(16, ch))
	c.qp(pd, cq)
	c.handle(opCreateSRQ, u32s(pd, 16, 1, 0))
	g := s.led
	g.mu.Lock()
	u := *g.user(os.Getuid())
	g.mu.Unlock()
	if u.conns != 1 || u.fds != fdsPerConn+1 || u.maps != 4 { // the MR, the CQ, QP and SRQ rings
		t.Errorf("charged %+v, want 1 connection, %d descriptors, 4 mappings", u, fdsPerConn+1)
	}
	c.c.Close()
	for s.Stats().Clients != 0 {
		time.Sleep(time.Millisecond)
	}
	g.mu.Lock()
	users, fds, maps := len(g.users), g.fds, g.maps
	g.mu.Unlock()
	d := s.devs[0]
	d.mu.Lock()
	slots, reserved := len(d.userSlots), d.reserved
	d.mu.Unlock()
	if users != 0 || fds != 0 || maps != 0 || slots != 0 || reserved != 0 {
		t.Errorf("after the client left: %d users, %d descriptors, %d mappings, %d users' queue slots (%d reserved)", users, fds, maps, slots, reserved)
	}
}

// A user's CQ slots are bounded over all its connections, and a resize
// counts too.
func TestCQSlotsPerUser(t *testing.T) {
	a, b := pipe.New(pipe.Config{})
	b.Close()
	d, err := verbs.Open(a, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := serveOn(t, []*verbs.Device{d}, Config{Socket: t.TempDir() + "/s.sock", Limits: Limits{CQSlotsPerUser: 3 * maxCQSlots}})
	c1, c2 := dial(t, s), dial(t, s)
	c1.open()
	c2.open()
	c1.handle(opCreateCQ, u32s(maxCQSlots, 0))
	c1.handle(opCreateCQ, u32s(maxCQSlots, 0))
	small := c2.handle(opCreateCQ, u32s(maxCQSlots/2, 0))
	if e, _, fds := c2.call(opCreateCQ, u32s(maxCQSlots, 0)); e != syscall.ENOMEM {
		closeAll(fds)
		t.Errorf("a CQ over --max-cq-slots-per-user on the user's other connection: %v, want ENOMEM", e)
	}
	if e, _, fds := c2.call(opResizeCQ, u32s(small, maxCQSlots)); e != 0 {
		t.Errorf("resize within the share: %v", e)
	} else {
		closeAll(fds)
	}
	if e, _, fds := c2.call(opCreateCQ, u32s(1, 0)); e != syscall.ENOMEM {
		closeAll(fds)
		t.Errorf("a CQ after the resize took the rest of the share: %v, want ENOMEM", e)
	}
	if n := s.Stats().Refusals[limCQSlotsPerUser]; n != 2 {
		t.Errorf("refusals of %s: %d, want 2", limCQSlotsPerUser, n)
	}
}

// QUERY_DEVICE reports what the limits let a client reach, and a QP of
// the reported max_qp_wr is created.
func TestQueryDeviceReportsLimits(t *testing.T) {
	a, b := pipe.New(pipe.Config{})
	b.Close()
	d, err := verbs.Open(a, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := serveOn(t, []*verbs.Device{d}, Config{Socket: t.TempDir() + "/s.sock",
		Limits: Limits{QueueSlotsPerUser: 1000, QPsPerConn: 7, MRsPerConn: 9, CQSlotsPerConn: 5000}})
	c := dial(t, s)
	c.open()
	e, attr, _ := c.call(opQueryDevice, nil)
	if e != 0 {
		t.Fatal(e)
	}
	field := func(i int) uint32 { return le.Uint32(attr[16+4*i:]) }
	for _, f := range []struct {
		name string
		i    int
		want uint32
	}{{"max_qp", 3, 7}, {"max_qp_wr", 4, 256}, {"max_cqe", 7, 4096}, {"max_mr", 8, 9}, {"max_srq_wr", 13, 512}} {
		if got := field(f.i); got != f.want {
			t.Errorf("%s %d, want %d", f.name, got, f.want)
		}
	}
	pd := c.handle(opAllocPD, nil)
	cq := c.handle(opCreateCQ, u32s(field(7), 0))
	wr := field(4)
	if e, _, fds := c.call(opCreateQP, u32s(pd, cq, cq, 2, wr, wr, 1, 1, 0, 0)); e != 0 {
		t.Errorf("a QP of max_qp_wr %d: %v", wr, e)
	} else {
		closeAll(fds)
	}
}
