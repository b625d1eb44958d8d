package agent

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/gopacket/gopacket/pcapgo"

	"github.com/softroce/softroce/conformance/rxevm"
	"github.com/softroce/softroce/icrc"
)

var (
	testVM     *rxevm.VM
	testVMErr  error
	skipReason string
)

// TestMain boots one rxe VM with the agent for the whole package when
// SOFTROCE_RXE=1.
func TestMain(m *testing.M) {
	code := func() int {
		switch {
		case os.Getenv("SOFTROCE_RXE") != "1":
			skipReason = "set SOFTROCE_RXE=1 to run the verbs agent in the kernel rdma_rxe VM"
		case os.Geteuid() != 0:
			skipReason = "the rxe VM needs root (network namespace, tap)"
		default:
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			dir, err := os.MkdirTemp("", "sragent-")
			if err != nil {
				testVMErr = err
				break
			}
			defer os.RemoveAll(dir)
			bin, err := Build(ctx, dir)
			var img *rxevm.Image
			if err == nil {
				img, err = rxevm.Build(ctx, rxevm.Config{Log: os.Stderr})
			}
			if err == nil {
				testVM, err = rxevm.Boot(ctx, img, rxevm.Options{Log: os.Stderr, Files: []rxevm.File{GuestFile(bin)}})
			}
			testVMErr = err
			if testVM != nil {
				defer testVM.Close()
			}
		}
		return m.Run()
	}()
	os.Exit(code)
}

func launch(t *testing.T, ctx context.Context) *Client {
	t.Helper()
	if skipReason != "" {
		t.Skip(skipReason)
	}
	if testVMErr != nil {
		t.Fatalf("VM: %v", testVMErr)
	}
	c, err := Launch(ctx, testVM, DefaultPort)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if err := c.Open(ctx, "rxe0"); err != nil {
		t.Fatal(err)
	}
	return c
}

// pair is two RC QPs of one agent connected to each other through rxe0
// (rxe loops packets to its own address back internally).
type pair struct {
	c      *Client
	mr     [2]MR
	qp     [2]QP
	scq    [2]CQ
	rcq    [2]CQ
	psn    [2]uint32
	ctx    context.Context
	t      *testing.T
	nextWR uint64
}

func newPair(t *testing.T, ctx context.Context, c *Client) *pair {
	p := &pair{c: c, ctx: ctx, t: t, psn: [2]uint32{0x123456, 0xfffffe}} // the second wraps soon
	pd, err := c.AllocPD(ctx)
	if err != nil {
		t.Fatal(err)
	}
	gid, err := c.GID(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(gid[:12], []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff}) || !bytes.Equal(gid[12:], testVM.GuestAddr().AsSlice()) {
		t.Fatalf("GID 1 = %x, want ::ffff:%s", gid, testVM.GuestAddr())
	}
	for i := range 2 {
		if p.mr[i], err = c.RegMR(ctx, pd, 16384, AccessAll); err != nil {
			t.Fatal(err)
		}
		if p.scq[i], err = c.CreateCQ(ctx, 64); err != nil {
			t.Fatal(err)
		}
		if p.rcq[i], err = c.CreateCQ(ctx, 64); err != nil {
			t.Fatal(err)
		}
		if p.qp[i], err = c.CreateQP(ctx, pd, p.scq[i], p.rcq[i], QPCap{}); err != nil {
			t.Fatal(err)
		}
		if err := c.ModifyToInit(ctx, p.qp[i], AccessRemoteWrite|AccessRemoteRead|AccessRemoteAtomic); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 2 {
		j := 1 - i
		err := c.ModifyToRTR(ctx, p.qp[i], RTRAttr{DestQPN: p.qp[j].QPN, RecvPSN: p.psn[j], DestGID: gid, MTU: 1024, MaxDestRdAtom: 4})
		if err != nil {
			t.Fatal(err)
		}
		rts := DefaultRTS(p.psn[i])
		rts.MaxRdAtom = 4
		if err := c.ModifyToRTS(ctx, p.qp[i], rts); err != nil {
			t.Fatal(err)
		}
	}
	a, err := c.Query(ctx, p.qp[0])
	if err != nil {
		t.Fatal(err)
	}
	if a.State != "RTS" || a.DestQPN != p.qp[1].QPN || a.MTU != 1024 || a.SendPSN != p.psn[0] {
		t.Fatalf("QP 0 after RTS: %+v", a)
	}
	return p
}

// complete posts wr on QP from and waits for its success completion.
func (p *pair) complete(from int, wr SendWR) *WC {
	p.t.Helper()
	p.nextWR++
	wr.WRID = p.nextWR
	if err := p.c.PostSend(p.ctx, p.qp[from], wr); err != nil {
		p.t.Fatal(err)
	}
	return p.expect(p.scq[from], wr.WRID)
}

func (p *pair) expect(cq CQ, wrID uint64) *WC {
	p.t.Helper()
	wc, err := p.c.Poll(p.ctx, cq, 10*time.Second)
	if err != nil {
		p.t.Fatal(err)
	}
	if wc == nil {
		p.t.Fatalf("no completion for WR %d within 10 s", wrID)
	}
	if wc.WRID != wrID || wc.Status != WCSuccess {
		p.t.Fatalf("completion %+v, want WR %d success", *wc, wrID)
	}
	return wc
}

// pattern is n bytes of a PRNG stream keyed by seed and n: nothing
// repeats, so misplaced data never passes for the right data.
func pattern(n int, seed byte) []byte {
	r := rand.New(rand.NewPCG(uint64(seed), uint64(n)))
	b := make([]byte, n+7)
	for i := 0; i < n; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	return b[:n:n]
}

func (p *pair) mem(i, off, n int) []byte {
	p.t.Helper()
	b, err := p.c.ReadMem(p.ctx, p.mr[i], off, n)
	if err != nil {
		p.t.Fatal(err)
	}
	return b
}

func TestLoopbackRCOperations(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := launch(t, ctx)
	p := newPair(t, ctx, c)

	// RDMA WRITE of 5000 bytes: five packets at MTU 1024, across the
	// PSN wrap of QP 1 (which starts at 0xfffffe).
	data := pattern(5000, 1)
	if err := c.WriteMem(ctx, p.mr[1], 0, data); err != nil {
		t.Fatal(err)
	}
	wc := p.complete(1, SendWR{Op: OpWrite, MR: p.mr[1], Off: 0, Len: len(data), RemoteAddr: p.mr[0].Addr + 100, RKey: p.mr[0].RKey})
	if wc.Opcode != WCRDMAWrite {
		t.Errorf("WRITE completion opcode %d", wc.Opcode)
	}
	if got := p.mem(0, 100, len(data)); !bytes.Equal(got, data) {
		t.Fatalf("WRITE: responder memory differs")
	}
	if got := p.mem(0, 0, 100); !bytes.Equal(got, make([]byte, 100)) {
		t.Fatalf("WRITE touched bytes before the target range: %x", got)
	}

	// A zero-length RDMA WRITE without any SGE: rxe checks no rkey for it
	// (docs/rxe-behaviour.md §4.5; docs/conformance-catalogue.md GU-08).
	p.complete(1, SendWR{Op: OpWrite, RemoteAddr: 0, RKey: 0x1234})

	// RDMA READ it back into another place of QP 1's buffer.
	wc = p.complete(1, SendWR{Op: OpRead, MR: p.mr[1], Off: 8192, Len: len(data), RemoteAddr: p.mr[0].Addr + 100, RKey: p.mr[0].RKey})
	if wc.Opcode != WCRDMARead || wc.ByteLen != uint32(len(data)) {
		t.Errorf("READ completion %+v", *wc)
	}
	if got := p.mem(1, 8192, len(data)); !bytes.Equal(got, data) {
		t.Fatalf("READ: local memory differs")
	}

	// SEND with immediate into a posted receive.
	msg := pattern(3000, 9)
	if err := c.WriteMem(ctx, p.mr[0], 12000, msg); err != nil {
		t.Fatal(err)
	}
	if err := c.PostRecv(ctx, p.qp[1], 77, p.mr[1], 4096, 4000); err != nil {
		t.Fatal(err)
	}
	p.complete(0, SendWR{Op: OpSendImm, MR: p.mr[0], Off: 12000, Len: len(msg), Imm: 0xdeadbeef})
	rwc := p.expect(p.rcq[1], 77)
	if rwc.Opcode != WCRecv || rwc.ByteLen != uint32(len(msg)) || rwc.Imm != 0xdeadbeef || rwc.Flags&2 == 0 {
		t.Errorf("receive completion %+v", *rwc)
	}
	if got := p.mem(1, 4096, len(msg)); !bytes.Equal(got, msg) {
		t.Fatalf("SEND: received bytes differ")
	}

	// Atomics on an 8-byte aligned word of QP 0's buffer.
	const word = 2048
	put := make([]byte, 8)
	binary.LittleEndian.PutUint64(put, 1000)
	if err := c.WriteMem(ctx, p.mr[0], word, put); err != nil {
		t.Fatal(err)
	}
	// A CAS that matches swaps and returns the original.
	p.complete(1, SendWR{Op: OpCmpSwap, MR: p.mr[1], Off: 0, Len: 8, RemoteAddr: p.mr[0].Addr + word, RKey: p.mr[0].RKey, Compare: 1000, Swap: 2000})
	if v := binary.LittleEndian.Uint64(p.mem(1, 0, 8)); v != 1000 {
		t.Fatalf("CAS returned %d, want the original 1000", v)
	}
	if v := binary.LittleEndian.Uint64(p.mem(0, word, 8)); v != 2000 {
		t.Fatalf("after CAS the target holds %d, want 2000", v)
	}
	// A CAS that does not match leaves the target alone.
	p.complete(1, SendWR{Op: OpCmpSwap, MR: p.mr[1], Off: 8, Len: 8, RemoteAddr: p.mr[0].Addr + word, RKey: p.mr[0].RKey, Compare: 1, Swap: 3})
	if v := binary.LittleEndian.Uint64(p.mem(1, 8, 8)); v != 2000 {
		t.Fatalf("failed CAS returned %d, want 2000", v)
	}
	if v := binary.LittleEndian.Uint64(p.mem(0, word, 8)); v != 2000 {
		t.Fatalf("failed CAS changed the target to %d", v)
	}
	// FETCH_ADD returns the original and adds.
	wc = p.complete(1, SendWR{Op: OpFetchAdd, MR: p.mr[1], Off: 16, Len: 8, RemoteAddr: p.mr[0].Addr + word, RKey: p.mr[0].RKey, Add: 0x1_0000_0001})
	if wc.Opcode != WCFetchAdd {
		t.Errorf("FAA completion opcode %d", wc.Opcode)
	}
	if v := binary.LittleEndian.Uint64(p.mem(1, 16, 8)); v != 2000 {
		t.Fatalf("FAA returned %d, want 2000", v)
	}
	if v := binary.LittleEndian.Uint64(p.mem(0, word, 8)); v != 2000+0x1_0000_0001 {
		t.Fatalf("after FAA the target holds %#x", v)
	}
}

func TestRemoteAccessError(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := launch(t, ctx)
	p := newPair(t, ctx, c)
	// A bad rkey: the responder NAKs with remote access error (IBTA
	// 9.7.5.2.4) and the requester completes with REM_ACCESS_ERR.
	if err := c.PostSend(ctx, p.qp[0], SendWR{WRID: 5, Op: OpWrite, MR: p.mr[0], Len: 64, RemoteAddr: p.mr[1].Addr, RKey: p.mr[1].RKey ^ 0xff00}); err != nil {
		t.Fatal(err)
	}
	wc, err := c.Poll(ctx, p.scq[0], 10*time.Second)
	if err != nil || wc == nil {
		t.Fatalf("poll: %v %v", wc, err)
	}
	if wc.WRID != 5 || wc.Status != WCRemAccessErr || wc.StatusStr != "remote access error" {
		t.Fatalf("completion %+v, want WR 5 remote access error", *wc)
	}
	a, err := c.Query(ctx, p.qp[0])
	if err != nil || a.State != "ERR" {
		t.Fatalf("requester QP state %q (%v), want ERR", a.State, err)
	}
	// The agent's protocol errors are typed.
	_, err = c.Do(ctx, "poll", "cq=63")
	var ae *Error
	if !errors.As(err, &ae) {
		t.Fatalf("poll on a missing CQ: %v, want *Error", err)
	}
}

// TestRxeRequesterOnTheWire points a QP at the host side of the tap, where
// nothing answers, and captures what rxe sends: with retry_cnt 1 the SEND
// goes out exactly twice with the same PSN (first try plus one retry after
// the local ACK timeout, IBTA 9.7.6.1.2), then the WR completes with
// RETRY_EXC_ERR. The frames' ICRC must verify with the project's icrc.
func TestRxeRequesterOnTheWire(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := launch(t, ctx)
	pd, err := c.AllocPD(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mr, err := c.RegMR(ctx, pd, 4096, AccessLocalWrite)
	if err != nil {
		t.Fatal(err)
	}
	cq, err := c.CreateCQ(ctx, 16)
	if err != nil {
		t.Fatal(err)
	}
	qp, err := c.CreateQP(ctx, pd, cq, cq, QPCap{})
	if err != nil {
		t.Fatal(err)
	}
	var hostGID [16]byte
	hostGID[10], hostGID[11] = 0xff, 0xff
	copy(hostGID[12:], testVM.HostAddr().AsSlice())
	const dqpn, psn = 0x4242, 0xabcdef
	if err := c.ModifyToInit(ctx, qp, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.ModifyToRTR(ctx, qp, RTRAttr{DestQPN: dqpn, RecvPSN: 1, DestGID: hostGID}); err != nil {
		t.Fatal(err)
	}
	if err := c.ModifyToRTS(ctx, qp, RTSAttr{SendPSN: psn, Timeout: 14, Retry: 1, RNRRetry: 0}); err != nil {
		t.Fatal(err)
	}
	if err := c.Fill(ctx, mr, 0, 100, 0x5a); err != nil {
		t.Fatal(err)
	}
	var pcap bytes.Buffer
	capt, err := testVM.CaptureTap(&pcap)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.PostSend(ctx, qp, SendWR{WRID: 1, Op: OpSend, MR: mr, Len: 100}); err != nil {
		capt.Stop()
		t.Fatal(err)
	}
	wc, err := c.Poll(ctx, cq, 20*time.Second)
	time.Sleep(300 * time.Millisecond) // no third transmission may follow
	if _, serr := capt.Stop(); serr != nil {
		t.Fatal(serr)
	}
	if err != nil || wc == nil {
		t.Fatalf("poll: %v %v", wc, err)
	}
	if wc.Status != WCRetryExcErr {
		t.Errorf("completion %+v, want transport retry counter exceeded", *wc)
	}
	r, err := pcapgo.NewReader(&pcap)
	if err != nil {
		t.Fatal(err)
	}
	var sends int
	for {
		frame, _, err := r.ReadPacketData()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		res, err := icrc.CheckFrame(frame)
		if err != nil {
			continue // ARP, ICMP port unreachable from the host, ...
		}
		if res.Status != icrc.StatusOK {
			t.Errorf("rxe frame with ICRC %v (wire %#x, computed %#x)", res.Status, res.Wire, res.Computed)
		}
		bth := frame[res.BTH:]
		op, qpn, gotPSN := bth[0], uint32(bth[5])<<16|uint32(bth[6])<<8|uint32(bth[7]), uint32(bth[9])<<16|uint32(bth[10])<<8|uint32(bth[11])
		if op != 0x04 || qpn != dqpn || gotPSN != psn {
			t.Errorf("frame opcode %#x dest QP %#x PSN %#x; want SEND_ONLY to %#x at %#x", op, qpn, gotPSN, dqpn, psn)
		}
		if udpSum := frame[res.UDP+6 : res.UDP+8]; udpSum[0] != 0 || udpSum[1] != 0 {
			t.Errorf("rxe UDP checksum %x, expected 0", udpSum)
		}
		sends++
	}
	if sends != 2 {
		t.Fatalf("rxe sent the SEND %d times, want 2 (retry_cnt 1)", sends)
	}
}
