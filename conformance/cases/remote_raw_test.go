package cases

import (
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/nic/udp"
)

// TestRawPeerHeader: the raw peer's packets arrive with the IPv4 header
// the harness wrote (ID counting from 1, its TTL and DSCP/ECN) and an
// ICRC that verifies over that header, as a receiver that sees the IP
// header (IPv4CheckRaw) checks it. Loopback, as root.
func TestRawPeerHeader(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("raw sockets need root")
	}
	src, dst := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("127.0.0.2")
	rx, err := udp.Open(udp.Config{Addr: dst, Port: 14791, MTU: 1500, IPv4Check: udp.IPv4CheckRaw})
	if err != nil {
		t.Skipf("receiver: %v", err)
	}
	defer rx.Close()
	tx, err := openRawPeer(src)
	if err != nil {
		t.Skipf("raw peer: %v", err)
	}
	defer tx.Close()
	for i := 1; i <= 2; i++ {
		b := make([]byte, 64)
		n, err := bth.Build(b, &bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCSendOnly, DestQP: 0x11, PSN: uint32(i), PKey: 0xffff}}, make([]byte, 8))
		if err != nil {
			t.Fatal(err)
		}
		k := []nic.Packet{{Buf: b, N: n, Remote: netip.AddrPortFrom(dst, 14791)}}
		if err := tx.PutICRC(&k[0]); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.SendRaw(k); err != nil {
			t.Fatal(err)
		}
		got := make([]nic.Packet, 1)
		got[0].Buf = make([]byte, 2048)
		done := make(chan error, 1)
		go func() { _, err := rx.Recv(got); done <- err }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("nothing received")
		}
		p := &got[0]
		if !p.IPKnown || p.IPID != uint16(i) || p.HopLimit != rawPeerTTL || p.TClass != rawPeerTOS {
			t.Errorf("packet %d: IP known %v ID %d TTL %d TOS %#x, want ID %d TTL %d TOS %#x", i, p.IPKnown, p.IPID, p.HopLimit, p.TClass, i, rawPeerTTL, rawPeerTOS)
		}
		if p.ICRC != nic.ICRCVerified {
			t.Errorf("packet %d: ICRC %v, want verified", i, p.ICRC)
		}
		if p.Remote != netip.AddrPortFrom(src, nic.RoCEv2Port) {
			t.Errorf("packet %d from %v", i, p.Remote)
		}
	}
}
