// Package abi builds softroce's libibverbs.so.1, the thin C library that
// lets unmodified libibverbs programs use the daemon (package serve). The
// C sources are embedded, so the softroce binary can build the library
// anywhere gcc and the distribution's libibverbs-dev are installed
// (`softroce abi build`, or `make -C abi` in a checkout).
package abi

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

//go:embed c
var src embed.FS

// Header is the system header the library is compiled against.
const Header = "/usr/include/infiniband/verbs.h"

// Missing says what the build lacks (gcc, make, libibverbs-dev), or "".
func Missing() string {
	for _, t := range []string{"gcc", "make", "nm", "awk"} {
		if _, err := exec.LookPath(t); err != nil {
			return t + " is not installed (Debian: apt-get install gcc make binutils gawk)"
		}
	}
	if _, err := os.Stat(Header); err != nil {
		return Header + " is missing (Debian: apt-get install libibverbs-dev)"
	}
	return ""
}

// Version identifies the embedded sources: a build directory per version.
func Version() string {
	h := sha256.New()
	fs, _ := src.ReadDir("c")
	for _, f := range fs {
		b, _ := src.ReadFile("c/" + f.Name())
		fmt.Fprintf(h, "%s %d\n", f.Name(), len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// DefaultDir is where Build puts the library unless told otherwise:
// $SOFTROCE_ABI_DIR, else the user cache directory.
func DefaultDir() string {
	if d := os.Getenv("SOFTROCE_ABI_DIR"); d != "" {
		return d
	}
	c, err := os.UserCacheDir()
	if err != nil {
		c = os.TempDir()
	}
	return filepath.Join(c, "softroce", "abi", Version())
}

// Build writes the sources to dir, runs make there and returns the
// directory holding libibverbs.so.1 (dir/build). An existing library of
// the same sources is reused.
func Build(dir string) (string, error) {
	if m := Missing(); m != "" {
		return "", errors.New("abi: cannot build libibverbs.so.1: " + m)
	}
	out := filepath.Join(dir, "build")
	if _, err := os.Stat(filepath.Join(out, "libibverbs.so.1")); err == nil {
		return out, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	fs, _ := src.ReadDir("c")
	for _, f := range fs {
		b, _ := src.ReadFile("c/" + f.Name())
		if err := os.WriteFile(filepath.Join(dir, f.Name()), b, 0o644); err != nil {
			return "", err
		}
	}
	cmd := exec.Command("make", "-C", dir, "B="+out)
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("abi: make: %v\n%s", err, b)
	}
	return out, nil
}
