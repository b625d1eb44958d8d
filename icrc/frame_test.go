package icrc

import (
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gopacket/gopacket/pcapgo"

	"github.com/softroce/softroce/bth"
)

// readPcap returns the frames of a classic pcap file, skipping the test
// when the shared captures are absent.
func readPcap(t testing.TB, path string) [][]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Skipf("shared captures absent: %v", err)
	}
	defer f.Close()
	r, err := pcapgo.NewReader(f)
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	var frames [][]byte
	for {
		data, _, err := r.ReadPacketData()
		if err == io.EOF {
			return frames
		}
		if err != nil {
			t.Fatalf("read %s: %v", path, err)
		}
		frames = append(frames, data)
	}
}

func TestCheckFrameVectors(t *testing.T) {
	data, err := os.ReadFile(sharedDir + "/vectors/icrc_vectors.json")
	if err != nil {
		t.Skipf("shared captures absent: %v", err)
	}
	var vecs []struct {
		Name  string `json:"name"`
		Frame string `json:"frame"`
		Wire  string `json:"icrc_wire_bytes"`
	}
	if err := json.Unmarshal(data, &vecs); err != nil {
		t.Fatal(err)
	}
	if len(vecs) != 3 {
		t.Fatalf("%d vectors, want 3", len(vecs))
	}
	for _, v := range vecs {
		frame, err := hex.DecodeString(v.Frame)
		if err != nil {
			t.Fatal(err)
		}
		r, err := CheckFrame(frame)
		if err != nil {
			t.Fatalf("%s: %v", v.Name, err)
		}
		wire, _ := hex.DecodeString(v.Wire)
		if r.Status != StatusOK || r.Wire != binary.LittleEndian.Uint32(wire) {
			t.Errorf("%s: status %v computed %08x wire %08x, vector says %s", v.Name, r.Status, r.Computed, r.Wire, v.Wire)
		}
	}
	frames := readPcap(t, sharedDir+"/vectors/hex_vectors.pcap")
	if len(frames) != len(vecs) {
		t.Fatalf("hex_vectors.pcap has %d frames, want %d", len(frames), len(vecs))
	}
	for i, fr := range frames {
		if r, err := CheckFrame(fr); err != nil || r.Status != StatusOK {
			t.Errorf("hex_vectors.pcap frame %d: %+v %v", i+1, r, err)
		}
	}
}

// TestHardwareCaptures checks every RoCE frame of the real captures: all
// verify, except the sniffer capture whose UDP source port was recorded
// before the NIC rewrote it, where every RoCE frame must mismatch.
func TestHardwareCaptures(t *testing.T) {
	files, _ := filepath.Glob(sharedDir + "/hardware/*.pcap")
	if len(files) == 0 {
		t.Skipf("shared captures absent: no %s/hardware/*.pcap", sharedDir)
	}
	for _, path := range files {
		bad := strings.Contains(path, "bad-icrc")
		frames := readPcap(t, path)
		roce := 0
		for i, fr := range frames {
			r, err := CheckFrame(fr)
			if errors.Is(err, ErrNotRoCE) {
				continue
			}
			if err != nil {
				t.Errorf("%s frame %d: %v", filepath.Base(path), i+1, err)
				continue
			}
			roce++
			want := StatusOK
			if bad {
				want = StatusMismatch
			}
			if r.Status != want {
				t.Errorf("%s frame %d: %v (computed %08x wire %08x), want %v", filepath.Base(path), i+1, r.Status, r.Computed, r.Wire, want)
			}
		}
		if roce == 0 {
			t.Errorf("%s: no RoCE frames found", filepath.Base(path))
		}
		t.Logf("%s: %d frames, %d RoCE", filepath.Base(path), len(frames), roce)
	}
}

// frame4K is an Ethernet | IPv4 | UDP | RC RDMA_WRITE_ONLY frame with a
// 4096-byte payload and a valid ICRC.
func frame4K(tb testing.TB) []byte { return frameN(tb, 4096) }

// frameN is frame4K with an n-byte payload.
func frameN(tb testing.TB, n int) []byte {
	payload := make([]byte, n)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	f := &bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCWriteOnly, PKey: 0xffff, DestQP: 0x11, PSN: 5, AckReq: true},
		VA: 0x1000, RKey: 0x42, DMALen: uint32(n)}
	return buildV4(tb, f, payload)
}

// buildV4 wraps a packet built by bth.Build in Ethernet, IPv4 and UDP
// headers and fills in its ICRC.
func buildV4(tb testing.TB, f *bth.Fields, payload []byte) []byte {
	n := bth.Len(f.BTH.Opcode, len(payload))
	frame := make([]byte, 14+20+8+n)
	copy(frame, []byte{2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x00})
	ip := frame[14:34]
	ip[0] = 0x45
	ip[1] = 0x02 // ECT(0): masked by the ICRC
	binary.BigEndian.PutUint16(ip[2:], uint16(20+8+n))
	binary.BigEndian.PutUint16(ip[4:], 0x1234)
	ip[6] = 0x40
	ip[8], ip[9] = 64, 17
	copy(ip[12:], []byte{10, 0, 0, 1, 10, 0, 0, 2})
	udp := frame[34:42]
	binary.BigEndian.PutUint16(udp[0:], 0xc000)
	binary.BigEndian.PutUint16(udp[2:], UDPPort)
	binary.BigEndian.PutUint16(udp[4:], uint16(8+n))
	if _, err := bth.Build(frame[42:], f, payload); err != nil {
		tb.Fatal(err)
	}
	crc, err := IPv4(ip, frame[34:])
	if err != nil {
		tb.Fatal(err)
	}
	Put(frame, crc)
	return frame
}

func TestCheckFrameSynthetic(t *testing.T) {
	fr := frame4K(t)
	r, err := CheckFrame(fr)
	if err != nil || r.Status != StatusOK || r.Kind != KindRoCEv2IPv4 || r.BTH != 42 || r.End != len(fr) {
		t.Fatalf("%+v %v", r, err)
	}
	// ECN, TTL and FECN/BECN changes are masked; a payload bit is not.
	mod := append([]byte(nil), fr...)
	mod[15] |= 3      // CE
	mod[22]--         // TTL
	mod[42+4] |= 0xc0 // FECN, BECN
	if r, _ := CheckFrame(mod); r.Status != StatusOK {
		t.Errorf("masked fields changed the verdict: %v", r.Status)
	}
	mod[100] ^= 1
	if r, _ := CheckFrame(mod); r.Status != StatusMismatch {
		t.Errorf("payload bit flip: %v, want bad", r.Status)
	}
	// The IPv4 ID is covered (docs/platform.md, ICRC).
	mod = append([]byte(nil), fr...)
	mod[19]++
	if r, _ := CheckFrame(mod); r.Status != StatusMismatch {
		t.Errorf("IP ID change: %v, want bad", r.Status)
	}
	// Ethernet padding and an FCS after the packet are ignored.
	padded := append(append([]byte(nil), fr...), 0xde, 0xad, 0xbe, 0xef)
	if r, err := CheckFrame(padded); err != nil || r.Status != StatusOK || r.End != len(fr) {
		t.Errorf("trailer: %+v %v", r, err)
	}
	// A short snap length is truncated, not bad.
	for _, cut := range []int{42, 60, 200, len(fr) - 1} {
		r, err := CheckFrame(fr[:cut])
		if err != nil || r.Status != StatusTruncated {
			t.Errorf("cut at %d: %+v %v, want truncated", cut, r, err)
		}
	}
	// Two VLAN tags.
	tagged := append(append(append([]byte(nil), fr[:12]...), 0x88, 0xa8, 0x00, 0x0a, 0x81, 0x00, 0x20, 0x0b), fr[12:]...)
	r, err = CheckFrame(tagged)
	if err != nil || r.Status != StatusOK || r.NumVLAN != 2 || r.VLAN != [2]uint16{10, 11} || r.BTH != 50 {
		t.Errorf("QinQ: %+v %v", r, err)
	}
}

func TestCheckFrameErrors(t *testing.T) {
	fr := frame4K(t)
	cases := []struct {
		name  string
		frame []byte
		notRo bool
	}{
		{"empty", nil, false},
		{"arp", append(append([]byte(nil), fr[:12]...), 0x08, 0x06, 0, 1), true},
		{"tcp", func() []byte { b := append([]byte(nil), fr...); b[14+9] = 6; return b }(), true},
		{"other port", func() []byte { b := append([]byte(nil), fr...); b[37] = 53; return b }(), true},
		{"fragment", func() []byte { b := append([]byte(nil), fr...); b[20] = 0x20; return b }(), true},
		{"ihl 4", func() []byte { b := append([]byte(nil), fr...); b[14] = 0x44; return b }(), true},
		{"ip version 5", func() []byte { b := append([]byte(nil), fr...); b[14] = 0x55; return b }(), true},
		{"ip total length short", func() []byte { b := append([]byte(nil), fr...); b[16], b[17] = 0, 40; return b }(), false},
		{"udp len too big", func() []byte { b := append([]byte(nil), fr...); b[38], b[39] = 0xff, 0xff; return b }(), false},
		{"udp len tiny", func() []byte { b := append([]byte(nil), fr...); b[38], b[39] = 0, 10; return b }(), false},
		{"cut in vlan", append(append([]byte(nil), fr[:12]...), 0x81, 0x00, 0), false},
		{"cut in ip", fr[:20], false},
		{"cut in udp", fr[:38], false},
	}
	for _, c := range cases {
		_, err := CheckFrame(c.frame)
		var fe *FrameError
		switch {
		case c.notRo && !errors.Is(err, ErrNotRoCE):
			t.Errorf("%s: %v, want ErrNotRoCE", c.name, err)
		case !c.notRo && !errors.As(err, &fe):
			t.Errorf("%s: %v, want *FrameError", c.name, err)
		case fe != nil && !fe.Truncated && fe.Kind != KindRoCEv2IPv4:
			t.Errorf("%s: malformed RoCE error without its kind: %+v", c.name, fe)
		}
	}
}

func TestCheckFrameAllocs(t *testing.T) {
	fr := frame4K(t)
	arp := append(append([]byte(nil), fr[:12]...), 0x08, 0x06, 0, 1)
	if n := testing.AllocsPerRun(100, func() { CheckFrame(fr); CheckFrame(arp) }); n != 0 {
		t.Errorf("CheckFrame allocates %v times per frame", n)
	}
}

// The ICRC of a whole frame (IPv4, RDMA WRITE with a 64-byte, 1 KiB or
// 4 KiB payload) against plain crc32 over the same frame. Both report
// the frame's length as bytes processed.

func benchICRC(b *testing.B, n int) {
	fr := frameN(b, n)
	ip, udp := fr[14:34], fr[34:]
	b.SetBytes(int64(len(fr)))
	b.ReportAllocs()
	for b.Loop() {
		IPv4(ip, udp)
	}
}

func benchCRC32(b *testing.B, n int) {
	fr := frameN(b, n)
	b.SetBytes(int64(len(fr)))
	b.ReportAllocs()
	for b.Loop() {
		crc32.ChecksumIEEE(fr)
	}
}

func BenchmarkICRC64(b *testing.B)      { benchICRC(b, 64) }
func BenchmarkICRC1K(b *testing.B)      { benchICRC(b, 1024) }
func BenchmarkICRC4K(b *testing.B)      { benchICRC(b, 4096) }
func BenchmarkCRC32IEEE64(b *testing.B) { benchCRC32(b, 64) }
func BenchmarkCRC32IEEE1K(b *testing.B) { benchCRC32(b, 1024) }
func BenchmarkCRC32IEEE4K(b *testing.B) { benchCRC32(b, 4096) }

func BenchmarkCheckFrame4K(b *testing.B) {
	fr := frame4K(b)
	b.SetBytes(int64(len(fr)))
	b.ReportAllocs()
	for b.Loop() {
		CheckFrame(fr)
	}
}
