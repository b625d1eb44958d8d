package wr

import "testing"

func TestOpcodeClasses(t *testing.T) {
	for _, tc := range []struct {
		o                             Opcode
		name                          string
		known, send, write, atomicRMW bool
	}{
		{RDMAWrite, "RDMA_WRITE", true, false, true, false},
		{RDMAWriteWithImm, "RDMA_WRITE_WITH_IMM", true, false, true, false},
		{Send, "SEND", true, true, false, false},
		{SendWithImm, "SEND_WITH_IMM", true, true, false, false},
		{SendWithInv, "SEND_WITH_INV", true, true, false, false},
		{RDMARead, "RDMA_READ", true, false, false, false},
		{AtomicCmpAndSwp, "ATOMIC_CMP_AND_SWP", true, false, false, true},
		{AtomicFetchAndAdd, "ATOMIC_FETCH_AND_ADD", true, false, false, true},
		{AtomicWrite, "ATOMIC_WRITE", true, false, false, false},
		{LocalInv, "LOCAL_INV", true, false, false, false},
		{BindMW, "BIND_MW", true, false, false, false},
		{Opcode(10), "WROpcode(10)", false, false, false, false},
	} {
		if tc.o.IsLocal() != (tc.o == LocalInv || tc.o == BindMW) {
			t.Errorf("%v: IsLocal = %v", tc.o, tc.o.IsLocal())
		}
		if got := tc.o.String(); got != tc.name {
			t.Errorf("Opcode(%d).String() = %q, want %q", uint8(tc.o), got, tc.name)
		}
		if tc.o.Known() != tc.known || tc.o.IsSend() != tc.send || tc.o.IsWrite() != tc.write || tc.o.IsAtomic() != tc.atomicRMW {
			t.Errorf("%v: Known/IsSend/IsWrite/IsAtomic = %v/%v/%v/%v, want %v/%v/%v/%v", tc.o,
				tc.o.Known(), tc.o.IsSend(), tc.o.IsWrite(), tc.o.IsAtomic(), tc.known, tc.send, tc.write, tc.atomicRMW)
		}
	}
}

// The opcodes are the values of enum ibv_wr_opcode (libibverbs verbs.h).
func TestOpcodeValues(t *testing.T) {
	if LocalInv != 7 || BindMW != 8 || SendWithInv != 9 {
		t.Fatalf("LOCAL_INV %d BIND_MW %d SEND_WITH_INV %d", LocalInv, BindMW, SendWithInv)
	}
}
