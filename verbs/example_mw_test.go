package verbs_test

import (
	"fmt"

	"github.com/softroce/softroce/verbs"
)

// A type 2 memory window lends the peer remote access to a part of a
// region, for as long as the window is bound: here the peer WRITEs
// through it, then a SEND with invalidate closes it.
func Example_memoryWindow() {
	a, b := pair()
	defer a.dev.Close()
	defer b.dev.Close()

	// The region itself grants no remote rights, only MW_BIND.
	shared := make([]byte, 4096)
	smr, _ := b.pd.RegMR(shared, verbs.AccessLocalWrite|verbs.AccessMWBind)
	mw, _ := b.pd.AllocMW(verbs.MWType2)
	bind := mw.BindWR(1, verbs.SendSignaled, smr, smr.Addr()+1024, 512, verbs.AccessRemoteWrite, verbs.IncRKey(mw.RKey()))
	if err := b.qp.PostSend(&bind); err != nil {
		panic(err)
	}
	fmt.Println(b.wait().Opcode)
	rkey := mw.RKey() // what b tells a out of band

	copy(a.buf, "through a window")
	a.qp.PostSend(&verbs.SendWR{ID: 2, Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled,
		SGL: []verbs.SGE{{Addr: a.mr.Addr(), Length: 16, LKey: a.mr.LKey()}}, RemoteAddr: smr.Addr() + 1024, RKey: rkey})
	fmt.Println(a.wait().Status)
	fmt.Printf("%s\n", shared[1024:1040])

	// a is done: its SEND with invalidate unbinds the window.
	b.qp.PostRecv(&verbs.RecvWR{ID: 3, SGL: []verbs.SGE{{Addr: b.mr.Addr(), Length: 64, LKey: b.mr.LKey()}}})
	a.qp.PostSend(&verbs.SendWR{ID: 4, Opcode: verbs.WRSendWithInv, Flags: verbs.SendSignaled, InvRKey: rkey,
		SGL: []verbs.SGE{{Addr: a.mr.Addr(), Length: 4, LKey: a.mr.LKey()}}})
	a.wait()
	wc := b.wait()
	fmt.Println(wc.Status, wc.InvalidatedRKey == rkey)
	// Output:
	// BIND_MW
	// success
	// through a window
	// success true
}

// A type 1 window is bound with MW.Bind (ibv_bind_mw): the bind is a work
// request on the QP's send queue, runs after what was posted before it,
// and completes with BIND_MW; its new rkey is known at once.
func Example_memoryWindowType1() {
	a, b := pair()
	defer a.dev.Close()
	defer b.dev.Close()

	shared := make([]byte, 4096)
	smr, _ := b.pd.RegMR(shared, verbs.AccessLocalWrite|verbs.AccessMWBind)
	mw, _ := b.pd.AllocMW(verbs.MWType1)
	rkey, err := mw.Bind(b.qp, verbs.MWBindInfo{MR: smr, Addr: smr.Addr(), Length: 256, Access: verbs.AccessRemoteRead}, 1, verbs.SendSignaled)
	if err != nil {
		panic(err)
	}
	wc := b.wait()
	fmt.Println(wc.Opcode, wc.Status, rkey == mw.RKey())

	copy(shared, "read me")
	a.qp.PostSend(&verbs.SendWR{ID: 2, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
		SGL: []verbs.SGE{{Addr: a.mr.Addr(), Length: 7, LKey: a.mr.LKey()}}, RemoteAddr: smr.Addr(), RKey: rkey})
	fmt.Println(a.wait().Status)
	fmt.Printf("%s\n", a.buf[:7])
	// Output:
	// BIND_MW success true
	// success
	// read me
}
