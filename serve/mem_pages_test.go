package serve

import (
	"testing"

	"golang.org/x/sys/unix"
)

// Two MRs of one client on the same page (two small malloc'd buffers)
// both map at the client's address, sharing the page; it stays mapped
// until the last of them goes. A different memfd page at an address the
// client already uses is mapped elsewhere.
func TestSharedPageMRsKeepClientAddress(t *testing.T) {
	fd, err := unix.MemfdCreate("t", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	unix.Ftruncate(fd, 2*pageSize)
	unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK)
	// An address free here: reserve and release it.
	a, err := mmap(0, 2*pageSize, unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS, -1, 0)
	if err != nil {
		t.Fatal(err)
	}
	munmap(a, 2*pageSize)
	va := uint64(a)
	pages := pageMap{}
	reg := func(addr, length uint64, off uint64) *clientMem {
		t.Helper()
		r := regMR{addr: addr, length: length, extents: []extent{{va: addr &^ (pageSize - 1), len: pageSize, off: off}}}
		m, err := mapClientMem(&r, []int{fd}, pages, nil)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	m1 := reg(va+16, 64, 0)
	m2 := reg(va+128, 64, 0)
	if m1.base != uintptr(va) || m2.base != uintptr(va) {
		t.Fatalf("MRs on one page mapped at 0x%x and 0x%x, want the client's 0x%x", m1.base, m2.base, va)
	}
	if pages[va].refs != 2 {
		t.Fatalf("page refs %d, want 2", pages[va].refs)
	}
	b := m2.buf(&regMR{addr: va + 128, length: 64})
	b[0] = 7
	m1.unmap()
	if b[0] != 7 || pages[va] == nil { // still mapped for m2
		t.Fatal("the page went with the first MR")
	}
	// Another memfd page at the same address cannot share it.
	m3 := reg(va+16, 64, pageSize)
	if m3.base == uintptr(va) {
		t.Fatal("a different memfd page was mapped over the shared one")
	}
	m3.unmap()
	m2.unmap()
	if len(pages) != 0 {
		t.Fatalf("pages left: %v", pages)
	}
	// The address is free again.
	got, err := mmap(uintptr(va), pageSize, unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_FIXED_NOREPLACE, -1, 0)
	if err != nil || got != uintptr(va) {
		t.Fatalf("page still mapped after the last MR: %v", err)
	}
	munmap(got, pageSize)
}
