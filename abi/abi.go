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
	"sort"
	"strings"
	"syscall"
)

//go:embed c
var src embed.FS

// Header is the system header the library is compiled against.
const Header = "/usr/include/infiniband/verbs.h"

// RDMACMHeader is the one librdmacm.so.1 is compiled against.
const RDMACMHeader = "/usr/include/rdma/rdma_cma.h"

// Missing says what the build lacks (gcc, binutils, libibverbs-dev), or "".
func Missing() string {
	for _, t := range []string{"gcc", "nm", "awk", "sh"} {
		if _, err := exec.LookPath(t); err != nil {
			return t + " is not installed (Debian: apt-get install gcc binutils mawk)"
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

// cacheError says which directory the library could not be written to and
// how to choose another: a bare "mkdir /nonexistent: permission denied"
// (HOME of a system user) names neither.
func cacheError(dir string, err error) error {
	how := "set SOFTROCE_ABI_DIR to a directory this user can write, or XDG_CACHE_HOME (the default is under $XDG_CACHE_HOME or $HOME/.cache)"
	if os.Getenv("SOFTROCE_ABI_DIR") != "" {
		how = "SOFTROCE_ABI_DIR names it: point it at a directory this user can write"
	}
	return fmt.Errorf("abi: cannot write the library cache %s: %v; %s", dir, err, how)
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
		return "", cacheError(dir, err)
	}
	// Two programs started at once build once: the second waits.
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", cacheError(dir, err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", err
	}
	if _, err := os.Stat(filepath.Join(out, "libibverbs.so.1")); err == nil {
		return out, nil
	}
	fs, _ := src.ReadDir("c")
	for _, f := range fs {
		b, _ := src.ReadFile("c/" + f.Name())
		if err := os.WriteFile(filepath.Join(dir, f.Name()), b, 0o644); err != nil {
			return "", err
		}
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return "", err
	}
	// The steps of c/Makefile, run here so that building needs no make.
	run := func(name string, args ...string) ([]byte, error) {
		cmd := exec.Command(name, args...)
		cmd.Dir = dir
		b, err := cmd.CombinedOutput()
		if err != nil {
			return nil, fmt.Errorf("abi: %s %s: %v\n%s", name, strings.Join(args, " "), err, b)
		}
		return b, nil
	}
	cflags := []string{"-O2", "-g", "-Wall", "-Wextra", "-fPIC", "-fvisibility=hidden", "-std=gnu11"}
	if _, err := run("sh", "gen.sh", "compat", "libibverbs_exports.txt", out); err != nil {
		return "", err
	}
	obj := filepath.Join(out, "verbs.o")
	if _, err := run("gcc", append(cflags, "-I"+out, "-c", "verbs.c", "-o", obj)...); err != nil {
		return "", err
	}
	syms, err := run("nm", "-g", "--defined-only", obj)
	if err != nil {
		return "", err
	}
	var impl []string
	for _, l := range strings.Split(string(syms), "\n") {
		if f := strings.Fields(l); len(f) == 3 {
			impl = append(impl, f[2])
		}
	}
	sort.Strings(impl)
	implPath := filepath.Join(out, "implemented.txt")
	if err := os.WriteFile(implPath, []byte(strings.Join(impl, "\n")+"\n"), 0o644); err != nil {
		return "", err
	}
	if _, err := run("sh", "gen.sh", "libibverbs_exports.txt", "stubs.txt", implPath, out); err != nil {
		return "", err
	}
	stubs := filepath.Join(out, "stubs.o")
	if _, err := run("gcc", append(cflags, "-c", filepath.Join(out, "stubs.c"), "-o", stubs)...); err != nil {
		return "", err
	}
	lib := filepath.Join(out, "libibverbs.so.1")
	tmp := lib + ".tmp"
	if _, err := run("gcc", "-shared", "-Wl,-soname,libibverbs.so.1", "-Wl,--version-script="+filepath.Join(out, "libibverbs.map"),
		"-Wl,-z,now", "-o", tmp, obj, stubs, "-lpthread"); err != nil {
		return "", err
	}
	// librdmacm.so.1 first (serve/cm.go's CM behind rdma_cm): the
	// directory is complete once libibverbs.so.1 is in place.
	if err := buildRDMACM(dir, out, run, cflags); err != nil {
		return "", err
	}
	// Renamed into place last: a library that exists is a complete one.
	if err := os.Rename(tmp, lib); err != nil {
		return "", err
	}
	return out, nil
}

// buildRDMACM compiles c/rdmacm.c into out/librdmacm.so.1 (the steps of
// c/Makefile's librdmacm target).
func buildRDMACM(dir, out string, run func(string, ...string) ([]byte, error), cflags []string) error {
	if _, err := os.Stat(RDMACMHeader); err != nil {
		return nil // no librdmacm-dev: libibverbs.so.1 alone (rdma_cm programs then find no softroce device)
	}
	m := filepath.Join(out, "librdmacm.map")
	if _, err := run("sh", "rdmacm_map.sh", "librdmacm_exports.txt", m); err != nil {
		return err
	}
	obj := filepath.Join(out, "rdmacm.o")
	if _, err := run("gcc", append(cflags, "-c", "rdmacm.c", "-o", obj)...); err != nil {
		return err
	}
	lib := filepath.Join(out, "librdmacm.so.1")
	if _, err := run("gcc", "-shared", "-Wl,-soname,librdmacm.so.1", "-Wl,--version-script="+m, "-Wl,-z,now",
		"-o", lib+".tmp", obj, "-libverbs", "-lpthread"); err != nil {
		return err
	}
	return os.Rename(lib+".tmp", lib)
}
