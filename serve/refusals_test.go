package serve

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// startPipeLogged is startPipe with the daemon's log kept: logged returns
// what it wrote so far.
func startPipeLogged(t *testing.T) (s *Server, logged func() string) {
	t.Helper()
	lg, logged := keptLog()
	return startPipeOn(t, Config{Socket: t.TempDir() + "/s.sock", Log: lg}), logged
}

// whoAmI is how the daemon names this process in its log.
func whoAmI(t *testing.T) string {
	comm, err := os.ReadFile("/proc/self/comm")
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("client pid %d (uid %d, %s)", os.Getpid(), os.Getuid(), strings.TrimSpace(string(comm)))
}

// A refused request is logged with the client, the request's name, the
// errno's name and message and what was wrong; a WQE an SRQ refuses is
// logged too. A refusal by a limit keeps its own line (limited).
func TestRefusedRequestLogged(t *testing.T) {
	s, logged := startPipeLogged(t)
	c := dial(t, s)
	c.open()
	gid := c.gid0()
	if e, _, _ := c.call(opCreateAH, ahBody(99, 1, 0, 0, 64, 0, 0, 1, gid)); e != syscall.EINVAL {
		t.Fatalf("CREATE_AH on no PD: %v, want EINVAL", e)
	}
	modify := append(u32s(999, uint32(attrState)), (&qpAttrWire{state: 6}).encode(nil)...)
	if e, _, _ := c.call(opModifyQP, modify); e != syscall.EINVAL {
		t.Fatalf("MODIFY_QP of no QP: %v, want EINVAL", e)
	}
	if e, _, _ := c.raw(u32s(77, 0)); e != syscall.EINVAL {
		t.Fatalf("op 77: %v, want EINVAL", e)
	}
	if e, _, _ := c.call(opDestroySRQ, u32s(5, 0)); e != syscall.EINVAL {
		t.Fatalf("DESTROY_SRQ of none: %v, want EINVAL", e)
	}
	pd := c.handle(opAllocPD, nil)
	ring, _, resp := c.srq(pd, 4)
	bad := s.Stats().BadWQEs
	store32(ring, offRQProd, 100)
	waitBad(s, bad)

	who := whoAmI(t)
	var out string
	for range 1000 { // the SRQ's line is written by the poller
		if out = logged(); strings.Contains(out, "SRQ ") {
			break
		}
		time.Sleep(time.Millisecond)
	}
	for _, want := range []string{
		who + " refused CREATE_AH: EINVAL: invalid argument (no PD 99)\n",
		who + " refused MODIFY_QP: EINVAL: invalid argument (no QP 999)\n",
		who + " refused op 77: EINVAL: invalid argument (malformed request: unknown op 77)\n",
		who + " refused DESTROY_SRQ: EINVAL: invalid argument (no SRQ 5)\n",
		fmt.Sprintf("%s SRQ %d: producer index out of range; the WQE is dropped\n", who, le.Uint32(resp[4:])),
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the log has no line %q:\n%s", want, out)
		}
	}
}

// A client flooding the daemon with refused requests gets at most
// refusalBurst lines a refusalWindow; its next line logged says how many
// were left out, and so does its connection's close. Another client's
// lines are its own.
func TestRefusalLogRateLimited(t *testing.T) {
	s, logged := startPipeLogged(t)
	who := whoAmI(t)
	modify := func(c *rawClient, h uint32) {
		body := append(u32s(h, uint32(attrState)), (&qpAttrWire{state: 6}).encode(nil)...)
		if e, _, _ := c.call(opModifyQP, body); e != syscall.EINVAL {
			t.Fatalf("MODIFY_QP of no QP: %v, want EINVAL", e)
		}
	}
	lineRE := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(who) + ` refused MODIFY_QP: EINVAL: invalid argument \(no QP (\d+)\)(?:; (\d+) earlier refusals not logged)?$`)

	const flood = 300
	a := dial(t, s)
	a.open()
	began := time.Now()
	for i := range flood {
		modify(a, 1000+uint32(i))
	}
	windows := int(time.Since(began)/refusalWindow) + 1
	lines := lineRE.FindAllStringSubmatch(logged(), -1)
	if len(lines) == 0 || len(lines) > refusalBurst*windows {
		t.Fatalf("%d refusals in %d windows of %v logged %d lines, want 1 to %d", flood, windows, refusalWindow, len(lines), refusalBurst*windows)
	}
	t.Logf("%d refusals in %v: %d lines", flood, time.Since(began), len(lines))

	// Another client is not held back by the first one's flood.
	b := dial(t, s)
	b.open()
	modify(b, 5000)
	if !strings.Contains(logged(), who+" refused MODIFY_QP: EINVAL: invalid argument (no QP 5000)\n") {
		t.Errorf("another client's refusal is not logged:\n%s", logged())
	}

	time.Sleep(refusalWindow)
	modify(a, 9999)
	lines = lineRE.FindAllStringSubmatch(logged(), -1)
	last := lines[len(lines)-1]
	if last[1] != "9999" || last[2] == "" {
		t.Fatalf("the first line after the window does not count the refusals left out: %q", last[0])
	}
	shown := 0
	for _, l := range lines {
		if l[1] != "5000" {
			shown++
		}
	}
	if left, _ := strconv.Atoi(last[2]); shown+left != flood+1 {
		t.Errorf("%d lines logged and %d said left out, want %d refusals in all", shown, left, flood+1)
	}

	// Left out when the connection closes: said then.
	for i := range 2 * refusalBurst {
		modify(b, 6000+uint32(i))
	}
	b.c.Close()
	closed := regexp.MustCompile(regexp.QuoteMeta(who) + ` closed; (\d+) refusals not logged`)
	var m []string
	for range 2000 {
		if m = closed.FindStringSubmatch(logged()); m != nil {
			break
		}
		unix.Nanosleep(&unix.Timespec{Nsec: 1e6}, nil)
	}
	if m == nil || m[1] == "0" {
		t.Errorf("the closing client's refusals left out are not said:\n%s", logged())
	}
}

// The log names every op of enum sr_op as the headers do, without SR_OP_.
func TestOpNamesMatchHeaders(t *testing.T) {
	re := regexp.MustCompile(`(?m)^\s*SR_OP_([A-Z0-9_]+) = (\d+),`)
	n := 0
	for _, h := range []string{"softroce_proto.h", "softroce_cm.h"} {
		b, err := os.ReadFile("../abi/c/" + h)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range re.FindAllStringSubmatch(string(b), -1) {
			op, _ := strconv.Atoi(m[2])
			if h == "softroce_cm.h" && op > opCMKnownLast {
				continue // an op the daemon does not serve yet
			}
			n++
			if got := requestName(u32s(uint32(op))); got != m[1] {
				t.Errorf("op %d is logged as %s, the header names it SR_OP_%s", op, got, m[1])
			}
		}
	}
	if n != len(opNames)-1 { // STATUS has no SR_OP_ name
		t.Errorf("the headers name %d ops, the log %d besides STATUS", n, len(opNames)-1)
	}
}

// One user's many clients share a budget of refusalUserBurst lines a
// window: opening connections does not buy more log lines. What is left
// out is counted, by the clients still open and for the closed ones.
func TestRefusalLogPerUser(t *testing.T) {
	s, logged := startPipeLogged(t)
	who := whoAmI(t)
	const clients = 4 * refusalUserBurst
	began := time.Now()
	for i := range clients {
		c := dial(t, s)
		c.open()
		body := append(u32s(uint32(7000+i), uint32(attrState)), (&qpAttrWire{state: 6}).encode(nil)...)
		if e, _, _ := c.call(opModifyQP, body); e != syscall.EINVAL {
			t.Fatalf("MODIFY_QP of no QP: %v, want EINVAL", e)
		}
	}
	windows := int(time.Since(began)/refusalWindow) + 1
	lines := regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(who)+` refused MODIFY_QP: `).FindAllString(logged(), -1)
	if len(lines) == 0 || len(lines) > refusalUserBurst*windows {
		t.Fatalf("%d clients of one user refused once each in %d windows: %d lines, want 1 to %d", clients, windows, len(lines), refusalUserBurst*windows)
	}
	t.Logf("%d clients refused once each in %v: %d lines", clients, time.Since(began), len(lines))
}
