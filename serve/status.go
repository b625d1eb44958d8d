package serve

import (
	"encoding/json"
	"errors"
	"sort"

	"github.com/softroce/softroce/cc/dcqcn"
	"github.com/softroce/softroce/verbs"
)

// Status is what `softroce status` shows: devices, clients and their QPs.
// A caller other than root sees only its own uid's clients; the others
// are only counted (OtherClients), since their pids and QP numbers are
// theirs.
type Status struct {
	Devices      []DeviceStatus `json:"devices"`
	Clients      []ClientStatus `json:"clients"`
	OtherClients int            `json:"other_clients,omitempty"`
	Stats        Stats          `json:"stats"`
}

// DeviceStatus is one device.
type DeviceStatus struct {
	Name      string   `json:"name"`
	Addrs     []string `json:"addrs"`
	QPs       int      `json:"qps"`
	RxPackets uint64   `json:"rx_packets"`
	TxPackets uint64   `json:"tx_packets"`
	// CC is the device's congestion-control counters (ConnectX's names),
	// present when it runs DCQCN (softroce serve --cc dcqcn). CNPs
	// ignored for QPs without it are counted there too.
	CC *dcqcn.Counters `json:"cc,omitempty"`
}

// ClientStatus is one connection (one ibv_context of one process).
type ClientStatus struct {
	UID    int            `json:"uid"` // -1: unknown
	PID    int            `json:"pid"`
	Device string         `json:"device,omitempty"`
	PDs    int            `json:"pds"`
	MRs    int            `json:"mrs"`
	CQs    int            `json:"cqs"`
	SRQs   int            `json:"srqs,omitempty"`
	AHs    int            `json:"ahs,omitempty"`
	QPs    []QPStatusLine `json:"qps"`
}

// QPStatusLine is one QP of a client.
type QPStatusLine struct {
	QPN   uint32 `json:"qpn"`
	State string `json:"state"`
	// CC is the QP's congestion control (its rate, the time its pacer
	// held it, its CNPs), present when it is on.
	CC *verbs.CCQPStats `json:"cc,omitempty"`
}

// Status returns a snapshot of the daemon, every client included.
func (s *Server) Status() Status { return s.status(nil) }

// status leaves out the connection that asks. Unless self is nil (the
// daemon's own caller) or root's, only clients of self's uid are listed.
func (s *Server) status(self *client) Status {
	all := self == nil || self.uid == 0
	st := Status{Stats: s.Stats()}
	if self != nil {
		st.Stats.Clients-- // not the connection that asks
	}
	for _, d := range s.devs {
		ds := DeviceStatus{Name: d.name}
		for _, a := range d.v.Link().Addrs() {
			ds.Addrs = append(ds.Addrs, a.String())
		}
		e := d.v.Stats()
		ds.RxPackets, ds.TxPackets = e.RxPackets, e.TxPackets
		if d.v.CC() != nil {
			ds.CC = &e.CC
		}
		d.mu.Lock()
		ds.QPs = len(d.qps)
		d.mu.Unlock()
		st.Devices = append(st.Devices, ds)
	}
	type cd struct {
		c *client
		d *device
	}
	s.mu.Lock()
	cs := make([]cd, 0, len(s.clients))
	for c := range s.clients {
		switch {
		case c == self:
		case all || self.uid >= 0 && c.uid == self.uid:
			cs = append(cs, cd{c, c.dev})
		default:
			st.OtherClients++
		}
	}
	s.mu.Unlock()
	for _, x := range cs {
		c := x.c
		cl := ClientStatus{UID: c.uid, PID: c.pid}
		if d := x.d; d != nil {
			d.mu.Lock()
			cl.Device, cl.PDs, cl.MRs, cl.CQs = d.name, len(c.pds), len(c.mrs), len(c.cqs)
			cl.SRQs, cl.AHs = len(c.srqs), len(c.ahs)
			for _, q := range c.qps {
				line := QPStatusLine{QPN: q.qpn, State: q.qp.State().String()}
				if cc := q.qp.Stats().CC; cc.Enabled {
					line.CC = &cc
				}
				cl.QPs = append(cl.QPs, line)
			}
			d.mu.Unlock()
			sort.Slice(cl.QPs, func(i, j int) bool { return cl.QPs[i].QPN < cl.QPs[j].QPN })
		}
		st.Clients = append(st.Clients, cl)
	}
	sort.Slice(st.Clients, func(i, j int) bool { return st.Clients[i].PID < st.Clients[j].PID })
	return st
}

// statusJSON is Status as JSON of at most n bytes: clients are dropped
// from the end (and counted in Stats.Clients) until it fits.
func (s *Server) statusJSON(n int, self *client) []byte {
	st := s.status(self)
	for {
		b, _ := json.Marshal(st)
		if len(b) <= n || len(st.Clients) == 0 {
			return b
		}
		st.Clients = st.Clients[:len(st.Clients)/2]
	}
}

// QueryStatus asks the daemon on socket for its Status.
func QueryStatus(socket string) (Status, error) {
	var st Status
	c, err := Dial(socket)
	if err != nil {
		return st, err
	}
	defer c.Close()
	if _, err := c.Write(le.AppendUint32(le.AppendUint32(nil, opStatus), 0)); err != nil {
		return st, err
	}
	b := make([]byte, maxMsg+1)
	n, err := c.Read(b)
	if err != nil {
		return st, err
	}
	if n < sizeResp || le.Uint32(b) != 0 {
		return st, errors.New("the daemon refused STATUS")
	}
	err = json.Unmarshal(b[sizeResp:n], &st)
	return st, err
}
