// Command recordcm records the connection management captures under
// inspect/testdata/rxe-cm: IB CM MADs on QP1 between kernel rdma_rxe (in
// the qemu guest of package rxevm, driven by rdmacm-utils' rping) and a
// host side that builds its MADs with package bth/mad, taken on the
// guest's tap device so that every frame is exactly what its sender put
// on the wire.
//
// It needs root and qemu (see package rxevm) and, for the golden decoder
// fields, tshark:
//
//	go run ./conformance/recordcm -out inspect/testdata/rxe-cm   # as root, from the repository root
//
// The capture holds, in order:
//
//   - a full exchange with the guest's CM: rping -s listens on port 7174,
//     the host sends a REQ (RDMA_PS_TCP:7174, with a cma_hdr), the guest
//     answers REP, the host sends RTU, then DREQ, and the guest answers
//     DREP; then the same REQ twice in a row to rping -s on port 7178 (the
//     kernel answers the duplicate with an MRA when it arrives before the
//     accept, then REP) and a host REJ of that REP;
//   - a REQ for a port nobody listens on (7175): the guest's CM answers
//     REJ reason 8 (invalid service ID);
//   - the guest's rping client connecting to the host (port 7176) where
//     nothing answers: its REQ and the CM's retransmissions of it, then,
//     when rping is killed, the REJ reason 4 (timeout) its CM sends as it
//     destroys the half-open connection;
//   - the guest's rping client connecting again (port 7177), answered by a
//     host REJ reason 28 (consumer defined) with private data;
//   - service ID resolution with udaddy (RDMA_PS_UDP:7174): a host
//     SIDR_REQ to udaddy -b answered SIDR_REP (the recorder checks, with
//     the codec's offsets, that it echoes the request ID and service ID
//     and carries Q_Key 0x01234567), a SIDR_REQ for a port nobody listens
//     on, and the guest's udaddy -s resolving the host, answered by a host
//     SIDR_REP, after which udaddy sends its datagram to the QP named.
//
// Frames from the guest (10.88.0.2) were built by the kernel's CM and
// rxe; frames from the host (10.88.0.1) by package bth/mad.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/bth/mad"
	"github.com/softroce/softroce/conformance/cases"
	"github.com/softroce/softroce/conformance/rxevm"
	"github.com/softroce/softroce/inspect"
	"github.com/softroce/softroce/internal/golden"
	"github.com/softroce/softroce/nic/udp"
)

// Ports of the four exchanges, and the host side's made-up identities.
const (
	portAccept  = 7174
	portNoOne   = 7175
	portSilent  = 7176
	portRejects = 7177
	portDup     = 7178

	udaddyPort = 7174 // udaddy's fixed port, in RDMA_PS_UDP

	hostQPN     = 0x000abc
	hostUDQPN   = 0x000abd
	hostPSN     = 0x123456
	hostGUID    = 0x0200000000000001
	hostCMAPort = 40000
	commBase    = 0x50f70000
)

func main() {
	out := flag.String("out", "inspect/testdata/rxe-cm", "directory for the pcap, its golden file and README")
	flag.Parse()
	log.SetFlags(0)
	if err := run(*out); err != nil {
		log.Fatal("recordcm: ", err)
	}
}

func run(out string) error {
	if _, err := exec.LookPath("tshark"); err != nil {
		return errors.New("tshark is needed for the golden fields (apt-get install tshark)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	img, err := rxevm.Build(ctx, rxevm.Config{Log: os.Stderr})
	if err != nil {
		return fmt.Errorf("build the rxe guest image: %w", err)
	}
	vm, err := rxevm.Boot(ctx, img, rxevm.Options{Log: os.Stderr})
	if err != nil {
		return fmt.Errorf("boot the rxe guest: %w", err)
	}
	stop := vm.CloseOnSignal()
	defer stop()
	defer vm.Close()

	var link *udp.Link
	if err := vm.Do(func() error {
		var err error
		link, err = udp.Open(udp.Config{Addr: vm.HostAddr()})
		return err
	}); err != nil {
		return err
	}
	peer, err := cases.NewPeer(link)
	if err != nil {
		link.Close()
		return err
	}
	defer peer.Close()

	var raw bytes.Buffer
	tc, err := vm.CaptureTap(&raw)
	if err != nil {
		return err
	}
	notes, err := exchanges(ctx, vm, peer)
	if err != nil {
		tc.Stop()
		return err
	}
	time.Sleep(300 * time.Millisecond) // let the last answers cross the tap
	if _, err := tc.Stop(); err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	const name = "rxe-cm.pcap"
	frames, err := keepRoCE(raw.Bytes(), filepath.Join(out, name), vm.GuestAddr())
	if err != nil {
		return err
	}
	version, err := writeGolden(filepath.Join(out, name), filepath.Join(out, "rxe-cm.tshark"))
	if err != nil {
		return err
	}
	release, _ := vm.Run(ctx, "uname -r")
	return writeReadme(out, name, frames, notes, strings.TrimSpace(release), version)
}

// cm is the host side's QP1 conversation with the guest's QP1.
type cm struct {
	conv *cases.Conv
	psn  uint32
	buf  []byte
}

// send sends one MAD as a UD SEND_ONLY to the guest's QP1.
func (c *cm) send(m mad.MAD) error {
	f := bth.Fields{BTH: bth.BTHFields{Opcode: bth.UDSendOnly, PKey: 0xffff, PSN: c.psn}, QKey: mad.QP1QKey, SrcQP: mad.GSIQPN}
	c.psn = bth.PSNAdd(c.psn, 1)
	_, err := c.conv.Send(f, m)
	return err
}

// next waits up to d for a CM MAD from the guest for which want is true.
func (c *cm) next(d time.Duration, want func(mad.MAD) bool) (mad.MAD, error) {
	var got mad.MAD
	c.conv.Collect(d, func(p *cases.Pkt) bool {
		if p.ParseErr != nil || p.P.DETH == nil {
			return false
		}
		m, err := mad.Parse(p.P.Payload)
		if err != nil || !want(m) {
			return false
		}
		got = mad.MAD(bytes.Clone(m))
		return true
	})
	if got == nil {
		return nil, errors.New("no answer from the guest's CM")
	}
	return got, nil
}

func attr(a ...mad.AttrID) func(mad.MAD) bool {
	return func(m mad.MAD) bool {
		for _, x := range a {
			if m.AttrID() == x {
				return true
			}
		}
		return false
	}
}

// req builds the host's REQ as the kernel's rdma_cm would for a
// connection from the host to port on the guest.
func (c *cm) req(vm *rxevm.VM, commID uint32, port uint16) mad.MAD {
	m := mad.MAD(c.buf).Init(mad.AttrREQ, uint64(1)<<32|uint64(commID))
	r := m.REQ()
	r.SetLocalCommID(commID)
	r.SetServiceID(mad.RDMACMServiceID(mad.PortSpaceTCP, port))
	r.SetLocalCAGUID(hostGUID)
	r.SetLocalQPN(hostQPN)
	r.SetResponderResources(1)
	r.SetInitiatorDepth(1)
	r.SetRemoteCMResponseTimeout(20)
	r.SetTransportType(mad.TransportRC)
	r.SetStartingPSN(hostPSN)
	r.SetLocalCMResponseTimeout(20)
	r.SetRetryCount(7)
	r.SetPKey(0xffff)
	r.SetPathMTU(3)
	r.SetRNRRetryCount(7)
	r.SetMaxCMRetries(15)
	p := r.Primary()
	p.SetLocalLID(0xffff)
	p.SetRemoteLID(0xffff)
	p.SetLocalGID(vm.HostAddr())
	p.SetRemoteGID(vm.GuestAddr())
	p.SetHopLimit(64)
	p.SetLocalAckTimeout(19)
	r.CMAHeader().Encode(netip.AddrPortFrom(vm.HostAddr(), hostCMAPort), vm.GuestAddr())
	return m
}

func exchanges(ctx context.Context, vm *rxevm.VM, peer *cases.Peer) ([]string, error) {
	var notes []string
	c := &cm{conv: peer.NewConv(ctx, vm.GuestAddr(), mad.GSIQPN, mad.GSIQPN), psn: 0x10, buf: make([]byte, mad.Len)}

	// 1. REQ / REP / RTU / DREQ / DREP against a listening rping server.
	srv, err := vm.Start(ctx, fmt.Sprintf("rping -s -v -a %s -p %d -C 1", vm.GuestAddr(), portAccept))
	if err != nil {
		return nil, err
	}
	defer srv.Kill()
	var rep mad.MAD
	commID := uint32(commBase + 1)
	for try := 0; ; try++ {
		// The server needs a moment to listen under TCG; until then the
		// guest's CM answers REJ 8.
		time.Sleep(2 * time.Second)
		if err := c.send(c.req(vm, commID, portAccept)); err != nil {
			return nil, err
		}
		m, err := c.next(10*time.Second, attr(mad.AttrREP, mad.AttrREJ))
		if err != nil {
			return nil, fmt.Errorf("REQ to port %d: %w", portAccept, err)
		}
		if m.AttrID() == mad.AttrREP {
			rep = m
			break
		}
		if try == 5 {
			return nil, fmt.Errorf("REQ to port %d: REJ reason %v", portAccept, m.REJ().Reason())
		}
		commID++
	}
	tid := uint64(1)<<32 | uint64(commID)
	remote := rep.REP().LocalCommID()
	m := mad.MAD(c.buf).Init(mad.AttrRTU, tid)
	m.RTU().SetLocalCommID(commID)
	m.RTU().SetRemoteCommID(remote)
	if err := c.send(m); err != nil {
		return nil, err
	}
	time.Sleep(500 * time.Millisecond)
	m = mad.MAD(c.buf).Init(mad.AttrDREQ, tid)
	m.DREQ().SetLocalCommID(commID)
	m.DREQ().SetRemoteCommID(remote)
	m.DREQ().SetRemoteQPN(rep.REP().LocalQPN())
	if err := c.send(m); err != nil {
		return nil, err
	}
	if _, err := c.next(10*time.Second, attr(mad.AttrDREP)); err != nil {
		return nil, fmt.Errorf("DREQ: %w", err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	out, werr := srv.Wait(wctx)
	wcancel()
	notes = append(notes, fmt.Sprintf("rping -s on port %d (exit: %s): %s", portAccept, errLine(werr), oneLine(out)))

	// 1b. A duplicate REQ right behind the first, before the server has
	// accepted, then a REJ of the REP.
	more, err := duplicate(ctx, vm, c)
	if err != nil {
		return nil, err
	}
	notes = append(notes, more)

	// 2. REQ for a port nobody listens on.
	if err := c.send(c.req(vm, commBase+0x100, portNoOne)); err != nil {
		return nil, err
	}
	rej, err := c.next(10*time.Second, attr(mad.AttrREJ))
	if err != nil {
		return nil, fmt.Errorf("REQ to port %d: %w", portNoOne, err)
	}
	notes = append(notes, fmt.Sprintf("REQ to port %d: REJ reason %d (%v)", portNoOne, rej.REJ().Reason(), rej.REJ().Reason()))

	// 3. The guest's rping client towards a host that never answers.
	cli, err := vm.Start(ctx, fmt.Sprintf("rping -c -a %s -p %d -C 1", vm.HostAddr(), portSilent))
	if err != nil {
		return nil, err
	}
	n := 0
	c.conv.Collect(15*time.Second, func(p *cases.Pkt) bool {
		if p.ParseErr == nil && p.P.DETH != nil {
			if m, err := mad.Parse(p.P.Payload); err == nil && m.AttrID() == mad.AttrREQ {
				n++
			}
		}
		return false
	})
	cli.Kill()
	notes = append(notes, fmt.Sprintf("rping -c to port %d, unanswered: %d REQs in 15 s", portSilent, n))

	// 4. The guest's rping client, rejected by the host with private data.
	cli, err = vm.Start(ctx, fmt.Sprintf("rping -c -a %s -p %d -C 1", vm.HostAddr(), portRejects))
	if err != nil {
		return nil, err
	}
	defer cli.Kill()
	greq, err := c.next(20*time.Second, attr(mad.AttrREQ))
	if err != nil {
		return nil, fmt.Errorf("rping -c to port %d: %w", portRejects, err)
	}
	m = mad.MAD(c.buf).Init(mad.AttrREJ, greq.TID())
	r := m.REJ()
	r.SetLocalCommID(commBase + 0x200)
	r.SetRemoteCommID(greq.REQ().LocalCommID())
	r.SetMsgRejected(mad.RejectedREQ)
	r.SetReason(mad.RejConsumerDefined)
	if err := r.SetPrivateData([]byte("softroce says no")); err != nil {
		return nil, err
	}
	if err := c.send(m); err != nil {
		return nil, err
	}
	wctx, wcancel = context.WithTimeout(ctx, 15*time.Second)
	out, werr = cli.Wait(wctx)
	wcancel()
	notes = append(notes, fmt.Sprintf("rping -c to port %d, rejected with reason 28 (exit: %s): %s", portRejects, errLine(werr), oneLine(out)))

	resolved, err := sidr(ctx, vm, c)
	return append(notes, resolved...), err
}

// duplicate sends a REQ twice in a row to a listening rping server: the
// kernel's CM answers a duplicate that arrives before the consumer's
// accept with an MRA (rdma_cm asks for one only after a duplicate), then
// REP. The host then rejects the REP.
func duplicate(ctx context.Context, vm *rxevm.VM, c *cm) (string, error) {
	srv, err := vm.Start(ctx, fmt.Sprintf("rping -s -v -a %s -p %d -C 1", vm.GuestAddr(), portDup))
	if err != nil {
		return "", err
	}
	defer srv.Kill()
	commID := uint32(commBase + 0x500)
	var rep mad.MAD
	mras := 0
	var mra mad.MAD
	for try := 0; ; try++ {
		time.Sleep(2 * time.Second)
		req := c.req(vm, commID, portDup)
		if err := c.send(req); err != nil {
			return "", err
		}
		if err := c.send(req); err != nil {
			return "", err
		}
		m, err := c.next(10*time.Second, func(m mad.MAD) bool {
			if m.AttrID() == mad.AttrMRA {
				mras++
				mra = mad.MAD(bytes.Clone(m))
				return false
			}
			return m.AttrID() == mad.AttrREP || m.AttrID() == mad.AttrREJ
		})
		if err != nil {
			return "", fmt.Errorf("duplicate REQ to port %d: %w", portDup, err)
		}
		if m.AttrID() == mad.AttrREP {
			rep = m
			break
		}
		if try == 5 {
			return "", fmt.Errorf("duplicate REQ to port %d: REJ reason %v", portDup, m.REJ().Reason())
		}
		commID++
	}
	m := mad.MAD(c.buf).Init(mad.AttrREJ, rep.TID())
	r := m.REJ()
	r.SetLocalCommID(commID)
	r.SetRemoteCommID(rep.REP().LocalCommID())
	r.SetMsgRejected(mad.RejectedREP)
	r.SetReason(mad.RejConsumerDefined)
	if err := c.send(m); err != nil {
		return "", err
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	out, werr := srv.Wait(wctx)
	cancel()
	note := fmt.Sprintf("the same REQ twice to rping -s on port %d: %d MRA", portDup, mras)
	if mra != nil {
		note += fmt.Sprintf(" (message MRAed %d, service timeout %d)", mra.MRA().MsgMRAed(), mra.MRA().ServiceTimeout())
	}
	return note + fmt.Sprintf(", then REP; the host's REJ of the REP ended rping (exit: %s): %s", errLine(werr), oneLine(out)), nil
}

// sidr records service ID resolution with udaddy (RDMA_PS_UDP, port
// 7174, the only one udaddy uses): a host SIDR_REQ to a listening udaddy
// answered SIDR_REP, one to a port nobody listens on, and the guest's
// udaddy client resolving the host, answered by a host SIDR_REP.
func sidr(ctx context.Context, vm *rxevm.VM, c *cm) ([]string, error) {
	var notes []string
	sreq := func(reqID uint32, port uint16) mad.MAD {
		m := mad.MAD(c.buf).Init(mad.AttrSIDRREQ, uint64(2)<<32|uint64(reqID))
		q := m.SIDRREQ()
		q.SetRequestID(reqID)
		q.SetPKey(0xffff)
		q.SetServiceID(mad.RDMACMServiceID(mad.PortSpaceUDP, port))
		q.CMAHeader().Encode(netip.AddrPortFrom(vm.HostAddr(), hostCMAPort), vm.GuestAddr())
		return m
	}
	// 5. SIDR_REQ to a listening udaddy server.
	srv, err := vm.Start(ctx, fmt.Sprintf("udaddy -b %s -C 1", vm.GuestAddr()))
	if err != nil {
		return nil, err
	}
	defer srv.Kill()
	var rep mad.MAD
	reqID := uint32(commBase + 0x300)
	for try := 0; ; try++ {
		time.Sleep(2 * time.Second)
		if err := c.send(sreq(reqID, udaddyPort)); err != nil {
			return nil, err
		}
		m, err := c.next(10*time.Second, attr(mad.AttrSIDRREP))
		if err != nil {
			return nil, fmt.Errorf("SIDR_REQ to udaddy: %w", err)
		}
		if m.SIDRREP().Status() == mad.SIDRSuccess {
			rep = m
			break
		}
		if try == 5 {
			return nil, fmt.Errorf("SIDR_REQ to udaddy: status %d", m.SIDRREP().Status())
		}
		reqID++
	}
	// The kernel's answer, read with the codec's offsets, must echo the
	// request and carry rdma_cm's UD Q_Key.
	p := rep.SIDRREP()
	if p.RequestID() != reqID || p.ServiceID() != mad.RDMACMServiceID(mad.PortSpaceUDP, udaddyPort) || p.QKey() != mad.RDMAUDPQKey || p.QPN() == 0 {
		return nil, fmt.Errorf("SIDR_REP: request ID %#x service %v Q_Key %#x QPN %#x", p.RequestID(), p.ServiceID(), p.QKey(), p.QPN())
	}
	notes = append(notes, fmt.Sprintf("SIDR_REQ to udaddy (%v): SIDR_REP status 0, QPN 0x%06x, Q_Key 0x%08x", p.ServiceID(), p.QPN(), p.QKey()))
	srv.Kill()

	// 6. SIDR_REQ for a port nobody listens on.
	if err := c.send(sreq(commBase+0x400, udaddyPort+1)); err != nil {
		return nil, err
	}
	m, err := c.next(10*time.Second, attr(mad.AttrSIDRREP))
	if err != nil {
		return nil, fmt.Errorf("SIDR_REQ to port %d: %w", udaddyPort+1, err)
	}
	notes = append(notes, fmt.Sprintf("SIDR_REQ to port %d: SIDR_REP status %d (%s)", udaddyPort+1, m.SIDRREP().Status(), mad.SIDRStatusName(m.SIDRREP().Status())))

	// 7. The guest's udaddy client resolving the host, answered by the host.
	cli, err := vm.Start(ctx, fmt.Sprintf("udaddy -s %s -C 1", vm.HostAddr()))
	if err != nil {
		return nil, err
	}
	defer cli.Kill()
	greq, err := c.next(20*time.Second, attr(mad.AttrSIDRREQ))
	if err != nil {
		return nil, fmt.Errorf("udaddy -s: %w", err)
	}
	q := greq.SIDRREQ()
	h, err := mad.ParseCMAHeader(q.PrivateData())
	if err != nil || q.ServiceID() != mad.RDMACMServiceID(mad.PortSpaceUDP, udaddyPort) || h.SrcAddr() != vm.GuestAddr() || h.DstAddr() != vm.HostAddr() {
		return nil, fmt.Errorf("the guest's SIDR_REQ: service %v cma_hdr %v (%v > %v)", q.ServiceID(), err, h.SrcAddr(), h.DstAddr())
	}
	m = mad.MAD(c.buf).Init(mad.AttrSIDRREP, greq.TID())
	r := m.SIDRREP()
	r.SetRequestID(q.RequestID())
	r.SetStatus(mad.SIDRSuccess)
	r.SetQPN(hostUDQPN)
	r.SetServiceID(q.ServiceID())
	r.SetQKey(mad.RDMAUDPQKey)
	if err := c.send(m); err != nil {
		return nil, err
	}
	// udaddy now sends its datagram to the QP the SIDR_REP named.
	data := peerData(c, hostUDQPN, 10*time.Second)
	cli.Kill()
	notes = append(notes, fmt.Sprintf("udaddy -s %v, answered SIDR_REP QPN 0x%06x: %d UD datagrams to that QP followed", vm.HostAddr(), hostUDQPN, data))
	return notes, nil
}

// peerData counts the UD packets to qpn that arrive within d.
func peerData(c *cm, qpn uint32, d time.Duration) int {
	n := 0
	c.conv.PeerQPN = qpn
	c.conv.Collect(d, func(p *cases.Pkt) bool {
		if p.ParseErr == nil && p.P.BTH.DestQP() == qpn {
			n++
			return true
		}
		return false
	})
	c.conv.PeerQPN = mad.GSIQPN
	return n
}

func errLine(err error) string {
	if err == nil {
		return "0"
	}
	return oneLine(err.Error())
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	if s == "" {
		return "(no output)"
	}
	return s
}

// frame is one kept frame, for the README's table.
type frame struct {
	n    int
	from string
	desc string
}

// keepRoCE writes the RoCEv2 frames of raw (UDP port 4791 either way) to
// path and describes each.
func keepRoCE(raw []byte, path string, guest netip.Addr) ([]frame, error) {
	r, err := pcapgo.NewReader(bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	w := pcapgo.NewWriter(&buf)
	if err := w.WriteFileHeader(65535, layers.LinkTypeEthernet); err != nil {
		return nil, err
	}
	var frames []frame
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
		rec := inspect.Decode(data, ci)
		if !rec.RoCE {
			continue
		}
		if err := w.WritePacket(ci, data); err != nil {
			return nil, err
		}
		f := frame{n: len(frames) + 1, from: "host (bth/mad)", desc: rec.OpcodeName}
		if rec.Src == guest {
			f.from = "guest (kernel CM, rxe)"
		}
		if rec.CM != nil {
			f.desc = rec.CM.Text()
		}
		frames = append(frames, f)
	}
	return frames, os.WriteFile(path, buf.Bytes(), 0o644)
}

// writeGolden writes tshark's fields for every frame of pcap to path.
func writeGolden(pcap, path string) (string, error) {
	version, err := golden.Version("tshark")
	if err != nil {
		return "", err
	}
	return version, golden.Write("tshark", version, pcap, path, golden.CMTsharkFields)
}

func writeReadme(out, name string, frames []frame, notes []string, release, tshark string) error {
	var b strings.Builder
	fmt.Fprintf(&b, `# Connection management captures from kernel rdma_rxe

Recorded on the tap device of the rdma_rxe guest (package conformance/rxevm,
guest kernel %s) by:

    go run ./conformance/recordcm -out inspect/testdata/rxe-cm   # as root, from the repository root

(root, qemu and tshark; the guest image is built on first use). The program
overwrites every file here, this README included. inspect/cm_tshark_test.go reads
them; it needs neither the VM nor tshark. After re-recording,
`+"`SOFTROCE_UPDATE_GOLDEN=1 go test -run TestCMTextGolden ./inspect`"+` rewrites
inspect/testdata/rxe-cm.txt, the capture as softroce inspect -v shows it.

| file | contents |
|---|---|
| %s | IB CM MADs on QP1 (and one UD datagram) over RoCEv2/IPv4 (10.88.0.1 host, 10.88.0.2 rxe guest) |
| rxe-cm.tshark | the golden decoder fields: `+"`tshark -T fields`"+` output for each frame (%s) |

Frames from the guest were built by the kernel's CM and rxe; frames from
the host by package bth/mad (UD SEND_ONLY to QP1, Q_Key 0x80010000). In
order: a host REQ to rping -s on port %d answered REP, the host's RTU,
DREQ and the guest's DREP; the same REQ twice to rping -s on port %d
(an MRA if the duplicate beat the accept, then REP) and a host REJ of the
REP; a host REQ to port %d where nobody listens,
answered REJ; the guest's rping client to host port %d, never answered (its
REQ, the CM's retransmissions of it, and the REJ reason 4 its CM sends when
rping is killed); the guest's rping client to host port %d, answered by a
host REJ reason 28 with private data; then service ID resolution with
udaddy (RDMA_PS_UDP:%d): a host SIDR_REQ to udaddy -b answered SIDR_REP, a
SIDR_REQ for port %d where nobody listens, and the guest's udaddy -s
resolving the host, answered by a host SIDR_REP naming QP 0x%06x, followed
by udaddy's datagram to that QP (Q_Key 0x01234567).

What the programs reported:

`, release, name, tshark, portAccept, portDup, portNoOne, portSilent, portRejects, udaddyPort, udaddyPort+1, hostUDQPN)
	for _, n := range notes {
		fmt.Fprintf(&b, "- %s\n", n)
	}
	b.WriteString("\n| frame | sent by | packet |\n|---|---|---|\n")
	for _, f := range frames {
		fmt.Fprintf(&b, "| %d | %s | %s |\n", f.n, f.from, strings.ReplaceAll(f.desc, "|", "/"))
	}
	return os.WriteFile(filepath.Join(out, "README.md"), []byte(b.String()), 0o644)
}
