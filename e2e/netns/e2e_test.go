// Package netns runs two softroce endpoints in separate network namespaces
// joined by veth pairs, over each NIC backend (nic/udp, nic/afxdp and one
// of each), directly and through an impairment relay in a middle
// namespace, and checks RC WRITE, READ, SEND and atomics byte for byte.
// The tests need root and skip otherwise.
package netns

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/softroce/softroce/internal/devsync"
	"github.com/softroce/softroce/internal/netnstest"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/nic/afxdp"
	"github.com/softroce/softroce/nic/impair"
	"github.com/softroce/softroce/nic/udp"
	"github.com/softroce/softroce/verbs"
)

const bufSize = 1 << 20

// backend opens a nic.Link on a namespace end.
type backend struct {
	name string
	open func(t testing.TB, e *netnstest.End) nic.Link
}

var (
	udpBackend = backend{"udp", func(t testing.TB, e *netnstest.End) nic.Link {
		var l *udp.Link
		e.NS.Run(t, func() (err error) {
			l, err = udp.Open(udp.Config{Addr: e.Addr(), SocketBuffer: 4 << 20})
			return err
		})
		return l
	}}
	// udpVerifyBackend reads IPv4 through a raw socket and verifies the
	// ICRC (udp.Config.VerifyIPv4).
	udpVerifyBackend = backend{"udp-verify", func(t testing.TB, e *netnstest.End) nic.Link {
		var l *udp.Link
		e.NS.Run(t, func() (err error) {
			l, err = udp.Open(udp.Config{Addr: e.Addr(), VerifyIPv4: true})
			return err
		})
		return l
	}}
	afxdpBackend = backend{"afxdp", func(t testing.TB, e *netnstest.End) nic.Link {
		var l *afxdp.Link
		e.NS.Run(t, func() (err error) {
			l, err = afxdp.Open(afxdp.Config{Interface: e.Name})
			return err
		})
		return l
	}}
)

// endpoint is one softroce device with a PD, a CQ, an RC QP and a
// registered 1 MiB buffer.
type endpoint struct {
	dev *verbs.Device
	pd  *verbs.PD
	cq  *verbs.CQ
	qp  *verbs.QP
	mr  *verbs.MR
	buf []byte
}

func newEndpoint(t *testing.T, l nic.Link) *endpoint {
	t.Helper()
	dev, err := verbs.Open(l, nil)
	if err != nil {
		l.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	ep := &endpoint{dev: dev, buf: make([]byte, bufSize)}
	if ep.pd, err = dev.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if ep.mr, err = ep.pd.RegMR(ep.buf, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead|verbs.AccessRemoteAtomic); err != nil {
		t.Fatal(err)
	}
	if ep.cq, err = dev.CreateCQ(256); err != nil {
		t.Fatal(err)
	}
	if ep.qp, err = ep.pd.CreateQP(verbs.QPInitAttr{SendCQ: ep.cq, RecvCQ: ep.cq, Cap: verbs.QPCap{MaxSendWR: 64, MaxRecvWR: 64}}); err != nil {
		t.Fatal(err)
	}
	return ep
}

func (ep *endpoint) info(psn uint32) verbs.RemoteInfo {
	gid, _ := ep.dev.QueryGID(0)
	return verbs.RemoteInfo{QPN: ep.qp.Num(), PSN: psn, GID: gid}
}

// connect joins a and b with the short local ACK timeout (2^12 * 4.096us,
// about 17 ms) that keeps recovery from lost tail packets quick under
// impairment.
func connect(t *testing.T, a, b *endpoint, mtu int) { connectTimeout(t, a, b, mtu, 12) }

// connectDirect is connect for paths that lose nothing: a longer timeout
// (2^16 * 4.096us, about 268 ms, 2.1 s over the 7 retries) rides out a
// first packet held back by neighbour discovery, or a stall of a loaded
// machine, instead of ending in RETRY_EXC_ERR.
func connectDirect(t *testing.T, a, b *endpoint, mtu int) { connectTimeout(t, a, b, mtu, 16) }

func connectTimeout(t *testing.T, a, b *endpoint, mtu int, timeout uint8) {
	t.Helper()
	oa := &verbs.ConnectOptions{PathMTU: mtu, SQPSN: 0x100, Timeout: timeout}
	ob := &verbs.ConnectOptions{PathMTU: mtu, SQPSN: 0x200, Timeout: timeout}
	if err := a.qp.Connect(b.info(0x200), oa); err != nil {
		t.Fatal(err)
	}
	if err := b.qp.Connect(a.info(0x100), ob); err != nil {
		t.Fatal(err)
	}
}

func (ep *endpoint) wait(t *testing.T, d time.Duration) verbs.WC {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	wc := make([]verbs.WC, 1)
	if _, err := ep.cq.Wait(ctx, wc); err != nil {
		t.Fatalf("no completion within %v: %v (link %+v)", d, err, ep.dev.Link().Stats())
	}
	return wc[0]
}

// remote runs f on ep's memory as the peer's NIC would see it: under the
// device's engine lock, which its responder holds while it touches
// registered memory. The packets in between cross the kernel, which the
// race detector cannot see through; the lock gives it the ordering.
func (ep *endpoint) remote(f func()) {
	devsync.Run(ep.dev, f)
}

func (ep *endpoint) sge(off, n int) []verbs.SGE {
	return []verbs.SGE{{Addr: ep.mr.Addr() + uint64(off), Length: uint32(n), LKey: ep.mr.LKey()}}
}

func expectOK(t *testing.T, wc verbs.WC, what string, eps ...*endpoint) {
	t.Helper()
	if wc.Status.String() != "success" {
		for i, ep := range eps {
			t.Logf("endpoint %d: link %+v, engine %+v", i, ep.dev.Link().Stats(), ep.dev.Stats())
		}
		t.Fatalf("%s completed with %v", what, wc.Status)
	}
}

// exercise runs WRITE, READ, SEND and both atomics from a to b and
// checks every byte.
func exercise(t *testing.T, a, b *endpoint, size int, wait time.Duration) {
	rng := rand.New(rand.NewPCG(1, 2))
	fillRandom := func(p []byte) {
		for i := range p {
			p[i] = byte(rng.Uint32())
		}
	}

	// RDMA WRITE: a's [0,size) to b's [0,size).
	fillRandom(a.buf[:size])
	if err := a.qp.PostSend(&verbs.SendWR{ID: 1, Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled,
		SGL: a.sge(0, size), RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()}); err != nil {
		t.Fatal(err)
	}
	expectOK(t, a.wait(t, wait), "WRITE", a, b)
	b.remote(func() {
		if !bytes.Equal(a.buf[:size], b.buf[:size]) {
			t.Error("WRITE: bytes differ")
		}
	})

	// RDMA READ: b's [size,2size) into a's [size,2size).
	b.remote(func() { fillRandom(b.buf[size : 2*size]) })
	if err := a.qp.PostSend(&verbs.SendWR{ID: 2, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
		SGL: a.sge(size, size), RemoteAddr: b.mr.Addr() + uint64(size), RKey: b.mr.RKey()}); err != nil {
		t.Fatal(err)
	}
	wc := a.wait(t, wait)
	expectOK(t, wc, "READ", a, b)
	b.remote(func() {
		if !bytes.Equal(a.buf[size:2*size], b.buf[size:2*size]) || int(wc.ByteLen) != size {
			t.Errorf("READ: bytes differ (byte_len %d)", wc.ByteLen)
		}
	})

	// SEND into a posted receive.
	msg := min(size, 64<<10)
	if err := b.qp.PostRecv(&verbs.RecvWR{ID: 3, SGL: b.sge(2*size, msg)}); err != nil {
		t.Fatal(err)
	}
	fillRandom(a.buf[2*size : 2*size+msg])
	if err := a.qp.PostSend(&verbs.SendWR{ID: 4, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SGL: a.sge(2*size, msg)}); err != nil {
		t.Fatal(err)
	}
	expectOK(t, a.wait(t, wait), "SEND")
	rwc := b.wait(t, wait)
	expectOK(t, rwc, "RECV")
	if int(rwc.ByteLen) != msg || !bytes.Equal(a.buf[2*size:2*size+msg], b.buf[2*size:2*size+msg]) {
		t.Errorf("SEND: %d bytes received, or bytes differ", rwc.ByteLen)
	}

	// Atomics on b's 8-byte word at 3*size, results into a.
	word := 3 * size
	b.remote(func() { binary.NativeEndian.PutUint64(b.buf[word:], 40) })
	if err := a.qp.PostSend(&verbs.SendWR{ID: 5, Opcode: verbs.WRAtomicFetchAndAdd, Flags: verbs.SendSignaled,
		SGL: a.sge(word, 8), RemoteAddr: b.mr.Addr() + uint64(word), RKey: b.mr.RKey(), CompareAdd: 2}); err != nil {
		t.Fatal(err)
	}
	expectOK(t, a.wait(t, wait), "FETCH_AND_ADD")
	b.remote(func() {
		if old, now := binary.NativeEndian.Uint64(a.buf[word:]), binary.NativeEndian.Uint64(b.buf[word:]); old != 40 || now != 42 {
			t.Errorf("FETCH_AND_ADD: returned %d, word now %d; want 40 and 42", old, now)
		}
	})
	if err := a.qp.PostSend(&verbs.SendWR{ID: 6, Opcode: verbs.WRAtomicCmpAndSwp, Flags: verbs.SendSignaled,
		SGL: a.sge(word+8, 8), RemoteAddr: b.mr.Addr() + uint64(word), RKey: b.mr.RKey(), CompareAdd: 42, Swap: 7}); err != nil {
		t.Fatal(err)
	}
	expectOK(t, a.wait(t, wait), "CMP_AND_SWP")
	b.remote(func() {
		if old, now := binary.NativeEndian.Uint64(a.buf[word+8:]), binary.NativeEndian.Uint64(b.buf[word:]); old != 42 || now != 7 {
			t.Errorf("CMP_AND_SWP: returned %d, word now %d; want 42 and 7", old, now)
		}
	})
}

var pairs = [][2]backend{
	{udpBackend, udpBackend},
	{afxdpBackend, afxdpBackend},
	{udpBackend, afxdpBackend},
	{afxdpBackend, udpBackend},
}

// TestDirect: two endpoints on one veth pair at MTU 9000, 4096-byte RoCE
// MTU, over each backend pairing.
func TestDirect(t *testing.T) {
	netnstest.Require(t)
	for _, p := range pairs {
		t.Run(fmt.Sprintf("%s-%s", p[0].name, p[1].name), func(t *testing.T) {
			v := netnstest.Pair(t, netnstest.VethConfig{MTU: 9000})
			a, b := newEndpoint(t, p[0].open(t, v.A)), newEndpoint(t, p[1].open(t, v.B))
			connectDirect(t, a, b, 4096)
			exercise(t, a, b, 256<<10, 10*time.Second)
			exercise(t, b, a, 64<<10, 10*time.Second)
		})
	}
}

// TestImpaired: the same through a relay in a middle namespace that
// drops, duplicates, reorders, delays and corrupts RoCE frames: RC must
// still deliver every byte exactly.
func TestImpaired(t *testing.T) {
	netnstest.Require(t)
	cfg := netnstest.RelayConfig{Impair: impair.Config{Loss: 0.03, Dup: 0.02, Reorder: 0.05, Corrupt: 0.01,
		Delay: 100 * time.Microsecond, Jitter: 100 * time.Microsecond, Seed: 11}}
	for _, p := range append(pairs, [2]backend{udpVerifyBackend, udpVerifyBackend}, [2]backend{udpVerifyBackend, afxdpBackend}) {
		t.Run(fmt.Sprintf("%s-%s", p[0].name, p[1].name), func(t *testing.T) {
			ea, eb, relay := netnstest.Line(t, 9000, cfg)
			a, b := newEndpoint(t, p[0].open(t, ea)), newEndpoint(t, p[1].open(t, eb))
			connect(t, a, b, 4096)
			exercise(t, a, b, 128<<10, 30*time.Second)
			exercise(t, b, a, 32<<10, 30*time.Second)
			ab, ba := relay.Counters()
			t.Logf("relay a->b %+v", ab)
			t.Logf("relay b->a %+v", ba)
			// Corrupted frames die at the receiver: the ICRC check of
			// nic/afxdp (and IPv6 nic/udp), or the kernel's UDP checksum
			// in front of nic/udp over IPv4.
			t.Logf("link a %+v", a.dev.Link().Stats())
			t.Logf("link b %+v", b.dev.Link().Stats())
			if st := b.dev.Link().Stats(); st.RxICRCUnverified == 0 && ab.Corrupted > ab.Impair.Dropped && st.RxICRCBad == 0 {
				t.Error("frames were corrupted towards a verifying receiver, but none failed its ICRC check")
			}
			if ab.Impair.Dropped+ba.Impair.Dropped == 0 {
				t.Error("the relay dropped nothing: the test proved little")
			}
		})
	}
}

// TestDirectIPv6: the same over IPv6, where nic/udp verifies the ICRC too
// and nic/afxdp resolves neighbours through NDP.
func TestDirectIPv6(t *testing.T) {
	netnstest.Require(t)
	for _, p := range pairs {
		t.Run(fmt.Sprintf("%s-%s", p[0].name, p[1].name), func(t *testing.T) {
			v := netnstest.Pair(t, netnstest.VethConfig{MTU: 9000,
				AddrA: netip.MustParsePrefix("fd77::1/64"), AddrB: netip.MustParsePrefix("fd77::2/64")})
			a, b := newEndpoint(t, p[0].open(t, v.A)), newEndpoint(t, p[1].open(t, v.B))
			// A 1 s ACK timeout (7 retries): nic/afxdp drops the first
			// packets while NDP resolves the peer, and on a fresh veth
			// under load that has taken longer than the 2 s that a 268 ms
			// timeout's retries last. RC's retransmission recovers them.
			connectTimeout(t, a, b, 4096, 18)
			exercise(t, a, b, 128<<10, 30*time.Second)
			if st := b.dev.Link().Stats(); st.RxICRCUnverified != 0 || st.RxPackets == 0 {
				t.Errorf("receiver over IPv6: %+v", st)
			}
		})
	}
}
