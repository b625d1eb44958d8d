package icrc

import (
	"encoding/hex"
	"encoding/json"
	"os"
	"testing"
)

// sharedDir holds further real captures and vectors, outside the
// repository: the tests that read it are extra checks beside the
// known-answer captures in testdata/rxe, and skip with a message starting
// "shared captures absent:" when it is missing. SOFTROCE_SHARED_CAPTURES
// names another place for it.
var sharedDir = sharedCaptureDir()

func sharedCaptureDir() string {
	if d := os.Getenv("SOFTROCE_SHARED_CAPTURES"); d != "" {
		return d
	}
	return "../../shared/captures"
}

func TestSharedVectors(t *testing.T) {
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
	if len(vecs) == 0 {
		t.Fatal("no vectors")
	}
	for _, v := range vecs {
		frame, err := hex.DecodeString(v.Frame)
		if err != nil {
			t.Fatal(err)
		}
		ip := frame[14:]
		ihl := int(ip[0]&0x0f) * 4
		tot := int(ip[2])<<8 | int(ip[3])
		got, err := IPv4(ip[:ihl], ip[ihl:tot])
		if err != nil {
			t.Fatalf("%s: %v", v.Name, err)
		}
		want := Wire(ip[:tot])
		if got != want {
			t.Errorf("%s: computed %08x, wire %08x (%s)", v.Name, got, want, v.Wire)
		}
	}
}
