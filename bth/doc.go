// Package bth holds the InfiniBand transport wire formats that RoCE
// carries (IBTA vol. 1 chapter 9, annexes A16/A17 for RoCE, A19 for FLUSH
// and ATOMIC WRITE): the Base Transport Header, every extended transport
// header, and the opcode table that says which headers and payload each of
// the 256 opcodes carries.
//
// Headers are zero-copy views: typed byte slices with accessors and
// Encode methods (BTH, RETH, AETH, ...). Parse splits a packet (BTH through
// ICRC) into views without allocating and returns a *ParseError for
// malformed input; Build and WriteHeaders write packets, pad and PadCnt
// included. The opcode table (Opcode.Info) is data that parse, build, the
// inspector and the transport all read.
//
// The package has no dependencies; gopacket layers live in bth/rocelayers.
package bth
