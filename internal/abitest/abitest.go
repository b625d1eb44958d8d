// Package abitest is for tests that run the distribution's RDMA tools on
// softroce's C libraries: it builds them once per test binary.
package abitest

import (
	"os"
	"os/exec"
	"sync"
	"testing"

	"github.com/softroce/softroce/abi"
)

var (
	once sync.Once
	dir  string
	err  error
)

// Tool skips the test unless softroce's libibverbs.so.1 can be built and
// the program name is installed (pkg: the Debian package that has it), and
// returns the program's path and the directory of the built library.
func Tool(t testing.TB, name, pkg string) (path, lib string) {
	t.Helper()
	if m := abi.Missing(); m != "" {
		t.Skip("cannot build softroce's libibverbs.so.1: " + m)
	}
	p, lerr := exec.LookPath(name)
	if lerr != nil {
		t.Skipf("%s is not installed (Debian: apt-get install %s)", name, pkg)
	}
	once.Do(func() {
		d, e := os.MkdirTemp("", "softroce-abi-test-")
		if e != nil {
			err = e
			return
		}
		dir, err = abi.Build(d)
	})
	if err != nil {
		t.Fatal(err)
	}
	return p, dir
}
