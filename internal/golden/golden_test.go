package golden

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// TestWriteRead records the CM capture's golden fields with tshark and
// reads them back: the fields line and one row a frame, the same rows as
// the committed file when tshark is the version that recorded it.
func TestWriteRead(t *testing.T) {
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		t.Skip("tshark not installed")
	}
	const pcap, committed = "../../inspect/testdata/rxe-cm/rxe-cm.pcap", "../../inspect/testdata/rxe-cm/rxe-cm.tshark"
	version, err := Version(tshark)
	if err != nil || !strings.Contains(version, "TShark") {
		t.Fatalf("version %q: %v", version, err)
	}
	path := filepath.Join(t.TempDir(), "cm.tshark")
	if err := Write(tshark, version, pcap, path, CMTsharkFields); err != nil {
		t.Fatal(err)
	}
	fields, rows, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(fields, CMTsharkFields) || len(rows) == 0 {
		t.Fatalf("read back %d fields, %d rows", len(fields), len(rows))
	}
	want, err := os.ReadFile(committed)
	if err != nil {
		t.Fatal(err)
	}
	if first, _, _ := strings.Cut(string(want), "\n"); first != "# "+version {
		t.Skipf("committed fields recorded by %q, this is %q", first, version)
	}
	_, wantRows, err := Read(committed)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(rows, wantRows) {
		t.Errorf("rows differ from %s", committed)
	}
}
