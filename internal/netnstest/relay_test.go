package netnstest

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/nic/impair"
)

// TestRelay sends numbered UDP datagrams to port 4791 from a to b through
// an impairing relay: losses, duplicates, reordering and corruption show
// up at b as the relay's counters say, and ARP/ICMP pass untouched.
func TestRelay(t *testing.T) {
	cfg := RelayConfig{Impair: impair.Config{Loss: 0.1, Dup: 0.1, Reorder: 0.2, Corrupt: 0.1, Delay: time.Millisecond, Seed: 5}}
	a, b, r := Line(t, 9000, cfg)
	if err := Ping(a.NS, b.Addr(), 3*time.Second); err != nil {
		t.Fatal(err)
	}
	var rx *net.UDPConn
	b.NS.Run(t, func() (err error) {
		rx, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(b.Addr(), 4791)))
		return err
	})
	defer rx.Close()
	// Delayed frames come out in bursts: give the receiver room (as root,
	// past net.core.rmem_max) so that only the relay loses packets.
	if rc, err := rx.SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) { unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20) })
	}
	var tx *net.UDPConn
	a.NS.Run(t, func() (err error) {
		tx, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(a.Addr(), 4791)))
		return err
	})
	defer tx.Close()
	const total = 400
	got := map[uint32]int{}
	inversions, last := 0, -1
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 4000)
		for {
			rx.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
			n, err := rx.Read(buf)
			if err != nil {
				return
			}
			seq := binary.BigEndian.Uint32(buf)
			for j := 4; j < n; j++ {
				if buf[j] != byte(int(seq)+j) {
					t.Errorf("datagram %d arrived damaged: the UDP checksum should have caught it", seq)
					return
				}
			}
			got[seq]++
			if int(seq) < last {
				inversions++
			}
			last = int(seq)
		}
	}()
	dst := net.UDPAddrFromAddrPort(netip.AddrPortFrom(b.Addr(), 4791))
	msg := make([]byte, 2000)
	for i := 0; i < total; i++ {
		binary.BigEndian.PutUint32(msg, uint32(i))
		for j := 4; j < len(msg); j++ {
			msg[j] = byte(i + j)
		}
		if _, err := tx.WriteTo(msg, dst); err != nil {
			t.Fatal(err)
		}
		if i%20 == 0 {
			time.Sleep(time.Millisecond) // the relay reads one frame per system call
		}
	}
	<-done
	ab, _ := r.Counters()
	delivered := 0
	for _, c := range got {
		delivered += c
	}
	t.Logf("a->b: %+v; delivered %d (%d distinct), %d inversions", ab, delivered, len(got), inversions)
	want := int(ab.Impair.Packets - ab.Impair.Dropped - ab.Corrupted + ab.Impair.Duplicated)
	// Corruption and impairment are drawn independently, so a corrupted
	// frame may also be dropped or duplicated: allow that slack.
	if ab.Impair.Packets != total || ab.Impair.Dropped == 0 || ab.Impair.Duplicated == 0 || ab.Corrupted == 0 ||
		delivered < want-int(ab.Impair.Duplicated) || delivered > want+int(ab.Impair.Dropped) {
		t.Errorf("delivered %d, expected about %d from the counters", delivered, want)
	}
	if inversions == 0 {
		t.Error("no reordering seen")
	}
}

// TestSetFrameECN marks IPv4 and IPv6 frames CE: the ECN bits change,
// the DSCP does not, and the IPv4 header checksum stays right.
func TestSetFrameECN(t *testing.T) {
	f4 := make([]byte, 14+20)
	binary.BigEndian.PutUint16(f4[12:], unix.ETH_P_IP)
	copy(f4[14:], []byte{0x45, 0xa2, 0, 60, 0x12, 0x34, 0x40, 0, 64, 17, 0, 0, 10, 77, 1, 1, 10, 77, 1, 2})
	binary.BigEndian.PutUint16(f4[14+10:], ^ipSum(f4[14:]))
	setFrameECN(f4, 0xa2|0b11)
	if f4[15] != 0xa3 || frameTClass(f4) != 0xa3 {
		t.Errorf("IPv4 TOS %#x after marking, want 0xa3", f4[15])
	}
	if s := ipSum(f4[14:]); s != 0xffff {
		t.Errorf("IPv4 header checksum wrong after marking (sum %#x)", s)
	}
	f6 := make([]byte, 14+40)
	binary.BigEndian.PutUint16(f6[12:], unix.ETH_P_IPV6)
	f6[14], f6[15] = 0x6a, 0x2f // traffic class 0xa2, flow label 0xf....
	setFrameECN(f6, 0xa3)
	if f6[14] != 0x6a || f6[15] != 0x3f || frameTClass(f6) != 0xa3 {
		t.Errorf("IPv6 bytes %#x %#x after marking, want 0x6a 0x3f", f6[14], f6[15])
	}
}

// ipSum is the ones' complement sum of an IPv4 header.
func ipSum(h []byte) uint16 {
	var s uint32
	for i := 0; i < 20; i += 2 {
		s += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	return uint16(s)
}
