package serve

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

func init() {
	// statusOwn makes an RC QP of its own, then asks STATUS on a
	// connection that has not opened a device ("before" and the JSON)
	// and on one that has ("after" and the JSON).
	childRoles["status-own"] = func() int {
		fail := func(err error) int { fmt.Println("error", err); return 1 }
		own, err := childDial()
		if err != nil {
			return fail(err)
		}
		_, qpn, _, err := own.rcQP()
		if err != nil {
			return fail(err)
		}
		fmt.Println("qpn", qpn)
		ask := func(c *childConn) (string, error) {
			e, b, _, err := c.call(opStatus, nil)
			if err == nil && e != 0 {
				err = fmt.Errorf("STATUS: %v", e)
			}
			return string(b), err
		}
		c, err := childDial()
		if err != nil {
			return fail(err)
		}
		b, err := ask(c)
		if err != nil {
			return fail(err)
		}
		fmt.Println("before", b)
		if err := c.open(); err != nil {
			return fail(err)
		}
		if b, err = ask(c); err != nil {
			return fail(err)
		}
		fmt.Println("after", b)
		// Stay, with the QP, until the test ends: root's STATUS looks
		// for it after this line.
		bufio.NewReader(os.Stdin).ReadString('\n')
		return 0
	}
}

// STATUS shows a user its own uid's clients and only a count of the
// others; root sees everyone's, with their uids.
func TestStatusOthersOnlyToRoot(t *testing.T) {
	s, u1001, u1002 := otherUsers(t)
	sock := "SOFTROCE_SOCKET=" + s.Socket()
	vcmd := childCmd(t, "hijack-victim", u1001, sock)
	_, vout := piped(t, vcmd)
	l := expectLine(t, vout, "qpn ", 30*time.Second)
	vqpn, _ := strconv.Atoi(strings.TrimPrefix(l, "qpn "))
	vpid := vcmd.Process.Pid

	ocmd := childCmd(t, "status-own", u1002, sock)
	_, oout := piped(t, ocmd)
	l = expectLine(t, oout, "qpn ", 30*time.Second)
	oqpn, _ := strconv.Atoi(strings.TrimPrefix(l, "qpn "))
	opid := ocmd.Process.Pid
	for _, when := range []string{"before", "after"} {
		l := expectLine(t, oout, when+" ", 30*time.Second)
		var st Status
		if err := json.Unmarshal([]byte(strings.TrimPrefix(l, when+" ")), &st); err != nil {
			t.Fatalf("STATUS %s OPEN: %v", when, err)
		}
		var own bool
		for _, c := range st.Clients {
			if c.UID != int(u1002.Uid) || c.PID == vpid {
				t.Errorf("STATUS %s OPEN as uid 1002 lists uid %d's pid %d", when, c.UID, c.PID)
			}
			for _, q := range c.QPs {
				if q.QPN == uint32(vqpn) {
					t.Errorf("STATUS %s OPEN as uid 1002 shows uid 1001's QP %d", when, vqpn)
				}
				own = own || q.QPN == uint32(oqpn) && c.PID == opid
			}
		}
		if !own {
			t.Errorf("STATUS %s OPEN as uid 1002 does not show its own QP %d: %+v", when, oqpn, st.Clients)
		}
		if st.OtherClients != 1 {
			t.Errorf("STATUS %s OPEN as uid 1002 counts %d clients of other users, want 1 (the victim's)", when, st.OtherClients)
		}
	}

	st, err := QueryStatus(s.Socket())
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	for _, c := range st.Clients {
		for _, q := range c.QPs {
			if q.QPN == uint32(vqpn) && c.PID == vpid && c.UID == int(u1001.Uid) ||
				q.QPN == uint32(oqpn) && c.PID == opid && c.UID == int(u1002.Uid) {
				seen[c.UID] = true
			}
		}
	}
	if !seen[1001] || !seen[1002] || st.OtherClients != 0 {
		t.Errorf("root's STATUS: %+v, other clients %d; want both users' QPs with their uids and pids", st.Clients, st.OtherClients)
	}
}
