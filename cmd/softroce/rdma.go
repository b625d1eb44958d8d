package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/softroce/softroce/serve"
)

func init() {
	register("rdma", "the daemon's ports, counters and resources as iproute2's rdma shows them: rdma dev|link|statistic|resource", runRdma)
}

const rdmaUsage = `Usage: softroce rdma [flags] OBJECT [show] [ARGS]

  softroce rdma dev [show] [DEV]
  softroce rdma link [show] [DEV[/PORT]]
  softroce rdma statistic [show] [link DEV[/PORT]]
  softroce rdma resource [show]
  softroce rdma resource [show] qp [link DEV[/PORT]] [lqpn N] [pid N]
  softroce rdma resource [show] cq [dev DEV] [pid N]
  softroce rdma resource [show] mr [dev DEV] [pid N]

What the daemon serves, in the columns and words of iproute2's rdma
tool: devices, ports (state, physical state, netdev, MTU, GIDs), their counters,
and the QPs, CQs and MRs of its client processes. A user sees their own
processes' objects, root sees everyone's; an MR's keys only to its owner.
OBJECT may be shortened as rdma allows (stat, res). Flags may come before
or after the words.

`

// rdmaOpts are the flags of softroce rdma.
type rdmaOpts struct {
	json, details, pretty bool
}

// rdmaFlags defines softroce rdma's flags (gen.go's flagSets reads them).
func rdmaFlags() (fs *flag.FlagSet, sock *string, o *rdmaOpts, watch *time.Duration) {
	fs = flag.NewFlagSet("rdma", flag.ContinueOnError)
	sock = fs.String("socket", "", "the daemon's socket (default as softroce serve)")
	o = new(rdmaOpts)
	fs.BoolVar(&o.json, "j", false, "print JSON (rdma -j)")
	fs.BoolVar(&o.json, "json", false, "print JSON (as -j)")
	fs.BoolVar(&o.details, "d", false, "details: netdev_index, and each QP's counters (rdma -d)")
	fs.BoolVar(&o.pretty, "p", false, "pretty: indented JSON, one counter a line (rdma -p)")
	watch = fs.Duration("w", 0, "watch: print the view again every `interval` (e.g. 1s) until interrupted")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), rdmaUsage)
		fs.PrintDefaults()
	}
	return
}

func runRdma(args []string) int {
	fs, sock, op, watch := rdmaFlags()
	o := op
	// Flags may sit between the words, as rdma's -j -d do before them.
	var words []string
	for rest := args; ; {
		if code, ok := parseFlags(fs, rest); !ok {
			return code
		}
		if fs.NArg() == 0 {
			break
		}
		words = append(words, fs.Arg(0))
		rest = fs.Args()[1:]
	}
	q, err := parseRdmaWords(words)
	if err != nil {
		fmt.Fprintf(os.Stderr, "softroce rdma: %v\n\n", err)
		fs.Usage()
		return 2
	}
	p := *sock
	if p == "" {
		p = serve.DefaultSocket()
	}
	for {
		v, err := serve.QueryRdma(p)
		if err != nil {
			fmt.Fprintf(os.Stderr, "softroce rdma: %v\n", err)
			return 1
		}
		var b bytes.Buffer
		writeRdma(&b, v, q, *o)
		if *watch > 0 {
			os.Stdout.WriteString("\033[H\033[2J" + time.Now().Format("15:04:05") + "  softroce rdma " + strings.Join(words, " ") + "\n")
		}
		os.Stdout.Write(b.Bytes())
		if *watch <= 0 {
			return 0
		}
		time.Sleep(*watch)
	}
}

// rdmaQuery is a parsed command line: which view and its filters.
type rdmaQuery struct {
	object string // link, statistic, resource
	res    string // resource: "" (the summary), qp, cq, mr
	dev    string
	port   int // 0: any
	lqpn   int64
	pid    int64
}

// rdmaObjects are the objects and the abbreviations rdma accepts for them.
var rdmaObjects = map[string]string{"dev": "dev", "link": "link", "statistic": "statistic", "stat": "statistic", "stats": "statistic",
	"resource": "resource", "res": "resource"}

func parseRdmaWords(w []string) (rdmaQuery, error) {
	q := rdmaQuery{lqpn: -1, pid: -1}
	if len(w) == 0 {
		return q, fmt.Errorf("which object: dev, link, statistic or resource?")
	}
	q.object = rdmaObjects[w[0]]
	if q.object == "" {
		return q, fmt.Errorf("unknown object %q (dev, link, statistic, resource)", w[0])
	}
	w = w[1:]
	if len(w) > 0 && (w[0] == "show" || w[0] == "list") {
		w = w[1:]
	}
	if q.object == "resource" && len(w) > 0 && (w[0] == "qp" || w[0] == "cq" || w[0] == "mr") {
		q.res, w = w[0], w[1:]
	}
	if (q.object == "link" || q.object == "dev") && len(w) == 1 { // rdma link show DEV/PORT, rdma dev show DEV
		w = []string{"link", w[0]}
	}
	for len(w) > 0 {
		if len(w) < 2 {
			return q, fmt.Errorf("%q wants a value", w[0])
		}
		k, val := w[0], w[1]
		w = w[2:]
		switch {
		case k == "link" || k == "dev":
			d, p, hasPort := strings.Cut(val, "/")
			q.dev = d
			if hasPort && p != "-" {
				n, err := strconv.Atoi(p)
				if err != nil || n < 1 {
					return q, fmt.Errorf("port %q", p)
				}
				q.port = n
			}
		case k == "lqpn" && q.res == "qp", k == "pid" && q.res != "":
			n, err := strconv.ParseInt(val, 0, 64)
			if err != nil || n < 0 {
				return q, fmt.Errorf("%s %q", k, val)
			}
			if k == "pid" {
				q.pid = n
			} else {
				q.lqpn = n
			}
		default:
			return q, fmt.Errorf("unknown filter %q", k)
		}
	}
	return q, nil
}

// ordered is a JSON object whose keys keep their order, as rdma prints
// them.
type ordered []kv

type kv struct {
	k string
	v any
}

func (o ordered) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, x := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		k, _ := json.Marshal(x.k)
		v, err := json.Marshal(x.v)
		if err != nil {
			return nil, err
		}
		b.Write(k)
		b.WriteByte(':')
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// line prints o as rdma prints a text line: "name value " for each pair,
// the first pairs (lead) as they are given.
func (o ordered) text(w io.Writer, lead string, pretty bool) {
	io.WriteString(w, lead)
	for _, x := range o {
		if pretty {
			io.WriteString(w, "\n    ")
		}
		switch v := x.v.(type) {
		case []string:
			for _, s := range v {
				fmt.Fprintf(w, "%s %s ", strings.TrimSuffix(x.k, "s"), s)
			}
		case hexKey:
			fmt.Fprintf(w, "%s 0x%x ", x.k, uint64(v))
		default:
			fmt.Fprintf(w, "%s %v ", x.k, v)
		}
	}
	io.WriteString(w, "\n")
}

// hexKey is an MR key or address: hex in text, a number in JSON.
type hexKey uint64

func (h hexKey) MarshalJSON() ([]byte, error) { return strconv.AppendUint(nil, uint64(h), 10), nil }

func (q rdmaQuery) devOK(name string, port int) bool {
	return (q.dev == "" || q.dev == name) && (q.port == 0 || port == 0 || q.port == port)
}

func (q rdmaQuery) pidOK(pid int) bool { return q.pid < 0 || int64(pid) == q.pid }

// writeRdma prints view q of v.
func writeRdma(w io.Writer, v serve.RdmaView, q rdmaQuery, o rdmaOpts) {
	var rows []ordered
	var leads []string
	add := func(lead string, r ordered) {
		rows = append(rows, r)
		leads = append(leads, lead)
	}
	switch {
	case q.object == "dev":
		for _, l := range v.Links {
			if !q.devOK(l.IfName, 0) {
				continue
			}
			g := guid(l.NodeGUID)
			r := ordered{{"node_type", "ca"}, {"node_guid", g}, {"sys_image_guid", g}}
			if o.json {
				r = append(ordered{{"ifindex", l.IfIndex}, {"ifname", l.IfName}}, r...)
			}
			add(fmt.Sprintf("%d: %s: ", l.IfIndex, l.IfName), r)
		}
	case q.object == "link":
		for _, l := range v.Links {
			if !q.devOK(l.IfName, l.Port) {
				continue
			}
			name := fmt.Sprintf("%s/%d", l.IfName, l.Port)
			r := ordered{{"state", l.State}, {"physical_state", l.PhysicalState}}
			if l.Netdev != "" {
				r = append(r, kv{"netdev", l.Netdev})
				if o.json || o.details {
					r = append(r, kv{"netdev_index", l.NetdevIndex})
				}
			}
			r = append(r, kv{"mtu", l.MTU}, kv{"gids", nonNil(l.GIDs)})
			if o.json {
				r = append(ordered{{"ifindex", l.IfIndex}, {"port", l.Port}, {"ifname", name}}, r...)
			}
			add(fmt.Sprintf("%d/%d: %s: ", l.IfIndex, l.Port, name), r)
		}
	case q.object == "statistic":
		for _, l := range v.Links {
			if !q.devOK(l.IfName, l.Port) {
				continue
			}
			r := counters(nil, l.Counters)
			if o.json {
				r = append(ordered{{"ifindex", l.IfIndex}, {"port", l.Port}, {"ifname", l.IfName}}, r...)
			}
			add(fmt.Sprintf("link %s/%d ", l.IfName, l.Port), r)
		}
	case q.res == "":
		for _, s := range v.Summary {
			if !q.devOK(s.IfName, 0) {
				continue
			}
			r := ordered{{"pd", s.PD}, {"cq", s.CQ}, {"qp", s.QP}, {"mr", s.MR}, {"ctx", s.Ctx}, {"srq", s.SRQ}}
			if o.json {
				r = append(ordered{{"ifindex", s.IfIndex}, {"ifname", s.IfName}}, r...)
			}
			add(fmt.Sprintf("%d: %s: ", s.IfIndex, s.IfName), r)
		}
	case q.res == "qp":
		for _, x := range v.QPs {
			if !q.devOK(x.IfName, x.Port) || !q.pidOK(x.PID) || q.lqpn >= 0 && int64(x.LQPN) != q.lqpn {
				continue
			}
			r := ordered{{"lqpn", x.LQPN}, {"pdn", x.PDN}}
			if x.Type != "UD" {
				r = append(r, kv{"rqpn", x.RQPN})
			}
			r = append(r, kv{"type", x.Type}, kv{"state", x.State})
			if x.Type != "UD" {
				r = append(r, kv{"rq-psn", x.RQPSN})
			}
			r = append(r, kv{"sq-psn", x.SQPSN})
			if x.PathMig != "" {
				r = append(r, kv{"path-mig-state", x.PathMig})
			}
			r = append(r, kv{"pid", x.PID}, kv{"comm", x.Comm})
			if x.DstAddr != "" {
				r = append(r, kv{"dst-addr", x.DstAddr})
			}
			if o.json || o.details {
				r = counters(r, x.Counters)
			}
			if o.json {
				r = append(ordered{{"ifindex", x.IfIndex}, {"port", x.Port}, {"ifname", x.IfName}}, r...)
			}
			add(fmt.Sprintf("link %s/%d ", x.IfName, x.Port), r)
		}
	case q.res == "cq":
		for _, x := range v.CQs {
			if !q.devOK(x.IfName, 0) || !q.pidOK(x.PID) {
				continue
			}
			r := ordered{{"cqe", x.CQE}, {"users", x.Users}, {"pid", x.PID}, {"comm", x.Comm}, {"cqn", x.CQN}}
			if o.json {
				r = append(ordered{{"ifindex", x.IfIndex}, {"ifname", x.IfName}}, r...)
			}
			add(fmt.Sprintf("dev %s ", x.IfName), r)
		}
	case q.res == "mr":
		for _, x := range v.MRs {
			if !q.devOK(x.IfName, 0) || !q.pidOK(x.PID) {
				continue
			}
			var r ordered
			if x.RKey != nil && x.LKey != nil && x.IOVA != nil {
				r = ordered{{"rkey", hexKey(*x.RKey)}, {"lkey", hexKey(*x.LKey)}, {"iova", hexKey(*x.IOVA)}}
			}
			r = append(r, kv{"mrlen", x.MRLen}, kv{"pid", x.PID}, kv{"comm", x.Comm}, kv{"mrn", x.MRN}, kv{"pdn", x.PDN})
			if o.json {
				r = append(ordered{{"ifindex", x.IfIndex}, {"ifname", x.IfName}}, r...)
			}
			add(fmt.Sprintf("dev %s ", x.IfName), r)
		}
	}
	if o.json {
		if rows == nil {
			rows = []ordered{}
		}
		var b []byte
		if o.pretty {
			b, _ = json.MarshalIndent(rows, "", "    ")
		} else {
			b, _ = json.Marshal(rows)
		}
		w.Write(append(b, '\n'))
		return
	}
	for i, r := range rows {
		r.text(w, leads[i], o.pretty && q.object == "statistic")
	}
}

func counters(r ordered, cs []serve.Counter) ordered {
	for _, c := range cs {
		r = append(r, kv{c.Name, c.Value})
	}
	return r
}

// guid prints a GUID as rdma and ibv_devinfo do.
func guid(g uint64) string {
	return fmt.Sprintf("%04x:%04x:%04x:%04x", g>>48, g>>32&0xffff, g>>16&0xffff, g&0xffff)
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
