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

// With the library cache somewhere this user cannot write (a system
// user's HOME), softroce run names the directory and the variable that
// moves it. Under a regular file, mkdir fails for root too.
func TestRunUnwritableLibraryCache(t *testing.T) {
	if m := abi.Missing(); m != "" {
		t.Skip("cannot build softroce's libibverbs.so.1: " + m)
	}
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		env  []string
		want string
	}{
		{[]string{"SOFTROCE_ABI_DIR=", "XDG_CACHE_HOME=" + file}, "set SOFTROCE_ABI_DIR to a directory this user can write"},
		{[]string{"SOFTROCE_ABI_DIR=" + filepath.Join(file, "abi")}, "SOFTROCE_ABI_DIR names it"},
	} {
		for _, kv := range c.env {
			k, v, _ := strings.Cut(kv, "=")
			t.Setenv(k, v)
		}
		var code int
		_, errOut := runOut(t, func() { code = run([]string{"run", "--", "true"}) })
		if code != 1 || !strings.Contains(errOut, "cannot write the library cache "+file) || !strings.Contains(errOut, c.want) {
			t.Errorf("softroce run with %v: exit %d, want 1 naming the cache under %s and %q:\n%s", c.env, code, file, c.want, errOut)
		}
	}
}
