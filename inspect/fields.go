package inspect

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"

	"github.com/gopacket/gopacket/layers"

	"github.com/softroce/softroce/bth"
	"github.com/softroce/softroce/icrc"
)

// Field is one line of the field tree: a named value and the bytes of the
// frame it occupies, [Start:End). Bit fields share their byte's range and
// give their mask.
type Field struct {
	Start, End int
	Name       string // "BTH.opcode"
	Mask       uint32 // bits of the bytes the field uses; 0 means all
	Value      string
}

// String renders "[start:end] name = value", with the mask for bit fields.
func (f Field) String() string {
	if f.Mask != 0 {
		return fmt.Sprintf("[%d:%d] %s = %s (mask 0x%0*x)", f.Start, f.End, f.Name, f.Value, 2*(f.End-f.Start), f.Mask)
	}
	return fmt.Sprintf("[%d:%d] %s = %s", f.Start, f.End, f.Name, f.Value)
}

type tree struct {
	b   []byte
	out []Field
}

func (t *tree) add(start, end int, name string, mask uint32, format string, args ...any) {
	if end > len(t.b) {
		return // beyond the capture
	}
	t.out = append(t.out, Field{Start: start, End: end, Name: name, Mask: mask, Value: fmt.Sprintf(format, args...)})
}

func (t *tree) u8(o int) uint8   { return t.b[o] }
func (t *tree) u16(o int) uint16 { return binary.BigEndian.Uint16(t.b[o:]) }
func (t *tree) u32(o int) uint32 { return binary.BigEndian.Uint32(t.b[o:]) }
func (t *tree) u64(o int) uint64 { return binary.BigEndian.Uint64(t.b[o:]) }
func (t *tree) has(o, n int) bool {
	return o >= 0 && o+n <= len(t.b)
}

// Fields returns the field tree of a RoCE record with frame offsets, from
// the link header to the ICRC, for as many bytes as were captured.
func Fields(r *Record) []Field {
	t := &tree{b: r.Data}
	if !r.RoCE || !r.Located() {
		return nil
	}
	base := r.Base
	loc := r.Loc
	switch r.LinkType {
	case layers.LinkTypeEthernet:
		t.ethernet(loc.L3)
	case layers.LinkTypeLinuxSLL:
		t.add(0, 14, "SLL", 0, "Linux cooked header")
		t.tags(14, base+loc.L3, "SLL.protocol")
	case layers.LinkTypeLinuxSLL2:
		t.add(0, 20, "SLL2", 0, "Linux cooked header v2, protocol 0x%04x", t.u16(0))
	}
	l3 := base + loc.L3
	switch loc.Kind {
	case icrc.KindRoCEv2IPv4:
		t.ipv4(l3, loc.L3Len)
	case icrc.KindRoCEv2IPv6:
		t.ipv6(l3, "IPv6")
	case icrc.KindRoCEv1:
		t.ipv6(l3, "GRH")
	}
	if loc.UDP >= 0 {
		u := base + loc.UDP
		if t.has(u, 8) {
			t.add(u, u+2, "UDP.src_port", 0, "%d", t.u16(u))
			t.add(u+2, u+4, "UDP.dst_port", 0, "%d", t.u16(u+2))
			t.add(u+4, u+6, "UDP.length", 0, "%d", t.u16(u+4))
			t.add(u+6, u+8, "UDP.checksum", 0, "0x%04x (covered as ones by the ICRC)", t.u16(u+6))
		}
	}
	o := base + loc.BTH
	end := base + loc.End
	if !t.has(o, bth.BTHLen) {
		return t.out
	}
	op := bth.Opcode(t.u8(o))
	info := op.Info()
	t.add(o, o+1, "BTH.opcode", 0, "0x%02x %s", uint8(op), op)
	b1 := t.u8(o + 1)
	t.add(o+1, o+2, "BTH.se", 0x80, "%d", b1>>7)
	t.add(o+1, o+2, "BTH.mig_req", 0x40, "%d", b1>>6&1)
	t.add(o+1, o+2, "BTH.pad_cnt", 0x30, "%d", b1>>4&3)
	t.add(o+1, o+2, "BTH.tver", 0x0f, "%d", b1&0xf)
	t.add(o+2, o+4, "BTH.pkey", 0, "0x%04x", t.u16(o+2))
	b4 := t.u8(o + 4)
	t.add(o+4, o+5, "BTH.fecn", 0x80, "%d", b4>>7)
	t.add(o+4, o+5, "BTH.becn", 0x40, "%d", b4>>6&1)
	t.add(o+4, o+5, "BTH.resv6", 0x3f, "0x%02x (byte covered as ones by the ICRC)", b4&0x3f)
	t.add(o+5, o+8, "BTH.dest_qp", 0, "0x%06x", t.u32(o+4)&0xffffff)
	t.add(o+8, o+9, "BTH.ack_req", 0x80, "%d", t.u8(o+8)>>7)
	t.add(o+8, o+9, "BTH.resv7", 0x7f, "0x%02x", t.u8(o+8)&0x7f)
	t.add(o+9, o+12, "BTH.psn", 0, "%d (0x%06x)", t.u32(o+8)&0xffffff, t.u32(o+8)&0xffffff)
	o += bth.BTHLen
	if !info.Valid {
		return t.out
	}
	for _, h := range []bth.Header{bth.HdrRDETH, bth.HdrDETH, bth.HdrXRCETH, bth.HdrFETH, bth.HdrRETH, bth.HdrAtomicETH,
		bth.HdrAETH, bth.HdrAtomicAckETH, bth.HdrImmDt, bth.HdrIETH} {
		if info.Headers&h == 0 {
			continue
		}
		n := h.Len()
		if !t.has(o, n) {
			return t.out
		}
		switch h {
		case bth.HdrRDETH:
			t.add(o+1, o+4, "RDETH.ee_context", 0, "0x%06x", t.u32(o)&0xffffff)
		case bth.HdrDETH:
			t.add(o, o+4, "DETH.qkey", 0, "0x%08x", t.u32(o))
			t.add(o+5, o+8, "DETH.src_qp", 0, "0x%06x", t.u32(o+4)&0xffffff)
		case bth.HdrXRCETH:
			t.add(o+1, o+4, "XRCETH.xrc_srq", 0, "0x%06x", t.u32(o)&0xffffff)
		case bth.HdrFETH:
			f := bth.FETH(t.b[o : o+4])
			t.add(o+3, o+4, "FETH.selectivity", 0x30, "%d", f.Selectivity())
			t.add(o+3, o+4, "FETH.placement_type", 0x0f, "%d", f.PlacementType())
		case bth.HdrRETH:
			t.add(o, o+8, "RETH.va", 0, "0x%016x", t.u64(o))
			t.add(o+8, o+12, "RETH.rkey", 0, "0x%08x", t.u32(o+8))
			t.add(o+12, o+16, "RETH.dma_len", 0, "%d", t.u32(o+12))
		case bth.HdrAtomicETH:
			t.add(o, o+8, "AtomicETH.va", 0, "0x%016x", t.u64(o))
			t.add(o+8, o+12, "AtomicETH.rkey", 0, "0x%08x", t.u32(o+8))
			t.add(o+12, o+20, "AtomicETH.swap_add", 0, "0x%016x", t.u64(o+12))
			t.add(o+20, o+28, "AtomicETH.compare", 0, "0x%016x", t.u64(o+20))
		case bth.HdrAETH:
			s := bth.Syndrome(t.u8(o))
			t.add(o, o+1, "AETH.syndrome", 0, "0x%02x %s", uint8(s), s)
			t.add(o+1, o+4, "AETH.msn", 0, "%d", t.u32(o)&0xffffff)
		case bth.HdrAtomicAckETH:
			t.add(o, o+8, "AtomicAckETH.orig", 0, "0x%016x", t.u64(o))
		case bth.HdrImmDt:
			t.add(o, o+4, "ImmDt", 0, "0x%08x", t.u32(o))
		case bth.HdrIETH:
			t.add(o, o+4, "IETH.rkey", 0, "0x%08x", t.u32(o))
		}
		o += n
	}
	pad := int(b1 >> 4 & 3)
	payEnd := end - bth.ICRCLen - pad
	if payEnd >= o {
		t.addClipped(o, payEnd, "payload", fmt.Sprintf("%d bytes", payEnd-o))
		if r.CM != nil {
			t.cmFields(o, r.CM)
		}
		if pad > 0 {
			t.addClipped(payEnd, payEnd+pad, "pad", fmt.Sprintf("%d bytes", pad))
		}
	}
	if t.has(end-bth.ICRCLen, bth.ICRCLen) && end >= bth.ICRCLen {
		verdict := "ok"
		if loc.Status == icrc.StatusMismatch {
			verdict = fmt.Sprintf("BAD, computed 0x%08x", loc.Computed)
		}
		t.add(end-4, end, "ICRC", 0, "0x%08x (%s)", loc.Wire, verdict)
	} else {
		t.out = append(t.out, Field{Start: end - 4, End: end, Name: "ICRC", Value: "not captured (truncated)"})
	}
	if n := len(t.b); n > end {
		t.out = append(t.out, Field{Start: end, End: n, Name: "trailer", Value: fmt.Sprintf("%d bytes after the packet (Ethernet padding or FCS)", n-end)})
	}
	return t.out
}

// addClipped adds a byte range that may extend past the capture.
func (t *tree) addClipped(start, end int, name, value string) {
	if end > len(t.b) {
		value += fmt.Sprintf(", %d captured", max(0, len(t.b)-start))
	}
	t.out = append(t.out, Field{Start: start, End: end, Name: name, Value: value})
}

func (t *tree) ethernet(l3 int) {
	t.add(0, 6, "Ethernet.dst", 0, "%s", net.HardwareAddr(t.b[0:6]))
	t.add(6, 12, "Ethernet.src", 0, "%s", net.HardwareAddr(t.b[6:12]))
	t.tags(12, l3, "Ethernet.type")
}

// tags shows the VLAN tags and EtherType from offset o (the first TPID or
// the EtherType) up to the network header at l3.
func (t *tree) tags(o, l3 int, typeName string) {
	for o+2 < l3 {
		t.add(o, o+2, "VLAN.tpid", 0, "0x%04x", t.u16(o))
		tci := t.u16(o + 2)
		t.add(o+2, o+4, "VLAN.pcp", 0xe000, "%d", tci>>13)
		t.add(o+2, o+4, "VLAN.dei", 0x1000, "%d", tci>>12&1)
		t.add(o+2, o+4, "VLAN.vid", 0x0fff, "%d", tci&0xfff)
		o += 4
	}
	t.add(o, o+2, typeName, 0, "0x%04x", t.u16(o))
}

func (t *tree) ipv4(o, ihl int) {
	if !t.has(o, 20) {
		return
	}
	t.add(o, o+1, "IPv4.version", 0xf0, "%d", t.u8(o)>>4)
	t.add(o, o+1, "IPv4.ihl", 0x0f, "%d (%d bytes)", t.u8(o)&0xf, ihl)
	t.add(o+1, o+2, "IPv4.dscp", 0xfc, "%d (byte covered as ones by the ICRC)", t.u8(o+1)>>2)
	t.add(o+1, o+2, "IPv4.ecn", 0x03, "%d", t.u8(o+1)&3)
	t.add(o+2, o+4, "IPv4.total_length", 0, "%d", t.u16(o+2))
	t.add(o+4, o+6, "IPv4.id", 0, "0x%04x (covered by the ICRC)", t.u16(o+4))
	t.add(o+6, o+8, "IPv4.flags", 0xe000, "DF=%d MF=%d", t.u16(o+6)>>14&1, t.u16(o+6)>>13&1)
	t.add(o+6, o+8, "IPv4.frag_offset", 0x1fff, "%d", t.u16(o+6)&0x1fff)
	t.add(o+8, o+9, "IPv4.ttl", 0, "%d (covered as ones by the ICRC)", t.u8(o+8))
	t.add(o+9, o+10, "IPv4.protocol", 0, "%d", t.u8(o+9))
	t.add(o+10, o+12, "IPv4.checksum", 0, "0x%04x (covered as ones by the ICRC)", t.u16(o+10))
	t.add(o+12, o+16, "IPv4.src", 0, "%s", netip.AddrFrom4([4]byte(t.b[o+12:o+16])))
	t.add(o+16, o+20, "IPv4.dst", 0, "%s", netip.AddrFrom4([4]byte(t.b[o+16:o+20])))
	if ihl > 20 {
		t.add(o+20, o+ihl, "IPv4.options", 0, "%d bytes", ihl-20)
	}
}

// ipv6 covers an IPv6 header or a RoCEv1 GRH (the same layout, IBTA §8.3).
func (t *tree) ipv6(o int, name string) {
	if !t.has(o, 40) {
		return
	}
	w := t.u32(o)
	masked := " (covered as ones by the ICRC)"
	t.add(o, o+4, name+".version", 0xf0000000, "%d", w>>28)
	t.add(o, o+4, name+".traffic_class", 0x0ff00000, "0x%02x%s", w>>20&0xff, masked)
	t.add(o, o+4, name+".flow_label", 0x000fffff, "0x%05x%s", w&0xfffff, masked)
	t.add(o+4, o+6, name+".payload_length", 0, "%d", t.u16(o+4))
	t.add(o+6, o+7, name+".next_header", 0, "0x%02x", t.u8(o+6))
	t.add(o+7, o+8, name+".hop_limit", 0, "%d%s", t.u8(o+7), masked)
	t.add(o+8, o+24, name+".src", 0, "%s", netip.AddrFrom16([16]byte(t.b[o+8:o+24])))
	t.add(o+24, o+40, name+".dst", 0, "%s", netip.AddrFrom16([16]byte(t.b[o+24:o+40])))
}
