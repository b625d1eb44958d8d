// Package cases is softroce's packet-level conformance harness: it crafts
// exact RoCEv2 packets to an RC queue pair, collects what comes back, and
// judges the answers against the InfiniBand specification (IBTA vol. 1
// chapter 9 and annex A17), in the manner of Lumina and roce-sim.
//
// A fake peer (Peer) owns QP numbers with no QP behind them. For each case
// it opens a QP on a Target, connected to one of its own QP numbers, and
// scripts a conversation (Conv): requests with chosen PSNs, opcodes, keys,
// lengths and ICRCs for responder cases; ACKs, NAKs and silence for
// requester cases, where the target posts the work request. Two targets
// exist:
//
//   - RxeTarget: the Linux kernel's rdma_rxe in a qemu guest (package
//     rxevm), driven through the libibverbs agent (package agent); the peer
//     is a nic/udp link on the host side of the guest's tap. Needs root.
//   - RemoteTarget: the RDMA device of another host (a real RNIC), driven
//     through a standalone softroce-agent over an authenticated TCP
//     connection; the peer is a nic/udp link on this host sending toward
//     the device's RoCEv2 address (docs/remote.md).
//   - SoftroceTarget: softroce's own transport (transport/rc through the
//     verbs API) on one end of an in-process nic/pipe; the peer holds the
//     other end. Needs nothing.
//
// Every case runs unchanged against every target. A Result records what
// the target did, whether that conforms to the case's Spec, and the packet
// trace. Where a device departs from the spec in a way the project's docs
// document (docs/rxe-behaviour.md for rxe), Case.Known names the deviation
// under the device's driver (DriverOf; rxe reached as a remote host shares
// rxe's): the verdict is then "deviation" rather than "fail", and the tests
// assert that it is still there, so the report never hides it.
//
// RunAll runs the catalogue (All) and returns a Report, which writes
// conformance-report.md (a table: case, spec expectation with section, one
// column per target) and conformance-report.json; with Options.PcapDir it
// also writes one pcap per case and target that `softroce inspect` reads.
// `softroce conformance rxe|remote|self` is the command line for all of it.
//
// go test runs every case against softroce; with SOFTROCE_RXE=1 and root it
// also boots the rxe VM once (TestMain) and runs them against rxe.
package cases
