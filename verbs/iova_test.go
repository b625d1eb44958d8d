package verbs

import (
	"bytes"
	"testing"

	"github.com/softroce/softroce/cq"
)

// A region registered at an IOVA over a pipe link: the peer's WRITE and
// READ addressed by the IOVA land at the right bytes, the local side's
// SGEs use the IOVA too, and the buffer's own address is refused.
func TestRegMRIOVAOverPipe(t *testing.T) {
	a, b := openPair(t)
	pda, _ := a.AllocPD()
	pdb, _ := b.AllocPD()
	bufa := make([]byte, 8192)
	mra, _ := pda.RegMR(bufa, AccessLocalWrite)
	bufb := make([]byte, 8192)
	const iova = 0x1234_0000_0000
	mrb, err := pdb.RegMRIOVA(bufb, iova, AccessLocalWrite|AccessRemoteWrite|AccessRemoteRead)
	if err != nil || mrb.Addr() != iova {
		t.Fatalf("RegMRIOVA: %v", err)
	}
	p := connectPair(t, a, b, pda, pdb, &ConnectOptions{Timeout: 16, RetryCnt: 2})
	for i := range bufa[:3000] {
		bufa[i] = byte(i*7 + 3)
	}
	if wc := p.post(t, SendWR{ID: 1, Opcode: WRRDMAWrite, RemoteAddr: iova + 1000, RKey: mrb.RKey(),
		SGL: []SGE{{Addr: mra.Addr(), Length: 3000, LKey: mra.LKey()}}}); wc.Status != cq.Success {
		t.Fatalf("WRITE at the IOVA: %v", wc.Status)
	}
	if !bytes.Equal(bufb[1000:4000], bufa[:3000]) {
		t.Fatal("the WRITE did not land at IOVA-relative bytes")
	}
	copy(bufb[6000:], "read me")
	if wc := p.post(t, SendWR{ID: 2, Opcode: WRRDMARead, RemoteAddr: iova + 6000, RKey: mrb.RKey(),
		SGL: []SGE{{Addr: mra.Addr() + 5000, Length: 7, LKey: mra.LKey()}}}); wc.Status != cq.Success || string(bufa[5000:5007]) != "read me" {
		t.Fatalf("READ at the IOVA: %v %q", wc.Status, bufa[5000:5007])
	}
	// The receiver's own SGEs address its region by the IOVA as well.
	if err := p.qb.PostRecv(&RecvWR{ID: 5, SGL: []SGE{{Addr: iova + 7000, Length: 100, LKey: mrb.LKey()}}}); err != nil {
		t.Fatal(err)
	}
	if wc := p.post(t, SendWR{ID: 3, Opcode: WRSend, SGL: []SGE{{Addr: mra.Addr(), Length: 50, LKey: mra.LKey()}}}); wc.Status != cq.Success {
		t.Fatalf("SEND: %v", wc.Status)
	}
	if wc := waitOne(t, p.cb, "receive"); wc.Status != cq.Success || !bytes.Equal(bufb[7000:7050], bufa[:50]) {
		t.Fatalf("receive at the IOVA: %+v", wc)
	}
	own := mra.Addr() // any address outside [iova, iova+8192)
	if wc := p.post(t, SendWR{ID: 4, Opcode: WRRDMAWrite, RemoteAddr: own, RKey: mrb.RKey(),
		SGL: []SGE{{Addr: mra.Addr(), Length: 8, LKey: mra.LKey()}}}); wc.Status != cq.RemAccessErr {
		t.Fatalf("WRITE outside the IOVA range: %v", wc.Status)
	}
}
