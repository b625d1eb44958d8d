package icrc

import (
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// v4Packet returns an IPv4 header (20 bytes, the given ID, DF as given)
// and a UDP segment carrying a roceLen-byte RoCE packet of random bytes,
// with the ICRC computed over that header by IPv4 (not by Synth).
func v4Packet(r *rand.Rand, id uint16, df bool, roceLen int) (ip, seg []byte) {
	ip = make([]byte, 20)
	ip[0] = 0x45
	ip[1] = byte(r.Uint32())
	binary.BigEndian.PutUint16(ip[2:], uint16(20+8+roceLen))
	binary.BigEndian.PutUint16(ip[4:], id)
	if df {
		ip[6] = 0x40
	}
	ip[8], ip[9] = 64, 17
	binary.BigEndian.PutUint32(ip[12:], 0x0a000001)
	binary.BigEndian.PutUint32(ip[16:], 0x0a000002)
	seg = make([]byte, 8+roceLen)
	for i := range seg {
		seg[i] = byte(r.Uint32())
	}
	binary.BigEndian.PutUint16(seg[2:], UDPPort)
	binary.BigEndian.PutUint16(seg[4:], uint16(8+roceLen))
	crc, err := IPv4(ip, seg)
	if err != nil {
		panic(err)
	}
	Put(seg, crc)
	return ip, seg
}

func v4Header(ip, seg []byte) Header {
	return Header{Src: ip[12:16], Dst: ip[16:20], DF: ip[6]&0x40 != 0,
		SrcPort: binary.BigEndian.Uint16(seg[0:]), DstPort: binary.BigEndian.Uint16(seg[2:])}
}

// TestIPv4IDColumns checks L against its definition, computed the slow
// way (the ICRC with one ID bit set, xored with the ICRC for ID 0), and
// that it has rank 16 for every packet length a link can carry, and a
// sample beyond.
func TestIPv4IDColumns(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	lengths := []int{}
	for n := bthLen + Len; n <= 9100; n++ {
		lengths = append(lengths, n)
	}
	for range 200 {
		lengths = append(lengths, 9100+r.IntN(MaxIPv4RoCE-9100+1))
	}
	lengths = append(lengths, MaxIPv4RoCE)
	for _, n := range lengths {
		cols := idColumns(n)
		if n%97 == 0 || n > 9100 && n%7 == 0 {
			// The definition, through the slow general path.
			_, seg := v4Packet(r, 0, true, n)
			h := v4Header(make([]byte, 20), seg)
			h.Src, h.Dst = []byte{10, 0, 0, 1}, []byte{10, 0, 0, 2}
			c0, _ := Synth(&h, seg[8:])
			for b := range 16 {
				h.ID = 1 << b
				cb, _ := Synth(&h, seg[8:])
				if cb^c0 != cols[b] {
					t.Fatalf("length %d bit %d: column %08x, definition %08x", n, b, cols[b], cb^c0)
				}
			}
		}
		// Rank by elimination, independent of newIDBasis.
		rank := 0
		var basis [32]uint32 // indexed by highest bit
		for _, v := range cols {
			for v != 0 {
				hb := 31 - leadingZeros(v)
				if basis[hb] == 0 {
					basis[hb] = v
					rank++
					break
				}
				v ^= basis[hb]
			}
		}
		if rank != 16 {
			t.Fatalf("length %d: rank %d, want 16", n, rank)
		}
	}
}

func leadingZeros(v uint32) int {
	n := 0
	for v&0x80000000 == 0 {
		v <<= 1
		n++
	}
	return n
}

// TestSolveIPv4ID recovers non-zero IDs from ICRCs computed over them,
// with DF set and clear, and rejects single corrupted bytes.
func TestSolveIPv4ID(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for trial := range 2000 {
		n := bthLen + Len + r.IntN(4200)
		id := uint16(r.Uint32())
		df := trial%4 != 0
		ip, seg := v4Packet(r, id, df, n)
		h := v4Header(ip, seg)
		got, ok, err := SolveIPv4ID(&h, seg[8:])
		if err != nil || !ok || got != id {
			t.Fatalf("trial %d (len %d, DF %v): got %#04x %v %v, want %#04x", trial, n, df, got, ok, err, id)
		}
		// The wrong DF assumption is caught like corruption.
		h.DF = !df
		if _, ok, _ := SolveIPv4ID(&h, seg[8:]); ok {
			t.Fatalf("trial %d: accepted with DF flipped", trial)
		}
		h.DF = df
		// One corrupted byte anywhere in BTH .. ICRC but BTH byte 4,
		// which the ICRC masks by design (FECN, BECN, resv6).
		i := 8 + r.IntN(n)
		if i == 8+4 {
			i++
		}
		seg[i] ^= byte(1 + r.IntN(255))
		if _, ok, _ := SolveIPv4ID(&h, seg[8:]); ok {
			t.Fatalf("trial %d: corrupted byte %d accepted", trial, i-8)
		}
	}
	if _, _, err := SolveIPv4ID(&Header{Src: make([]byte, 16), Dst: make([]byte, 16)}, make([]byte, 64)); err == nil {
		t.Error("IPv6 header accepted")
	}
	if _, _, err := SolveIPv4ID(&Header{Src: make([]byte, 4), Dst: make([]byte, 4)}, make([]byte, 8)); !errors.Is(err, ErrShort) {
		t.Errorf("short packet: %v", err)
	}
}

// TestSolveIPv4IDFalseAccept measures how often a corrupted packet still
// passes. SOFTROCE_FA_TRIALS sets the number of trials (default 2^18).
// Two kinds of damage: uniformly random (every byte of BTH .. payload
// replaced), where 2^-16 is exact, and 1 to 3 damaged bytes, where the
// rate is of the same order but depends on where the damage falls: unlike
// the full CRC, the 16 remaining bits do not catch every short burst (for
// some lengths, some single-byte errors at some positions pass). Damage
// confined to the ICRC bytes is left out: it leaves the data intact. The bounds are loose enough never to fail by chance
// (Poisson tail below 1e-9) and catch a check weaker than about 13 bits.
func TestSolveIPv4IDFalseAccept(t *testing.T) {
	trials := 1 << 18
	if s := os.Getenv("SOFTROCE_FA_TRIALS"); s != "" {
		trials, _ = strconv.Atoi(s)
	}
	r := rand.New(rand.NewPCG(5, 6))
	ip, seg := v4Packet(r, 0xbeef, true, 64)
	h := v4Header(ip, seg)
	roce := seg[8:]
	data := len(roce) - Len
	orig := append([]byte(nil), roce...)
	for _, uniform := range []bool{true, false} {
		accepted := 0
		for range trials {
			if uniform {
				for i := range data {
					roce[i] = byte(r.Uint32())
				}
				roce[4] = orig[4]
			} else {
				// BTH byte 4 is masked by the ICRC by design: not damage.
				for k := 1 + r.IntN(3); k > 0; k-- {
					i := r.IntN(data - 1)
					if i >= 4 {
						i++
					}
					roce[i] ^= byte(1 + r.IntN(255))
				}
			}
			if string(roce) != string(orig) {
				if _, ok, _ := SolveIPv4ID(&h, roce); ok {
					accepted++
				}
			}
			copy(roce, orig)
		}
		t.Logf("uniform %v: %d of %d corrupted packets accepted (1 in %.0f; 2^-16 expects %.1f)",
			uniform, accepted, trials, float64(trials)/float64(max(accepted, 1)), float64(trials)/65536)
		if float64(accepted) > 8*float64(trials)/65536+20 {
			t.Errorf("uniform %v: %d false accepts in %d trials", uniform, accepted, trials)
		}
	}
}

func TestSolveIPv4IDAllocs(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	ip, seg := v4Packet(r, 77, true, 1024)
	h := v4Header(ip, seg)
	SolveIPv4ID(&h, seg[8:]) // builds the basis for this length
	if a := testing.AllocsPerRun(100, func() { SolveIPv4ID(&h, seg[8:]) }); a != 0 {
		t.Errorf("%v allocations per call", a)
	}
}

// solveFrame checks that the solver names the ID in the header of fr, an
// Ethernet frame with a correct ICRC; it reports whether fr was an IPv4
// RoCE frame without options, and its ID.
func solveFrame(t *testing.T, name string, n int, fr []byte) (bool, uint16) {
	t.Helper()
	res, err := CheckFrame(fr)
	if err != nil || res.Kind != KindRoCEv2IPv4 || res.Status != StatusOK || res.L3Len != 20 {
		return false, 0
	}
	ip, seg := fr[res.L3:res.L3+20], fr[res.UDP:res.End]
	h := v4Header(ip, seg)
	want := binary.BigEndian.Uint16(ip[4:])
	got, ok, err := SolveIPv4ID(&h, seg[8:])
	if err != nil || !ok || got != want {
		t.Errorf("%s frame %d: got %#04x %v %v, want ID %#04x", name, n, got, ok, err, want)
	}
	return true, want
}

// TestSolveIPv4IDKnownAnswers recovers the IPv4 ID of every frame rxe sent
// in testdata/rxe: their ICRCs were computed by the kernel over non-zero
// IDs, an independent implementation.
func TestSolveIPv4IDKnownAnswers(t *testing.T) {
	checked, nonZero := 0, 0
	for _, fr := range readKAT(t, "rxe-ipv4.pcap", netip.MustParseAddr("10.88.0.2")) {
		if !fr.byRxe {
			continue
		}
		if ok, id := solveFrame(t, "rxe-ipv4.pcap", fr.n, fr.data); ok {
			checked++
			if id != 0 {
				nonZero++
			}
		}
	}
	if checked == 0 || nonZero == 0 {
		t.Fatalf("%d rxe frames checked, %d with a non-zero ID: nothing tested", checked, nonZero)
	}
	t.Logf("recovered the IPv4 ID of %d frames rxe sent (%d non-zero)", checked, nonZero)
}

// TestSolveIPv4IDCaptures does the same for the shared captures of
// ConnectX NICs and rxe, where present.
func TestSolveIPv4IDCaptures(t *testing.T) {
	files, _ := filepath.Glob(sharedDir + "/hardware/*.pcap")
	if len(files) == 0 {
		t.Skipf("shared captures absent: no %s/hardware/*.pcap", sharedDir)
	}
	checked, nonZero := 0, 0
	for _, path := range files {
		for i, fr := range readPcap(t, path) {
			if ok, id := solveFrame(t, filepath.Base(path), i+1, fr); ok {
				checked++
				if id != 0 {
					nonZero++
				}
			}
		}
	}
	if checked == 0 || nonZero == 0 {
		t.Fatalf("%d frames checked, %d with a non-zero ID: nothing tested", checked, nonZero)
	}
	t.Logf("recovered the IPv4 ID of %d captured frames (%d non-zero)", checked, nonZero)
}

func BenchmarkSolveIPv4ID(b *testing.B) {
	for _, n := range []int{64, 1024, 4096} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			r := rand.New(rand.NewPCG(9, 10))
			ip, seg := v4Packet(r, 0x1234, true, n)
			h := v4Header(ip, seg)
			b.SetBytes(int64(n))
			b.ReportAllocs()
			for b.Loop() {
				if _, ok, _ := SolveIPv4ID(&h, seg[8:]); !ok {
					b.Fatal("rejected")
				}
			}
		})
	}
}

func BenchmarkSynthIPv4(b *testing.B) {
	for _, n := range []int{64, 1024, 4096} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			r := rand.New(rand.NewPCG(9, 10))
			ip, seg := v4Packet(r, 0x1234, true, n)
			h := v4Header(ip, seg)
			b.SetBytes(int64(n))
			b.ReportAllocs()
			for b.Loop() {
				Synth(&h, seg[8:])
			}
		})
	}
}

// BenchmarkIDBasis is the one-off cost of a packet length seen first.
func BenchmarkIDBasis(b *testing.B) {
	for b.Loop() {
		newIDBasis(4096 + 28)
	}
}
