package perftest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/softroce/softroce/cm"
	"github.com/softroce/softroce/nic/pipe"
	"github.com/softroce/softroce/verbs"
)

func TestBinaryKeys(t *testing.T) {
	k := Keys{LID: 0, OutReads: 16, QPN: 0x11, PSN: 0xa1b2c3, RKey: 0x1234, VAddr: 0x7f0012345000,
		GID: verbs.GIDFromAddr(netip.MustParseAddr("192.168.122.113"))}
	b := k.MarshalBinary(1)
	want := []byte{
		0, 0, 0, 0, 0, 0, 0, 16, 0, 0, 0, 0x11, 0, 0xa1, 0xb2, 0xc3, // lid, out_reads, qpn, psn
		0, 0, 0x12, 0x34, 0, 0, 0, 0, // rkey, padding
		0, 0, 0x7f, 0, 0x12, 0x34, 0x50, 0, // vaddr
		0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 168, 122, 113, // GID
		0, 0, 0, 0, 0, 0, 0, 1, // srqn, gid_index
	}
	if !bytes.Equal(b, want) {
		t.Fatalf("got  % x\nwant % x", b, want)
	}
	// perftest's padding is whatever was on its stack.
	b[20], b[23] = 0xde, 0xad
	if back, err := ParseBinaryKeys(b); err != nil || back != k {
		t.Fatalf("round trip %+v, %v", back, err)
	}
	for _, bad := range [][]byte{nil, b[:55], append(b[:56:56], 0)} {
		if _, err := ParseBinaryKeys(bad); !errors.Is(err, ErrMalformed) {
			t.Errorf("%d bytes: %v", len(bad), err)
		}
	}
	over := bytes.Clone(b)
	over[8] = 1 // QPN beyond 24 bits
	if _, err := ParseBinaryKeys(over); !errors.Is(err, ErrMalformed) {
		t.Errorf("QPN %#x accepted", over[8:12])
	}
}

func TestConfigRDMACM(t *testing.T) {
	for _, c := range []Config{
		{Test: Write, Conn: verbs.QPTypeUC, RDMACM: true},
		{Test: Write, Conn: verbs.QPTypeUD, RDMACM: true},
	} {
		if err := c.defaults(); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
	for _, c := range []Config{{Test: Read, RDMACM: true}, {Test: Send, Conn: verbs.QPTypeUD, RDMACM: true}} {
		if err := c.defaults(); err != nil {
			t.Errorf("%+v: %v", c, err)
		}
	}
}

// cmPair is two devices on an in-memory link, each with its CM.
type cmPair struct {
	devs [2]*verbs.Device
	cms  [2]*cm.CM
}

func newCMPair(t *testing.T, pc pipe.Config) *cmPair {
	t.Helper()
	la, lb := pipe.New(pc)
	p := &cmPair{devs: openDevs(t, la, lb)}
	for i, d := range p.devs {
		c, err := cm.Open(d, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		p.cms[i] = c
	}
	return p
}

// TestLoopbackRDMACM runs -R between two softroce devices: the exchange
// and the test QPs are connected by the CMs, the traffic and the data
// checks are those of the TCP flow.
func TestLoopbackRDMACM(t *testing.T) {
	p := newCMPair(t, pipe.Config{Depth: 4096})
	for i, tc := range []struct {
		test        Test
		conn        verbs.QPType
		size, iters int
		qps         int
	}{
		{Write, verbs.QPTypeRC, 4096, 200, 1},
		{Write, verbs.QPTypeRC, 100, 300, 2},
		{Read, verbs.QPTypeRC, 65536, 30, 1},
		{Read, verbs.QPTypeRC, 1000, 100, 2},
		{Send, verbs.QPTypeRC, 4096, 200, 1},
		{Send, verbs.QPTypeRC, 64, 500, 2},
		{Atomic, verbs.QPTypeRC, 8, 200, 1},
		{Send, verbs.QPTypeUD, 4096, 200, 1},
		{Send, verbs.QPTypeUD, 1000, 300, 3},
	} {
		t.Run(fmt.Sprintf("%v/%v/size%d/q%d", tc.test, tc.conn, tc.size, tc.qps), func(t *testing.T) {
			base := Config{Test: tc.test, Conn: tc.conn, RDMACM: true, Port: 18515 + i, Size: tc.size, Iters: tc.iters, QPs: tc.qps,
				Timeout: 30 * time.Second}
			sres, cres, sout, cout := runPair(t, p.devs, base, func(side int, c *Config) {
				c.CM = p.cms[side]
				if side == 1 {
					c.Server = p.cms[0].Local().String()
				}
			})
			total := uint64(tc.iters * tc.qps)
			if sres.Report.Iters != total || cres.Report.Iters != total || cres.Report.AvgBW <= 0 || sres.Report.AvgBW <= 0 {
				t.Fatalf("reports: server %+v, client %+v", sres.Report, cres.Report)
			}
			if sres.Checked == "" || (tc.test != Write && tc.test != Send && cres.Checked == "") {
				t.Fatalf("data checks did not run: server %q, client %q", sres.Checked, cres.Checked)
			}
			// The CM chose the path MTU: the pipe's 4096 (UD has none:
			// the exchanged MTU limits the size).
			if sres.MTU != 4096 || cres.MTU != 4096 {
				t.Fatalf("path MTU %d/%d, want 4096", sres.MTU, cres.MTU)
			}
			if tc.conn == verbs.QPTypeUD && (sres.Lost != 0 || sres.Stats.TxPackets != 0) {
				t.Fatalf("UD server: lost %d, stats %+v", sres.Lost, sres.Stats)
			}
			for q := range tc.qps {
				if sres.LocalQPs[q] != cres.RemoteQPs[q] || sres.RemoteQPs[q] != cres.LocalQPs[q] {
					t.Fatalf("QP %d keys: server %+v / %+v, client %+v / %+v", q, sres.LocalQPs[q], sres.RemoteQPs[q], cres.LocalQPs[q], cres.RemoteQPs[q])
				}
			}
			if strings.Contains(sout, "done") || !strings.Contains(cout, "BW average") {
				t.Fatalf("output:\n%s\n%s", sout, cout)
			}
		})
	}
	// Every connection was disconnected at the end: none is left.
	for i, c := range p.cms {
		deadline := time.Now().Add(10 * time.Second)
		for c.Stats().Conns != 0 && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if st := c.Stats(); st.Conns != 0 {
			t.Errorf("CM %d still has %d connections: %+v", i, st.Conns, st)
		}
	}
}

// TestRDMACMNoServer: a client with no server fails with the CM's
// refusal once its timeout ends, naming what to check.
func TestRDMACMNoServer(t *testing.T) {
	p := newCMPair(t, pipe.Config{})
	_, err := Run(context.Background(), p.devs[1], Config{Test: Write, RDMACM: true, CM: p.cms[1],
		Server: p.cms[0].Local().String(), Iters: 10, Timeout: 500 * time.Millisecond}, &bytes.Buffer{})
	if err == nil || !errors.Is(err, cm.ErrNoListener) || !strings.Contains(err.Error(), "-R") {
		t.Fatalf("err %v", err)
	}
	if _, err := Run(context.Background(), p.devs[1], Config{Test: Write, RDMACM: true, CM: p.cms[1],
		Server: "server.example", Timeout: time.Second}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "IP address") {
		t.Fatalf("host name: %v", err)
	}
}

// TestRDMACMPeerMisbehaves: scripted rdma_cm clients that break the
// exchange draw a clear error from softroce's server, not a hang.
func TestRDMACMPeerMisbehaves(t *testing.T) {
	p := newCMPair(t, pipe.Config{})
	pd, err := p.devs[1].AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 256)
	mr, err := pd.RegMR(buf, verbs.AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	for i, tc := range []struct {
		name   string
		script func(ctx context.Context, k *cm.Conn, qp *verbs.QP, cq *verbs.CQ)
		want   string
	}{
		{"wrong size", func(ctx context.Context, k *cm.Conn, qp *verbs.QP, c *verbs.CQ) {
			// A KEYS-sized message where the version belongs.
			qp.PostSend(&verbs.SendWR{Opcode: verbs.WRSend, Flags: verbs.SendSignaled,
				SGL: []verbs.SGE{{Addr: mr.Addr(), Length: BinaryKeysLen, LKey: mr.LKey()}}})
			c.Wait(ctx, make([]verbs.WC, 1))
			<-ctx.Done()
		}, "malformed"},
		{"disconnects", func(ctx context.Context, k *cm.Conn, qp *verbs.QP, c *verbs.CQ) {
			k.Disconnect(ctx)
		}, "perftest -R version exchange"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			port := 18600 + i
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			go func() {
				c, _ := p.devs[1].CreateCQ(4)
				qp, _ := pd.CreateQP(verbs.QPInitAttr{SendCQ: c, RecvCQ: c})
				defer qp.Destroy()
				k, err := dialRetry(ctx, p.cms[1], p.cms[0].Local(), uint16(port), qp, nil, -1)
				if err != nil {
					return
				}
				tc.script(ctx, k, qp, c)
			}()
			_, err := Run(ctx, p.devs[0], Config{Test: Write, RDMACM: true, CM: p.cms[0], Port: port, Iters: 10,
				Timeout: 3 * time.Second}, &bytes.Buffer{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
			t.Log(err)
		})
	}
}
