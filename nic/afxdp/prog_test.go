package afxdp

import (
	"encoding/binary"
	"os"
	"testing"
)

// frame builds an Ethernet frame for the program test.
func frame(ethertype uint16, l3 []byte) []byte {
	b := make([]byte, 14, 14+len(l3))
	binary.BigEndian.PutUint16(b[12:], ethertype)
	return append(b, l3...)
}

func ipv4UDP(ihl int, flags uint16, proto byte, dport uint16) []byte {
	ip := make([]byte, ihl*4+8+32)
	ip[0] = 0x40 | byte(ihl)
	binary.BigEndian.PutUint16(ip[2:], uint16(len(ip)))
	binary.BigEndian.PutUint16(ip[6:], flags)
	ip[8], ip[9] = 64, proto
	u := ip[ihl*4:]
	binary.BigEndian.PutUint16(u[0:], 50000)
	binary.BigEndian.PutUint16(u[2:], dport)
	binary.BigEndian.PutUint16(u[4:], 8+32)
	return ip
}

func ipv6UDP(next byte, dport uint16) []byte {
	ip := make([]byte, 40+8+32)
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:], 8+32)
	ip[6], ip[7] = next, 64
	binary.BigEndian.PutUint16(ip[40+2:], dport)
	return ip
}

// TestProgramVerdicts runs the XDP program on crafted frames
// (BPF_PROG_TEST_RUN). With an empty XSKMAP and XDP_DROP as the fallback,
// "redirected" shows up as XDP_DROP and "passed to the kernel" as XDP_PASS.
func TestProgramVerdicts(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to load BPF programs")
	}
	raiseMemlock()
	prog, xsks, frags, err := loadProgram(4791, 4, xdpDrop, true)
	if err != nil {
		t.Fatal(err)
	}
	defer prog.Close()
	defer xsks.Close()
	if !frags {
		t.Log("kernel without BPF_F_XDP_HAS_FRAGS: loaded a single-buffer program")
	}
	arp := frame(0x0806, make([]byte, 28))
	for _, c := range []struct {
		name string
		in   []byte
		want uint32
	}{
		{"IPv4 UDP 4791", frame(0x0800, ipv4UDP(5, 0x4000, 17, 4791)), xdpDrop},
		{"IPv4 UDP 4791 without DF", frame(0x0800, ipv4UDP(5, 0, 17, 4791)), xdpDrop},
		{"IPv4 UDP 4791 with options", frame(0x0800, ipv4UDP(7, 0x4000, 17, 4791)), xdpDrop},
		{"IPv6 UDP 4791", frame(0x86dd, ipv6UDP(17, 4791)), xdpDrop},
		{"ARP", arp, xdpPass},
		{"IPv4 TCP", frame(0x0800, ipv4UDP(5, 0x4000, 6, 4791)), xdpPass},
		{"IPv4 UDP 4792", frame(0x0800, ipv4UDP(5, 0x4000, 17, 4792)), xdpPass},
		{"IPv4 UDP port 4791 byte-swapped", frame(0x0800, ipv4UDP(5, 0x4000, 17, 0xb712)), xdpPass},
		{"IPv4 first fragment", frame(0x0800, ipv4UDP(5, 0x2000, 17, 4791)), xdpPass},
		{"IPv4 later fragment", frame(0x0800, ipv4UDP(5, 0x0010, 17, 4791)), xdpPass},
		{"IPv4 bad IHL", frame(0x0800, ipv4UDP(4, 0x4000, 17, 4791)), xdpPass},
		{"IPv4 truncated", frame(0x0800, ipv4UDP(5, 0x4000, 17, 4791)[:24]), xdpPass},
		{"IPv4 options past the end", frame(0x0800, ipv4UDP(15, 0x4000, 17, 4791)[:60]), xdpPass},
		{"IPv6 extension header", frame(0x86dd, ipv6UDP(0, 4791)), xdpPass},
		{"IPv6 UDP 53", frame(0x86dd, ipv6UDP(17, 53)), xdpPass},
		{"IPv6 truncated", frame(0x86dd, ipv6UDP(17, 4791)[:44]), xdpPass},
		{"VLAN-tagged", frame(0x8100, make([]byte, 60)), xdpPass},
		{"Ethernet only", frame(0x0800, nil), xdpPass},
	} {
		in := c.in
		if len(in) < 60 {
			in = append(in, make([]byte, 60-len(in))...) // Ethernet minimum
			if c.name == "Ethernet only" || c.name == "IPv4 truncated" || c.name == "IPv6 truncated" {
				in = c.in
			}
		}
		got, _, err := prog.Test(in)
		if err != nil {
			t.Fatalf("%s: test run: %v", c.name, err)
		}
		if got != c.want {
			t.Errorf("%s: verdict %d, want %d", c.name, got, c.want)
		}
	}
}
