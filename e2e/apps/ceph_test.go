package apps

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// cephDevice is the device name softroce's libibverbs gives its first
// device (what `softroce run -- ibv_devices` lists): Ceph's RDMA stack
// opens the device named by ms_async_rdma_device_name.
const cephDevice = "softroce0"

// cephMode is one way Ceph's RDMA messenger sets up its connections.
type cephMode struct {
	name      string
	conf      string // lines added to [global]
	tcpListen bool   // whether a daemon listens on TCP at its address
}

var cephModes = []cephMode{
	// The default: each connection's QP numbers, PSNs and GIDs are
	// exchanged over a TCP connection beside it; receives come from one
	// SRQ per process, of ms_async_rdma_receive_queue_len buffers.
	{"default", "ms_async_rdma_receive_queue_len = 256\n", true},
	// rdma_cm: connections by rdma_cm (Ceph's RDMAIWARPConnectedSocketImpl,
	// selected by ms_async_rdma_type = iwarp), with SRQ off as Ceph
	// documents it: each QP posts ms_async_rdma_receive_queue_len buffers
	// of its own. Ceph's rdma_cm connections have no RNR retries
	// (rnr_retry_count 0), so a QP must hold what its peer sends before
	// the receiver posts its buffers again: with 64 a QP, the OSDs'
	// SENDs failed with RNR_RETRY_EXC_ERR during the benchmark.
	{"rdma_cm", "ms_async_rdma_cm = true\nms_async_rdma_type = iwarp\nms_async_rdma_support_srq = false\nms_async_rdma_receive_queue_len = 256\n", false},
}

// cephSide is where part of a cluster runs (its monitor, its OSDs, its
// clients): a softroce host, programs as User through `softroce run`, or
// the rxe guest, programs as root. Each side has the cluster's files in a
// directory of its own, with a ceph.conf naming its RDMA device.
type cephSide struct {
	end
	dir    string // the cluster's files here: ceph.conf, data, logs, admin sockets
	device string // ms_async_rdma_device_name
	gidIdx int    // ms_async_rdma_gid_idx: the GID of the side's IPv4 address
	extra  string // lines added to [global] on this side
	// writeFile writes a file in dir.
	writeFile func(t *testing.T, name, data string)
	// logs is the end of each daemon log file in dir.
	logs func(t *testing.T) string
	// listening reports whether p's network namespace has a TCP
	// listener on port.
	listening func(t *testing.T, p endProc, port int) bool
}

func (s *cephSide) conf() string { return s.dir + "/ceph.conf" }

// run runs a program on the side and returns its output.
func (s *cephSide) run(t *testing.T, timeout time.Duration, argv ...string) (string, error) {
	t.Helper()
	p := s.start(t, nil, argv...)
	err := p.Wait(timeout)
	return p.Output(), err
}

// hostCephSide is a softroce host: a directory of its own, owned by User,
// mode 0700; softroce's device and the GID index of its IPv4 address (1
// beside a link-local GID, as on rxe).
func hostCephSide(t *testing.T, h *Host) *cephSide {
	t.Helper()
	dir, err := os.MkdirTemp("", "softroce-ceph-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chown(dir, User, User); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return &cephSide{
		end:    hostEnd(h),
		dir:    dir,
		device: cephDevice,
		gidIdx: h.GIDIndex(),
		writeFile: func(t *testing.T, name, data string) {
			f := filepath.Join(dir, name)
			if err := os.WriteFile(f, []byte(data), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(f, User, User); err != nil {
				t.Fatal(err)
			}
		},
		logs: func(t *testing.T) string {
			var b strings.Builder
			logs, _ := filepath.Glob(filepath.Join(dir, "*.log"))
			for _, l := range logs {
				d, _ := os.ReadFile(l)
				if len(d) > cephLogTail {
					d = d[len(d)-cephLogTail:]
				}
				fmt.Fprintf(&b, "%s (end):\n%s\n", l, d)
			}
			return b.String()
		},
		listening: func(t *testing.T, p endProc, port int) bool {
			return tcpListening(p.(hostProc).Pid(), port)
		},
	}
}

// cephLogTail is how much of each daemon log a failed test shows.
const cephLogTail = 12000

// guestCephSide is the rxe guest: a directory in its /tmp (tmpfs: the
// monitor's store is RocksDB, and admin sockets are Unix sockets, which
// the 9p share does not hold), rxe0 and the GID index of its IPv4 address
// (1: rxe's GID 0 is the link-local IPv6 address).
func (r *RxePeer) guestCephSide(t *testing.T) *cephSide {
	t.Helper()
	dir := "/tmp/softroce-ceph-" + uuid4()[:8]
	if out, err := r.GuestRun(t, time.Minute, "mkdir -m 700 "+dir); err != nil {
		t.Fatalf("guest mkdir %s: %v\n%s", dir, err, out)
	}
	t.Cleanup(func() { r.GuestRun(t, time.Minute, "rm -rf "+dir) })
	return &cephSide{
		end:    r.guestEnd(),
		dir:    dir,
		device: "rxe0",
		gidIdx: 1,
		// Every daemon loads the erasure-code plugins at start. Debian's
		// builds of their Galois-field code (libec_jerasure_generic.so
		// as much as _sse3 and _sse4) use SSE4.1 (pinsrd in gf_init_hard),
		// which the guest's CPU (TCG, qemu64) lacks: the daemons died of
		// SIGILL there. The replicated pool needs none of them.
		// The guest has no hostname (the kernel's "(none)"), which an
		// OSD puts in its CRUSH location (host=(none)) and the monitor
		// refuses (EINVAL; the OSD then exits): the guest's OSDs name
		// their host.
		extra: "osd_erasure_code_plugins =\ncrush_location = root=default host=rxe-guest\n",
		writeFile: func(t *testing.T, name, data string) {
			cmd := fmt.Sprintf("echo %s | base64 -d > %s/%s", base64.StdEncoding.EncodeToString([]byte(data)), dir, name)
			if out, err := r.GuestRun(t, time.Minute, cmd); err != nil {
				t.Fatalf("guest: write %s/%s: %v\n%s", dir, name, err, out)
			}
		},
		logs: func(t *testing.T) string {
			out, _ := r.GuestRun(t, time.Minute, fmt.Sprintf(`for f in %s/*.log; do echo "$f (end):"; tail -c %d "$f"; echo; done`, dir, cephLogTail))
			return out
		},
		listening: func(t *testing.T, p endProc, port int) bool {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			out, err := r.VM.Run(ctx, "netstat -ltn")
			if err != nil {
				t.Fatalf("guest netstat: %v", err)
			}
			for _, l := range strings.Split(out, "\n") {
				if f := strings.Fields(l); len(f) >= 4 && strings.HasSuffix(f[3], ":"+strconv.Itoa(port)) {
					return true
				}
			}
			return false
		},
	}
}

// cephCluster is a monitor on one side and memstore OSDs on another, the
// ceph and rados clients on a third (which may be either).
type cephCluster struct {
	mon, osd, client *cephSide
	monProc          endProc
	osds             []endProc
	osdIDs           []int
	monPort          int
}

// cephConf is the cluster's ceph.conf on side s: no authentication (auth
// none), messenger v2 only, async+rdma for every messenger on s's device
// and GID, memstore OSDs, and pools of two replicas that stay writable
// with one, placed on OSDs rather than hosts (both OSDs are on one side).
// Every path (data, logs, admin sockets) is under s.dir.
//
// The RDMA buffer counts are Ceph's own settings, set small. By default
// a process registers 1024 send buffers and, at its first connection,
// 8192 receive buffers (twice ms_async_rdma_receive_queue_len), of 128
// KiB each: 1.1 GiB, which a registration copies into memfds (docs/abi.md),
// here at about 150 MB/s; the first `ceph osd new` then timed out. A
// client whose session is not up within 3 s (mon_client_hunt_interval)
// drops the connection and tries again; the monitor's end of a dropped
// rdma_cm connection gets CONNECT_ERROR and Ceph keeps its QP and
// receive buffers. With 512 receives a QP, growing the pool made accepts
// that slow: each ceph command left one such QP behind, and after a few
// the monitor ran out of receive buffers and crashed in rdma_accept on the
// QP it had just destroyed.
func cephConf(s *cephSide, fsid, monAddr, osdAddr string, monPort int, mode cephMode) string {
	dir := s.dir
	return fmt.Sprintf(`[global]
fsid = %s
mon_host = v2:%s:%d
auth_cluster_required = none
auth_service_required = none
auth_client_required = none
ms_bind_msgr1 = false
ms_bind_msgr2 = true
ms_type = async+rdma
ms_async_rdma_device_name = %s
ms_async_rdma_gid_idx = %d
ms_async_rdma_receive_buffers = 4096
ms_async_rdma_send_buffers = 256
%s%srun_dir = %s
admin_socket = %s/$name.asok
log_file = %s/$name.log
pid_file =
log_to_stderr = false
err_to_stderr = true
osd_pool_default_size = 2
osd_pool_default_min_size = 1
osd_pool_default_pg_num = 8
osd_pool_default_pgp_num = 8
osd_pool_default_pg_autoscale_mode = off
osd_crush_chooseleaf_type = 0
mon_warn_on_pool_no_redundancy = false

[mon]
debug_ms = 1
mon_data = %s/mon-$id
public_addr = %s

[osd]
debug_ms = 1
osd_data = %s/osd-$id
osd_objectstore = memstore
memstore_device_bytes = %d
public_addr = %s
cluster_addr = %s
`, fsid, monAddr, monPort, s.device, s.gidIdx, mode.conf, s.extra, dir, dir, dir, dir, monAddr, dir, cephMemstoreBytes, osdAddr, osdAddr)
}

// cephMemstoreBytes is each OSD's memstore size; cephBenchObjects bounds
// what the write benchmark stores (4 MiB objects, two replicas, one on
// each OSD) below the OSDs' nearfull ratio (0.85), so that a faster
// machine does not fill them.
const (
	cephMemstoreBytes = 1 << 30
	cephBenchObjects  = 160
)

func uuid4() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// newCephCluster writes each side's configuration and makes the
// monitor's store (monmaptool, ceph-mon --mkfs), then starts the monitor
// on its side, at TCP port monPort (free there).
func newCephCluster(t *testing.T, mon, osd, client *cephSide, monPort int, mode cephMode) *cephCluster {
	t.Helper()
	c := &cephCluster{mon: mon, osd: osd, client: client, monPort: monPort}
	fsid := uuid4()
	for _, s := range c.sides() {
		s.writeFile(t, "ceph.conf", cephConf(s, fsid, mon.addr.String(), osd.addr.String(), monPort, mode))
	}
	t.Cleanup(func() {
		if t.Failed() {
			c.dumpLogs(t)
		}
	})
	monmap := mon.dir + "/monmap"
	if out, err := mon.run(t, time.Minute, "monmaptool", "--create", "--fsid", fsid,
		"--addv", "a", fmt.Sprintf("[v2:%s:%d]", mon.addr, monPort), monmap); err != nil {
		t.Fatalf("monmaptool: %v\n%s", err, out)
	}
	if out, err := mon.run(t, time.Minute, "ceph-mon", "-c", mon.conf(), "--mkfs", "-i", "a", "--monmap", monmap); err != nil {
		t.Fatalf("ceph-mon --mkfs: %v\n%s", err, out)
	}
	c.monProc = mon.start(t, nil, "ceph-mon", "-c", mon.conf(), "-f", "-i", "a")
	return c
}

// sides are the cluster's distinct sides.
func (c *cephCluster) sides() []*cephSide {
	var ss []*cephSide
	for _, s := range []*cephSide{c.mon, c.osd, c.client} {
		if !slices.Contains(ss, s) {
			ss = append(ss, s)
		}
	}
	return ss
}

// dumpLogs logs the end of the daemons' log files and their output.
func (c *cephCluster) dumpLogs(t *testing.T) {
	for _, s := range c.sides() {
		t.Logf("%s side's logs:\n%s", s.name, s.logs(t))
	}
	if c.monProc != nil {
		t.Logf("ceph-mon output:\n%s", c.monProc.Output())
	}
	for i, o := range c.osds {
		t.Logf("ceph-osd %d output:\n%s", i, o.Output())
	}
}

// ceph runs the ceph command-line client on the client side.
func (c *cephCluster) ceph(t *testing.T, args ...string) (string, error) {
	t.Helper()
	start := time.Now()
	out, err := c.client.run(t, time.Minute, append([]string{"ceph", "-c", c.client.conf(), "--connect-timeout", "30"}, args...)...)
	t.Logf("ceph %s: %v (%v)", strings.Join(args, " "), err, time.Since(start).Round(10*time.Millisecond))
	return out, err
}

// rados runs rados on the client side.
func (c *cephCluster) rados(t *testing.T, timeout time.Duration, args ...string) (string, error) {
	t.Helper()
	return c.client.run(t, timeout, append([]string{"rados", "-c", c.client.conf()}, args...)...)
}

// addOSD registers an OSD with the monitor (ceph osd new), makes its
// memstore (ceph-osd --mkfs) and starts it on the OSDs' side.
func (c *cephCluster) addOSD(t *testing.T) {
	t.Helper()
	uuid := uuid4()
	out, err := c.ceph(t, "osd", "new", uuid)
	if err != nil {
		t.Fatalf("ceph osd new: %v\n%s", err, out)
	}
	id := -1
	for _, l := range strings.Split(out, "\n") {
		if n, err := strconv.Atoi(strings.TrimSpace(l)); err == nil {
			id = n
		}
	}
	if id < 0 {
		t.Fatalf("ceph osd new printed no OSD id:\n%s", out)
	}
	// memstore keeps its files in osd_data, which must exist.
	data := fmt.Sprintf("%s/osd-%d", c.osd.dir, id)
	if out, err := c.osd.run(t, time.Minute, "mkdir", "-m", "700", data); err != nil {
		t.Fatalf("mkdir %s: %v\n%s", data, err, out)
	}
	if out, err := c.osd.run(t, 2*time.Minute, "ceph-osd", "-c", c.osd.conf(), "-i", strconv.Itoa(id), "--mkfs", "--osd-uuid", uuid); err != nil {
		t.Fatalf("ceph-osd -i %d --mkfs: %v\n%s", id, err, out)
	}
	c.osdIDs = append(c.osdIDs, id)
	c.osds = append(c.osds, c.osd.start(t, nil, "ceph-osd", "-c", c.osd.conf(), "-f", "-i", strconv.Itoa(id)))
}

// jsonPart is the JSON document in a ceph command's output, which
// starts with Ceph's warning about the memlock limit on stderr (softroce
// pins no memory: the limit does not apply).
func jsonPart(s string) string {
	if i := strings.Index(s, "{"); i >= 0 {
		return s[i:]
	}
	return s
}

// waitOSDsUp waits until the monitor's OSD map has every OSD up and in.
func (c *cephCluster) waitOSDsUp(t *testing.T, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		out, err := c.ceph(t, "osd", "stat", "-f", "json")
		var st struct {
			NumOSDs   int `json:"num_osds"`
			NumUpOSDs int `json:"num_up_osds"`
			NumInOSDs int `json:"num_in_osds"`
		}
		if err == nil && json.Unmarshal([]byte(jsonPart(out)), &st) == nil &&
			st.NumOSDs == len(c.osds) && st.NumUpOSDs == st.NumOSDs && st.NumInOSDs == st.NumOSDs {
			return
		}
		for i, o := range c.osds {
			if o.Exited() {
				t.Fatalf("ceph-osd %d ended:\n%s", i, o.Output())
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the OSDs are not all up and in after %v: %v\n%s", d, err, out)
		}
		time.Sleep(time.Second)
	}
}

// daemons are the OSDs and the monitor.
func (c *cephCluster) daemons() []endProc {
	return append(append([]endProc{}, c.osds...), c.monProc)
}

// cephStopTimeout bounds a daemon's shutdown.
const cephStopTimeout = 20 * time.Second

// stop sends SIGTERM to every daemon, the OSDs first, and requires each
// to exit on its own.
func (c *cephCluster) stop(t *testing.T) {
	t.Helper()
	procs := c.daemons()
	names := make([]string, 0, len(procs))
	for i := range c.osds {
		names = append(names, fmt.Sprintf("ceph-osd %d", i))
	}
	names = append(names, "ceph-mon")
	// To the process group, as a service manager does: the daemon must
	// get it once (Ceph's daemons take a second SIGTERM's default action).
	for _, p := range procs {
		p.Signal(syscall.SIGTERM)
	}
	for i, p := range procs {
		start := time.Now()
		err := p.Wait(cephStopTimeout)
		if err == ErrTimeout {
			t.Errorf("%s did not exit within %v of SIGTERM:\n%s", names[i], cephStopTimeout, p.Output())
			continue
		}
		t.Logf("%s exited %v after SIGTERM (%v)", names[i], time.Since(start).Round(10*time.Millisecond), err)
		if err != nil {
			t.Errorf("%s: %v after SIGTERM:\n%s", names[i], err, p.Output())
		}
	}
}

// rdmaRxBytes is what OSD id's RDMA workers have received (its perf
// counters, read through its admin socket).
func (c *cephCluster) rdmaRxBytes(t *testing.T, id int) float64 {
	t.Helper()
	out, err := c.osd.run(t, 2*time.Minute, "ceph", "--admin-daemon", fmt.Sprintf("%s/osd.%d.asok", c.osd.dir, id), "perf", "dump")
	if err != nil {
		t.Fatalf("osd.%d perf dump: %v\n%s", id, err, out)
	}
	var perf map[string]map[string]any
	if err := json.Unmarshal([]byte(jsonPart(out)), &perf); err != nil {
		t.Fatalf("osd.%d perf dump: %v\n%s", id, err, out)
	}
	var rx float64
	n := 0
	for k, v := range perf {
		if strings.HasPrefix(k, "AsyncMessenger::RDMAWorker") {
			b, _ := v["rx_bytes"].(float64)
			rx += b
			n++
		}
	}
	if n == 0 {
		t.Fatalf("osd.%d has no RDMA workers:\n%s", id, out)
	}
	return rx
}

// tcpListening reports whether process pid's network namespace has a TCP
// listener on port.
func tcpListening(pid, port int) bool {
	want := fmt.Sprintf(":%04X ", port)
	for _, f := range []string{"tcp", "tcp6"} {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, f))
		for _, l := range strings.Split(string(b), "\n")[1:] {
			fs := strings.Fields(l)
			if len(fs) > 3 && strings.HasSuffix(fs[1]+" ", want) && fs[3] == "0A" {
				return true
			}
		}
	}
	return false
}

// benchResult is the summary rados bench prints after a run: "Key: value"
// lines from "Total time run:" on.
type benchResult map[string]string

var benchLine = regexp.MustCompile(`^([A-Za-z][A-Za-z ()/]*[A-Za-z)]):\s+(\S+)$`)

func parseBench(out string) benchResult {
	r := benchResult{}
	in := false
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "Total time run:") {
			in = true
		}
		if !in {
			continue
		}
		if m := benchLine.FindStringSubmatch(line); m != nil {
			r[m[1]] = m[2]
		}
	}
	return r
}

func (r benchResult) num(key string) float64 {
	v, err := strconv.ParseFloat(r[key], 64)
	if err != nil {
		return -1
	}
	return v
}

// TestCeph runs a Ceph cluster over softroce with Ceph's RDMA messenger
// (async+rdma): a monitor on host A, two memstore OSDs on host B, a pool
// of two replicas, `rados bench` write then seq from host B, and a clean
// stop of every daemon on SIGTERM. No manager: the monitor creates the
// pool's placement groups and rados bench needs none. Each mode is one
// way the messenger connects (cephModes).
func TestCeph(t *testing.T) {
	cephNeed(t)
	for _, mode := range cephModes {
		t.Run(mode.name, func(t *testing.T) {
			hs := NewTwoHosts(t)
			a, b := hostCephSide(t, hs.A), hostCephSide(t, hs.B)
			cephBench(t, newCephCluster(t, a, b, b, hs.A.FreeTCPPort(t), mode), mode)
		})
	}
}

func cephNeed(t *testing.T) {
	Need(t, "ceph-mon ceph-osd ceph-common", "ceph-mon", "ceph-osd", "ceph", "rados", "monmaptool")
}

// cephBench adds two OSDs to cluster c, whose monitor runs, creates a
// pool, runs `rados bench` write then seq from the client side, checks
// that the data went over RDMA and stops every daemon with SIGTERM.
func cephBench(t *testing.T, c *cephCluster, mode cephMode) {
	stopped := false
	defer func() {
		if !stopped {
			c.stop(t)
		}
	}()
	for i := 0; i < 2; i++ {
		c.addOSD(t)
	}
	c.waitOSDsUp(t, 2*time.Minute)
	const pool = "bench"
	if out, err := c.ceph(t, "osd", "pool", "create", pool, "8", "8", "replicated"); err != nil {
		t.Fatalf("ceph osd pool create: %v\n%s", err, out)
	}
	// Listing the pool asks every placement group in turn, so it
	// returns once all are active: the benchmark then measures
	// writes, not the pool's creation.
	start := time.Now()
	if out, err := c.rados(t, 2*time.Minute, "-p", pool, "ls"); err != nil {
		t.Fatalf("rados ls: %v\n%s", err, out)
	}
	t.Logf("rados -p %s ls: %v", pool, time.Since(start).Round(10*time.Millisecond))
	// --max-objects: see cephBenchObjects.
	write, err := c.rados(t, 2*time.Minute, "bench", "-p", pool, "5", "write", "--no-cleanup",
		"--max-objects", strconv.Itoa(cephBenchObjects))
	if err != nil {
		t.Fatalf("rados bench write: %v\n%s", err, write)
	}
	t.Logf("rados bench write:\n%s", write)
	seq, err := c.rados(t, 2*time.Minute, "bench", "-p", pool, "5", "seq")
	if err != nil {
		t.Fatalf("rados bench seq: %v\n%s", err, seq)
	}
	t.Logf("rados bench seq:\n%s", seq)
	w, s := parseBench(write), parseBench(seq)
	writes, reads := w.num("Total writes made"), s.num("Total reads made")
	if writes <= 0 || w.num("Bandwidth (MB/sec)") <= 0 || w.num("Average Latency(s)") <= 0 {
		t.Errorf("rados bench write: %v, want writes, bandwidth and latency above 0", w)
	}
	if reads <= 0 || reads > writes || s.num("Bandwidth (MB/sec)") <= 0 || s.num("Average Latency(s)") <= 0 {
		t.Errorf("rados bench seq: %v, want 1 to %v reads, bandwidth and latency above 0", s, writes)
	}
	for _, o := range []string{write, seq} {
		if strings.Contains(strings.ToLower(o), "error") {
			t.Errorf("rados bench reported an error:\n%s", o)
		}
	}
	t.Logf("%s: write %s MB/s (%v objects, average latency %s s), seq %s MB/s (%v objects, average latency %s s)",
		mode.name, w["Bandwidth (MB/sec)"], writes, w["Average Latency(s)"], s["Bandwidth (MB/sec)"], reads, s["Average Latency(s)"])
	// The data went over RDMA: the OSDs' RDMA workers received at
	// least what was written, once from the client and once
	// more for the replica.
	var rx float64
	for _, id := range c.osdIDs {
		rx += c.rdmaRxBytes(t, id)
	}
	if want := writes * (4 << 20) * 2; rx < want {
		t.Errorf("the OSDs' RDMA workers received %v bytes, want at least %v (the writes and their replicas)", rx, want)
	}
	// The monitor's address is a TCP listener only when the
	// messenger exchanges its QPs over TCP.
	if got := c.mon.listening(t, c.monProc, c.monPort); got != mode.tcpListen {
		t.Errorf("ceph-mon listens on TCP %d: %v, want %v", c.monPort, got, mode.tcpListen)
	}
	stopped = true
	c.stop(t)
	// A SEND that found no receive fails the QP when the
	// connection has no RNR retries (rdma_cm mode); Ceph logs it
	// and reconnects.
	for i, p := range c.daemons() {
		if strings.Contains(p.Output(), "RNR_RETRY_EXC_ERR") {
			t.Errorf("daemon %d of %d: a SEND found no receive:\n%s", i+1, len(c.osds)+1, p.Output())
		}
	}
}

// TestCephAgainstRxe runs TestCeph's cluster between softroce and kernel
// rxe: the monitor on one side and both OSDs on the other, the clients on
// the softroce side. In the guest Ceph opens rxe0 at the GID index of its
// IPv4 address, and two settings of its own make it run there
// (guestCephSide). Not run: rdma_cm mode with the monitor in the guest.
// The benchmark passes, but the monitor did not exit within a minute of
// SIGTERM (twice; its log stops 5 s after the signal) and, in a third
// run, aborted in shutdown (ceph_assert(mon.is_leader()), Paxos.cc:1068);
// in each run rdma_create_qp had failed with EINVAL for some incoming
// connections ("failed to create queue pair with rdmacm library(22)").
func TestCephAgainstRxe(t *testing.T) {
	cephNeed(t)
	for _, x := range []struct {
		mode      cephMode
		placement string
	}{
		{cephModes[0], "rxe-mon"},
		{cephModes[0], "rxe-osds"},
		{cephModes[1], "rxe-osds"},
	} {
		t.Run(x.mode.name+"/"+x.placement, func(t *testing.T) {
			r := NewRxePeer(t)
			soft, guest := hostCephSide(t, r.Soft), r.guestCephSide(t)
			port := r.Soft.FreeTCPPort(t) // free on the host side; the guest's ports are its own
			var c *cephCluster
			if x.placement == "rxe-mon" {
				c = newCephCluster(t, guest, soft, soft, port, x.mode)
			} else {
				c = newCephCluster(t, soft, guest, soft, port, x.mode)
			}
			cephBench(t, c, x.mode)
		})
	}
}
