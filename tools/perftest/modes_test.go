package perftest

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/abitest"
	"github.com/softroce/softroce/nic/pipe"
	"github.com/softroce/softroce/nic/udp"
	"github.com/softroce/softroce/serve"
	"github.com/softroce/softroce/verbs"
)

// The perftest tools themselves run on a softroce daemon (softroce's
// libibverbs.so.1), facing tools/perftest's engine on a second device on
// the same loopback address: -a, -D and --run_infinitely in both roles.

// realTool skips unless softroce's C library can be built and the
// perftest tool is installed, and returns the tool's path and the
// library's directory.
func realTool(t *testing.T, name string) (string, string) {
	t.Helper()
	return abitest.Tool(t, name, "perftest")
}

func freePort(t *testing.T, network string) int {
	t.Helper()
	if network == "udp" {
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.LocalAddr().(*net.UDPAddr).Port
	}
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// toolRig is a daemon for the perftest tool and a device for softroce's
// engine, on 127.0.0.1, each sending to the other's UDP port.
type toolRig struct {
	tool, lib string
	daemon    *serve.Server
	dev       *verbs.Device
	devPort   int // the daemon's UDP port, the engine's RemotePort
}

func newToolRig(t *testing.T, name string) *toolRig {
	t.Helper()
	p, lib := realTool(t, name)
	x, y := freePort(t, "udp"), freePort(t, "udp")
	open := func(port int) *verbs.Device {
		l, err := udp.Open(udp.Config{Addr: netip.MustParseAddr("127.0.0.1"), Port: port, SocketBuffer: 4 << 20})
		if err != nil {
			t.Fatal(err)
		}
		d, err := verbs.Open(l, nil)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	dd := open(x)
	s, err := serve.New([]*verbs.Device{dd}, serve.Config{Socket: filepath.Join(t.TempDir(), "s.sock"), RemotePort: uint16(y)})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Listen(); err != nil {
		s.Close()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve() }()
	dev := open(y)
	t.Cleanup(func() {
		dev.Close()
		s.Close()
		<-done
	})
	return &toolRig{tool: p, lib: lib, daemon: s, dev: dev, devPort: x}
}

// toolProc is a running perftest tool with its output.
type toolProc struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  bytes.Buffer
	done chan error
}

func (p *toolProc) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.Write(b)
}

func (p *toolProc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// start runs the tool with args: -F keeps a busy machine's CPU frequency
// estimate from failing the report, -x 0 is softroce's GID. (The tool
// keeps its send and receive rings exactly full, as perftest does, which
// serve's TestRingSlotFreeBeforePost is about.)
func (r *toolRig) start(t *testing.T, args ...string) *toolProc {
	t.Helper()
	p := &toolProc{cmd: exec.Command(r.tool, append([]string{"-F", "-x", "0"}, args...)...), done: make(chan error, 1)}
	p.cmd.Env = append(os.Environ(), "SOFTROCE_SOCKET="+r.daemon.Socket(), "LD_LIBRARY_PATH="+r.lib)
	p.cmd.Stdout, p.cmd.Stderr = p, p
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() { p.cmd.Process.Kill() })
	return p
}

// wait waits for the tool to exit; a hang, not a performance bound, ends
// it after two minutes.
func (p *toolProc) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-p.done:
		return err
	case <-time.After(2 * time.Minute):
		p.cmd.Process.Kill()
		t.Fatalf("%s did not finish:\n%s", p.cmd.Path, p.output())
		return nil
	}
}

// toolRows parses perftest's result rows (the last one may lack its
// newline when the tool was interrupted).
var rowRE = regexp.MustCompile(`(?m)^ (\d+)\s+(\d+)\s+([0-9.]+|-?nan|inf)\s+([0-9.]+|-?nan|inf)\s+([0-9.]+|-?nan|inf)`)

func toolRows(out string) []Report {
	var rows []Report
	for _, m := range rowRE.FindAllStringSubmatch(out, -1) {
		size, _ := strconv.ParseUint(m[1], 10, 64)
		iters, _ := strconv.ParseUint(m[2], 10, 64)
		avg, _ := strconv.ParseFloat(m[4], 64)
		rows = append(rows, Report{Size: size, Iters: iters, AvgBW: avg})
	}
	return rows
}

// engine runs softroce's side with cfg (server when cfg.Server is empty,
// listening before it returns) and returns a channel with its result.
type engineRun struct {
	res *Result
	err error
	out *lockedBuf
}

type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (r *toolRig) engine(t *testing.T, cfg Config) (<-chan engineRun, *lockedBuf) {
	t.Helper()
	cfg.RemotePort = uint16(r.devPort)
	if cfg.Timeout == 0 {
		cfg.Timeout = 90 * time.Second
	}
	if cfg.Server == "" {
		ln, err := net.Listen("tcp4", fmt.Sprintf("127.0.0.1:%d", cfg.Port))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		cfg.Listen = func(string, string) (net.Listener, error) { return ln, nil }
	}
	out := &lockedBuf{}
	ch := make(chan engineRun, 1)
	go func() {
		res, err := Run(context.Background(), r.dev, cfg, out)
		ch <- engineRun{res, err, out}
	}()
	return ch, out
}

// run runs the tool with args against the engine with cfg, softroce in
// role (the server starts first), and fails the test unless the tool
// exits cleanly.
func (r *toolRig) run(t *testing.T, role string, cfg Config, args []string) (*toolProc, engineRun) {
	t.Helper()
	var tool *toolProc
	var ch <-chan engineRun
	if role == "softroce-client" {
		tool = r.start(t, args...)
		cfg.Server = "127.0.0.1"
		ch, _ = r.engine(t, cfg)
	} else {
		ch, _ = r.engine(t, cfg)
		tool = r.start(t, append(args, "127.0.0.1")...)
	}
	e := awaitEngine(t, ch, tool)
	if err := tool.wait(t); err != nil {
		t.Fatalf("%s: %v\n%s", filepath.Base(r.tool), err, tool.output())
	}
	return tool, e
}

func awaitEngine(t *testing.T, ch <-chan engineRun, tool *toolProc) engineRun {
	t.Helper()
	select {
	case e := <-ch:
		if e.err != nil {
			t.Fatalf("softroce: %v\n%s\ntool:\n%s", e.err, e.out, tool.output())
		}
		return e
	case <-time.After(2 * time.Minute):
		t.Fatalf("softroce did not finish; tool:\n%s", tool.output())
	}
	return engineRun{}
}

// allSizes are -a's sizes over RC.
func allSizes() []uint64 {
	var v []uint64
	for n := uint64(2); n <= MaxSize; n *= 2 {
		v = append(v, n)
	}
	return v
}

// checkAll asserts one row per size of -a, with iters iterations each
// (and, for rows softroce measured, a rate).
func checkAll(t *testing.T, who string, rows []Report, iters uint64, rate bool) {
	t.Helper()
	want := allSizes()
	if len(rows) != len(want) {
		t.Fatalf("%s printed %d rows, want %d: %+v", who, len(rows), len(want), rows)
	}
	for i, r := range rows {
		if r.Size != want[i] || r.Iters != iters || (rate && !(r.AvgBW > 0)) {
			t.Fatalf("%s row %d: %+v, want %d bytes x %d iterations", who, i, r, want[i], iters)
		}
	}
}

// TestToolAllSizes: -a -n 5 against ib_write_bw and ib_send_bw, softroce
// as client and as server. Over WRITE only the client prints a row per
// size (the server prints the client's last report); over SEND both do.
func TestToolAllSizes(t *testing.T) {
	for _, test := range []Test{Write, Send} {
		for _, role := range []string{"softroce-client", "softroce-server"} {
			t.Run(test.String()+"/"+role, func(t *testing.T) {
				rig := newToolRig(t, test.Tool())
				port := freePort(t, "tcp")
				args := []string{"-a", "-n", "5", "-p", strconv.Itoa(port)}
				cfg := Config{Test: test, All: true, Iters: 5, Port: port}
				tool, e := rig.run(t, role, cfg, args)
				trows := toolRows(tool.output())
				last := []Report{{Size: MaxSize, Iters: 5}}
				switch {
				case test == Send || role == "softroce-client":
					checkAll(t, "softroce", e.res.Rows, 5, true)
				default:
					if len(e.res.Rows) != 1 || e.res.Rows[0].Size != last[0].Size || e.res.Rows[0].Iters != 5 {
						t.Fatalf("softroce server rows %+v, want the client's last: %+v\n%s", e.res.Rows, last, e.out)
					}
				}
				switch {
				case test == Send || role == "softroce-server":
					checkAll(t, test.Tool(), trows, 5, false)
				default:
					if len(trows) != 1 || trows[0].Size != MaxSize || trows[0].Iters != 5 {
						t.Fatalf("%s server rows %+v, want softroce's last\n%s", test.Tool(), trows, tool.output())
					}
				}
				if role == "softroce-server" && e.res.Checked == "" {
					t.Fatalf("softroce ran no data check\n%s", e.out)
				}
				t.Logf("softroce %s; %s last row %+v; check: %s", role, test.Tool(), trows[len(trows)-1], e.res.Checked)
			})
		}
	}
}

// TestToolDuration: -D 2 against ib_write_bw and ib_send_bw in both
// roles: one row of the timed run (no peak, as perftest), on both sides
// for SEND, and the client's on both sides for WRITE.
func TestToolDuration(t *testing.T) {
	for _, test := range []Test{Write, Send} {
		for _, role := range []string{"softroce-client", "softroce-server"} {
			t.Run(test.String()+"/"+role, func(t *testing.T) {
				rig := newToolRig(t, test.Tool())
				port := freePort(t, "tcp")
				args := []string{"-D", "2", "-s", "4096", "-p", strconv.Itoa(port)}
				cfg := Config{Test: test, Duration: 2 * time.Second, Size: 4096, Port: port}
				tool, e := rig.run(t, role, cfg, args)
				trows := toolRows(tool.output())
				if len(trows) != 1 || trows[0].Size != 4096 || trows[0].Iters == 0 {
					t.Fatalf("%s rows %+v\n%s", test.Tool(), trows, tool.output())
				}
				if len(e.res.Rows) != 1 {
					t.Fatalf("softroce rows %+v\n%s", e.res.Rows, e.out)
				}
				r := e.res.Rows[0]
				if r.Size != 4096 || r.Iters == 0 || r.PeakBW != 0 || !(r.AvgBW > 0) {
					t.Fatalf("softroce row %+v\n%s", r, e.out)
				}
				if test == Write && r.Iters != trows[0].Iters {
					t.Fatalf("softroce printed %d iterations, %s %d: one report, printed on both sides", r.Iters, test.Tool(), trows[0].Iters)
				}
				t.Logf("softroce %+v, %s %+v", r, test.Tool(), trows[0])
			})
		}
	}
}

// TestToolInfinite: --run_infinitely -D 1 against ib_write_bw and
// ib_send_bw, each stopped after two rows. softroce's client, stopped,
// ends a WRITE run with the closing exchange (ib_write_bw's server prints
// the whole run and exits 0); over SEND perftest's receiver never reads
// again and is killed. softroce's server ends when the interrupted tool
// closes the connection.
func TestToolInfinite(t *testing.T) {
	for _, test := range []Test{Write, Send} {
		for _, role := range []string{"softroce-client", "softroce-server"} {
			t.Run(test.String()+"/"+role, func(t *testing.T) {
				rig := newToolRig(t, test.Tool())
				port := freePort(t, "tcp")
				args := []string{"--run_infinitely", "-D", "1", "-s", "4096", "-p", strconv.Itoa(port)}
				stop := make(chan struct{})
				cfg := Config{Test: test, Infinite: true, Duration: time.Second, Size: 4096, Port: port, Stop: stop}
				var tool *toolProc
				twoRows := func(out func() string) {
					t.Helper()
					for deadline := time.Now().Add(time.Minute); len(toolRows(out())) < 2; time.Sleep(50 * time.Millisecond) {
						if time.Now().After(deadline) {
							t.Fatalf("no two rows in a minute:\n%s\ntool:\n%s", out(), tool.output())
						}
					}
				}
				if role == "softroce-client" {
					tool = rig.start(t, args...)
					cfg.Server = "127.0.0.1"
					ch, out := rig.engine(t, cfg)
					twoRows(out.String)
					close(stop)
					e := awaitEngine(t, ch, tool)
					rows := e.res.Rows
					if len(rows) < 3 {
						t.Fatalf("softroce rows %+v\n%s", rows, e.out)
					}
					for _, r := range rows {
						if r.Size != 4096 || r.PeakBW != 0 || !(r.AvgBW > 0) || r.Iters == 0 {
							t.Fatalf("softroce row %+v\n%s", r, e.out)
						}
					}
					whole := rows[len(rows)-1] // the whole run
					if test == Write {
						if err := tool.wait(t); err != nil {
							t.Fatalf("%s server did not end cleanly: %v\n%s", test.Tool(), err, tool.output())
						}
						trows := toolRows(tool.output())
						if len(trows) != 1 || trows[0].Iters != whole.Iters {
							t.Fatalf("%s server rows %+v, want softroce's whole run %+v\n%s", test.Tool(), trows, whole, tool.output())
						}
					} else {
						twoRows(tool.output)
						tool.cmd.Process.Signal(syscall.SIGINT)
						tool.wait(t)
					}
					t.Logf("softroce rows %+v", rows)
					return
				}
				ch, _ := rig.engine(t, cfg)
				tool = rig.start(t, append(args, "127.0.0.1")...)
				twoRows(tool.output)
				tool.cmd.Process.Signal(syscall.SIGINT)
				tool.wait(t)
				e := awaitEngine(t, ch, tool)
				if test == Send && len(e.res.Rows) < 2 {
					t.Fatalf("softroce receiver rows %+v\n%s", e.res.Rows, e.out)
				}
				if !bytes.Contains([]byte(e.out.String()), []byte("the peer closed the connection")) {
					t.Fatalf("softroce server output:\n%s", e.out)
				}
				t.Logf("%s rows %+v; softroce rows %+v", test.Tool(), toolRows(tool.output()), e.res.Rows)
			})
		}
	}
}

// TestAllSizesUD: over UD, -a stops at the MTU (a UD message is one
// packet), as perftest's send_bw does; both sides print a row per size.
func TestAllSizesUD(t *testing.T) {
	devs := udPair(t, pipe.Config{Block: true})
	base := Config{Test: Send, Conn: verbs.QPTypeUD, All: true, Iters: 20, MTU: 1024, Port: freePort(t, "tcp"), Timeout: 60 * time.Second}
	sres, cres, sout, cout := runPair(t, devs, base, func(side int, c *Config) {
		if side == 1 {
			c.Server = "127.0.0.1"
		}
	})
	for _, r := range []struct {
		who  string
		rows []Report
		out  string
	}{{"server", sres.Rows, sout}, {"client", cres.Rows, cout}} {
		if len(r.rows) != 10 {
			t.Fatalf("%s: %d rows, want 2..1024 bytes\n%s", r.who, len(r.rows), r.out)
		}
		for i, row := range r.rows {
			if row.Size != 2<<i || row.Iters == 0 || !(row.AvgBW > 0) {
				t.Fatalf("%s row %d: %+v\n%s", r.who, i, row, r.out)
			}
		}
	}
	if !strings.Contains(sout, "Max msg size in UD is MTU 1024") || sres.Checked == "" {
		t.Fatalf("server output:\n%s", sout)
	}
}
