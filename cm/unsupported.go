package cm

import (
	"encoding/binary"

	"github.com/softroce/softroce/bth/mad"
)

// statusUnsupportedMethodAttr is the MAD status "unsupported method/
// attribute combination" (IBTA §13.4.7: code 3 in bits 2-4).
const statusUnsupportedMethodAttr = 0x000c

// answerUnsupported answers a Get or Set that nothing on this QP1 serves
// the way the kernel's MAD layer does on a host whose only agent on QP1
// is the CM: the MAD comes back unchanged but for method GetResp and
// status 0x000C. Like the kernel it stays silent for SMPs (they belong on
// QP0), for CM attributes other than ClassPortInfo sent with any method
// but Send, for other base versions and for every other method. It
// reports whether it answered.
func (e *engine) answerUnsupported(from Peer, b []byte) bool {
	if len(b) != MADSize {
		return false
	}
	m := mad.MAD(b)
	switch {
	case m.BaseVersion() != mad.BaseVersion,
		m.MgmtClass() == classSMPLIDRouted || m.MgmtClass() == classSMPDirected,
		m.Method() != mad.MethodGet && m.Method() != mad.MethodSet,
		m.MgmtClass() == mad.ClassCM && m.AttrID() != mad.AttrClassPortInfo:
		return false
	}
	r := e.scratch[:]
	copy(r, b)
	r[3] = byte(mad.MethodGetResp)
	binary.BigEndian.PutUint16(r[4:], statusUnsupportedMethodAttr)
	e.stats.Unsupported++
	e.send(from, r)
	return true
}

// The subnet management classes, which QP1 never serves.
const (
	classSMPLIDRouted = 0x01
	classSMPDirected  = 0x81
)
