package serve

import (
	"testing"

	"golang.org/x/sys/unix"
)

// Two clients register the same address: the second one's bytes are
// mapped elsewhere in the daemon, yet its MR keeps the client's VA (what
// peers and its SGEs use), and so does an MR registered at an IOVA.
func TestMRMappedElsewhereKeepsClientVA(t *testing.T) {
	s := startPipe(t)
	const addr, iova = 0x7e0000000000, 0x5000
	for i, c := range []struct {
		op   uint32
		want uint64
	}{{opRegMR, addr + 100}, {opRegMR, addr + 100}, {opRegMRIOVA, iova}} {
		cl := newClient(s, nil)
		cl.dev, cl.bell = s.devs[0], -1
		if _, _, err := cl.handle(u32s(opAllocPD, 0), nil); err != nil {
			t.Fatal(err)
		}
		fd, err := unix.Dup(memfd(t, 4096, true)) // handle closes it
		if err != nil {
			t.Fatal(err)
		}
		body := regMRBody(1, addr+100, 200, extent{addr, 4096, 0})
		if c.op == opRegMRIOVA {
			body = regMRIOVABody(1, addr+100, 200, iova, 1, extent{addr, 4096, 0})
		}
		if _, _, err := cl.handle(append(u32s(c.op, 0), body...), []int{fd}); err != nil {
			t.Fatalf("%d: %v", i, err)
		}
		o := cl.mrs[2]
		if got := o.mr.Addr(); got != c.want || o.addr != c.want || o.daddr != c.want {
			t.Errorf("%d: verbs VA %#x (addr %#x, daddr %#x), want the client's %#x", i, got, o.addr, o.daddr, c.want)
		}
		if elsewhere := o.mem.base != addr; elsewhere != (i > 0) {
			t.Errorf("%d: mapped at %#x", i, o.mem.base)
		}
		t.Cleanup(func() {
			cl.dev.mu.Lock()
			defer cl.dev.mu.Unlock()
			cl.deregMR(2)
			cl.deallocPD(1)
		})
	}
}
