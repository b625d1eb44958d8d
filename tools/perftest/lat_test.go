package perftest

import (
	"regexp"
	"strconv"
	"testing"
	"time"
)

// checkLat asserts a plausible latency row of iters iterations.
func checkLat(t *testing.T, who string, r *LatReport, size, iters uint64) {
	t.Helper()
	if r == nil {
		t.Fatalf("%s printed no latency row", who)
	}
	if r.Size != size || r.Iters != iters || !(r.Min > 0) || r.Min > r.Typical || r.Typical > r.Max ||
		r.Avg < r.Min || r.Avg > r.Max || r.P99 < r.Typical || r.P999 < r.P99 || r.Stdev < 0 {
		t.Fatalf("%s row %+v, want %d bytes x %d iterations, min <= typical <= max", who, r, size, iters)
	}
}

func TestLatStats(t *testing.T) {
	// Posts 0, 10, 20, ... us apart by 10, one iteration of 100 us and
	// one of 50 us: the two left out.
	var posted []time.Duration
	at := time.Duration(0)
	for i := range 12 {
		posted = append(posted, at)
		switch i {
		case 3:
			at += 100 * time.Microsecond
		case 7:
			at += 50 * time.Microsecond
		default:
			at += 10 * time.Microsecond
		}
	}
	r := latStats(posted, 2, 2)
	if r.Iters != 12 || r.Min != 5 || r.Typical != 5 || r.Avg != 5 || r.Stdev != 0 || r.Max != 25 {
		t.Fatalf("%+v", r)
	}
}

// TestLatLoopback runs the four latency tests between two softroce
// engines on loopback.
func TestLatLoopback(t *testing.T) {
	devs := loopbackDevs(t, 47971)
	for _, test := range []Test{Write, Read, Atomic, Send} {
		t.Run(test.String(), func(t *testing.T) {
			base := Config{Test: test, Latency: true, Port: freeTCPPort(t), Iters: 200, Timeout: 30 * time.Second}
			sres, cres, sout, cout := runPair(t, devs, base, overUDP(47971))
			size := uint64(2)
			if test == Atomic {
				size = 8
			}
			checkLat(t, "client", cres.Lat, size, 200)
			if test == Write || test == Send {
				checkLat(t, "server", sres.Lat, size, 200)
			} else if sres.Lat != nil {
				t.Fatalf("the %v server measured %+v\n%s", test, sres.Lat, sout)
			}
			t.Logf("%s", lastLines(cout, 3))
		})
	}
}

var latRowRE = regexp.MustCompile(`(?m)^ (\d+)\s+(\d+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s*$`)

// toolLat parses the latency row perftest printed (nil when none).
func toolLat(out string) *LatReport {
	m := latRowRE.FindStringSubmatch(out)
	if m == nil {
		return nil
	}
	var f [7]float64
	for i := range f {
		f[i], _ = strconv.ParseFloat(m[3+i], 64)
	}
	size, _ := strconv.ParseUint(m[1], 10, 64)
	iters, _ := strconv.ParseUint(m[2], 10, 64)
	return &LatReport{Size: size, Iters: iters, Min: f[0], Max: f[1], Typical: f[2], Avg: f[3], Stdev: f[4], P99: f[5], P999: f[6]}
}

// TestToolLat runs ib_write_lat, ib_read_lat, ib_atomic_lat and
// ib_send_lat (on the softroce daemon) against the engine, softroce in
// either role. Both sides of write and send measure; only the client of
// read and atomic does.
func TestToolLat(t *testing.T) {
	for _, test := range []Test{Write, Read, Atomic, Send} {
		for _, role := range []string{"softroce-client", "softroce-server"} {
			t.Run(test.String()+"/"+role, func(t *testing.T) {
				name := "ib_" + test.String() + "_lat"
				rig := newToolRig(t, name)
				port := freePort(t, "tcp")
				args := []string{"-n", "300", "-p", strconv.Itoa(port)}
				cfg := Config{Test: test, Latency: true, Iters: 300, Port: port}
				tool, e := rig.run(t, role, cfg, args)
				size := uint64(2)
				if test == Atomic {
					size = 8
				}
				pingPong := test == Write || test == Send
				tr := toolLat(tool.output())
				if pingPong || role == "softroce-server" {
					checkLat(t, name, tr, size, 300)
				} else if tr != nil {
					t.Fatalf("%s server printed a row\n%s", name, tool.output())
				}
				if pingPong || role == "softroce-client" {
					checkLat(t, "softroce", e.res.Lat, size, 300)
				} else if e.res.Lat != nil {
					t.Fatalf("softroce server measured %+v", e.res.Lat)
				}
				t.Logf("softroce %s: softroce %+v; %s %+v", role, e.res.Lat, name, tr)
			})
		}
	}
}
