package interop

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/softroce/softroce/nic/udp"
	"github.com/softroce/softroce/verbs"
)

// rxeCounters reads rxe0's port hw counters in the guest.
func rxeCounters(t *testing.T, ctx context.Context) map[string]uint64 {
	t.Helper()
	out, err := vm.Run(ctx, `cd /sys/class/infiniband/rxe0/ports/1/hw_counters && for f in *; do echo "$f $(cat $f)"; done`)
	if err != nil {
		t.Fatalf("read rxe hw counters: %v", err)
	}
	c := map[string]uint64{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		if v, err := strconv.ParseUint(f[1], 10, 64); err == nil {
			c[f[0]] = v
		}
	}
	if _, ok := c["rcvd_pkts"]; !ok {
		t.Fatalf("no rcvd_pkts among rxe's hw counters: %q", out)
	}
	return c
}

// TestGSOAgainstRxe: softroce sends 64 KiB WRITEs and SENDs to rxe over a
// nic/udp link with GSO forced on, so the packets of each message leave
// as super-packets the host splits before the guest's NIC; each
// segment's ICRC covers the IPv4 ID Linux gives it. rxe drops a packet
// with a bad ICRC without counting an error, so acceptance is proven by
// its counters: it received every packet softroce sent, found none out
// of sequence or duplicated, and softroce never retransmitted; every
// completion arrives and the bytes are right.
func TestGSOAgainstRxe(t *testing.T) {
	needVM(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var link *udp.Link
	if err := vm.Do(func() (err error) {
		link, err = udp.Open(udp.Config{Addr: vm.HostAddr(), GSO: udp.OffloadOn})
		return err
	}); err != nil {
		t.Fatalf("open a GSO link: %v", err)
	}
	dev, err := verbs.Open(link, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dev.Close() })
	p := connectPairOn(t, ctx, 4096, dev)

	before := rxeCounters(t, ctx)
	tx0, rx0 := link.Stats().TxPackets, link.Stats().RxPackets

	// 16 WRITEs of 64 KiB in flight, covering rxe's whole buffer.
	const wsize, nw = 64 << 10, bufLen / (64 << 10)
	data := pattern(bufLen, 41)
	p.mem(func() { copy(p.buf, data) })
	for i := 0; i < nw; i++ {
		p.wrID++
		wr := verbs.SendWR{ID: p.wrID, Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled,
			SGL:        []verbs.SGE{{Addr: p.mr.Addr() + uint64(i*wsize), Length: wsize, LKey: p.mr.LKey()}},
			RemoteAddr: p.amr.Addr + uint64(i*wsize), RKey: p.amr.RKey}
		if err := p.qp.PostSend(&wr); err != nil {
			t.Fatal(err)
		}
	}
	waitAll(t, p, nw, "WRITE")
	got, err := p.ag.ReadMem(ctx, p.amr, 0, bufLen)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("rxe's memory after the WRITEs differs (%v)", err)
	}

	// SENDs: 16 KiB (a GSO run of 4 packets) and 64 bytes (single).
	sizes := []int{16 << 10, 64, 16 << 10, 64, 16 << 10, 16 << 10, 64, 16 << 10}
	sdata := pattern(len(sizes)*(16<<10), 42)
	p.mem(func() { copy(p.buf, sdata) })
	for i := range sizes {
		if err := p.ag.PostRecv(ctx, p.aqp, uint64(1000+i), p.amr, i*(16<<10), 16<<10); err != nil {
			t.Fatal(err)
		}
	}
	for i, n := range sizes {
		p.wrID++
		wr := verbs.SendWR{ID: p.wrID, Opcode: verbs.WRSend, Flags: verbs.SendSignaled,
			SGL: []verbs.SGE{{Addr: p.mr.Addr() + uint64(i*(16<<10)), Length: uint32(n), LKey: p.mr.LKey()}}}
		if err := p.qp.PostSend(&wr); err != nil {
			t.Fatal(err)
		}
	}
	waitAll(t, p, len(sizes), "SEND")
	for i, n := range sizes {
		wc, err := p.ag.Poll(ctx, p.acq, 20*time.Second)
		if err != nil {
			t.Fatalf("rxe receive %d: %v", i, err)
		}
		if wc.Status != 0 || wc.WRID != uint64(1000+i) || int(wc.ByteLen) != n {
			t.Fatalf("rxe receive %d: %+v, want %d bytes", i, wc, n)
		}
		got, err := p.ag.ReadMem(ctx, p.amr, i*(16<<10), n)
		if err != nil || !bytes.Equal(got, sdata[i*(16<<10):i*(16<<10)+n]) {
			t.Fatalf("SEND %d: rxe received other bytes (%v)", i, err)
		}
	}

	after := rxeCounters(t, ctx)
	sent, recvd := link.Stats().TxPackets-tx0, link.Stats().RxPackets-rx0
	ost, qs := link.OffloadStats(), p.qp.Stats()
	delta := func(k string) uint64 { return after[k] - before[k] }
	t.Logf("softroce sent %d packets (%d GSO super-packets carrying %d), received %d; rxe rcvd_pkts +%d sent_pkts +%d; QP %+v",
		sent, ost.GSOSends, ost.GSOSegments, recvd, delta("rcvd_pkts"), delta("sent_pkts"), qs)
	for k := range after {
		if d := delta(k); d != 0 {
			t.Logf("rxe %s +%d", k, d)
		}
	}
	if ost.GSOSends == 0 || ost.GSOFallbacks != 0 || !link.GSO() {
		t.Errorf("GSO was not used: %+v", ost)
	}
	if delta("rcvd_pkts") != sent {
		t.Errorf("rxe received %d packets, softroce sent %d: some were dropped (a bad ICRC is dropped silently)", delta("rcvd_pkts"), sent)
	}
	if delta("sent_pkts") != recvd {
		t.Errorf("rxe sent %d packets, softroce received %d", delta("sent_pkts"), recvd)
	}
	for _, k := range []string{"out_of_seq_request", "duplicate_request", "rcvd_seq_err", "completer_retry_err", "retry_exceeded_err"} {
		if delta(k) != 0 {
			t.Errorf("rxe %s +%d", k, delta(k))
		}
	}
	if qs.Retransmits != 0 || qs.Timeouts != 0 || qs.SeqNAKsRecv != 0 || qs.RNRNAKsRecv != 0 {
		t.Errorf("softroce QP: %+v", qs)
	}
}

func waitAll(t *testing.T, p *pairing, n int, what string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	wcs := make([]verbs.WC, n)
	for got := 0; got < n; {
		k, err := p.cq.Wait(ctx, wcs[got:])
		if err != nil {
			t.Fatalf("%s: %d of %d completions: %v (QP stats %+v)", what, got, n, err, p.qp.Stats())
		}
		for _, wc := range wcs[got : got+k] {
			if wc.Status != 0 {
				t.Fatalf("%s: completion %+v", what, wc)
			}
		}
		got += k
	}
}

// connectPairOn is connectPair over a given softroce device, its buffer
// registered without atomic access.
func connectPairOn(t *testing.T, ctx context.Context, mtu int, dev *verbs.Device) *pairing {
	t.Helper()
	return connectPairWith(t, ctx, mtu, dev, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
}
