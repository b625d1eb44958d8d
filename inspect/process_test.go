package inspect

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

// testCaptures are the captures the fast path is compared on: the
// project's own and, when present, the shared real ones.
func testCaptures(t *testing.T) []string {
	t.Helper()
	files := []string{syntheticCapture, "testdata/rxe-cm/rxe-cm.pcap"}
	rxe, _ := filepath.Glob("../icrc/testdata/rxe/*.pcap")
	files = append(files, rxe...)
	if shared, _ := filepath.Glob(sharedDir + "/*/*.pcap"); len(shared) > 0 {
		files = append(files, shared...)
	} else {
		t.Log("shared captures absent: comparing the project's captures only")
	}
	return files
}

// referenceOutput renders a capture as `inspect` did before Process: Walk,
// then json.Marshal of each RoCE record (or the text writer), then the
// summary. The error is part of the output, as the command prints it.
func referenceOutput(path, file string, asJSON, verbose bool) string {
	var out bytes.Buffer
	z := NewSummarizer(path)
	err := Walk(path, func(r *Record) error {
		r.File = file
		z.Add(r)
		if !asJSON {
			return WriteText(&out, r, verbose)
		}
		if !r.RoCE {
			return nil
		}
		b, err := json.Marshal(r)
		if err != nil {
			return fmt.Errorf("encode frame %d: %w", r.Frame, err)
		}
		out.Write(append(b, '\n'))
		return nil
	})
	return finish(&out, z, err, asJSON)
}

func finish(out *bytes.Buffer, z *Summarizer, err error, asJSON bool) string {
	s := z.Summary()
	if s.Frames > 0 {
		if asJSON {
			WriteJSONSummary(out, &s)
		} else {
			WriteSummary(out, &s)
		}
	}
	if err != nil {
		fmt.Fprintf(out, "error: %v\n", err)
	}
	return out.String()
}

// processOutput renders a capture through Process.
func processOutput(path, file string, jobs int, asJSON, verbose bool) string {
	var out bytes.Buffer
	z := NewSummarizer(path)
	render := RenderText(verbose)
	if asJSON {
		render = RenderJSON
	}
	err := Process(path, ProcessOptions{Jobs: jobs, File: file, Render: render}, func(r *Record, line []byte, rerr error) error {
		z.Add(r)
		if rerr != nil {
			return rerr
		}
		out.Write(line)
		return nil
	})
	return finish(&out, z, err, asJSON)
}

// smallBatches makes batches of a few frames and bytes for the test, so
// that records straddle batch buffers and the buffer grows for a record.
func smallBatches(t *testing.T, frames, bytes int) {
	t.Helper()
	f, b := batchFrames, batchBytes
	batchFrames, batchBytes = frames, bytes
	t.Cleanup(func() { batchFrames, batchBytes = f, b })
}

// TestProcessMatchesWalk: on every test capture, serial and parallel,
// with batches of every size, Process gives the records Walk gives and
// the output the previous implementation (json.Marshal) wrote, in JSON
// and as text.
func TestProcessMatchesWalk(t *testing.T) {
	for _, path := range testCaptures(t) {
		for _, sizes := range [][2]int{{2048, 1 << 20}, {3, 200}, {1, 1}} {
			smallBatches(t, sizes[0], sizes[1])
			for _, mode := range []struct{ json, verbose bool }{{true, false}, {false, false}, {false, true}} {
				want := referenceOutput(path, "f.pcap", mode.json, mode.verbose)
				for _, jobs := range []int{1, 2, 5, 40} {
					if got := processOutput(path, "f.pcap", jobs, mode.json, mode.verbose); got != want {
						t.Errorf("%s, batches %v, jobs %d, json %v verbose %v: output differs\n got: %.600s\nwant: %.600s",
							path, sizes, jobs, mode.json, mode.verbose, got, want)
					}
				}
			}
			recs, err := Records(path)
			if err != nil {
				t.Fatal(err)
			}
			i := 0
			err = Process(path, ProcessOptions{Jobs: 3}, func(r *Record, _ []byte, _ error) error {
				if i >= len(recs) || !reflect.DeepEqual(*r, recs[i]) {
					return fmt.Errorf("record %d differs from Walk's", i+1)
				}
				i++
				return nil
			})
			if err != nil || i != len(recs) {
				t.Errorf("%s: %v after %d of %d records", path, err, i, len(recs))
			}
		}
	}
}

// TestCloneOutlivesProcess: a clone shares no pointer or slice with the
// record Process hands out, clones kept from Process (whose one batch of
// two frames is reused every other frame) still equal Walk's records at
// the end, and the captures exercise every optional header Clone copies.
func TestCloneOutlivesProcess(t *testing.T) {
	smallBatches(t, 2, 300)
	seen := map[string]bool{}
	for _, path := range testCaptures(t) {
		recs, err := Records(path)
		if err != nil {
			t.Fatal(err)
		}
		var kept []Record
		err = Process(path, ProcessOptions{}, func(r *Record, _ []byte, _ error) error {
			c := r.Clone()
			if p := sharedStorage(reflect.ValueOf(c), reflect.ValueOf(*r), "Record"); p != "" {
				return fmt.Errorf("frame %d: clone shares %s", r.Frame, p)
			}
			kept = append(kept, c)
			return nil
		})
		if err != nil || len(kept) != len(recs) {
			t.Fatalf("%s: %v after %d of %d records", path, err, len(kept), len(recs))
		}
		for i := range recs {
			if !reflect.DeepEqual(kept[i], recs[i]) {
				t.Fatalf("%s: clone of record %d differs from Walk's", path, i+1)
			}
			r := &recs[i]
			for name, set := range map[string]bool{
				"DETH": r.DETH != nil, "RETH": r.RETH != nil,
				"AtomicETH": r.AtomicETH != nil, "AETH": r.AETH != nil, "AtomicAck": r.AtomicAck != nil,
				"Imm": r.Imm != nil, "IETH": r.IETH != nil,
				"Credits":  r.AETH != nil && r.AETH.Credits != nil,
				"NAKCode":  r.AETH != nil && r.AETH.NAKCode != nil,
				"RNRTimer": r.AETH != nil && r.AETH.RNRTimer != nil,
			} {
				seen[name] = seen[name] || set
			}
		}
	}
	for name, ok := range seen {
		if !ok {
			t.Errorf("no record with %s: Clone's copy of it is untested", name)
		}
	}
}

// sharedStorage names the first non-nil pointer or non-empty slice that
// a and b (values of one of this package's types) both hold, or returns
// "". Other packages' values (addresses, times) and the CM, which is never
// changed, may share.
func sharedStorage(a, b reflect.Value, path string) string {
	if t := a.Type(); t.Name() != "" && t.PkgPath() != reflect.TypeFor[Record]().PkgPath() || t == reflect.TypeFor[*CM]() {
		return ""
	}
	switch a.Kind() {
	case reflect.Pointer:
		if a.IsNil() || b.IsNil() {
			return ""
		}
		if a.Pointer() == b.Pointer() {
			return path
		}
		return sharedStorage(a.Elem(), b.Elem(), path)
	case reflect.Slice:
		if a.Len() > 0 && b.Len() > 0 && a.Pointer() == b.Pointer() {
			return path
		}
	case reflect.Struct:
		for i := range a.NumField() {
			if p := sharedStorage(a.Field(i), b.Field(i), path+"."+a.Type().Field(i).Name); p != "" {
				return p
			}
		}
	}
	return ""
}

// pcapBytes builds a classic pcap: header fields in the given byte order
// and timestamp resolution, then records of (caplen, wirelen, data).
func pcapBytes(order binary.AppendByteOrder, nano bool, snaplen uint32, lt layers.LinkType, recs ...[]byte) []byte {
	var b []byte
	magic := uint32(0xa1b2c3d4)
	if nano {
		magic = 0xa1b23c4d
	}
	b = order.AppendUint32(b, magic)
	b = order.AppendUint16(b, 2)
	b = order.AppendUint16(b, 4)
	b = append(b, make([]byte, 8)...)
	b = order.AppendUint32(b, snaplen)
	b = order.AppendUint32(b, uint32(lt))
	for i, r := range recs {
		b = order.AppendUint32(b, 1700000000+uint32(i))
		b = order.AppendUint32(b, uint32(i*999_999+1))
		b = order.AppendUint32(b, uint32(len(r)))
		b = order.AppendUint32(b, uint32(len(r)+i%2*4))
		b = append(b, r...)
	}
	return b
}

// TestProcessOddFiles: byte orders, nanosecond stamps, records longer than
// the snap length or than the packet, empty records, files cut at every
// byte, pcapng cut at every byte, and not a capture at all give Walk's
// records and errors.
func TestProcessOddFiles(t *testing.T) {
	frames, _, _ := syntheticFrames(t)
	dir := t.TempDir()
	if d := os.Getenv("ZZKEEP"); d != "" {
		dir = d
	}
	files := map[string][]byte{}
	for _, order := range []binary.AppendByteOrder{binary.LittleEndian, binary.BigEndian} {
		for _, nano := range []bool{false, true} {
			files[fmt.Sprintf("%v-%v.pcap", order, nano)] = pcapBytes(order, nano, 65535, layers.LinkTypeEthernet, frames...)
		}
	}
	files["empty-record.pcap"] = pcapBytes(binary.LittleEndian, false, 65535, layers.LinkTypeEthernet, frames[0], nil, frames[1])
	files["over-snaplen.pcap"] = pcapBytes(binary.LittleEndian, false, 64, layers.LinkTypeEthernet, frames[0], make([]byte, 262145))
	long := pcapBytes(binary.LittleEndian, false, 65535, layers.LinkTypeEthernet, frames[0], frames[1])
	binary.LittleEndian.PutUint32(long[24+16+len(frames[0])+12:], 10) // wire length below the capture length
	files["over-wirelen.pcap"] = long
	huge := pcapBytes(binary.LittleEndian, false, 0xffffffff, layers.LinkTypeEthernet, frames[0])
	huge = binary.LittleEndian.AppendUint32(huge, 1)
	huge = binary.LittleEndian.AppendUint32(huge, 0)
	huge = binary.LittleEndian.AppendUint32(huge, 0xfffffff0) // 4 GiB claimed, 5 bytes present
	huge = binary.LittleEndian.AppendUint32(huge, 0xfffffff0)
	files["huge-record.pcap"] = append(huge, 1, 2, 3, 4, 5)
	sll := append(make([]byte, 16), frames[4][14:]...)
	sll[14] = 0x08 // IPv4
	files["sll.pcap"] = pcapBytes(binary.LittleEndian, false, 65535, layers.LinkTypeLinuxSLL, sll)
	files["version.pcap"] = append(pcapBytes(binary.LittleEndian, false, 65535, layers.LinkTypeEthernet)[:4], make([]byte, 20)...)
	files["junk"] = []byte("not a capture at all, surely")
	base := pcapBytes(binary.BigEndian, true, 65535, layers.LinkTypeEthernet, frames...)
	for n := 0; n < len(base); n += 1 + n/64 {
		files[fmt.Sprintf("cut-%05d.pcap", n)] = base[:n]
	}
	for off, i := 24, 0; i < len(frames); off, i = off+16+len(frames[i]), i+1 {
		// Cut at a record, inside its header, after it, inside its data.
		for _, n := range []int{off, off + 7, off + 16, off + 17} {
			files[fmt.Sprintf("cut-%05d.pcap", n)] = base[:n]
		}
	}
	ng, err := os.ReadFile(syntheticCapture)
	if err != nil {
		t.Fatal(err)
	}
	for n := 0; n < len(ng); n += 1 + n/32 {
		files[fmt.Sprintf("cut-%05d.pcapng", n)] = ng[:n]
	}
	smallBatches(t, 4, 300)
	for name, data := range files {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		want := referenceOutput(path, "", true, false)
		for _, jobs := range []int{1, 3} {
			if got := processOutput(path, "", jobs, true, false); got != want {
				t.Errorf("%s, jobs %d:\n got: %.400s\nwant: %.400s", name, jobs, tail(got), tail(want))
			}
		}
	}
}

func tail(s string) string {
	if i := strings.LastIndex(strings.TrimSuffix(s, "\n"), "\n"); i >= 0 {
		return "..." + s[i:]
	}
	return s
}

// TestAppendJSONMatchesMarshal: the hand-written encoder writes
// json.Marshal's bytes for every record of the test captures, for strings
// that need escaping, other time zones and the zero address, and fails as
// json.Marshal does for a year it cannot encode.
func TestAppendJSONMatchesMarshal(t *testing.T) {
	var recs []Record
	for _, path := range testCaptures(t) {
		r, err := Records(path)
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, r...)
	}
	odd := recs[0]
	odd.File = "a<b>&\"c\"\\\n\r\t\b\f\x01\x7f é \u2028\u2029 \xff\xfe end"
	odd.Malformed = "bad </script> & \x00"
	odd.Interface = 3
	odd.Time = time.Date(2026, 5, 6, 7, 8, 9, 120000, time.FixedZone("x", -(3*3600+30*60)))
	recs = append(recs, odd, Record{}, Record{Time: time.Unix(0, 1).In(time.FixedZone("y", 5*3600+7))})
	for i := range recs {
		want, err := json.Marshal(&recs[i])
		if err != nil {
			t.Fatal(err)
		}
		got, err := AppendJSON([]byte("prefix"), &recs[i])
		if err != nil || string(got) != "prefix"+string(want) {
			t.Errorf("record %d: %v\n got: %s\nwant: %s", i, err, got, want)
		}
	}
	for _, ts := range []time.Time{time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(2000, 1, 1, 0, 0, 0, 0, time.FixedZone("z", 24*3600))} {
		r := Record{Frame: 7, Time: ts}
		_, jerr := json.Marshal(&r)
		got, err := AppendJSON([]byte("x"), &r)
		if err == nil || jerr == nil || err.Error() != "encode frame 7: "+jerr.Error() || string(got) != "x" {
			t.Errorf("%v: got %q, %v; json.Marshal: %v", ts, got, err, jerr)
		}
	}
}

// TestAppendTimeUTC: the direct civil date matches AppendFormat from
// year 0 to 9999, leap days, the Unix epoch and every fraction length;
// other years and zones are left to AppendFormat.
func TestAppendTimeUTC(t *testing.T) {
	times := []time.Time{time.Unix(0, 0).UTC(), time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC),
		time.Date(2000, 2, 29, 12, 0, 0, 100, time.UTC), time.Date(1900, 3, 1, 0, 0, 0, 0, time.UTC), time.Date(1969, 12, 31, 23, 59, 59, 5e8, time.UTC)}
	rng := rand.New(rand.NewPCG(1, 2))
	lo, hi := time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC).Unix(), time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC).Unix()
	for range 200000 {
		ns := rng.Int64N(1e9)
		if rng.IntN(2) == 0 {
			ns = ns / 1000 * 1000
		}
		times = append(times, time.Unix(lo+rng.Int64N(hi-lo), ns).UTC())
	}
	for _, ts := range times {
		want := ts.AppendFormat([]byte("x"), time.RFC3339Nano)
		if got := appendTimeUTC([]byte("x"), ts); string(got) != string(want) {
			t.Fatalf("%v: %s, want %s", ts, got, want)
		}
	}
	for _, ts := range []time.Time{time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(-1, 12, 31, 0, 0, 0, 0, time.UTC), time.Unix(0, 0)} {
		if got := appendTimeUTC([]byte("x"), ts); got != nil {
			t.Errorf("%v: %s, want nil (left to AppendFormat)", ts, got)
		}
	}
}

// TestProcessNoAllocs: decoding and rendering a batch of frames allocates
// nothing once the batch's buffers have grown (CM MADs aside, which the
// rxe capture has none of).
func TestProcessNoAllocs(t *testing.T) {
	path := "../icrc/testdata/rxe/rxe-ipv4.pcap"
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	src, err := newFrameSource(f)
	if err != nil {
		t.Fatal(err)
	}
	b := newBatch()
	src.fill(b)
	if len(b.frames) < 10 {
		t.Fatalf("%d frames", len(b.frames))
	}
	o := ProcessOptions{Render: RenderJSON}
	roce := 0
	allocs := testing.AllocsPerRun(20, func() {
		b.decode(&o)
		roce = 0
		for i := range b.recs {
			if b.recs[i].RoCE {
				roce++
			}
		}
	})
	if allocs != 0 || roce < 10 || len(b.out) == 0 {
		t.Errorf("%v allocations per batch of %d frames (%d RoCE)", allocs, len(b.frames), roce)
	}
	r := DecodeLink(layers.LinkTypeEthernet, b.buf[b.frames[0].off:][:b.frames[0].n], gopacket.CaptureInfo{})
	if !r.RoCE {
		t.Error("first frame is not RoCE")
	}
}

// FuzzProcess: any file is read by Process, serial and parallel, with
// Walk's records, output and error.
func FuzzProcess(f *testing.F) {
	ng, err := os.ReadFile(syntheticCapture)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(ng)
	frames := [][]byte{}
	for i := range 4 {
		frames = append(frames, make([]byte, 20+i*7))
	}
	f.Add(pcapBytes(binary.BigEndian, true, 65535, layers.LinkTypeEthernet, frames...))
	f.Add(pcapBytes(binary.LittleEndian, false, 128, layers.LinkTypeRaw, frames...))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(dir, "f")
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		smallBatches(t, 2, 64)
		want := referenceOutput(path, "", true, false)
		for _, jobs := range []int{1, 2} {
			if got := processOutput(path, "", jobs, true, false); got != want {
				t.Fatalf("jobs %d:\n got: %s\nwant: %s", jobs, got, want)
			}
		}
	})
}

// TestProcessStopsAtError: the first error fn returns ends Process, serial
// or parallel, with no further call and no goroutine left behind.
func TestProcessStopsAtError(t *testing.T) {
	smallBatches(t, 2, 1<<20)
	before := runtime.NumGoroutine()
	stop := errors.New("stop")
	for _, jobs := range []int{1, 4} {
		calls := 0
		err := Process(syntheticCapture, ProcessOptions{Jobs: jobs, Render: RenderJSON}, func(r *Record, _ []byte, _ error) error {
			calls++
			if r.Frame == 5 {
				return stop
			}
			return nil
		})
		if err != stop || calls != 5 {
			t.Errorf("jobs %d: %v after %d calls, want stop after 5", jobs, err, calls)
		}
	}
	for range 100 {
		if runtime.NumGoroutine() <= before {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Errorf("%d goroutines before, %d after", before, runtime.NumGoroutine())
}
