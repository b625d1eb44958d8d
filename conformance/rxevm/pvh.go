package rxevm

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// xenElfnotePhys32Entry is the ELF note (owner "Xen") that marks a kernel
// with a PVH entry point (CONFIG_PVH). qemu boots such an uncompressed
// vmlinux directly, in 32-bit protected mode: no firmware real-mode loader
// and, above all, no in-guest decompression, which under TCG costs
// several seconds per boot (Debian compresses its bzImage with xz).
const xenElfnotePhys32Entry = 18

// extractPVH writes the vmlinux inside bzImage to out when it is an
// xz-compressed kernel with a PVH entry point. It needs the xz tool.
func extractPVH(ctx context.Context, bzImage, out string) error {
	data, err := os.ReadFile(bzImage)
	if err != nil {
		return err
	}
	i := bytes.Index(data, []byte("\xfd7zXZ\x00"))
	if i < 0 {
		return errors.New("no xz stream in the kernel image")
	}
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "xz", "-dc", "--single-stream")
	cmd.Stdin = bytes.NewReader(data[i:])
	cmd.Stdout = f
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err = cmd.Run()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(out)
		return fmt.Errorf("xz -d: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	ok, err := hasPVHEntry(out)
	if err == nil && !ok {
		err = errors.New("vmlinux has no PVH entry note")
	}
	if err != nil {
		os.Remove(out)
		return err
	}
	return nil
}

// hasPVHEntry reports whether the ELF file carries the Xen PHYS32_ENTRY
// note.
func hasPVHEntry(file string) (bool, error) {
	f, err := elf.Open(file)
	if err != nil {
		return false, err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type != elf.PT_NOTE {
			continue
		}
		b := make([]byte, p.Filesz)
		if _, err := p.ReadAt(b, 0); err != nil {
			return false, err
		}
		if notesHave(b, f.ByteOrder, "Xen", xenElfnotePhys32Entry) {
			return true, nil
		}
	}
	return false, nil
}

// notesHave scans an ELF note segment (namesz, descsz, type, name, desc;
// name and desc padded to 4 bytes) for a note of the given owner and type.
func notesHave(b []byte, bo binary.ByteOrder, owner string, typ uint32) bool {
	pad := func(n uint32) uint64 { return (uint64(n) + 3) &^ 3 }
	for len(b) >= 12 {
		namesz, descsz, t := bo.Uint32(b), bo.Uint32(b[4:]), bo.Uint32(b[8:])
		b = b[12:]
		if pad(namesz) > uint64(len(b)) {
			return false
		}
		name := string(bytes.TrimRight(b[:namesz], "\x00"))
		b = b[pad(namesz):]
		if pad(descsz) > uint64(len(b)) {
			return false
		}
		b = b[pad(descsz):]
		if name == owner && t == typ {
			return true
		}
	}
	return false
}
