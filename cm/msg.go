package cm

// The engine works on a decoded form of each CM message: the fields it
// acts on, copied out of the 256-byte MAD by the codec (wire.go). Keeping
// the state machine on this struct rather than on the wire views means
// every handler sees values that were range-checked once, in one place.

// CM attribute IDs (IBTA vol. 1 §12.6, table 103).
const (
	attrREQ     uint16 = 0x0010
	attrMRA     uint16 = 0x0011
	attrREJ     uint16 = 0x0012
	attrREP     uint16 = 0x0013
	attrRTU     uint16 = 0x0014
	attrDREQ    uint16 = 0x0015
	attrDREP    uint16 = 0x0016
	attrSIDRReq uint16 = 0x0017
	attrSIDRRep uint16 = 0x0018
	attrLAP     uint16 = 0x0019
	attrAPR     uint16 = 0x001A
)

// Message-rejected / message-MRAed values.
const (
	msgRespREQ   uint8 = 0
	msgRespREP   uint8 = 1
	msgRespOther uint8 = 2
)

// REJ reasons the engine sends or acts on (IBTA vol. 1 table 112).
const (
	RejNoQP                  uint16 = 1
	RejNoResources           uint16 = 3
	RejTimeout               uint16 = 4
	RejInvalidCommID         uint16 = 6
	RejInvalidServiceID      uint16 = 8
	RejInvalidTransportType  uint16 = 9
	RejStaleConn             uint16 = 10
	RejInvalidMTU            uint16 = 26
	RejInsufficientResources uint16 = 27
	RejConsumerDefined       uint16 = 28
)

// SIDR_REP statuses (IBTA vol. 1 table 119).
const (
	SIDRSuccess     uint8 = 0
	SIDRUnsupported uint8 = 1 // no service with that ID
	SIDRReject      uint8 = 2
	SIDRNoQP        uint8 = 3
)

// Private data sizes of each message (the room left after its fields).
const (
	reqPrivate     = 92
	repPrivate     = 196
	rtuPrivate     = 224
	rejPrivate     = 148
	mraPrivate     = 222
	dreqPrivate    = 220
	drepPrivate    = 224
	sidrReqPrivate = 216
	sidrRepPrivate = 136
)

// Transport service types in a REQ.
const (
	transportRC uint8 = 0
	transportUC uint8 = 1
)

// msg is one decoded CM message. Private aliases the received buffer and
// is only valid while the handler runs; handlers copy what they keep.
type msg struct {
	attr uint16
	tid  uint64

	localID, remoteID uint32 // comm IDs as the sender names them

	// REQ
	serviceID       uint64
	caGUID          uint64 // REQ and REP: the sender's CA GUID
	qkey            uint32
	qpn             uint32 // REQ local QPN, REP local QPN, DREQ remote QPN, SIDR_REP QPN
	respRes         uint8
	initDepth       uint8
	remoteCMTimeout uint8
	transport       uint8
	psn             uint32
	localCMTimeout  uint8
	retryCount      uint8
	pkey            uint16
	mtu             uint8
	rnrRetry        uint8
	maxCMRetries    uint8
	srq             bool
	flowControl     bool     // end-to-end flow control (REQ, REP)
	localGID        [16]byte // REQ primary local port GID
	remoteGID       [16]byte // REQ primary remote port GID
	flowLabel       uint32
	trafficClass    uint8
	hopLimit        uint8
	sl              uint8
	localAckTimeout uint8

	// REP
	targetAckDelay uint8

	// REJ
	msgRejected uint8
	reason      uint16
	ari         []byte

	// MRA
	msgMRAed       uint8
	serviceTimeout uint8

	// SIDR (requestID travels in localID)
	status uint8

	private []byte
}
