package apps

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// fiInfo is one entry of fi_info's short listing.
type fiInfo struct{ provider, fabric, domain, typ, protocol string }

func parseFiInfo(out string) []fiInfo {
	var l []fiInfo
	for _, line := range strings.Split(out, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ": ")
		if !ok {
			continue
		}
		if k == "provider" {
			l = append(l, fiInfo{provider: v})
			continue
		}
		if len(l) == 0 {
			continue
		}
		e := &l[len(l)-1]
		switch k {
		case "fabric":
			e.fabric = v
		case "domain":
			e.domain = v
		case "type":
			e.typ = v
		case "protocol":
			e.protocol = v
		}
	}
	return l
}

// libfabric's verbs provider finds softroce's device through the
// libraries: FI_EP_MSG on the RC domain (rdma_cm), FI_EP_DGRAM on its
// "-dgram" twin (UD), and FI_EP_RDM over either by the utility providers
// ofi_rxm (on MSG) and ofi_rxd (on DGRAM).
func TestFiInfo(t *testing.T) {
	Need(t, "libfabric-bin", "fi_info")
	hs := NewTwoHosts(t)
	out, err := hs.A.Run(t, time.Minute, nil, "fi_info", "-p", "verbs")
	if err != nil {
		t.Fatalf("fi_info -p verbs: %v\n%s", err, out)
	}
	t.Logf("fi_info -p verbs on host A:\n%s", out)
	fiInfoCheck(t, out, "softroce0", "IB-0x")
}

// fiInfoCheck fails the test unless fi_info -p verbs's listing (out) has
// the four endpoint types on device dev (MSG and RDM over ofi_rxm on dev,
// DGRAM and RDM over ofi_rxd on dev-dgram) and nothing on another device
// or on a fabric whose name does not start with fabric.
func fiInfoCheck(t *testing.T, out, dev, fabric string) {
	t.Helper()
	l := parseFiInfo(out)
	for _, w := range []fiInfo{
		{"verbs", "", dev, "FI_EP_MSG", "FI_PROTO_RDMA_CM_IB_RC"},
		{"verbs", "", dev + "-dgram", "FI_EP_DGRAM", "FI_PROTO_IB_UD"},
		{"verbs;ofi_rxm", "", dev, "FI_EP_RDM", "FI_PROTO_RXM"},
		{"verbs;ofi_rxd", "", dev + "-dgram", "FI_EP_RDM", "FI_PROTO_RXD"},
	} {
		found := false
		for _, e := range l {
			if e.provider == w.provider && e.domain == w.domain && e.typ == w.typ && e.protocol == w.protocol {
				found = true
			}
		}
		if !found {
			t.Errorf("fi_info lists no %s %s on %s (%s)", w.provider, w.typ, w.domain, w.protocol)
		}
	}
	for _, e := range l {
		if !strings.HasPrefix(e.domain, dev) || !strings.HasPrefix(e.fabric, fabric) {
			t.Errorf("an entry on another domain or fabric: %+v", e)
		}
	}
}

// pingpongRow is one row of fi_pingpong's result table.
type pingpongRow struct {
	bytes      string // as printed: 64, 1k, 64k
	sent, ack  int
	total      string
	sec        float64
	mbps, usec float64
	mxfers     float64
}

// parsePingpong reads the rows under fi_pingpong's header
// "bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec".
func parsePingpong(out string) ([]pingpongRow, error) {
	var rows []pingpongRow
	header := false
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 8 && f[0] == "bytes" && f[1] == "#sent" && f[5] == "MB/sec" && f[6] == "usec/xfer" {
			header = true
			continue
		}
		if !header || len(f) != 8 {
			continue
		}
		var r pingpongRow
		var err error
		r.bytes, r.total = f[0], f[3]
		if r.sent, err = strconv.Atoi(f[1]); err != nil {
			return nil, fmt.Errorf("row %q: #sent: %v", line, err)
		}
		if r.ack, err = strconv.Atoi(strings.TrimPrefix(f[2], "=")); err != nil {
			return nil, fmt.Errorf("row %q: #ack: %v", line, err)
		}
		for i, p := range []*float64{&r.sec, &r.mbps, &r.usec, &r.mxfers} {
			if *p, err = strconv.ParseFloat(strings.TrimSuffix(f[4+i], "s"), 64); err != nil {
				return nil, fmt.Errorf("row %q: column %d: %v", line, 5+i, err)
			}
		}
		rows = append(rows, r)
	}
	if !header {
		return nil, fmt.Errorf("no result table")
	}
	return rows, nil
}

// sizeStr is a size as fi_pingpong prints it.
func sizeStr(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dm", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dk", n>>10)
	}
	return strconv.Itoa(n)
}

// fiCase is one endpoint type for fi_pingpong: the provider (-p), the
// endpoint type (-e) and the sizes, one run each (-S).
type fiCase struct {
	name, prov, ep string
	sizes          []int
}

// fiCases are the endpoint types the verbs provider gives: MSG (RC by
// rdma_cm), RDM over MSG (ofi_rxm), RDM over DGRAM (ofi_rxd), DGRAM (UD).
var fiCases = []fiCase{
	{"msg", "verbs", "msg", []int{64, 65536}},
	{"rdm-rxm", "verbs;ofi_rxm", "rdm", []int{64, 65536}},
	{"rdm-rxd", "verbs;ofi_rxd", "rdm", []int{64, 4096}},
	{"dgram", "verbs", "dgram", []int{64, 1024}},
}

// fiPingpong runs one fi_pingpong of iters iterations of size bytes, its
// server at ro.server and its client at ro.client, and returns both
// sides' output and exit errors.
func fiPingpong(t *testing.T, ro role, c fiCase, size, iters int) (co, so string, cerr, serr error) {
	t.Helper()
	port := ro.port(t)
	args := []string{"fi_pingpong", "-p", c.prov, "-e", c.ep, "-I", strconv.Itoa(iters), "-S", strconv.Itoa(size)}
	srv := ro.server.start(t, nil, append(args, "-B", strconv.Itoa(port))...)
	ro.server.waitListen(t, srv, port)
	cli := ro.client.start(t, nil, append(args, "-P", strconv.Itoa(port), ro.server.addr.String())...)
	cerr = cli.Wait(2 * time.Minute)
	serr = srv.Wait(time.Minute)
	return cli.Output(), srv.Output(), cerr, serr
}

// fiPingpongCheck fails the test unless both sides of a fiPingpong ended
// well and printed one result row of size bytes and iters messages each
// way, with positive figures; it logs the rows, tagged with the role.
func fiPingpongCheck(t *testing.T, ro role, c fiCase, size, iters int, co, so string, cerr, serr error) {
	t.Helper()
	if cerr != nil || serr != nil {
		t.Errorf("fi_pingpong -p '%s' -e %s -S %d, %s: client: %v, server: %v\nclient:\n%s\nserver:\n%s", c.prov, c.ep, size, ro.name, cerr, serr, co, so)
		return
	}
	for _, x := range []struct {
		side string
		e    end
		out  string
	}{{"client", ro.client, co}, {"server", ro.server, so}} {
		rows, err := parsePingpong(x.out)
		if err != nil || len(rows) != 1 {
			t.Errorf("%s: %v, %d result rows, want 1:\n%s", x.side, err, len(rows), x.out)
			continue
		}
		r := rows[0]
		// MB/sec has two decimals: a slow run of small messages (ofi_rxd
		// against the emulated rxe guest at 64 bytes took up to 29 ms a
		// transfer, 6.2k in 2.9 s) prints 0.00, so only its sign is
		// checked; time and usec/xfer must be positive.
		if r.bytes != sizeStr(size) || r.sent != iters || r.ack != iters || r.sec <= 0 || r.mbps < 0 || r.usec <= 0 {
			t.Errorf("%s: row %+v, want %s bytes, %d sent and acked, positive time and usec/xfer", x.side, r, sizeStr(size), iters)
		}
		t.Logf("fi_pingpong -p '%s' -e %s, %s %s (%s): bytes %s, #sent %d, #ack %d, total %s, time %.2fs, %.2f MB/sec, %.2f usec/xfer",
			c.prov, c.ep, x.e.name, x.side, ro.name, r.bytes, r.sent, r.ack, r.total, r.sec, r.mbps, r.usec)
	}
}

// fi_pingpong, libfabric's ping-pong, server on host A and client on
// host B, over each endpoint type the verbs provider gives softroce: MSG
// (RC by rdma_cm), RDM over MSG (ofi_rxm: eager sends and, above its
// eager limit, rendezvous by RDMA READ), RDM over DGRAM (ofi_rxd: its own
// reliability over UD) and DGRAM (UD, messages up to the path MTU). The
// provider and endpoint type are fi_pingpong's flags: the test sets
// nothing else.
func TestFiPingpong(t *testing.T) {
	Need(t, "libfabric-bin", "fi_pingpong")
	hs := NewTwoHosts(t)
	const iters = 100
	for _, c := range fiCases {
		t.Run(c.name, func(t *testing.T) {
			for _, size := range c.sizes {
				co, so, cerr, serr := fiPingpong(t, hs.role(), c, size, iters)
				fiPingpongCheck(t, hs.role(), c, size, iters, co, so, cerr, serr)
			}
		})
	}
}
