package agent

import (
	"bufio"
	"context"
	"errors"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// fakeAgent answers each request line with the scripted reply for its
// command word and records the requests.
func fakeAgent(t *testing.T, replies map[string]string) (*Client, chan string) {
	t.Helper()
	a, b := net.Pipe()
	reqs := make(chan string, 100)
	go func() {
		defer b.Close()
		r := bufio.NewReader(b)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			line = strings.TrimSuffix(line, "\n")
			reqs <- line
			cmd, _, _ := strings.Cut(line, " ")
			rep, ok := replies[cmd]
			if !ok {
				rep = "err unknown command " + cmd
			}
			if rep == "HANG" {
				continue
			}
			if _, err := b.Write([]byte(rep + "\n")); err != nil {
				return
			}
		}
	}()
	c := New(a)
	t.Cleanup(func() { c.Close() })
	return c, reqs
}

func TestClientParsesReplies(t *testing.T) {
	ctx := context.Background()
	c, reqs := fakeAgent(t, map[string]string{
		"mr":    "ok mr=3 addr=0x7f0012345000 lkey=0x1a2b rkey=0x3c4d",
		"qp":    "ok qp=1 qpn=0x11",
		"gid":   "ok gid=00000000000000000000ffff0a580002",
		"poll":  "ok wr=5 status=10 opcode=1 len=0 imm=0xdeadbeef qpn=0x11 src_qp=0x0 wc_flags=0x2 vendor_err=0x0 str=remote access error",
		"query": "ok state=ERR sq_psn=0x123456 rq_psn=0xfffffe mtu=1024 dqpn=0x12 timeout=14 retry=7 rnr_retry=7 min_rnr=12 rd_atomic=4 dest_rd_atomic=4 qkey=0x11",
		"mem":   "ok hex=00ff10",
		"rtr":   "err modify to RTR: Invalid argument",
	})
	mr, err := c.RegMR(ctx, 1, 4096, AccessAll)
	if err != nil || mr != (MR{ID: 3, Addr: 0x7f0012345000, LKey: 0x1a2b, RKey: 0x3c4d, Len: 4096}) {
		t.Fatalf("RegMR = %+v, %v", mr, err)
	}
	if got := <-reqs; got != "mr pd=1 len=4096 access=15" {
		t.Errorf("request %q", got)
	}
	qp, err := c.CreateQP(ctx, 1, 1, 2, QPCap{SendWR: 8})
	if err != nil || qp != (QP{ID: 1, QPN: 0x11}) {
		t.Fatalf("CreateQP = %+v, %v", qp, err)
	}
	if got := <-reqs; got != "qp pd=1 scq=1 rcq=2 sq=8" {
		t.Errorf("request %q", got)
	}
	g, err := c.GID(ctx, 1)
	if err != nil || g[10] != 0xff || g[15] != 2 {
		t.Fatalf("GID = %x, %v", g, err)
	}
	<-reqs
	wc, err := c.Poll(ctx, 2, 1500*time.Millisecond)
	want := WC{WRID: 5, Status: WCRemAccessErr, StatusStr: "remote access error", Opcode: WCRDMAWrite, Imm: 0xdeadbeef, QPN: 0x11, Flags: 2}
	if err != nil || wc == nil || *wc != want {
		t.Fatalf("Poll = %+v, %v", wc, err)
	}
	if got := <-reqs; got != "poll cq=2 timeout=1500" {
		t.Errorf("request %q", got)
	}
	a, err := c.Query(ctx, qp)
	if err != nil || a.State != "ERR" || a.RecvPSN != 0xfffffe || a.MaxDestRdAtom != 4 || a.MTU != 1024 || a.QKey != 0x11 {
		t.Fatalf("Query = %+v, %v", a, err)
	}
	<-reqs
	b, err := c.ReadMem(ctx, mr, 0, 3)
	if err != nil || string(b) != "\x00\xff\x10" {
		t.Fatalf("ReadMem = %x, %v", b, err)
	}
	<-reqs
	if _, err := c.ReadMem(ctx, mr, 0, 4); err == nil {
		t.Error("short memory reply accepted")
	}
	<-reqs
	err = c.ModifyToRTR(ctx, qp, RTRAttr{DestQPN: 0x12, RecvPSN: 7})
	var ae *Error
	if !errors.As(err, &ae) || ae.Request != "rtr" || ae.Msg != "modify to RTR: Invalid argument" {
		t.Fatalf("ModifyToRTR error = %v", err)
	}
	// Defaults are filled in; the source GID index is left to the
	// agent's --gid-index.
	if got := <-reqs; got != "rtr qp=1 dqpn=0x12 rpsn=0x7 dgid=00000000000000000000000000000000 mtu=1024 rd_atomic=1 min_rnr=12 hop=64 tc=0" {
		t.Errorf("request %q", got)
	}
	if err := c.PostSend(ctx, qp, SendWR{WRID: 9, Op: OpFetchAdd, MR: mr, Len: 8, RemoteAddr: 0x1000, RKey: 0x55, Add: 3, Unsignaled: true}); err == nil {
		t.Error("unknown command accepted")
	}
	if got := <-reqs; !strings.Contains(got, " op=faa ") || !strings.Contains(got, " add=0x3 ") || !strings.Contains(got, " signaled=0 ") {
		t.Errorf("request %q", got)
	}
}

func TestClientNoCompletionAndCancel(t *testing.T) {
	c, _ := fakeAgent(t, map[string]string{"poll": "ok none", "pd": "HANG", "ping": "garbage"})
	wc, err := c.Poll(context.Background(), 1, time.Millisecond)
	if wc != nil || err != nil {
		t.Fatalf("Poll with no completion = %v, %v; want nil, nil", wc, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := c.AllocPD(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("hung agent: %v, want the context's deadline", err)
	}
	if _, err := c.Poll(context.Background(), 1, time.Millisecond); err == nil {
		t.Fatal("client reused after a cancelled request")
	}
	c2, _ := fakeAgent(t, map[string]string{"ping": "garbage"})
	if _, err := c2.Do(context.Background(), "ping"); err == nil {
		t.Fatal("malformed reply accepted")
	}
	if _, err := c2.Do(context.Background(), "memw", "hex=00\nquit"); err == nil {
		t.Fatal("request with a line break accepted")
	}
}

// TestBuild compiles the agent when the host has gcc and libibverbs-dev.
func TestBuild(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("no gcc")
	}
	bin, err := Build(context.Background(), t.TempDir())
	if err != nil {
		if strings.Contains(err.Error(), "verbs.h") || strings.Contains(err.Error(), "-libverbs") {
			t.Skip("libibverbs-dev not installed: ", err)
		}
		t.Fatal(err)
	}
	if f := GuestFile(bin); f.Path != GuestPath || f.Src != bin || !f.WithLibs {
		t.Fatalf("GuestFile = %+v", f)
	}
}
