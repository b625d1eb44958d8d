package interop

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
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
	if out, err := exec.Command("gcc", "-O1", "-I"+filepath.Join("..", "..", "serve", "testdata"), "-o", bin,
		filepath.Join("testdata", "iova_peer.c"), "-libverbs").CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	cmd := vm.HostCommand(ctx, bin) // in the namespace the daemon serves
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

	g := newRxeRC(t, ctx)
	fmt.Fprintf(in, "%d %x\n", g.qp.QPN, g.gid[:])
	must(agentToRTS(ctx, g.ag, g.qp, qpn, pgid, 100, 200))
	if l := line(); l != "ready" {
		t.Fatalf("the program says %q", l)
	}
	rxe := func(op agent.Op, off, length int, raddr uint64) agent.WCStatus {
		t.Helper()
		return g.op(t, ctx, op, off, length, raddr, rkey)
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
	must(g.ag.WriteMem(ctx, g.mr, 0, data))
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
	if b, err := g.ag.ReadMem(ctx, g.mr, 8192, 5000); err != nil || !bytes.Equal(b, initial(40000, 5000)) {
		t.Fatalf("rxe READ at the IOVA: data differs (%v)", err)
	}
	if addr < iova || addr >= iova+64<<10 {
		if st := rxe(agent.OpWrite, 0, 8, addr+100); st != agent.WCRemAccessErr {
			t.Fatalf("rxe WRITE at the buffer's own address: status %d, want REM_ACCESS_ERR", st)
		}
	}
}
