package apps

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
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

// cephCluster is a monitor on host A and memstore OSDs on host B, every
// daemon and client run as User through `softroce run`.
type cephCluster struct {
	hs      *TwoHosts
	dir     string // the cluster's files, owned by User, mode 0700
	conf    string // ceph.conf
	mon     *Proc
	osds    []*Proc
	osdIDs  []int
	monPort int
}

// cephConf is the cluster's ceph.conf: no authentication (auth none),
// messenger v2 only, async+rdma for every messenger, memstore OSDs, and
// pools of two replicas that stay writable with one, placed on OSDs
// rather than hosts (both OSDs are on host B). Every path (data, logs,
// admin sockets) is under dir.
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
func cephConf(dir, fsid, monAddr, osdAddr string, monPort int, mode cephMode) string {
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
ms_async_rdma_receive_buffers = 4096
ms_async_rdma_send_buffers = 256
%srun_dir = %s
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
`, fsid, monAddr, monPort, cephDevice, mode.conf, dir, dir, dir, dir, monAddr, dir, cephMemstoreBytes, osdAddr, osdAddr)
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

// newCephCluster writes the configuration and makes the monitor's store
// (monmaptool, ceph-mon --mkfs), then starts the monitor on host A.
func newCephCluster(t *testing.T, hs *TwoHosts, mode cephMode) *cephCluster {
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
	c := &cephCluster{hs: hs, dir: dir, conf: filepath.Join(dir, "ceph.conf"), monPort: hs.A.FreeTCPPort(t)}
	fsid := uuid4()
	conf := cephConf(dir, fsid, hs.A.Addr().String(), hs.B.Addr().String(), c.monPort, mode)
	if err := os.WriteFile(c.conf, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(c.conf, User, User); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			c.dumpLogs(t)
		}
	})
	monmap := filepath.Join(dir, "monmap")
	if out, err := hs.A.Run(t, time.Minute, nil, "monmaptool", "--create", "--fsid", fsid,
		"--addv", "a", fmt.Sprintf("[v2:%s:%d]", hs.A.Addr(), c.monPort), monmap); err != nil {
		t.Fatalf("monmaptool: %v\n%s", err, out)
	}
	if out, err := hs.A.Run(t, time.Minute, nil, "ceph-mon", "-c", c.conf, "--mkfs", "-i", "a", "--monmap", monmap); err != nil {
		t.Fatalf("ceph-mon --mkfs: %v\n%s", err, out)
	}
	c.mon = hs.A.Start(t, nil, "ceph-mon", "-c", c.conf, "-f", "-i", "a")
	return c
}

// dumpLogs logs the daemons' log files, their last lines.
func (c *cephCluster) dumpLogs(t *testing.T) {
	logs, _ := filepath.Glob(filepath.Join(c.dir, "*.log"))
	for _, l := range logs {
		b, _ := os.ReadFile(l)
		const tail = 12000
		if len(b) > tail {
			b = b[len(b)-tail:]
		}
		t.Logf("%s (end):\n%s", filepath.Base(l), b)
	}
	if c.mon != nil {
		t.Logf("ceph-mon output:\n%s", c.mon.Output())
	}
	for i, o := range c.osds {
		t.Logf("ceph-osd %d output:\n%s", i, o.Output())
	}
}

// ceph runs the ceph command-line client on host B.
func (c *cephCluster) ceph(t *testing.T, args ...string) (string, error) {
	t.Helper()
	start := time.Now()
	out, err := c.hs.B.Run(t, time.Minute, nil, "ceph", append([]string{"-c", c.conf, "--connect-timeout", "30"}, args...)...)
	t.Logf("ceph %s: %v (%v)", strings.Join(args, " "), err, time.Since(start).Round(10*time.Millisecond))
	return out, err
}

// addOSD registers an OSD with the monitor (ceph osd new), makes its
// memstore (ceph-osd --mkfs) and starts it on host B.
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
	data := filepath.Join(c.dir, fmt.Sprintf("osd-%d", id))
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(data, User, User); err != nil {
		t.Fatal(err)
	}
	if out, err := c.hs.B.Run(t, time.Minute, nil, "ceph-osd", "-c", c.conf, "-i", strconv.Itoa(id), "--mkfs", "--osd-uuid", uuid); err != nil {
		t.Fatalf("ceph-osd -i %d --mkfs: %v\n%s", id, err, out)
	}
	c.osdIDs = append(c.osdIDs, id)
	c.osds = append(c.osds, c.hs.B.Start(t, nil, "ceph-osd", "-c", c.conf, "-f", "-i", strconv.Itoa(id)))
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

// stop sends SIGTERM to every daemon, the OSDs first, and requires each
// to exit on its own.
func (c *cephCluster) stop(t *testing.T) {
	t.Helper()
	procs := append(append([]*Proc{}, c.osds...), c.mon)
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
		err := p.WaitTimeout(20 * time.Second)
		if err == ErrTimeout {
			t.Errorf("%s did not exit within 20 s of SIGTERM:\n%s", names[i], p.Output())
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
	out, err := c.hs.B.Run(t, time.Minute, nil, "ceph", "--admin-daemon", filepath.Join(c.dir, fmt.Sprintf("osd.%d.asok", id)), "perf", "dump")
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
	Need(t, "ceph-mon ceph-osd ceph-common", "ceph-mon", "ceph-osd", "ceph", "rados", "monmaptool")
	for _, mode := range cephModes {
		t.Run(mode.name, func(t *testing.T) {
			hs := NewTwoHosts(t)
			c := newCephCluster(t, hs, mode)
			stopped := false
			defer func() {
				if !stopped {
					c.stop(t)
				}
			}()
			for i := 0; i < 2; i++ {
				c.addOSD(t)
			}
			c.waitOSDsUp(t, time.Minute)
			const pool = "bench"
			if out, err := c.ceph(t, "osd", "pool", "create", pool, "8", "8", "replicated"); err != nil {
				t.Fatalf("ceph osd pool create: %v\n%s", err, out)
			}
			// Listing the pool asks every placement group in turn, so it
			// returns once all are active: the benchmark then measures
			// writes, not the pool's creation.
			start := time.Now()
			if out, err := hs.B.Run(t, 2*time.Minute, nil, "rados", "-c", c.conf, "-p", pool, "ls"); err != nil {
				t.Fatalf("rados ls: %v\n%s", err, out)
			}
			t.Logf("rados -p %s ls: %v", pool, time.Since(start).Round(10*time.Millisecond))
			// --max-objects: see cephBenchObjects.
			write, err := hs.B.Run(t, 2*time.Minute, nil, "rados", "-c", c.conf, "bench", "-p", pool, "5", "write", "--no-cleanup",
				"--max-objects", strconv.Itoa(cephBenchObjects))
			if err != nil {
				t.Fatalf("rados bench write: %v\n%s", err, write)
			}
			t.Logf("rados bench write:\n%s", write)
			seq, err := hs.B.Run(t, 2*time.Minute, nil, "rados", "-c", c.conf, "bench", "-p", pool, "5", "seq")
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
			if got := tcpListening(c.mon.Pid(), c.monPort); got != mode.tcpListen {
				t.Errorf("ceph-mon listens on TCP %d: %v, want %v", c.monPort, got, mode.tcpListen)
			}
			stopped = true
			c.stop(t)
			// A SEND that found no receive fails the QP when the
			// connection has no RNR retries (rdma_cm mode); Ceph logs it
			// and reconnects.
			for i, p := range append(append([]*Proc{}, c.osds...), c.mon) {
				if strings.Contains(p.Output(), "RNR_RETRY_EXC_ERR") {
					t.Errorf("daemon %d of %d: a SEND found no receive:\n%s", i+1, len(c.osds)+1, p.Output())
				}
			}
		})
	}
}
