package rxevm

import (
	"debug/elf"
	"fmt"
	"os"
	"path/filepath"
)

// elfInfo reports the shared libraries an ELF file names in DT_NEEDED and
// its program interpreter ("" for static executables and libraries).
func elfInfo(file string) (needed []string, interp string, err error) {
	f, err := elf.Open(file)
	if err != nil {
		return nil, "", fmt.Errorf("read ELF %s: %w", file, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b := make([]byte, p.Filesz)
			if _, err := p.ReadAt(b, 0); err != nil {
				return nil, "", fmt.Errorf("read interpreter of %s: %w", file, err)
			}
			for len(b) > 0 && b[len(b)-1] == 0 {
				b = b[:len(b)-1]
			}
			interp = string(b)
		}
	}
	needed, err = f.ImportedLibraries()
	if err != nil {
		return nil, "", fmt.Errorf("read DT_NEEDED of %s: %w", file, err)
	}
	return needed, interp, nil
}

// libResolver finds shared libraries by soname in an ordered list of
// directories, the way the dynamic loader's default search path would.
// Absolute symlinks are resolved inside root (an unpacked package tree
// links e.g. /lib64/ld-linux-x86-64.so.2 to an absolute path that must not
// escape to the build host's own files); root "" means the host.
type libResolver struct {
	root string
	dirs []string
}

// find returns the real file (symlinks resolved) for soname.
func (r libResolver) find(soname string) (string, bool) {
	for _, d := range r.dirs {
		if real, err := resolveIn(r.root, filepath.Join(d, soname)); err == nil {
			return real, true
		}
	}
	return "", false
}

// resolveIn follows symlinks of the last path element of p, treating
// absolute link targets as relative to root, until it reaches a regular
// file.
func resolveIn(root, p string) (string, error) {
	for range 40 {
		st, err := os.Lstat(p)
		if err != nil {
			return "", err
		}
		if st.Mode().IsRegular() {
			return p, nil
		}
		if st.Mode()&os.ModeSymlink == 0 {
			return "", fmt.Errorf("%s is not a regular file", p)
		}
		target, err := os.Readlink(p)
		if err != nil {
			return "", err
		}
		if filepath.IsAbs(target) {
			p = filepath.Join(root, target)
		} else {
			p = filepath.Join(filepath.Dir(p), target)
		}
	}
	return "", fmt.Errorf("%s: too many levels of symbolic links", p)
}

// closure computes every library (soname -> host file) that roots need,
// transitively, skipping sonames for which have reports true. The
// interpreter paths seen are returned separately.
func (r libResolver) closure(roots []string, have func(soname string) bool) (libs map[string]string, interps map[string]bool, err error) {
	libs = map[string]string{}
	interps = map[string]bool{}
	queue := append([]string(nil), roots...)
	for len(queue) > 0 {
		f := queue[0]
		queue = queue[1:]
		needed, interp, err := elfInfo(f)
		if err != nil {
			return nil, nil, err
		}
		if interp != "" {
			interps[interp] = true
		}
		for _, so := range needed {
			if _, ok := libs[so]; ok || (have != nil && have(so)) {
				continue
			}
			p, ok := r.find(so)
			if !ok {
				return nil, nil, fmt.Errorf("%s needs %s, not found in %v", f, so, r.dirs)
			}
			libs[so] = p
			queue = append(queue, p)
		}
	}
	return libs, interps, nil
}
