package serve

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// The control protocol, byte for byte as abi/softroce_proto.h defines it.
// Every request is untrusted: decode checks the exact length of each body
// before a field is read, so a short, long or unknown message is an error
// and never a panic.

const (
	protoVersion = 4 // 2: CREATE_QP answers a QP token, ATTACH_QP carries it; HELLO's answer carries the network namespace; 3: CM_OPEN answers a channel token, CM_MIGRATE_ID; 4: RDMA_VIEW
	maxMsg       = 4096
	maxExtents   = 64
	nameLen      = 64
	pageSize     = 4096
)

// Operation codes (enum sr_op).
const (
	opHello          = 1
	opOpen           = 2
	opQueryDevice    = 3
	opQueryPort      = 4
	opQueryGID       = 5
	opAllocPD        = 6
	opDeallocPD      = 7
	opRegMR          = 8
	opDeregMR        = 9
	opCreateCQ       = 10
	opDestroyCQ      = 11
	opCreateQP       = 12
	opModifyQP       = 13
	opQueryQP        = 14
	opDestroyQP      = 15
	opCreateChannel  = 16
	opDestroyChannel = 17
	opStatus         = 18 // resp: the daemon's Status as JSON, cut at maxMsg
	// UD address handles and SRQs: 19..39 (ud.go, srq.go).
	opCreateAH   = 19
	opDestroyAH  = 20
	opCreateSRQ  = 21
	opModifySRQ  = 22
	opQuerySRQ   = 23
	opDestroySRQ = 24
	opRdmaView   = 25 // body: u32 first item, u32 0; resp: a page of the rdma views as JSON (rdmaview.go)
	opLast       = opRdmaView
	// rdma_cm: 40..69 (cmproto.go). Memory windows and IOVA
	// registration: 80..89 (mw.go). Resizing CQs and SRQs: 90..99
	// (resize.go).
	opAllocMW   = 80
	opDeallocMW = 81
	opRegMRIOVA = 82
)

// Sizes of the fixed structs.
const (
	sizeReq       = 8
	sizeResp      = 8
	sizeHandle    = 8
	sizeHello     = 8
	sizeHelloResp = 24
	sizeDevEntry  = nameLen + 8
	sizeDevAttr   = 96
	sizePortAttr  = 32
	sizeGIDReq    = 8
	sizeGID       = 24
	sizeRegMR     = 32
	sizeRegMRIOVA = sizeRegMR + 8
	sizeAllocMW   = 8
	sizeMWResp    = 8
	sizeExtent    = 24
	sizeMR        = 16
	sizeCreateCQ  = 8
	sizeCQ        = 16
	sizeCreateQP  = 48 // with the appended srq field; sizeCreateQP1 without
	sizeCreateQP1 = 40
	sizeQP        = 80
	sizeQPAttr    = 128
	sizeModifyQP  = 8 + sizeQPAttr
	sizeSendWQE   = 80
	sizeSGE       = 16
	sizeRecvWQE   = 16
	cqeSize       = 64
	ctlPage       = pageSize
	offSQProd     = 0
	offSQCons     = 64
	offRQProd     = 128
	offRQCons     = 192
	offSleeping   = 256
	offQPError    = 260
	offCQProd     = 0
	offCQCons     = 64
	offCQArmed    = 128
	offCQOverrun  = 192
	armAny        = 1
	armSolicited  = 2
	gidTypeRoCEv2 = 1
)

var le = binary.LittleEndian

// errMsg is a malformed request: answered with EINVAL, counted.
var errMsg = errors.New("serve: malformed request")

// request is a decoded request header and its body.
type request struct {
	op   uint32
	body []byte
}

// parseRequest splits a message into its op and body, checking the op is
// known and the body has exactly the length the op needs (REG_MR: its
// header plus the extents it announces).
func parseRequest(b []byte) (request, error) {
	if len(b) < sizeReq || len(b) > maxMsg {
		return request{}, fmt.Errorf("%w: %d bytes", errMsg, len(b))
	}
	r := request{op: le.Uint32(b), body: b[sizeReq:]}
	want := -1
	switch r.op {
	case opHello:
		want = sizeHello
	case opOpen, opDeallocPD, opDeregMR, opDestroyCQ, opQueryQP, opDestroyQP, opDestroyChannel, opQueryPort, opDeallocMW:
		want = sizeHandle
	case opQueryDevice, opAllocPD, opCreateChannel, opStatus:
		want = 0
	case opQueryGID:
		want = sizeGIDReq
	case opRdmaView:
		want = 8
	case opCreateCQ:
		want = sizeCreateCQ
	case opCreateQP:
		// The body without the appended srq field is a QP with no SRQ.
		want = sizeCreateQP
		if len(r.body) == sizeCreateQP1 {
			want = sizeCreateQP1
		}
	case opCreateAH, opCreateSRQ, opModifySRQ, opDestroyAH, opQuerySRQ, opDestroySRQ:
		want = udBodySize(r.op)
	case opModifyQP:
		want = sizeModifyQP
	case opAllocMW:
		want = sizeAllocMW
	case opResizeCQ, opResizeSRQ:
		want = resizeBodySize(r.op)
	case opRegMR, opRegMRIOVA:
		hdr := regMRHeader(r.op)
		if len(r.body) < hdr {
			return request{}, fmt.Errorf("%w: REG_MR of %d bytes", errMsg, len(r.body))
		}
		n := le.Uint32(r.body[24:])
		if n == 0 || n > maxExtents {
			return request{}, fmt.Errorf("%w: REG_MR with %d extents", errMsg, n)
		}
		want = hdr + int(n)*sizeExtent
	default:
		if r.op < opCMFirst || r.op > opCMKnownLast { // CM ops: serve/cmproto.go
			return request{}, fmt.Errorf("%w: unknown op %d", errMsg, r.op)
		}
		want = sizeCMReq
	}
	if len(r.body) != want {
		return request{}, fmt.Errorf("%w: op %d body of %d bytes, want %d", errMsg, r.op, len(r.body), want)
	}
	return r, nil
}

// u32 reads the i-th uint32 of a body whose length parseRequest checked.
func u32(b []byte, i int) uint32 { return le.Uint32(b[4*i:]) }

// regMR is a decoded REG_MR or REG_MR_IOVA.
type regMR struct {
	pd, access   uint32
	addr, length uint64
	iova         uint64 // the region's VA: addr for REG_MR
	extents      []extent
}

type extent struct{ va, len, off uint64 }

// regMRHeader is the size of op's fixed part, before the extents.
func regMRHeader(op uint32) int {
	if op == opRegMRIOVA {
		return sizeRegMRIOVA
	}
	return sizeRegMR
}

func decodeRegMR(op uint32, b []byte, ext []extent) regMR {
	r := regMR{pd: u32(b, 0), access: u32(b, 1), addr: le.Uint64(b[8:]), length: le.Uint64(b[16:])}
	r.iova = r.addr
	hdr := regMRHeader(op)
	if op == opRegMRIOVA {
		r.iova = le.Uint64(b[sizeRegMR:])
	}
	n := int(le.Uint32(b[24:]))
	for i := range n {
		e := b[hdr+i*sizeExtent:]
		ext = append(ext, extent{va: le.Uint64(e), len: le.Uint64(e[8:]), off: le.Uint64(e[16:])})
	}
	r.extents = ext
	return r
}

// qpAttrWire is struct sr_qp_attr.
type qpAttrWire struct {
	state, curState, pathMTU, access       uint32
	rqPSN, sqPSN, destQPN, flowLabel       uint32
	sgidIndex, hopLimit, trafficClass, sl  uint32
	timeout, retryCnt, rnrRetry, minRNR    uint32
	maxRDAtomic, maxDestRDAtomic, port, pk uint32
	isGlobal, qkey                         uint32
	dgid                                   [16]byte
	maxSendWR, maxRecvWR                   uint32
	maxSendSGE, maxRecvSGE, maxInline      uint32
}

func decodeQPAttr(b []byte) qpAttrWire {
	var a qpAttrWire
	f := []*uint32{&a.state, &a.curState, &a.pathMTU, &a.access, &a.rqPSN, &a.sqPSN, &a.destQPN, &a.flowLabel,
		&a.sgidIndex, &a.hopLimit, &a.trafficClass, &a.sl, &a.timeout, &a.retryCnt, &a.rnrRetry, &a.minRNR,
		&a.maxRDAtomic, &a.maxDestRDAtomic, &a.port, &a.pk, &a.isGlobal, &a.qkey}
	for i, p := range f {
		*p = u32(b, i)
	}
	copy(a.dgid[:], b[88:104])
	a.maxSendWR, a.maxRecvWR, a.maxSendSGE, a.maxRecvSGE, a.maxInline = u32(b, 26), u32(b, 27), u32(b, 28), u32(b, 29), u32(b, 30)
	return a
}

func (a *qpAttrWire) encode(b []byte) []byte {
	for _, v := range []uint32{a.state, a.curState, a.pathMTU, a.access, a.rqPSN, a.sqPSN, a.destQPN, a.flowLabel,
		a.sgidIndex, a.hopLimit, a.trafficClass, a.sl, a.timeout, a.retryCnt, a.rnrRetry, a.minRNR,
		a.maxRDAtomic, a.maxDestRDAtomic, a.port, a.pk, a.isGlobal, a.qkey} {
		b = le.AppendUint32(b, v)
	}
	b = append(b, a.dgid[:]...)
	for _, v := range []uint32{a.maxSendWR, a.maxRecvWR, a.maxSendSGE, a.maxRecvSGE, a.maxInline, 0} {
		b = le.AppendUint32(b, v)
	}
	return b
}

// mtuEnum converts bytes to enum ibv_mtu (0 for a size that is none).
func mtuEnum(bytes int) uint32 {
	for e, s := uint32(1), 256; s <= 4096; e, s = e+1, s*2 {
		if s == bytes {
			return e
		}
	}
	return 0
}

// mtuBytes converts enum ibv_mtu to bytes (0 for an unknown value).
func mtuBytes(e uint32) int {
	if e < 1 || e > 5 {
		return 0
	}
	return 128 << e
}
