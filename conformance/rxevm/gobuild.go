package rxevm

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// BuildStaticGo builds the Go package pkg (e.g. "./cmd/softroce") of the
// module in dir into a static executable at out (CGO_ENABLED=0), ready to
// be shipped into the guest as a File: the guest has a glibc, but a static
// binary depends on nothing in it.
func BuildStaticGo(ctx context.Context, dir, pkg, out string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", out, pkg)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build static %s: %w: %s", pkg, err, strings.TrimSpace(string(b)))
	}
	needed, interp, err := elfInfo(out)
	if err != nil {
		return err
	}
	if interp != "" || len(needed) > 0 {
		return fmt.Errorf("build static %s: result is dynamically linked (%s %v)", pkg, interp, needed)
	}
	return nil
}
