package serve

import (
	"crypto/rand"
	"fmt"
	"net"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/memreg"
	"github.com/softroce/softroce/qpstate"
	"github.com/softroce/softroce/verbs"
)

const (
	attrState = qpstate.AttrState
	// What one connection may make the daemon allocate is in Limits
	// (limits.go); these are the device's own bounds.
	maxRingWR = verbs.MaxQPWR
	// max_cqe: libfabric's verbs;ofi_rxm sizes one CQ for the sends and
	// receives of 256 peers (262144 entries with its defaults) and does
	// not fall back to a smaller one; NICs report millions.
	maxCQSlots = 1 << 18
)

type mrObj struct {
	handle       uint32
	pd           uint32
	mr           *verbs.MR
	addr, length uint64 // the client's range
	daddr        uint64 // verbs' VA of addr: the same, the MR being registered at the client's VA
	mem          *clientMem
}

type pdObj struct {
	handle uint32
	pd     *verbs.PD
	uses   int // MRs and QPs
}

// client is one connection: one ibv_context of one process.
type client struct {
	s    *Server
	seq  uint64 // the order it came in: the rdma views list clients by it
	conn *net.UnixConn
	dev  *device
	bell int // the doorbell eventfd (its copy sent to the client)
	evW  int // the write end of the async event pipe (non-blocking)
	pid  int // the peer process (SO_PEERCRED), 0 when unknown
	// uid and gid are the peer's (SO_PEERCRED), -1 when unknown. Unlike
	// the pid, which another process may get once this one exits, they
	// say whose the connection is: ownership checks use them.
	uid  int
	gid  int
	next uint32

	// Guarded by dev.mu once dev is set (the poller reads mrByKey).
	pds     map[uint32]*pdObj
	mrs     map[uint32]*mrObj
	mrByKey map[uint32]*mrObj
	cqs     map[uint32]*cqObj
	qps     map[uint32]*qpObj
	chans   map[uint32]*chanObj
	ahs     map[uint32]*ahObj  // ud.go
	srqs    map[uint32]*srqObj // srq.go
	mws     map[uint32]*mwObj  // mw.go

	cqSlots int // slots of all its CQ rings

	refused map[string]bool // limits already logged for this client (under s.led.mu)
	rlog    refusalLog      // refused requests and WQEs logged (refusals.go)

	cm    *cmChan // an rdma_cm event channel (serve/cm.go), or nil
	pages pageMap // its MRs' pages mapped at its own addresses (serve/mem.go)

	out []byte
	ext []extent
}

func newClient(s *Server, conn *net.UnixConn) *client {
	pid, uid, gid := peerCred(conn)
	return newClientOf(s, conn, pid, uid, gid)
}

// peerCred is the connecting process's pid, uid and gid (SO_PEERCRED);
// the ids are -1 when unknown.
func peerCred(conn *net.UnixConn) (pid, uid, gid int) {
	pid, uid, gid = 0, -1, -1
	if conn != nil {
		if rc, err := conn.SyscallConn(); err == nil {
			rc.Control(func(fd uintptr) {
				if u, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
					pid, uid, gid = int(u.Pid), int(u.Uid), int(u.Gid)
				}
			})
		}
	}
	return pid, uid, gid
}

func newClientOf(s *Server, conn *net.UnixConn, pid, uid, gid int) *client {
	return &client{s: s, seq: s.clientSeq.Add(1), conn: conn, bell: -1, evW: -1, pid: pid, uid: uid, gid: gid, pds: map[uint32]*pdObj{}, mrs: map[uint32]*mrObj{}, mrByKey: map[uint32]*mrObj{},
		cqs: map[uint32]*cqObj{}, qps: map[uint32]*qpObj{}, chans: map[uint32]*chanObj{},
		ahs: map[uint32]*ahObj{}, srqs: map[uint32]*srqObj{}, mws: map[uint32]*mwObj{}}
}

// run serves requests until the connection closes, then frees everything.
func (c *client) run() {
	defer c.refusalsNotLogged()
	defer c.cleanup()
	buf := make([]byte, maxMsg+1)
	oob := make([]byte, unix.CmsgSpace(4*maxExtents))
	for {
		n, oobn, flags, _, err := c.conn.ReadMsgUnix(buf, oob)
		if err != nil || n == 0 {
			return
		}
		fds := parseFDs(oob[:oobn])
		if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
			closeAll(fds)
			c.s.badReq.Add(1)
			c.refusedRequest("a message over "+strconv.Itoa(maxMsg)+" bytes", syscall.EMSGSIZE)
			if c.reply(syscall.EMSGSIZE, nil, nil) != nil {
				return
			}
			continue
		}
		resp, rfds, err := c.handle(buf[:n], fds)
		if err != nil {
			c.s.badReq.Add(1)
			c.refusedRequest(requestName(buf[:n]), err)
		}
		werr := c.reply(errno(err), resp, rfds)
		for _, fd := range rfds {
			unix.Close(fd)
		}
		if werr != nil {
			return
		}
	}
}

func parseFDs(oob []byte) []int {
	if len(oob) == 0 {
		return nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for i := range msgs {
		if f, err := unix.ParseUnixRights(&msgs[i]); err == nil {
			fds = append(fds, f...)
		}
	}
	return fds
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

func (c *client) reply(e syscall.Errno, body []byte, fds []int) error {
	c.out = le.AppendUint32(c.out[:0], uint32(e))
	c.out = le.AppendUint32(c.out, 0)
	c.out = append(c.out, body...)
	var oob []byte
	if len(fds) > 0 && e == 0 {
		oob = unix.UnixRights(fds...)
	}
	_, _, err := c.conn.WriteMsgUnix(c.out, oob, nil)
	return err
}

// handle decodes and runs one request. Descriptors that came with it are
// always closed or kept by the handler, never leaked.
func (c *client) handle(msg []byte, fds []int) (resp []byte, rfds []int, err error) {
	r, err := parseRequest(msg)
	if err != nil {
		closeAll(fds)
		return nil, nil, err
	}
	if r.op >= opCMFirst && r.op <= opCMLast { // connection management: serve/cm.go
		closeAll(fds)
		return c.handleCM(r)
	}
	if r.op != opRegMR && r.op != opRegMRIOVA && len(fds) > 0 {
		closeAll(fds)
		return nil, nil, fmt.Errorf("%w: descriptors with op %d", errMsg, r.op)
	}
	switch r.op {
	case opHello:
		if v := u32(r.body, 0); v != protoVersion {
			return nil, nil, fmt.Errorf("%w: protocol version %d, the daemon speaks %d", syscall.EPROTONOSUPPORT, v, protoVersion)
		}
		return c.hello(), nil, nil
	case opOpen:
		return c.open(u32(r.body, 0))
	case opStatus:
		return c.s.statusJSON(maxMsg-sizeResp, c), nil, nil
	case opRdmaView:
		if u32(r.body, 1) != 0 {
			return nil, nil, fmt.Errorf("%w: RDMA_VIEW with flags %#x", errMsg, u32(r.body, 1))
		}
		return c.s.rdmaPageJSON(maxMsg-sizeResp, c, u32(r.body, 0)), nil, nil
	}
	d := c.dev
	if d == nil {
		closeAll(fds)
		return nil, nil, fmt.Errorf("%w: op %d before OPEN", syscall.EBADF, r.op)
	}
	if r.op == opRegMR || r.op == opRegMRIOVA {
		return c.regMRRequest(r, fds)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	switch r.op {
	case opQueryDevice:
		return c.queryDevice(), nil, nil
	case opQueryPort:
		return c.queryPort(u32(r.body, 0))
	case opQueryGID:
		return c.queryGID(u32(r.body, 0), u32(r.body, 1))
	case opAllocPD:
		return c.allocPD()
	case opDeallocPD:
		return nil, nil, c.deallocPD(u32(r.body, 0))
	case opDeregMR:
		return nil, nil, c.deregMR(u32(r.body, 0))
	case opCreateCQ:
		return c.createCQ(u32(r.body, 0), u32(r.body, 1))
	case opDestroyCQ:
		return nil, nil, c.destroyCQ(u32(r.body, 0))
	case opCreateQP:
		return c.createQP(r.body)
	case opModifyQP:
		return nil, nil, c.modifyQP(u32(r.body, 0), u32(r.body, 1), decodeQPAttr(r.body[8:]))
	case opQueryQP:
		return c.queryQP(u32(r.body, 0))
	case opDestroyQP:
		return nil, nil, c.destroyQP(u32(r.body, 0))
	case opCreateChannel:
		return c.createChannel()
	case opDestroyChannel:
		return nil, nil, c.destroyChannel(u32(r.body, 0))
	case opAllocMW:
		return c.allocMW(u32(r.body, 0), u32(r.body, 1))
	case opDeallocMW:
		return nil, nil, c.deallocMW(u32(r.body, 0))
	case opResizeCQ:
		return c.resizeCQ(u32(r.body, 0), u32(r.body, 1))
	case opResizeSRQ:
		return c.resizeSRQ(u32(r.body, 0), u32(r.body, 1), u32(r.body, 2), u32(r.body, 3))
	}
	if resp, rfds, err, ok := c.handleUD(r); ok {
		return resp, rfds, err
	}
	return nil, nil, fmt.Errorf("%w: op %d", errMsg, r.op)
}

func (c *client) handleID() uint32 {
	c.next++
	if c.next == 0 {
		c.next = 1
	}
	return c.next
}

func (c *client) hello() []byte {
	out := le.AppendUint32(nil, protoVersion)
	out = le.AppendUint32(out, uint32(len(c.s.devs)))
	out = le.AppendUint64(le.AppendUint64(out, c.s.netns.Dev), c.s.netns.Ino)
	for _, d := range c.s.devs {
		var name [nameLen]byte
		copy(name[:nameLen-1], d.name)
		out = append(out, name[:]...)
		out = le.AppendUint64(out, d.guid)
	}
	return out
}

func (c *client) open(i uint32) ([]byte, []int, error) {
	if c.dev != nil || c.cm != nil {
		return nil, nil, fmt.Errorf("%w: connection already opened a device or an rdma_cm channel", syscall.EBUSY)
	}
	if int(i) >= len(c.s.devs) {
		return nil, nil, fmt.Errorf("%w: no device %d", syscall.ENODEV, i)
	}
	fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return nil, nil, err
	}
	var ev [2]int
	if err := unix.Pipe2(ev[:], unix.O_CLOEXEC); err != nil {
		unix.Close(fd)
		return nil, nil, err
	}
	unix.SetNonblock(ev[1], true)
	d := c.s.devs[i]
	if err := d.addDoorbell(fd); err != nil {
		unix.Close(fd)
		unix.Close(ev[0])
		unix.Close(ev[1])
		return nil, nil, err
	}
	c.s.mu.Lock() // Status and the device's event loop read dev and evW
	c.dev, c.bell, c.evW = d, fd, ev[1]
	c.s.mu.Unlock()
	dup, err := unix.Dup(fd)
	if err != nil {
		unix.Close(ev[0])
		return nil, nil, err
	}
	return nil, []int{dup, ev[0]}, nil
}

// Async event types (enum ibv_event_type).
const (
	evCQErr       = 0
	evQPFatal     = 1
	evDeviceFatal = 8
)

// raise queues an async event for the client. It never blocks: a client
// that does not read its events loses the ones its pipe cannot hold.
func (c *client) raise(typ, handle uint32) {
	if c.evW < 0 {
		return
	}
	var b [8]byte
	le.PutUint32(b[:], typ)
	le.PutUint32(b[4:], handle)
	unix.Write(c.evW, b[:])
}

// queryDevice reports the device's limits as this client can reach them:
// as a NIC's, they are capacities (not what is free now), bounded by the
// daemon's Limits for the client's user and connection, so that one QP,
// CQ or SRQ of the reported size fits a user who holds nothing yet.
func (c *client) queryDevice() []byte {
	a := c.dev.v.QueryDevice()
	l := c.lim()
	share := l.QueueSlotsPerUser
	// A QP of max_qp_wr sends and receives takes twice its rounded size.
	qpWR := min(a.MaxQPWR, maxRingWR, floorPow2(share/2))
	// Each QP, CQ, SRQ and MR is a mapping at least; a QP takes two
	// slots at least.
	maxQP := min(a.MaxQP, l.QPsPerConn, share/2, l.MappingsPerUser)
	maxCQ := min(a.MaxCQ, l.CQsPerConn, l.MappingsPerUser)
	maxCQE := min(a.MaxCQE, maxCQSlots, floorPow2(l.CQSlotsPerConn))
	maxMR := min(a.MaxMR, l.MRsPerConn, l.MappingsPerUser)
	maxSRQ := min(verbs.MaxSRQ, l.SRQsPerConn, share, l.MappingsPerUser)
	srqWR := min(verbs.MaxSRQWR, maxRingWR, floorPow2(share))
	out := le.AppendUint64(nil, a.MaxMRSize)
	out = le.AppendUint64(out, c.dev.guid)
	for _, v := range []int{int(a.VendorID), 1, 0, maxQP, qpWR, a.MaxSGE, maxCQ, maxCQE, maxMR, a.MaxPD,
		a.MaxQPRDAtom, a.MaxQPInitRDAtom, maxSRQ, srqWR, verbs.MaxSRQSGE, a.MaxMW, int(a.DeviceCapFlags & (verbs.DeviceMemWindow | verbs.DeviceMemWindowType2B)), 1 /* IBV_ATOMIC_HCA */, a.PhysPortCnt, 0} {
		out = le.AppendUint32(out, uint32(v))
	}
	return out
}

// floorPow2 is the largest power of two not above n (0 for n < 1).
func floorPow2(n int) int {
	p := 1
	for p*2 <= n {
		p *= 2
	}
	if n < 1 {
		return 0
	}
	return p
}

func (c *client) queryPort(port uint32) ([]byte, []int, error) {
	if port != 1 {
		return nil, nil, fmt.Errorf("%w: port %d", syscall.EINVAL, port)
	}
	p := c.dev.v.QueryPort()
	out := le.AppendUint32(nil, 4) // IBV_PORT_ACTIVE
	for _, v := range []uint32{mtuEnum(p.MaxMTU), mtuEnum(p.ActiveMTU), uint32(p.GIDTblLen), uint32(p.PKeyTblLen), verbs.MaxMsgSize, uint32(p.LinkMTU), 0} {
		out = le.AppendUint32(out, v)
	}
	return out, nil, nil
}

func (c *client) queryGID(port, index uint32) ([]byte, []int, error) {
	if port != 1 {
		return nil, nil, fmt.Errorf("%w: port %d", syscall.EINVAL, port)
	}
	g, err := c.dev.v.QueryGID(int(index))
	if index > 1<<16 || err != nil {
		return nil, nil, fmt.Errorf("%w: GID index %d", syscall.EINVAL, index)
	}
	out := append([]byte(nil), g[:]...)
	out = le.AppendUint32(out, gidTypeRoCEv2)
	out = le.AppendUint32(out, 0)
	return out, nil, nil
}

func handleResp(h uint32) []byte { return le.AppendUint32(le.AppendUint32(nil, h), 0) }

func (c *client) allocPD() ([]byte, []int, error) {
	pd, err := c.dev.v.AllocPD()
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", syscall.ENOMEM, err)
	}
	h := c.handleID()
	c.pds[h] = &pdObj{handle: h, pd: pd}
	return handleResp(h), nil, nil
}

func (c *client) deallocPD(h uint32) error {
	p := c.pds[h]
	if p == nil {
		return fmt.Errorf("%w: no PD %d", syscall.EINVAL, h)
	}
	if p.uses > 0 {
		return fmt.Errorf("%w: PD %d in use", syscall.EBUSY, h)
	}
	if err := p.pd.Dealloc(); err != nil {
		return err
	}
	delete(c.pds, h)
	return nil
}

// regMRRequest runs a REG_MR. The client's descriptors are checked,
// mapped and closed before the device lock is taken: closing a descriptor
// can block (a socket with SO_LINGER passed as a memfd blocks close for
// its linger time), and only this client's goroutine may wait for that.
// c.pages is this client's alone and only its goroutine (requests and
// cleanup) touches it, so the mapping needs no lock either.
func (c *client) regMRRequest(r request, fds []int) ([]byte, []int, error) {
	rq := decodeRegMR(r.op, r.body, c.ext[:0])
	const known = memreg.AccessLocalWrite | memreg.AccessRemoteWrite | memreg.AccessRemoteRead | memreg.AccessRemoteAtomic | memreg.AccessMWBind
	// Optional-range flags (relaxed ordering, ...) are hints; others are refused.
	acc := memreg.Access(rq.access) &^ (0xfff00000)
	if acc&^known != 0 {
		closeAll(fds)
		return nil, nil, fmt.Errorf("%w: access flags 0x%x", syscall.EOPNOTSUPP, rq.access)
	}
	// Only this goroutine changes c.mrs: counted here, before any mapping.
	if len(c.mrs) >= c.lim().MRsPerConn {
		closeAll(fds)
		return nil, nil, c.limited(c.s.led.count(syscall.ENOMEM, limMRs, c.lim().MRsPerConn))
	}
	if c.pages == nil {
		c.pages = pageMap{}
	}
	m, err := mapClientMem(&rq, fds, c.pages, c.chargeMaps) // the ledger has its own lock
	closeAll(fds)                                           // the mappings keep the memory; no lock is held here
	if err != nil {
		return nil, nil, err
	}
	d := c.dev
	d.mu.Lock()
	defer d.mu.Unlock()
	resp, err := c.regMR(&rq, acc, m)
	if err != nil {
		c.chargeMaps(-m.unmap())
	}
	return resp, nil, err
}

// regMR registers the mapped range m; the caller holds dev.mu and unmaps
// m when it fails.
func (c *client) regMR(r *regMR, acc memreg.Access, m *clientMem) ([]byte, error) {
	p := c.pds[r.pd]
	if p == nil {
		return nil, fmt.Errorf("%w: no PD %d", syscall.EINVAL, r.pd)
	}
	// The region's VA is the client's (its address or the IOVA it asked
	// for) wherever the daemon mapped the bytes: peers, SGEs and window
	// binds all use it.
	buf := m.buf(r)
	mr, err := p.pd.RegMRIOVA(buf, r.iova, acc)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", syscall.EINVAL, err)
	}
	h := c.handleID()
	o := &mrObj{handle: h, pd: r.pd, mr: mr, addr: r.iova, length: r.length, daddr: mr.Addr(), mem: m}
	c.mrs[h] = o
	c.mrByKey[mr.LKey()] = o
	p.uses++
	out := le.AppendUint32(nil, h)
	out = le.AppendUint32(out, mr.LKey())
	out = le.AppendUint32(out, mr.RKey())
	out = le.AppendUint32(out, 0)
	return out, nil
}

func (c *client) deregMR(h uint32) error {
	o := c.mrs[h]
	if o == nil {
		return fmt.Errorf("%w: no MR %d", syscall.EINVAL, h)
	}
	// verbs waits for in-flight accesses; only then is the mapping gone.
	if err := c.dev.v.DeregMR(o.mr); err != nil {
		return err
	}
	c.chargeMaps(-o.mem.unmap())
	delete(c.mrByKey, o.mr.LKey())
	delete(c.mrs, h)
	c.pds[o.pd].uses--
	return nil
}

func (c *client) createCQ(cqe, ch uint32) ([]byte, []int, error) {
	if cqe == 0 || cqe > maxCQSlots {
		return nil, nil, fmt.Errorf("%w: cqe %d", syscall.EINVAL, cqe)
	}
	if len(c.cqs) >= c.lim().CQsPerConn {
		return nil, nil, c.limited(c.s.led.count(syscall.ENOMEM, limCQs, c.lim().CQsPerConn))
	}
	var co *chanObj
	if ch != 0 {
		if co = c.chans[ch]; co == nil {
			return nil, nil, fmt.Errorf("%w: no channel %d", syscall.EINVAL, ch)
		}
	}
	size := ceilPow2(cqe)
	if err := c.chargeCQSlots(int(size)); err != nil {
		return nil, nil, err
	}
	m, err := c.newRing("softroce-cq", ctlPage+int(size)*cqeSize)
	if err != nil {
		c.chargeCQSlots(-int(size))
		return nil, nil, err
	}
	h := c.handleID()
	c.cqs[h] = &cqObj{handle: h, mem: m, size: size, ch: co}
	if co != nil {
		co.nCQ++
	}
	fd := m.fd
	m.fd = -1 // sent, then closed by run
	out := le.AppendUint32(nil, h)
	out = le.AppendUint32(out, size)
	out = le.AppendUint64(out, uint64(len(m.b)))
	return out, []int{fd}, nil
}

func (c *client) destroyCQ(h uint32) error {
	o := c.cqs[h]
	if o == nil {
		return fmt.Errorf("%w: no CQ %d", syscall.EINVAL, h)
	}
	if o.nQP > 0 {
		return fmt.Errorf("%w: CQ %d in use", syscall.EBUSY, h)
	}
	if o.ch != nil {
		o.ch.nCQ--
	}
	c.freeRing(o.mem)
	c.chargeCQSlots(-int(o.size))
	delete(c.cqs, h)
	return nil
}

func (c *client) createQP(b []byte) ([]byte, []int, error) {
	pdH, scqH, rcqH, typ := u32(b, 0), u32(b, 1), u32(b, 2), u32(b, 3)
	msw, mrw, mss, mrs, mil, sigAll := u32(b, 4), u32(b, 5), u32(b, 6), u32(b, 7), u32(b, 8), u32(b, 9)
	p, scq, rcq := c.pds[pdH], c.cqs[scqH], c.cqs[rcqH]
	vt, typOK := qpType(typ)
	var srqH uint32
	if len(b) >= sizeCreateQP {
		srqH = u32(b, 10)
	}
	srq, srqErr := c.srqFor(srqH, pdH)
	switch {
	case p == nil || scq == nil || rcq == nil:
		return nil, nil, fmt.Errorf("%w: PD %d, CQs %d/%d", syscall.EINVAL, pdH, scqH, rcqH)
	case !typOK:
		return nil, nil, fmt.Errorf("%w: QP type %d (RC, UC and UD only)", syscall.EOPNOTSUPP, typ)
	case srqErr != nil:
		return nil, nil, srqErr
	case msw > maxRingWR || mrw > maxRingWR || mss > verbs.MaxSGE || mrs > verbs.MaxSGE || mil > verbs.MaxInline:
		return nil, nil, fmt.Errorf("%w: QP capacities", syscall.EINVAL)
	case len(c.qps) >= c.lim().QPsPerConn:
		return nil, nil, c.limited(c.s.led.count(syscall.ENOMEM, limQPs, c.lim().QPsPerConn))
	}
	msw, mrw, mss, mrs = max(msw, 1), max(mrw, 1), max(mss, 1), max(mrs, 1)
	if srq != nil {
		mrw, mrs = 1, 1 // its receives come from the SRQ
	}
	sqSize, rqSize := ceilPow2(msw), ceilPow2(mrw)
	d := c.dev
	if err := c.reserveSlots(int(sqSize + rqSize)); err != nil {
		return nil, nil, err
	}
	sqStride := uint32(sizeSendWQE + (max(int(mss)*sizeSGE, int(mil))+15)&^15)
	rqStride := uint32(sizeRecvWQE + int(mrs)*sizeSGE)
	sqOff := ctlPage
	rqOff := sqOff + int(sqSize*sqStride+pageSize-1)&^(pageSize-1)
	total := rqOff + int(rqSize*rqStride+pageSize-1)&^(pageSize-1)
	m, err := c.newRing("softroce-qp", total)
	if err != nil {
		return nil, nil, err
	}
	var vsrq *verbs.SRQ
	if srq != nil {
		vsrq = srq.srq
	}
	qp, err := p.pd.CreateQP(verbs.QPInitAttr{Type: vt, SRQ: vsrq, SendCQ: d.sendCQ, RecvCQ: d.recvCQ, SQSigAll: sigAll != 0,
		Cap: verbs.QPCap{MaxSendWR: int(sqSize), MaxRecvWR: int(rqSize), MaxSendSGE: int(mss), MaxRecvSGE: int(mrs), MaxInlineData: int(mil)}})
	if err != nil {
		c.freeRing(m)
		return nil, nil, fmt.Errorf("%w: %v", syscall.EINVAL, err)
	}
	if c.s.cfg.RemotePort != 0 {
		qp.SetRemotePort(c.s.cfg.RemotePort)
	}
	token, err := newQPToken()
	if err != nil {
		qp.Destroy()
		m.free()
		return nil, nil, err
	}
	h := c.handleID()
	q := &qpObj{handle: h, c: c, pd: pdH, qp: qp, qpn: qp.Num(), token: token, mem: m, maxInline: int(mil), sendCQ: scq, recvCQ: rcq,
		sgl: make([]verbs.SGE, mss), recv: recvWQE{sgl: make([]verbs.SGE, mrs)}, inline: make([]byte, mil), typ: vt, srq: srq}
	q.initRings(sqSize, sqStride, sqOff, rqSize, rqStride, rqOff)
	if srq != nil {
		srq.nQP++
	}
	// A QP born while the poller sleeps must ring: start with the flag set.
	store32(m.b, offSleeping, 1)
	c.qps[h] = q
	d.qps = append(d.qps, q)
	d.rmu.Lock()
	d.byQPN[q.qpn] = q
	d.rmu.Unlock()
	c.takeSlots(int(sqSize + rqSize))
	p.uses++
	scq.nQP++
	rcq.nQP++
	fd := m.fd
	m.fd = -1
	out := make([]byte, 0, sizeQP)
	for _, v := range []uint32{h, q.qpn, sqSize, rqSize, mss, mrs, mil, sqSize, rqSize, sqStride, rqStride, 0} {
		out = le.AppendUint32(out, v)
	}
	out = le.AppendUint64(out, uint64(total))
	out = le.AppendUint64(out, uint64(sqOff))
	out = le.AppendUint64(out, uint64(rqOff))
	out = le.AppendUint64(out, token)
	return out, []int{fd}, nil
}

// newQPToken is a QP's token: what ATTACH_QP must show besides the
// owner's uid. QP numbers are small and STATUS used to show them; the
// token is random and only CREATE_QP's answer carries it.
func newQPToken() (uint64, error) {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return 0, fmt.Errorf("QP token: %w", err)
	}
	return le.Uint64(b[:]), nil
}

func (c *client) modifyQP(h, mask uint32, a qpAttrWire) error {
	q := c.qps[h]
	if q == nil {
		return fmt.Errorf("%w: no QP %d", syscall.EINVAL, h)
	}
	var attr verbs.QPAttr
	m := verbs.AttrMask(mask)
	if m&qpstate.AttrPathMTU != 0 {
		if attr.PathMTU = mtuBytes(a.pathMTU); attr.PathMTU == 0 {
			return fmt.Errorf("%w: path_mtu %d", syscall.EINVAL, a.pathMTU)
		}
	}
	if a.state > 6 || a.curState > 6 {
		return fmt.Errorf("%w: state %d", syscall.EINVAL, a.state)
	}
	attr.State, attr.CurState = verbs.QPState(a.state), verbs.QPState(a.curState)
	attr.AccessFlags = a.access
	attr.PKeyIndex = uint16(a.pk)
	attr.Port = uint8(a.port)
	attr.QKey = a.qkey
	attr.AV = verbs.AddressVector{DGID: a.dgid, SGIDIndex: uint8(a.sgidIndex), HopLimit: uint8(a.hopLimit),
		TrafficClass: uint8(a.trafficClass), FlowLabel: a.flowLabel & 0xfffff, SL: uint8(a.sl)}
	attr.Timeout, attr.RetryCnt, attr.RNRRetry = uint8(a.timeout), uint8(a.retryCnt), uint8(a.rnrRetry)
	attr.RQPSN, attr.SQPSN = a.rqPSN&0xffffff, a.sqPSN&0xffffff
	attr.MaxRDAtomic, attr.MaxDestRDAtomic = uint8(min(a.maxRDAtomic, 255)), uint8(min(a.maxDestRDAtomic, 255))
	attr.MinRNRTimer = uint8(a.minRNR)
	attr.DestQPN = a.destQPN & 0xffffff
	// Fields that do not fit their type are refused rather than truncated.
	if a.port > 255 || a.pk > 0xffff || a.sgidIndex > 255 || a.hopLimit > 255 || a.trafficClass > 255 || a.sl > 15 ||
		a.timeout > 31 || a.retryCnt > 7 || a.rnrRetry > 7 || a.minRNR > 31 {
		return fmt.Errorf("%w: QP attribute out of range", syscall.EINVAL)
	}
	if m&qpstate.AttrAV != 0 && a.isGlobal == 0 {
		// As the kernel's core refuses it for every RoCE device
		// (rdma_check_ah_attr): a LID names no one on Ethernet.
		return fmt.Errorf("%w: RoCE needs a GRH (is_global): an address by LID alone reaches no one; the peers must exchange GIDs or use rdma_cm", syscall.EINVAL)
	}
	if err := q.qp.Modify(&attr, m&^qpstate.AttrCap); err != nil {
		return fmt.Errorf("%w: %v", syscall.EINVAL, err)
	}
	if m&attrState != 0 {
		q.state = a.state
	}
	return nil
}

func (c *client) queryQP(h uint32) ([]byte, []int, error) {
	q := c.qps[h]
	if q == nil {
		return nil, nil, fmt.Errorf("%w: no QP %d", syscall.EINVAL, h)
	}
	a, ia := q.qp.Query()
	w := qpAttrWire{state: uint32(a.State), curState: uint32(a.CurState), pathMTU: mtuEnum(a.PathMTU), access: a.AccessFlags,
		rqPSN: a.RQPSN, sqPSN: a.SQPSN, destQPN: a.DestQPN, flowLabel: a.AV.FlowLabel, sgidIndex: uint32(a.AV.SGIDIndex),
		hopLimit: uint32(a.AV.HopLimit), trafficClass: uint32(a.AV.TrafficClass), sl: uint32(a.AV.SL), timeout: uint32(a.Timeout),
		retryCnt: uint32(a.RetryCnt), rnrRetry: uint32(a.RNRRetry), minRNR: uint32(a.MinRNRTimer), maxRDAtomic: uint32(a.MaxRDAtomic),
		maxDestRDAtomic: uint32(a.MaxDestRDAtomic), port: uint32(a.Port), pk: uint32(a.PKeyIndex), isGlobal: 1, qkey: a.QKey, dgid: a.AV.DGID,
		maxSendWR: uint32(ia.Cap.MaxSendWR), maxRecvWR: uint32(ia.Cap.MaxRecvWR), maxSendSGE: uint32(ia.Cap.MaxSendSGE),
		maxRecvSGE: uint32(ia.Cap.MaxRecvSGE), maxInline: uint32(ia.Cap.MaxInlineData)}
	return w.encode(make([]byte, 0, sizeQPAttr)), nil, nil
}

func (c *client) destroyQP(h uint32) error {
	q := c.qps[h]
	if q == nil {
		return fmt.Errorf("%w: no QP %d", syscall.EINVAL, h)
	}
	st := q.qp.Stats()
	if err := q.qp.Destroy(); err != nil {
		return err
	}
	d := c.dev
	addQPStats(&d.retired, st)
	for i, x := range d.qps {
		if x == q {
			d.qps = append(d.qps[:i], d.qps[i+1:]...)
			break
		}
	}
	d.rmu.Lock() // route no longer reaches q nor its CQs
	delete(d.byQPN, q.qpn)
	d.rmu.Unlock()
	c.takeSlots(-int(q.sq.size + q.rq.size))
	c.freeRing(q.mem)
	delete(c.qps, h)
	c.pds[q.pd].uses--
	q.sendCQ.nQP--
	q.recvCQ.nQP--
	if q.srq != nil {
		q.srq.nQP--
	}
	return nil
}

func (c *client) createChannel() ([]byte, []int, error) {
	if len(c.chans) >= c.lim().ChannelsPerConn {
		return nil, nil, c.limited(c.s.led.count(syscall.ENOMEM, limChannels, c.lim().ChannelsPerConn))
	}
	if r := c.s.led.chargeFDs(c.uid, 1); r != nil { // its pipe's write end
		return nil, nil, c.limited(r)
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		c.s.led.chargeFDs(c.uid, -1)
		return nil, nil, err
	}
	if err := unix.SetNonblock(p[1], true); err != nil {
		unix.Close(p[0])
		unix.Close(p[1])
		c.s.led.chargeFDs(c.uid, -1)
		return nil, nil, err
	}
	h := c.handleID()
	c.chans[h] = &chanObj{handle: h, w: p[1]}
	return handleResp(h), []int{p[0]}, nil
}

func (c *client) destroyChannel(h uint32) error {
	o := c.chans[h]
	if o == nil {
		return fmt.Errorf("%w: no channel %d", syscall.EINVAL, h)
	}
	if o.nCQ > 0 {
		return fmt.Errorf("%w: channel %d in use", syscall.EBUSY, h)
	}
	unix.Close(o.w)
	c.s.led.chargeFDs(c.uid, -1)
	delete(c.chans, h)
	return nil
}

// cleanup frees what the connection left, as closing a uverbs file does:
// QPs to ERR and destroyed first (nothing posts on the client's memory
// any more), then MRs deregistered (verbs waits for in-flight accesses)
// and unmapped, then CQs, channels and PDs.
func (c *client) cleanup() {
	c.conn.Close()
	c.cmCleanup()
	d := c.dev
	if d == nil {
		return
	}
	d.removeDoorbell(c.bell)
	unix.Close(c.bell)
	d.mu.Lock()
	defer d.mu.Unlock()
	c.s.mu.Lock()
	unix.Close(c.evW)
	c.evW = -1
	c.s.mu.Unlock()
	for h, q := range c.qps {
		q.toErr()
		c.destroyQP(h)
	}
	c.cleanupUD()
	for h := range c.mws { // windows first: a region with one bound cannot go
		c.deallocMW(h)
	}
	for h := range c.mrs {
		c.deregMR(h)
	}
	for h := range c.cqs {
		c.destroyCQ(h)
	}
	for h := range c.chans {
		c.destroyChannel(h)
	}
	for h := range c.pds {
		c.deallocPD(h)
	}
}
