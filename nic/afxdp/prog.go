package afxdp

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"
)

// XDP actions (enum xdp_action).
const (
	xdpDrop     = 1
	xdpPass     = 2
	xdpRedirect = 4
)

// Offsets in struct xdp_md, the context an XDP program gets.
const (
	mdData         = 0
	mdDataEnd      = 4
	mdRxQueueIndex = 16
)

// be16 is the value a little-endian 2-byte load reads from the network-order
// bytes of v: the program compares loaded fields against it.
func be16(v uint16) int32 { return int32(v>>8 | v<<8&0xff00) }

// program returns the XDP program: UDP packets to port (IPv4 without
// fragments, whatever the header length; IPv6 with UDP as the first next
// header) are redirected to the AF_XDP socket of the receive queue they
// arrived on, through the XSKMAP mapFD. Everything else (ARP, NDP, ICMP,
// other traffic) passes to the kernel, so the interface keeps working.
// When the queue has no socket, the packet gets the fallback action.
//
// It is written with the asm package so that building needs no clang. It
// reads only the first buffer of a multi-buffer packet, which holds the
// headers, so it is safe to load with BPF_F_XDP_HAS_FRAGS.
func program(port uint16, mapFD int, fallback int32) asm.Instructions {
	p := be16(port)
	insns := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.LoadMem(asm.R2, asm.R6, mdData, asm.Word),
		asm.LoadMem(asm.R3, asm.R6, mdDataEnd, asm.Word),
		// Ethernet header.
		asm.Mov.Reg(asm.R4, asm.R2),
		asm.Add.Imm(asm.R4, 14),
		asm.JGT.Reg(asm.R4, asm.R3, "pass"),
		asm.LoadMem(asm.R5, asm.R2, 12, asm.Half),
		asm.JEq.Imm(asm.R5, be16(0x0800), "ipv4"),
		asm.JEq.Imm(asm.R5, be16(0x86dd), "ipv6"),
		asm.Ja.Label("pass"),

		// IPv4: version 4, protocol UDP, not a fragment (MF clear,
		// offset 0), header length from IHL (options allowed).
		asm.Mov.Reg(asm.R4, asm.R2).WithSymbol("ipv4"),
		asm.Add.Imm(asm.R4, 14+20),
		asm.JGT.Reg(asm.R4, asm.R3, "pass"),
		asm.LoadMem(asm.R5, asm.R2, 14, asm.Byte),
		asm.Mov.Reg(asm.R7, asm.R5),
		asm.And.Imm(asm.R7, 0xf0),
		asm.JNE.Imm(asm.R7, 0x40, "pass"),
		asm.LoadMem(asm.R7, asm.R2, 14+9, asm.Byte),
		asm.JNE.Imm(asm.R7, unix.IPPROTO_UDP, "pass"),
		asm.LoadMem(asm.R7, asm.R2, 14+6, asm.Half),
		asm.And.Imm(asm.R7, be16(0x3fff)),
		asm.JNE.Imm(asm.R7, 0, "pass"),
		asm.And.Imm(asm.R5, 0x0f),
	}
	// The UDP header follows IHL*4 bytes of IPv4 header. Adding a
	// variable offset to a packet pointer is pointer arithmetic, which the
	// verifier allows only with CAP_PERFMON; one branch with constant
	// offsets per possible IHL (5..15) needs nothing beyond CAP_BPF.
	for ihl := 5; ihl <= 15; ihl++ {
		insns = append(insns, asm.JEq.Imm(asm.R5, int32(ihl), fmt.Sprintf("ihl%d", ihl)))
	}
	insns = append(insns, asm.Ja.Label("pass"))
	for ihl := 5; ihl <= 15; ihl++ {
		udp := int16(14 + ihl*4)
		insns = append(insns,
			asm.Mov.Reg(asm.R4, asm.R2).WithSymbol(fmt.Sprintf("ihl%d", ihl)),
			asm.Add.Imm(asm.R4, int32(udp)+8),
			asm.JGT.Reg(asm.R4, asm.R3, "pass"),
			asm.LoadMem(asm.R5, asm.R2, udp+2, asm.Half),
			asm.JEq.Imm(asm.R5, p, "redirect"),
			asm.Ja.Label("pass"),
		)
	}
	return append(insns,
		// IPv6 with UDP right after the fixed header.
		asm.Mov.Reg(asm.R4, asm.R2).WithSymbol("ipv6"),
		asm.Add.Imm(asm.R4, 14+40+8),
		asm.JGT.Reg(asm.R4, asm.R3, "pass"),
		asm.LoadMem(asm.R5, asm.R2, 14+6, asm.Byte),
		asm.JNE.Imm(asm.R5, unix.IPPROTO_UDP, "pass"),
		asm.LoadMem(asm.R5, asm.R2, 14+40+2, asm.Half),
		asm.JNE.Imm(asm.R5, p, "pass"),

		// bpf_redirect_map(xskmap, rx_queue_index, fallback action).
		asm.LoadMem(asm.R2, asm.R6, mdRxQueueIndex, asm.Word).WithSymbol("redirect"),
		asm.LoadMapPtr(asm.R1, mapFD),
		asm.Mov.Imm(asm.R3, fallback),
		asm.FnRedirectMap.Call(),
		asm.Return(),

		asm.Mov.Imm(asm.R0, xdpPass).WithSymbol("pass"),
		asm.Return(),
	)
}

// loadProgram creates the XSKMAP (one slot per queue) and the program.
// It asks for a frags-aware program (BPF_F_XDP_HAS_FRAGS), which native
// XDP on veth and most drivers require above a ~3.5 KB MTU; hasFrags
// reports whether the kernel took it.
func loadProgram(port uint16, queues int, fallback int32, wantFrags bool) (prog *ebpf.Program, xsks *ebpf.Map, hasFrags bool, err error) {
	xsks, err = ebpf.NewMap(&ebpf.MapSpec{
		Name: "softroce_xsks", Type: ebpf.XSKMap, KeySize: 4, ValueSize: 4, MaxEntries: uint32(queues),
	})
	if err != nil {
		return nil, nil, false, fmt.Errorf("create XSKMAP: %w", permErr(err))
	}
	spec := &ebpf.ProgramSpec{
		Name: "softroce_xdp", Type: ebpf.XDP, License: "GPL",
		Instructions: program(port, xsks.FD(), fallback),
		Flags:        unix.BPF_F_XDP_HAS_FRAGS,
	}
	if !wantFrags {
		spec.Flags = 0
	}
	prog, err = ebpf.NewProgram(spec)
	if err == nil {
		return prog, xsks, wantFrags, nil
	}
	if errors.Is(err, unix.EPERM) {
		xsks.Close()
		return nil, nil, false, fmt.Errorf("load XDP program: %w", permErr(err))
	}
	// Kernels before 5.18 do not know BPF_F_XDP_HAS_FRAGS: load a
	// plain program, limited to single-buffer frames.
	spec.Flags = 0
	prog, err2 := ebpf.NewProgram(spec)
	if err2 != nil {
		xsks.Close()
		return nil, nil, false, fmt.Errorf("load XDP program: %w (with frags: %v)", err2, err)
	}
	return prog, xsks, false, nil
}
