// Package serve is the softroce daemon: it owns verbs devices the way a
// RNIC does and lets unmodified libibverbs programs use them through the
// C library in abi/.
//
// Each client process talks to the daemon over a Unix SOCK_SEQPACKET
// socket (one connection per ibv_context) for control: open a device,
// allocate PDs, register memory, create CQs and QPs, modify and query
// them. Work requests and completions never cross the socket: each QP has
// a send and a receive ring and each CQ a completion ring in shared memory
// (memfds the daemon creates and the client maps). The library writes
// WQEs and bumps a producer index; one poller goroutine per device moves
// them into verbs PostSend/PostRecv (and sends the packets they make
// itself, in verbs Device.Batch). Completions are written into the CQ
// rings as the transport produces them (a push hook on the device's verbs
// CQs), and the library polls those without a system call. The library rings
// a doorbell (an eventfd per connection) only when the poller said, in the
// QP's shared control page, that it is going to sleep.
//
// Registered memory is the client's own: the library moves the
// registered pages into sealed memfds mapped over the same addresses and
// passes them with SCM_RIGHTS; the daemon maps them and registers that
// mapping with verbs (docs/abi.md says what this costs and where it fails).
//
// Every request is untrusted. Handles are per connection, so another
// client's handles do not exist for a client; lengths, counts, indices,
// SGEs and memfds are checked before use. When a connection closes (the
// process exited or was killed), its QPs are moved to ERR and destroyed,
// then its MRs are deregistered (verbs waits for in-flight accesses) and
// only then unmapped.
package serve

import (
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/softroce/softroce/verbs"
)

// Config configures a Server.
type Config struct {
	// Socket is the Unix socket path; when empty, $SOFTROCE_SOCKET, else
	// SocketFor(the daemon's uid). Its directory must be the daemon's
	// user's and writable by no one else (Listen checks).
	Socket string
	// Group, when set, is the group that may use the daemon: the socket
	// becomes mode 0770 owned by that group. Otherwise it is 0700: only
	// the daemon's user.
	Group string
	// RemotePort, when set, is the UDP port every QP sends to (peers
	// listen on a port other than 4791, as a daemon started with
	// --udp-port and its peers do).
	RemotePort uint16
	// Log receives a line per closed device context and per refusal by
	// a limit; nil discards.
	Log *log.Logger
	// Limits bound what clients can make the daemon hold (zero fields:
	// DefaultLimits).
	Limits Limits
}

// Stats count what the daemon saw.
type Stats struct {
	Clients     int    `json:"clients"`      // connections open now
	Accepted    uint64 `json:"accepted"`     // connections ever accepted
	BadRequests uint64 `json:"bad_requests"` // malformed or refused requests
	BadWQEs     uint64 `json:"bad_wqes"`     // WQEs that moved their QP to ERR
	Overruns    uint64 `json:"overruns"`     // CQEs dropped on a full client CQ ring
	Backstops   uint64 `json:"backstops"`    // poller sleeps that ended on the backstop timer
	QueueFull   uint64 `json:"queue_full"`   // WQEs verbs refused as over the QP's capacity (retried)
	// AcceptErrors counts accepts that failed (descriptors or memory
	// short): the daemon waits and accepts again.
	AcceptErrors uint64 `json:"accept_errors"`
	// Refusals counts the requests and connections refused by each limit,
	// by its name (the flag of softroce serve that raises it).
	Refusals map[string]uint64 `json:"refusals,omitempty"`
}

// Server is a running daemon.
type Server struct {
	cfg  Config
	devs []*device
	ln   *net.UnixListener
	log  *log.Logger
	// netns is the network namespace the daemon serves, which HELLO
	// reports so that a client of another namespace refuses it.
	netns NetNS

	mu      sync.Mutex
	clients map[*client]struct{}
	closed  bool
	wg      sync.WaitGroup

	led      *ledger
	refusing chan struct{} // refused connections waiting for their request

	refusalBudget refusalBudget // refusals.go

	accepted, badReq, badWQE, overruns, backstops, queueFull, acceptErrs atomic.Uint64
	clientSeq                                                            atomic.Uint64 // numbers clients in the order they came (client.seq)
}

// New makes a server for devs; it takes them over (Close closes them).
func New(devs []*verbs.Device, cfg Config) (*Server, error) {
	if len(devs) == 0 {
		return nil, errors.New("serve: no device")
	}
	if cfg.Socket == "" {
		cfg.Socket = os.Getenv("SOFTROCE_SOCKET")
	}
	if cfg.Socket == "" {
		// The daemon's own socket, whatever SOFTROCE_DAEMON_UID says.
		cfg.Socket = SocketFor(os.Geteuid())
	}
	s := &Server{cfg: cfg, log: cfg.Log, clients: map[*client]struct{}{}, led: newLedger(cfg.Limits), refusing: make(chan struct{}, 16)}
	if s.log == nil {
		s.log = log.New(io.Discard, "", 0)
	}
	for i, v := range devs {
		d, err := newDevice(s, i, v)
		if err != nil {
			for _, d := range s.devs {
				d.close()
			}
			return nil, err
		}
		s.devs = append(s.devs, d)
	}
	return s, nil
}

// Listen creates the socket and opens the devices' CMs. A stale socket
// file (nobody answers on it) is replaced; a live one is an error.
func (s *Server) Listen() error {
	p := s.cfg.Socket
	if err := socketDir(filepath.Dir(p), s.cfg.Group != ""); err != nil {
		return err
	}
	if c, err := net.Dial("unixpacket", p); err == nil {
		c.Close()
		return fmt.Errorf("serve: a daemon already listens on %s; to run a second one, give it another socket (--socket PATH) and point programs at it with SOFTROCE_SOCKET=PATH or softroce run --socket PATH", p)
	}
	s.netns = s.devNetNS()
	os.Remove(p)
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: p, Net: "unixpacket"})
	if err != nil {
		return fmt.Errorf("serve: listen on %s: %w", p, err)
	}
	ln.SetUnlinkOnClose(true)
	mode := os.FileMode(0o700)
	if s.cfg.Group != "" {
		g, err := user.LookupGroup(s.cfg.Group)
		if err != nil {
			ln.Close()
			return fmt.Errorf("serve: --group %s: %w", s.cfg.Group, err)
		}
		gid, _ := strconv.Atoi(g.Gid)
		if err := os.Chown(p, -1, gid); err != nil {
			ln.Close()
			return fmt.Errorf("serve: chown %s to group %s: %w", p, s.cfg.Group, err)
		}
		mode = 0o770
	}
	if err := os.Chmod(p, mode); err != nil {
		ln.Close()
		return fmt.Errorf("serve: chmod %s: %w", p, err)
	}
	s.ln = ln
	s.startCMs() // QP1 answers from now on, as ib_cm does (cm.go)
	return nil
}

// Socket is the socket path.
func (s *Server) Socket() string { return s.cfg.Socket }

// Serve accepts clients until Close. Listen must have succeeded.
// A failed accept (descriptors or memory short) never ends it: it is
// logged (at most every few seconds) and tried again after a pause.
func (s *Server) Serve() error {
	var pause time.Duration
	var lastLog time.Time
	for {
		conn, err := s.ln.AcceptUnix()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed || errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			s.acceptErrs.Add(1)
			pause = min(max(2*pause, 5*time.Millisecond), time.Second)
			if time.Since(lastLog) > 10*time.Second {
				lastLog = time.Now()
				s.log.Printf("accept: %v (%d so far); accepting again in %v", err, s.acceptErrs.Load(), pause)
			}
			time.Sleep(pause)
			continue
		}
		pause = 0
		// Admission comes before any allocation for the client: a user over
		// its limit may connect as fast as it likes, and each refusal must
		// cost the daemon little.
		pid, uid, gid := peerCred(conn)
		if r := s.led.admit(uid); r != nil {
			s.limitedConn(uid, pid, r)
			s.refuse(conn, r.errno)
			continue
		}
		c := newClientOf(s, conn, pid, uid, gid)
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			s.led.leave(c.uid)
			conn.Close()
			return nil
		}
		s.clients[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		s.accepted.Add(1)
		go func() {
			defer s.wg.Done()
			c.run()
			s.mu.Lock()
			delete(s.clients, c)
			s.mu.Unlock()
			s.led.leave(c.uid)
			if c.dev != nil {
				s.log.Printf("client pid %d closed its %s context; its resources are freed", c.pid, c.dev.name)
			}
		}()
	}
}

// refuse answers a connection's first request with e and closes it. The
// answer is queued at once; the connection stays open a moment for the
// request (so that the client reads the answer rather than a closed
// socket), for a bounded number of connections at a time.
func (s *Server) refuse(conn *net.UnixConn, e syscall.Errno) {
	conn.Write(le.AppendUint32(le.AppendUint32(nil, uint32(e)), 0))
	select {
	case s.refusing <- struct{}{}:
	default:
		// Not on the accept loop: closing drops the messages queued unread,
		// and the last close of a descriptor in one can block (SO_LINGER).
		go conn.Close()
		return
	}
	go func() {
		defer func() { <-s.refusing }()
		conn.SetReadDeadline(time.Now().Add(time.Second))
		conn.Read(make([]byte, maxMsg+1))
		conn.Close()
	}()
}

// Close stops accepting, disconnects every client (cleaning up after each
// as after a crash) and closes the devices.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	conns := make([]net.Conn, 0, len(s.clients))
	for c := range s.clients {
		conns = append(conns, c.conn)
	}
	s.mu.Unlock()
	// Outside s.mu: a connection's close drops the descriptors still queued
	// on it unread, and the last close of one can block (SO_LINGER).
	for _, c := range conns {
		c.Close()
	}
	if s.ln != nil {
		s.ln.Close()
	}
	s.wg.Wait()
	for _, d := range s.devs {
		d.close()
	}
	return nil
}

// Stats returns the daemon's counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	n := len(s.clients)
	s.mu.Unlock()
	return Stats{Clients: n, Accepted: s.accepted.Load(), BadRequests: s.badReq.Load(), BadWQEs: s.badWQE.Load(), Overruns: s.overruns.Load(),
		Backstops: s.backstops.Load(), QueueFull: s.queueFull.Load(), AcceptErrors: s.acceptErrs.Load(), Refusals: s.led.refusalCounts()}
}

// QPs is how many client QPs exist on all devices.
func (s *Server) QPs() int {
	n := 0
	for _, d := range s.devs {
		d.mu.Lock()
		n += len(d.qps)
		d.mu.Unlock()
	}
	return n
}

// errno maps an error to the errno a client gets.
func errno(err error) syscall.Errno {
	var e syscall.Errno
	switch {
	case err == nil:
		return 0
	case errors.As(err, &e):
		return e
	case errors.Is(err, verbs.ErrBusy):
		return syscall.EBUSY
	case errors.Is(err, errMsg):
		return syscall.EINVAL
	}
	return syscall.EINVAL
}
