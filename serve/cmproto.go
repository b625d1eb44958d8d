package serve

import (
	"fmt"
	"net/netip"
	"strconv"
	"syscall"
)

// The connection-management ops (abi/c/softroce_cm.h): what
// librdmacm.so.1 asks on an event channel's connection.
const (
	opCMOpen         = 40
	opCMCreateID     = 41
	opCMDestroyID    = 42
	opCMBind         = 43
	opCMResolveAddr  = 44
	opCMResolveRoute = 45
	opCMListen       = 46
	opCMConnect      = 47
	opCMAccept       = 48
	opCMReject       = 49
	opCMDisconnect   = 50
	opCMGetEvent     = 51
	opCMAttachQP     = 52
	opCMDetachQP     = 53
	opCMQuery        = 54
	opCMMigrateID    = 55
	opCMFirst        = 40
	opCMLast         = 69
	opCMKnownLast    = opCMMigrateID
)

const (
	cmPrivate    = 256
	sizeSockaddr = 24
	sizeCMParam  = 8
	sizeCMReq    = 40 + 2*sizeSockaddr + cmPrivate + 8 // + qp_token
	sizeCMResp   = 8 + 2*sizeSockaddr + 8              // + token
	sizeCMEvent  = 32 + 2*sizeSockaddr + sizeCMParam + cmPrivate
	cmNoDev      = 0xffffffff
	afInet       = 2
	afInet6      = 10
)

// rdma_cm event types (enum rdma_cm_event_type).
const (
	cmEvAddrResolved   = 0
	cmEvAddrError      = 1
	cmEvRouteResolved  = 2
	cmEvRouteError     = 3
	cmEvConnectRequest = 4
	cmEvConnectError   = 6
	cmEvUnreachable    = 7
	cmEvRejected       = 8
	cmEvEstablished    = 9
	cmEvDisconnected   = 10
	cmEvDeviceRemoval  = 11
)

type cmParam struct {
	respRes, initDepth, flowControl, retry, rnrRetry, srq, valid uint8
}

// cmReq is a decoded struct sr_cm_req.
type cmReq struct {
	id, ps, qpType, qpn, timeoutMS, qkey uint32
	qpToken                              uint64 // ATTACH_QP: the token CREATE_QP gave the QP; MIGRATE_ID: the new channel's
	param                                cmParam
	priv                                 []byte
	src, dst                             netip.AddrPort
	hasSrc, hasDst                       bool
}

// decodeSockaddr reads a struct sr_sockaddr; family 0 is "none". The
// scope id of an IPv6 link-local address (sin6_scope_id, the interface
// index in the program's network namespace) becomes its zone, in
// decimal; other addresses have no scope.
func decodeSockaddr(b []byte) (netip.AddrPort, bool, error) {
	fam, port := le.Uint16(b), le.Uint16(b[2:])
	switch fam {
	case 0:
		return netip.AddrPort{}, false, nil
	case afInet:
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[8:12])), port), true, nil
	case afInet6:
		a := netip.AddrFrom16([16]byte(b[8:24])).Unmap()
		if scope := le.Uint32(b[4:]); scope != 0 && isLinkLocal(a) {
			a = a.WithZone(strconv.FormatUint(uint64(scope), 10))
		}
		return netip.AddrPortFrom(a, port), true, nil
	}
	return netip.AddrPort{}, false, fmt.Errorf("%w: address family %d", syscall.EAFNOSUPPORT, fam)
}

func appendSockaddr(out []byte, a netip.AddrPort) []byte {
	var b [sizeSockaddr]byte
	if a.IsValid() {
		ip := a.Addr()
		if ip.Is4() {
			le.PutUint16(b[:], afInet)
			v := ip.As4()
			copy(b[8:], v[:])
		} else {
			le.PutUint16(b[:], afInet6)
			v := ip.As16()
			copy(b[8:], v[:])
			le.PutUint32(b[4:], scopeOf(ip))
		}
		le.PutUint16(b[2:], a.Port())
	}
	return append(out, b[:]...)
}

// isLinkLocal says whether a is an IPv6 link-local unicast address (an
// IPv4 one, fe80::/10's IPv4 counterpart, is not: it has no scope id).
func isLinkLocal(a netip.Addr) bool { return a.Is6() && !a.Is4In6() && a.IsLinkLocalUnicast() }

// scopeOf is the scope id an address's zone holds (decodeSockaddr), 0 for
// none.
func scopeOf(a netip.Addr) uint32 {
	n, err := strconv.ParseUint(a.Zone(), 10, 32)
	if err != nil {
		return 0
	}
	return uint32(n)
}

func decodeCMReq(b []byte) (cmReq, error) {
	var r cmReq
	r.id, r.ps, r.qpType, r.qpn, r.timeoutMS, r.qkey = u32(b, 0), u32(b, 1), u32(b, 2), u32(b, 3), u32(b, 4), u32(b, 5)
	p := b[24:32]
	r.param = cmParam{p[0], p[1], p[2], p[3], p[4], p[5], p[6]}
	n := u32(b, 8)
	if n > cmPrivate {
		return r, fmt.Errorf("%w: %d bytes of private data", syscall.EINVAL, n)
	}
	var err error
	if r.src, r.hasSrc, err = decodeSockaddr(b[40:]); err != nil {
		return r, err
	}
	if r.dst, r.hasDst, err = decodeSockaddr(b[40+sizeSockaddr:]); err != nil {
		return r, err
	}
	r.priv = b[40+2*sizeSockaddr : 40+2*sizeSockaddr+int(n)]
	r.qpToken = le.Uint64(b[40+2*sizeSockaddr+cmPrivate:])
	return r, nil
}

// cmEvent is one queued struct sr_cm_event.
type cmEvent struct {
	id, typ  uint32
	status   int32
	listen   uint32
	dev      uint32
	qpn      uint32
	qkey     uint32
	src, dst netip.AddrPort
	param    cmParam
	priv     []byte
}

func (e *cmEvent) encode() []byte {
	out := make([]byte, 0, sizeCMEvent)
	for _, v := range []uint32{e.id, e.typ, uint32(e.status), e.listen, e.dev, e.qpn, e.qkey, uint32(min(len(e.priv), cmPrivate))} {
		out = le.AppendUint32(out, v)
	}
	out = appendSockaddr(out, e.src)
	out = appendSockaddr(out, e.dst)
	p := e.param
	out = append(out, p.respRes, p.initDepth, p.flowControl, p.retry, p.rnrRetry, p.srq, p.valid, 0)
	var priv [cmPrivate]byte
	copy(priv[:], e.priv)
	return append(out, priv[:]...)
}

func cmResp(id, dev uint32, src, dst netip.AddrPort) []byte {
	out := le.AppendUint32(nil, id)
	out = le.AppendUint32(out, dev)
	out = appendSockaddr(out, src)
	out = appendSockaddr(out, dst)
	return le.AppendUint64(out, 0)
}

// cmOpenResp is CM_OPEN's answer: the channel's token.
func cmOpenResp(token uint64) []byte {
	out := cmResp(0, cmNoDev, netip.AddrPort{}, netip.AddrPort{})
	le.PutUint64(out[sizeCMResp-8:], token)
	return out
}
