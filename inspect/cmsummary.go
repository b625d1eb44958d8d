package inspect

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/softroce/softroce/bth/mad"
)

// CMConn is one connection attempt as the CM MADs of a capture tell it:
// a REQ and what followed it (REP, MRA, RTU, REJ, DREQ, DREP), matched by
// comm IDs, or a SIDR_REQ and its SIDR_REP, matched by request ID.
type CMConn struct {
	SIDR       bool       `json:"sidr,omitempty"`
	Active     netip.Addr `json:"active"`         // the REQ's (SIDR_REQ's) sender
	Passive    netip.Addr `json:"passive"`        // its receiver
	ActiveID   uint32     `json:"active_comm_id"` // REQ local comm ID, or SIDR request ID
	PassiveID  *uint32    `json:"passive_comm_id,omitempty"`
	ServiceID  uint64     `json:"service_id"`
	Service    string     `json:"service"` // "RDMA_PS_TCP:7174" or hex
	ActiveQPN  *uint32    `json:"active_qpn,omitempty"`
	PassiveQPN *uint32    `json:"passive_qpn,omitempty"` // from REP or SIDR_REP
	QKey       *uint32    `json:"qkey,omitempty"`        // SIDR_REP
	// Messages are the MADs in capture order, "<" marking those the
	// passive side sent: "REQ", "<REP", "RTU".
	Messages []string `json:"messages"`
	// Retransmissions counts messages seen again from the same side.
	Retransmissions int     `json:"retransmissions"`
	RejReason       *uint16 `json:"rej_reason,omitempty"`
	// State is what the exchange came to: "unanswered", "REP sent, no
	// RTU", "established", "disconnecting (no DREP)", "disconnected",
	// "rejected: 8 (invalid service ID)", "resolved", "SIDR status 1 (...)".
	State string `json:"state"`

	seen map[string]bool
}

// maxCMConns bounds the connections a summary tracks, more are counted;
// the text summary lists the first maxCMText of them.
const (
	maxCMConns = 1000
	maxCMText  = 50
)

type cmIDKey struct {
	addr netip.Addr
	id   uint32
	sidr bool
}

// cmTracker follows the CM exchanges of a capture.
type cmTracker struct {
	byID      map[cmIDKey]*CMConn
	conns     []*CMConn
	untracked int // beyond maxCMConns
	unmatched int // MADs that belong to no REQ or SIDR_REQ seen
}

func (k *cmTracker) add(r *Record) {
	c := r.CM
	if c == nil || c.Error != "" {
		return
	}
	if k.byID == nil {
		k.byID = map[cmIDKey]*CMConn{}
	}
	var conn *CMConn
	switch c.Message {
	case "REQ", "SIDR_REQ":
		sidr := c.Message == "SIDR_REQ"
		id := c.LocalCommID
		if sidr {
			id = c.RequestID
		}
		key := cmIDKey{r.Src, *id, sidr}
		conn = k.byID[key]
		if conn == nil {
			if len(k.conns) >= maxCMConns {
				k.untracked++
				return
			}
			conn = &CMConn{SIDR: sidr, Active: r.Src, Passive: r.Dst, ActiveID: *id, seen: map[string]bool{}}
			if c.ServiceID != nil {
				conn.ServiceID = *c.ServiceID
				conn.Service = mad.ServiceID(*c.ServiceID).String()
			}
			if c.QPN != nil {
				v := *c.QPN
				conn.ActiveQPN = &v
			}
			k.byID[key] = conn
			k.conns = append(k.conns, conn)
		}
	case "SIDR_REP":
		conn = k.byID[cmIDKey{r.Dst, *c.RequestID, true}]
		if conn != nil && *c.SIDRStatus == mad.SIDRSuccess {
			q, qk := *c.QPN, *c.QKey
			conn.PassiveQPN, conn.QKey = &q, &qk
		}
	default:
		if c.LocalCommID == nil || c.RemoteCommID == nil {
			k.unmatched++
			return
		}
		l, rc := *c.LocalCommID, *c.RemoteCommID
		if l != 0 {
			conn = k.byID[cmIDKey{r.Src, l, false}]
		}
		if conn == nil {
			conn = k.byID[cmIDKey{r.Dst, rc, false}]
		}
		// The passive side names itself in its first answer (MRA or REP).
		if conn != nil && r.Src == conn.Passive && l != 0 && conn.PassiveID == nil {
			conn.PassiveID = &l
			k.byID[cmIDKey{r.Src, l, false}] = conn
		}
		if conn != nil && c.Message == "REP" {
			q := *c.QPN
			conn.PassiveQPN = &q
		}
	}
	if conn == nil {
		k.unmatched++
		return
	}
	name := c.Message
	if r.Src != conn.Active {
		name = "<" + name
	}
	if conn.seen[name] {
		conn.Retransmissions++
	}
	conn.seen[name] = true
	conn.Messages = append(conn.Messages, name)
	switch c.Message {
	case "REJ":
		v := *c.RejReason
		conn.RejReason = &v
		conn.State = fmt.Sprintf("rejected: %d (%s)", v, c.RejReasonName)
	case "SIDR_REP":
		if *c.SIDRStatus == mad.SIDRSuccess {
			conn.State = "resolved"
		} else {
			conn.State = fmt.Sprintf("SIDR status %d (%s)", *c.SIDRStatus, c.SIDRStatusStr)
		}
	}
}

// state derives what an exchange came to from its messages.
func (conn *CMConn) state() string {
	if conn.State != "" {
		return conn.State
	}
	has := func(m string) bool { return conn.seen[m] || conn.seen["<"+m] }
	switch {
	case has("DREP"):
		return "disconnected"
	case has("DREQ"):
		return "disconnecting (no DREP)"
	case has("RTU"):
		return "established"
	case has("REP"):
		return "REP sent, no RTU"
	}
	return "unanswered"
}

func (k *cmTracker) summary() []*CMConn {
	for _, c := range k.conns {
		c.State = c.state()
	}
	return k.conns
}

// messageList renders the messages with repeats folded: "REQ x3 <REJ".
func (conn *CMConn) messageList() string {
	var b strings.Builder
	for i := 0; i < len(conn.Messages); {
		j := i
		for j < len(conn.Messages) && conn.Messages[j] == conn.Messages[i] {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(conn.Messages[i])
		if j-i > 1 {
			fmt.Fprintf(&b, " x%d", j-i)
		}
		i = j
	}
	return b.String()
}

// writeCMConns renders the CM exchanges for people.
func writeCMConns(b *strings.Builder, s *Summary) {
	if len(s.CMConns) == 0 && s.CMUnmatched == 0 {
		return
	}
	fmt.Fprintf(b, "   CM exchanges (\"<\": sent by the passive side):\n")
	for i, c := range s.CMConns {
		if i == maxCMText {
			fmt.Fprintf(b, "     ... %d more exchanges (listed by --json)\n", len(s.CMConns)-maxCMText)
			break
		}
		kind, id := "comm", "0x%08x"
		if c.SIDR {
			kind = "request"
		}
		fmt.Fprintf(b, "     %d: %s > %s %s, %s "+id, i+1, c.Active, c.Passive, c.Service, kind, c.ActiveID)
		if c.PassiveID != nil {
			fmt.Fprintf(b, "/0x%08x", *c.PassiveID)
		}
		if c.ActiveQPN != nil {
			fmt.Fprintf(b, ", qpn 0x%06x", *c.ActiveQPN)
			if c.PassiveQPN != nil {
				fmt.Fprintf(b, "/0x%06x", *c.PassiveQPN)
			}
		} else if c.PassiveQPN != nil {
			fmt.Fprintf(b, ", qpn 0x%06x qkey 0x%08x", *c.PassiveQPN, *c.QKey)
		}
		fmt.Fprintf(b, ": %s: %s", c.messageList(), c.State)
		if c.Retransmissions > 0 {
			fmt.Fprintf(b, " (%d sent again)", c.Retransmissions)
		}
		b.WriteByte('\n')
	}
	if s.CMUntracked > 0 {
		fmt.Fprintf(b, "     ... and %d more exchanges not tracked\n", s.CMUntracked)
	}
	if s.CMUnmatched > 0 {
		fmt.Fprintf(b, "     %s matched no REQ or SIDR_REQ in the capture\n", Plural(s.CMUnmatched, "MAD"))
	}
}
