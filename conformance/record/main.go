// Command record regenerates the known-answer captures under
// icrc/testdata/rxe: RoCEv2 traffic between kernel rdma_rxe (in the qemu
// guest of package rxevm) and softroce, over IPv4 and IPv6, taken on the
// guest's tap device so that every frame is exactly what its sender put on
// the wire. Every ICRC in a frame rxe sent was computed by the kernel, an
// implementation independent of package icrc; frames softroce sent carry
// the project's own ICRC and are labelled so in the README it writes.
//
// It needs root, qemu, gcc and libibverbs-dev (see package rxevm) and, for
// the golden decoder fields, tshark:
//
//	go run ./conformance/record -out icrc/testdata/rxe   # as root, from the repository root
//
// Each address family gets two conversations on the same rxe device:
//
//   - verbs: softroce's verbs API on a nic/udp link against an rxe QP
//     driven by the verbs agent. rxe sends SEND, SEND with immediate, a
//     three-packet WRITE, WRITE with immediate, a READ request, CAS and
//     FAA (softroce answers); softroce sends the same kinds of requests and
//     rxe answers with ACKs, READ responses FIRST/MIDDLE/LAST and ONLY,
//     and ATOMIC ACKs.
//   - peer: the scripted fake peer of package conformance/cases provokes
//     rxe's NAKs one packet at a time: a PSN gap (NAK PSN sequence error),
//     a SEND with no receive posted (RNR NAK), a WRITE with a wrong rkey
//     (NAK remote access error).
//
// The path MTU is 256 so that multi-packet messages stay small.
package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
	"golang.org/x/sys/unix"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/conformance/agent"
	"github.com/softroce/softroce/conformance/cases"
	"github.com/softroce/softroce/conformance/rxevm"
	"github.com/softroce/softroce/internal/golden"
	"github.com/softroce/softroce/nic/udp"
	"github.com/softroce/softroce/verbs"
)

// The IPv6 addresses given to the tap (host side) and the guest's eth0;
// the VM itself is set up with IPv4 only.
var (
	host6  = netip.MustParseAddr("fd88::1")
	guest6 = netip.MustParseAddr("fd88::2")
)

const mtu = 256

// TsharkFields are the Wireshark fields of the golden files (names as
// `tshark -G fields` lists them, Wireshark 4.0). The decoder tests in
// packages inspect and bth read them back by name.
var tsharkFields = []string{"frame.number", "infiniband.bth.opcode", "infiniband.bth.destqp", "infiniband.bth.psn",
	"infiniband.reth.va", "infiniband.reth.r_key", "infiniband.reth.dmalen", "infiniband.aeth.syndrome", "infiniband.aeth.msn",
	"infiniband.atomiceth.swapdt", "infiniband.atomiceth.cmpdt", "infiniband.atomicacketh.origremdt",
	"infiniband.deth.q_key", "infiniband.deth.srcqp", "infiniband.immdt", "infiniband.ieth"}

func main() {
	out := flag.String("out", "icrc/testdata/rxe", "directory for the pcaps, golden files and README")
	flag.Parse()
	log.SetFlags(0)
	if err := run(*out); err != nil {
		log.Fatal("record: ", err)
	}
}

func run(out string) error {
	if _, err := exec.LookPath("tshark"); err != nil {
		return errors.New("tshark is needed for the golden fields (apt-get install tshark)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	vm, err := cases.BootRxeVM(ctx, os.Stderr)
	if err != nil {
		return err
	}
	stop := vm.CloseOnSignal()
	defer stop()
	defer vm.Close()
	if err := addIPv6(ctx, vm); err != nil {
		return err
	}
	ag, err := agent.Launch(ctx, vm, 7100)
	if err != nil {
		return err
	}
	defer ag.Close()
	if err := ag.Open(ctx, "rxe0"); err != nil {
		return err
	}
	idx6, err := gidIndex(ctx, ag, guest6)
	if err != nil {
		return err
	}

	var raw bytes.Buffer
	tc, err := vm.CaptureTap(&raw)
	if err != nil {
		return err
	}
	for _, fam := range []struct {
		name        string
		host, guest netip.Addr
		sgid        int
	}{{"IPv4", vm.HostAddr(), vm.GuestAddr(), 1}, {"IPv6", host6, guest6, idx6}} {
		if err := verbsConversation(ctx, vm, ag, fam.host, fam.sgid); err != nil {
			return fmt.Errorf("%s verbs conversation: %w", fam.name, err)
		}
		if err := peerConversation(ctx, vm, ag, fam.host, fam.guest, fam.sgid); err != nil {
			return fmt.Errorf("%s peer conversation: %w", fam.name, err)
		}
	}
	time.Sleep(300 * time.Millisecond) // let the last answers cross the tap
	if _, err := tc.Stop(); err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	files, err := split(raw.Bytes(), out, vm.GuestAddr(), guest6)
	if err != nil {
		return err
	}
	version, err := goldens(out, files)
	if err != nil {
		return err
	}
	release, _ := vm.Run(ctx, "uname -r")
	return writeReadme(out, files, strings.TrimSpace(release), version)
}

// addIPv6 gives the tap and the guest's eth0 an IPv6 address each (no
// duplicate address detection, so both are usable at once) and waits for
// rxe to add the guest's address to its GID table.
func addIPv6(ctx context.Context, vm *rxevm.VM) error {
	if b, err := vm.HostCommand(ctx, "ip", "-6", "addr", "add", host6.String()+"/64", "dev", rxevm.TapName, "nodad").CombinedOutput(); err != nil {
		return fmt.Errorf("host IPv6 address: %v: %s", err, b)
	}
	// busybox ip has no nodad: switch DAD off on the interface first.
	if _, err := vm.Run(ctx, "echo 0 > /proc/sys/net/ipv6/conf/eth0/accept_dad && ip -6 addr add "+guest6.String()+"/64 dev eth0"); err != nil {
		return fmt.Errorf("guest IPv6 address: %w", err)
	}
	// Resolve the neighbour once before rxe needs it (modify to RTR
	// resolves the destination's MAC and fails when that times out).
	var err error
	for try := 0; try < 10; try++ {
		if _, err = vm.Run(ctx, "ping -c 1 -W 1 "+host6.String()); err == nil {
			return nil
		}
	}
	return fmt.Errorf("guest cannot reach %v: %w", host6, err)
}

// gidIndex finds the rxe GID table entry for addr (rxe adds it shortly
// after the address appears).
func gidIndex(ctx context.Context, ag *agent.Client, addr netip.Addr) (int, error) {
	want := addr.As16()
	for try := 0; try < 50; try++ {
		for i := 0; i < 8; i++ {
			g, err := ag.GID(ctx, i)
			if err == nil && g == want {
				return i, nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return 0, fmt.Errorf("rxe0 has no GID for %v", addr)
}

// openLink opens a nic/udp link on host inside the VM's namespace. rxe
// sends UDP checksum 0 over IPv6 too, which a Linux UDPv6 socket drops
// unless UDP_NO_CHECK6_RX is set: the link's socket (found by its bound
// address) gets the option here.
func openLink(vm *rxevm.VM, host netip.Addr) (*udp.Link, error) {
	var link *udp.Link
	if err := vm.Do(func() error {
		var err error
		link, err = udp.Open(udp.Config{Addr: host})
		return err
	}); err != nil {
		return nil, err
	}
	if !host.Is6() {
		return link, nil
	}
	ents, _ := os.ReadDir("/proc/self/fd")
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		sa, err := unix.Getsockname(fd)
		if a, ok := sa.(*unix.SockaddrInet6); err == nil && ok && a.Port == 4791 && netip.AddrFrom16(a.Addr) == host {
			if err := unix.SetsockoptInt(fd, unix.IPPROTO_UDP, unix.UDP_NO_CHECK6_RX, 1); err != nil {
				link.Close()
				return nil, fmt.Errorf("UDP_NO_CHECK6_RX: %w", err)
			}
			return link, nil
		}
	}
	link.Close()
	return nil, fmt.Errorf("no socket bound to [%v]:4791", host)
}

// pattern is non-periodic test data.
func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*13) + byte(i>>7)
	}
	return b
}

// verbsConversation connects softroce (on host) with an rxe QP and runs
// one operation of each kind in each direction, one at a time.
func verbsConversation(ctx context.Context, vm *rxevm.VM, ag *agent.Client, host netip.Addr, sgid int) error {
	link, err := openLink(vm, host)
	if err != nil {
		return err
	}
	defer link.Close()
	dev, err := verbs.Open(link, nil)
	if err != nil {
		return err
	}
	defer dev.Close()

	const bufLen = 16384
	pd, err := ag.AllocPD(ctx)
	if err != nil {
		return err
	}
	amr, err := ag.RegMR(ctx, pd, bufLen, agent.AccessAll)
	if err != nil {
		return err
	}
	acq, err := ag.CreateCQ(ctx, 64)
	if err != nil {
		return err
	}
	aqp, err := ag.CreateQP(ctx, pd, acq, acq, agent.QPCap{SendWR: 16, RecvWR: 16})
	if err != nil {
		return err
	}
	if err := ag.ModifyToInit(ctx, aqp, agent.AccessAll); err != nil {
		return err
	}
	agid, err := ag.GID(ctx, sgid)
	if err != nil {
		return err
	}
	spd, err := dev.AllocPD()
	if err != nil {
		return err
	}
	buf := make([]byte, bufLen)
	copy(buf, pattern(bufLen, 0x5a))
	smr, err := spd.RegMR(buf, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead|verbs.AccessRemoteAtomic)
	if err != nil {
		return err
	}
	scq, err := dev.CreateCQ(64)
	if err != nil {
		return err
	}
	sqp, err := spd.CreateQP(verbs.QPInitAttr{SendCQ: scq, RecvCQ: scq, Cap: verbs.QPCap{MaxSendWR: 16, MaxRecvWR: 16}})
	if err != nil {
		return err
	}
	sgidv, err := dev.QueryGID(0)
	if err != nil {
		return err
	}
	const apsn, spsn = 0x100, 0x800
	if err := ag.ModifyToRTR(ctx, aqp, agent.RTRAttr{DestQPN: sqp.Num(), RecvPSN: spsn, DestGID: sgidv, MTU: mtu, MaxDestRdAtom: 4, SGIDIndex: sgid}); err != nil {
		return err
	}
	if err := ag.ModifyToRTS(ctx, aqp, agent.RTSAttr{SendPSN: apsn, Timeout: 14, Retry: 7, RNRRetry: 7, MaxRdAtom: 4}); err != nil {
		return err
	}
	if err := sqp.Connect(verbs.RemoteInfo{QPN: aqp.QPN, PSN: apsn, GID: agid}, &verbs.ConnectOptions{PathMTU: mtu, SQPSN: spsn, MaxRDAtomic: 4}); err != nil {
		return err
	}
	if err := ag.WriteMem(ctx, amr, 0, pattern(bufLen, 0xa5)); err != nil {
		return err
	}

	wcs := make([]verbs.WC, 1)
	swait := func(what string) error {
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		if _, err := scq.Wait(wctx, wcs); err != nil {
			return fmt.Errorf("%s: softroce completion: %w", what, err)
		}
		if wcs[0].Status != 0 {
			return fmt.Errorf("%s: softroce completion %+v", what, wcs[0])
		}
		return nil
	}
	await := func(what string) error {
		wc, err := ag.Poll(ctx, acq, 20*time.Second)
		if err != nil {
			return fmt.Errorf("%s: rxe completion: %w", what, err)
		}
		if wc == nil || wc.Status != 0 {
			return fmt.Errorf("%s: rxe completion %+v", what, wc)
		}
		return nil
	}
	sge := func(off, n int) []verbs.SGE {
		return []verbs.SGE{{Addr: smr.Addr() + uint64(off), Length: uint32(n), LKey: smr.LKey()}}
	}
	// Word for the atomics, 8-byte aligned in each side's buffer.
	const word = 8192
	var w [8]byte
	binary.LittleEndian.PutUint64(w[:], 1000)
	if err := ag.WriteMem(ctx, amr, word, w[:]); err != nil {
		return err
	}

	// rxe is the requester: softroce answers.
	for i := range 3 {
		if err := sqp.PostRecv(&verbs.RecvWR{ID: uint64(100 + i), SGL: sge(4096+i*1024, 1024)}); err != nil {
			return err
		}
	}
	for _, wr := range []agent.SendWR{
		{Op: agent.OpSend, Off: 0, Len: 40},
		{Op: agent.OpSendImm, Off: 64, Len: 20, Imm: 0x1234abcd},
		{Op: agent.OpWrite, Off: 128, Len: 600, RemoteAddr: smr.Addr() + 2048, RKey: smr.RKey()},
		{Op: agent.OpWriteImm, Off: 1024, Len: 16, RemoteAddr: smr.Addr() + 3000, RKey: smr.RKey(), Imm: 0x00c0ffee},
		{Op: agent.OpRead, Off: 2048, Len: 600, RemoteAddr: smr.Addr() + 6000, RKey: smr.RKey()},
		{Op: agent.OpCmpSwap, Off: 4000, Len: 8, RemoteAddr: smr.Addr() + word, RKey: smr.RKey(), Compare: binary.LittleEndian.Uint64(buf[word:]), Swap: 0x1111},
		{Op: agent.OpFetchAdd, Off: 4008, Len: 8, RemoteAddr: smr.Addr() + word, RKey: smr.RKey(), Add: 5},
	} {
		wr.MR, wr.WRID = amr, 1
		if err := ag.PostSend(ctx, aqp, wr); err != nil {
			return err
		}
		if err := await(string(wr.Op)); err != nil {
			return err
		}
		if wr.Op == agent.OpSend || wr.Op == agent.OpSendImm || wr.Op == agent.OpWriteImm {
			if err := swait(string(wr.Op) + " receive"); err != nil {
				return err
			}
		}
	}

	// softroce is the requester: rxe answers.
	for i := range 2 {
		if err := ag.PostRecv(ctx, aqp, uint64(200+i), amr, 10000+i*1024, 1024); err != nil {
			return err
		}
	}
	for _, wr := range []verbs.SendWR{
		{Opcode: verbs.WRSend, SGL: sge(0, 40)},
		{Opcode: verbs.WRSendWithImm, SGL: sge(64, 20), Imm: 0x0badcafe},
		{Opcode: verbs.WRRDMAWrite, SGL: sge(128, 600), RemoteAddr: amr.Addr + 12288, RKey: amr.RKey},
		{Opcode: verbs.WRRDMARead, SGL: sge(12288, 600), RemoteAddr: amr.Addr + 512, RKey: amr.RKey},
		{Opcode: verbs.WRRDMARead, SGL: sge(13312, 100), RemoteAddr: amr.Addr + 1500, RKey: amr.RKey},
		{Opcode: verbs.WRAtomicCmpAndSwp, SGL: sge(14000, 8), RemoteAddr: amr.Addr + word, RKey: amr.RKey, CompareAdd: 1000, Swap: 0x2222},
		{Opcode: verbs.WRAtomicFetchAndAdd, SGL: sge(14008, 8), RemoteAddr: amr.Addr + word, RKey: amr.RKey, CompareAdd: 7},
	} {
		wr.ID, wr.Flags = 1, verbs.SendSignaled
		if err := sqp.PostSend(&wr); err != nil {
			return err
		}
		if err := swait(fmt.Sprint(wr.Opcode)); err != nil {
			return err
		}
		if wr.Opcode == verbs.WRSend || wr.Opcode == verbs.WRSendWithImm {
			if err := await(fmt.Sprint(wr.Opcode) + " receive"); err != nil {
				return err
			}
		}
	}
	time.Sleep(200 * time.Millisecond) // the last ACK
	return nil
}

// peerConversation provokes rxe's NAKs with exact packets from the fake
// peer.
func peerConversation(ctx context.Context, vm *rxevm.VM, ag *agent.Client, host, guest netip.Addr, sgid int) error {
	link, err := openLink(vm, host)
	if err != nil {
		return err
	}
	peer, err := cases.NewPeer(link)
	if err != nil {
		link.Close()
		return err
	}
	defer peer.Close()

	pd, err := ag.AllocPD(ctx)
	if err != nil {
		return err
	}
	mr, err := ag.RegMR(ctx, pd, 4096, agent.AccessAll)
	if err != nil {
		return err
	}
	cq, err := ag.CreateCQ(ctx, 16)
	if err != nil {
		return err
	}
	qp, err := ag.CreateQP(ctx, pd, cq, cq, agent.QPCap{SendWR: 4, RecvWR: 4})
	if err != nil {
		return err
	}
	if err := ag.ModifyToInit(ctx, qp, agent.AccessAll); err != nil {
		return err
	}
	const peerQPN, epsn = 0x0abcde, 0x200
	// RNR timer code 14 (1.28 ms) so that the NAK's timer is visible.
	if err := ag.ModifyToRTR(ctx, qp, agent.RTRAttr{DestQPN: peerQPN, RecvPSN: epsn, DestGID: peer.GID(), MTU: mtu, SGIDIndex: sgid, MinRNRTimer: 14}); err != nil {
		return err
	}
	if err := ag.ModifyToRTS(ctx, qp, agent.RTSAttr{SendPSN: 0x300, Timeout: 14, Retry: 7, RNRRetry: 7}); err != nil {
		return err
	}
	c := peer.NewConv(ctx, guest, peerQPN, qp.QPN)
	steps := []struct {
		what string
		f    bth.Fields
		n    int
		want bth.Syndrome
	}{
		{"SEND_ONLY one PSN ahead of the expected one", bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCSendOnly, PSN: epsn + 1, AckReq: true}}, 8, bth.SyndromePSNSeqError},
		{"SEND_ONLY at the expected PSN, no receive posted", bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCSendOnly, PSN: epsn, AckReq: true}}, 8, bth.RNRNAK(14)},
		{"RDMA_WRITE_ONLY with a wrong rkey", bth.Fields{BTH: bth.BTHFields{Opcode: bth.RCWriteOnly, PSN: epsn, AckReq: true},
			VA: mr.Addr, RKey: mr.RKey ^ 0x5a5a00, DMALen: 16}, 16, bth.SyndromeRemoteAccessError},
	}
	for _, s := range steps {
		if _, err := c.Send(s.f, pattern(s.n, 0x33)); err != nil {
			return err
		}
		got := c.Expect(2*time.Second, 1)
		if len(got) != 1 || got[0].Opcode() != bth.RCAck || got[0].Syndrome() != s.want {
			return fmt.Errorf("%s: rxe answered %v, want one ACKNOWLEDGE with syndrome %v", s.what, got, s.want)
		}
	}
	// Nothing else may follow (a second NAK would be a recording of
	// something other than what the README says).
	if more := c.Collect(300*time.Millisecond, nil); len(more) != 0 {
		return fmt.Errorf("unexpected packets after the NAKs: %v", more)
	}
	return nil
}

// capFile is one trimmed capture.
type capFile struct {
	name   string
	frames []frameInfo
}

type frameInfo struct {
	byRxe bool
	desc  string
}

// split keeps the RoCEv2 frames of the raw tap capture and writes them to
// rxe-ipv4.pcap and rxe-ipv6.pcap.
func split(raw []byte, out string, guest4, guest6 netip.Addr) ([]*capFile, error) {
	r, err := pcapgo.NewReader(bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	v4 := &capFile{name: "rxe-ipv4.pcap"}
	v6 := &capFile{name: "rxe-ipv6.pcap"}
	var bufs [2]bytes.Buffer
	ws := [2]*pcapgo.Writer{pcapgo.NewWriter(&bufs[0]), pcapgo.NewWriter(&bufs[1])}
	for _, w := range ws {
		if err := w.WriteFileHeader(65535, layers.LinkTypeEthernet); err != nil {
			return nil, err
		}
	}
	for {
		data, ci, err := r.ReadPacketData()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		pkt := gopacket.NewPacket(data, layers.LayerTypeEthernet, gopacket.NoCopy)
		u, _ := pkt.Layer(layers.LayerTypeUDP).(*layers.UDP)
		if u == nil || u.DstPort != 4791 {
			continue
		}
		var src netip.Addr
		k := 0
		if ip, ok := pkt.Layer(layers.LayerTypeIPv4).(*layers.IPv4); ok {
			src, _ = netip.AddrFromSlice(ip.SrcIP)
		} else if ip, ok := pkt.Layer(layers.LayerTypeIPv6).(*layers.IPv6); ok {
			src, _ = netip.AddrFromSlice(ip.SrcIP)
			k = 1
		} else {
			continue
		}
		var p bth.Packet
		desc := "unparsable"
		if err := bth.Parse(&p, u.Payload); err == nil {
			desc = fmt.Sprintf("%v psn 0x%06x", p.BTH.Opcode(), p.BTH.PSN())
			if p.AETH != nil {
				desc += fmt.Sprintf(" syndrome 0x%02x (%v)", uint8(p.AETH.Syndrome()), p.AETH.Syndrome())
			}
		}
		fi := frameInfo{byRxe: src == guest4 || src == guest6, desc: desc}
		if err := ws[k].WritePacket(ci, data); err != nil {
			return nil, err
		}
		f := []*capFile{v4, v6}[k]
		f.frames = append(f.frames, fi)
	}
	for i, f := range []*capFile{v4, v6} {
		if len(f.frames) == 0 {
			return nil, fmt.Errorf("%s: no RoCE frames captured", f.name)
		}
		if err := os.WriteFile(filepath.Join(out, f.name), bufs[i].Bytes(), 0o644); err != nil {
			return nil, err
		}
	}
	return []*capFile{v4, v6}, nil
}

// goldens writes NAME.tshark beside each capture: tshark's -T fields
// output for tsharkFields, after two comment lines naming the version and
// the fields.
func goldens(out string, files []*capFile) (string, error) {
	version, err := golden.Version("tshark")
	if err != nil {
		return "", err
	}
	for _, f := range files {
		name := strings.TrimSuffix(f.name, ".pcap") + ".tshark"
		if err := golden.Write("tshark", version, filepath.Join(out, f.name), filepath.Join(out, name), tsharkFields); err != nil {
			return "", err
		}
	}
	return version, nil
}

func writeReadme(out string, files []*capFile, release, tshark string) error {
	var b strings.Builder
	fmt.Fprintf(&b, `# Known-answer captures from kernel rdma_rxe

Recorded on the tap device of the rdma_rxe guest (package conformance/rxevm,
guest kernel %s), path MTU %d, by:

    go run ./conformance/record -out icrc/testdata/rxe   # as root, from the repository root

(root, qemu, gcc, libibverbs-dev and tshark; the guest image is built on
first use). The program overwrites every file here, this README included.
The known-answer tests icrc/kat_test.go, inspect/kat_test.go and
bth/kat_test.go read these files; they need neither the VM nor tshark.

| file | contents |
|---|---|
| rxe-ipv4.pcap | RoCEv2 over IPv4 (10.88.0.1 softroce, 10.88.0.2 rxe) |
| rxe-ipv6.pcap | RoCEv2 over IPv6 (fd88::1 softroce, fd88::2 rxe) |
| rxe-ipv4.tshark, rxe-ipv6.tshark | the golden decoder fields: `+"`tshark -T fields`"+` output for each frame, recorded with the capture (%s) |

Frames whose source is the rxe guest (10.88.0.2, fd88::2) were built by the
kernel: their ICRC is an independent answer for package icrc. Frames whose
source is the host (10.88.0.1, fd88::1) were sent by softroce and carry its
own ICRC: they check consistency, not correctness.

In each file, a verbs conversation (softroce's verbs API against an rxe QP
driven by the verbs agent: rxe requests answered by softroce, then
softroce requests answered by rxe) is followed by the fake peer of package
conformance/cases provoking rxe's NAKs, one exact packet each: a PSN one
ahead of the expected one (NAK PSN sequence error), a SEND with no receive
posted (RNR NAK, timer code 14), a WRITE with a wrong rkey (NAK remote
access error). Those requests are softroce-built too.

rxe picks a new nonzero IPv4 Identification for each packet, which its
ICRC covers; softroce sends ID 0 (docs/platform.md, ICRC). UDP checksums
are whatever each side's kernel put there: 0 from rxe, also over IPv6.
`, release, mtu, tshark)
	for _, f := range files {
		fmt.Fprintf(&b, "\n## %s\n\n| frame | sent by | ICRC | packet |\n|---|---|---|---|\n", f.name)
		for i, fr := range f.frames {
			who, icrc := "softroce", "own (not independent)"
			if fr.byRxe {
				who, icrc = "rxe", "kernel (independent)"
			}
			fmt.Fprintf(&b, "| %d | %s | %s | %s |\n", i+1, who, icrc, fr.desc)
		}
	}
	return os.WriteFile(filepath.Join(out, "README.md"), []byte(b.String()), 0o644)
}
