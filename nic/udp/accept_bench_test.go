package udp

import (
	"encoding/binary"
	"net/netip"
	"strconv"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/nic"
)

// BenchmarkAccept is the user-space cost per received IPv4 packet of each
// check, on a message laid out as recvmmsg leaves it (the system call
// itself not included): control messages parsed, ICRC checked.
func BenchmarkAccept(b *testing.B) {
	lo := netip.MustParseAddr("127.0.0.1")
	src := netip.MustParseAddrPort("127.0.0.1:49153")
	for _, n := range []int{20, 1024, 4128} {
		for _, check := range []IPv4Check{IPv4CheckNone, IPv4CheckSolve, IPv4CheckRaw} {
			b.Run(strconv.Itoa(n)+"/"+check.String(), func(b *testing.B) {
				l := &Link{local: netip.AddrPortFrom(lo, 4791), check: check}
				hdr := 0
				if check == IPv4CheckRaw {
					hdr = rawHdrLen
					l.rawScratch = make([]byte, 60+8+9000)
				}
				l.rx = newReceiver(nil, 1, hdr)
				h := &hdrincl{src: src}
				d := h.datagram(l.local, 0x1234, 0x40, nil, make([]byte, n))
				p := nic.Packet{Buf: make([]byte, n)}
				// What recvmmsg leaves: length, source, IP_PKTINFO.
				sa := (*unix.RawSockaddrInet4)(unsafe.Pointer(&l.rx.names[0]))
				sa.Family = unix.AF_INET
				sa.Addr = src.Addr().As4()
				binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:], src.Port())
				l.rx.hdrs[0].Hdr.Namelen = unix.SizeofSockaddrInet4
				oob := l.rx.oob[:32]
				binary.NativeEndian.PutUint64(oob[0:], 16+12)
				binary.NativeEndian.PutUint32(oob[8:], unix.IPPROTO_IP)
				binary.NativeEndian.PutUint32(oob[12:], unix.IP_PKTINFO)
				copy(oob[16+8:], []byte{127, 0, 0, 1})
				l.rx.hdrs[0].Hdr.SetControllen(32)
				l.rx.hdrs[0].Len = uint32(n + hdr)
				b.SetBytes(int64(n))
				b.ReportAllocs()
				for b.Loop() {
					var ok bool
					if check == IPv4CheckRaw {
						copy(l.rx.header(0), d[:rawHdrLen])
						copy(p.Buf, d[rawHdrLen:])
						m, fl, _, _ := l.rx.message(0)
						ok = l.acceptRaw(m, fl, l.rx.header(0), &p)
					} else {
						copy(p.Buf, d[28:])
						m, fl, src, oob := l.rx.message(0)
						ok = l.accept(m, fl, src, oob, &p)
					}
					if !ok {
						b.Fatalf("rejected: %+v", l.Stats())
					}
				}
			})
		}
	}
}
