package mad

import "fmt"

// RejReason is a REJ's reason code (IBTA §12.6.7, table 109).
type RejReason uint16

// The reasons IBTA vol. 1 defines.
const (
	RejNoQP                      RejReason = 1
	RejNoEEC                     RejReason = 2
	RejNoResources               RejReason = 3
	RejTimeout                   RejReason = 4
	RejUnsupported               RejReason = 5
	RejInvalidCommID             RejReason = 6
	RejInvalidCommInstance       RejReason = 7
	RejInvalidServiceID          RejReason = 8 // nobody listens on the service
	RejInvalidTransportType      RejReason = 9
	RejStaleConn                 RejReason = 10
	RejRDCNotExist               RejReason = 11
	RejInvalidGID                RejReason = 12
	RejInvalidLID                RejReason = 13
	RejInvalidSL                 RejReason = 14
	RejInvalidTrafficClass       RejReason = 15
	RejInvalidHopLimit           RejReason = 16
	RejInvalidPacketRate         RejReason = 17
	RejInvalidAltGID             RejReason = 18
	RejInvalidAltLID             RejReason = 19
	RejInvalidAltSL              RejReason = 20
	RejInvalidAltTrafficClass    RejReason = 21
	RejInvalidAltHopLimit        RejReason = 22
	RejInvalidAltPacketRate      RejReason = 23
	RejPortCMRedirect            RejReason = 24
	RejPortRedirect              RejReason = 25
	RejInvalidMTU                RejReason = 26
	RejInsufficientRespResources RejReason = 27
	RejConsumerDefined           RejReason = 28 // the application said no (rdma_reject)
	RejInvalidRNRRetry           RejReason = 29
	RejDuplicateLocalCommID      RejReason = 30
	RejInvalidClassVersion       RejReason = 31
	RejInvalidFlowLabel          RejReason = 32
	RejInvalidAltFlowLabel       RejReason = 33
	RejVendorOptionNotSupported  RejReason = 35
)

var rejNames = map[RejReason]string{
	RejNoQP:                      "no QP available",
	RejNoEEC:                     "no EEC available",
	RejNoResources:               "no resources available",
	RejTimeout:                   "timeout",
	RejUnsupported:               "unsupported request",
	RejInvalidCommID:             "invalid comm ID",
	RejInvalidCommInstance:       "invalid comm instance",
	RejInvalidServiceID:          "invalid service ID",
	RejInvalidTransportType:      "invalid transport service type",
	RejStaleConn:                 "stale connection",
	RejRDCNotExist:               "RDC does not exist",
	RejInvalidGID:                "primary remote port GID rejected",
	RejInvalidLID:                "primary remote port LID rejected",
	RejInvalidSL:                 "invalid primary SL",
	RejInvalidTrafficClass:       "invalid primary traffic class",
	RejInvalidHopLimit:           "invalid primary hop limit",
	RejInvalidPacketRate:         "invalid primary packet rate",
	RejInvalidAltGID:             "alternate remote port GID rejected",
	RejInvalidAltLID:             "alternate remote port LID rejected",
	RejInvalidAltSL:              "invalid alternate SL",
	RejInvalidAltTrafficClass:    "invalid alternate traffic class",
	RejInvalidAltHopLimit:        "invalid alternate hop limit",
	RejInvalidAltPacketRate:      "invalid alternate packet rate",
	RejPortCMRedirect:            "port and CM redirection",
	RejPortRedirect:              "port redirection",
	RejInvalidMTU:                "invalid path MTU",
	RejInsufficientRespResources: "insufficient responder resources",
	RejConsumerDefined:           "consumer defined",
	RejInvalidRNRRetry:           "invalid RNR NAK retry count",
	RejDuplicateLocalCommID:      "duplicate local comm ID",
	RejInvalidClassVersion:       "unsupported class version",
	RejInvalidFlowLabel:          "invalid primary flow label",
	RejInvalidAltFlowLabel:       "invalid alternate flow label",
	RejVendorOptionNotSupported:  "vendor option not supported",
}

// Known reports whether r is a reason IBTA defines.
func (r RejReason) Known() bool { _, ok := rejNames[r]; return ok }

// String names the reason ("invalid service ID"), or gives its number.
func (r RejReason) String() string {
	if s, ok := rejNames[r]; ok {
		return s
	}
	return fmt.Sprintf("reason %d", uint16(r))
}
