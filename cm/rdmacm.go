package cm

import (
	"errors"
	"fmt"
	"time"

	"github.com/softroce/softroce/bth/mad"
)

// PortSpace is an rdma_cm port space; a service ID is port space << 16 | port.
type PortSpace = mad.PortSpace

// The port spaces of rdma_cm.
const (
	PortSpaceTCP = mad.PortSpaceTCP // RDMA_PS_TCP: RC connections
	PortSpaceUDP = mad.PortSpaceUDP // RDMA_PS_UDP: UD, resolved by SIDR
	PortSpaceIB  = mad.PortSpaceIB  // RDMA_PS_IB
)

// UDPQKey is the Q_Key rdma_cm gives UD QPs (RDMA_UDP_QKEY).
const UDPQKey = mad.RDMAUDPQKey

// ServiceID is the CM service ID of a port in a port space.
func ServiceID(ps PortSpace, port uint16) uint64 { return uint64(mad.RDMACMServiceID(ps, port)) }

// Largest private data a connection request can carry after the 36-byte
// cma_hdr rdma_cm puts in front of it.
const (
	MaxConnPrivateData   = reqPrivate - mad.CMAHeaderLen     // 56
	MaxUDPrivateData     = sidrReqPrivate - mad.CMAHeaderLen // 180
	MaxAcceptPrivateData = repPrivate                        // 196
	MaxRejectPrivateData = rejPrivate                        // 148
)

// Errors users meet. Match them with errors.Is; a rejection is also a
// *RejectError with the reason and the peer's private data.
var (
	// ErrNoListener: the peer answered REJ 8 "invalid service ID" (or a
	// SIDR_REP "service ID not supported"): nobody listens on that port.
	ErrNoListener = errors.New("cm: nobody listens on that port (REJ invalid service ID)")
	// ErrRejected: the peer's application or CM rejected the request.
	ErrRejected = errors.New("cm: connection rejected")
	// ErrUnreachable: no answer after every retry of the CM response
	// timeout (rdma_cm's RDMA_CM_EVENT_UNREACHABLE).
	ErrUnreachable = errors.New("cm: peer unreachable: no answer after the CM retries")
	// ErrDisconnectTimeout: the DREQ was never answered by a DREP; the
	// connection is down anyway.
	ErrDisconnectTimeout = errors.New("cm: disconnect request never answered (no DREP after the CM retries)")
	// ErrDisconnected: the connection is gone (the peer disconnected or
	// rejected it after it was established).
	ErrDisconnected = errors.New("cm: disconnected")
	// ErrClosed: the CM or listener was closed.
	ErrClosed = errors.New("cm: closed")
	// ErrExpired: the connection request waited too long for Accept and
	// was rejected.
	ErrExpired = errors.New("cm: connection request expired before it was accepted")
)

// RejectError is a REJ from the peer.
type RejectError struct {
	Reason      uint16 // IBTA REJ reason (8 invalid service ID, 28 consumer defined, ...)
	PrivateData []byte // the REJ's private data area (148 bytes, as rdma_cm reports it)
}

func (e *RejectError) Error() string {
	switch e.Reason {
	case RejInvalidServiceID:
		return "cm: nobody listens on that port at the peer: REJ reason 8 (invalid service ID)"
	case RejConsumerDefined:
		return "cm: the peer's application rejected the connection: REJ reason 28 (consumer defined; see PrivateData)"
	}
	return fmt.Sprintf("cm: connection rejected by the peer: REJ reason %d (%s)", e.Reason, mad.RejReason(e.Reason))
}

// Is matches ErrRejected, and ErrNoListener for reason 8.
func (e *RejectError) Is(target error) bool {
	return target == ErrRejected || (target == ErrNoListener && e.Reason == RejInvalidServiceID)
}

// ConnParam are the connection parameters (struct rdma_conn_param).
type ConnParam struct {
	PrivateData []byte
	// ResponderResources are the RDMA READ/atomic requests this side
	// accepts at once from the peer; InitiatorDepth those it issues.
	ResponderResources uint8
	InitiatorDepth     uint8
	FlowControl        bool
	// RetryCount (transport retries) and RNRRetryCount (7: forever) are
	// capped at 7. The RNR retry count a side sends is the one its peer
	// uses.
	RetryCount    uint8
	RNRRetryCount uint8
	// SourcePort is the source port the REQ's cma_hdr names, which the
	// passive side reports as its peer's (rdma_get_peer_addr): rdma_cm
	// puts its id's own port there. 0: an ephemeral port.
	SourcePort uint16
}

// DefaultConnParam is what a nil *ConnParam means: one READ each way,
// seven retries, RNR retries forever.
var DefaultConnParam = ConnParam{ResponderResources: 1, InitiatorDepth: 1, RetryCount: 7, RNRRetryCount: 7}

// Clock is the time the CM runs on; tests inject a simulated one.
type Clock interface {
	Now() time.Time
	// NewTimer fires once after d.
	NewTimer(d time.Duration) Timer
}

// Timer is a Clock's one-shot timer.
type Timer interface {
	C() <-chan time.Time
	Stop() bool
}

type realClock struct{}

type realTimer struct{ t *time.Timer }

func (realClock) Now() time.Time                 { return time.Now() }
func (realClock) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }
func (t realTimer) C() <-chan time.Time          { return t.t.C }
func (t realTimer) Stop() bool                   { return t.t.Stop() }
