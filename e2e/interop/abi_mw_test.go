package interop

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"os"
	"regexp"
	"testing"
	"time"

	"github.com/softroce/softroce/conformance/agent"
)

// hostAgent builds the project's C verbs agent on the host and starts it
// with env, so that it runs on softroce through the C library (GID index
// 0: softroce's IPv4 GID). It returns a client connected to it.
func hostAgent(t *testing.T, ctx context.Context, env []string) *agent.Client {
	t.Helper()
	bin, err := agent.Build(ctx, t.TempDir())
	if err != nil {
		t.Skipf("cannot build the agent on the host: %v", err)
	}
	// In the namespace the daemon serves; so is the connection to it.
	cmd := vm.HostCommand(ctx, bin, "--listen", "127.0.0.1:0", "--gid-index", "0")
	cmd.Env = env
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	r := bufio.NewReader(out)
	l1, err1 := r.ReadString('\n')
	l2, err2 := r.ReadString('\n')
	addr := regexp.MustCompile(`listening on (\S+),`).FindStringSubmatch(l1)
	token := regexp.MustCompile(`token ([0-9a-f]{32})\n$`).FindStringSubmatch(l2)
	if err1 != nil || err2 != nil || addr == nil || token == nil {
		t.Fatalf("host agent start: %q %q (%v, %v)", l1, l2, err1, err2)
	}
	go io.Copy(io.Discard, r)
	var d net.Dialer
	dial := func(ctx context.Context, network, address string) (c net.Conn, err error) {
		vm.Do(func() error { c, err = d.DialContext(ctx, network, address); return nil })
		return c, err
	}
	c, err := agent.Dial(ctx, dial, addr[1], token[1])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestABIMWAgainstRxe: a C program on the host (the verbs agent) uses
// memory windows through softroce's libibverbs.so.1 and daemon, and
// kernel rxe in the guest is the peer. A type 1 window bound with
// ibv_bind_mw and a type 2 one bound with an IBV_WR_BIND_MW work request
// take rxe's WRITE and READ, byte-exact, at the program's own addresses;
// after the program's LOCAL_INV of the type 2 window rxe's WRITE through
// it completes REM_ACCESS_ERR.
func TestABIMWAgainstRxe(t *testing.T) {
	needVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	must := mustOf(t)
	ha := hostAgent(t, ctx, abiDaemon(t))
	g := newRxeRC(t, ctx)
	must(ha.Open(ctx, ""))

	const n = 64 << 10

	hpd, err := ha.AllocPD(ctx)
	must(err)
	// The region grants no remote right itself: only the windows do.
	hmr, err := ha.RegMR(ctx, hpd, n, agent.AccessLocalWrite|agent.AccessMWBind)
	must(err)
	hcq, err := ha.CreateCQ(ctx, 64)
	must(err)
	hqp, err := ha.CreateQP(ctx, hpd, hcq, hcq, agent.QPCap{SendWR: 16, RecvWR: 16})
	must(err)
	must(ha.ModifyToInit(ctx, hqp, agent.AccessAll))
	hgid, err := ha.GID(ctx, 0)
	must(err)

	must(agentToRTS(ctx, g.ag, g.qp, hqp.QPN, hgid, 100, 200))
	must(agentToRTS(ctx, ha, hqp, g.qp.QPN, g.gid, 200, 100))

	var wrID uint64
	hostWC := func(what string) {
		t.Helper()
		wc, err := ha.Poll(ctx, hcq, 20*time.Second)
		if err != nil || wc.Status != agent.WCSuccess || wc.WRID != wrID {
			t.Fatalf("%s on softroce: %+v (%v)", what, wc, err)
		}
	}
	rxe := func(op agent.Op, off, length int, raddr uint64, rkey uint32) agent.WCStatus {
		t.Helper()
		return g.op(t, ctx, op, off, length, raddr, rkey)
	}
	through := func(name string, mw agent.MW, off int, seed byte) {
		t.Helper()
		data := pattern(3000, seed)
		must(g.ag.WriteMem(ctx, g.mr, 0, data))
		if st := rxe(agent.OpWrite, 0, len(data), hmr.Addr+uint64(off)+100, mw.RKey); st != agent.WCSuccess {
			t.Fatalf("%s: rxe WRITE through the window: status %d", name, st)
		}
		got, err := ha.ReadMem(ctx, hmr, off+99, len(data)+2)
		if err != nil || got[0] != 0 || got[len(got)-1] != 0 || !bytes.Equal(got[1:len(got)-1], data) {
			t.Fatalf("%s: rxe WRITE: the program's bytes differ or spilled (%v)", name, err)
		}
		back := pattern(2000, seed+1)
		must(ha.WriteMem(ctx, hmr, off+5000, back))
		if st := rxe(agent.OpRead, 8192, len(back), hmr.Addr+uint64(off)+5000, mw.RKey); st != agent.WCSuccess {
			t.Fatalf("%s: rxe READ through the window: status %d", name, st)
		}
		if got, err := g.ag.ReadMem(ctx, g.mr, 8192, len(back)); err != nil || !bytes.Equal(got, back) {
			t.Fatalf("%s: rxe READ: data differs (%v)", name, err)
		}
	}

	// bind allocates a window of type typ and binds it over 8 KiB at off
	// of the program's region, the way what says.
	bind := func(typ, off int, what string) agent.MW {
		t.Helper()
		mw, err := ha.AllocMW(ctx, hpd, typ)
		must(err)
		wrID++
		must(ha.BindMW(ctx, hqp, wrID, &mw, hmr, off, 8192, agent.AccessRemoteWrite|agent.AccessRemoteRead, true))
		hostWC(what)
		return mw
	}
	through("type 1", bind(1, 4096, "ibv_bind_mw"), 4096, 3)
	mw2 := bind(2, 16384, "BIND_MW work request")
	through("type 2", mw2, 16384, 9)

	wrID++
	must(ha.LocalInv(ctx, hqp, wrID, mw2.RKey, true))
	hostWC("LOCAL_INV")
	if st := rxe(agent.OpWrite, 0, 8, hmr.Addr+16384, mw2.RKey); st != agent.WCRemAccessErr {
		t.Fatalf("rxe WRITE through the invalidated window: status %d, want REM_ACCESS_ERR", st)
	}
}
