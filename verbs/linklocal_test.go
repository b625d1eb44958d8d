package verbs

import (
	"bytes"
	"testing"
	"time"

	"github.com/softroce/softroce/cq"
	"github.com/softroce/softroce/internal/netnstest"
	"github.com/softroce/softroce/nic/udp"
)

// openLinkLocalPair opens a device in each namespace of a veth pair on a
// udp.Multi of the end's link-local and IPv4 addresses.
func openLinkLocalPair(t *testing.T) (a, b *Device) {
	t.Helper()
	netnstest.Require(t)
	v := netnstest.Pair(t, netnstest.VethConfig{MTU: 1500, NoDAD: true})
	open := func(e *netnstest.End) (d *Device) {
		e.NS.Run(t, func() error {
			ll, err := udp.LinkLocalOf(e.Addr(), 5*time.Second)
			if err != nil {
				return err
			}
			m, err := udp.OpenMulti(udp.Config{}, ll, e.Addr())
			if err != nil {
				return err
			}
			if d, err = Open(m, nil); err != nil {
				m.Close()
			}
			return err
		})
		t.Cleanup(func() { d.Close() })
		return d
	}
	return open(v.A), open(v.B)
}

// TestLinkLocalGIDs: a device on an interface's link-local and IPv4
// addresses has the kernel's GID table order (0: the link-local GID, 1:
// the IPv4-mapped GID), and UD datagrams and an RC RDMA WRITE go both
// ways over either GID: GRH, completion and the AH built from it name the
// GID the datagram came to.
func TestLinkLocalGIDs(t *testing.T) {
	a, b := openLinkLocalPair(t)
	for _, d := range []*Device{a, b} {
		g := d.GIDTable()
		if len(g) != 2 || !g[0].Addr.Is6() || !g[0].Addr.IsLinkLocalUnicast() || !g[1].Addr.Is4() {
			t.Fatalf("%s: GID table %+v, want [link-local, IPv4]", d.Name(), g)
		}
		if p := d.QueryPort(); p.GIDTblLen != 2 {
			t.Errorf("%s: gid_tbl_len %d", d.Name(), p.GIDTblLen)
		}
	}
	sa, sb := newUDSide(t, a, 0x1234), newUDSide(t, b, 0x5678)
	for _, idx := range []int{0, 1} {
		ga, _ := a.QueryGID(idx)
		gb, _ := b.QueryGID(idx)
		var err error
		if sa.ah, err = sa.pd.CreateAH(AHAttr{DGID: gb, SGIDIndex: idx, HopLimit: 64}); err != nil {
			t.Fatal(err)
		}
		if sb.ah, err = sb.pd.CreateAH(AHAttr{DGID: ga, SGIDIndex: idx, HopLimit: 64}); err != nil {
			t.Fatal(err)
		}
		for _, dir := range []struct {
			from, to *udSide
			fromGID  GID
			qkey     uint32
		}{{sa, sb, ga, 0x5678}, {sb, sa, gb, 0x1234}} {
			from, to := dir.from, dir.to
			copy(from.buf, "over the link")
			if err := to.qp.PostRecv(&RecvWR{ID: 9, SGL: []SGE{{Addr: to.mr.Addr() + 4096, Length: GRHLen + 1024, LKey: to.mr.LKey()}}}); err != nil {
				t.Fatal(err)
			}
			if err := from.qp.PostSend(&SendWR{ID: 1, Opcode: WRSend, Flags: SendSignaled,
				SGL: []SGE{{Addr: from.mr.Addr(), Length: 13, LKey: from.mr.LKey()}},
				AH:  from.ah.AV(), RemoteQPN: to.qp.Num(), RemoteQKey: dir.qkey}); err != nil {
				t.Fatal(err)
			}
			if w := waitOne(t, from.cq, "send"); w.Status != cq.Success {
				t.Fatalf("GID %d: send completion %+v", idx, w)
			}
			rwc := waitOne(t, to.cq, "receive")
			wantV := uint8(6)
			if idx == 1 {
				wantV = 4
			}
			if rwc.Status != cq.Success || rwc.ByteLen != GRHLen+13 || rwc.IPVersion != wantV {
				t.Fatalf("GID %d: receive completion %+v, want success, IP version %d", idx, rwc, wantV)
			}
			grh := to.buf[4096 : 4096+GRHLen]
			if !bytes.Equal(to.buf[4096+GRHLen:4096+GRHLen+13], []byte("over the link")) {
				t.Errorf("GID %d: payload %q", idx, to.buf[4096+GRHLen:4096+GRHLen+13])
			}
			attr, err := to.d.AHAttrFromWC(&rwc, grh)
			if err != nil {
				t.Fatalf("GID %d: AH from WC: %v", idx, err)
			}
			if attr.SGIDIndex != idx || attr.DGID != dir.fromGID {
				t.Errorf("GID %d: AH from WC %+v, want sgid %d, dgid %v", idx, attr, idx, dir.fromGID)
			}
		}
	}

	// RC over the link-local GIDs.
	pda, ca, qa := newQP(t, a)
	pdb, cb, qb := newQP(t, b)
	mra, _ := pda.RegMR(make([]byte, 64), AccessLocalWrite)
	dst := make([]byte, 64)
	mrb, _ := pdb.RegMR(dst, AccessLocalWrite|AccessRemoteWrite)
	ga, _ := a.QueryGID(0)
	gb, _ := b.QueryGID(0)
	if err := qa.Connect(RemoteInfo{QPN: qb.Num(), PSN: 1, GID: gb}, &ConnectOptions{SQPSN: 1}); err != nil {
		t.Fatal(err)
	}
	if err := qb.Connect(RemoteInfo{QPN: qa.Num(), PSN: 1, GID: ga}, &ConnectOptions{SQPSN: 1}); err != nil {
		t.Fatal(err)
	}
	copy(mra.Buf(), "written over link-local")
	// With immediate data: b's completion orders the write before the
	// check of its target.
	if err := qb.PostRecv(&RecvWR{ID: 6}); err != nil {
		t.Fatal(err)
	}
	if err := qa.PostSend(&SendWR{ID: 5, Opcode: WRRDMAWriteWithImm, Imm: 1, Flags: SendSignaled,
		SGL: []SGE{{Addr: mra.Addr(), Length: 23, LKey: mra.LKey()}}, RemoteAddr: mrb.Addr(), RKey: mrb.RKey()}); err != nil {
		t.Fatal(err)
	}
	wcs := []WC{waitOne(t, ca, "RDMA WRITE")}
	if w := waitOne(t, cb, "RDMA WRITE receive"); w.Status != cq.Success || w.Opcode != cq.OpRecvRDMAWithImm {
		t.Fatalf("RDMA WRITE with immediate: receive completion %+v", w)
	}
	if wcs[0].Status != cq.Success || string(dst[:23]) != "written over link-local" {
		t.Fatalf("RDMA WRITE: %+v, target %q", wcs[0], dst[:23])
	}
	if st := a.Link().Stats(); st.TxErrors != 0 {
		t.Errorf("link stats %+v", st)
	}
}
