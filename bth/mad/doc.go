// Package mad holds the wire format of InfiniBand management datagrams as
// the connection manager uses them (IBTA vol. 1 §13.4 for the common MAD
// header, chapter 12 for the communication management messages): the
// 24-byte MAD header, one view per CM message (REQ, MRA, REJ, REP, RTU,
// DREQ, DREP, SIDR_REQ, SIDR_REP; LAP and APR by their comm IDs only), the
// REJ reasons, and what rdma_cm adds on top: the service IDs of its port
// spaces and the cma_hdr at the head of REQ and SIDR_REQ private data.
//
// On RoCE a MAD travels as the 256-byte payload of a UD SEND_ONLY to QP1
// with a DETH carrying Q_Key QP1QKey. The types here are zero-copy views
// (typed byte slices, as in package bth): getters and setters read and
// write the 256 bytes in place, big-endian, so building a message is
// Init on a caller-owned buffer followed by setters, with no allocation.
// Parse checks the header and the few fields whose value bounds the rest
// and returns a *ParseError for anything else; it never panics.
//
// The offsets in the message getters' comments are the specification's
// table offsets, which count from the end of the 24-byte header: table
// offset N is byte HeaderLen+N of the MAD (docs/cm-wire.md lists both).
package mad
