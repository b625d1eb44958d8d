package udp

import (
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/icrc"
	"github.com/softroce/softroce/internal/netnstest"
	"github.com/softroce/softroce/nic"
)

// gsoBatch is a Send batch that makes GSO runs: 20 full packets and a
// short one to b (runs of 15 by the 64 KiB limit, then 5 and the short
// one), a packet to another peer, and 3 more to b.
func gsoBatch(b, other netip.AddrPort) []nic.Packet {
	out := packets(25, 4200)
	for i := range out {
		out[i].N = 4128
		if i == 20 {
			out[i].N = 1000
		}
		out[i].Remote = b
		if i == 21 {
			out[i].Remote = other
		}
		fill(out[i].Buf, out[i].N, uint32(i))
	}
	return out
}

// gsoRecv is a packet of gsoBatch sent to b (index i) and what b got.
type gsoRecv struct {
	i         int
	sent, got *nic.Packet
}

// sendGSOBatch sends gsoBatch from a to b (other: the odd peer), receives
// b's 24 packets and returns them beside the ones sent to b.
func sendGSOBatch(t *testing.T, a, b *Link, other netip.AddrPort) []gsoRecv {
	t.Helper()
	out := gsoBatch(b.LocalAddrPort(), other)
	if n, err := a.Send(out); n != len(out) || err != nil {
		t.Fatalf("Send = %d, %v", n, err)
	}
	in := recvN(t, b, packets(24, 4200), 24)
	r := make([]gsoRecv, 0, len(in))
	for i := range out {
		if i != 21 {
			r = append(r, gsoRecv{i, &out[i], &in[len(r)]})
		}
	}
	return r
}

// TestGSO sends runs as super-packets and receives them with each
// receive path: the UDP socket with GRO on and off (IPv4 solved, IPv6
// verified) and the raw IPv4 socket, which sees super-packets whole and
// splits them. Every packet arrives in order, intact, with the ICRC of
// the ID its segment carried.
func TestGSO(t *testing.T) {
	type rcase struct {
		name  string
		addr  string
		check IPv4Check
		gro   Offload
		want  nic.ICRCStatus
	}
	cases := []rcase{
		{"v4-solve-gro", "127.0.0.1", IPv4CheckSolve, OffloadAuto, nic.ICRCPartial},
		{"v4-solve-nogro", "127.0.0.1", IPv4CheckSolve, OffloadOff, nic.ICRCPartial},
		{"v6-gro", "::1", 0, OffloadAuto, nic.ICRCVerified},
		{"v6-nogro", "::1", 0, OffloadOff, nic.ICRCVerified},
	}
	if os.Geteuid() == 0 {
		cases = append(cases, rcase{"v4-raw", "127.0.0.1", IPv4CheckRaw, OffloadAuto, nic.ICRCVerified})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ad := netip.MustParseAddr(c.addr)
			a, err := Open(Config{Addr: ad, Port: freePort(t, ad), MTU: 9000, GSO: OffloadOn, IPv4Check: IPv4CheckSolve})
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			b, err := Open(Config{Addr: ad, Port: freePort(t, ad), MTU: 9000, GRO: c.gro, IPv4Check: c.check})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			o := open(t, c.addr, 9000)
			if !a.GSO() || b.GRO() != (c.gro != OffloadOff) {
				t.Fatalf("GSO %v GRO %v", a.GSO(), b.GRO())
			}
			// Segment ids within each run: 0..14, 0..5, (other), 0..2.
			var ids [25]uint16
			for i := range ids {
				switch {
				case i < 15:
					ids[i] = uint16(i)
				case i < 21:
					ids[i] = uint16(i - 15)
				case i > 21:
					ids[i] = uint16(i - 22)
				}
			}
			for _, r := range sendGSOBatch(t, a, b, o.LocalAddrPort()) {
				i, sent, p := r.i, r.sent, r.got
				if string(p.Bytes()) != string(sent.Bytes()) || p.ICRC != c.want || p.Remote != a.LocalAddrPort() {
					t.Fatalf("packet %d: %d bytes %v from %v", i, p.N, p.ICRC, p.Remote)
				}
				// IPv4: the ID the segment carried, read off the
				// split header (raw) or solved from the ICRC.
				if c.addr == "127.0.0.1" && (!p.IPKnown || p.IPID != ids[i]) {
					t.Errorf("packet %d: IP ID known %v, %d, want %d", i, p.IPKnown, p.IPID, ids[i])
				}
				want, _ := synthID(a.LocalAddrPort(), b.LocalAddrPort(), ids[i], sent.Bytes())
				if icrc.Wire(p.Bytes()) != want {
					t.Errorf("packet %d: ICRC %08x, want the one for ID %d %08x", i, icrc.Wire(p.Bytes()), ids[i], want)
				}
			}
			recvN(t, o, packets(1, 4200), 1)
			st, ost := b.Stats(), b.OffloadStats()
			if st.RxPackets != 24 || st.RxICRCBad != 0 || st.RxTruncated != 0 || st.RxMalformed != 0 {
				t.Errorf("receiver stats %+v", st)
			}
			// Three super-packets to b; the raw socket and a GRO socket
			// split them, a socket without GRO gets them segmented.
			if wantSplit := uint64(3); b.GRO() && ost.RxSplit != wantSplit || !b.GRO() && ost.RxSplit != 0 {
				t.Errorf("split %d datagrams", ost.RxSplit)
			}
			// Runs of 15, 6 and 3; the packet to o alone.
			if ost := a.OffloadStats(); ost.GSOSends != 3 || ost.GSOSegments != 24 {
				t.Errorf("sender offload stats %+v", ost)
			}
			if st := a.Stats(); st.TxPackets != 25 || st.TxBytes != 24*4128+1000 {
				t.Errorf("sender stats %+v", st)
			}
		})
	}
}

// TestGSOOff: with GSO off every packet is its own datagram (nothing to
// split at a raw or GRO receiver), and its ICRC is the one for ID 0.
func TestGSOOff(t *testing.T) {
	ad := netip.MustParseAddr("127.0.0.1")
	a, err := Open(Config{Addr: ad, Port: freePort(t, ad), MTU: 9000, GSO: OffloadOff, IPv4Check: IPv4CheckSolve})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b := open(t, "127.0.0.1", 9000)
	o := open(t, "127.0.0.1", 9000)
	if a.GSO() {
		t.Fatal("GSO on")
	}
	for _, r := range sendGSOBatch(t, a, b, o.LocalAddrPort()) {
		i, sent, p := r.i, r.sent, r.got
		want, _ := synth(a.LocalAddrPort(), b.LocalAddrPort(), sent.Bytes())
		if icrc.Wire(p.Bytes()) != want {
			t.Errorf("packet %d: not the ICRC for ID 0", i)
		}
	}
	if b.OffloadStats().RxSplit != 0 {
		t.Errorf("split %d datagrams", b.OffloadStats().RxSplit)
	}
}

// TestGSOFallback: a socket that refuses GSO (here: UDP checksums off,
// which segmentation needs) makes Send fall back to single packets for
// good, and nothing is lost.
func TestGSOFallback(t *testing.T) {
	ad := netip.MustParseAddr("127.0.0.1")
	a, err := Open(Config{Addr: ad, Port: freePort(t, ad), MTU: 9000, GSO: OffloadOn, IPv4Check: IPv4CheckSolve})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	rc := a.sock
	var serr error
	rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_NO_CHECK, 1) })
	if serr != nil {
		t.Skipf("SO_NO_CHECK: %v", serr)
	}
	b := open(t, "127.0.0.1", 9000)
	o := open(t, "127.0.0.1", 9000)
	for _, r := range sendGSOBatch(t, a, b, o.LocalAddrPort()) {
		i, sent, p := r.i, r.sent, r.got
		if string(p.Bytes()) != string(sent.Bytes()) || p.ICRC != nic.ICRCPartial {
			t.Fatalf("packet %d differs or fails its ICRC", i)
		}
	}
	if a.GSO() || a.OffloadStats().GSOFallbacks != 1 || a.Stats().TxPackets != 25 || a.Stats().TxErrors != 0 {
		t.Errorf("GSO %v, %+v, %+v", a.GSO(), a.OffloadStats(), a.Stats())
	}
}

// TestGSOSegmentIDsOnTheWire: a veth that cannot segment UDP makes the
// sending kernel split each super-packet itself, so the receiver's raw
// socket sees every segment with the IPv4 ID Linux gave it: the full
// ICRC of each must be right (segments numbered upward from ID 0).
func TestGSOSegmentIDsOnTheWire(t *testing.T) {
	netnstest.Require(t)
	v := netnstest.Pair(t, netnstest.VethConfig{MTU: 9000})
	v.A.NS.Run(t, func() error {
		out, err := exec.Command("ethtool", "-K", v.A.Name, "tx-udp-segmentation", "off").CombinedOutput()
		if err != nil {
			t.Skipf("ethtool: %v %s", err, out)
		}
		return nil
	})
	var a, b *Link
	v.A.NS.Run(t, func() (err error) {
		a, err = Open(Config{Addr: v.A.Addr(), GSO: OffloadOn})
		return err
	})
	defer a.Close()
	v.B.NS.Run(t, func() (err error) {
		b, err = Open(Config{Addr: v.B.Addr(), IPv4Check: IPv4CheckRaw})
		return err
	})
	defer b.Close()
	for _, r := range sendGSOBatch(t, a, b, netip.AddrPortFrom(b.LocalAddrPort().Addr(), 9)) {
		i, sent, p := r.i, r.sent, r.got
		if string(p.Bytes()) != string(sent.Bytes()) || p.ICRC != nic.ICRCVerified {
			t.Fatalf("packet %d: %v", i, p.ICRC)
		}
	}
	if st, ost := b.Stats(), b.OffloadStats(); st.RxICRCVerified != 24 || st.RxICRCBad != 0 || ost.RxSplit != 0 {
		t.Errorf("receiver %+v %+v (want 24 verified segments, none split here)", st, ost)
	}
}

// TestTryRecv: TryRecv returns nothing without waiting when nothing is
// queued, and the packets (checked as Recv checks them) when some are,
// on every receive path.
func TestTryRecv(t *testing.T) {
	checks := []IPv4Check{IPv4CheckSolve}
	if os.Geteuid() == 0 {
		checks = append(checks, IPv4CheckRaw)
	}
	for _, check := range checks {
		for _, gro := range []Offload{OffloadAuto, OffloadOff} {
			if check == IPv4CheckRaw && gro == OffloadOff {
				continue // drops super-packets as truncated: TestRawWithoutSplit
			}
			ad := netip.MustParseAddr("127.0.0.1")
			b, err := Open(Config{Addr: ad, Port: freePort(t, ad), MTU: 9000, GRO: gro, IPv4Check: check})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			a := open(t, "127.0.0.1", 9000)
			in := packets(32, 4200)
			if n, err := b.TryRecv(in); n != 0 || err != nil {
				t.Fatalf("%v gro %v: TryRecv on an empty socket = %d, %v", check, gro, n, err)
			}
			out := gsoBatch(b.LocalAddrPort(), a.LocalAddrPort())
			if _, err := a.Send(out); err != nil {
				t.Fatal(err)
			}
			got := 0
			for tries := 0; got < 24 && tries < 1e6; tries++ {
				n, err := b.TryRecv(in)
				if err != nil {
					t.Fatal(err)
				}
				for _, p := range in[:n] {
					if p.ICRC == nic.ICRCUnverified || p.N != 4128 && p.N != 1000 {
						t.Fatalf("packet %+v", p)
					}
				}
				got += n
			}
			if got != 24 || b.Polled() != 24 || b.Stats().RxICRCBad != 0 {
				t.Errorf("%v gro %v: polled %d (%d), stats %+v", check, gro, got, b.Polled(), b.Stats())
			}
			// Empty polls leave the GRO headers set up (a busy poll does
			// not redo the batch's set-up each time), and a batch that
			// arrives after them is still received whole.
			for i := 0; i < 3; i++ {
				if n, err := b.TryRecv(in); n != 0 || err != nil {
					t.Fatalf("%v gro %v: TryRecv on a drained socket = %d, %v", check, gro, n, err)
				}
			}
			if b.gro && !b.rx.bigSet {
				t.Errorf("%v gro %v: an empty poll left the headers to be set up again", check, gro)
			}
			if _, err := a.Send(gsoBatch(b.LocalAddrPort(), a.LocalAddrPort())); err != nil {
				t.Fatal(err)
			}
			got = 0
			for tries := 0; got < 24 && tries < 1e6; tries++ {
				n, err := b.TryRecv(in)
				if err != nil {
					t.Fatal(err)
				}
				for _, p := range in[:n] {
					if p.ICRC == nic.ICRCUnverified || p.N != 4128 && p.N != 1000 {
						t.Fatalf("second batch: packet %+v", p)
					}
				}
				got += n
			}
			if got != 24 || b.Polled() != 48 {
				t.Errorf("%v gro %v: second batch: polled %d (%d in all)", check, gro, got, b.Polled())
			}
		}
	}
}

// TestRawWithoutSplit: a raw-socket receiver with GRO off does not split
// super-packets; they are counted as truncated, never delivered damaged.
func TestRawWithoutSplit(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs a raw socket (root)")
	}
	ad := netip.MustParseAddr("127.0.0.1")
	b, err := Open(Config{Addr: ad, Port: freePort(t, ad), MTU: 9000, GRO: OffloadOff, IPv4Check: IPv4CheckRaw})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	a := open(t, "127.0.0.1", 9000)
	out := gsoBatch(b.LocalAddrPort(), netip.AddrPortFrom(ad, 9))
	out[0].N = 200 // one single packet first, to know when all arrived
	if _, err := a.Send(out); err != nil {
		t.Fatal(err)
	}
	in := recvN(t, b, packets(32, 4200), 1)
	if in[0].N != 200 || in[0].ICRC != nic.ICRCVerified {
		t.Fatalf("packet %+v", in[0])
	}
	for b.Stats().RxTruncated < 2 {
		if n, err := b.TryRecv(packets(32, 4200)); n != 0 || err != nil {
			t.Fatalf("TryRecv = %d, %v", n, err)
		}
	}
	if st := b.Stats(); st.RxPackets != 1 || st.RxICRCBad != 0 {
		t.Errorf("stats %+v", st)
	}
}

// TestRawReassembledNotSplit: a datagram longer than a packet that the
// kernel reassembled from fragments (DF clear) is not taken for a
// super-packet: it is dropped whole, without a search for segments.
func TestRawReassembledNotSplit(t *testing.T) {
	h := newHdrincl(t)
	ad := netip.MustParseAddr("127.0.0.1")
	b, err := Open(Config{Addr: ad, Port: freePort(t, ad), MTU: 9000, IPv4Check: IPv4CheckRaw})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	r := rand.New(rand.NewPCG(1, 2))
	// Two 6000-byte RoCE packets end to end, each with the ICRC of its
	// segment (IDs 7 and 8, DF clear), sent as two fragments.
	roce := append(roceBytes(r, 6000, 1), roceBytes(r, 6000, 2)...)
	for j := 0; j < 2; j++ {
		seg := roce[j*6000 : (j+1)*6000]
		crc, _ := synthV4(h.src, b.LocalAddrPort(), uint16(7+j), false, seg)
		icrc.Put(seg, crc)
	}
	d := h.datagram(b.LocalAddrPort(), 7, 0, nil, roce)
	copy(d[28:], roce) // keep both segments' ICRCs (datagram rewrote the last)
	h.fragments(t, d)
	h.send(t, h.datagram(b.LocalAddrPort(), 9, 0x40, nil, roceBytes(r, 100, 3)))
	in := recvN(t, b, packets(4, 9000), 1)
	if in[0].N != 100 {
		t.Fatalf("got %d bytes", in[0].N)
	}
	if st, ost := b.Stats(), b.OffloadStats(); ost.RxSplit != 0 || st.RxPackets != 1 || st.RxTruncated+st.RxICRCBad+st.RxMalformed != 1 {
		t.Errorf("stats %+v %+v", st, ost)
	}
}
