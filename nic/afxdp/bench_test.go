package afxdp

import (
	"net/netip"
	"testing"

	"github.com/softroce/softroce/internal/netnstest"
	"github.com/softroce/softroce/nic"
	"github.com/softroce/softroce/nic/internal/linktest"
)

// RoCE packet of an RDMA WRITE carrying 4096 bytes: BTH + RETH + payload + ICRC.
const (
	payload4K = 4096
	size4K    = 12 + 16 + payload4K + 4
)

func benchPair(b *testing.B, txMode, rxMode Mode, udpTx bool) {
	netnstest.Require(b)
	v := netnstest.Pair(b, netnstest.VethConfig{MTU: 9000})
	var tx nic.Link
	if udpTx {
		tx = openUDPIn(b, v.A)
	} else {
		tx = openIn(b, v.A, Config{Mode: txMode})
	}
	rx := openIn(b, v.B, Config{Mode: rxMode})
	linktest.Stream(b, tx, rx, netip.AddrPortFrom(v.B.Addr(), nic.RoCEv2Port), size4K, payload4K, 32)
	if st := rx.Stats(); st.RxICRCBad != 0 || st.RxMalformed != 0 {
		b.Errorf("receiver stats %+v", st)
	}
}

// BenchmarkLink4KNative: nic/afxdp Send -> Recv between two AF_XDP links
// over a veth pair at MTU 9000 (native XDP, copy mode, multi-buffer),
// 4096-byte RDMA payloads, batches of 32.
func BenchmarkLink4KNative(b *testing.B) { benchPair(b, ModeNative, ModeNative, false) }

// BenchmarkLink4KGeneric: the same with generic XDP.
func BenchmarkLink4KGeneric(b *testing.B) { benchPair(b, ModeGeneric, ModeGeneric, false) }

// BenchmarkFromUDP4K: nic/udp sends, nic/afxdp (native) receives.
func BenchmarkFromUDP4K(b *testing.B) { benchPair(b, 0, ModeNative, true) }
