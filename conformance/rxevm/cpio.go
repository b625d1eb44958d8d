package rxevm

import (
	"bufio"
	"compress/gzip"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"
)

// entry is one member of an initramfs archive. Exactly one of src, data or
// link describes the content of a regular file or symlink.
type entry struct {
	name  string      // path inside the guest, without a leading slash
	mode  fs.FileMode // permission bits plus type (fs.ModeDir, fs.ModeSymlink, fs.ModeCharDevice)
	src   string      // host file to copy (regular files)
	data  []byte      // literal content (regular files)
	link  string      // target (symlinks)
	major uint32      // device numbers (character devices)
	minor uint32
}

// tree is the content of an initramfs before it is written. Parent
// directories are implied and created on write.
type tree struct {
	entries map[string]*entry
}

func newTree() *tree { return &tree{entries: map[string]*entry{}} }

func clean(p string) string { return strings.TrimPrefix(path.Clean("/"+p), "/") }

func (t *tree) has(p string) bool { _, ok := t.entries[clean(p)]; return ok }

func (t *tree) addFile(guest, src string, perm fs.FileMode) {
	t.entries[clean(guest)] = &entry{name: clean(guest), mode: perm, src: src}
}

func (t *tree) addData(guest string, data []byte, perm fs.FileMode) {
	t.entries[clean(guest)] = &entry{name: clean(guest), mode: perm, data: data}
}

func (t *tree) addSymlink(guest, target string) {
	t.entries[clean(guest)] = &entry{name: clean(guest), mode: fs.ModeSymlink | 0o777, link: target}
}

func (t *tree) addDir(guest string, perm fs.FileMode) {
	t.entries[clean(guest)] = &entry{name: clean(guest), mode: fs.ModeDir | perm}
}

func (t *tree) addCharDev(guest string, perm fs.FileMode, major, minor uint32) {
	t.entries[clean(guest)] = &entry{name: clean(guest), mode: fs.ModeCharDevice | fs.ModeDevice | perm, major: major, minor: minor}
}

// names returns every member path, including implied parent directories,
// sorted so that a directory always precedes its content (the kernel's
// unpacker creates paths in archive order).
func (t *tree) names() []string {
	for name := range t.entries {
		for d := path.Dir(name); d != "." && d != "/"; d = path.Dir(d) {
			if _, ok := t.entries[d]; !ok {
				t.entries[d] = &entry{name: d, mode: fs.ModeDir | 0o755}
			}
		}
	}
	out := make([]string, 0, len(t.entries))
	for n := range t.entries {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// writeGzipCpio writes the tree as a gzip-compressed cpio archive in the
// "newc" format, the one format the kernel's initramfs unpacker reads
// (Documentation/driver-api/early-userspace/buffer-format.rst). All
// timestamps and owners are zero so that the archive is reproducible.
func (t *tree) writeGzipCpio(file string) error {
	f, err := os.Create(file)
	if err != nil {
		return fmt.Errorf("create %s: %w", file, err)
	}
	bw := bufio.NewWriterSize(f, 1<<20)
	zw := gzip.NewWriter(bw)
	cw := &cpioWriter{w: zw}
	for _, n := range t.names() {
		if err := cw.add(t.entries[n]); err != nil {
			f.Close()
			return fmt.Errorf("write %s into %s: %w", n, file, err)
		}
	}
	if err := cw.trailer(); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", file, err)
	}
	if err := zw.Close(); err != nil {
		f.Close()
		return fmt.Errorf("compress %s: %w", file, err)
	}
	if err := bw.Flush(); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", file, err)
	}
	return f.Close()
}

type cpioWriter struct {
	w   io.Writer
	ino uint32
	n   int64
}

// Mode bits of the cpio header (the traditional stat(2) encoding).
const (
	cpioDir  = 0o040000
	cpioReg  = 0o100000
	cpioLink = 0o120000
	cpioChr  = 0o020000
)

func (c *cpioWriter) write(b []byte) error {
	n, err := c.w.Write(b)
	c.n += int64(n)
	return err
}

func (c *cpioWriter) pad() error {
	if r := c.n % 4; r != 0 {
		return c.write(make([]byte, 4-r))
	}
	return nil
}

func (c *cpioWriter) header(name string, mode uint32, nlink uint32, size int64, rmaj, rmin uint32) error {
	c.ino++
	h := fmt.Sprintf("070701%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x",
		c.ino, mode, 0, 0, nlink, 0, uint32(size), 0, 0, rmaj, rmin, len(name)+1, 0)
	if err := c.write([]byte(h)); err != nil {
		return err
	}
	if err := c.write(append([]byte(name), 0)); err != nil {
		return err
	}
	return c.pad()
}

func (c *cpioWriter) add(e *entry) error {
	perm := uint32(e.mode.Perm())
	switch {
	case e.mode.IsDir():
		return c.header(e.name, cpioDir|perm, 2, 0, 0, 0)
	case e.mode&fs.ModeSymlink != 0:
		if err := c.header(e.name, cpioLink|perm, 1, int64(len(e.link)), 0, 0); err != nil {
			return err
		}
		if err := c.write([]byte(e.link)); err != nil {
			return err
		}
		return c.pad()
	case e.mode&fs.ModeCharDevice != 0:
		return c.header(e.name, cpioChr|perm, 1, 0, e.major, e.minor)
	}
	data := e.data
	if e.src != "" {
		b, err := os.ReadFile(e.src)
		if err != nil {
			return err
		}
		data = b
	}
	if int64(len(data)) > 0xffffffff {
		return fmt.Errorf("file too large for cpio newc: %d bytes", len(data))
	}
	if err := c.header(e.name, cpioReg|perm, 1, int64(len(data)), 0, 0); err != nil {
		return err
	}
	if err := c.write(data); err != nil {
		return err
	}
	return c.pad()
}

func (c *cpioWriter) trailer() error {
	return c.header("TRAILER!!!", 0, 1, 0, 0, 0)
}
