package serve

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Limits bound what clients can make the daemon hold, so that one client
// (or one user's many clients) cannot take what the others need or make
// the daemon fail. A zero field takes its value from DefaultLimits. Each
// has a flag on softroce serve (its name in the comment); the flag's name
// is also the limit's name in Stats.Refusals and in the log.
//
// A connection is one ibv_context (or one rdma_cm event channel) of a
// process; a user is the uid of the connecting process (SO_PEERCRED), all
// its connections together.
type Limits struct {
	// ConnsPerUser: connections one user holds open (max-conns-per-user).
	ConnsPerUser int
	// FDsPerUser: descriptors the daemon keeps for one user's connections:
	// fdsPerConn a connection and one a completion channel
	// (max-fds-per-user).
	FDsPerUser int
	// FDReserve: descriptors kept for the daemon itself; clients together
	// get the rest of RLIMIT_NOFILE (fd-reserve).
	FDReserve int
	// Mappings: memory mappings (VMAs) the daemon makes for all clients
	// together: registered memory and the rings (max-mappings).
	Mappings int
	// MappingsPerUser: the same for one user (max-mappings-per-user).
	MappingsPerUser int
	// QueueSlotsPerUser: send and receive queue slots of one user's QPs
	// and SRQs on one device (each queue's WRs rounded up to a power of
	// two), of the device's completion capacity (max-queue-slots-per-user).
	QueueSlotsPerUser int
	// QPsPerConn, CQsPerConn, MRsPerConn, ChannelsPerConn: objects of one
	// connection (max-qps-per-conn, max-cqs-per-conn, max-mrs-per-conn,
	// max-channels-per-conn).
	QPsPerConn      int
	CQsPerConn      int
	MRsPerConn      int
	ChannelsPerConn int
	// CQSlotsPerConn: slots of all CQ rings of one connection, 64 bytes
	// each of the daemon's memory (max-cq-slots-per-conn).
	CQSlotsPerConn int
	// CQSlotsPerUser: the same for all of one user's connections
	// (max-cq-slots-per-user).
	CQSlotsPerUser int
	// SRQsPerConn, AHsPerConn, MWsPerConn: more objects of one connection
	// (max-srqs-per-conn, max-ahs-per-conn, max-mws-per-conn).
	SRQsPerConn int
	AHsPerConn  int
	MWsPerConn  int
	// CMIDsPerConn: rdma_cm ids of one event channel (max-cm-ids-per-conn).
	CMIDsPerConn int
}

// fdsPerConn is what the daemon keeps open for a connection: its socket,
// its doorbell eventfd and its event pipe (or, for an rdma_cm event
// channel, the two ends it keeps of the channel's event socket).
const fdsPerConn = 3

// Limit names: the flags of softroce serve that set them.
const (
	limConnsPerUser    = "max-conns-per-user"
	limFDsPerUser      = "max-fds-per-user"
	limFDs             = "fd-reserve"
	limMappings        = "max-mappings"
	limMappingsPerUser = "max-mappings-per-user"
	limQueueSlots      = "max-queue-slots-per-user"
	limQPs             = "max-qps-per-conn"
	limCQs             = "max-cqs-per-conn"
	limMRs             = "max-mrs-per-conn"
	limChannels        = "max-channels-per-conn"
	limCQSlots         = "max-cq-slots-per-conn"
	limCQSlotsPerUser  = "max-cq-slots-per-user"
	limSRQs            = "max-srqs-per-conn"
	limAHs             = "max-ahs-per-conn"
	limMWs             = "max-mws-per-conn"
	limCMIDs           = "max-cm-ids-per-conn"
)

// DefaultLimits are the limits a zero Limits field takes. Mappings is half
// of vm.max_map_count (read now; 65530, the kernel's default, when it
// cannot be read), MappingsPerUser a quarter of that; the other half is
// the Go runtime's and the daemon's own. QueueSlotsPerUser is a quarter
// of the device's completion capacity (131072 slots).
func DefaultLimits() Limits {
	n := 65530
	if b, err := os.ReadFile("/proc/sys/vm/max_map_count"); err == nil {
		if v, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && v > 0 {
			n = v
		}
	}
	return Limits{
		ConnsPerUser:      256,
		FDsPerUser:        4096,
		FDReserve:         256,
		Mappings:          n / 2,
		MappingsPerUser:   n / 8,
		QueueSlotsPerUser: goCQDepth / 4,
		QPsPerConn:        4096,
		CQsPerConn:        4096,
		MRsPerConn:        1 << 14,
		ChannelsPerConn:   256,
		CQSlotsPerConn:    1 << 20,
		CQSlotsPerUser:    1 << 22,
		SRQsPerConn:       1024,
		AHsPerConn:        1 << 14,
		MWsPerConn:        1 << 14,
		CMIDsPerConn:      1024,
	}
}

// withDefaults fills zero fields. A per-user share set above the total it
// is part of is the total.
func (l Limits) withDefaults() Limits {
	d := DefaultLimits()
	for _, p := range []struct{ v, def *int }{
		{&l.ConnsPerUser, &d.ConnsPerUser}, {&l.FDsPerUser, &d.FDsPerUser}, {&l.FDReserve, &d.FDReserve},
		{&l.QueueSlotsPerUser, &d.QueueSlotsPerUser}, {&l.QPsPerConn, &d.QPsPerConn}, {&l.CQsPerConn, &d.CQsPerConn},
		{&l.MRsPerConn, &d.MRsPerConn}, {&l.ChannelsPerConn, &d.ChannelsPerConn}, {&l.CQSlotsPerConn, &d.CQSlotsPerConn},
		{&l.CQSlotsPerUser, &d.CQSlotsPerUser},
		{&l.SRQsPerConn, &d.SRQsPerConn}, {&l.AHsPerConn, &d.AHsPerConn}, {&l.MWsPerConn, &d.MWsPerConn}, {&l.CMIDsPerConn, &d.CMIDsPerConn},
	} {
		if *p.v <= 0 {
			*p.v = *p.def
		}
	}
	if l.Mappings <= 0 {
		l.Mappings = d.Mappings
	}
	if l.MappingsPerUser <= 0 {
		l.MappingsPerUser = max(l.Mappings/4, 1)
	}
	l.MappingsPerUser = min(l.MappingsPerUser, l.Mappings)
	l.QueueSlotsPerUser = min(l.QueueSlotsPerUser, goCQDepth)
	return l
}

// usage is what one user's connections hold.
type usage struct {
	conns, fds, maps, cqSlots int
}

// ledger charges what clients make the daemon hold against Limits. Its
// mutex is taken last (under a device's mu, never the other way).
type ledger struct {
	lim Limits
	// fdBudget is the descriptors all clients together may make the daemon
	// hold: RLIMIT_NOFILE less those open at start and the reserve.
	fdBudget int

	mu       sync.Mutex
	users    map[int]*usage
	fds      int // all users'
	maps     int // all users'
	refusals map[string]uint64
	logged   map[string]bool // "uid limit" of connection refusals logged
}

func newLedger(l Limits) *ledger {
	g := &ledger{lim: l.withDefaults(), users: map[int]*usage{}, refusals: map[string]uint64{}, logged: map[string]bool{}}
	var r unix.Rlimit
	nofile := 1024
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &r) == nil && r.Cur < 1<<30 {
		nofile = int(r.Cur)
	}
	open := 0
	if es, err := os.ReadDir("/proc/self/fd"); err == nil {
		open = len(es)
	}
	g.fdBudget = max(nofile-open-g.lim.FDReserve, 0)
	return g
}

func (g *ledger) user(uid int) *usage {
	u := g.users[uid]
	if u == nil {
		u = &usage{}
		g.users[uid] = u
	}
	return u
}

// refusal is a request refused by a limit: the errno the client gets,
// the limit's name and its value.
type refusal struct {
	errno syscall.Errno
	name  string
	limit int
}

func (r *refusal) Error() string {
	return fmt.Sprintf("%v: the %s limit (%d) is reached; the daemon's --%s raises it", r.errno, r.name, r.limit, r.name)
}

func (r *refusal) Unwrap() error { return r.errno }

// admit charges a new connection of uid, or refuses it: EMFILE for the
// user's own limits, ENFILE when all clients' descriptors are used up.
func (g *ledger) admit(uid int) *refusal {
	g.mu.Lock()
	defer g.mu.Unlock()
	u := g.user(uid)
	switch {
	case u.conns >= g.lim.ConnsPerUser:
		return g.refused(syscall.EMFILE, limConnsPerUser, g.lim.ConnsPerUser)
	case u.fds+fdsPerConn > g.lim.FDsPerUser:
		return g.refused(syscall.EMFILE, limFDsPerUser, g.lim.FDsPerUser)
	case g.fds+fdsPerConn > g.fdBudget:
		return g.refused(syscall.ENFILE, limFDs, g.lim.FDReserve)
	}
	u.conns++
	u.fds += fdsPerConn
	g.fds += fdsPerConn
	return nil
}

// leave releases a connection's charge.
func (g *ledger) leave(uid int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	u := g.user(uid)
	u.conns--
	u.fds -= fdsPerConn
	g.fds -= fdsPerConn
	if *u == (usage{}) {
		delete(g.users, uid)
	}
}

// chargeFDs charges n more descriptors of uid (negative n releases).
func (g *ledger) chargeFDs(uid, n int) *refusal {
	g.mu.Lock()
	defer g.mu.Unlock()
	u := g.user(uid)
	if n > 0 {
		switch {
		case u.fds+n > g.lim.FDsPerUser:
			return g.refused(syscall.EMFILE, limFDsPerUser, g.lim.FDsPerUser)
		case g.fds+n > g.fdBudget:
			return g.refused(syscall.ENFILE, limFDs, g.lim.FDReserve)
		}
	}
	u.fds += n
	g.fds += n
	return nil
}

// chargeCQSlots charges n more CQ slots of the client and its user
// (negative n releases them).
func (c *client) chargeCQSlots(n int) error {
	g := c.s.led
	g.mu.Lock()
	u := g.user(c.uid)
	var r *refusal
	switch {
	case n <= 0:
	case c.cqSlots+n > g.lim.CQSlotsPerConn:
		r = g.refused(syscall.ENOMEM, limCQSlots, g.lim.CQSlotsPerConn)
	case u.cqSlots+n > g.lim.CQSlotsPerUser:
		r = g.refused(syscall.ENOMEM, limCQSlotsPerUser, g.lim.CQSlotsPerUser)
	}
	if r == nil {
		c.cqSlots += n
		u.cqSlots += n
	}
	g.mu.Unlock()
	if r != nil {
		return c.limited(r)
	}
	return nil
}

// chargeMaps charges n more mappings of uid (negative n releases). As
// uverbs, a mapping the daemon cannot make is ENOMEM.
func (g *ledger) chargeMaps(uid, n int) *refusal {
	g.mu.Lock()
	defer g.mu.Unlock()
	u := g.user(uid)
	if n > 0 {
		switch {
		case u.maps+n > g.lim.MappingsPerUser:
			return g.refused(syscall.ENOMEM, limMappingsPerUser, g.lim.MappingsPerUser)
		case g.maps+n > g.lim.Mappings:
			return g.refused(syscall.ENOMEM, limMappings, g.lim.Mappings)
		}
	}
	u.maps += n
	g.maps += n
	return nil
}

// refused counts a refusal; g.mu is held.
func (g *ledger) refused(e syscall.Errno, name string, limit int) *refusal {
	g.refusals[name]++
	return &refusal{errno: e, name: name, limit: limit}
}

// count counts a refusal of a limit the ledger does not charge itself.
func (g *ledger) count(e syscall.Errno, name string, limit int) *refusal {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.refused(e, name, limit)
}

func (g *ledger) refusalCounts() map[string]uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.refusals) == 0 {
		return nil
	}
	m := make(map[string]uint64, len(g.refusals))
	for k, v := range g.refusals {
		m[k] = v
	}
	return m
}

// usedMaps is the mappings charged to all clients.
func (g *ledger) usedMaps() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.maps
}

// limited logs a refusal once per client and limit and returns it as the
// error the request fails with.
func (c *client) limited(r *refusal) error {
	g := c.s.led
	g.mu.Lock() // rdma_cm's listeners make ids on their own goroutines
	if c.refused == nil {
		c.refused = map[string]bool{}
	}
	first := !c.refused[r.name]
	c.refused[r.name] = true
	g.mu.Unlock()
	if first {
		c.s.log.Printf("client pid %d (uid %d) refused: %v", c.pid, c.uid, r)
	}
	return r
}

// limitedConn logs a refused connection once per user and limit.
func (s *Server) limitedConn(uid, pid int, r *refusal) {
	k := strconv.Itoa(uid) + " " + r.name
	s.led.mu.Lock()
	first := !s.led.logged[k]
	s.led.logged[k] = true
	s.led.mu.Unlock()
	if first {
		s.log.Printf("connection of pid %d (uid %d) refused: %v", pid, uid, r)
	}
}

// newRing is newShm charged as one mapping of the client's user.
func (c *client) newRing(name string, size int) (*shm, error) {
	if r := c.s.led.chargeMaps(c.uid, 1); r != nil {
		return nil, c.limited(r)
	}
	m, err := newShm(name, size)
	if err != nil {
		c.s.led.chargeMaps(c.uid, -1)
		return nil, fmt.Errorf("%w: %v", syscall.ENOMEM, err)
	}
	return m, nil
}

// freeRing frees a ring newRing made.
func (c *client) freeRing(m *shm) {
	if m.b != nil {
		c.s.led.chargeMaps(c.uid, -1)
	}
	m.free()
}

func (c *client) lim() *Limits { return &c.s.led.lim }

// chargeMaps charges n mappings (negative: releases them) to the client's
// user, as mapClientMem asks.
func (c *client) chargeMaps(n int) error {
	if r := c.s.led.chargeMaps(c.uid, n); r != nil {
		return c.limited(r)
	}
	return nil
}

// reserveSlots checks that n more queue slots fit the device's completion
// capacity and the user's share of it. d.mu is held.
func (c *client) reserveSlots(n int) error {
	d := c.dev
	if d.userSlots[c.uid]+n > c.lim().QueueSlotsPerUser {
		return c.limited(c.s.led.count(syscall.ENOMEM, limQueueSlots, c.lim().QueueSlotsPerUser))
	}
	if d.reserved+n > goCQDepth {
		return fmt.Errorf("%w: the device's completion capacity is used up", syscall.ENOMEM)
	}
	return nil
}

// takeSlots takes n queue slots (negative: gives them back). d.mu is held.
func (c *client) takeSlots(n int) {
	d := c.dev
	d.reserved += n
	if d.userSlots[c.uid] += n; d.userSlots[c.uid] == 0 {
		delete(d.userSlots, c.uid)
	}
}
