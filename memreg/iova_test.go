package memreg

import (
	"bytes"
	"errors"
	"testing"
)

// A region registered at an IOVA is addressed by it everywhere: remote
// accesses, local SGEs, window binds; its buffer's own address is outside
// it. Re-registering with the translation kept keeps the IOVA.
func TestRegMRIOVA(t *testing.T) {
	tab := NewTable(Limits{})
	pd, _ := tab.AllocPD()
	buf := make([]byte, 4096)
	const iova = 0x7000_0000_1000
	mr, err := tab.RegMRIOVA(pd, buf, iova, all|AccessMWBind)
	if err != nil {
		t.Fatal(err)
	}
	if mr.Addr() != iova {
		t.Fatalf("addr %#x, want the IOVA %#x", mr.Addr(), uint64(iova))
	}
	if err := tab.RemoteWrite(pd, mr.RKey(), iova+100, []byte("hello")); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf[100:105], []byte("hello")) {
		t.Fatalf("the write landed elsewhere: %q", buf[100:105])
	}
	got := make([]byte, 5)
	if err := tab.LocalRead(pd, mr.LKey(), iova+100, got); err != nil || string(got) != "hello" {
		t.Fatalf("local read at the IOVA: %q, %v", got, err)
	}
	if err := tab.RemoteRead(pd, mr.RKey(), iova+4095, got[:2]); !isReason(err, ReasonOutOfBounds) {
		t.Errorf("read past the end: %v", err)
	}
	if err := tab.RemoteWrite(pd, mr.RKey(), vaOf(buf, 0)+100, []byte("x")); !isReason(err, ReasonOutOfBounds) {
		t.Errorf("write at the buffer's own address: %v", err)
	}
	mw, _ := tab.AllocMW(pd, MWType1)
	if _, err := tab.BindMW(mw, pd, NoQP, Bind{MRKey: mr.LKey(), Addr: iova + 1000, Length: 100, Access: AccessRemoteWrite}); err != nil {
		t.Fatalf("bind inside the IOVA range: %v", err)
	}
	if err := tab.RemoteWrite(pd, mw.RKey(), iova+1000, []byte("w")); err != nil || buf[1000] != 'w' {
		t.Fatalf("write through the window: %v", err)
	}
	if _, err := tab.BindMW(mw, pd, NoQP, Bind{MRKey: mr.LKey(), Addr: vaOf(buf, 0), Length: 100, Access: AccessRemoteWrite}); err == nil {
		t.Error("bind at the buffer's own address succeeded")
	}
	if _, err := tab.BindMW(mw, pd, NoQP, Bind{}); err != nil {
		t.Fatal(err)
	}
	if err := tab.ReregMR(mr, nil, all); err != nil || mr.Addr() != iova {
		t.Errorf("rereg keeping the translation: addr %#x, %v", mr.Addr(), err)
	}
	if err := tab.ReregMR(mr, buf, all); err != nil || mr.Addr() != vaOf(buf, 0) {
		t.Errorf("rereg with a new buffer: addr %#x, %v", mr.Addr(), err)
	}
	if _, err := tab.RegMRIOVA(pd, buf, ^uint64(0)-100, all); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("a range wrapping around: %v", err)
	}
	if _, err := tab.RegMRIOVA(pd, buf, iova, all|AccessZeroBased); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("zero-based with an IOVA: %v", err)
	}
}

func isReason(err error, reason string) bool {
	var ae *AccessError
	return errors.As(err, &ae) && ae.Reason == reason
}
