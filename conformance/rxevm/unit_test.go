package rxevm

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// readNewc parses a newc cpio stream (the test's own reader, independent
// of the writer) into name -> (mode, content).
func readNewc(t *testing.T, r io.Reader) (map[string]uint32, map[string]string, []string) {
	t.Helper()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	modes, data := map[string]uint32{}, map[string]string{}
	var order []string
	off := 0
	align := func() { off = (off + 3) &^ 3 }
	for {
		if off+110 > len(b) || string(b[off:off+6]) != "070701" {
			t.Fatalf("bad cpio header at %d", off)
		}
		field := func(i int) int {
			v, err := strconv.ParseUint(string(b[off+6+8*i:off+14+8*i]), 16, 32)
			if err != nil {
				t.Fatal(err)
			}
			return int(v)
		}
		mode, size, namesize := field(1), field(6), field(11)
		name := string(b[off+110 : off+110+namesize-1])
		off += 110 + namesize
		align()
		if name == "TRAILER!!!" {
			break
		}
		modes[name] = uint32(mode)
		data[name] = string(b[off : off+size])
		order = append(order, name)
		off += size
		align()
	}
	return modes, data, order
}

func TestCpioNewc(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	if err := os.WriteFile(src, []byte("from a file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tr := newTree()
	tr.addData("/etc/softroce/x", []byte("hello"), 0o644) // odd length: padding
	tr.addFile("usr/bin/tool", src, 0o755)
	tr.addSymlink("bin/sh", "busybox")
	tr.addCharDev("dev/console", 0o600, 5, 1)
	out := filepath.Join(dir, "a.cpio.gz")
	if err := tr.writeGzipCpio(out); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	modes, data, order := readNewc(t, zr)
	want := map[string]struct {
		mode uint32
		data string
	}{
		"etc":            {cpioDir | 0o755, ""},
		"etc/softroce":   {cpioDir | 0o755, ""},
		"etc/softroce/x": {cpioReg | 0o644, "hello"},
		"usr/bin/tool":   {cpioReg | 0o755, "from a file\n"},
		"bin/sh":         {cpioLink | 0o777, "busybox"},
		"dev/console":    {cpioChr | 0o600, ""},
		"usr":            {cpioDir | 0o755, ""},
		"usr/bin":        {cpioDir | 0o755, ""},
		"bin":            {cpioDir | 0o755, ""},
		"dev":            {cpioDir | 0o755, ""},
	}
	for n, w := range want {
		if modes[n] != w.mode || data[n] != w.data {
			t.Errorf("%s: mode %o data %q, want %o %q", n, modes[n], data[n], w.mode, w.data)
		}
	}
	if len(modes) != len(want) {
		t.Errorf("archive has %d members, want %d: %v", len(modes), len(want), order)
	}
	pos := map[string]int{}
	for i, n := range order {
		pos[n] = i
	}
	for n := range modes {
		if d := filepath.Dir(n); d != "." && pos[d] > pos[n] {
			t.Errorf("%s comes before its directory %s", n, d)
		}
	}
	// GNU cpio agrees, when it is installed.
	if _, err := exec.LookPath("cpio"); err == nil {
		raw, _ := os.ReadFile(out)
		zr, _ := gzip.NewReader(bytes.NewReader(raw))
		plain, _ := io.ReadAll(zr)
		cmd := exec.Command("cpio", "-it", "--quiet")
		cmd.Stdin = bytes.NewReader(plain)
		got, err := cmd.Output()
		if err != nil {
			t.Fatalf("cpio -it: %v", err)
		}
		if n := len(strings.Fields(string(got))); n != len(want) {
			t.Errorf("cpio -it lists %d members, want %d:\n%s", n, len(want), got)
		}
	}
}

func TestParseBW(t *testing.T) {
	out := `
************************************
* Waiting for client to connect... *
************************************
---------------------------------------------------------------------------------------
                    RDMA_Write BW Test
 Dual-port       : OFF		Device         : rxe0
---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
 65536      200              12.05              11.83  		   0.000189
 131072     200              13.00              12.50  		   0.000100
---------------------------------------------------------------------------------------
`
	res, err := ParseBW(out)
	if err != nil {
		t.Fatal(err)
	}
	want := []BWResult{
		{Bytes: 65536, Iterations: 200, PeakBW: 12.05, AvgBW: 11.83, MsgRate: 0.000189, Unit: "MB/sec"},
		{Bytes: 131072, Iterations: 200, PeakBW: 13, AvgBW: 12.5, MsgRate: 0.0001, Unit: "MB/sec"},
	}
	if fmt.Sprint(res) != fmt.Sprint(want) {
		t.Fatalf("got %+v\nwant %+v", res, want)
	}
	gb, err := ParseBW(" #bytes #iterations BW peak[Gb/sec] BW average[Gb/sec] MsgRate[Mpps]\n 4096 1000 1.5 1.25 0.038\n")
	if err != nil || gb[0].Unit != "Gb/sec" || gb[0].AvgBW != 1.25 {
		t.Fatalf("Gb/sec: %+v %v", gb, err)
	}
	for _, bad := range []string{"", "Couldn't connect to 10.88.0.2:18515\n", " #bytes #iterations BW peak[MB/sec] BW average[MB/sec] MsgRate[Mpps]\n 4096 1000 x 1 1\n"} {
		if _, err := ParseBW(bad); err == nil {
			t.Errorf("ParseBW(%q) accepted", bad)
		}
	}
}

func TestOwnerPid(t *testing.T) {
	for name, want := range map[string]int{
		"softroce-vm-123-4": 123, "softroce-vm-1-1": 1,
		"softroce-vm-x-1": 0, "softroce-vm-12": 0, "other-123-4": 0, "softroce-vm--1": 0,
	} {
		got, ok := ownerPid(name)
		if ok != (want != 0) || got != want {
			t.Errorf("ownerPid(%q) = %d, %v; want %d", name, got, ok, want)
		}
	}
	if !pidAlive(os.Getpid()) {
		t.Error("own pid not alive")
	}
}

func TestShellQuote(t *testing.T) {
	for _, s := range []string{"", "a b", "it's", `"$HOME" \n ;|&`, "'''"} {
		out, err := exec.Command("/bin/sh", "-c", "printf %s "+shellQuote(s)).Output()
		if err != nil || string(out) != s {
			t.Errorf("shellQuote(%q) round trip = %q, %v", s, out, err)
		}
	}
}

func TestKernelCmdlineEnv(t *testing.T) {
	vm := &VM{opts: Options{MTU: 9000, CommandPort: 7000, Env: map[string]string{"sr_x": "1"}}}
	c, err := vm.cmdline()
	if err != nil || !strings.Contains(c, " sr_mtu=9000 ") || !strings.HasSuffix(c, " sr_x=1") {
		t.Fatalf("cmdline = %q, %v", c, err)
	}
	for k, v := range map[string]string{"a.b": "1", "x": "two words", "": "v", "q": `"`} {
		vm.opts.Env = map[string]string{k: v}
		if _, err := vm.cmdline(); err == nil {
			t.Errorf("env %q=%q accepted", k, v)
		}
	}
}

func TestResolveIn(t *testing.T) {
	root := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(root, "lib/x86_64-linux-gnu"), 0o755))
	must(os.MkdirAll(filepath.Join(root, "lib64"), 0o755))
	must(os.WriteFile(filepath.Join(root, "lib/x86_64-linux-gnu/ld-2.36.so"), nil, 0o755))
	must(os.Symlink("ld-2.36.so", filepath.Join(root, "lib/x86_64-linux-gnu/ld-linux-x86-64.so.2")))
	// An absolute link must resolve inside root, not on the host.
	must(os.Symlink("/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", filepath.Join(root, "lib64/ld-linux-x86-64.so.2")))
	got, err := resolveIn(root, filepath.Join(root, "lib64/ld-linux-x86-64.so.2"))
	if err != nil || got != filepath.Join(root, "lib/x86_64-linux-gnu/ld-2.36.so") {
		t.Fatalf("resolveIn = %q, %v", got, err)
	}
	must(os.Symlink("loop", filepath.Join(root, "loop")))
	if _, err := resolveIn(root, filepath.Join(root, "loop")); err == nil {
		t.Fatal("symlink loop resolved")
	}
}

func TestSweepStale(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2's ip")
	}
	// A pid that has just exited stands for a killed test binary.
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("%s%d-1", NetnsPrefix, dead.Process.Pid)
	live := fmt.Sprintf("%s%d-99", NetnsPrefix, os.Getpid())
	for _, n := range []string{name, live} {
		if out, err := exec.Command("ip", "netns", "add", n).CombinedOutput(); err != nil {
			t.Fatalf("ip netns add: %v %s", err, out)
		}
	}
	defer exec.Command("ip", "netns", "del", live).Run()
	defer exec.Command("ip", "netns", "del", name).Run()
	// An orphan left running inside the stale namespace.
	orphan := exec.Command("ip", "netns", "exec", name, "sleep", "60")
	if err := orphan.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- orphan.Wait() }()
	time.Sleep(200 * time.Millisecond)
	// Every VM boot sweeps too, and other test packages boot VMs at the
	// same time: one of them may remove the stale namespace first, so 0
	// removed here is right when it is gone (checked next).
	n, err := SweepStale()
	if err != nil || n > 1 {
		t.Fatalf("SweepStale = %d, %v; want 1 removed (0 if a concurrent sweep got it)", n, err)
	}
	if _, err := os.Stat(filepath.Join(netnsDir, name)); err == nil {
		t.Fatal("stale namespace still exists")
	}
	if _, err := os.Stat(filepath.Join(netnsDir, live)); err != nil {
		t.Fatal("namespace of a live process was removed")
	}
	select {
	case <-waited:
	case <-time.After(5 * time.Second):
		t.Fatal("process in the stale namespace survived")
	}
}

func TestNotesHave(t *testing.T) {
	note := func(name string, typ uint32, desc []byte) []byte {
		var b []byte
		b = binary.LittleEndian.AppendUint32(b, uint32(len(name)+1))
		b = binary.LittleEndian.AppendUint32(b, uint32(len(desc)))
		b = binary.LittleEndian.AppendUint32(b, typ)
		b = append(b, name...)
		b = append(b, 0)
		for len(b)%4 != 0 {
			b = append(b, 0)
		}
		b = append(b, desc...)
		for len(b)%4 != 0 {
			b = append(b, 0)
		}
		return b
	}
	seg := append(note("GNU", 3, []byte{1, 2, 3, 4, 5}), note("Xen", 6, []byte("linux\x00"))...)
	withPVH := append(append([]byte(nil), seg...), note("Xen", xenElfnotePhys32Entry, []byte{0, 0, 0, 1})...)
	if notesHave(seg, binary.LittleEndian, "Xen", xenElfnotePhys32Entry) {
		t.Error("found a PVH note that is not there")
	}
	if !notesHave(withPVH, binary.LittleEndian, "Xen", xenElfnotePhys32Entry) {
		t.Error("missed the PVH note")
	}
	// Truncated or lying sizes end the scan without panicking.
	for i := range withPVH {
		notesHave(withPVH[:i], binary.LittleEndian, "Xen", xenElfnotePhys32Entry)
	}
	bad := binary.LittleEndian.AppendUint32(nil, 0xfffffff0)
	bad = append(bad, make([]byte, 8)...)
	if notesHave(bad, binary.LittleEndian, "Xen", 18) {
		t.Error("huge namesz accepted")
	}
}

// InHostRoot's command must reach the chrooted shell as one word, quotes
// and all: run the wrapped command with chroot replaced by a function
// that drops the root argument.
func TestInHostRootQuoting(t *testing.T) {
	inner := `printf '%s|' "a b" 'c'"'"'d'; echo`
	wrapped := InHostRoot(inner)
	if !strings.HasPrefix(wrapped, "chroot "+HostRoot+" /bin/sh -c ") {
		t.Fatalf("InHostRoot = %q, want a chroot into %s", wrapped, HostRoot)
	}
	// The inner shell's ulimit may fail here (not root): stdout only.
	script := `chroot() { shift; "$@"; }; ` + wrapped
	out, err := exec.Command("/bin/sh", "-c", script).Output()
	if err != nil {
		t.Fatalf("%s: %v\n%s", script, err, out)
	}
	if got, want := string(out), "a b|c'd|\n"; got != want {
		t.Fatalf("output %q, want %q", got, want)
	}
}

func TestHostRootDevices(t *testing.T) {
	args := strings.Join(hostRootDevices("/tmp/x/share"), " ")
	for _, s := range hostShares {
		if !strings.Contains(args, "path="+s[1]+",security_model=none,readonly=on") || !strings.Contains(args, "mount_tag="+s[0]) {
			t.Errorf("qemu arguments %q do not share %s read-only as %s", args, s[1], s[0])
		}
	}
	if !strings.Contains(args, "path=/tmp/x/share,security_model=none -device") || !strings.Contains(args, "mount_tag="+shareTag) {
		t.Errorf("qemu arguments %q do not share the scratch directory writable", args)
	}
}
