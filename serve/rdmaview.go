package serve

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/softroce/softroce/transport/engine"
	"github.com/softroce/softroce/verbs"
)

// The views of `softroce rdma`, in the shape of iproute2's rdma tool:
// ports (rdma link), their counters (rdma statistic) and the clients'
// QPs, CQs and MRs (rdma resource). The daemon answers RDMA_VIEW with
// one page of objects at a time, since a view of many clients does not
// fit one control message; each page is a snapshot of its own.
//
// Visibility follows STATUS: a user sees the objects of their own
// processes, root sees everyone's. An MR's keys and address are shown
// only to the user who registered it.

// RdmaView is everything the views show, gathered over its pages.
type RdmaView struct {
	Links   []RdmaLink    `json:"links"`
	Summary []RdmaSummary `json:"summary"`
	QPs     []RdmaQP      `json:"qps"`
	CQs     []RdmaCQ      `json:"cqs"`
	MRs     []RdmaMR      `json:"mrs"`
}

// RdmaLink is one port (rdma link show, rdma statistic show) and its
// device (rdma dev show).
type RdmaLink struct {
	IfIndex       int      `json:"ifindex"`
	Port          int      `json:"port"`
	IfName        string   `json:"ifname"`    // the device, without the port
	NodeGUID      uint64   `json:"node_guid"` // also the sys_image_guid, as ibv_query_device says
	State         string   `json:"state"`
	PhysicalState string   `json:"physical_state"`
	Netdev        string   `json:"netdev,omitempty"`
	NetdevIndex   int      `json:"netdev_index,omitempty"`
	MTU           int      `json:"mtu"`     // the active IB MTU, bytes
	MaxMTU        int      `json:"max_mtu"` // bytes
	LinkMTU       int      `json:"link_mtu"`
	GIDs          []string `json:"gids"`
	// Counters in the order rdma statistic prints them, named as rxe or
	// a ConnectX names its hardware counters where one of them has it.
	Counters []Counter `json:"counters"`
}

// Counter is one named counter.
type Counter struct {
	Name  string `json:"name"`
	Value uint64 `json:"value"`
}

// RdmaSummary is one device's object counts (rdma resource show).
type RdmaSummary struct {
	IfIndex int    `json:"ifindex"`
	IfName  string `json:"ifname"`
	PD      int    `json:"pd"`
	CQ      int    `json:"cq"`
	QP      int    `json:"qp"`
	MR      int    `json:"mr"`
	Ctx     int    `json:"ctx"`
	SRQ     int    `json:"srq"`
}

// RdmaQP is one QP (rdma resource show qp); rdma's own keys keep their
// spelling (rq-psn).
type RdmaQP struct {
	IfIndex  int       `json:"ifindex"`
	Port     int       `json:"port"`
	IfName   string    `json:"ifname"`
	LQPN     uint32    `json:"lqpn"`
	PDN      uint32    `json:"pdn"`
	RQPN     uint32    `json:"rqpn,omitempty"`
	Type     string    `json:"type"`
	State    string    `json:"state"`
	RQPSN    uint32    `json:"rq-psn"`
	SQPSN    uint32    `json:"sq-psn"`
	PathMig  string    `json:"path-mig-state,omitempty"`
	PID      int       `json:"pid"`
	Comm     string    `json:"comm"`
	UID      int       `json:"uid"`
	DstAddr  string    `json:"dst-addr,omitempty"` // the peer's IP address (rdma resource show cm_id's name)
	Counters []Counter `json:"counters"`
}

// RdmaCQ is one CQ (rdma resource show cq).
type RdmaCQ struct {
	IfIndex int    `json:"ifindex"`
	IfName  string `json:"ifname"`
	CQE     uint32 `json:"cqe"`
	Users   int    `json:"users"`
	PID     int    `json:"pid"`
	Comm    string `json:"comm"`
	UID     int    `json:"uid"`
	CQN     uint32 `json:"cqn"`
}

// RdmaMR is one MR (rdma resource show mr). RKey, LKey and IOVA are nil
// for a viewer who is not the MR's owner.
type RdmaMR struct {
	IfIndex int     `json:"ifindex"`
	IfName  string  `json:"ifname"`
	RKey    *uint32 `json:"rkey,omitempty"`
	LKey    *uint32 `json:"lkey,omitempty"`
	IOVA    *uint64 `json:"iova,omitempty"`
	MRLen   uint64  `json:"mrlen"`
	PID     int     `json:"pid"`
	Comm    string  `json:"comm"`
	UID     int     `json:"uid"`
	MRN     uint32  `json:"mrn"`
	PDN     uint32  `json:"pdn"`
}

// rdmaItem is one object of a page: exactly one field is set.
type rdmaItem struct {
	Link    *RdmaLink    `json:"link,omitempty"`
	Summary *RdmaSummary `json:"summary,omitempty"`
	QP      *RdmaQP      `json:"qp,omitempty"`
	CQ      *RdmaCQ      `json:"cq,omitempty"`
	MR      *RdmaMR      `json:"mr,omitempty"`
}

// rdmaPage is RDMA_VIEW's answer: items from..next-1 of total.
type rdmaPage struct {
	Total int               `json:"total"`
	Next  int               `json:"next"`
	Items []json.RawMessage `json:"items"`
}

// qpCounters are a QP's counters under their rdma statistic names: rxe's
// (sent_pkts, rcvd_pkts, send_rnr_err) or a ConnectX's where rxe has none
// (duplicate_request, out_of_sequence, packet_seq_err: sequence error
// NAKs received, rnr_nak_retry_err: RNR NAKs received,
// local_ack_timeout_err). What neither names is softroce's own.
func qpCounters(s engine.QPStats) []Counter {
	return []Counter{
		{"sent_pkts", s.TxPackets}, {"rcvd_pkts", s.RxPackets},
		{"duplicate_request", s.DupRequests}, {"out_of_sequence", s.OutOfSeqRequests},
		{"packet_seq_err", s.SeqNAKsRecv}, {"seq_nak_sent", s.SeqNAKsSent},
		{"rnr_nak_retry_err", s.RNRNAKsRecv}, {"send_rnr_err", s.RNRNAKsSent},
		{"local_ack_timeout_err", s.Timeouts}, {"retransmitted_pkts", s.Retransmits},
		{"dropped_pkts", s.Dropped},
	}
}

func addQPStats(a *engine.QPStats, b engine.QPStats) {
	a.TxPackets += b.TxPackets
	a.RxPackets += b.RxPackets
	a.Retransmits += b.Retransmits
	a.Timeouts += b.Timeouts
	a.RNRNAKsRecv += b.RNRNAKsRecv
	a.RNRNAKsSent += b.RNRNAKsSent
	a.SeqNAKsRecv += b.SeqNAKsRecv
	a.SeqNAKsSent += b.SeqNAKsSent
	a.DupRequests += b.DupRequests
	a.OutOfSeqRequests += b.OutOfSeqRequests
	a.Dropped += b.Dropped
}

// linkCounters are a port's counters: the link's packets and bytes (every
// packet, QP1's included), its ICRC failures, then the clients' QPs'
// counters summed, destroyed QPs included (qpCounters names them).
func (d *device) linkCounters() []Counter {
	l := d.v.Link().Stats()
	d.mu.Lock()
	q := d.retired
	for _, x := range d.qps {
		addQPStats(&q, x.qp.Stats())
	}
	d.mu.Unlock()
	c := []Counter{
		{"rcvd_pkts", l.RxPackets}, {"sent_pkts", l.TxPackets},
		{"rcvd_bytes", l.RxBytes}, {"sent_bytes", l.TxBytes},
		// mlx5's name for RoCE packets dropped for a bad ICRC.
		{"rx_icrc_encapsulated", l.RxICRCBad},
	}
	for _, x := range qpCounters(q) {
		if x.Name != "sent_pkts" && x.Name != "rcvd_pkts" { // the link's are above
			c = append(c, x)
		}
	}
	e := d.v.Stats()
	c = append(c, Counter{"rx_unknown_qp", e.RxUnknownQP}, Counter{"rx_malformed", e.RxMalformed + l.RxMalformed})
	if d.v.CC() != nil {
		// Congestion control's, under the names mlx5's port counters
		// give them (softroce serve --cc dcqcn).
		c = append(c, Counter{"np_ecn_marked_roce_packets", e.CC.NPECNMarkedRoCEPackets}, Counter{"np_cnp_sent", e.CC.NPCNPSent},
			Counter{"rp_cnp_handled", e.CC.RPCNPHandled}, Counter{"rp_cnp_ignored", e.CC.RPCNPIgnored})
	}
	return c
}

// link describes d's port 1.
func (d *device) link() RdmaLink {
	p := d.v.QueryPort()
	l := RdmaLink{IfIndex: d.index, Port: 1, IfName: d.name, NodeGUID: d.guid, State: "ACTIVE", PhysicalState: "LINK_UP",
		MTU: p.ActiveMTU, MaxMTU: p.MaxMTU, LinkMTU: p.LinkMTU, Counters: d.linkCounters()}
	if p.State != "PORT_ACTIVE" {
		l.State, l.PhysicalState = "DOWN", "DISABLED"
	}
	var addrs []netip.Addr
	for _, g := range d.v.GIDTable() {
		l.GIDs = append(l.GIDs, netip.AddrFrom16(g.GID).String())
		addrs = append(addrs, g.Addr)
	}
	l.Netdev, l.NetdevIndex = netdevOf(addrs)
	return l
}

// netdevOf names the interface, in the daemon's network namespace, that
// holds the first of addrs it finds.
func netdevOf(addrs []netip.Addr) (string, int) {
	ifs, err := net.Interfaces()
	if err != nil {
		return "", 0
	}
	for _, want := range addrs {
		for _, ifc := range ifs {
			as, _ := ifc.Addrs()
			for _, a := range as {
				if n, ok := a.(*net.IPNet); ok {
					if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Unmap() == want.Unmap() {
						return ifc.Name, ifc.Index
					}
				}
			}
		}
	}
	return "", 0
}

// comm is the command name of pid, as rdma reads it ("" when unknown).
func comm(pid int) string {
	if pid <= 0 {
		return ""
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// rdmaPageJSON answers RDMA_VIEW for self (nil: the daemon's own caller,
// who sees everything and every key): the items of its view from index
// from on, as many as fit n bytes (at least one, which always fits: a
// link with its GIDs and counters is well under maxMsg). The order is
// links, summaries, then each client's QPs, CQs and MRs, the clients in
// the order they came. Only the page's items are built; the clients
// before it are only counted, so a view of many pages costs the daemon
// little per page. The devices are locked together while the page is
// made: within a page, counts and objects agree.
func (s *Server) rdmaPageJSON(n int, self *client, from uint32) []byte {
	all := self == nil || self.uid == 0
	p := rdmaPage{Next: -1, Items: []json.RawMessage{}}
	size := len(`{"total":,"next":,"items":[]}`) + 2*11
	i := 0
	want := func() bool { return p.Next < 0 && uint64(i) >= uint64(from) }
	put := func(it rdmaItem) {
		b, _ := json.Marshal(it)
		if size+len(b)+1 > n && len(p.Items) > 0 {
			p.Next = i
		} else {
			size += len(b) + 1
			p.Items = append(p.Items, b)
		}
		i++
	}
	for _, d := range s.devs {
		if want() {
			l := d.link()
			put(rdmaItem{Link: &l})
		} else {
			i++
		}
	}
	type cd struct {
		c    *client
		d    *device
		comm string
	}
	s.mu.Lock()
	var cs []cd
	for c := range s.clients {
		if c != self && c.dev != nil && (all || self.uid >= 0 && c.uid == self.uid) {
			cs = append(cs, cd{c: c, d: c.dev})
		}
	}
	s.mu.Unlock()
	// Read /proc before the devices are locked: their pollers wait on it.
	for k := range cs {
		cs[k].comm = comm(cs[k].c.pid)
	}
	sort.Slice(cs, func(i, j int) bool { return cs[i].c.seq < cs[j].c.seq })
	// Devices in index order: every other holder of d.mu takes one.
	for _, d := range s.devs {
		d.mu.Lock()
	}
	defer func() {
		for _, d := range s.devs {
			d.mu.Unlock()
		}
	}()
	sums := make([]RdmaSummary, len(s.devs))
	for k, d := range s.devs {
		sums[k] = RdmaSummary{IfIndex: d.index, IfName: d.name}
	}
	for _, x := range cs {
		c, sm := x.c, &sums[x.d.index]
		sm.Ctx++
		sm.PD += len(c.pds)
		sm.CQ += len(c.cqs)
		sm.QP += len(c.qps)
		sm.MR += len(c.mrs)
		sm.SRQ += len(c.srqs)
	}
	for k := range sums {
		if want() {
			put(rdmaItem{Summary: &sums[k]})
		} else {
			i++
		}
	}
	for _, x := range cs {
		c, d := x.c, x.d
		cnt := len(c.qps) + len(c.cqs) + len(c.mrs)
		if !want() && (p.Next >= 0 || uint64(i+cnt) <= uint64(from)) {
			i += cnt
			continue
		}
		cm := x.comm
		ownKeys := self == nil || self.uid >= 0 && self.uid == c.uid
		for _, h := range sortedKeys(c.qps) {
			if !want() {
				i++
				continue
			}
			o := c.qps[h]
			a, init := o.qp.Query()
			sq, rq := o.qp.PSNs()
			q := &RdmaQP{IfIndex: d.index, Port: 1, IfName: d.name, LQPN: o.qpn, PDN: o.pd, Type: init.Type.String(),
				State: a.State.String(), SQPSN: sq, PID: c.pid, Comm: cm, UID: c.uid, Counters: qpCounters(o.qp.Stats())}
			if init.Type != verbs.QPTypeUD {
				q.RQPN, q.RQPSN, q.PathMig = a.DestQPN, rq, "MIGRATED"
				if a.AV.DGID != ([16]byte{}) {
					q.DstAddr = netip.AddrFrom16(a.AV.DGID).Unmap().String()
				}
			}
			put(rdmaItem{QP: q})
		}
		for _, h := range sortedKeys(c.cqs) {
			if !want() {
				i++
				continue
			}
			o := c.cqs[h]
			put(rdmaItem{CQ: &RdmaCQ{IfIndex: d.index, IfName: d.name, CQE: o.size, Users: o.nQP, PID: c.pid, Comm: cm, UID: c.uid, CQN: h}})
		}
		for _, h := range sortedKeys(c.mrs) {
			if !want() {
				i++
				continue
			}
			o := c.mrs[h]
			m := &RdmaMR{IfIndex: d.index, IfName: d.name, MRLen: o.length, PID: c.pid, Comm: cm, UID: c.uid, MRN: h, PDN: o.pd}
			if ownKeys && o.mr != nil {
				lk, iova := o.mr.LKey(), o.mr.Addr()
				m.LKey, m.RKey, m.IOVA = &lk, &lk, &iova
			}
			put(rdmaItem{MR: m})
		}
	}
	p.Total = i
	if p.Next < 0 {
		p.Next = i
	}
	b, _ := json.Marshal(p)
	return b
}

func sortedKeys[V any](m map[uint32]V) []uint32 {
	k := make([]uint32, 0, len(m))
	for h := range m {
		k = append(k, h)
	}
	sort.Slice(k, func(i, j int) bool { return k[i] < k[j] })
	return k
}

// QueryRdma asks the daemon on socket for its rdma views, page by page.
func QueryRdma(socket string) (RdmaView, error) {
	var v RdmaView
	c, err := Dial(socket)
	if err != nil {
		return v, err
	}
	defer c.Close()
	b := make([]byte, maxMsg+1)
	for from := 0; ; {
		req := le.AppendUint32(le.AppendUint32(nil, opRdmaView), 0)
		req = le.AppendUint32(le.AppendUint32(req, uint32(from)), 0)
		if _, err := c.Write(req); err != nil {
			return v, err
		}
		n, err := c.Read(b)
		if err != nil {
			return v, err
		}
		if n < sizeResp || le.Uint32(b) != 0 {
			return v, errors.New("the daemon refused RDMA_VIEW (a daemon older than this softroce?)")
		}
		var p rdmaPage
		if err := json.Unmarshal(b[sizeResp:n], &p); err != nil {
			return v, err
		}
		for _, raw := range p.Items {
			var it rdmaItem
			if err := json.Unmarshal(raw, &it); err != nil {
				return v, err
			}
			switch {
			case it.Link != nil:
				v.Links = append(v.Links, *it.Link)
			case it.Summary != nil:
				v.Summary = append(v.Summary, *it.Summary)
			case it.QP != nil:
				v.QPs = append(v.QPs, *it.QP)
			case it.CQ != nil:
				v.CQs = append(v.CQs, *it.CQ)
			case it.MR != nil:
				v.MRs = append(v.MRs, *it.MR)
			}
		}
		if p.Next >= p.Total || p.Next <= from {
			if p.Next <= from && p.Next < p.Total {
				return v, fmt.Errorf("RDMA_VIEW page at %d did not advance", from)
			}
			return v, nil
		}
		from = p.Next
	}
}
