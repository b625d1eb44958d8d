package main

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/softroce/softroce/abi"
)

// TestMain lets a test run the test binary as the softroce command, as
// softroce run does when it starts a private daemon (os.Executable).
func TestMain(m *testing.M) {
	if os.Getenv("SOFTROCE_TEST_AS_MAIN") == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

// softroce run -- ibv_devinfo with no daemon running: a private daemon is
// started for it, the program prints the device, the daemon is stopped.
func TestRunIbvDevinfoPrivateDaemon(t *testing.T) {
	if m := abi.Missing(); m != "" {
		t.Skip("cannot build softroce's libibverbs.so.1: " + m)
	}
	if _, err := exec.LookPath("ibv_devinfo"); err != nil {
		t.Skip("ibv_devinfo is not installed (Debian: apt-get install ibverbs-utils)")
	}
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	port := c.LocalAddr().(*net.UDPAddr).Port
	c.Close()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "none.sock")
	cmd := exec.Command(self, "run", "--socket", sock, "--addr", "127.0.0.1", "--udp-port", strconv.Itoa(port), "--", "ibv_devinfo")
	cmd.Env = append(os.Environ(), "SOFTROCE_TEST_AS_MAIN=1", "SOFTROCE_ABI_DIR="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("softroce run: %v\n%s", err, out)
	}
	for _, want := range []string{"hca_id:\tsoftroce0", "state:\t\t\tPORT_ACTIVE (4)", "link_layer:\t\tEthernet"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	t.Logf("%s", out)
}
