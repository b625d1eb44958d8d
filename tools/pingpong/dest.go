package pingpong

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/softroce/softroce/verbs"
)

// MsgLen is the size of one address message: "%04x:%06x:%06x:%s" with a
// 32-hex-digit GID, plus the terminating NUL; always sent whole.
const MsgLen = 52

// Dest is what one side announces for one QP: LID (0 on Ethernet), QPN,
// PSN and GID.
type Dest struct {
	LID uint16
	QPN uint32
	PSN uint32
	GID verbs.GID
}

// Marshal formats d as the pingpong tools do, NUL-padded to MsgLen bytes.
func (d Dest) Marshal() []byte {
	s := fmt.Sprintf("%04x:%06x:%06x:%s", d.LID, d.QPN&0xffffff, d.PSN&0xffffff, hex.EncodeToString(d.GID[:]))
	b := make([]byte, MsgLen)
	copy(b, s)
	return b
}

// ParseDest reads one address message of a peer. The tools read it with
// sscanf, which stops at the NUL; what follows the NUL is ignored here too.
// Everything before it must be the exact format: a peer that speaks
// another protocol (perftest, say) on the same port gets a clear error.
func ParseDest(b []byte) (Dest, error) {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	s := string(b)
	parts := strings.Split(s, ":")
	if len(parts) != 4 || len(parts[0]) != 4 || len(parts[1]) != 6 || len(parts[2]) != 6 || len(parts[3]) != 32 {
		return Dest{}, fmt.Errorf("malformed address message %q from the peer (want LID:QPN:PSN:GID as 4, 6, 6 and 32 hex digits)", s)
	}
	var d Dest
	lid, err := strconv.ParseUint(parts[0], 16, 16)
	if err != nil {
		return Dest{}, fmt.Errorf("malformed address message %q from the peer: LID %q is not hex", s, parts[0])
	}
	qpn, err := strconv.ParseUint(parts[1], 16, 24)
	if err != nil {
		return Dest{}, fmt.Errorf("malformed address message %q from the peer: QPN %q is not hex", s, parts[1])
	}
	psn, err := strconv.ParseUint(parts[2], 16, 24)
	if err != nil {
		return Dest{}, fmt.Errorf("malformed address message %q from the peer: PSN %q is not hex", s, parts[2])
	}
	g, err := hex.DecodeString(parts[3])
	if err != nil {
		return Dest{}, fmt.Errorf("malformed address message %q from the peer: GID %q is not hex", s, parts[3])
	}
	d.LID, d.QPN, d.PSN = uint16(lid), uint32(qpn), uint32(psn)
	copy(d.GID[:], g)
	return d, nil
}

// gidString formats a GID as the tools print it (inet_ntop of AF_INET6:
// "::ffff:192.168.122.113" for an IPv4-mapped GID, "::" for none).
func gidString(g verbs.GID) string { return netip.AddrFrom16(g).String() }
