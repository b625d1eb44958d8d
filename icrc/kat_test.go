package icrc

import (
	"bytes"
	"encoding/binary"
	"io"
	"net/netip"
	"os"
	"testing"

	"github.com/gopacket/gopacket/pcapgo"

	"github.com/softroce/softroce/bth"
)

// The known-answer captures recorded from kernel rdma_rxe (see
// testdata/rxe/README.md and conformance/record). They are part of the
// repository: these tests never skip.
const katDir = "testdata/rxe"

// katFile is one recorded capture; guest is the rxe side's address.
var katFiles = []struct {
	name  string
	kind  Kind
	guest netip.Addr
}{
	{"rxe-ipv4.pcap", KindRoCEv2IPv4, netip.MustParseAddr("10.88.0.2")},
	{"rxe-ipv6.pcap", KindRoCEv2IPv6, netip.MustParseAddr("fd88::2")},
}

// katFrame is one recorded frame with the side that built it.
type katFrame struct {
	n     int // frame number, from 1
	data  []byte
	byRxe bool
}

func readKAT(t *testing.T, name string, guest netip.Addr) []katFrame {
	t.Helper()
	f, err := os.Open(katDir + "/" + name)
	if err != nil {
		t.Fatalf("known-answer capture missing from the repository: %v", err)
	}
	defer f.Close()
	r, err := pcapgo.NewReader(f)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	var out []katFrame
	for {
		data, _, err := r.ReadPacketData()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var src netip.Addr
		switch binary.BigEndian.Uint16(data[12:]) {
		case 0x0800:
			src = netip.AddrFrom4([4]byte(data[14+12 : 14+16]))
		case 0x86dd:
			src = netip.AddrFrom16([16]byte(data[14+8 : 14+24]))
		}
		out = append(out, katFrame{n: len(out) + 1, data: data, byRxe: src == guest})
	}
	if len(out) == 0 {
		t.Fatalf("%s: no frames", name)
	}
	return out
}

// verifyKAT checks one frame through both public paths: CheckFrame on the
// whole frame, and IPv4/IPv6 on its IP header and UDP segment compared
// with Wire.
func verifyKAT(t *testing.T, name string, kind Kind, fr katFrame) Result {
	t.Helper()
	r, err := CheckFrame(fr.data)
	if err != nil {
		t.Fatalf("%s frame %d: %v", name, fr.n, err)
	}
	if r.Kind != kind || r.Status != StatusOK || r.End != len(fr.data) {
		t.Errorf("%s frame %d: kind %v status %v (computed %08x wire %08x) end %d of %d", name, fr.n, r.Kind, r.Status, r.Computed, r.Wire, r.End, len(fr.data))
	}
	ip, udp := fr.data[r.L3:r.L3+r.L3Len], fr.data[r.UDP:r.End]
	var crc uint32
	if kind == KindRoCEv2IPv4 {
		crc, err = IPv4(ip, udp)
	} else {
		crc, err = IPv6(ip, udp)
	}
	if err != nil || crc != Wire(udp) {
		t.Errorf("%s frame %d: %v computes %08x (%v), wire %08x", name, fr.n, kind, crc, err, Wire(udp))
	}
	return r
}

// TestRxeKnownAnswers: every frame rdma_rxe sent, over IPv4 and IPv6,
// carries an ICRC computed by the kernel; package icrc must agree with
// each, and must reject the same frame with one bit of its payload (or,
// for packets without one, of its last header) flipped, and over IPv4 with
// the Identification changed (the ICRC covers it).
func TestRxeKnownAnswers(t *testing.T) {
	for _, kf := range katFiles {
		t.Run(kf.name, func(t *testing.T) {
			ops := map[bth.Opcode]bool{}
			n, ids := 0, 0
			for _, fr := range readKAT(t, kf.name, kf.guest) {
				if !fr.byRxe {
					continue
				}
				n++
				r := verifyKAT(t, kf.name, kf.kind, fr)
				ops[bth.Opcode(fr.data[r.BTH])] = true
				// The byte before the ICRC is payload, pad or the end of
				// the last extended header: covered either way.
				for _, off := range []int{r.End - 5, r.BTH + 12} {
					if off >= r.End-4 {
						continue
					}
					bad := bytes.Clone(fr.data)
					bad[off] ^= 0x08
					if b, err := CheckFrame(bad); err != nil || b.Status != StatusMismatch {
						t.Errorf("frame %d with bit 3 of byte %d flipped: %v %v, want mismatch", fr.n, off, b.Status, err)
					}
				}
				if kf.kind == KindRoCEv2IPv4 {
					if binary.BigEndian.Uint16(fr.data[r.L3+4:]) != 0 {
						ids++
					}
					bad := bytes.Clone(fr.data)
					bad[r.L3+5] ^= 0x01
					if b, _ := CheckFrame(bad); b.Status != StatusMismatch {
						t.Errorf("frame %d with its IPv4 ID changed: %v, want mismatch", fr.n, b.Status)
					}
				}
			}
			// What the capture must hold for the answers to mean
			// anything (testdata/rxe/README.md lists every frame).
			for _, op := range []bth.Opcode{bth.RCSendOnly, bth.RCSendOnlyImm, bth.RCWriteFirst, bth.RCWriteMiddle, bth.RCWriteLast,
				bth.RCWriteOnlyImm, bth.RCReadRequest, bth.RCCompareSwap, bth.RCFetchAdd, bth.RCAck, bth.RCReadResponseFirst,
				bth.RCReadResponseMiddle, bth.RCReadResponseLast, bth.RCReadResponseOnly, bth.RCAtomicAck} {
				if !ops[op] {
					t.Errorf("no rxe-sent %v frame", op)
				}
			}
			if kf.kind == KindRoCEv2IPv4 && ids == 0 {
				t.Error("no rxe frame with a nonzero IPv4 ID: the ID's coverage is not exercised")
			}
			t.Logf("%d rxe-sent frames verified (kernel ICRC), %d opcodes", n, len(ops))
		})
	}
}

// TestRxeKnownAnswerNAKs: the NAKs of the captures came from rxe, each
// with its kernel-computed ICRC.
func TestRxeKnownAnswerNAKs(t *testing.T) {
	for _, kf := range katFiles {
		got := map[bth.Syndrome]bool{}
		for _, fr := range readKAT(t, kf.name, kf.guest) {
			r := verifyKAT(t, kf.name, kf.kind, fr)
			if fr.byRxe && bth.Opcode(fr.data[r.BTH]) == bth.RCAck {
				got[bth.Syndrome(fr.data[r.BTH+12])] = true
			}
		}
		for _, s := range []bth.Syndrome{bth.SyndromeACKUnlimited, bth.SyndromePSNSeqError, bth.SyndromeRemoteAccessError, bth.RNRNAK(14)} {
			if !got[s] {
				t.Errorf("%s: no rxe-sent ACKNOWLEDGE with syndrome %v", kf.name, s)
			}
		}
	}
}

// TestSoftroceSentFrames checks the frames softroce sent in the same
// captures. Their ICRC is the project's own, so this is a consistency
// check (what was sent still verifies after crossing the kernel and the
// tap), not an independent answer: rxe accepting them (it answered each)
// is the independent part.
func TestSoftroceSentFrames(t *testing.T) {
	for _, kf := range katFiles {
		n := 0
		for _, fr := range readKAT(t, kf.name, kf.guest) {
			if fr.byRxe {
				continue
			}
			n++
			verifyKAT(t, kf.name, kf.kind, fr)
		}
		if n == 0 {
			t.Errorf("%s: no softroce-sent frames", kf.name)
		}
		t.Logf("%s: %d softroce-sent frames (own ICRC, not independent) verify", kf.name, n)
	}
}
