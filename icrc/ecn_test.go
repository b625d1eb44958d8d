package icrc_test

import (
	"encoding/binary"
	"testing"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/icrc"
)

// ipUDP returns an IPv4 or IPv6 header with traffic class tc, then a UDP
// header and roce, contiguous, as a link would send them.
func ipUDP(v6 bool, tc uint8, roce []byte) (ip, udp []byte) {
	ipLen := 20
	if v6 {
		ipLen = 40
	}
	b := make([]byte, ipLen+8+len(roce))
	ip, udp = b[:ipLen], b[ipLen:]
	if v6 {
		binary.BigEndian.PutUint32(ip[0:], 6<<28|uint32(tc)<<20|0x12345) // version, traffic class, flow label
		binary.BigEndian.PutUint16(ip[4:], uint16(8+len(roce)))
		ip[6], ip[7] = 17, 64
		ip[8], ip[23] = 0xfd, 1  // fd00::1
		ip[24], ip[39] = 0xfd, 2 // fd00::2
	} else {
		ip[0], ip[1] = 0x45, tc
		binary.BigEndian.PutUint16(ip[2:], uint16(ipLen+8+len(roce)))
		ip[6] = 0x40 // DF
		ip[8], ip[9] = 64, 17
		copy(ip[12:], []byte{10, 0, 0, 1, 10, 0, 0, 2})
		binary.BigEndian.PutUint16(ip[10:], 0xbeef) // masked anyway
	}
	binary.BigEndian.PutUint16(udp[0:], 49152)
	binary.BigEndian.PutUint16(udp[2:], icrc.UDPPort)
	binary.BigEndian.PutUint16(udp[4:], uint16(8+len(roce)))
	copy(udp[8:], roce)
	return ip, udp
}

func sum(t *testing.T, v6 bool, ip, udp []byte) uint32 {
	t.Helper()
	var crc uint32
	var err error
	if v6 {
		crc, err = icrc.IPv6(ip, udp)
	} else {
		crc, err = icrc.IPv4(ip, udp)
	}
	if err != nil {
		t.Fatal(err)
	}
	return crc
}

// TestECNMasked: a switch that marks a packet Congestion Experienced
// rewrites the IP header's ECN bits after the sender computed the ICRC;
// the ICRC masks the traffic class (annex A17.3.3), so the marked packet
// still verifies, and a receiver must accept it (then answer with a CNP).
// A CNP is itself a RoCEv2 packet and sent ECN-capable by some NICs.
func TestECNMasked(t *testing.T) {
	cnp := make([]byte, bth.CNPLen)
	if _, err := bth.BuildCNP(cnp, bth.CNPFields{DestQP: 0x118, PKey: 0xffff}); err != nil {
		t.Fatal(err)
	}
	send := make([]byte, bth.Len(bth.RCSendOnly, 100))
	if _, err := bth.Build(send, &bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCSendOnly, PKey: 0xffff, DestQP: 0x11, PSN: 5}}, make([]byte, 100)); err != nil {
		t.Fatal(err)
	}
	const (
		notECT = 0b00
		ect1   = 0b01
		ect0   = 0b10
		ce     = 0b11
	)
	tests := []struct {
		name     string
		v6       bool
		roce     []byte
		sent, at uint8 // traffic class when the ICRC was computed, and on arrival
	}{
		{"v4 cnp ECT(0) marked CE", false, cnp, ect0, ce},
		{"v4 cnp ECT(1) marked CE", false, cnp, ect1, ce},
		{"v4 send ECT(0) marked CE, DSCP 26", false, send, 26<<2 | ect0, 26<<2 | ce},
		{"v4 send not-ECT", false, send, notECT, notECT},
		{"v6 cnp ECT(0) marked CE", true, cnp, ect0, ce},
		{"v6 send ECT(1) marked CE, DSCP 46", true, send, 46<<2 | ect1, 46<<2 | ce},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ip, udp := ipUDP(tt.v6, tt.sent, tt.roce)
			icrc.Put(udp, sum(t, tt.v6, ip, udp))
			wire := icrc.Wire(udp)
			ip2, udp2 := ipUDP(tt.v6, tt.at, udp[8:])
			if got := sum(t, tt.v6, ip2, udp2); got != wire {
				t.Errorf("after marking: ICRC %08x, wire carries %08x", got, wire)
			}
			// The header a kernel socket hides gives the same ICRC: Synth
			// never sees the traffic class at all.
			h := icrc.Header{SrcPort: 49152, DstPort: icrc.UDPPort}
			if tt.v6 {
				h.Src, h.Dst = ip[8:24], ip[24:40]
			} else {
				h.Src, h.Dst, h.DF = ip[12:16], ip[16:20], true
			}
			if got, err := icrc.Synth(&h, udp2[8:]); err != nil || got != wire {
				t.Errorf("Synth: %08x, %v; wire %08x", got, err, wire)
			}
			// A bit the ICRC does cover still fails: the test can fail.
			udp2[8+bth.BTHLen] ^= 1
			if got := sum(t, tt.v6, ip2, udp2); got == wire {
				t.Errorf("payload bit flip not detected")
			}
		})
	}
}
