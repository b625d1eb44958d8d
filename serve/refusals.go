package serve

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Refused requests and WQEs are logged, so that whoever runs the daemon
// can tell which request of which program failed and why; a client that
// keeps failing (a hostile one, or a loop retrying) gets at most
// refusalBurst lines a refusalWindow, the lines it would have had beyond
// that counted and said with its next line logged, or when it closes.
// A user's clients together get at most refusalUserBurst lines a window,
// so that one user opening many connections cannot flood the log either.
const (
	refusalBurst     = 5
	refusalUserBurst = 20
	refusalWindow    = time.Second
)

// refusalBudget is the daemon's per-user rate limit of refusal lines, over
// every client of the user. It grows by one entry a uid ever refused.
type refusalBudget struct {
	mu    sync.Mutex
	users map[int]*refusalWindowCount
}

type refusalWindowCount struct {
	start time.Time
	n     int
	// closed counts the refusals of the user's closed clients whose
	// closing line the budget kept out; the user's next line says them.
	closed int
}

// take reports whether uid may log one more line at now.
func (b *refusalBudget) take(uid int, now time.Time) bool {
	ok, _ := b.takeCarried(uid, now, 0)
	return ok
}

// takeCarried is take, and also hands over (and clears) the count of
// refusals of the user's closed clients not logged; a line refused here
// adds carry to that count instead.
func (b *refusalBudget) takeCarried(uid int, now time.Time, carry int) (bool, int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.users == nil {
		b.users = map[int]*refusalWindowCount{}
	}
	w := b.users[uid]
	if w == nil {
		w = &refusalWindowCount{}
		b.users[uid] = w
	}
	if now.Sub(w.start) >= refusalWindow {
		w.start, w.n = now, 0
	}
	if w.n >= refusalUserBurst {
		w.closed += carry
		return false, 0
	}
	w.n++
	closed := w.closed
	w.closed = 0
	return true, closed
}

// refusalLog is one client's rate limit of refusal lines. Requests and the
// poller (refused WQEs) both log through it.
type refusalLog struct {
	mu         sync.Mutex
	start      time.Time // of the current window
	n          int       // lines logged in it
	suppressed int       // lines not logged since the last one
	comm       string    // the client's command name, read at its first line
	commRead   bool
}

// opNames are the request names of enum sr_op (softroce_proto.h,
// softroce_cm.h) without their SR_OP_ prefix.
var opNames = map[uint32]string{
	opHello: "HELLO", opOpen: "OPEN", opQueryDevice: "QUERY_DEVICE", opQueryPort: "QUERY_PORT", opQueryGID: "QUERY_GID",
	opAllocPD: "ALLOC_PD", opDeallocPD: "DEALLOC_PD", opRegMR: "REG_MR", opDeregMR: "DEREG_MR", opCreateCQ: "CREATE_CQ",
	opDestroyCQ: "DESTROY_CQ", opCreateQP: "CREATE_QP", opModifyQP: "MODIFY_QP", opQueryQP: "QUERY_QP", opDestroyQP: "DESTROY_QP",
	opCreateChannel: "CREATE_CHANNEL", opDestroyChannel: "DESTROY_CHANNEL", opStatus: "STATUS",
	opCreateAH: "CREATE_AH", opDestroyAH: "DESTROY_AH", opCreateSRQ: "CREATE_SRQ", opModifySRQ: "MODIFY_SRQ",
	opQuerySRQ: "QUERY_SRQ", opDestroySRQ: "DESTROY_SRQ", opRdmaView: "RDMA_VIEW",
	opCMOpen: "CM_OPEN", opCMCreateID: "CM_CREATE_ID", opCMDestroyID: "CM_DESTROY_ID", opCMBind: "CM_BIND",
	opCMResolveAddr: "CM_RESOLVE_ADDR", opCMResolveRoute: "CM_RESOLVE_ROUTE", opCMListen: "CM_LISTEN", opCMConnect: "CM_CONNECT",
	opCMAccept: "CM_ACCEPT", opCMReject: "CM_REJECT", opCMDisconnect: "CM_DISCONNECT", opCMGetEvent: "CM_GET_EVENT",
	opCMAttachQP: "CM_ATTACH_QP", opCMDetachQP: "CM_DETACH_QP", opCMQuery: "CM_QUERY", opCMMigrateID: "CM_MIGRATE_ID",
	opAllocMW: "ALLOC_MW", opDeallocMW: "DEALLOC_MW", opRegMRIOVA: "REG_MR_IOVA",
	opResizeCQ: "RESIZE_CQ", opResizeSRQ: "RESIZE_SRQ",
}

// requestName names the request msg holds: its op's name, else its number.
func requestName(msg []byte) string {
	if len(msg) < 4 {
		return "a message of " + strconv.Itoa(len(msg)) + " bytes"
	}
	op := le.Uint32(msg)
	if n, ok := opNames[op]; ok {
		return n
	}
	return "op " + strconv.FormatUint(uint64(op), 10)
}

// errnoText is an errno as its name and message: "EINVAL: invalid
// argument".
func errnoText(e syscall.Errno) string {
	name := unix.ErrnoName(e)
	if name == "" {
		name = "errno " + strconv.Itoa(int(e))
	}
	return name + ": " + e.Error()
}

// refusedRequest logs a request the daemon answered with an error: the
// request's name, the errno the client got and what was wrong. Not
// logged here: EAGAIN (CM_GET_EVENT with no event: an answer, not a
// refusal) and refusals by a limit, which limited logs once a client and
// limit, naming the flag that raises it.
func (c *client) refusedRequest(req string, err error) {
	var r *refusal
	e := errno(err)
	if e == syscall.EAGAIN || errors.As(err, &r) {
		return
	}
	line := "refused " + req + ": " + errnoText(e)
	if why := strings.TrimPrefix(strings.TrimPrefix(err.Error(), e.Error()), ": "); why != "" {
		line += " (" + strings.TrimPrefix(why, "serve: ") + ")"
	}
	c.logRefusal(line)
}

// logRefusal logs one refusal line of the client, as the rate limit lets
// it.
func (c *client) logRefusal(line string) {
	l := &c.rlog
	l.mu.Lock()
	now := time.Now()
	if now.Sub(l.start) >= refusalWindow {
		l.start, l.n = now, 0
	}
	if l.n >= refusalBurst {
		l.suppressed++
		l.mu.Unlock()
		return
	}
	ok, closed := c.s.refusalBudget.takeCarried(c.uid, now, 0)
	if !ok {
		l.suppressed++
		l.mu.Unlock()
		return
	}
	l.n++
	dropped := l.suppressed
	l.suppressed = 0
	who := c.whoLocked()
	l.mu.Unlock()
	if dropped > 0 {
		line += fmt.Sprintf("; %d earlier refusals not logged", dropped)
	}
	if closed > 0 {
		line += fmt.Sprintf("; %d refusals of this user's closed clients not logged", closed)
	}
	c.s.log.Printf("client %s %s", who, line)
}

// refusalsNotLogged says how many refusals of a closing client the rate
// limit kept out of the log since its last line.
func (c *client) refusalsNotLogged() {
	l := &c.rlog
	l.mu.Lock()
	dropped := l.suppressed
	l.suppressed = 0
	who := ""
	if dropped > 0 {
		who = c.whoLocked()
	}
	l.mu.Unlock()
	if dropped == 0 {
		return
	}
	if ok, closed := c.s.refusalBudget.takeCarried(c.uid, time.Now(), dropped); ok {
		if closed > 0 {
			c.s.log.Printf("client %s closed; %d refusals not logged; %d refusals of this user's closed clients not logged", who, dropped, closed)
			return
		}
		c.s.log.Printf("client %s closed; %d refusals not logged", who, dropped)
	}
}

// whoLocked names the client for the log: "pid 4242 (uid 1000,
// ibv_rc_pingpong)". The command name is read once, at the client's
// first line, not for every connection. c.rlog.mu is held.
func (c *client) whoLocked() string {
	l := &c.rlog
	if !l.commRead {
		l.commRead = true
		if c.pid > 0 {
			if b, err := os.ReadFile("/proc/" + strconv.Itoa(c.pid) + "/comm"); err == nil {
				l.comm = strings.TrimSpace(string(b))
			}
		}
	}
	s := fmt.Sprintf("pid %d (uid %d", c.pid, c.uid)
	if l.comm != "" {
		s += ", " + l.comm
	}
	return s + ")"
}
