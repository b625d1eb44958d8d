package interop

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/softroce/softroce/conformance/agent"
)

// TestABIIOVAAgainstRxe: a C program on the host registers its buffer
// with ibv_reg_mr_iova2 at an IOVA other than its address, through
// softroce's libibverbs.so.1 and daemon (testdata/iova_peer.c). Kernel
// rxe's WRITE and READ addressed by the IOVA land at and come from the
// right bytes of the program's buffer; a WRITE to the buffer's own
// address completes REM_ACCESS_ERR.
func TestABIIOVAAgainstRxe(t *testing.T) {
	needVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	must := mustOf(t)
	env := abiDaemon(t)
	bin := filepath.Join(t.TempDir(), "iova_peer")
	if out, err := exec.Command("gcc", "-O1", "-o", bin, filepath.Join("testdata", "iova_peer.c"), "-libverbs").CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	cmd := exec.Command(bin)
	cmd.Env = env
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	must(err)
	outp, err := cmd.StdoutPipe()
	must(err)
	must(cmd.Start())
	t.Cleanup(func() { in.Close(); cmd.Process.Kill(); cmd.Wait() })
	out := bufio.NewReader(outp)
	line := func() string {
		t.Helper()
		l, err := out.ReadString('\n')
		if err != nil {
			t.Fatalf("the program's output: %q (%v)", l, err)
		}
		return strings.TrimSpace(l)
	}
	var qpn, rkey uint32
	var iova, addr uint64
	var gidHex string
	if _, err := fmt.Sscanf(line(), "qpn=%d rkey=%d iova=%d addr=%d gid=%s", &qpn, &rkey, &iova, &addr, &gidHex); err != nil {
		t.Fatalf("the program's first line: %v", err)
	}
	var pgid [16]byte
	if b, err := hex.DecodeString(gidHex); err != nil || len(b) != 16 {
		t.Fatalf("gid %q", gidHex)
	} else {
		copy(pgid[:], b)
	}

	ga, err := agent.Launch(ctx, vm, 7100+rand.IntN(800))
	if err != nil {
		t.Fatalf("launch the verbs agent: %v", err)
	}
	t.Cleanup(func() { ga.Close() })
	must(ga.Open(ctx, "rxe0"))
	gpd, err := ga.AllocPD(ctx)
	must(err)
	gmr, err := ga.RegMR(ctx, gpd, 64<<10, agent.AccessAll)
	must(err)
	gcq, err := ga.CreateCQ(ctx, 16)
	must(err)
	gqp, err := ga.CreateQP(ctx, gpd, gcq, gcq, agent.QPCap{SendWR: 16, RecvWR: 16})
	must(err)
	must(ga.ModifyToInit(ctx, gqp, agent.AccessAll))
	ggid, err := ga.GID(ctx, 1)
	must(err)
	fmt.Fprintf(in, "%d %x\n", gqp.QPN, ggid[:])
	must(ga.ModifyToRTR(ctx, gqp, agent.RTRAttr{DestQPN: qpn, RecvPSN: 100, DestGID: pgid, MTU: 1024, MaxDestRdAtom: 16}))
	must(ga.ModifyToRTS(ctx, gqp, agent.RTSAttr{SendPSN: 200, Timeout: 14, Retry: 7, RNRRetry: 7, MaxRdAtom: 16}))
	if l := line(); l != "ready" {
		t.Fatalf("the program says %q", l)
	}
	var wrID uint64
	rxe := func(op agent.Op, off, length int, raddr uint64) agent.WCStatus {
		t.Helper()
		wrID++
		must(ga.PostSend(ctx, gqp, agent.SendWR{WRID: wrID, Op: op, MR: gmr, Off: off, Len: length, RemoteAddr: raddr, RKey: rkey}))
		wc, err := ga.Poll(ctx, gcq, 20*time.Second)
		if err != nil || wc.WRID != wrID {
			t.Fatalf("rxe %s: %+v (%v)", op, wc, err)
		}
		return wc.Status
	}
	dump := func(off, n int) []byte {
		t.Helper()
		fmt.Fprintf(in, "dump %d %d\n", off, n)
		b, err := hex.DecodeString(line())
		if err != nil || len(b) != n {
			t.Fatalf("dump: %d bytes (%v)", len(b), err)
		}
		return b
	}
	initial := func(off, n int) []byte { // the program's fill: byte i*3+1
		b := make([]byte, n)
		for i := range b {
			b[i] = byte((off+i)*3 + 1)
		}
		return b
	}

	data := pattern(3000, 5)
	must(ga.WriteMem(ctx, gmr, 0, data))
	if st := rxe(agent.OpWrite, 0, len(data), iova+1000); st != agent.WCSuccess {
		t.Fatalf("rxe WRITE at the IOVA: status %d", st)
	}
	got := dump(999, len(data)+2)
	if !bytes.Equal(got[1:len(got)-1], data) || got[0] != initial(999, 1)[0] || got[len(got)-1] != initial(1000+len(data), 1)[0] {
		t.Fatal("rxe's WRITE did not land at the IOVA's bytes of the program's buffer, or spilled")
	}
	if st := rxe(agent.OpRead, 8192, 5000, iova+40000); st != agent.WCSuccess {
		t.Fatalf("rxe READ at the IOVA: status %d", st)
	}
	if b, err := ga.ReadMem(ctx, gmr, 8192, 5000); err != nil || !bytes.Equal(b, initial(40000, 5000)) {
		t.Fatalf("rxe READ at the IOVA: data differs (%v)", err)
	}
	if addr < iova || addr >= iova+64<<10 {
		if st := rxe(agent.OpWrite, 0, 8, addr+100); st != agent.WCRemAccessErr {
			t.Fatalf("rxe WRITE at the buffer's own address: status %d, want REM_ACCESS_ERR", st)
		}
	}
}
