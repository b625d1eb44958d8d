package interop

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/softroce/softroce/bth/mad"
	"github.com/softroce/softroce/cm"
)

// TestDaemonRejectsAgainstRxe points the guest's rdma_cm tools at a
// softroce daemon that no host program has used, on a port nothing
// listens on. The daemon's QP1 answers from the start, as the kernel's
// ib_cm does on a host with an RNIC: rping and ucmatose report
// RDMA_CM_EVENT_REJECTED with status 8 (REJ "invalid service ID"), and
// udaddy RDMA_CM_EVENT_UNREACHABLE with status 1 (SIDR_REP "service not
// supported"), the rdma_cm event the kernel makes of that SIDR status.
// Without an answer each tool would instead wait out its CM retries
// (about 74 s for a REQ, 65 s for a SIDR_REQ) and be killed by the
// 60-second timeout with none of those lines, or report status -110.
func TestDaemonRejectsAgainstRxe(t *testing.T) {
	needVM(t)
	const port = 7479 // nobody listens on it, in any port space
	for _, tc := range []struct {
		tool, args string
		want       *regexp.Regexp
	}{
		{"rping", fmt.Sprintf("-c -C 1 -p %d -a HOST", port), regexp.MustCompile(`cma event RDMA_CM_EVENT_REJECTED, error 8\b`)},
		{"ucmatose", fmt.Sprintf("-p %d -s HOST", port), regexp.MustCompile(`RDMA_CM_EVENT_REJECTED, error: 8\b`)},
		// udaddy's port is fixed (7174); -p is its port space.
		{"udaddy", "-s HOST", regexp.MustCompile(`udaddy: event: RDMA_CM_EVENT_UNREACHABLE, error: 1\b`)},
	} {
		t.Run(tc.tool, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			s, _ := abiServe(t, "")
			args := strings.ReplaceAll(tc.args, "HOST", vm.HostAddr().String())
			start := time.Now()
			out, err := vm.Run(ctx, fmt.Sprintf("timeout 60 %s %s 2>&1; echo exit=$?", tc.tool, args))
			took := time.Since(start)
			if err != nil {
				t.Fatalf("guest %s %s: %v\n%s", tc.tool, args, err, out)
			}
			if !tc.want.MatchString(out) {
				t.Fatalf("guest %s %s (%v): want %q:\n%s", tc.tool, args, took.Round(time.Millisecond), tc.want, out)
			}
			if strings.Contains(out, "exit=124") || strings.Contains(out, "error: -110") || strings.Contains(out, "error -110") {
				t.Fatalf("guest %s timed out rather than being refused:\n%s", tc.tool, out)
			}
			if st := s.Stats(); st.Accepted != 0 {
				t.Errorf("a host program used the daemon: %+v", st)
			}
			t.Logf("guest %s refused in %v: %s", tc.tool, took.Round(time.Millisecond), lastLines(out, 3))
		})
	}
}

// chanMADConn is a MADConn the test feeds and reads: softroce's CM on it
// answers exactly what the test hands it.
type chanMADConn struct {
	in, out chan []byte
	done    chan struct{}
	once    sync.Once
}

func newChanMADConn() *chanMADConn {
	return &chanMADConn{in: make(chan []byte, 1), out: make(chan []byte, 16), done: make(chan struct{})}
}

func (c *chanMADConn) SendMAD(_ cm.Peer, b []byte) error {
	c.out <- append([]byte(nil), b...)
	return nil
}

func (c *chanMADConn) RecvMAD(buf []byte) (int, cm.Peer, error) {
	select {
	case b := <-c.in:
		return copy(buf, b), cm.Peer{Addr: netip.AddrPortFrom(vm.GuestAddr(), 4791), QPN: 1}, nil
	case <-c.done:
		return 0, cm.Peer{}, cm.ErrClosed
	}
}

func (c *chanMADConn) Close() error { c.once.Do(func() { close(c.done) }); return nil }

// gsiMAD is a 256-byte MAD to QP1 with the given header and a recognisable
// body.
func gsiMAD(class, version uint8, method mad.Method, attr mad.AttrID, tid uint64) []byte {
	b := make([]byte, cm.MADSize)
	b[0], b[1], b[2], b[3] = mad.BaseVersion, class, version, byte(method)
	binary.BigEndian.PutUint64(b[8:], tid)
	binary.BigEndian.PutUint16(b[16:], uint16(attr))
	for i := 24; i < len(b); i++ {
		b[i] = byte(i)
	}
	return b
}

// TestUnsupportedMADAgainstRxe sends Gets and Sets that no agent on the
// guest's QP1 serves (only the kernel's CM is there, for Send) to the
// guest, and the same MADs to softroce's CM: the answers must be the same
// bytes (the kernel's MAD layer sends the MAD back as a GetResp with
// status 0x000C). MADs the kernel does not answer (SMPs on QP1, a
// GetResp, a CM Get of a REQ) go first: had one been answered, its answer
// would come before the next expected one.
func TestUnsupportedMADAgainstRxe(t *testing.T) {
	needVM(t)
	dev := hostDevice(t)
	q, err := cm.OpenQP1(dev, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	fake := newChanMADConn()
	c, err := cm.New(dev, fake, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	guest := cm.Peer{Addr: netip.AddrPortFrom(vm.GuestAddr(), 4791), QPN: 1}
	type reply struct {
		b   []byte
		err error
	}
	replies := make(chan reply, 16)
	go func() {
		for {
			buf := make([]byte, cm.MADSize)
			n, _, err := q.RecvMAD(buf)
			replies <- reply{buf[:n], err}
			if err != nil {
				return
			}
		}
	}()
	silent := [][]byte{
		gsiMAD(0x01, 1, mad.MethodGet, 0x0015, 0x51),                              // LID-routed SMP: QP0's
		gsiMAD(0x04, 1, mad.MethodGetResp, 0x0012, 0x52),                          // a response nobody asked for
		gsiMAD(mad.ClassCM, mad.CMClassVersion, mad.MethodGet, mad.AttrREQ, 0x53), // CM messages travel by Send
	}
	answered := []struct {
		name string
		b    []byte
	}{
		{"PerfMgmt Get PortCounters", gsiMAD(0x04, 1, mad.MethodGet, 0x0012, 0x61)},
		{"SA Get ClassPortInfo", gsiMAD(0x03, 2, mad.MethodGet, mad.AttrClassPortInfo, 0x62)},
		{"DevMgmt Set", gsiMAD(0x06, 1, mad.MethodSet, 0x0010, 0x63)},
		{"CM Get ClassPortInfo", gsiMAD(mad.ClassCM, mad.CMClassVersion, mad.MethodGet, mad.AttrClassPortInfo, 0x64)},
	}
	for i, a := range answered {
		if i == 0 {
			for _, s := range silent {
				if err := q.SendMAD(guest, s); err != nil {
					t.Fatal(err)
				}
				fake.in <- s
			}
		}
		if err := q.SendMAD(guest, a.b); err != nil {
			t.Fatal(err)
		}
		var kernel []byte
		select {
		case r := <-replies:
			if r.err != nil {
				t.Fatal(r.err)
			}
			kernel = r.b
		case <-time.After(20 * time.Second):
			t.Fatalf("%s: the guest's kernel did not answer", a.name)
		}
		fake.in <- a.b
		var ours []byte
		select {
		case ours = <-fake.out:
		case <-time.After(20 * time.Second):
			t.Fatalf("%s: softroce's CM did not answer", a.name)
		}
		if !bytes.Equal(kernel, ours) {
			t.Errorf("%s: the kernel answers\n%x\nsoftroce\n%x", a.name, kernel, ours)
		}
		t.Logf("%s: %s, status 0x%04x, from both", a.name, mad.Method(kernel[3]), binary.BigEndian.Uint16(kernel[4:]))
	}
	if s := c.Stats(); s.Unsupported != uint64(len(answered)) || s.Sent != uint64(len(answered)) {
		t.Errorf("softroce's CM: %+v", s)
	}
}
