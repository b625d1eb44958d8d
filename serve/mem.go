package serve

import (
	"fmt"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// shm is a shared mapping the daemon created: a memfd of fixed size it
// maps once and hands to a client. The daemon created the file, so a
// client cannot shrink it under the daemon's feet (it could ftruncate its
// own descriptor: the memfd is sealed against shrinking first).
type shm struct {
	b  []byte
	fd int // closed once sent
}

func newShm(name string, size int) (*shm, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("ftruncate: %w", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("seal: %w", err)
	}
	b, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("mmap: %w", err)
	}
	return &shm{b: b, fd: fd}, nil
}

func (m *shm) closeFD() {
	if m.fd >= 0 {
		unix.Close(m.fd)
		m.fd = -1
	}
}

func (m *shm) free() {
	m.closeFD()
	if m.b != nil {
		unix.Munmap(m.b)
		m.b = nil
	}
}

// Shared indices and flags are read and written atomically: the other
// side is another process.
func load32(b []byte, off int) uint32 {
	return atomic.LoadUint32((*uint32)(unsafe.Pointer(&b[off])))
}

func store32(b []byte, off int, v uint32) {
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&b[off])), v)
}

func cas32(b []byte, off int, old, v uint32) bool {
	return atomic.CompareAndSwapUint32((*uint32)(unsafe.Pointer(&b[off])), old, v)
}

// clientMem is a client's registered range mapped into the daemon: a
// reservation of the page-rounded range with each run of its memfd
// extents mapped over its part. The daemon maps it at the client's own
// address when that address is free here (and pages of two MRs can be
// shared); otherwise anywhere. Either way verbs registers it at the
// client's VA (its address or IOVA), which peers and local SGEs use.
//
// Every mapping is a VMA of the daemon, of which the kernel allows
// vm.max_map_count: the daemon charges each MR the VMAs it can occupy
// (Limits.MappingsPerUser) and never splits one. Contiguous extents (the
// same memfd at contiguous offsets) are one mmap; a range is unmapped
// whole, never a page inside a mapping.
type clientMem struct {
	base   uintptr // daemon address of the page-rounded start
	length uintptr // page-rounded length
	pages  pageMap // set when mapped at the client's address: pages shared by reference
	maps   int     // the mappings charged (not at the client's address)
}

// pageMap is a client's pages mapped at its own addresses in the daemon,
// by address. Two MRs of one process often share a page (small malloc'd
// buffers): the second reuses the first's mapping of the same memfd page,
// so both keep the program's addresses (what a peer's RDMA uses).
//
// Each mmap made there is a mapCall, unmapped whole when no MR uses a
// page of it any more: unmapping a page inside it would split its VMA,
// which no charge made when it was mapped accounts for. A page of a call
// still mapped for another page's MR stays, unreferenced, and is reused
// when an MR registers the same memfd page there again.
type pageMap map[uint64]*pageRef

type pageRef struct {
	dev, ino, off uint64 // the memfd page mapped there
	refs          int    // the MRs using the page
	call          *mapCall
}

// mapCall is one mmap at the client's addresses: one charged mapping.
type mapCall struct {
	addr, length uint64
	refs         int // page references of all its pages
}

// mapClientMem checks the extents and fds of a REG_MR and maps them.
// charge (nil: none) is asked for the mappings it is about to make; its
// error refuses the request. It never keeps the fds: the caller closes
// them, holding no lock (see regMRRequest). It runs without the device
// lock: pages is the client's.
func mapClientMem(r *regMR, fds []int, pages pageMap, charge func(n int) error) (*clientMem, error) {
	if r.length == 0 || r.addr+r.length < r.addr {
		return nil, fmt.Errorf("%w: MR range 0x%x+%d", syscall.EINVAL, r.addr, r.length)
	}
	ps := r.addr &^ (pageSize - 1)
	pe := (r.addr + r.length + pageSize - 1) &^ (pageSize - 1)
	if pe < ps || pe == 0 {
		return nil, fmt.Errorf("%w: MR range overflows", syscall.EINVAL)
	}
	if len(fds) != len(r.extents) {
		return nil, fmt.Errorf("%w: %d extents but %d descriptors", syscall.EINVAL, len(r.extents), len(fds))
	}
	if charge == nil {
		charge = func(int) error { return nil }
	}
	at := ps
	st := make([]unix.Stat_t, len(r.extents))
	for i, e := range r.extents {
		if e.va != at || e.len == 0 || e.len%pageSize != 0 || e.off%pageSize != 0 || e.va+e.len < e.va || e.off+e.len < e.off {
			return nil, fmt.Errorf("%w: extent %d (va 0x%x len %d off %d) does not tile the range", syscall.EINVAL, i, e.va, e.len, e.off)
		}
		seals, err := unix.FcntlInt(uintptr(fds[i]), unix.F_GET_SEALS, 0)
		if err != nil || seals&unix.F_SEAL_SHRINK == 0 {
			return nil, fmt.Errorf("%w: extent %d is not a memfd sealed against shrinking", syscall.EINVAL, i)
		}
		if err := unix.Fstat(fds[i], &st[i]); err != nil || st[i].Mode&unix.S_IFMT != unix.S_IFREG {
			return nil, fmt.Errorf("%w: extent %d is not a memfd", syscall.EINVAL, i)
		}
		if uint64(st[i].Size) < e.off+e.len {
			return nil, fmt.Errorf("%w: extent %d's memfd is smaller than off+len", syscall.EINVAL, i)
		}
		at += e.len
	}
	if at != pe {
		return nil, fmt.Errorf("%w: extents cover 0x%x..0x%x, not the page range 0x%x..0x%x", syscall.EINVAL, ps, at, ps, pe)
	}
	ext, fds, st := coalesce(r.extents, fds, st)
	if pages != nil {
		m, err := mapDirect(ps, pe, ext, fds, st, pages, charge)
		if m != nil || err != nil {
			return m, err
		}
	}
	// Each run is one VMA, the reservation under it replaced whole; while
	// they are mapped in order, the runs mapped and the reservation's rest
	// are at most len(ext) VMAs too.
	if err := charge(len(ext)); err != nil {
		return nil, err
	}
	n := uintptr(pe - ps)
	// Same address as the client when it is free here.
	base, err := mmap(uintptr(ps), n, unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE|unix.MAP_FIXED_NOREPLACE, -1, 0)
	if err != nil || base != uintptr(ps) {
		if err == nil {
			munmap(base, n) // an old kernel took the hint as a hint
		}
		base, err = mmap(0, n, unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE, -1, 0)
		if err != nil {
			charge(-len(ext))
			return nil, fmt.Errorf("%w: reserve %d bytes: %v", syscall.ENOMEM, n, err)
		}
	}
	m := &clientMem{base: base, length: n, maps: len(ext)}
	for i, e := range ext {
		if _, err := mmap(m.base+uintptr(e.va-ps), uintptr(e.len), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_FIXED, fds[i], int64(e.off)); err != nil {
			charge(-m.unmap())
			return nil, fmt.Errorf("%w: map extent %d: %v", syscall.ENOMEM, i, err)
		}
	}
	return m, nil
}

// coalesce merges extents that continue the one before in the same memfd
// (the same file at the next offset): one mmap maps them.
func coalesce(ext []extent, fds []int, st []unix.Stat_t) ([]extent, []int, []unix.Stat_t) {
	if len(ext) < 2 {
		return ext, fds, st
	}
	oe := []extent{ext[0]}
	of := []int{fds[0]}
	ost := []unix.Stat_t{st[0]}
	for i := 1; i < len(ext); i++ {
		l := &oe[len(oe)-1]
		p := &ost[len(ost)-1]
		if st[i].Dev == p.Dev && st[i].Ino == p.Ino && ext[i].off == l.off+l.len && ext[i].va == l.va+l.len {
			l.len += ext[i].len
			continue
		}
		oe, of, ost = append(oe, ext[i]), append(of, fds[i]), append(ost, st[i])
	}
	return oe, of, ost
}

// buf is the registered bytes: [addr, addr+length) of the client, here.
func (m *clientMem) buf(r *regMR) []byte {
	ps := r.addr &^ (pageSize - 1)
	return unsafe.Slice((*byte)(ptr(m.base+uintptr(r.addr-ps))), int(r.length))
}

// mapDirect maps the range at the client's own addresses, reusing the
// client's pages already there when they hold the same memfd pages. It
// returns nil, having changed nothing, when some page is taken otherwise
// (or an error when charge refuses the mappings it needs).
func mapDirect(ps, pe uint64, ext []extent, fds []int, st []unix.Stat_t, pages pageMap, charge func(int) error) (*clientMem, error) {
	calls := 0
	for i, e := range ext {
		for pa := e.va; pa < e.va+e.len; pa += pageSize {
			p := pages[pa]
			if p != nil && (p.dev != st[i].Dev || p.ino != st[i].Ino || p.off != e.off+(pa-e.va)) {
				return nil, nil
			}
			if p == nil && (pa == e.va || pages[pa-pageSize] != nil) {
				calls++ // a run of pages not mapped yet starts here
			}
		}
	}
	if err := charge(calls); err != nil {
		return nil, err
	}
	var added []*mapCall
	undo := func() {
		for _, c := range added {
			munmap(uintptr(c.addr), uintptr(c.length))
			for x := c.addr; x < c.addr+c.length; x += pageSize {
				delete(pages, x)
			}
		}
		charge(-calls)
	}
	for i, e := range ext {
		for pa := e.va; pa < e.va+e.len; {
			if pages[pa] != nil {
				pa += pageSize
				continue
			}
			end := pa
			for end < e.va+e.len && pages[end] == nil {
				end += pageSize
			}
			got, err := mmap(uintptr(pa), uintptr(end-pa), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_FIXED_NOREPLACE,
				fds[i], int64(e.off+(pa-e.va)))
			if err != nil || got != uintptr(pa) {
				if err == nil {
					munmap(got, uintptr(end-pa)) // an old kernel took the hint as a hint
				}
				undo()
				return nil, nil
			}
			c := &mapCall{addr: pa, length: end - pa}
			for x := pa; x < end; x += pageSize {
				pages[x] = &pageRef{dev: st[i].Dev, ino: st[i].Ino, off: e.off + (x - e.va), call: c}
			}
			added = append(added, c)
			pa = end
		}
	}
	for pa := ps; pa < pe; pa += pageSize {
		p := pages[pa]
		p.refs++
		p.call.refs++
	}
	return &clientMem{base: uintptr(ps), length: uintptr(pe - ps), pages: pages}, nil
}

// unmap unmaps what the range no longer shares and returns how many
// charged mappings went.
func (m *clientMem) unmap() int {
	if m.base == 0 {
		return 0
	}
	n := 0
	if m.pages != nil {
		for pa := uint64(m.base); pa < uint64(m.base+m.length); pa += pageSize {
			p := m.pages[pa]
			if p == nil {
				continue
			}
			p.refs--
			if c := p.call; c != nil {
				if c.refs--; c.refs == 0 {
					munmap(uintptr(c.addr), uintptr(c.length))
					for x := c.addr; x < c.addr+c.length; x += pageSize {
						delete(m.pages, x)
					}
					n++
				}
			}
		}
		m.base = 0
		return n
	}
	munmap(m.base, m.length)
	m.base = 0
	return m.maps
}

// mmap and munmap work on addresses outside Go's heap, as numbers.
func mmap(addr, n uintptr, prot, flags, fd int, off int64) (uintptr, error) {
	r, _, e := unix.Syscall6(unix.SYS_MMAP, addr, n, uintptr(prot), uintptr(flags), uintptr(fd), uintptr(off))
	if e != 0 {
		return 0, e
	}
	return r, nil
}

func munmap(addr, n uintptr) { unix.Syscall(unix.SYS_MUNMAP, addr, n, 0) }

// ptr turns the address of memory the daemon mapped (never Go's heap)
// into a pointer.
func ptr(u uintptr) unsafe.Pointer { return *(*unsafe.Pointer)(unsafe.Pointer(&u)) }
